//! A full-size host converges, in `cargo test` (issue #14 item 4): 8 H100s × 7 MIG devices,
//! 32 teams, 56 MPS daemons. VM 65 boots the same shape under a real systemd and measures it
//! against systemd alone; it is a benchmark, run on request (`vm-tests/run --bench`), so the
//! correctness half is here, natively, on every run: on the simulated host (every phase:
//! MIG, slices, MPS units, env files) and through the real NVML path against the fake library
//! (the boot case: MIG mode on, no instances).

mod fakehost;
#[path = "common/scale.rs"]
mod scale;

use fakehost::{mig_part, policy, FakeHost};
use gpuctl::apply::execute;
use gpuctl::plan::plan;
use gpuctl::sim::SimHost;
use scale::{policy_toml, GPUS, PER_GPU, TEAMS};
use std::collections::{BTreeMap, BTreeSet};

const DEVICES: usize = GPUS * PER_GPU;

/// Each team's MIG devices as the policy assigns them (teams 0–23 two, 24–31 one).
fn expected_devices_per_team() -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for t in 0..TEAMS {
        m.insert(format!("t{t:02}"), if t < 24 { 2 } else { 1 });
    }
    m
}

#[test]
fn a_full_size_host_converges_in_one_apply_on_the_simulated_host() {
    let dir = tempfile::tempdir().unwrap();
    let p = policy(dir.path(), "50-scale.toml", &policy_toml());
    let mut host = SimHost::from_spec(&format!("h100-80gb*{GPUS}")).unwrap();
    let first = plan(&p, &host.state);
    let report = execute(&p, &first, &mut host).expect("apply on the simulated host");
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(
        plan(&p, &host.state).is_converged(),
        "a second plan after the apply must be empty: {:?}",
        plan(&p, &host.state).actions
    );

    // 56 instances, 7 per GPU, each owned by the team the policy names.
    let mut owned: BTreeMap<String, usize> = BTreeMap::new();
    let mut mig_uuids = BTreeSet::new();
    for g in &host.state.gpus {
        let m = g.mig.as_ref().expect("MIG mode on every GPU");
        assert_eq!(m.instances.len(), PER_GPU, "GPU {}", g.index);
        for gi in &m.instances {
            *owned.entry(gi.owner.clone().expect("owned")).or_default() += 1;
            mig_uuids.extend(gi.compute.iter().map(|c| c.uuid.clone()));
        }
    }
    assert_eq!(owned, expected_devices_per_team());
    assert_eq!(
        mig_uuids.len(),
        DEVICES,
        "one compute instance per GPU instance"
    );

    // One MPS daemon per MIG device, for the device's team; one slice and env file per team.
    assert_eq!(host.state.mps.len(), DEVICES);
    let mut served = BTreeSet::new();
    let mut per_team: BTreeMap<String, usize> = BTreeMap::new();
    for m in host.state.mps.values() {
        assert_eq!(m.devices.len(), 1, "one device per daemon: {m:?}");
        assert!(mig_uuids.contains(&m.devices[0]), "{m:?}");
        assert!(
            served.insert(m.devices[0].clone()),
            "two daemons on {}",
            m.devices[0]
        );
        assert_eq!(m.active_thread_percentage, Some(50));
        *per_team.entry(m.team.clone()).or_default() += 1;
    }
    assert_eq!(per_team, expected_devices_per_team());
    assert_eq!(host.state.slices.len(), TEAMS);
    assert_eq!(host.state.env_files.len(), TEAMS);
}

#[test]
fn after_a_reboot_the_full_size_host_is_rebuilt_with_one_create_per_instance() {
    let fake = FakeHost::new(&format!("h100*{GPUS}"));
    let p = policy(fake.dir.path(), "50-scale.toml", &policy_toml());
    let r = fake.apply(&p);
    assert!(r.failed.is_empty(), "{:?}", r.failed);

    // A reboot: MIG mode stays on, GPU and compute instances are gone.
    fake_nvml::control::reboot(&fake.state).unwrap();
    let booted = fake.observe();
    assert!(booted
        .gpus
        .iter()
        .all(|g| g.mig.as_ref().is_some_and(|m| m.instances.is_empty())));

    let before = fake.log().len();
    let r = fake.apply(&p);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let log = fake.log();
    let mutating: Vec<&str> = log[before..]
        .iter()
        .filter(|(f, _, _)| {
            f.contains("Create") || f.contains("Destroy") || f.contains("SetMigMode")
        })
        .map(|(f, _, _)| f.as_str())
        .collect();
    let count = |name: &str| mutating.iter().filter(|f| f.starts_with(name)).count();
    assert_eq!(
        count("nvmlDeviceCreateGpuInstance"),
        DEVICES,
        "{mutating:?}"
    );
    assert_eq!(
        count("nvmlGpuInstanceCreateComputeInstance"),
        DEVICES,
        "{mutating:?}"
    );
    assert_eq!(
        mutating.len(),
        2 * DEVICES,
        "nothing but the creates: {mutating:?}"
    );
    assert!(log[before..]
        .iter()
        .all(|(_, res, _)| res == "NVML_SUCCESS"));

    let after = fake.observe();
    assert!(mig_part(&plan(&p, &after)).is_empty());
    let n: usize = after
        .gpus
        .iter()
        .map(|g| g.mig.as_ref().map_or(0, |m| m.instances.len()))
        .sum();
    assert_eq!(n, DEVICES);

    // Converged: the next apply changes nothing on the GPUs.
    let calls = fake.mutating_calls();
    let r = fake.apply(&p);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert_eq!(
        fake.mutating_calls(),
        calls,
        "a converged host needs no NVML change"
    );
}
