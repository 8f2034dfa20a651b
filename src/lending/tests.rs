use super::*;
use crate::policy::LendTo;
use proptest::prelude::*;

const MIN: u64 = 60_000;

fn rule(to: &[&str], after_min: u64, grace_s: u64, when: &[&str]) -> LendRule {
    LendRule {
        to: if to == ["all"] {
            LendTo::All
        } else {
            LendTo::Teams(to.iter().map(|t| t.parse().unwrap()).collect())
        },
        after: Duration::from_secs(after_min * 60),
        grace: Duration::from_secs(grace_s),
        when: when.iter().map(|w| Window::parse(w).unwrap()).collect(),
    }
}

fn dev(id: &str, owner: &str, mig: bool, idle_since_ms: Option<u64>) -> Device {
    Device {
        id: id.into(),
        owners: vec![owner.into()],
        mig,
        mps: false,
        idle_since_ms,
        foreign: None,
        profile: None,
    }
}

fn held(unit: &str, team: &str, devices: &[&str], since_ms: u64, from: Option<&str>) -> Held {
    Held {
        unit: unit.into(),
        team: team.into(),
        uid: 1,
        devices: devices.iter().map(|d| d.to_string()).collect(),
        since_ms,
        borrowed_from: from.map(str::to_string),
    }
}

fn waiter(ticket: Ticket, team: &str, uid: u32, borrow: bool) -> Waiter {
    Waiter {
        ticket,
        team: team.into(),
        uid,
        gpus: None,
        device: None,
        profile: None,
        borrow,
        passed_over: 0,
    }
}

/// train lends its two idle GPUs to interns; interns has one MIG device, held.
fn night() -> Snapshot {
    let mut teams = BTreeMap::new();
    teams.insert(
        "train".to_string(),
        TeamRules {
            lend: Some(rule(&["interns"], 10, 60, &[])),
            ..Default::default()
        },
    );
    teams.insert("interns".to_string(), TeamRules::default());
    Snapshot {
        now_ms: 100 * MIN,
        local: None,
        teams,
        devices: vec![
            dev("GPU-a", "train", false, Some(0)),
            dev("GPU-b", "train", false, Some(0)),
            dev("MIG-i", "interns", true, None),
        ],
        leases: vec![held("i-1.scope", "interns", &["MIG-i"], 0, None)],
        ..Default::default()
    }
}

/// [`night`] with both of train's GPUs lent to interns: `b-1.scope` on GPU-a (started at 10
/// minutes), `b-2.scope` on GPU-b (at 20).
fn both_lent() -> Snapshot {
    let mut s = night();
    s.leases.push(held(
        "b-1.scope",
        "interns",
        &["GPU-a"],
        10 * MIN,
        Some("train"),
    ));
    s.leases.push(held(
        "b-2.scope",
        "interns",
        &["GPU-b"],
        20 * MIN,
        Some("train"),
    ));
    s.devices[0].idle_since_ms = None;
    s.devices[1].idle_since_ms = None;
    s
}

/// Train's request 7 took back interns' loan `b-2.scope` of GPU-b at `at`, with a 60 s grace.
fn owner_7_takes_back_b2(at: u64) -> Reclaiming {
    Reclaiming {
        unit: "b-2.scope".into(),
        devices: vec!["GPU-b".into()],
        why: Why::Owner(7),
        noticed_ms: at,
        grace: Duration::from_secs(60),
    }
}

fn places(d: &[Decision]) -> Vec<(Ticket, Vec<String>, Option<String>)> {
    d.iter()
        .filter_map(|d| match d {
            Decision::Place {
                ticket,
                devices,
                borrowed_from,
            } => Some((*ticket, devices.clone(), borrowed_from.clone())),
            _ => None,
        })
        .collect()
}

fn waits(d: &[Decision]) -> Vec<(Ticket, usize, u32, String)> {
    d.iter()
        .filter_map(|d| match d {
            Decision::Wait {
                ticket,
                position,
                passed_over,
                reason,
            } => Some((*ticket, *position, *passed_over, reason.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_job_borrows_only_with_borrow_and_only_when_its_own_share_is_full() {
    let mut s = night();
    s.waiting = vec![waiter(1, "interns", 1000, false)];
    let d = decide(&s);
    assert_eq!(places(&d), vec![]);
    assert_eq!(
        waits(&d)[0].3,
        "no free device in interns' share; train has 2 idle device(s) to lend: wait with \
         --borrow; you are 1st"
    );
    s.waiting[0].borrow = true;
    assert_eq!(
        places(&decide(&s)),
        vec![(1, vec!["GPU-a".into()], Some("train".into()))]
    );
    // Its own device free: no borrowing.
    s.leases.clear();
    assert_eq!(places(&decide(&s)), vec![(1, vec!["MIG-i".into()], None)]);
    // Two whole GPUs from one lender, never a MIG device for more than one.
    s.leases = night().leases;
    s.waiting[0].gpus = Some(Gpus::Count(2));
    assert_eq!(
        places(&decide(&s)),
        vec![(
            1,
            vec!["GPU-a".into(), "GPU-b".into()],
            Some("train".into())
        )]
    );
    // Never with --device, never to a team the rule does not name.
    s.waiting[0].gpus = None;
    s.waiting[0].device = Some("MIG-i".into());
    assert_eq!(places(&decide(&s)), vec![]);
    s.waiting = vec![waiter(2, "research", 1001, true)];
    s.teams.insert("research".into(), TeamRules::default());
    let d = decide(&s);
    assert_eq!(places(&d), vec![]);
    assert_eq!(
        waits(&d)[0].3,
        "research has no devices of its own; you are 1st"
    );
}

#[test]
fn only_devices_idle_for_after_inside_the_window_and_free_of_foreign_memory_are_lent() {
    let mut s = night();
    s.waiting = vec![waiter(1, "interns", 1000, true)];
    // GPU-a was busy until 5 minutes ago, GPU-b has memory of a process outside every lease.
    s.devices[0].idle_since_ms = Some(95 * MIN);
    s.devices[1].foreign = Some("pid 4242 (python) holds 3.0 GiB".into());
    let d = decide(&s);
    assert_eq!(places(&d), vec![]);
    // GPU-a is idle, not yet for train's `after`: not called busy.
    assert_eq!(
        waits(&d)[0].3,
        "no free device in interns' share; 1 of train's lent devices busy, 1 idle, lent once \
         idle for 10 min; you are 1st"
    );
    s.waiting[0].borrow = false;
    assert_eq!(
        waits(&decide(&s))[0].3,
        "no free device in interns' share; 1 of train's lent devices busy, 1 idle, lent once \
         idle for 10 min: wait with --borrow; you are 1st"
    );
    s.waiting[0].borrow = true;
    s.devices[0].idle_since_ms = None;
    assert_eq!(
        waits(&decide(&s))[0].3,
        "no free device in interns' share; 2 of train's lent devices busy; you are 1st"
    );
    s.devices[0].idle_since_ms = Some(90 * MIN);
    assert_eq!(
        places(&decide(&s)),
        vec![(1, vec!["GPU-a".into()], Some("train".into()))]
    );
    // Outside the window, nothing is lent. 2025-12-03 was a Wednesday.
    let t = s.teams.get_mut("train").unwrap();
    t.lend = Some(rule(
        &["all"],
        10,
        60,
        &["Sat,Sun", "Mon..Fri 20:00..08:00"],
    ));
    s.local = Some(LocalTime::at(1_764_783_110, 0));
    assert_eq!(
        s.local,
        Some(LocalTime {
            weekday: 2,
            minute_of_day: 17 * 60 + 31
        })
    );
    let d = decide(&s);
    assert_eq!(places(&d), vec![]);
    assert!(
        waits(&d)[0]
            .3
            .contains("train lends only Sat,Sun, Mon..Fri 20:00..08:00"),
        "{d:?}"
    );
    s.local = Some(LocalTime::at(1_764_783_110, 3 * 3600));
    assert_eq!(places(&decide(&s)).len(), 1, "20:31 local: open");
    // An MPS device and a GPU shared by two teams are never lent.
    s.devices[0].mps = true;
    assert_eq!(places(&decide(&s)), vec![]);
    s.devices[0].mps = false;
    s.devices[0].owners.push("research".into());
    assert_eq!(places(&decide(&s)), vec![]);
}

#[test]
fn foreign_memory_makes_an_own_device_busy_with_that_reason() {
    let mut s = night();
    s.leases.clear();
    s.devices[2].foreign = Some("pid 77 (python) holds 2.0 GiB".into());
    s.waiting = vec![waiter(1, "interns", 1000, false)];
    let d = decide(&s);
    assert_eq!(places(&d), vec![]);
    assert!(
        waits(&d)[0].3.starts_with(
            "no free device in interns' share; 1 busy with memory of a process outside every \
             lease (pid 77 (python) holds 2.0 GiB)"
        ),
        "{d:?}"
    );
    // On an MPS device, memory outside the leases is its server's.
    s.devices[2].mps = true;
    assert_eq!(places(&decide(&s)).len(), 1);
}

#[test]
fn an_owner_takes_back_the_latest_loan_and_the_borrower_stops_only_after_grace() {
    let mut s = both_lent();
    s.waiting = vec![waiter(7, "train", 2000, false)];
    let d = decide(&s);
    assert_eq!(
        d[0],
        Decision::Reclaim {
            unit: "b-2.scope".into(),
            borrower: "interns".into(),
            owner: "train".into(),
            devices: vec!["GPU-b".into()],
            why: Why::Owner(7),
            grace: Duration::from_secs(60),
        },
        "the most recently started loan"
    );
    assert_eq!(d.len(), 2, "one reclaim for one device: {d:?}");
    // In flight: no second reclaim; no stop before the grace is over.
    s.reclaims.push(owner_7_takes_back_b2(s.now_ms));
    s.now_ms += 59_999;
    let d = decide(&s);
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(
        waits(&d)[0]
            .3
            .contains("no free device in train's share; GPU-b comes back in 1 s at most"),
        "{d:?}"
    );
    s.now_ms += 1;
    assert_eq!(
        decide(&s)[0],
        Decision::Stop {
            unit: "b-2.scope".into()
        }
    );
    // Gone: the device goes to the request it was taken back for, before an earlier one.
    s.leases.retain(|l| l.unit != "b-2.scope");
    s.devices[1].idle_since_ms = Some(s.now_ms);
    s.waiting.insert(0, waiter(3, "train", 1, false));
    s.usage.users.insert(2000, 5.0);
    let d = decide(&s);
    assert_eq!(places(&d), vec![(7, vec!["GPU-b".into()], None)]);
    // ... and the other request takes back the other loan.
    assert!(
        d.iter().any(|x| matches!(x, Decision::Reclaim { unit, why: Why::Owner(3), .. } if unit == "b-1.scope")),
        "{d:?}"
    );
}

#[test]
fn a_request_with_devices_taken_back_for_it_is_served_before_the_queue() {
    // GPU-b and GPU-c were taken back for train's two-GPU request 2 (the loan is gone); it takes
    // GPU-a and GPU-b by the placement rules. The lighter user's request 1 for GPU-c, first in
    // fair order, gets GPU-c in the same decision.
    let mut s = night();
    s.devices.push(dev("GPU-c", "train", false, Some(s.now_ms)));
    s.reclaims.push(Reclaiming {
        unit: "b-1.scope".into(),
        devices: vec!["GPU-b".into(), "GPU-c".into()],
        why: Why::Owner(2),
        noticed_ms: s.now_ms - MIN,
        grace: Duration::from_secs(60),
    });
    let mut one = waiter(1, "train", 1, false);
    one.device = Some("GPU-c".into());
    let mut two = waiter(2, "train", 2000, false);
    two.gpus = Some(Gpus::Count(2));
    s.waiting = vec![one, two];
    s.usage.users.insert(2000, 5.0);
    let mut got = places(&decide(&s));
    got.sort();
    assert_eq!(
        got,
        vec![
            (1, vec!["GPU-c".into()], None),
            (2, vec!["GPU-a".into(), "GPU-b".into()], None)
        ]
    );
}

#[test]
fn a_request_keeps_only_as_many_taken_back_devices_as_it_needs() {
    // Request 7 (one GPU) had a two-GPU loan taken back, now gone; request 8, lighter, waits for
    // a loan still in its grace: it gets the device 7 does not need now, not after the grace.
    let mut s = night();
    s.devices.push(dev("GPU-c", "train", false, None));
    s.leases
        .push(held("b-2.scope", "interns", &["GPU-c"], 0, Some("train")));
    for (unit, devices, t) in [
        ("b-1.scope", vec!["GPU-a", "GPU-b"], 7),
        ("b-2.scope", vec!["GPU-c"], 8),
    ] {
        s.reclaims.push(Reclaiming {
            unit: unit.into(),
            devices: devices.into_iter().map(String::from).collect(),
            why: Why::Owner(t),
            noticed_ms: s.now_ms,
            grace: Duration::from_secs(60),
        });
    }
    s.waiting = vec![
        waiter(7, "train", 2000, false),
        waiter(8, "train", 1, false),
    ];
    s.usage.users.insert(2000, 5.0);
    let mut got = places(&decide(&s));
    got.sort();
    assert_eq!(
        got,
        vec![
            (7, vec!["GPU-a".into()], None),
            (8, vec!["GPU-b".into()], None)
        ]
    );
}

#[test]
fn a_closed_window_or_a_changed_rule_takes_loans_back_with_grace() {
    let mut s = night();
    s.leases.push(held(
        "b-1.scope",
        "interns",
        &["GPU-a"],
        10 * MIN,
        Some("train"),
    ));
    s.local = Some(LocalTime {
        weekday: 0,
        minute_of_day: 9 * 60,
    });
    assert_eq!(decide(&s), vec![], "always open without windows");
    s.teams.get_mut("train").unwrap().lend = Some(rule(&["interns"], 10, 30, &["20:00..08:00"]));
    let d = decide(&s);
    assert!(
        matches!(&d[0], Decision::Reclaim { why: Why::WindowClosed, grace, .. } if grace.as_secs() == 30),
        "{d:?}"
    );
    s.teams.get_mut("train").unwrap().lend = Some(rule(&["research"], 10, 30, &[]));
    assert!(matches!(
        &decide(&s)[0],
        Decision::Reclaim {
            why: Why::NotLent,
            ..
        }
    ));
    s.teams.get_mut("train").unwrap().lend = None;
    assert!(matches!(
        &decide(&s)[0],
        Decision::Reclaim {
            why: Why::NotLent,
            grace,
            ..
        } if *grace == LendRule::DEFAULT_GRACE
    ));
}

#[test]
fn a_blocked_request_does_not_hold_back_a_servable_one_but_keeps_its_place() {
    let mut s = night();
    s.devices.push(dev("MIG-j", "interns", true, Some(0)));
    // The first wants MIG-i, held; the second any device.
    let mut first = waiter(1, "interns", 1000, false);
    first.device = Some("MIG-i".into());
    s.waiting = vec![first, waiter(2, "interns", 1001, false)];
    let d = decide(&s);
    assert_eq!(places(&d), vec![(2, vec!["MIG-j".into()], None)]);
    assert_eq!(
        waits(&d),
        vec![(1, 1, 0, "MIG-i is held; you are 1st".to_string())],
        "still first, and not passed over: MIG-j is no use to it"
    );
    // When MIG-i frees, it goes to the first request that can use it.
    s.leases.clear();
    s.waiting[0].passed_over = 1;
    let d = decide(&s);
    assert_eq!(
        places(&d),
        vec![
            (1, vec!["MIG-i".into()], None),
            (2, vec!["MIG-j".into()], None)
        ]
    );
}

#[test]
fn a_request_passed_over_too_often_keeps_the_devices_it_needs() {
    // Four whole GPUs; one free; the first wants two, the second one.
    let mut s = night();
    s.teams.insert("train".into(), TeamRules::default());
    s.leases = ["GPU-b", "GPU-c", "GPU-d"]
        .iter()
        .map(|d| held(&format!("{d}.scope"), "train", &[d], 0, None))
        .collect();
    s.devices = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]
        .iter()
        .map(|d| dev(d, "train", false, None))
        .collect();
    let mut two = waiter(1, "train", 1000, false);
    two.gpus = Some(Gpus::Count(2));
    s.waiting = vec![two, waiter(2, "train", 1001, false)];
    let d = decide(&s);
    assert_eq!(places(&d), vec![(2, vec!["GPU-a".into()], None)]);
    assert_eq!(waits(&d)[0].2, 1);
    s.waiting[0].passed_over = MAX_PASSED_OVER;
    let d = decide(&s);
    assert_eq!(places(&d), vec![], "GPU-a is kept for the first");
    assert!(
        waits(&d)[0].3.contains("first in line (passed over often)"),
        "{d:?}"
    );
    assert_eq!(waits(&d)[1].1, 2, "the other is 2nd");
}

#[test]
fn fair_order_is_least_recent_usage_first_ties_by_arrival() {
    let ws = vec![
        waiter(1, "t", 10, false),
        waiter(2, "t", 11, false),
        waiter(3, "t", 12, false),
        waiter(4, "t", 10, false),
    ];
    let day = 86_400_000;
    let samples = vec![
        (
            10u32,
            UsageSample {
                at_ms: 0,
                device_seconds: 800.0,
            },
        ),
        (
            11,
            UsageSample {
                at_ms: 7 * day,
                device_seconds: 150.0,
            },
        ),
    ];
    let users = decayed(samples, 7 * day, Duration::from_secs(7 * 86_400));
    assert_eq!(users[&10], 400.0, "a week old: half");
    assert_eq!(users[&11], 150.0);
    let usage = RecentUsage {
        users,
        ..Default::default()
    };
    assert_eq!(fair_order(&ws, &usage), vec![2, 1, 0, 3]);
    let mut starved = ws.clone();
    starved[3].passed_over = MAX_PASSED_OVER;
    assert_eq!(fair_order(&starved, &usage), vec![3, 2, 1, 0]);
    assert_eq!(
        [1, 2, 3, 4, 11, 12, 13, 21, 102, 111].map(ordinal),
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "102nd", "111th"]
    );
}

// A simulation: a step is one second. Jobs end on their own; the decisions are carried out as
// the bus handler would, and the invariants are checked at every step.

struct Sim {
    s: Snapshot,
    ends: HashMap<String, u64>,
    arrived: HashMap<Ticket, u64>,
    /// Ticket → how long it waited, once placed.
    waited: HashMap<Ticket, u64>,
    /// Unit → (noticed, grace) of every reclaim decided.
    notices: HashMap<String, (u64, Duration)>,
    reclaimed: Vec<String>,
    next: u64,
    rng: u64,
    max_job_s: u64,
    borrow_job_s: u64,
}

impl Sim {
    fn new(s: Snapshot, seed: u64) -> Sim {
        Sim {
            s,
            ends: HashMap::new(),
            arrived: HashMap::new(),
            waited: HashMap::new(),
            notices: HashMap::new(),
            reclaimed: Vec::new(),
            next: 1,
            rng: seed | 1,
            max_job_s: 10,
            borrow_job_s: 40,
        }
    }

    fn rand(&mut self, n: u64) -> u64 {
        // xorshift: enough for a simulation, no crate needed.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % n.max(1)
    }

    fn submit(&mut self, mut w: Waiter) -> Ticket {
        w.ticket = self.next;
        self.next += 1;
        self.arrived.insert(w.ticket, self.s.now_ms);
        let t = w.ticket;
        self.s.waiting.push(w);
        t
    }

    fn end(&mut self, unit: &str) {
        let Some(i) = self.s.leases.iter().position(|l| l.unit == unit) else {
            return;
        };
        let l = self.s.leases.remove(i);
        for d in &l.devices {
            if !self.s.leases.iter().any(|x| x.devices.contains(d)) {
                if let Some(dev) = self.s.devices.iter_mut().find(|x| &x.id == d) {
                    dev.idle_since_ms = Some(self.s.now_ms);
                }
            }
        }
    }

    /// Apply `places` to a copy: what the next decision would see right away.
    fn after_places(&self, d: &[Decision]) -> Snapshot {
        let mut s = self.s.clone();
        for (t, devs, from) in places(d) {
            let w = s.waiting.iter().position(|w| w.ticket == t).unwrap();
            let w = s.waiting.remove(w);
            for id in &devs {
                s.devices
                    .iter_mut()
                    .find(|x| &x.id == id)
                    .unwrap()
                    .idle_since_ms = None;
            }
            s.leases.push(Held {
                unit: format!("sim-{t}.scope"),
                team: w.team,
                uid: w.uid,
                devices: devs,
                since_ms: s.now_ms,
                borrowed_from: from,
            });
        }
        s
    }

    fn step(&mut self) -> Result<Vec<Decision>, TestCaseError> {
        self.s.now_ms += 1000;
        let now = self.s.now_ms;
        let done: Vec<String> = self
            .ends
            .iter()
            .filter(|(_, e)| **e <= now)
            .map(|(u, _)| u.clone())
            .collect();
        for u in done {
            self.ends.remove(&u);
            self.end(&u);
        }
        let live: HashSet<String> = self.s.leases.iter().map(|l| l.unit.clone()).collect();
        let waiting: HashSet<Ticket> = self.s.waiting.iter().map(|w| w.ticket).collect();
        self.s.reclaims.retain(|r| {
            live.contains(&r.unit) || matches!(r.why, Why::Owner(t) if waiting.contains(&t))
        });
        let d = decide(&self.s);

        // A request that a free device can serve is never left waiting.
        let again = decide(&self.after_places(&d));
        prop_assert_eq!(places(&again), vec![], "left servable: {:?}", d);

        for x in &d {
            match x {
                Decision::Stop { unit } => {
                    let (noticed, grace) = self.notices.get(unit).copied().ok_or_else(|| {
                        TestCaseError::fail(format!("{unit} stopped without notice"))
                    })?;
                    prop_assert!(now >= noticed + grace.as_millis() as u64, "{unit} early");
                    self.ends.remove(unit);
                    self.end(unit);
                }
                Decision::Reclaim {
                    unit,
                    devices,
                    why,
                    grace,
                    ..
                } => {
                    prop_assert!(!self.notices.contains_key(unit), "{unit} reclaimed twice");
                    let l = self.s.leases.iter().find(|l| &l.unit == unit).unwrap();
                    prop_assert!(l.borrowed_from.is_some());
                    self.notices.insert(unit.clone(), (now, *grace));
                    self.reclaimed.push(unit.clone());
                    self.s.reclaims.push(Reclaiming {
                        unit: unit.clone(),
                        devices: devices.clone(),
                        why: *why,
                        noticed_ms: now,
                        grace: *grace,
                    });
                }
                Decision::Wait {
                    ticket,
                    passed_over,
                    ..
                } => {
                    let w = self
                        .s
                        .waiting
                        .iter_mut()
                        .find(|w| w.ticket == *ticket)
                        .unwrap();
                    w.passed_over = *passed_over;
                }
                Decision::Place { .. } => {}
            }
        }
        for (t, devs, from) in places(&d) {
            let w = self
                .s
                .waiting
                .iter()
                .find(|w| w.ticket == t)
                .unwrap()
                .clone();
            for id in &devs {
                let dev = self.s.devices.iter().find(|x| &x.id == id).unwrap();
                let others: Vec<&Held> = self
                    .s
                    .leases
                    .iter()
                    .filter(|l| l.devices.contains(id))
                    .collect();
                // Never two teams on one device; a lent device carries its one job only.
                prop_assert!(
                    others
                        .iter()
                        .all(|l| l.team == w.team && l.borrowed_from.is_none()),
                    "{id} of {:?} given to {} beside {:?}",
                    dev.owners,
                    w.team,
                    others
                );
                match &from {
                    None => prop_assert!(dev.owners.contains(&w.team)),
                    Some(o) => {
                        let r = self.s.teams[o].lend.clone().unwrap();
                        prop_assert!(
                            others.is_empty() && !dev.mps && dev.owners == vec![o.clone()]
                        );
                        prop_assert!(r.lends_to(o, &w.team) && w.borrow);
                        let idle = dev.idle_since_ms.unwrap();
                        prop_assert!(now - idle >= r.after.as_millis() as u64);
                        prop_assert!(self.s.local.is_none_or(|l| window_open(&r.when, l)));
                    }
                }
            }
            let n = self.next;
            self.next += 1;
            let unit = format!("job-{n}.scope");
            let len = if from.is_some() {
                self.borrow_job_s
            } else {
                self.max_job_s
            };
            let len = 1 + self.rand(len);
            self.ends.insert(unit.clone(), now + len * 1000);
            for id in &devs {
                self.s
                    .devices
                    .iter_mut()
                    .find(|x| &x.id == id)
                    .unwrap()
                    .idle_since_ms = None;
            }
            self.s.leases.push(Held {
                unit,
                team: w.team.clone(),
                uid: w.uid,
                devices: devs.clone(),
                since_ms: now,
                borrowed_from: from,
            });
            *self.s.usage.users.entry(w.uid).or_default() += devs.len() as f64;
            self.s.waiting.retain(|x| x.ticket != t);
            self.waited.insert(t, now - self.arrived[&t]);
        }
        Ok(d)
    }
}

/// Three teams on `n` devices each; train lends to the others after 5 s with a 3 s grace.
fn teams_sim(devs: &[(u8, bool)], window: Option<&str>) -> Snapshot {
    let names = ["train", "interns", "research"];
    let mut teams = BTreeMap::new();
    for t in names {
        teams.insert(t.to_string(), TeamRules::default());
    }
    let mut r = rule(
        &["interns", "research"],
        0,
        3,
        &window.into_iter().collect::<Vec<_>>(),
    );
    r.after = Duration::from_secs(5);
    teams.get_mut("train").unwrap().lend = Some(r);
    let mut r = rule(&["all"], 0, 2, &[]);
    r.after = Duration::from_secs(1);
    teams.get_mut("research").unwrap().lend = Some(r);
    Snapshot {
        now_ms: 0,
        local: window.map(|_| LocalTime {
            weekday: 0,
            minute_of_day: 0,
        }),
        teams,
        devices: devs
            .iter()
            .enumerate()
            .map(|(i, (team, mig))| {
                dev(
                    &format!("{}-{i}", if *mig { "MIG" } else { "GPU" }),
                    names[*team as usize % 3],
                    *mig,
                    Some(0),
                )
            })
            .collect(),
        ..Default::default()
    }
}

/// Whether `w` could ever be served by its own share (checked on the full, empty share).
fn own_servable(s: &Snapshot, w: &Waiter) -> bool {
    let share: Vec<Candidate> = s
        .devices
        .iter()
        .filter(|d| d.owners.contains(&w.team))
        .map(|d| Candidate {
            id: d.id.clone(),
            mig: d.mig,
            mps: d.mps,
            held: 0,
            memory_used: None,
            activity: None,
            outside: None,
            profile: d.profile.clone(),
        })
        .collect();
    let req = Request {
        gpus: w.gpus,
        device: w.device.clone(),
        profile: w.profile.clone(),
    };
    placement::choose(&share, &req, None, None).is_ok()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Random teams, devices, lend rules and requests: at every step never two teams on one
    /// device, a lent device carries its one job, a borrower stopped only after notice and
    /// grace, nothing servable left waiting; and once arrivals stop, every request its own
    /// share can serve is placed.
    #[test]
    fn random_shares_keep_every_invariant(
        devs in prop::collection::vec((0u8..3, any::<bool>()), 2..9),
        seed in any::<u64>(),
        windowed in any::<bool>(),
        rate in 2u64..6,
    ) {
        let s = teams_sim(&devs, windowed.then_some("00:02..00:05"));
        let mut sim = Sim::new(s, seed);
        let names = ["train", "interns", "research"];
        let mut own = Vec::new();
        for step in 0..360u64 {
            if step < 200 && sim.rand(10) < rate {
                let team = names[sim.rand(3) as usize];
                let mut w = waiter(0, team, 1000 + sim.rand(12) as u32, sim.rand(2) == 0);
                match sim.rand(6) {
                    0 => w.gpus = Some(Gpus::Count(2)),
                    1 => w.device = Some(sim.rand(3).to_string()),
                    _ => {}
                }
                let servable = own_servable(&sim.s, &w);
                if servable || w.borrow {
                    let t = sim.submit(w);
                    if servable {
                        own.push(t);
                    }
                }
            }
            if let Some(l) = sim.s.local.as_mut() {
                l.minute_of_day = (step / 60) as u16;
            }
            sim.step()?;
        }
        for t in own {
            prop_assert!(sim.waited.contains_key(&t), "ticket {} never placed", t);
        }
    }

    /// An owner whose devices are all lent gets them back: one reclaim per request, the most
    /// recent loans first, placed within grace plus a step.
    #[test]
    fn an_owner_always_gets_its_devices_back(
        k in 1usize..5,
        m in 1usize..5,
        sinces in prop::collection::vec(0u64..100, 4),
        seed in any::<u64>(),
    ) {
        let m = m.min(k);
        let mut s = teams_sim(&vec![(0, false); k], None);
        s.now_ms = 200_000;
        for (i, d) in s.devices.iter_mut().enumerate() {
            d.idle_since_ms = None;
            s.leases.push(held(&format!("b-{i}.scope"), "interns", &[&d.id], sinces[i] * 1000, Some("train")));
        }
        let mut sim = Sim::new(s, seed);
        sim.borrow_job_s = 1_000_000;
        let tickets: Vec<Ticket> = (0..m).map(|i| sim.submit(waiter(0, "train", 7 + i as u32, false))).collect();
        for _ in 0..6 {
            sim.step()?;
        }
        // Grace (3 s) and 2 s: the stop at the end of the grace, the start at the next step.
        for t in &tickets {
            prop_assert!(sim.waited.get(t).is_some_and(|w| *w <= 5000), "{} waited {:?}", t, sim.waited.get(t));
        }
        prop_assert_eq!(sim.reclaimed.len(), m);
        let mut loans: Vec<(u64, String)> = (0..k).map(|i| (sinces[i], format!("b-{i}.scope"))).collect();
        loans.sort();
        loans.reverse();
        let mut latest: Vec<String> = loans.into_iter().take(m).map(|(_, u)| u).collect();
        let mut got = sim.reclaimed.clone();
        latest.sort();
        got.sort();
        prop_assert_eq!(got, latest);
    }

    /// A request for two GPUs among a stream of one-GPU requests from users who used less:
    /// passed over a bounded number of times, then served.
    #[test]
    fn a_queue_never_starves_a_request(
        k in 2usize..5,
        seed in any::<u64>(),
    ) {
        let mut s = teams_sim(&vec![(0, false); k], None);
        s.usage.users.insert(1, 1e9);
        let mut sim = Sim::new(s, seed);
        sim.max_job_s = 6;
        let mut two = waiter(0, "train", 1, false);
        two.gpus = Some(Gpus::Count(2));
        let t = sim.submit(two);
        for step in 0..200u32 {
            // Enough newcomers to take every device that frees, never a long queue.
            while sim.s.waiting.len() < 2 * k + 2 {
                sim.submit(waiter(0, "train", 100 + step, false));
            }
            sim.step()?;
            if sim.waited.contains_key(&t) {
                break;
            }
        }
        prop_assert!(sim.waited.get(&t).is_some_and(|w| *w <= 60_000), "waited {:?}", sim.waited.get(&t));
    }
}

#[test]
fn ledger_days_become_each_waiting_users_and_each_borrowers_decayed_usage() {
    use crate::ledger::{Day, Figures, Key};
    let key = |team: &str, user: &str| Key {
        team: team.into(),
        user: user.into(),
        device: "0".into(),
        kind: "gpu".into(),
    };
    let held = |s: u64, borrowed: u64| Figures {
        held_ms: s * 1000,
        borrowed_ms: borrowed * 1000,
        ..Figures::default()
    };
    const DAY: u64 = 86_400_000;
    let days = vec![
        Day {
            day: 10,
            figures: [
                (key("t", "alice"), held(800, 0)),
                (key("interns", "1002"), held(100, 100)),
                (key("research", "dave"), held(600, 600)),
            ]
            .into(),
        },
        Day {
            day: 11,
            figures: [
                (key("t", "alice"), held(100, 0)),
                (key("interns", "carol"), held(50, 40)),
            ]
            .into(),
        },
    ];
    // alice by name, uid 1002 by its uid (no NSS name when it was written); carol and dave are
    // not waiting, but their teams' borrowed time counts.
    let users: HashMap<String, u32> = [("alice".into(), 1000), ("1002".into(), 1002)].into();
    let half = Duration::from_millis(DAY);
    // Now is the end of day 11: day 11 weighs in full, day 10 half.
    let u = from_ledger(&days, &users, 12 * DAY, half);
    assert_eq!(u.users.len(), 2);
    assert!((u.users[&1000] - (100.0 + 400.0)).abs() < 1e-6, "{u:?}");
    assert!((u.users[&1002] - 50.0).abs() < 1e-6, "{u:?}");
    assert_eq!(u.teams.len(), 2, "only teams that borrowed: {u:?}");
    assert!((u.teams["interns"] - (50.0 + 40.0)).abs() < 1e-6, "{u:?}");
    assert!((u.teams["research"] - 300.0).abs() < 1e-6, "{u:?}");
}

#[test]
fn the_team_that_borrowed_least_recently_gets_the_next_loan() {
    // train lends one idle GPU to interns and research; research asked first, but borrowed more
    // lately: interns gets it. With research's borrowed time below interns', research does.
    let mut s = night();
    s.teams.get_mut("train").unwrap().lend = Some(rule(&["interns", "research"], 10, 60, &[]));
    s.teams.insert("research".into(), TeamRules::default());
    s.devices.retain(|d| d.id != "GPU-b");
    s.waiting = vec![
        waiter(1, "research", 1001, true),
        waiter(2, "interns", 1000, true),
    ];
    s.usage.teams = [
        ("research".to_string(), 900.0),
        ("interns".to_string(), 100.0),
    ]
    .into();
    assert_eq!(
        places(&decide(&s)),
        vec![(2, vec!["GPU-a".into()], Some("train".into()))]
    );
    s.usage.teams = [
        ("research".to_string(), 50.0),
        ("interns".to_string(), 100.0),
    ]
    .into();
    assert_eq!(
        places(&decide(&s)),
        vec![(1, vec!["GPU-a".into()], Some("train".into()))]
    );
    // A team's borrowed time outweighs its user's own usage.
    s.usage.users = [(1001, 0.0), (1000, 5_000.0)].into();
    assert_eq!(
        places(&decide(&s)),
        vec![(1, vec!["GPU-a".into()], Some("train".into()))]
    );
}

#[test]
fn an_owner_that_takes_a_loan_back_waits_for_it_and_borrows_nothing_else() {
    // Train's request may borrow too (borrow = true); research lends an idle GPU to all. Train's
    // own GPUs are both lent to interns: it takes one back and does not also borrow research's.
    let mut s = night();
    s.teams.insert(
        "research".to_string(),
        TeamRules {
            lend: Some(LendRule {
                to: crate::policy::LendTo::All,
                ..rule(&[], 1, 60, &[])
            }),
            ..Default::default()
        },
    );
    s.devices.push(dev("GPU-r", "research", false, Some(0)));
    for (unit, d, at) in [("b-1.scope", "GPU-a", 10), ("b-2.scope", "GPU-b", 20)] {
        s.leases
            .push(held(unit, "interns", &[d], at * MIN, Some("train")));
    }
    s.devices[0].idle_since_ms = None;
    s.devices[1].idle_since_ms = None;
    s.waiting = vec![waiter(7, "train", 2000, true)];
    let d = decide(&s);
    assert!(
        d.iter().any(|x| matches!(
            x,
            Decision::Reclaim {
                why: Why::Owner(7),
                ..
            }
        )),
        "{d:?}"
    );
    assert_eq!(
        places(&d),
        vec![],
        "no borrowing beside its own reclaim: {d:?}"
    );
    // The next look, with the reclaim in flight: still no borrowing.
    s.reclaims.push(owner_7_takes_back_b2(s.now_ms));
    s.now_ms += 1000;
    let d = decide(&s);
    assert_eq!(places(&d), vec![], "{d:?}");
    // Another team's request, with no reclaim for it, does borrow research's GPU.
    s.waiting.push(waiter(8, "interns", 3000, true));
    let d = decide(&s);
    assert_eq!(
        places(&d),
        vec![(8, vec!["GPU-r".into()], Some("research".into()))],
        "{d:?}"
    );
}

#[test]
fn requests_of_one_team_share_a_reason_only_where_nothing_is_theirs_alone() {
    // Both of train's GPUs lent to interns; train's request 7 took back GPU-b, 8 takes back
    // GPU-a now; 11 is 8's size and 9 and 12 ask for both GPUs; interns' 10 borrows.
    let mut s = both_lent();
    s.reclaims.push(owner_7_takes_back_b2(s.now_ms));
    let both = |t: Ticket, uid: u32| Waiter {
        gpus: Some(Gpus::Count(2)),
        ..waiter(t, "train", uid, false)
    };
    s.waiting = vec![
        waiter(7, "train", 2000, false),
        waiter(8, "train", 2001, false),
        both(9, 2002),
        waiter(10, "interns", 3000, true),
        waiter(11, "train", 2003, false),
        both(12, 2004),
    ];
    let w = waits(&decide(&s));
    let of = |t: Ticket| w.iter().find(|x| x.0 == t).unwrap().3.clone();
    let none = "no free device in train's share";
    assert_eq!(
        of(7),
        format!("{none}; GPU-b comes back in 60 s at most; you are 1st")
    );
    assert_eq!(
        of(8),
        format!("{none}; a lent device is being taken back for it; you are 2nd")
    );
    assert_eq!(of(9), format!("{none}; you are 3rd"));
    assert_eq!(
        of(11),
        format!("{none}; you are 4th"),
        "8's size, nothing of 8's"
    );
    assert_eq!(of(12), format!("{none}; you are 5th"));
    assert_eq!(
        of(10),
        "no free device in interns' share; train's own requests wait; you are 1st"
    );
}

#[test]
fn a_profile_takes_back_only_a_loan_of_its_profile_and_never_borrows() {
    // Train's two MIG devices, a 3g.40gb and a 1g.10gb, are lent to interns; the 1g loan is
    // the later one.
    let mut s = both_lent();
    for (d, p) in s.devices.iter_mut().zip(["3g.40gb", "1g.10gb"]) {
        d.mig = true;
        d.profile = Some(p.into());
    }
    let big = Waiter {
        profile: Some("3g.40gb".into()),
        ..waiter(7, "train", 2000, false)
    };
    s.waiting = vec![big.clone()];
    let d = decide(&s);
    assert!(
        matches!(&d[0], Decision::Reclaim { unit, why: Why::Owner(7), .. } if unit == "b-1.scope"),
        "the loan of the 3g.40gb device, not the latest: {d:?}"
    );
    assert!(
        !d.iter()
            .any(|x| matches!(x, Decision::Reclaim { unit, .. } if unit == "b-2.scope")),
        "{d:?}"
    );
    // A profile its team has no device of takes nothing back.
    s.waiting = vec![Waiter {
        profile: Some("7g.80gb".into()),
        ..big.clone()
    }];
    assert!(
        !decide(&s)
            .iter()
            .any(|x| matches!(x, Decision::Reclaim { .. })),
        "nothing of train's can serve it"
    );
    // Interns asks for a 3g.40gb with --borrow: train's idle one is not lent to it.
    let mut s = night();
    for d in &mut s.devices {
        d.mig = true;
        d.profile = Some("3g.40gb".into());
    }
    s.waiting = vec![Waiter {
        profile: Some("3g.40gb".into()),
        ..waiter(1, "interns", 1000, true)
    }];
    let d = decide(&s);
    assert!(places(&d).is_empty(), "{d:?}");
    s.waiting[0].profile = None;
    assert_eq!(places(&decide(&s)).len(), 1, "without a profile it borrows");
}
