//! The `Report` method: the GPU-hours ledger over whole UTC days, read from the day files
//! under `/var/lib/gpuctl/ledger/` on a blocking thread.
//!
//! Authorization is `Usage`'s ([`crate::join::viewer`]): a caller sees the rows of the teams it
//! may use; root and members of `[host] admin-group` see every team, processes outside team
//! slices and teams no longer in the policy included.

use super::join::JoinError;
use super::reply::{LedgerReply, LedgerRow};
use super::Backend;
use crate::join::Viewer;
use crate::ledger::store::Store;
use crate::ledger::{day_name, parse_day, summarise, By, Day, Figures, Key};
use crate::paths::Root;
use crate::policy::Policy;
use zbus::fdo;
use zbus::message::Header;
use zbus::Connection;

/// Longest span one call reads (the store keeps less at its default cap anyway).
pub const MAX_DAYS: u64 = 400;
/// Rows in `top_idle`.
pub const TOP_IDLE: usize = 10;

fn row(k: &Key, f: &Figures, by: By) -> LedgerRow {
    let s = |ms: u64| ms as f64 / 1000.0;
    let some = |v: &str, on: bool| on.then(|| v.to_string());
    LedgerRow {
        team: some(&k.team, by != By::Device),
        user: some(&k.user, by == By::User),
        device: some(&k.device, by == By::Device),
        kind: some(&k.kind, by == By::Device),
        held_s: s(f.held_ms),
        active_s: s(f.active_ms),
        unknown_s: s(f.unknown_ms),
        idle_s: s(f.idle_ms()),
        utilisation: f.utilisation(),
        memory_gib_hours: f.memory_byte_s / (1u64 << 30) as f64 / 3600.0,
        reclaimed_s: s(f.reclaimed_ms),
        stops: f.stops,
        borrowed_s: s(f.borrowed_ms),
        lent_s: s(f.lent_ms),
    }
}

fn bad(msg: String) -> JoinError {
    fdo::Error::InvalidArgs(msg).into()
}

/// `Report(from, to, by)`: `from`/`to` are `YYYY-MM-DD` (UTC, inclusive), `by` is `team`,
/// `user` or `device`.
pub async fn report(
    backend: &dyn Backend,
    root: &Root,
    conn: &Connection,
    hdr: &Header<'_>,
    (from, to, by): (&str, &str, &str),
) -> Result<String, JoinError> {
    let day = |s: &str| {
        parse_day(s).ok_or_else(|| {
            bad(format!(
                "not a day: {:?} (YYYY-MM-DD)",
                s.chars().take(32).collect::<String>()
            ))
        })
    };
    let (first, last) = (day(from)?, day(to)?);
    if last < first || last - first >= MAX_DAYS {
        return Err(bad(format!(
            "{from}..{to}: the last day must follow the first, at most {MAX_DAYS} days"
        )));
    }
    let by: By = by.parse().map_err(bad)?;
    // The same rule as Usage/Idle/Metrics: root and the `[host] admin-group` see every team
    // (processes outside team slices included), a member the teams it may join.
    let viewer = super::usage::viewer(backend, conn, hdr).await?;
    let all = viewer == Viewer::All;
    let state = backend.state();
    let policy = match (backend.policy(), all) {
        (Ok(p), _) => Some(p),
        (Err(_), true) => state.policy.clone(),
        (Err(e), false) => return Err(e.into()),
    };
    let root = root.clone();
    let (days, problems) =
        tokio::task::spawn_blocking(move || Store::new(&root).range(first, last))
            .await
            .map_err(|e| JoinError::from(fdo::Error::Failed(format!("ledger read failed: {e}"))))?;
    let reply = ledger_reply(&days, problems, by, (first, last), &viewer, policy.as_ref());
    serde_json::to_string(&reply).map_err(|e| fdo::Error::Failed(e.to_string()).into())
}

/// The `Report` reply over `days` (the store's days `first..=last`), as `viewer` may read it:
/// rows grouped `by`, most held first; the ten users with the most idle time; the teams with an
/// idle rule; the accounting setting of `policy` (`auto` without one).
pub fn ledger_reply(
    days: &[Day],
    problems: Vec<String>,
    by: By,
    (first, last): (u64, u64),
    viewer: &Viewer,
    policy: Option<&Policy>,
) -> LedgerReply {
    let visible = |k: &Key| viewer.sees(Some(&k.team));
    let mut rows: Vec<LedgerRow> = summarise(days, by, visible)
        .iter()
        .map(|(k, f)| row(k, f, by))
        .collect();
    rows.sort_by(|a, b| b.held_s.total_cmp(&a.held_s));
    let mut top_idle: Vec<LedgerRow> = summarise(days, By::User, visible)
        .iter()
        .filter(|(_, f)| f.idle_ms() > 0)
        .map(|(k, f)| row(k, f, By::User))
        .collect();
    top_idle.sort_by(|a, b| b.idle_s.total_cmp(&a.idle_s));
    top_idle.truncate(TOP_IDLE);
    LedgerReply {
        accounting: policy
            .map_or("auto", |p| accounting_name(p.host.accounting))
            .into(),
        all_teams: *viewer == Viewer::All,
        by: format!("{by:?}").to_lowercase(),
        from: day_name(first),
        to: day_name(last),
        idle_rule_teams: policy
            .iter()
            .flat_map(|p| &p.teams)
            .filter(|(t, team)| team.idle.is_some() && viewer.sees(Some(t)))
            .map(|(t, _)| t.to_string())
            .collect(),
        problems,
        rows,
        top_idle,
    }
}

fn accounting_name(a: crate::policy::Accounting) -> &'static str {
    match a {
        crate::policy::Accounting::Auto => "auto",
        crate::policy::Accounting::On => "on",
        crate::policy::Accounting::Off => "off",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(team: &str, user: &str, device: &str) -> Key {
        Key {
            team: team.into(),
            user: user.into(),
            device: device.into(),
            kind: crate::ledger::WHOLE_GPU.into(),
        }
    }

    /// Two hours held, one active, half an hour unknown, 2 GiB for an hour, a quarter of an
    /// hour reclaimed by two stops.
    fn figures() -> Figures {
        Figures {
            held_ms: 7_200_000,
            active_ms: 3_600_000,
            unknown_ms: 1_800_000,
            memory_byte_s: (2u64 << 30) as f64 * 3600.0,
            reclaimed_ms: 900_000,
            stops: 2,
            borrowed_ms: 600_000,
            lent_ms: 300_000,
        }
    }

    #[test]
    fn a_row_is_in_seconds_and_names_what_its_grouping_keeps() {
        let k = key("train", "carol", "0");
        let want = LedgerRow {
            team: Some("train".into()),
            held_s: 7200.0,
            active_s: 3600.0,
            unknown_s: 1800.0,
            // held − active − unknown
            idle_s: 1800.0,
            // active / (held − unknown) = 3600 / 5400
            utilisation: Some(2.0 / 3.0),
            memory_gib_hours: 2.0,
            reclaimed_s: 900.0,
            stops: 2,
            borrowed_s: 600.0,
            lent_s: 300.0,
            ..Default::default()
        };
        assert_eq!(row(&k, &figures(), By::Team), want);
        assert_eq!(
            row(&k, &figures(), By::User),
            LedgerRow {
                user: Some("carol".into()),
                ..want.clone()
            }
        );
        assert_eq!(
            row(&k, &figures(), By::Device),
            LedgerRow {
                team: None,
                device: Some("0".into()),
                kind: Some("gpu".into()),
                ..want
            }
        );
        // Activity never known: no utilisation and no idle time, not 0 % and all idle.
        let blind = Figures {
            held_ms: 1500,
            unknown_ms: 1500,
            ..Default::default()
        };
        let r = row(&k, &blind, By::Team);
        assert_eq!((r.held_s, r.idle_s, r.utilisation), (1.5, 0.0, None));
    }

    #[test]
    fn a_reply_sums_days_ranks_rows_and_shows_a_member_only_its_teams() {
        let mut d1 = Day {
            day: 20_000,
            ..Default::default()
        };
        d1.figures.insert(key("train", "carol", "0"), figures());
        d1.figures.insert(
            key("infer", "alice", "1"),
            Figures {
                held_ms: 1_000_000,
                active_ms: 1_000_000,
                ..Default::default()
            },
        );
        let mut d2 = Day {
            day: 20_001,
            ..Default::default()
        };
        d2.figures.insert(key("train", "carol", "0"), figures());
        d2.figures.insert(
            key("train", "dave", "0"),
            Figures {
                held_ms: 600_000,
                ..Default::default()
            },
        );
        let days = [d1, d2];
        let r = ledger_reply(
            &days,
            vec![],
            By::Team,
            (20_000, 20_001),
            &Viewer::All,
            None,
        );
        assert_eq!(
            (r.from.as_str(), r.to.as_str()),
            ("2024-10-04", "2024-10-05")
        );
        assert_eq!((r.by.as_str(), r.accounting.as_str()), ("team", "auto"));
        assert!(r.all_teams);
        let held: Vec<(Option<&str>, f64)> = r
            .rows
            .iter()
            .map(|r| (r.team.as_deref(), r.held_s))
            .collect();
        // train: two days of 7200 s and dave's 600 s; most held first.
        assert_eq!(
            held,
            vec![(Some("train"), 15_000.0), (Some("infer"), 1000.0)]
        );
        // Idle: carol 2 × 1800 s, dave 600 s; alice was never idle.
        let idle: Vec<(Option<&str>, f64)> = r
            .top_idle
            .iter()
            .map(|r| (r.user.as_deref(), r.idle_s))
            .collect();
        assert_eq!(idle, vec![(Some("carol"), 3600.0), (Some("dave"), 600.0)]);
        let infer_only = Viewer::Teams(["infer".to_string()].into());
        let r = ledger_reply(&days, vec![], By::User, (20_000, 20_001), &infer_only, None);
        assert!(!r.all_teams);
        assert_eq!(r.rows.len(), 1);
        assert_eq!(r.rows[0].user.as_deref(), Some("alice"));
        assert!(r.top_idle.is_empty());
    }
}
