//! The GPU-hours ledger as Prometheus counters: device-seconds held, active and with activity
//! unknown, labelled team, user and kind (whole `gpu` or the MIG profile). Process-lifetime
//! counters, as Prometheus expects: a restart resets them and `rate`/`increase` handle that,
//! while the ledger's own day files carry the history for `gpuctl report`.

use crate::ledger::Credit;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, OnceLock};

type Labels = Vec<(String, String)>;
type Seconds = Family<Labels, Counter<f64, AtomicU64>>;

/// Totals in ms by (team, user, kind): the one source each scrape's counters are built from,
/// so a scrape can merge users it may not name into `user=""` without a second set of counters.
type Totals = BTreeMap<(String, String, String), [u64; 3]>;

fn totals() -> &'static Mutex<Totals> {
    static T: OnceLock<Mutex<Totals>> = OnceLock::new();
    T.get_or_init(Default::default)
}

/// Add what one sample credited.
pub fn count(credit: &Credit) {
    let mut t = totals().lock().unwrap_or_else(|e| e.into_inner());
    for (k, f) in credit {
        let e = t
            .entry((k.team.clone(), k.user.clone(), k.kind.clone()))
            .or_default();
        for (slot, ms) in e.iter_mut().zip([f.held_ms, f.active_ms, f.unknown_ms]) {
            *slot += ms;
        }
    }
}

/// Register the counters in a scrape's registry. `names_users(team)`: whether this scrape may
/// carry the user names of that team (the same rule as the other per-process labels); users it
/// may not name are summed into `user=""`.
pub fn register(r: &mut Registry, names_users: &dyn Fn(&str) -> bool) {
    let fams: [Seconds; 3] = Default::default();
    let t = totals().lock().unwrap_or_else(|e| e.into_inner());
    for ((team, user, kind), ms) in t.iter() {
        let user = if names_users(team) { user.as_str() } else { "" };
        let l: Labels = vec![
            ("team".to_string(), team.clone()),
            ("user".to_string(), user.to_string()),
            ("kind".to_string(), kind.clone()),
        ];
        for (fam, v) in fams.iter().zip(ms) {
            fam.get_or_create(&l).inc_by(*v as f64 / 1000.0);
        }
    }
    let [held, active, unknown] = fams;
    r.register_with_unit(
        "ledger_held",
        "Device-seconds held (a process of the team's user on the device), by team, user and kind (gpu or MIG profile); sampling gaps not counted",
        Unit::Seconds,
        held,
    );
    r.register_with_unit(
        "ledger_active",
        "Device-seconds held with activity at or above the team's idle threshold",
        Unit::Seconds,
        active,
    );
    r.register_with_unit(
        "ledger_unknown",
        "Device-seconds held on devices that report no activity (never counted as idle or active)",
        Unit::Seconds,
        unknown,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Figures, Key};

    #[test]
    fn credits_reach_the_counters_with_team_user_and_kind() {
        let k = Key {
            team: "ledger_test_team".into(),
            user: "ann".into(),
            device: "0".into(),
            kind: "3g.40gb".into(),
        };
        let f = Figures {
            held_ms: 10_000,
            active_ms: 2_500,
            ..Figures::default()
        };
        count(&vec![(k.clone(), f)]);
        count(&vec![(k, f)]);
        let mut r = Registry::with_prefix("gpuctl");
        register(&mut r, &|_| true);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        let line = |name: &str| {
            out.lines()
                .find(|l| l.starts_with(name) && l.contains("ledger_test_team"))
                .unwrap_or_else(|| panic!("{name} missing:\n{out}"))
                .to_string()
        };
        let held = line("gpuctl_ledger_held_seconds_total{");
        assert!(
            held.contains("user=\"ann\"") && held.contains("kind=\"3g.40gb\""),
            "{held}"
        );
        assert!(held.ends_with(" 20.0"), "{held}");
        assert!(line("gpuctl_ledger_active_seconds_total{").ends_with(" 5.0"));
        // Zero, but present: a series exists from the first credit, so rate() has a start.
        assert!(line("gpuctl_ledger_unknown_seconds_total{").ends_with(" 0.0"));
        // A scrape that may not name the team's users sums them into user="".
        let mut r = Registry::with_prefix("gpuctl");
        register(&mut r, &|_| false);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        assert!(!out.contains("ann"), "{out}");
        assert!(
            out.contains(r#"team="ledger_test_team",user="",kind="3g.40gb"} 20.0"#),
            "{out}"
        );
    }
}
