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
use crate::ledger::{day_name, parse_day, summarise, By, Figures, Key};
use crate::paths::Root;
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
    let visible = |k: &Key| viewer.sees(Some(&k.team));
    let mut rows: Vec<LedgerRow> = summarise(&days, by, visible)
        .iter()
        .map(|(k, f)| row(k, f, by))
        .collect();
    rows.sort_by(|a, b| b.held_s.total_cmp(&a.held_s));
    let mut top_idle: Vec<LedgerRow> = summarise(&days, By::User, visible)
        .iter()
        .filter(|(_, f)| f.idle_ms() > 0)
        .map(|(k, f)| row(k, f, By::User))
        .collect();
    top_idle.sort_by(|a, b| b.idle_s.total_cmp(&a.idle_s));
    top_idle.truncate(TOP_IDLE);
    let reply = LedgerReply {
        accounting: policy
            .as_ref()
            .map_or("auto", |p| accounting_name(p.host.accounting))
            .into(),
        all_teams: all,
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
    };
    serde_json::to_string(&reply).map_err(|e| fdo::Error::Failed(e.to_string()).into())
}

fn accounting_name(a: crate::policy::Accounting) -> &'static str {
    match a {
        crate::policy::Accounting::Auto => "auto",
        crate::policy::Accounting::On => "on",
        crate::policy::Accounting::Off => "off",
    }
}
