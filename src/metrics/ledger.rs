//! The GPU-hours ledger as Prometheus counters: device-seconds held, active and with activity
//! unknown, labelled team, user and kind (whole `gpu` or the MIG profile). Process-lifetime
//! counters, as Prometheus expects: a restart resets them and `rate`/`increase` handle that,
//! while the ledger's own day files carry the history for `gpuctl report`.

use crate::ledger::{Credit, Key};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

type Labels = Vec<(String, String)>;
type Seconds = Family<Labels, Counter<f64, AtomicU64>>;

#[derive(Default)]
struct Counters {
    held: Seconds,
    active: Seconds,
    unknown: Seconds,
}

fn counters() -> &'static Counters {
    static C: OnceLock<Counters> = OnceLock::new();
    C.get_or_init(Counters::default)
}

/// The `user` label's value: the one place to gate per-user figures.
fn user_label(k: &Key) -> String {
    k.user.clone()
}

fn labels(k: &Key) -> Labels {
    vec![
        ("team".to_string(), k.team.clone()),
        ("user".to_string(), user_label(k)),
        ("kind".to_string(), k.kind.clone()),
    ]
}

/// Add what one sample credited.
pub fn count(credit: &Credit) {
    let c = counters();
    for (k, f) in credit {
        let l = labels(k);
        for (fam, ms) in [
            (&c.held, f.held_ms),
            (&c.active, f.active_ms),
            (&c.unknown, f.unknown_ms),
        ] {
            fam.get_or_create(&l).inc_by(ms as f64 / 1000.0);
        }
    }
}

/// Register the counters in a scrape's registry.
pub fn register(r: &mut Registry) {
    let c = counters();
    r.register_with_unit(
        "ledger_held",
        "Device-seconds held (a process of the team's user on the device), by team, user and kind (gpu or MIG profile); sampling gaps not counted",
        Unit::Seconds,
        c.held.clone(),
    );
    r.register_with_unit(
        "ledger_active",
        "Device-seconds held with activity at or above the team's idle threshold",
        Unit::Seconds,
        c.active.clone(),
    );
    r.register_with_unit(
        "ledger_unknown",
        "Device-seconds held on devices that report no activity (never counted as idle or active)",
        Unit::Seconds,
        c.unknown.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Figures;

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
        register(&mut r);
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
    }
}
