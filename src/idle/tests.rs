//! The idle state machine on synthetic samples: one test per row (or edge) of the table in the
//! module header.

use super::sample::from_usage;
use super::*;
use crate::usage::{GpuUsage, MigUsage, ProcessUsage, Usage};
use std::time::Duration;

const IV: u64 = 10_000; // sample interval, ms

fn rule(action: IdleAction) -> IdleRule {
    IdleRule {
        after: Duration::from_secs(60),
        below: 5.0,
        action,
        grace: Duration::from_secs(30),
        exclude: vec!["triton-*.service".into()],
        memory_alarm: None,
    }
}

fn tracker(team: &str, r: IdleRule) -> Tracker {
    let mut t = Tracker::new(IV);
    t.set_rules([(team.to_string(), r)].into());
    t
}

fn holder(unit: &str, device: &str, activity: Activity) -> HolderSample {
    HolderSample {
        team: "research".into(),
        unit: unit.into(),
        user: Some("ann".into()),
        uid: Some(1001),
        device: device.into(),
        pids: vec![4242],
        memory: Some(1 << 30),
        capacity: Some(80 << 30),
        activity,
        sharing: 1,
    }
}

fn at(ms: u64, holders: Vec<HolderSample>) -> Sample {
    Sample { at_ms: ms, holders }
}

fn idle(unit: &str) -> HolderSample {
    holder(unit, "0", Activity::Percent(1.0))
}

fn busy(unit: &str) -> HolderSample {
    holder(unit, "0", Activity::Percent(60.0))
}

/// Feed samples every interval from `from` (inclusive) for `n` samples; all events.
fn run(
    t: &mut Tracker,
    from: u64,
    n: u64,
    hs: impl Fn(u64) -> Vec<HolderSample>,
) -> Vec<(u64, Event)> {
    let mut out = Vec::new();
    for i in 0..n {
        let ms = from + i * IV;
        out.extend(t.observe(&at(ms, hs(ms))).into_iter().map(|e| (ms, e)));
    }
    out
}

fn kinds(evs: &[(u64, Event)]) -> Vec<(u64, &'static str)> {
    let kind = |e: &Event| match e {
        Event::Idle(_) => "idle",
        Event::Unknown(_) => "unknown",
        Event::Warn(_) => "warn",
        Event::Stop(_) => "stop",
        Event::Woke(_) => "woke",
        Event::Gone(_) => "gone",
    };
    evs.iter().map(|(ms, e)| (*ms, kind(e))).collect()
}

#[test]
fn below_threshold_for_the_window_is_idle_and_not_a_sample_earlier() {
    let mut t = tracker("research", rule(IdleAction::Report));
    // First sample at 0 starts the stretch; 60 s of observed time is reached at 60 s.
    let ev = run(&mut t, 0, 10, |_| vec![idle("a.service")]);
    assert_eq!(kinds(&ev), vec![(60_000, "idle")]);
    let h = &t.holders()[0];
    assert_eq!(h.phase, Phase::Idle);
    assert_eq!(h.idle_seconds, 90);
    assert_eq!(h.idle_since_ms, Some(0));
    assert_eq!(h.reason, Some(Reason::Idle));
    assert_eq!(h.stop_at_ms, None);
}

#[test]
fn at_the_threshold_is_not_below() {
    let mut t = tracker("research", rule(IdleAction::Report));
    let ev = run(&mut t, 0, 10, |_| {
        vec![holder("a.service", "0", Activity::Percent(5.0))]
    });
    assert!(ev.is_empty(), "{ev:?}");
    assert_eq!(t.holders()[0].phase, Phase::Busy);
}

#[test]
fn activity_above_the_threshold_resets_the_window() {
    let mut t = tracker("research", rule(IdleAction::Report));
    // Idle 0..50 s, one busy sample at 50 s, idle again: the 60 s count again from 50 s.
    let ev = run(&mut t, 0, 15, |ms| {
        if ms == 50_000 {
            vec![busy("a.service")]
        } else {
            vec![idle("a.service")]
        }
    });
    // The span (50 s, 60 s] is the first idle one again: 60 s of it at 110 s.
    assert_eq!(kinds(&ev), vec![(110_000, "idle")]);
    assert_eq!(t.holders()[0].idle_since_ms, Some(50_000));
}

#[test]
fn a_gap_in_samples_is_not_idle_time_and_does_not_reset() {
    let mut t = tracker("research", rule(IdleAction::Report));
    // 0..30 s sampled (30 s idle), then nothing until 330 s, then sampled again.
    let mut ev = run(&mut t, 0, 4, |_| vec![idle("a.service")]);
    assert_eq!(t.holders()[0].idle_seconds, 30);
    ev.extend(run(&mut t, 330_000, 3, |_| vec![idle("a.service")]));
    // The 300 s gap did not count: 30 + 0 + 10 + 10 = 50 s < 60 s.
    assert!(ev.is_empty(), "{ev:?}");
    assert_eq!(t.holders()[0].idle_seconds, 50);
    ev.extend(run(&mut t, 360_000, 1, |_| vec![idle("a.service")]));
    assert_eq!(kinds(&ev), vec![(360_000, "idle")]);
}

#[test]
fn jitter_up_to_one_and_a_half_intervals_counts() {
    let mut t = tracker("research", rule(IdleAction::Report));
    for ms in [0, 15_000, 30_000, 45_000, 60_000] {
        t.observe(&at(ms, vec![idle("a.service")]));
    }
    assert_eq!(t.holders()[0].idle_seconds, 60);
    let mut t = tracker("research", rule(IdleAction::Report));
    for ms in [0, 15_001, 30_002] {
        t.observe(&at(ms, vec![idle("a.service")]));
    }
    assert_eq!(t.holders()[0].idle_seconds, 0, "each span is a gap");
}

#[test]
fn a_holder_missing_from_one_sample_starts_over() {
    let mut t = tracker("research", rule(IdleAction::Report));
    let ev = run(&mut t, 0, 12, |ms| {
        if ms == 40_000 {
            vec![]
        } else {
            vec![idle("a.service")]
        }
    });
    // Forgotten at 40 s (never reported: no Gone), new from 50 s: idle at 110 s.
    assert_eq!(kinds(&ev), vec![(110_000, "idle")]);
}

#[test]
fn activity_unknown_is_reported_and_never_warned_or_stopped() {
    let mut t = tracker("research", rule(IdleAction::Stop));
    let ev = run(&mut t, 0, 30, |_| {
        vec![holder("a.service", "MIG-x", Activity::Unknown)]
    });
    assert_eq!(kinds(&ev), vec![(60_000, "unknown")]);
    let h = &t.holders()[0];
    assert!(h.activity_unknown);
    assert_eq!(h.phase, Phase::Busy);
    assert_eq!(h.idle_seconds, 0);
    assert_eq!(h.pending(300_000), None);
}

#[test]
fn unknown_spans_do_not_count_toward_idle() {
    let mut t = tracker("research", rule(IdleAction::Report));
    // Alternating known-idle and unknown: only the known spans count (10 s every 20 s).
    let ev = run(&mut t, 0, 12, |ms| {
        let a = if (ms / IV) % 2 == 0 {
            Activity::Percent(0.0)
        } else {
            Activity::Unknown
        };
        vec![holder("a.service", "0", a)]
    });
    assert!(ev.is_empty(), "{ev:?}");
    assert_eq!(t.holders()[0].idle_seconds, 50);
}

#[test]
fn report_only_never_warns_or_stops() {
    let mut t = tracker("research", rule(IdleAction::Report));
    let ev = run(&mut t, 0, 100, |_| vec![idle("a.service")]);
    assert_eq!(kinds(&ev), vec![(60_000, "idle")]);
}

#[test]
fn warn_warns_once_and_never_stops() {
    let mut t = tracker("research", rule(IdleAction::Warn));
    let ev = run(&mut t, 0, 100, |_| vec![idle("a.service")]);
    assert_eq!(kinds(&ev), vec![(60_000, "idle"), (60_000, "warn")]);
    let h = &t.holders()[0];
    assert_eq!(h.phase, Phase::Warned);
    assert_eq!(h.warned_at_ms, Some(60_000));
    assert_eq!(h.stop_at_ms, None);
}

#[test]
fn stop_comes_after_grace_from_the_warning_and_only_once() {
    let mut t = tracker("research", rule(IdleAction::Stop));
    let ev = run(&mut t, 0, 20, |_| vec![idle("gpuctl-run-research-9.scope")]);
    assert_eq!(
        kinds(&ev),
        vec![(60_000, "idle"), (60_000, "warn"), (90_000, "stop")]
    );
    let Event::Warn(w) = &ev[1].1 else { panic!() };
    assert_eq!(w.stop_at_ms, Some(90_000));
    assert_eq!(
        w.pending(70_000).unwrap(),
        "stop gpuctl-run-research-9.scope (research, user ann, device 0) in 20s unless it \
         becomes active: idle for 60s, warned"
    );
    let Event::Stop(s) = &ev[2].1 else { panic!() };
    assert_eq!(s.unit, "gpuctl-run-research-9.scope");
    assert_eq!(s.idle_seconds, 90);
    assert_eq!(t.holders()[0].phase, Phase::Stopping);
}

#[test]
fn a_holder_that_wakes_during_grace_is_not_stopped() {
    let mut t = tracker("research", rule(IdleAction::Stop));
    // Warned at 60 s, busy at 80 s (inside the 30 s grace), idle again after.
    let ev = run(&mut t, 0, 20, |ms| {
        if ms == 80_000 {
            vec![busy("a.service")]
        } else {
            vec![idle("a.service")]
        }
    });
    // Woke at 80 s; the new stretch from 80 s reaches 60 s at 140 s: warned again, stop 30 s later.
    assert_eq!(
        kinds(&ev),
        vec![
            (60_000, "idle"),
            (60_000, "warn"),
            (80_000, "woke"),
            (140_000, "idle"),
            (140_000, "warn"),
            (170_000, "stop"),
        ]
    );
}

#[test]
fn the_pending_action_is_visible_before_it_happens() {
    let mut t = tracker("research", rule(IdleAction::Stop));
    run(&mut t, 0, 3, |_| vec![idle("a.service")]);
    let h = &t.holders()[0];
    assert_eq!(h.phase, Phase::Idling);
    assert_eq!(h.warn_in_seconds, Some(40));
    assert_eq!(
        h.pending(20_000).unwrap(),
        "stop a.service (research, user ann, device 0) after 40s more idle time (idle 20s)"
    );
}

#[test]
fn excluded_units_are_reported_but_never_warned_or_stopped() {
    let mut t = tracker("research", rule(IdleAction::Stop));
    let ev = run(&mut t, 0, 30, |_| vec![idle("triton-main.service")]);
    assert_eq!(kinds(&ev), vec![(60_000, "idle")]);
    let h = &t.holders()[0];
    assert!(h.excluded);
    assert_eq!(h.phase, Phase::Idle);
    assert_eq!(h.not_stopped.as_deref(), Some("excluded by the rule"));
    assert!(h.pending(0).unwrap().contains("excluded"));
}

#[test]
fn sessions_and_mps_daemons_are_warned_but_never_stopped() {
    for unit in ["session-4.scope", "gpuctl-mps@research-0.service"] {
        let mut t = tracker("research", rule(IdleAction::Stop));
        let ev = run(&mut t, 0, 30, |_| vec![idle(unit)]);
        assert_eq!(
            kinds(&ev),
            vec![(60_000, "idle"), (60_000, "warn")],
            "{unit}"
        );
        let h = &t.holders()[0];
        assert_eq!(h.stop_at_ms, None);
        assert!(h.not_stopped.is_some(), "{unit}");
    }
}

#[test]
fn a_unit_busy_on_another_device_is_not_stopped() {
    let mut t = tracker("research", rule(IdleAction::Stop));
    let ev = run(&mut t, 0, 30, |_| {
        vec![
            idle("a.service"),
            holder("a.service", "1", Activity::Percent(90.0)),
        ]
    });
    assert_eq!(kinds(&ev), vec![(60_000, "idle"), (60_000, "warn")]);
    // The warning promises no stop that will not come.
    let warned = ev.iter().find_map(|(_, e)| match e {
        Event::Warn(h) => Some(h.clone()),
        _ => None,
    });
    let warned = warned.expect("a warning");
    assert_eq!(warned.stop_at_ms, None);
    assert_eq!(
        warned.not_stopped.as_deref(),
        Some("in use on another device")
    );
    let h = t.holders().into_iter().find(|h| h.device == "0").unwrap();
    assert_eq!(
        (h.stop_at_ms, h.not_stopped.as_deref()),
        (None, Some("in use on another device"))
    );
    assert!(
        h.pending(0)
            .unwrap()
            .contains("not stopped: in use on another device"),
        "{:?}",
        h.pending(0)
    );
    // Once device 1 goes idle too, both are due; one stop for the unit.
    let ev = run(&mut t, 300_000, 12, |_| {
        vec![
            idle("a.service"),
            holder("a.service", "1", Activity::Percent(0.0)),
        ]
    });
    let stops: Vec<_> = kinds(&ev)
        .into_iter()
        .filter(|(_, k)| *k == "stop")
        .collect();
    assert_eq!(stops.len(), 1, "{ev:?}");
}

#[test]
fn a_shared_device_is_idle_for_all_or_none() {
    let mut t = tracker("research", rule(IdleAction::Report));
    let shared = |a: f64| {
        let mut x = holder("a.service", "0", Activity::Percent(a));
        let mut y = holder("b.service", "0", Activity::Percent(a));
        x.sharing = 2;
        y.sharing = 2;
        vec![x, y]
    };
    let ev = run(&mut t, 0, 10, |_| shared(50.0));
    assert!(ev.is_empty());
    let ev = run(&mut t, 100_000, 7, |_| shared(0.0));
    assert_eq!(kinds(&ev), vec![(150_000, "idle"), (150_000, "idle")]);
    assert!(t.holders().iter().all(|h| h.shared_device));
}

#[test]
fn memory_runaway_is_reported_like_idle_and_clears() {
    let mut r = rule(IdleAction::Warn);
    r.memory_alarm = Some(95.0);
    let mut t = tracker("research", r);
    let mut h = busy("a.service");
    h.memory = Some(79 << 30);
    h.capacity = Some(80 << 30);
    let ev = t.observe(&at(0, vec![h.clone()]));
    assert_eq!(
        kinds(&ev.iter().map(|e| (0, e.clone())).collect::<Vec<_>>()),
        vec![(0, "idle"), (0, "warn")]
    );
    let Event::Idle(i) = &ev[0] else { panic!() };
    assert!(matches!(i.reason, Some(Reason::MemoryAlarm(p)) if (p - 98.75).abs() < 0.01));
    // Memory falls: withdrawn.
    h.memory = Some(10 << 30);
    let ev = t.observe(&at(IV, vec![h]));
    assert!(matches!(ev.as_slice(), [Event::Woke(_)]), "{ev:?}");
}

#[test]
fn memory_alarm_works_without_activity_and_without_knowing_capacity_does_nothing() {
    let mut r = rule(IdleAction::Report);
    r.memory_alarm = Some(50.0);
    let mut t = tracker("research", r.clone());
    let mut h = holder("a.service", "MIG-x", Activity::Unknown);
    h.memory = Some(30 << 30);
    h.capacity = Some(40 << 30);
    assert!(matches!(
        t.observe(&at(0, vec![h.clone()])).as_slice(),
        [Event::Idle(_)]
    ));
    let mut t = tracker("research", r);
    h.capacity = None;
    assert!(t.observe(&at(0, vec![h])).is_empty());
}

#[test]
fn a_reported_holder_that_leaves_is_gone() {
    let mut t = tracker("research", rule(IdleAction::Report));
    let ev = run(&mut t, 0, 9, |ms| {
        if ms < 80_000 {
            vec![idle("a.service")]
        } else {
            vec![]
        }
    });
    assert_eq!(kinds(&ev), vec![(60_000, "idle"), (80_000, "gone")]);
    assert!(t.holders().is_empty());
}

#[test]
fn teams_without_a_rule_are_ignored_and_a_removed_rule_forgets() {
    let mut t = tracker("research", rule(IdleAction::Stop));
    let mut other = idle("x.service");
    other.team = "infer".into();
    run(&mut t, 0, 3, |_| vec![idle("a.service"), other.clone()]);
    assert_eq!(t.holders().len(), 1);
    t.set_rules(BTreeMap::new());
    assert!(!t.active());
    let ev = run(&mut t, 30_000, 20, |_| vec![idle("a.service")]);
    assert!(ev.is_empty());
    assert!(t.holders().is_empty());
}

#[test]
fn unit_globs_are_case_sensitive_wildcards() {
    assert!(unit_glob("triton-*.service", "triton-main.service"));
    assert!(unit_glob("jupyter?.scope", "jupyter1.scope"));
    assert!(!unit_glob("jupyter?.scope", "jupyter12.scope"));
    assert!(!unit_glob("Triton-*.service", "triton-main.service"));
    assert!(unit_glob("*", "x.service"));
    assert!(!unit_glob("a.service", "a.servicex"));
}

// --- from_usage ---

fn p(pid: u32, team: Option<&str>, unit: Option<&str>, mem: u64) -> ProcessUsage {
    ProcessUsage {
        pid,
        kind: "compute".into(),
        used_memory: Some(mem),
        uid: Some(1001),
        user: Some("ann".into()),
        team: team.map(str::to_string),
        team_unit: unit.map(str::to_string),
        unit: unit.map(str::to_string),
        ..Default::default()
    }
}

fn usage() -> Usage {
    Usage {
        collected_at_ms: 123,
        gpus: vec![
            GpuUsage {
                index: 0,
                teams: vec!["research".into()],
                memory_total: Some(80 << 30),
                utilization_gpu: Some(3),
                processes: vec![
                    p(1, Some("research"), Some("a.service"), 1 << 30),
                    p(2, Some("research"), Some("a.service"), 2 << 30),
                    p(3, Some("research"), Some("b.scope"), 1 << 30),
                    p(4, None, Some("cron.service"), 1 << 20),
                    p(5, Some("infer"), Some("leak.service"), 1 << 20),
                ],
                ..Default::default()
            },
            GpuUsage {
                index: 1,
                mig: true,
                mig_devices: vec![
                    MigUsage {
                        uuid: "MIG-gpm".into(),
                        teams: vec!["research".into()],
                        memory_total: Some(40 << 30),
                        activity: Some(0.5),
                        processes: vec![p(6, Some("research"), Some("c.service"), 1 << 30)],
                        ..Default::default()
                    },
                    MigUsage {
                        uuid: "MIG-nogpm".into(),
                        teams: vec!["research".into()],
                        memory_total: Some(40 << 30),
                        activity: None,
                        processes: vec![p(7, Some("research"), None, 1 << 30)],
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

#[test]
fn holders_from_a_collection() {
    let mut u = usage();
    crate::usage::attribute(
        &mut u,
        &crate::usage::Owners {
            gpus: [(0, vec!["research".to_string()])].into(),
            mig: [
                ("MIG-gpm".to_string(), vec!["research".to_string()]),
                ("MIG-nogpm".to_string(), vec!["research".to_string()]),
            ]
            .into(),
        },
    );
    let rules = [("research".to_string(), rule(IdleAction::Stop))].into();
    let s = from_usage(&u, &rules);
    assert_eq!(s.at_ms, 123);
    type Row<'a> = (&'a str, &'a str, Vec<u32>, Option<u64>, Activity, usize);
    let got: Vec<Row> = s
        .holders
        .iter()
        .map(|h| {
            (
                h.unit.as_str(),
                h.device.as_str(),
                h.pids.clone(),
                h.memory,
                h.activity,
                h.sharing,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            // Two processes, one holder; utilisation stands in for GPM; 4 units share GPU 0
            // (the root job and infer's stray count for the device's activity, but are not
            // holders: one is in no team slice, the other not on its team's device).
            (
                "a.service",
                "0",
                vec![1, 2],
                Some(3 << 30),
                Activity::Percent(3.0),
                4
            ),
            (
                "b.scope",
                "0",
                vec![3],
                Some(1 << 30),
                Activity::Percent(3.0),
                4
            ),
            (
                "c.service",
                "MIG-gpm",
                vec![6],
                Some(1 << 30),
                Activity::Percent(0.5),
                1
            ),
        ]
    );
    // pid 7 has no unit directly in the slice: nothing systemd could stop, not a holder.
    // A team without a rule has no holders.
    let none = from_usage(&u, &[("infer".to_string(), rule(IdleAction::Stop))].into());
    assert!(none.holders.is_empty());
}

#[test]
fn mig_without_gpm_is_unknown_and_mig_mode_gpu_processes_too() {
    let mut u = usage();
    u.gpus[1].mig_devices[1].processes[0].team_unit = Some("d.service".into());
    u.gpus[1].processes = vec![p(8, Some("research"), Some("e.service"), 1)];
    u.gpus[1].teams = vec!["research".into()];
    u.gpus[1].utilization_gpu = Some(0);
    u.gpus[1].mig_devices[1].teams = vec!["research".into()];
    let rules = [("research".to_string(), rule(IdleAction::Stop))].into();
    let s = from_usage(&u, &rules);
    let d = s.holders.iter().find(|h| h.unit == "d.service").unwrap();
    assert_eq!(d.activity, Activity::Unknown);
    let e = s.holders.iter().find(|h| h.unit == "e.service").unwrap();
    assert_eq!(e.activity, Activity::Unknown, "no utilisation in MIG mode");
}

#[test]
fn an_idle_slurm_job_on_a_teams_device_is_reported_and_never_stopped() {
    let mut u = usage();
    let mut job = p(9, None, Some("slurmstepd.scope"), 1 << 30);
    job.team_unit = None;
    job.slurm_job = Some(42);
    u.gpus[1].mig_devices[0].processes = vec![job];
    crate::usage::attribute(
        &mut u,
        &crate::usage::Owners {
            gpus: [(0, vec!["research".to_string()])].into(),
            mig: [("MIG-gpm".to_string(), vec!["research".to_string()])].into(),
        },
    );
    let rules: BTreeMap<String, IdleRule> =
        [("research".to_string(), rule(IdleAction::Stop))].into();
    let s = from_usage(&u, &rules);
    let h = s.holders.iter().find(|h| h.device == "MIG-gpm").unwrap();
    assert_eq!(
        (h.team.as_str(), h.unit.as_str()),
        ("research", "slurm job 42")
    );
    // Idle for the window: told it is idle, never stopped by gpuctl.
    let mut t = tracker("research", rule(IdleAction::Stop));
    let ev = run(&mut t, 0, 30, |_| vec![idle("slurm job 42")]);
    assert!(!kinds(&ev).iter().any(|(_, k)| *k == "stop"), "{ev:?}");
    let held = &t.holders()[0];
    assert_eq!(held.stop_at_ms, None);
    assert!(held.not_stopped.as_deref().unwrap().contains("Slurm"));
    // Outside a device its team owns (no single owner), a Slurm job is no holder.
    u.gpus[1].mig_devices[0].teams.clear();
    assert!(from_usage(&u, &rules)
        .holders
        .iter()
        .all(|h| h.device != "MIG-gpm"));
}
