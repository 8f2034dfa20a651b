//! One usage collection on 8 H100s × 7 MIG devices with 500 processes, through the real
//! nvml-wrapper against the fake libnvidia-ml: NVML calls per collection and wall time, against
//! the floor of (devices × calls a device needs), and a served (cached) read as the baseline
//! of what a reader costs within the interval.
//!
//! Floor: per GPU the 10 reads nothing can skip (handle, UUID, name, memory, utilisation,
//! power, temperature, MIG mode, compute and graphics process lists) and per MIG device 5
//! (handle, UUID, GI id, CI id, memory); GPM and the process lists' size queries come on top.
//!
//! Run: `cargo bench --bench usage_collect`.

#[path = "../tests/fakehost/mod.rs"]
mod fakehost;
#[path = "../tests/usagehost/mod.rs"]
mod usagehost;

use fakehost::{lib_path, query_calls, FakeHost};
use gpuctl::paths::Root;
use gpuctl::usage::collect::Collector;
use std::time::{Duration, Instant};

const RUNS: usize = 5;

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

    let mut walls = Vec::new();
    let mut calls = Vec::new();
    let mut procs = 0;
    for _ in 0..RUNS {
        // A fresh collector each run: the first collection opens NVML (nvmlInit counted).
        let c = Collector::new(Some(lib_path()), Duration::from_secs(3600));
        let q0 = query_calls();
        let t = Instant::now();
        let u = c.get(&root, &owners, &usagehost::Names);
        walls.push(t.elapsed());
        calls.push(query_calls() - q0);
        procs = u.processes().count();
        assert_eq!(u.gpus.len(), 8);
        assert_eq!(
            u.gpus.iter().map(|g| g.mig_devices.len()).sum::<usize>(),
            56
        );
    }
    assert_eq!(procs, 500);
    let c = Collector::new(Some(lib_path()), Duration::from_secs(3600));
    let _ = c.get(&root, &owners, &usagehost::Names);
    let mut served = Vec::new();
    let q0 = query_calls();
    for _ in 0..RUNS {
        let t = Instant::now();
        let _ = c.get(&root, &owners, &usagehost::Names);
        served.push(t.elapsed());
    }
    let served_calls = query_calls() - q0;

    let (gpus, migs) = (8u64, 56u64);
    let floor = gpus * 10 + migs * 5;
    let wall = median(walls);
    let served = median(served);
    let n = calls[calls.len() / 2];
    println!(
        "BENCH usage_collect gpus=8 mig_devices=56 processes={procs} nvml_calls={n} floor={floor} \
         calls_vs_floor={:.2} wall_ms={:.1} served_read_us={:.0} served_nvml_calls={served_calls} \
         collect_vs_served={:.0}",
        n as f64 / floor as f64,
        wall.as_secs_f64() * 1e3,
        served.as_secs_f64() * 1e6,
        wall.as_secs_f64() / served.as_secs_f64().max(1e-9),
    );
}
