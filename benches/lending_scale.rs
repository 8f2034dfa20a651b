//! `lending::decide` at the scale: 1,000 waiting requests from 200 users over 56
//! devices (8 GPUs × 7 MIG devices, 8 teams of 7), 20 of them lent; goal ≤ 5 ms, natively.
//!
//! The host is busy, the worst case for the choice: every device not lent is held by its
//! owner's job, so each request is looked at on its own share, half of them again as borrowers,
//! and each gets its reason in words. A handful of lent devices are idle, so some borrow.
//!
//! Printed, each as the median of many runs in this process:
//! - `decide`: the whole decision (fair order, both passes, every reason);
//! - `choose x1000` (baseline): `placement::choose` once per waiting request over its own team's
//!   share, what a queue that only tried each request in turn would pay, measured in the same run.
//!
//! Run: `cargo bench --bench lending_scale`.

use gpuctl::lending::{decide, Decision, Device, Held, RecentUsage, Snapshot, TeamRules, Waiter};
use gpuctl::placement::{self, Candidate, Request};
use gpuctl::policy::{LendRule, LendTo};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

const TEAMS: usize = 8;
const PER_TEAM: usize = 7;
const USERS: u32 = 200;
const WAITING: u64 = 1000;
const LOANS: usize = 20;

fn median<F: FnMut()>(runs: usize, mut f: F) -> Duration {
    let mut t: Vec<Duration> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    t.sort();
    t[runs / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn team(i: usize) -> String {
    format!("team{i}")
}

fn snapshot() -> Snapshot {
    let now_ms = 10 * 86_400_000;
    let mut teams = BTreeMap::new();
    for i in 0..TEAMS {
        // The first half lends to everyone, after ten minutes, with a minute's grace.
        let lend = (i < TEAMS / 2).then(|| LendRule {
            to: LendTo::All,
            after: LendRule::DEFAULT_AFTER,
            grace: LendRule::DEFAULT_GRACE,
            when: vec![],
        });
        teams.insert(
            team(i),
            TeamRules {
                lend,
                ..Default::default()
            },
        );
    }
    let mut devices = Vec::new();
    let mut leases = Vec::new();
    let mut lent = 0;
    for t in 0..TEAMS {
        for k in 0..PER_TEAM {
            let id = format!("MIG-{t}-{k}");
            let lender = t < TEAMS / 2;
            let (holder, from, idle) = if lender && lent < LOANS && k < 5 {
                lent += 1;
                (team(TEAMS / 2 + lent % (TEAMS / 2)), Some(team(t)), None)
            } else if lender && k == 6 {
                // Idle for an hour: lendable.
                (String::new(), None, Some(now_ms - 3_600_000))
            } else {
                (team(t), None, None)
            };
            if !holder.is_empty() {
                leases.push(Held {
                    unit: format!("gpuctl-run-{holder}-{t}{k}.scope"),
                    team: holder,
                    uid: 1000 + (t * PER_TEAM + k) as u32,
                    devices: vec![id.clone()],
                    since_ms: now_ms - (t * PER_TEAM + k) as u64 * 60_000,
                    borrowed_from: from,
                });
            }
            devices.push(Device {
                id,
                owners: vec![team(t)],
                mig: true,
                mps: false,
                idle_since_ms: idle,
                foreign: None,
                profile: None,
            });
        }
    }
    assert_eq!(lent, LOANS);
    let waiting: Vec<Waiter> = (0..WAITING)
        .map(|n| {
            let uid = 1000 + (n as u32 * 7919) % USERS;
            Waiter {
                ticket: n + 1,
                team: team(uid as usize % TEAMS),
                uid,
                gpus: None,
                device: None,
                profile: None,
                borrow: n % 2 == 0,
                passed_over: (n % 5) as u32,
            }
        })
        .collect();
    let usage = RecentUsage {
        users: (0..USERS)
            .map(|u| (1000 + u, f64::from((u * 37) % 101)))
            .collect(),
        teams: (0..TEAMS).map(|t| (team(t), t as f64)).collect(),
    };
    Snapshot {
        now_ms,
        local: None,
        teams,
        devices,
        leases,
        reclaims: vec![],
        waiting,
        usage,
    }
}

fn main() {
    let s = snapshot();
    let d = decide(&s);
    let count = |f: fn(&Decision) -> bool| d.iter().filter(|x| f(x)).count();
    let placed = count(|x| matches!(x, Decision::Place { .. }));
    let reclaims = count(|x| matches!(x, Decision::Reclaim { .. }));
    let waits = count(|x| matches!(x, Decision::Wait { .. }));
    assert_eq!(placed + waits, WAITING as usize, "one answer per request");
    assert!(
        placed > 0 && reclaims > 0,
        "{placed} placed, {reclaims} reclaims"
    );

    // The baseline: each request's own share as candidates, one choose each.
    let shares: Vec<Vec<Candidate>> = (0..TEAMS)
        .map(|t| {
            s.devices
                .iter()
                .filter(|x| x.owners[0] == team(t))
                .map(|x| Candidate {
                    id: x.id.clone(),
                    mig: x.mig,
                    mps: x.mps,
                    held: s
                        .leases
                        .iter()
                        .filter(|l| l.devices.contains(&x.id))
                        .count() as u32,
                    memory_used: None,
                    activity: None,
                    outside: None,
                    profile: None,
                })
                .collect()
        })
        .collect();
    let index: Vec<usize> = s.waiting.iter().map(|w| (w.uid as usize) % TEAMS).collect();

    let runs = 101;
    let t_decide = median(runs, || {
        black_box(decide(black_box(&s)));
    });
    let t_choose = median(runs, || {
        for &t in &index {
            let _ = black_box(placement::choose(
                black_box(&shares[t]),
                &Request::default(),
                None,
                None,
            ));
        }
    });
    println!(
        "lending_scale: {} waiting from {USERS} users, {} devices, {LOANS} loans: {placed} placed, \
         {reclaims} reclaims, {waits} waiting",
        WAITING,
        s.devices.len()
    );
    println!("  decide          {:8.3} ms", ms(t_decide));
    println!(
        "  choose x{WAITING}    {:8.3} ms (baseline: one choose per request)",
        ms(t_choose)
    );
    println!(
        "BENCH lending_scale decide/choose_x1000={:.1}x decide/goal_5ms={:.2}",
        ms(t_decide) / ms(t_choose),
        ms(t_decide) / 5.0
    );
}
