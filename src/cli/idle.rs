//! `gpuctl idle [--json] [--all]`: the holders gpuctld's idle rules flag (`Idle` on the bus).

use super::shell::{parse_reply, with_agent, Failure};
use crate::dbus_api::reply::IdleReply;
use crate::idle::{IdleHolder, Phase};
use clap::Args;

/// Arguments of `gpuctl idle`.
#[derive(Debug, Args)]
#[command(
    after_long_help = "Per holder (a unit in a team's slice with GPU memory on one of the \
team's devices): team, user, unit, device, state, observed idle time, and what is pending. \
States: idle (reported), warned, stopping; `activity unknown`: the device reports no activity \
(a MIG device before Hopper), so the holder is never acted on for idleness. Rules: \
[teams.NAME.idle] in gpuctl.policy(5).

Exit status: 0; 6 gpuctld not running; 2 other failure."
)]
pub struct IdleArgs {
    /// Print the daemon's JSON document (every tracked holder, busy ones too).
    #[arg(long)]
    pub json: bool,
    /// Also list holders that are busy or idle for less than their window.
    #[arg(long)]
    pub all: bool,
}

fn dur(s: u64) -> String {
    match s {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

fn state(h: &IdleHolder) -> String {
    let mut s = match h.phase {
        Phase::Busy => "busy",
        Phase::Idling => "idling",
        Phase::Idle => "idle",
        Phase::Warned => "warned",
        Phase::Stopping => "stopping",
    }
    .to_string();
    if let Some(crate::idle::Reason::MemoryAlarm(p)) = h.reason {
        s = format!("{s} (memory {p:.0}%)");
    }
    if h.excluded {
        s.push_str(" (excluded)");
    }
    s
}

/// Whether `gpuctl idle` (without `--all`) shows the holder.
fn flagged(h: &IdleHolder) -> bool {
    h.activity_unknown || matches!(h.phase, Phase::Idle | Phase::Warned | Phase::Stopping)
}

/// The human view of an `Idle` reply.
pub fn render(r: &IdleReply, all: bool) -> String {
    if !r.sampling {
        return "no team has an idle rule ([teams.NAME.idle]); nothing is watched\n".into();
    }
    let rows: Vec<&IdleHolder> = r.holders.iter().filter(|h| all || flagged(h)).collect();
    let mut o = format!(
        "{} idle holder(s) of {} watched\n",
        r.holders.iter().filter(|h| flagged(h)).count(),
        r.holders.len()
    );
    if rows.is_empty() {
        return o;
    }
    o.push_str(&format!(
        "{:<10} {:<10} {:<36} {:<14} {:<22} {:>8}  {}\n",
        "TEAM", "USER", "UNIT", "DEVICE", "STATE", "IDLE", "PENDING"
    ));
    for h in rows {
        let idle = if h.activity_unknown {
            "activity unknown".to_string()
        } else {
            dur(h.idle_seconds)
        };
        let mut dev = h.device.clone();
        if h.shared_device {
            dev.push_str(" (shared)");
        }
        o.push_str(&format!(
            "{:<10} {:<10} {:<36} {:<14} {:<22} {:>8}  {}\n",
            h.team,
            h.user.as_deref().unwrap_or("?"),
            h.shown_unit(),
            dev,
            state(h),
            idle,
            h.pending(r.at_ms).unwrap_or_else(|| "-".into()),
        ));
    }
    o
}

/// `--json`: the `Idle` document as read, fields in their declared order.
pub fn render_json(r: &IdleReply) -> String {
    serde_json::to_string_pretty(r).unwrap_or_default()
}

/// gpuctld's `Idle` reply.
pub fn fetch() -> Result<IdleReply, Failure> {
    with_agent("Idle", async |p| p.idle().await).and_then(|t| parse_reply("Idle", &t))
}

/// Run `gpuctl idle`.
pub fn run(args: &IdleArgs) -> i32 {
    let r: IdleReply = match fetch() {
        Ok(r) => r,
        Err(f) => return f.report(),
    };
    if args.json {
        println!("{}", render_json(&r));
    } else {
        print!("{}", render(&r, args.all));
    }
    super::exit::OK
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idle::{Activity, HolderSample, Sample, Tracker};
    use crate::policy::{IdleAction, IdleRule};
    use std::time::Duration;

    #[test]
    fn lists_flagged_holders_with_what_is_pending() {
        let mut t = Tracker::new(10_000);
        t.set_rules(
            [(
                "research".to_string(),
                IdleRule {
                    after: Duration::from_secs(60),
                    below: 5.0,
                    action: IdleAction::Stop,
                    grace: Duration::from_secs(600),
                    exclude: vec![],
                    memory_alarm: None,
                },
            )]
            .into(),
        );
        let h = |unit: &str, dev: &str, a| HolderSample {
            team: "research".into(),
            unit: unit.into(),
            user: Some("ann".into()),
            uid: Some(1001),
            device: dev.into(),
            pids: vec![1],
            activity: a,
            sharing: 1,
            ..Default::default()
        };
        let mut last = 0;
        for i in 0..8 {
            last = i * 10_000;
            t.observe(&Sample {
                at_ms: last,
                holders: vec![
                    h("nb.scope", "0", Activity::Percent(0.0)),
                    h("train.service", "1", Activity::Percent(90.0)),
                    h("mig.service", "MIG-x", Activity::Unknown),
                ],
            });
        }
        let r = IdleReply {
            at_ms: last,
            interval_ms: 10_000,
            sampling: true,
            holders: t.holders(),
        };
        let s = render(&r, false);
        assert!(s.starts_with("2 idle holder(s) of 3 watched\n"), "{s}");
        let nb = s.lines().find(|l| l.contains("nb.scope")).unwrap();
        assert!(nb.contains("warned"), "{nb}");
        assert!(nb.contains("stop nb.scope"), "{nb}");
        assert!(nb.contains("in 590s"), "{nb}");
        let mig = s.lines().find(|l| l.contains("mig.service")).unwrap();
        assert!(mig.contains("activity unknown"), "{mig}");
        assert!(
            !s.contains("train.service"),
            "busy holders only with --all: {s}"
        );
        assert!(render(&r, true).contains("train.service"));
        let none = IdleReply::default();
        assert!(render(&none, false).contains("no team has an idle rule"));
    }
}
