//! Usage observation through the real nvml-wrapper against the fake libnvidia-ml: MIG devices
//! without utilisation, GPM activity, per-process attribution through a fake `/proc`, strays,
//! processes that exit between the NVML and the `/proc` read, pids in another pid namespace,
//! and the collector's bound on NVML reads.

mod fakehost;
mod usagehost;

use fakehost::{lib_path, query_calls, FakeHost};
use gpuctl::paths::Root;
use gpuctl::usage::collect::Collector;
use gpuctl::usage::Usage;
use std::time::Duration;
use usagehost::{apply_and_own, seven_policy, team_cgroup, write_proc, Names};

fn process(u: &Usage, pid: u32) -> Option<&gpuctl::usage::ProcessUsage> {
    u.processes().map(|(_, _, p)| p).find(|p| p.pid == pid)
}

#[test]
fn usage_is_attributed_and_unknowns_stay_unknown() {
    let fake = FakeHost::new("h100-80gb,l40s");
    let p = seven_policy(fake.dir.path(), 1);
    let owners = apply_and_own(&fake, &p);
    let devs = usagehost::mig_devices(&fake);
    assert_eq!(devs.len(), 7);
    // Device k belongs to team TEAMS[k] (placement order = GI order on a fresh GPU): find the
    // GI of team a and team c from the owners instead of assuming.
    let obs = fake.observe();
    let team_of = |gi: u32| -> String {
        let inst = obs.gpus[0]
            .mig
            .as_ref()
            .unwrap()
            .instances
            .iter()
            .find(|i| i.id == gi)
            .unwrap();
        owners.mig[&inst.compute[0].uuid][0].clone()
    };
    let dev_of = |team: &str| *devs.iter().find(|(_, gi, _)| team_of(*gi) == team).unwrap();
    let (da, db, dc, dd) = (dev_of("a"), dev_of("b"), dev_of("c"), dev_of("d"));
    let root = &fake.root;
    write_proc(
        root,
        10000,
        1001,
        &team_cgroup("a", "train-a.service"),
        Some(7),
    );
    write_proc(
        root,
        10001,
        1002,
        &team_cgroup("b", "gpuctl-run-b-9.scope"),
        None,
    );
    write_proc(root, 10002, 0, "/system.slice/cron.service", None);
    // 10003: no /proc entry: it exited after NVML listed it.
    write_proc(
        root,
        10004,
        1003,
        "/user.slice/user-1003.slice/session-2.scope",
        None,
    );
    write_proc(root, 10005, 4242, "/system.slice/render.service", None);
    fake_nvml::control::update(&fake.state, |st| {
        let mk = |pid, (g, gi, ci): (u32, u32, u32), mib| fake_nvml::state::Process {
            pid,
            gpu: g,
            gi: Some(gi),
            ci: Some(ci),
            used_memory_mib: mib,
        };
        st.processes.push(mk(10000, da, 2048));
        st.processes.push(mk(10001, db, 1024));
        st.processes.push(mk(10002, dc, 512));
        st.processes.push(mk(10003, dd, 256));
        st.processes.push(fake_nvml::state::Process {
            pid: 10005,
            gpu: 1,
            gi: None,
            ci: None,
            used_memory_mib: 300,
        });
        st.usage.graphics.push(fake_nvml::state::Process {
            pid: 10004,
            gpu: 1,
            gi: None,
            ci: None,
            used_memory_mib: 100,
        });
        st.usage.gpus.insert(
            1,
            fake_nvml::usage::GpuUsage {
                utilization_gpu: 37,
                utilization_memory: 12,
                power_mw: 250_000,
                temperature_c: 50,
                gpm_sm_activity: 0.0,
            },
        );
        st.usage.gpm_gi.insert(format!("0/{}", da.1), 55.0);
    })
    .unwrap();

    // Interval 0: every get collects (the second one has a GPM sample pair).
    let c = Collector::new(Some(lib_path()), Duration::ZERO);
    let r = Root::new(root);
    let first = c.get(&r, &owners, &Names);
    let u = c.get(&r, &owners, &Names);
    assert_eq!(c.collections(), 2);
    assert_eq!(u.nvml_unavailable, None);
    assert_eq!(u.gpus.len(), 2);

    let h = &u.gpus[0];
    assert!(h.mig);
    assert_eq!(h.utilization_gpu, None, "no utilisation in MIG mode");
    assert_eq!(h.utilization_memory, None);
    assert!(h.power_mw.is_some() && h.temperature_c.is_some());
    assert_eq!(h.mig_devices.len(), 7);
    for m in &h.mig_devices {
        assert_eq!(m.profile, "1g.10gb");
        assert_eq!(m.teams.len(), 1);
        assert!(m.memory_total.unwrap() > 9 << 30, "{m:?}");
    }
    let ma = h.mig_devices.iter().find(|m| m.gi_id == da.1).unwrap();
    assert_eq!(ma.teams, vec!["a"]);
    assert_eq!(ma.memory_used, Some(2048 << 20));
    assert_eq!(
        ma.activity,
        Some(55.0),
        "GPM SM activity of its GPU instance"
    );
    let mb = h.mig_devices.iter().find(|m| m.gi_id == db.1).unwrap();
    assert_eq!(mb.activity, Some(0.0), "a measured idle GI is 0");
    let first_a = first.gpus[0]
        .mig_devices
        .iter()
        .find(|m| m.gi_id == da.1)
        .unwrap();
    assert_eq!(
        first_a.activity, None,
        "one GPM sample gives no activity yet"
    );

    let l = &u.gpus[1];
    assert!(!l.mig);
    assert_eq!(
        (l.utilization_gpu, l.utilization_memory),
        (Some(37), Some(12))
    );
    assert_eq!(l.activity, None, "no GPM before Hopper");
    assert_eq!(l.power_mw, Some(250_000));
    assert_eq!(l.temperature_c, Some(50));
    assert!(l.teams.is_empty());

    let a = process(&u, 10000).unwrap();
    assert_eq!(a.user.as_deref(), Some("user1001"));
    assert_eq!(a.team.as_deref(), Some("a"));
    assert_eq!(a.unit.as_deref(), Some("train-a.service"));
    assert_eq!(a.ns_pid, Some(7), "pid inside its own pid namespace");
    assert_eq!(a.used_memory, Some(2048 << 20));
    assert!(!a.stray);
    let b = process(&u, 10001).unwrap();
    assert_eq!(
        (b.team.as_deref(), b.unit.as_deref()),
        (Some("b"), Some("gpuctl-run-b-9.scope"))
    );
    assert!(!b.stray);
    let s = process(&u, 10002).unwrap();
    assert!(s.stray, "root job on team c's device");
    assert_eq!((s.user.as_deref(), s.team.as_deref()), (Some("root"), None));
    assert!(
        process(&u, 10003).is_none(),
        "exited between NVML and /proc: skipped"
    );
    let g = process(&u, 10004).unwrap();
    assert_eq!(g.kind, "graphics");
    assert!(!g.stray, "unowned GPU: nobody's stray");
    assert_eq!(process(&u, 10005).unwrap().user.as_deref(), Some("4242"));
    assert_eq!(u.processes().filter(|(_, _, p)| p.stray).count(), 1);
}

#[test]
fn one_collection_serves_every_reader_and_nothing_polls_unasked() {
    let fake = FakeHost::new("h100-80gb*2");
    let p = seven_policy(fake.dir.path(), 2);
    let owners = apply_and_own(&fake, &p);
    let r = Root::new(&fake.root);
    let c = Collector::new(Some(lib_path()), Duration::from_secs(3600));
    let before = query_calls();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(c.collections(), 0);
    assert_eq!(query_calls(), before, "no NVML call while nobody asks");
    let u1 = c.get(&r, &owners, &Names);
    let after_one = query_calls();
    assert!(after_one > before);
    let readers: Vec<Usage> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| c.get(&r, &owners, &Names)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(c.collections(), 1, "one collection per interval");
    assert_eq!(query_calls(), after_one, "later readers cost no NVML call");
    for u in readers {
        assert_eq!(u.gpus, u1.gpus);
    }
}

#[test]
fn failing_reads_are_not_available_never_zero() {
    let fake = FakeHost::new("l40s");
    std::env::set_var(
        "FAKE_NVML_FAIL",
        "nvmlDeviceGetUtilizationRates:UNKNOWN,nvmlDeviceGetPowerUsage:NOT_SUPPORTED",
    );
    let c = Collector::new(Some(lib_path()), Duration::ZERO);
    let u = c.get(&Root::new(&fake.root), &Default::default(), &Names);
    std::env::remove_var("FAKE_NVML_FAIL");
    let g = &u.gpus[0];
    assert_eq!(g.utilization_gpu, None);
    assert_eq!(g.power_mw, None);
    assert!(g.temperature_c.is_some());
    assert!(g.memory_total.is_some());
}

#[test]
fn no_driver_is_reported_not_fatal() {
    let fake = FakeHost::new("l40s");
    let c = Collector::new(
        Some(fake.dir.path().join("no-such-libnvidia-ml.so")),
        Duration::ZERO,
    );
    let u = c.get(&Root::new(&fake.root), &Default::default(), &Names);
    assert!(u
        .nvml_unavailable
        .as_deref()
        .unwrap()
        .contains("NVML not available"));
    assert!(u.gpus.is_empty());
}
