//! `gpuctl plan` on a full-size host: 8 H100s in MIG mode with 7 instances each, 32 teams,
//! 56 MPS daemons (one per MIG device). Issue #14 sets the goal at ≤ 5 ms for the plan on such a
//! host, natively.
//!
//! Printed, each as the median of many runs in this process, on the simulated host:
//! - `load`: parse and validate the policy drop-in (what every reconcile does first);
//! - `plan fresh`: the first plan, against a host with MIG off and nothing set up (the boot case);
//! - `plan converged`: the plan against the host that plan's apply produced (the steady state:
//!   every policy change and drift check pays this);
//! - `observe floor`: a deep copy of the observed snapshot, the cost of merely holding the host's
//!   state once, as a baseline measured in the same run.
//!
//! Run: `cargo bench --bench plan_scale`.

use gpuctl::apply::execute;
use gpuctl::plan::plan;
use gpuctl::sim::SimHost;
use std::hint::black_box;
use std::time::{Duration, Instant};

#[path = "../tests/common/scale.rs"]
mod scale;
use scale::{policy_toml, GPUS, PER_GPU, TEAMS};

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

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("50-scale.toml");
    std::fs::write(&file, policy_toml()).expect("write policy");
    let load = || {
        gpuctl::policy::load_files(std::slice::from_ref(&file))
            .policy
            .expect("the scale policy is valid")
    };
    let policy = load();

    let fresh = SimHost::from_spec(&format!("h100-80gb*{GPUS}")).expect("sim host");
    let first = plan(&policy, &fresh.state);
    let mut host = fresh.clone();
    let report = execute(&policy, &first, &mut host).expect("apply on the simulated host");
    let again = plan(&policy, &host.state);
    assert!(
        again.is_converged(),
        "the scale host must converge: {report:#?}"
    );
    assert_eq!(
        host.state.mps.len(),
        GPUS * PER_GPU,
        "one MPS daemon per MIG device"
    );
    assert_eq!(host.state.slices.len(), TEAMS, "one slice per team");

    let runs = 200;
    let t_load = median(runs / 4, || {
        black_box(load());
    });
    let t_fresh = median(runs, || {
        black_box(plan(&policy, &fresh.state));
    });
    let t_conv = median(runs, || {
        black_box(plan(&policy, &host.state));
    });
    let t_floor = median(runs, || {
        black_box(host.state.clone());
    });
    println!(
        "plan_scale: {GPUS} GPUs x {PER_GPU} MIG devices, {TEAMS} teams, {} MPS daemons; {} actions on the fresh host",
        host.state.mps.len(),
        first.actions.len()
    );
    println!("  load policy     {:8.3} ms", ms(t_load));
    println!("  plan fresh      {:8.3} ms", ms(t_fresh));
    println!("  plan converged  {:8.3} ms", ms(t_conv));
    println!(
        "  observe floor   {:8.3} ms (deep copy of the snapshot)",
        ms(t_floor)
    );
    println!(
        "BENCH plan_scale converged/floor={:.1}x fresh/floor={:.1}x (load+plan converged)/goal 5 ms={:.2}",
        ms(t_conv) / ms(t_floor),
        ms(t_fresh) / ms(t_floor),
        (ms(t_load) + ms(t_conv)) / 5.0
    );
}
