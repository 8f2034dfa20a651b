//! The idle rules over the fake NVML: utilisation (a whole L40S) and GPM activity (an H100 MIG
//! device) driven over time through the fake's control API, read through the real collector,
//! fed to the tracker with synthetic sample times (the tracker takes time as input).
//!
//! One test function: it sets `FAKE_NVML_FAIL` at the end, which is process-wide.

mod fakehost;
mod usagehost;

use fakehost::{lib_path, FakeHost};
use gpuctl::idle::{sample::from_usage, Event, Phase, Tracker};
use gpuctl::paths::Root;
use gpuctl::policy::{IdleAction, IdleRule};
use gpuctl::usage::collect::Collector;
use std::collections::BTreeMap;
use std::time::Duration;
use usagehost::{apply_and_own, mig_devices, seven_policy, team_cgroup, write_proc, Names};

const IV: u64 = 10_000;

fn kind(e: &Event) -> (&'static str, String) {
    let (k, h) = match e {
        Event::Idle(h) => ("idle", h),
        Event::Unknown(h) => ("unknown", h),
        Event::Warn(h) => ("warn", h),
        Event::Stop(h) => ("stop", h),
        Event::Woke(h) => ("woke", h),
        Event::Gone(h) => ("gone", h),
    };
    (k, h.unit.clone())
}

#[test]
fn utilisation_and_gpm_over_time_drive_report_warn_and_stop() {
    let fake = FakeHost::new("h100-80gb,l40s");
    let p = seven_policy(fake.dir.path(), 1);
    let mut owners = apply_and_own(&fake, &p);
    // The L40S is team a's whole GPU.
    owners.gpus.insert(1, vec!["a".into()]);
    let obs = fake.observe();
    // Team a's MIG device (GPU 0).
    let (_, gi_a, ci_a) = *mig_devices(&fake)
        .iter()
        .find(|(_, gi, _)| {
            let inst = obs.gpus[0]
                .mig
                .as_ref()
                .unwrap()
                .instances
                .iter()
                .find(|i| i.id == *gi)
                .unwrap();
            owners.mig[&inst.compute[0].uuid] == vec!["a".to_string()]
        })
        .unwrap();
    let root = &fake.root;
    write_proc(root, 20000, 1001, &team_cgroup("a", "nb.scope"), None);
    write_proc(root, 20001, 1002, &team_cgroup("a", "keep-a.service"), None);
    write_proc(
        root,
        20002,
        1001,
        &team_cgroup("a", "train-a.service"),
        None,
    );
    let set_util = |u: u32| {
        fake_nvml::control::update(&fake.state, |st| {
            st.usage.gpus.insert(
                1,
                fake_nvml::usage::GpuUsage {
                    utilization_gpu: u,
                    utilization_memory: 0,
                    power_mw: 70_000,
                    temperature_c: 30,
                    gpm_sm_activity: 0.0,
                },
            );
        })
        .unwrap()
    };
    let set_gpm = |a: f64| {
        fake_nvml::control::update(&fake.state, |st| {
            st.usage.gpm_gi.insert(format!("0/{gi_a}"), a);
        })
        .unwrap()
    };
    fake_nvml::control::update(&fake.state, |st| {
        let on_l40s = |pid| fake_nvml::state::Process {
            pid,
            gpu: 1,
            gi: None,
            ci: None,
            used_memory_mib: 1024,
        };
        st.processes.push(on_l40s(20000));
        st.processes.push(on_l40s(20001));
        st.processes.push(fake_nvml::state::Process {
            pid: 20002,
            gpu: 0,
            gi: Some(gi_a),
            ci: Some(ci_a),
            used_memory_mib: 4096,
        });
    })
    .unwrap();
    set_util(0);
    set_gpm(50.0);

    let rule = IdleRule {
        after: Duration::from_secs(30),
        below: 5.0,
        action: IdleAction::Stop,
        grace: Duration::from_secs(20),
        exclude: vec!["keep-*.service".into()],
        memory_alarm: None,
    };
    let rules: BTreeMap<String, IdleRule> = [("a".to_string(), rule)].into();
    let mut t = Tracker::new(IV);
    t.set_rules(rules.clone());
    let c = Collector::new(Some(lib_path()), Duration::ZERO);
    let r = Root::new(root);
    let step = |t: &mut Tracker, i: u64| -> Vec<(u64, &'static str, String)> {
        let u = c.get(&r, &owners, &Names);
        let mut s = from_usage(&u, &rules);
        s.at_ms = i * IV;
        t.observe(&s)
            .iter()
            .map(|e| {
                let (k, u) = kind(e);
                (i, k, u)
            })
            .collect()
    };

    let mut ev = Vec::new();
    for i in 0..4 {
        ev.extend(step(&mut t, i));
    }
    // 30 s of 0% utilisation on the L40S: both holders there idle; the excluded one only
    // reported. The MIG job runs at 50% GPM activity: nothing.
    assert_eq!(
        ev,
        vec![
            (3, "idle", "keep-a.service".to_string()),
            (3, "idle", "nb.scope".to_string()),
            (3, "warn", "nb.scope".to_string()),
        ]
    );
    let hs = t.holders();
    let nb = hs.iter().find(|h| h.unit == "nb.scope").unwrap();
    assert!(nb.shared_device, "two units share the L40S");
    assert_eq!(nb.pids, vec![20000]);
    assert_eq!(nb.user.as_deref(), Some("user1001"));
    let train = hs.iter().find(|h| h.unit == "train-a.service").unwrap();
    assert_eq!(
        train.activity,
        Some(50.0),
        "GPM activity of its GPU instance"
    );
    assert_eq!(train.phase, Phase::Busy);

    // Utilisation comes back inside the grace: warnings withdrawn, no stop.
    set_util(60);
    let ev = step(&mut t, 4);
    assert_eq!(
        ev,
        vec![
            (4, "woke", "keep-a.service".to_string()),
            (4, "woke", "nb.scope".to_string()),
        ]
    );
    // Idle again from the span after step 4, the MIG job too: 30 s at step 7 (warned), the
    // 20 s grace ends at step 9.
    set_util(0);
    set_gpm(0.0);
    let mut ev = Vec::new();
    for i in 5..11 {
        ev.extend(step(&mut t, i));
    }
    let stops: Vec<_> = ev.iter().filter(|e| e.1 == "stop").collect();
    assert_eq!(
        stops,
        vec![
            &(9, "stop", "nb.scope".to_string()),
            &(9, "stop", "train-a.service".to_string()),
        ],
        "{ev:?}"
    );
    assert!(ev.iter().all(|e| e.2 != "keep-a.service" || e.1 == "idle"));

    // GPM no longer offered (as on a MIG device before Hopper): the MIG holder's activity is
    // unknown; a fresh holder there is reported as such and never warned.
    std::env::set_var("FAKE_NVML_FAIL", "nvmlGpmQueryDeviceSupport:NOT_SUPPORTED");
    let mut t2 = Tracker::new(IV);
    t2.set_rules(rules.clone());
    let mut ev = Vec::new();
    for i in 0..6 {
        ev.extend(step(&mut t2, i));
    }
    std::env::remove_var("FAKE_NVML_FAIL");
    let train: Vec<_> = ev.iter().filter(|e| e.2 == "train-a.service").collect();
    assert_eq!(train, vec![&(3, "unknown", "train-a.service".to_string())]);
    let h = t2
        .holders()
        .into_iter()
        .find(|h| h.unit == "train-a.service")
        .unwrap();
    assert!(h.activity_unknown);
    assert_eq!(h.idle_seconds, 0);
}
