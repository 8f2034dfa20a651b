//! What the idle rules add to a sample, against the usage collection it rides on (issue 12):
//! 8 H100s × 7 MIG devices with 500 processes through the real nvml-wrapper and the fake
//! libnvidia-ml, every team with an idle rule. Printed, as medians of `RUNS` interleaved runs:
//! one collection (the baseline: what gpuctld pays per sample anyway), building the holders
//! from it (`idle::sample::from_usage`) plus one `Tracker::observe`, and their ratio.
//!
//! Run: `cargo bench --bench idle_sample`.

#[path = "../tests/fakehost/mod.rs"]
mod fakehost;
#[path = "../tests/usagehost/mod.rs"]
mod usagehost;

use fakehost::{lib_path, FakeHost};
use gpuctl::idle::{sample::from_usage, Tracker};
use gpuctl::paths::Root;
use gpuctl::policy::{IdleAction, IdleRule};
use gpuctl::usage::collect::Collector;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const RUNS: usize = 9;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let fake = FakeHost::new("h100-80gb*8");
    let p = usagehost::seven_policy(fake.dir.path(), 8);
    let owners = usagehost::apply_and_own(&fake, &p);
    usagehost::spread(&fake, &owners, 500);
    let root = Root::new(&fake.root);
    let rules: BTreeMap<String, IdleRule> = usagehost::TEAMS
        .iter()
        .map(|t| {
            (
                t.to_string(),
                IdleRule {
                    after: Duration::from_secs(3600),
                    below: 5.0,
                    action: IdleAction::Stop,
                    grace: Duration::from_secs(900),
                    exclude: vec!["triton-*.service".into()],
                    memory_alarm: Some(95.0),
                },
            )
        })
        .collect();
    let c = Collector::new(Some(lib_path()), Duration::ZERO);
    let _ = c.get(&root, &owners, &usagehost::Names); // opens NVML
    let mut tracker = Tracker::new(30_000);
    tracker.set_rules(rules.clone());
    let (mut collect, mut idle) = (Vec::new(), Vec::new());
    let mut holders = 0;
    for i in 0..RUNS {
        let t = Instant::now();
        let mut u = c.get(&root, &owners, &usagehost::Names);
        collect.push(t.elapsed());
        u.collected_at_ms = i as u64 * 30_000;
        let t = Instant::now();
        let s = from_usage(&u, &rules);
        let ev = tracker.observe(&s);
        idle.push(t.elapsed());
        holders = s.holders.len();
        std::hint::black_box(ev);
    }
    assert!(holders > 0);
    let (c, i) = (median(collect), median(idle));
    println!(
        "BENCH idle_sample holders={holders} collection_ms={:.2} idle_step_ms={:.3} idle/collection={:.4}",
        c.as_secs_f64() * 1e3,
        i.as_secs_f64() * 1e3,
        i.as_secs_f64() / c.as_secs_f64()
    );
}
