//! Idle shares: which holders of a team's GPU share sit idle (or run away with its memory), and
//! what the team's `[teams.NAME.idle]` rule says to do about them.
//!
//! Pure: [`Tracker::observe`] takes a [`Sample`] (built from a usage collection by
//! [`sample::from_usage`]) with its time, and returns [`Event`]s; gpuctld (the composition root)
//! does the journal, the terminals and the systemd stop. No clock, no I/O here.
//!
//! A **holder** is a unit directly in `gpu-<team>.slice` with processes holding memory on one of
//! the team's devices; it is tracked per (team, unit, device). Its **activity** is the device's
//! (GPM SM activity, else NVML GPU utilisation; `Unknown` for MIG without GPM).
//!
//! ## The state machine (per holder; `dt` = time since the previous sample)
//!
//! | state | input (one sample) | next state | event |
//! |---|---|---|---|
//! | — | holder appears | `Busy` (idle 0) | — |
//! | any but `Stopping` | activity ≥ `below` | `Busy`, idle time reset to 0 | `Woke` if it was `Idle`/`Warned` and memory is under the alarm |
//! | `Busy`/`Idling` | activity < `below`, `dt` ≤ 1.5 × interval | `Idling`, idle += `dt` | — |
//! | `Busy`/`Idling` | activity < `below`, `dt` > 1.5 × interval (a gap) | unchanged: the gap does not count, nor reset | — |
//! | any | activity unknown | unchanged; unknown time += `dt` | `Unknown` once, when unknown time reaches `after` |
//! | `Idling`/`Busy` | idle ≥ `after`, or memory ≥ `memory-alarm` | `Idle` | `Idle` (report: journal and metric) |
//! | `Idle` | action `warn`/`stop`, not excluded | `Warned` (at now) | `Warn` (terminals, journal with uid); with `stop`: the stop time, or why it will not be stopped |
//! | `Warned` | action `stop`, now ≥ warned + `grace`, still idle, stoppable, every holder of the unit `Warned` | `Stopping` | `Stop` |
//! | `Idle`/`Warned` | excluded unit | stays `Idle` (listed `excluded`) | none beyond `Idle` |
//! | any | holder absent from the sample | forgotten | `Gone` if it had been reported |
//!
//! Stoppable: a `.service` or `.scope` directly in the team's slice, not `session-*.scope`, not
//! `gpuctl-mps@*`, not matching `exclude`. A unit with holders on several devices is stopped only
//! when all of them are due (a busy device elsewhere keeps it).
//!
//! Decisions about gaps and guesses: a span between samples longer than 1.5 intervals (gpuctld
//! stopped, NVML hung) is not observed, so it is not idle time; it does not reset the count either
//! (nothing was seen to be busy). Unknown activity never counts as idle, so a holder whose device
//! has no activity counter is reported ("activity unknown") and never warned or stopped for
//! idleness; its memory alarm still works, memory being measured.

use crate::policy::{IdleAction, IdleRule};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

pub mod sample;

/// Activity of a holder's device over the span that ends at the sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub enum Activity {
    /// Percent (GPM SM activity, or GPU utilisation).
    Percent(f64),
    /// The driver offers no activity for this device.
    #[default]
    Unknown,
}

/// One holder in one sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HolderSample {
    /// Team whose slice the unit runs in.
    pub team: String,
    /// The unit directly in `gpu-<team>.slice`.
    pub unit: String,
    /// User name of its processes (the first one's).
    pub user: Option<String>,
    /// uid of its processes (the first one's).
    pub uid: Option<u32>,
    /// Device: the GPU index as text, or the MIG UUID.
    pub device: String,
    /// Its processes on the device.
    pub pids: Vec<u32>,
    /// GPU memory its processes hold, bytes (`None`: the driver does not say).
    pub memory: Option<u64>,
    /// The device's memory, bytes.
    pub capacity: Option<u64>,
    /// The device's activity.
    pub activity: Activity,
    /// How many holders share the device (activity is per device, not per holder).
    pub sharing: usize,
}

/// What a collection says about every holder of every team with an idle rule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Unix ms of the collection.
    pub at_ms: u64,
    /// Holders.
    pub holders: Vec<HolderSample>,
}

/// Where a holder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Active, or idle for less than `after`.
    Busy,
    /// Idle for less than `after` but some.
    Idling,
    /// Idle for `after` (or over its memory alarm): reported.
    Idle,
    /// Warned; with `stop`, stopped after `grace`.
    Warned,
    /// The stop was sent.
    Stopping,
}

/// Why a holder is flagged.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// Activity below the threshold for the window.
    Idle,
    /// Memory at or above the alarm, percent of the device.
    MemoryAlarm(f64),
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Idle => f.write_str("idle"),
            Reason::MemoryAlarm(p) => write!(f, "memory runaway ({p:.0}% of the device)"),
        }
    }
}

/// One holder as `gpuctl idle`, the metrics and `gpuctl plan` see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleHolder {
    /// Team.
    pub team: String,
    /// Unit or scope.
    pub unit: String,
    /// User name.
    pub user: Option<String>,
    /// uid.
    pub uid: Option<u32>,
    /// GPU index or MIG UUID.
    pub device: String,
    /// Its processes.
    pub pids: Vec<u32>,
    /// GPU memory held, bytes.
    pub memory: Option<u64>,
    /// Where it stands.
    pub phase: Phase,
    /// Why it is flagged (phases `Idle`, `Warned`, `Stopping`).
    pub reason: Option<Reason>,
    /// Observed idle time, seconds.
    pub idle_seconds: u64,
    /// Unix ms of the first sample of the current idle stretch.
    pub idle_since_ms: Option<u64>,
    /// The device offers no activity: never acted on for idleness.
    pub activity_unknown: bool,
    /// Last activity seen, percent.
    pub activity: Option<f64>,
    /// Other holders share the device: the activity is the device's, not this holder's own.
    pub shared_device: bool,
    /// Matches the rule's `exclude`.
    pub excluded: bool,
    /// The rule's action.
    pub action: IdleAction,
    /// When it was warned, unix ms.
    pub warned_at_ms: Option<u64>,
    /// When it will be stopped, unix ms (stop rule, warned, stoppable).
    pub stop_at_ms: Option<u64>,
    /// Why the stop rule will not stop it, when it will not.
    pub not_stopped: Option<String>,
    /// Idling under a `warn`/`stop` rule: observed idle time still needed before the warning.
    pub warn_in_seconds: Option<u64>,
}

impl IdleHolder {
    /// Drop what names the holder (unit, user, uid, pids) for a caller who may not read its
    /// team's per-process detail ([`crate::join::Viewer`]); team, device, state and times stay.
    pub fn redact(&mut self) {
        self.unit.clear();
        self.user = None;
        self.uid = None;
        self.pids.clear();
    }

    /// Its unit as shown: `(hidden)` once [`IdleHolder::redact`]ed.
    pub fn shown_unit(&self) -> &str {
        if self.unit.is_empty() {
            "(hidden)"
        } else {
            &self.unit
        }
    }

    /// The pending idle action, in words, for `gpuctl plan` (`None`: nothing pending).
    pub fn pending(&self, now_ms: u64) -> Option<String> {
        let who = format!(
            "{} ({}, user {}, device {})",
            self.shown_unit(),
            self.team,
            self.user.as_deref().unwrap_or("?"),
            self.device
        );
        let why = self
            .reason
            .map_or_else(|| "idle".to_string(), |r| r.to_string());
        match self.phase {
            Phase::Stopping => Some(format!("stopping {who}: {why}")),
            Phase::Warned => match (self.stop_at_ms, &self.not_stopped) {
                (Some(at), _) => Some(format!(
                    "stop {who} in {}s unless it becomes active: {why} for {}s, warned",
                    at.saturating_sub(now_ms) / 1000,
                    self.idle_seconds
                )),
                (None, Some(n)) if self.action == IdleAction::Stop => {
                    Some(format!("warned {who}: {why}; not stopped: {n}"))
                }
                _ => None,
            },
            Phase::Idling => self.warn_in_seconds.map(|s| {
                format!(
                    "{} {who} after {s}s more idle time (idle {}s)",
                    self.action, self.idle_seconds
                )
            }),
            Phase::Idle if self.excluded && self.action != IdleAction::Report => Some(format!(
                "none for {who}: idle ({why}) but excluded by the rule"
            )),
            _ => None,
        }
    }
}

/// Something gpuctld must do or log.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Newly idle (or over its memory alarm): journal entry (and the metric shows it).
    Idle(IdleHolder),
    /// Held memory for `after` with no activity counter: reported, never acted on.
    Unknown(IdleHolder),
    /// Tell the user (terminals, journal with uid).
    Warn(IdleHolder),
    /// Stop the unit through systemd.
    Stop(IdleHolder),
    /// Became active again (or its memory fell) after it was reported: warning withdrawn.
    Woke(IdleHolder),
    /// A reported holder holds the device no more.
    Gone(IdleHolder),
}

/// A span longer than this many intervals between two samples is a gap (not observed).
const GAP_FACTOR_NUM: u64 = 3;
const GAP_FACTOR_DEN: u64 = 2;

type Key = (String, String, String);

#[derive(Debug, Clone, Default)]
struct Track {
    last: HolderSample,
    last_ms: u64,
    idle_ms: u64,
    idle_since_ms: Option<u64>,
    unknown_ms: u64,
    unknown_reported: bool,
    reported: bool,
    reason: Option<Reason>,
    warned_at_ms: Option<u64>,
    stopping: bool,
}

/// The per-holder state of every team's idle rule.
#[derive(Debug, Clone)]
pub struct Tracker {
    interval_ms: u64,
    tracks: BTreeMap<Key, Track>,
    rules: BTreeMap<String, IdleRule>,
    last_at_ms: Option<u64>,
}

/// Case-sensitive glob with `*` and `?` over a unit name (systemd's unit patterns are
/// case-sensitive; `policy::validate::glob_match` folds case for GPU model names).
pub fn unit_glob(pattern: &str, name: &str) -> bool {
    crate::policy::validate::glob_case(pattern, name)
}

/// Why gpuctl may not stop `unit` of `team`, or `None` when it may.
pub fn not_stoppable(rule: &IdleRule, unit: &str) -> Option<String> {
    if rule.exclude.iter().any(|g| unit_glob(g, unit)) {
        return Some("excluded by the rule".into());
    }
    if unit.starts_with("session-") && unit.ends_with(".scope") {
        return Some("a login session".into());
    }
    if unit.starts_with("slurm job ") {
        return Some("a Slurm job: Slurm's limits end it, gpuctl only reports".into());
    }
    if unit.starts_with("gpuctl-mps@") {
        return Some("gpuctl's own MPS daemon".into());
    }
    if !(unit.ends_with(".service") || unit.ends_with(".scope")) {
        return Some("not a service or scope".into());
    }
    None
}

impl Tracker {
    /// A tracker for samples taken every `interval_ms`.
    pub fn new(interval_ms: u64) -> Tracker {
        Tracker {
            interval_ms: interval_ms.max(1),
            tracks: BTreeMap::new(),
            rules: BTreeMap::new(),
            last_at_ms: None,
        }
    }

    /// The rules in force (team → rule). Holders of teams without one are forgotten at the next
    /// sample; a changed rule applies from the next sample on.
    pub fn set_rules(&mut self, rules: BTreeMap<String, IdleRule>) {
        self.rules = rules;
    }

    /// Whether any team has a rule (gpuctld samples only then).
    pub fn active(&self) -> bool {
        !self.rules.is_empty()
    }

    fn max_gap(&self) -> u64 {
        self.interval_ms * GAP_FACTOR_NUM / GAP_FACTOR_DEN
    }

    /// Feed one sample; returns what to do, in holder order.
    pub fn observe(&mut self, s: &Sample) -> Vec<Event> {
        let now = s.at_ms;
        let prev_at = self.last_at_ms.replace(now);
        let max_gap = self.max_gap();
        let mut events = Vec::new();
        let mut seen: BTreeMap<Key, ()> = BTreeMap::new();
        for h in &s.holders {
            let Some(rule) = self.rules.get(&h.team).cloned() else {
                continue;
            };
            let key = (h.team.clone(), h.unit.clone(), h.device.clone());
            seen.insert(key.clone(), ());
            let t = self.tracks.entry(key).or_insert_with(|| Track {
                last: h.clone(),
                last_ms: now,
                ..Default::default()
            });
            // Only a span both ends of which saw this holder, and no longer than a gap, counts.
            let dt = match prev_at {
                Some(p) if t.last_ms == p && now > p && now - p <= max_gap => now - p,
                _ => 0,
            };
            t.last_ms = now;
            t.last = h.clone();
            let alarm = alarm_of(&rule, h);
            let busy = match h.activity {
                Activity::Percent(a) => {
                    t.unknown_ms = 0;
                    t.unknown_reported = false;
                    if a < rule.below {
                        if t.idle_since_ms.is_none() {
                            t.idle_since_ms = Some(prev_at.filter(|_| dt > 0).unwrap_or(now));
                        }
                        t.idle_ms += dt;
                        false
                    } else {
                        true
                    }
                }
                Activity::Unknown => {
                    // Never idle on a guess; not busy either (nothing was seen).
                    t.unknown_ms += dt;
                    false
                }
            };
            if busy {
                t.idle_ms = 0;
                t.idle_since_ms = None;
            }
            let after = rule.after.as_millis() as u64;
            let reason = (t.idle_ms >= after)
                .then_some(Reason::Idle)
                .or(alarm.map(Reason::MemoryAlarm));
            match reason {
                None if t.reported && !t.stopping => {
                    t.reported = false;
                    t.reason = None;
                    t.warned_at_ms = None;
                    events.push(Event::Woke(view(t, &rule)));
                }
                None => {}
                Some(r) => {
                    t.reason = Some(r);
                    if !t.reported {
                        t.reported = true;
                        events.push(Event::Idle(view(t, &rule)));
                    }
                    let excluded = rule.exclude.iter().any(|g| unit_glob(g, &h.unit));
                    if rule.action >= IdleAction::Warn && !excluded && t.warned_at_ms.is_none() {
                        t.warned_at_ms = Some(now);
                        events.push(Event::Warn(view(t, &rule)));
                    }
                }
            }
            if matches!(h.activity, Activity::Unknown)
                && !t.unknown_reported
                && t.unknown_ms >= after
            {
                t.unknown_reported = true;
                events.push(Event::Unknown(view(t, &rule)));
            }
        }
        // Forget holders not in this sample (or whose team lost its rule).
        let (kept, gone): (BTreeMap<Key, Track>, _) = std::mem::take(&mut self.tracks)
            .into_iter()
            .partition(|(k, _)| seen.contains_key(k));
        self.tracks = kept;
        for ((team, _, _), t) in gone {
            if let (true, Some(rule)) = (t.reported, self.rules.get(&team)) {
                events.push(Event::Gone(view(&t, rule)));
            }
        }
        // A warning says what will happen: a unit still busy on another device is not stopped,
        // so it is told it is idle, not given a stop time.
        let busy = self.busy_units();
        for e in &mut events {
            if let Event::Warn(h) = e {
                busy_elsewhere(h, &busy);
            }
        }
        // Stops: per unit, when every holder of it is due.
        let mut due: BTreeMap<(String, String), bool> = BTreeMap::new();
        for ((team, unit, _), t) in &self.tracks {
            let Some(rule) = self.rules.get(team) else {
                continue;
            };
            let ok = rule.action == IdleAction::Stop
                && !t.stopping
                && t.reason.is_some()
                && not_stoppable(rule, unit).is_none()
                && t.warned_at_ms
                    .is_some_and(|w| now >= w + rule.grace.as_millis() as u64);
            due.entry((team.clone(), unit.clone()))
                .and_modify(|d| *d &= ok)
                .or_insert(ok);
        }
        for ((team, unit), _) in due.into_iter().filter(|(_, ok)| *ok) {
            let rule = self.rules[&team].clone();
            let mut first = None;
            for ((_, _, _), t) in self
                .tracks
                .iter_mut()
                .filter(|((tm, u, _), _)| *tm == team && *u == unit)
            {
                t.stopping = true;
                first.get_or_insert_with(|| view(t, &rule));
            }
            if let Some(v) = first {
                events.push(Event::Stop(v));
            }
        }
        events
    }

    /// Every tracked holder, as `gpuctl idle` lists them.
    pub fn holders(&self) -> Vec<IdleHolder> {
        let busy = self.busy_units();
        self.tracks
            .iter()
            .filter_map(|((team, _, _), t)| {
                let mut v = view(t, self.rules.get(team)?);
                busy_elsewhere(&mut v, &busy);
                Some(v)
            })
            .collect()
    }

    /// (team, unit) of every unit with a holder that is not flagged: the stop rule waits for all
    /// of a unit's holders, so such a unit is not stopped.
    fn busy_units(&self) -> BTreeSet<(String, String)> {
        self.tracks
            .iter()
            .filter(|(_, t)| t.reason.is_none() && !t.stopping)
            .map(|((team, unit, _), _)| (team.clone(), unit.clone()))
            .collect()
    }
}

/// A flagged holder whose unit is busy on another device: no stop time, and why not.
fn busy_elsewhere(h: &mut IdleHolder, busy: &BTreeSet<(String, String)>) {
    let flagged = h.reason.is_some();
    if flagged
        && h.action == IdleAction::Stop
        && h.not_stopped.is_none()
        && busy.contains(&(h.team.clone(), h.unit.clone()))
    {
        h.stop_at_ms = None;
        h.not_stopped = Some("in use on another device".into());
    }
}

fn alarm_of(rule: &IdleRule, h: &HolderSample) -> Option<f64> {
    let (Some(limit), Some(m), Some(c)) = (rule.memory_alarm, h.memory, h.capacity) else {
        return None;
    };
    let pct = m as f64 * 100.0 / c.max(1) as f64;
    (c > 0 && pct >= limit).then_some(pct)
}

fn view(t: &Track, rule: &IdleRule) -> IdleHolder {
    let h = &t.last;
    let excluded = rule.exclude.iter().any(|g| unit_glob(g, &h.unit));
    let phase = if t.stopping {
        Phase::Stopping
    } else if t.warned_at_ms.is_some() {
        Phase::Warned
    } else if t.reason.is_some() {
        Phase::Idle
    } else if t.idle_ms > 0 {
        Phase::Idling
    } else {
        Phase::Busy
    };
    let not_stopped = (rule.action == IdleAction::Stop)
        .then(|| not_stoppable(rule, &h.unit))
        .flatten();
    let stop_at_ms = match (rule.action, &not_stopped, t.warned_at_ms) {
        (IdleAction::Stop, None, Some(w)) => Some(w + rule.grace.as_millis() as u64),
        _ => None,
    };
    IdleHolder {
        team: h.team.clone(),
        unit: h.unit.clone(),
        user: h.user.clone(),
        uid: h.uid,
        device: h.device.clone(),
        pids: h.pids.clone(),
        memory: h.memory,
        phase,
        reason: t.reason,
        idle_seconds: t.idle_ms / 1000,
        idle_since_ms: t.idle_since_ms,
        activity_unknown: matches!(h.activity, Activity::Unknown),
        activity: match h.activity {
            Activity::Percent(a) => Some(a),
            Activity::Unknown => None,
        },
        shared_device: h.sharing > 1,
        excluded,
        action: rule.action,
        warned_at_ms: t.warned_at_ms,
        stop_at_ms,
        not_stopped,
        warn_in_seconds: (phase == Phase::Idling && rule.action >= IdleAction::Warn && !excluded)
            .then(|| (rule.after.as_millis() as u64).saturating_sub(t.idle_ms) / 1000),
    }
}

/// Mark the processes of `usage` that the idle rules flag (by pid and device), for `gpuctl top`.
pub fn mark(usage: &mut crate::usage::Usage, holders: &[IdleHolder]) {
    for g in &mut usage.gpus {
        let dev = g.index.to_string();
        let mark_all = |procs: &mut [crate::usage::ProcessUsage], dev: &str| {
            for p in procs {
                let h = holders
                    .iter()
                    .find(|h| h.device == dev && h.pids.contains(&p.pid));
                p.idle = h.and_then(|h| match h.phase {
                    Phase::Idle => Some("idle".to_string()),
                    Phase::Warned => Some("warned".to_string()),
                    Phase::Stopping => Some("stopping".to_string()),
                    _ if h.activity_unknown => Some("activity unknown".to_string()),
                    _ => None,
                });
            }
        };
        mark_all(&mut g.processes, &dev);
        for m in &mut g.mig_devices {
            mark_all(&mut m.processes, &m.uuid);
        }
    }
}

#[cfg(test)]
mod tests;
