//! The idle rules at work: every `GPUCTL_IDLE_INTERVAL_MS` (while some team has a
//! `[teams.NAME.idle]` rule) take a usage collection through the one collector, feed it to the
//! pure [`crate::idle::Tracker`], and carry out its events: journal entries (structured:
//! `GPUCTL_ACTION=idle|idle-warn|idle-stop|…`, `GPUCTL_TEAM`, `GPUCTL_UNIT`, `GPUCTL_USER`,
//! `GPUCTL_UID`, `GPUCTL_GPU`), messages on the holder's terminals ([`crate::real::tty`]), and
//! stops through the one systemd client. Without rules it reads nothing.
//!
//! The tracker's nominal spacing is the idle interval plus the usage collector's interval: a
//! collection is served to every reader for one usage interval, so two samples can lie that much
//! further apart without anything being missed.

use super::Shared;
use crate::dbus_api::reply::IdleReply;
use crate::dbus_api::Backend;
use crate::events::Kind;
use crate::idle::{not_stoppable, sample, Event, IdleHolder, Tracker};
use crate::paths::Root;
use crate::policy::{Accounting, IdleRule};
use crate::systemd::Systemd;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{error, info, warn};

/// Environment variable: ms between idle samples.
pub const ENV_INTERVAL_MS: &str = "GPUCTL_IDLE_INTERVAL_MS";
/// Default time between idle samples.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(30_000);

/// The interval from `$GPUCTL_IDLE_INTERVAL_MS`, else [`DEFAULT_INTERVAL`] (at least 100 ms).
pub fn interval_from_env() -> Duration {
    std::env::var(ENV_INTERVAL_MS)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_INTERVAL, Duration::from_millis)
        .max(Duration::from_millis(100))
}

fn rules_of(shared: &Mutex<Shared>) -> BTreeMap<String, IdleRule> {
    super::lock(shared)
        .policy
        .as_ref()
        .map(|p| {
            p.teams
                .iter()
                .filter_map(|(t, team)| Some((t.to_string(), team.idle.clone()?)))
                .collect()
        })
        .unwrap_or_default()
}

fn accounting_of(shared: &Mutex<Shared>) -> Accounting {
    super::lock(shared)
        .policy
        .as_ref()
        .map_or(Accounting::Auto, |p| p.host.accounting)
}

fn secs(s: u64) -> String {
    match s {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

/// Run until the runtime ends. `policy_seen` is signalled after every reconcile: while no team
/// has an idle rule the loop waits on it instead of ticking, so an idle host without idle
/// reclaim costs no wakeups (issue 14: 0 wakeups/s while nothing changes).
pub async fn run(
    root: Root,
    backend: Arc<dyn Backend>,
    sd: Systemd,
    shared: Arc<Mutex<Shared>>,
    interval: Duration,
    policy_seen: Arc<tokio::sync::Notify>,
) {
    let spacing = interval + crate::dbus_api::usage::collector_interval();
    let mut tracker = Tracker::new(spacing.as_millis() as u64);
    let mut ledger = super::ledger::LedgerSide::new(&root, spacing.as_millis() as u64);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let rules = rules_of(&shared);
        tracker.set_rules(rules.clone());
        let accounting = accounting_of(&shared);
        // The ledger rides these samples; only `accounting = "on"` keeps them going without
        // idle rules (docs/ledger.md).
        if !tracker.active() && accounting != Accounting::On {
            super::lock(&shared).idle = IdleReply::default();
            // notify_one keeps a permit, so a reconcile that ended before this wait still
            // wakes it; the first sample after rules appear is taken at once.
            policy_seen.notified().await;
            tick.reset_immediately();
            continue;
        }
        let usage = match crate::dbus_api::usage::usage(&*backend, &root).await {
            Ok(u) => u,
            Err(e) => {
                warn!(gpuctl_action = "idle", "idle sample: {e}");
                continue;
            }
        };
        if let Some(why) = &usage.nvml_unavailable {
            // No sample: a gap, not an empty host (which would forget every holder).
            warn!(gpuctl_action = "idle", "idle sample skipped: {why}");
            continue;
        }
        ledger.observe(&usage, &rules, accounting).await;
        if !tracker.active() {
            super::lock(&shared).idle = IdleReply::default();
            continue;
        }
        let s = sample::from_usage(&usage, &rules);
        let events = tracker.observe(&s);
        super::lock(&shared).idle = IdleReply {
            at_ms: s.at_ms,
            interval_ms: interval.as_millis() as u64,
            sampling: true,
            holders: tracker.holders(),
        };
        for e in events {
            let stop = match &e {
                Event::Stop(h) => Some((h.team.clone(), h.unit.clone())),
                _ => None,
            };
            if act(&root, &sd, &rules, e).await {
                if let Some((team, unit)) = stop {
                    ledger.reclaimed(&team, &unit, s.at_ms).await;
                }
            }
        }
    }
}

fn uid_s(h: &IdleHolder) -> String {
    h.uid.map(|u| u.to_string()).unwrap_or_default()
}

async fn tell(root: &Root, h: &IdleHolder, text: String) -> usize {
    let Some(uid) = h.uid else { return 0 };
    let root = root.clone();
    tokio::task::spawn_blocking(move || crate::real::tty::tell(&root, uid, &text).len())
        .await
        .unwrap_or(0)
}

/// The holder's own event (`gpuctl events`), saying what its terminals were told.
fn post(kind: Kind, h: &IdleHolder, text: String) {
    crate::events::post(crate::events::Event {
        user: h.user.clone(),
        uid: h.uid,
        unit: Some(h.unit.clone()),
        device: Some(h.device.clone()),
        ..crate::events::Event::new(kind, Some(&h.team), text)
    });
}

/// Carry out one event; `true` when it sent a stop.
async fn act(root: &Root, sd: &Systemd, rules: &BTreeMap<String, IdleRule>, e: Event) -> bool {
    let user = |h: &IdleHolder| h.user.clone().unwrap_or_else(|| "?".into());
    let why = |h: &IdleHolder| h.reason.map_or_else(|| "idle".into(), |r| r.to_string());
    match e {
        Event::Idle(h) => info!(
            gpuctl_action = "idle",
            gpuctl_team = %h.team,
            gpuctl_unit = %h.unit,
            gpuctl_user = %user(&h),
            gpuctl_uid = %uid_s(&h),
            gpuctl_gpu = %h.device,
            gpuctl_idle_seconds = h.idle_seconds,
            "idle holder: {} of user {} (team {}) on device {}: {} for {}{}",
            h.unit,
            user(&h),
            h.team,
            h.device,
            why(&h),
            secs(h.idle_seconds),
            if h.excluded { " (excluded from actions)" } else { "" }
        ),
        Event::Unknown(h) => info!(
            gpuctl_action = "idle-unknown",
            gpuctl_team = %h.team,
            gpuctl_unit = %h.unit,
            gpuctl_user = %user(&h),
            gpuctl_uid = %uid_s(&h),
            gpuctl_gpu = %h.device,
            "holder {} of user {} (team {}) on device {}: activity unknown (the driver reports \
             none for this device); not acted on",
            h.unit,
            user(&h),
            h.team,
            h.device
        ),
        Event::Warn(h) => {
            let rule = rules.get(&h.team);
            let below = rule.map_or(0.0, |r| r.below);
            // Only a stop that will come is announced (Tracker: not for an excluded unit, a
            // session, or a unit in use on another device).
            let then = match (h.stop_at_ms, &h.not_stopped) {
                (Some(_), _) => format!(
                    "It will be stopped in {} unless it becomes active.",
                    secs(rule.map_or(0, |r| r.grace.as_secs()))
                ),
                (None, Some(no)) => format!("It is not stopped automatically ({no})."),
                (None, None) => String::new(),
            };
            let text = format!(
                "Your GPU job {} (team {}) on device {}: {} for {} (activity below {below}%). {then}",
                h.unit,
                h.team,
                h.device,
                why(&h),
                secs(h.idle_seconds)
            );
            let n = tell(root, &h, text.clone()).await;
            post(Kind::IdleWarn, &h, text.clone());
            warn!(
                gpuctl_action = "idle-warn",
                gpuctl_team = %h.team,
                gpuctl_unit = %h.unit,
                gpuctl_user = %user(&h),
                gpuctl_uid = %uid_s(&h),
                gpuctl_gpu = %h.device,
                gpuctl_idle_seconds = h.idle_seconds,
                "warned user {} (uid {}) on {n} terminal(s): {text}",
                user(&h),
                uid_s(&h)
            );
        }
        Event::Stop(h) => {
            // The tracker only emits stops it may make; checked again at the effector, which
            // also refuses a unit that is not directly in the team's slice.
            let refusal = match rules.get(&h.team).map(|r| not_stoppable(r, &h.unit)) {
                None => Some("the team has no idle rule any more".to_string()),
                Some(Some(no)) => Some(no),
                Some(None) => match in_team_slice(sd, &h).await {
                    Ok(true) => None,
                    Ok(false) => Some(format!(
                        "it is not in {}",
                        crate::systemd::props::slice_unit(&h.team)
                    )),
                    Err(e) => Some(format!("cannot read its slice: {e}")),
                },
            };
            if let Some(no) = refusal {
                warn!(gpuctl_action = "idle-stop", gpuctl_unit = %h.unit, "not stopping {}: {no}", h.unit);
                return false;
            }
            let text = format!(
                "Your GPU job {} (team {}) on device {} is being stopped: {} for {}.",
                h.unit,
                h.team,
                h.device,
                why(&h),
                secs(h.idle_seconds)
            );
            tell(root, &h, text.clone()).await;
            post(Kind::IdleStop, &h, text);
            warn!(
                gpuctl_action = "idle-stop",
                gpuctl_team = %h.team,
                gpuctl_unit = %h.unit,
                gpuctl_user = %user(&h),
                gpuctl_uid = %uid_s(&h),
                gpuctl_gpu = %h.device,
                gpuctl_idle_seconds = h.idle_seconds,
                "stopping {} of user {} (uid {}, team {}, pids {:?}) on device {}: {} for {}, \
                 warned {} ago",
                h.unit,
                user(&h),
                uid_s(&h),
                h.team,
                h.pids,
                h.device,
                why(&h),
                secs(h.idle_seconds),
                secs(
                    h.warned_at_ms
                        .map_or(0, |w| crate::daemon::unix_now().saturating_sub(w / 1000))
                )
            );
            match sd.stop_unit(&h.unit).await {
                Ok(_) => return true,
                Err(e) => {
                    error!(gpuctl_action = "idle-stop", gpuctl_unit = %h.unit, "stop {}: {e}", h.unit)
                }
            }
        }
        Event::Woke(h) => info!(
            gpuctl_action = "idle-woke",
            gpuctl_team = %h.team,
            gpuctl_unit = %h.unit,
            gpuctl_user = %user(&h),
            gpuctl_uid = %uid_s(&h),
            gpuctl_gpu = %h.device,
            "{} of user {} (team {}) on device {} is active again; nothing pending",
            h.unit,
            user(&h),
            h.team,
            h.device
        ),
        Event::Gone(h) => info!(
            gpuctl_action = "idle-gone",
            gpuctl_team = %h.team,
            gpuctl_unit = %h.unit,
            gpuctl_gpu = %h.device,
            "{} (team {}) holds device {} no more",
            h.unit,
            h.team,
            h.device
        ),
    }
    false
}

/// Whether systemd puts the unit directly in `gpu-<team>.slice` (its `Slice` property).
async fn in_team_slice(sd: &Systemd, h: &IdleHolder) -> Result<bool, crate::systemd::SystemdError> {
    let slice = sd.unit_slice(&h.unit).await?;
    Ok(slice.as_deref() == Some(crate::systemd::props::slice_unit(&h.team).as_str()))
}
