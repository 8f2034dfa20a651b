use super::store::{encode, Store};
use super::*;
use crate::paths::Root;
use crate::usage::{GpuUsage, MigUsage, ProcessUsage};

const I: u64 = 10_000;

fn key(team: &str, user: &str, device: &str) -> Key {
    Key {
        team: team.into(),
        user: user.into(),
        device: device.into(),
        kind: WHOLE_GPU.into(),
    }
}

fn holder(team: &str, user: &str, device: &str, activity: Option<f64>) -> Holder {
    Holder {
        key: key(team, user, device),
        unit: format!("{user}.service"),
        memory: Some(1 << 30),
        activity,
        borrowed_from: None,
    }
}

fn at(at_ms: u64, holders: Vec<Holder>) -> LedgerSample {
    LedgerSample { at_ms, holders }
}

/// A day in 2026, so day numbers look real.
const T0: u64 = 20_000 * DAY_MS + 3_600_000;

fn get(l: &Ledger, k: &Key) -> Figures {
    l.today().figures.get(k).copied().unwrap_or_default()
}

#[test]
fn steady_samples_credit_the_time_between_them() {
    let mut l = Ledger::new(I, None, None);
    let none = BTreeMap::new();
    for i in 0..=6 {
        let busy = holder("train", "ann", "0", Some(90.0));
        let idle = holder("interns", "bob", "1", Some(0.0));
        l.observe(&at(T0 + i * I, vec![busy, idle]), &none);
    }
    // The first sample only anchors: six spans of one interval follow it.
    let a = get(&l, &key("train", "ann", "0"));
    assert_eq!((a.held_ms, a.active_ms, a.unknown_ms), (6 * I, 6 * I, 0));
    assert_eq!(a.utilisation(), Some(1.0));
    let b = get(&l, &key("interns", "bob", "1"));
    assert_eq!((b.held_ms, b.active_ms, b.idle_ms()), (6 * I, 0, 6 * I));
    assert_eq!(b.utilisation(), Some(0.0));
    // 1 GiB for 60 s.
    assert_eq!(b.memory_byte_s, (1u64 << 30) as f64 * 60.0);
}

#[test]
fn a_loan_counts_as_borrowed_to_the_borrower_and_as_lent_on_the_owners_line() {
    let mut l = Ledger::new(I, None, None);
    let none = BTreeMap::new();
    for i in 0..=3 {
        let mut bob = holder("interns", "bob", "2", Some(90.0));
        bob.borrowed_from = Some("train".into());
        // Two borrowed units on one device: one device's time, lent once.
        let mut bob2 = holder("interns", "bob", "2", Some(90.0));
        bob2.unit = "other.scope".into();
        bob2.borrowed_from = Some("train".into());
        let ann = holder("train", "ann", "0", Some(90.0));
        l.observe(&at(T0 + i * I, vec![bob, bob2, ann]), &none);
    }
    let b = get(&l, &key("interns", "bob", "2"));
    assert_eq!(
        (b.held_ms, b.active_ms, b.borrowed_ms, b.lent_ms),
        (3 * I, 3 * I, 3 * I, 0)
    );
    let lent = get(&l, &key("train", "", "2"));
    assert_eq!(
        (lent.held_ms, lent.lent_ms, lent.borrowed_ms),
        (0, 3 * I, 0)
    );
    let a = get(&l, &key("train", "ann", "0"));
    assert_eq!((a.held_ms, a.borrowed_ms, a.lent_ms), (3 * I, 0, 0));
    // By team: train held 3 spans of its own and lent 3; interns held 3, all borrowed.
    let by = summarise([l.today()], By::Team, |_| true);
    let team = |t: &str| {
        by[&Key {
            team: t.into(),
            user: String::new(),
            device: String::new(),
            kind: String::new(),
        }]
    };
    assert_eq!(
        (team("train").held_ms, team("train").lent_ms),
        (3 * I, 3 * I)
    );
    assert_eq!(
        (team("interns").held_ms, team("interns").borrowed_ms),
        (3 * I, 3 * I)
    );
}

#[test]
fn the_team_threshold_decides_active() {
    let mut l = Ledger::new(I, None, None);
    let below: BTreeMap<String, f64> = [("train".to_string(), 50.0)].into();
    for i in 0..3 {
        let h = vec![
            holder("train", "ann", "0", Some(30.0)),
            holder("infer", "cy", "1", Some(30.0)),
        ];
        l.observe(&at(T0 + i * I, h), &below);
    }
    // 30% is below train's 50% rule but above the default 5% of a team without a rule.
    assert_eq!(get(&l, &key("train", "ann", "0")).active_ms, 0);
    assert_eq!(get(&l, &key("infer", "cy", "1")).active_ms, 2 * I);
}

#[test]
fn gaps_count_neither_as_held_nor_as_idle() {
    let mut l = Ledger::new(I, None, None);
    let none = BTreeMap::new();
    let idle = || vec![holder("interns", "bob", "0", Some(0.0))];
    l.observe(&at(T0, idle()), &none);
    l.observe(&at(T0 + I, idle()), &none);
    // gpuctld stopped (or NVML hung) for ten intervals: not observed.
    l.observe(&at(T0 + 11 * I, idle()), &none);
    l.observe(&at(T0 + 12 * I, idle()), &none);
    let f = get(&l, &key("interns", "bob", "0"));
    assert_eq!((f.held_ms, f.idle_ms()), (2 * I, 2 * I));
    // A late sample (1.5 intervals) credits at most one interval.
    l.observe(&at(T0 + 12 * I + 3 * I / 2, idle()), &none);
    assert_eq!(get(&l, &key("interns", "bob", "0")).held_ms, 3 * I);
    // The same collection served again credits nothing.
    let before = l.today().clone();
    l.observe(&at(T0 + 12 * I + 3 * I / 2, idle()), &none);
    assert_eq!(l.today(), &before);
}

#[test]
fn unknown_activity_is_kept_apart() {
    let mut l = Ledger::new(I, None, None);
    let none = BTreeMap::new();
    for i in 0..5 {
        // Activity known for two spans, then the device stops reporting it.
        let a = if i < 3 { Some(80.0) } else { None };
        l.observe(
            &at(T0 + i * I, vec![holder("mig", "dee", "MIG-x", a)]),
            &none,
        );
    }
    let f = get(&l, &key("mig", "dee", "MIG-x"));
    assert_eq!(
        (f.held_ms, f.active_ms, f.unknown_ms),
        (4 * I, 2 * I, 2 * I)
    );
    assert_eq!(f.idle_ms(), 0, "unknown never counts as idle");
    assert_eq!(
        f.utilisation(),
        Some(1.0),
        "over the time activity was known"
    );
    let only_unknown = Figures {
        held_ms: 5,
        unknown_ms: 5,
        ..Figures::default()
    };
    assert_eq!(only_unknown.utilisation(), None);
    assert_eq!(Figures::default().utilisation(), None);
}

#[test]
fn a_process_moving_between_devices_is_held_where_it_is_seen() {
    let mut l = Ledger::new(I, None, None);
    let none = BTreeMap::new();
    l.observe(
        &at(T0, vec![holder("train", "ann", "0", Some(90.0))]),
        &none,
    );
    l.observe(
        &at(T0 + I, vec![holder("train", "ann", "0", Some(90.0))]),
        &none,
    );
    l.observe(
        &at(T0 + 2 * I, vec![holder("train", "ann", "1", Some(90.0))]),
        &none,
    );
    l.observe(
        &at(T0 + 3 * I, vec![holder("train", "ann", "1", Some(90.0))]),
        &none,
    );
    assert_eq!(get(&l, &key("train", "ann", "0")).held_ms, I);
    assert_eq!(get(&l, &key("train", "ann", "1")).held_ms, 2 * I);
    let total: u64 = l.today().figures.values().map(|f| f.held_ms).sum();
    assert_eq!(
        total,
        3 * I,
        "one device at a time: never both for one span"
    );
    // Two units of one user on one device: device time counts once, memory adds up.
    let mut two = holder("train", "ann", "0", Some(90.0));
    two.unit = "other.service".into();
    l.observe(
        &at(
            T0 + 4 * I,
            vec![holder("train", "ann", "0", Some(90.0)), two],
        ),
        &none,
    );
    let f = get(&l, &key("train", "ann", "0"));
    assert_eq!(f.held_ms, 2 * I);
    // 1 GiB for the first span on it, then 2 GiB for this one.
    assert_eq!(f.memory_byte_s, (1u64 << 30) as f64 * (10.0 + 2.0 * 10.0));
}

#[test]
fn clock_jumps_credit_nothing_and_re_anchor() {
    let mut l = Ledger::new(I, None, None);
    let none = BTreeMap::new();
    let h = || vec![holder("train", "ann", "0", Some(90.0))];
    l.observe(&at(T0, h()), &none);
    l.observe(&at(T0 + I, h()), &none);
    // Back by an hour: nothing credited, the next span counts from there.
    l.observe(&at(T0 + I - 3_600_000, h()), &none);
    l.observe(&at(T0 + 2 * I - 3_600_000, h()), &none);
    assert_eq!(get(&l, &key("train", "ann", "0")).held_ms, 2 * I);
    // Forward by a day: a gap in a new day, then normal again.
    let (_, finished) = l.observe(&at(T0 + DAY_MS, h()), &none);
    assert_eq!(finished.map(|d| d.day), Some(day_of(T0)));
    assert_eq!(get(&l, &key("train", "ann", "0")).held_ms, 0);
    l.observe(&at(T0 + DAY_MS + I, h()), &none);
    assert_eq!(get(&l, &key("train", "ann", "0")).held_ms, I);
}

#[test]
fn a_restart_mid_interval_credits_the_span_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(&Root::new(dir.path()));
    let none = BTreeMap::new();
    let h = || vec![holder("train", "ann", "0", Some(90.0))];
    let mut l = Ledger::new(I, None, None);
    for i in 0..4 {
        l.observe(&at(T0 + i * I, h()), &none);
        store.save(l.today(), l.last_at_ms()).unwrap();
    }
    assert_eq!(get(&l, &key("train", "ann", "0")).held_ms, 3 * I);
    // gpuctld restarts 4 s into the next interval and samples at once.
    let (today, last) = store.latest();
    let mut l = Ledger::new(I, today, last);
    l.observe(&at(T0 + 3 * I + 4_000, h()), &none);
    l.observe(&at(T0 + 4 * I + 4_000, h()), &none);
    // The 4 s since the last stored sample count once, then a full interval: no more, no less.
    assert_eq!(get(&l, &key("train", "ann", "0")).held_ms, 4 * I + 4_000);
    // Restarting after a long stop: the stop is a gap.
    store.save(l.today(), l.last_at_ms()).unwrap();
    let (today, last) = store.latest();
    let mut l = Ledger::new(I, today, last);
    l.observe(&at(T0 + 40 * I, h()), &none);
    assert_eq!(get(&l, &key("train", "ann", "0")).held_ms, 4 * I + 4_000);
}

#[test]
fn an_idle_stop_counts_the_stretch_as_reclaimed() {
    let mut l = Ledger::new(I, None, None);
    let none = BTreeMap::new();
    for i in 0..4 {
        l.observe(
            &at(T0 + i * I, vec![holder("interns", "bob", "0", Some(0.0))]),
            &none,
        );
    }
    l.reclaimed("interns", "bob.service", T0 + 3 * I);
    // Gone after the stop: nothing open to count twice.
    l.reclaimed("interns", "bob.service", T0 + 3 * I);
    l.observe(&at(T0 + 4 * I, vec![]), &none);
    let f = get(&l, &key("interns", "bob", "0"));
    assert_eq!((f.held_ms, f.reclaimed_ms, f.stops), (3 * I, 3 * I, 1));
}

#[test]
fn from_usage_attributes_devices_kinds_and_activity() {
    let p = |pid, team: &str, user: &str, mem| ProcessUsage {
        pid,
        kind: "compute".into(),
        used_memory: mem,
        user: Some(user.into()),
        team: Some(team.into()),
        team_unit: Some(format!("{user}.service")),
        ..Default::default()
    };
    let u = Usage {
        collected_at_ms: T0,
        gpus: vec![
            GpuUsage {
                index: 0,
                utilization_gpu: Some(40),
                processes: vec![
                    p(1, "train", "ann", Some(10)),
                    p(2, "train", "ann", Some(5)),
                ],
                ..Default::default()
            },
            GpuUsage {
                index: 1,
                mig: true,
                utilization_gpu: Some(99),
                mig_devices: vec![MigUsage {
                    uuid: "MIG-a".into(),
                    profile: "3g.40gb".into(),
                    processes: vec![p(3, "infer", "cy", None)],
                    ..Default::default()
                }],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let s = from_usage(&u).unwrap();
    assert_eq!(s.at_ms, T0);
    assert_eq!(s.holders.len(), 2);
    let ann = &s.holders[1];
    assert_eq!(ann.key, key("train", "ann", "0"));
    assert_eq!((ann.memory, ann.activity), (Some(15), Some(40.0)));
    let cy = &s.holders[0];
    assert_eq!(
        (cy.key.device.as_str(), cy.key.kind.as_str()),
        ("MIG-a", "3g.40gb")
    );
    assert_eq!(
        cy.activity, None,
        "no utilisation for a MIG device: unknown, not 99"
    );
    let down = Usage {
        nvml_unavailable: Some("no driver".into()),
        ..Default::default()
    };
    assert_eq!(from_usage(&down), None, "a gap, not an empty host");
}

#[test]
fn days_are_named_and_parsed_both_ways() {
    assert_eq!(day_name(0), "1970-01-01");
    assert_eq!(day_name(20_425), "2025-12-03");
    for d in [0, 59, 60, 365, 11_016, 20_425, 30_000] {
        assert_eq!(parse_day(&day_name(d)), Some(d));
    }
    for bad in [
        "2025-02-29",
        "2024-13-01",
        "2024-1-01",
        "1969-12-31",
        "x",
        "2024-02-30",
    ] {
        assert_eq!(parse_day(bad), None, "{bad}");
    }
    assert_eq!(parse_day("2024-02-29"), Some(19_782));
}

#[test]
fn summaries_group_and_filter() {
    let mut d = Day {
        day: 1,
        figures: BTreeMap::new(),
    };
    let f = |h| Figures {
        held_ms: h,
        ..Figures::default()
    };
    d.figures.insert(key("train", "ann", "0"), f(1));
    d.figures.insert(key("train", "ann", "1"), f(2));
    d.figures.insert(key("train", "bob", "1"), f(4));
    d.figures.insert(key("infer", "cy", "1"), f(8));
    let by_team = summarise([&d], By::Team, |_| true);
    assert_eq!(by_team[&group(&key("train", "", ""), By::Team)].held_ms, 7);
    let by_user = summarise([&d, &d], By::User, |_| true);
    assert_eq!(
        by_user[&group(&key("train", "ann", ""), By::User)].held_ms,
        6
    );
    let by_dev = summarise([&d], By::Device, |k| k.team == "train");
    assert_eq!(by_dev[&group(&key("", "", "1"), By::Device)].held_ms, 6);
    assert_eq!(by_dev.len(), 2);
}

#[test]
fn store_round_trips_and_drops_the_oldest_day_over_the_cap() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("ledger");
    let mut day = Day {
        day: 20_000,
        figures: BTreeMap::new(),
    };
    day.figures.insert(
        key("train", "ann", "0"),
        Figures {
            held_ms: 5,
            active_ms: 3,
            unknown_ms: 1,
            memory_byte_s: 2.5,
            reclaimed_ms: 4,
            stops: 1,
            ..Default::default()
        },
    );
    let one = encode(&day, Some(7)).len() as u64;
    let store = Store::at(dir.clone(), 3 * one + one / 2);
    assert!(!dir.exists());
    for d in 20_000..20_005 {
        day.day = d;
        store.save(&day, Some(7)).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "per-user figures: root only");
    let kept: Vec<u64> = store.days().iter().map(|d| d.0).collect();
    assert_eq!(kept, vec![20_002, 20_003, 20_004]);
    let (back, last) = store.load(20_004).unwrap().unwrap();
    assert_eq!((back, last), (day.clone(), Some(7)));
    let (days, problems) = store.range(20_003, 30_000);
    assert_eq!((days.len(), problems.len()), (2, 0));
}

#[test]
fn loans_are_stored_only_where_counted_and_a_day_without_reads_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::at(dir.path().join("ledger"), 1 << 20);
    let mut day = Day {
        day: 20_000,
        figures: BTreeMap::new(),
    };
    let plain = Figures {
        held_ms: 5,
        ..Default::default()
    };
    day.figures.insert(key("train", "ann", "0"), plain);
    // The line format of a day before lending, as an older gpuctl wrote and reads it.
    let text = String::from_utf8(encode(&day, None)).unwrap();
    assert!(
        text.contains(r#"["train","ann","0","gpu",5,0,0,0.0,0,0]"#),
        "{text}"
    );
    day.figures.insert(
        key("interns", "bob", "2"),
        Figures {
            held_ms: 7,
            borrowed_ms: 7,
            ..Default::default()
        },
    );
    day.figures.insert(
        key("train", "", "2"),
        Figures {
            lent_ms: 7,
            ..Default::default()
        },
    );
    let text = String::from_utf8(encode(&day, None)).unwrap();
    assert!(
        text.contains(r#"["interns","bob","2","gpu",7,0,0,0.0,0,0,7,0]"#),
        "{text}"
    );
    assert!(
        text.contains(r#"["train","","2","gpu",0,0,0,0.0,0,0,0,7]"#),
        "{text}"
    );
    assert!(
        text.contains(r#"["train","ann","0","gpu",5,0,0,0.0,0,0]"#),
        "{text}"
    );
    store.save(&day, Some(3)).unwrap();
    assert_eq!(store.load(20_000).unwrap(), Some((day, Some(3))));
}

/// Crash safety: a write killed midway leaves a partial temp file (the rename never happened)
/// or, on a filesystem that lost the data, a torn day file. The ledger reads back the state
/// one interval before, skips a torn day with a report, and resumes.
#[test]
fn a_write_killed_midway_loses_at_most_one_interval() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(&Root::new(dir.path()));
    let none = BTreeMap::new();
    let h = || vec![holder("train", "ann", "0", Some(90.0))];
    let mut l = Ledger::new(I, None, None);
    for i in 0..5 {
        l.observe(&at(T0 + i * I, h()), &none);
        store.save(l.today(), l.last_at_ms()).unwrap();
    }
    // Interval 6 is credited in memory, and its write is cut off after half its bytes: the
    // temp file write_atomic was filling is all that exists of it.
    l.observe(&at(T0 + 5 * I, h()), &none);
    let full = encode(l.today(), l.last_at_ms());
    let ledger_dir = dir.path().join("var/lib/gpuctl/ledger");
    let name = format!("{}.json", day_name(day_of(T0)));
    let tmp = ledger_dir.join(format!(".{name}.4242.0.tmp"));
    std::fs::write(&tmp, &full[..full.len() / 2]).unwrap();

    let (today, last) = store.latest();
    let resumed = Ledger::new(I, today.clone(), last);
    assert_eq!(
        last,
        Some(T0 + 4 * I),
        "the file holds the interval before the crash"
    );
    assert_eq!(get(&resumed, &key("train", "ann", "0")).held_ms, 4 * I);
    assert_eq!(
        get(&l, &key("train", "ann", "0")).held_ms - 4 * I,
        I,
        "exactly one interval lost"
    );
    store.clean();
    assert!(!tmp.exists(), "the torn temp file is removed at start");

    // A torn day file itself (yesterday's, say): reported and skipped, the rest readable.
    let y = ledger_dir.join(format!("{}.json", day_name(day_of(T0) - 1)));
    std::fs::write(&y, &full[..full.len() / 3]).unwrap();
    let (days, problems) = store.range(0, u64::MAX);
    assert_eq!(days.len(), 1);
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].contains("not a ledger day file"),
        "{problems:?}"
    );
    let (today2, last2) = store.latest();
    assert_eq!((today2, last2), (today, last));
}
