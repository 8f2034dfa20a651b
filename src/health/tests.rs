use super::*;
use proptest::prelude::*;

fn topo() -> Topology {
    Topology {
        gpus: vec![
            GpuTopo {
                index: 0,
                uuid: "GPU-0".into(),
                mig: vec![],
            },
            GpuTopo {
                index: 1,
                uuid: "GPU-1".into(),
                mig: vec![
                    MigDevice {
                        gi: 7,
                        ci: 0,
                        uuid: "MIG-a".into(),
                    },
                    MigDevice {
                        gi: 8,
                        ci: 0,
                        uuid: "MIG-b".into(),
                    },
                ],
            },
        ],
    }
}

fn xid(gpu: &str, code: u32) -> Observation {
    Observation::Xid {
        gpu: gpu.into(),
        code,
        gi: None,
        ci: None,
    }
}

fn out(r: &Registry) -> Vec<String> {
    r.out_of_service(&topo()).into_keys().collect()
}

#[test]
fn application_xid_is_counted_and_reported_never_quarantines() {
    let s = HealthSettings::default();
    let mut r = Registry::default();
    let e = r.observe(&xid("GPU-0", 13), &topo(), &s, 10);
    assert_eq!(
        e,
        vec![Effect::ApplicationXid {
            device: "GPU-0".into(),
            code: 13
        }]
    );
    assert!(out(&r).is_empty());
    assert_eq!(r.get("GPU-0").unwrap().xids[&13], 1);
}

#[test]
fn fatal_xid_quarantines_the_gpu_and_its_mig_devices() {
    let s = HealthSettings::default();
    let mut r = Registry::default();
    let e = r.observe(&xid("GPU-1", 79), &topo(), &s, 10);
    assert_eq!(
        e,
        vec![Effect::Quarantined {
            device: "GPU-1".into(),
            reason: "XID 79 (GPU has fallen off the bus)".into(),
            reset_when_idle: false
        }]
    );
    assert_eq!(out(&r), ["GPU-1", "MIG-a", "MIG-b"]);
    // A second fault keeps the first time and reason and counts no new quarantine.
    let e = r.observe(&xid("GPU-1", 48), &topo(), &s, 20);
    assert!(matches!(e[..], [Effect::Warning { .. }]));
    let o = &r.out_of_service(&topo())["GPU-1"];
    assert_eq!(
        (o.since, o.reason.as_str()),
        (10, "XID 79 (GPU has fallen off the bus)")
    );
    assert_eq!(r.get("GPU-1").unwrap().quarantines, 1);
}

#[test]
fn an_xid_naming_an_instance_stays_with_its_mig_device_unless_board_wide() {
    let s = HealthSettings::default();
    let mut r = Registry::default();
    let named = |code| Observation::Xid {
        gpu: "GPU-1".into(),
        code,
        gi: Some(8),
        ci: Some(0),
    };
    r.observe(&named(94), &topo(), &s, 1);
    assert_eq!(out(&r), ["MIG-b"]);
    r.observe(&named(43), &topo(), &s, 2);
    assert_eq!(r.get("MIG-b").unwrap().xids[&43], 1);
    assert_eq!(out(&r), ["MIG-b"]);
    r.observe(&named(95), &topo(), &s, 3);
    assert_eq!(out(&r), ["GPU-1", "MIG-a", "MIG-b"]);
}

#[test]
fn policy_can_add_and_remove_application_xids_but_not_fatal_ones() {
    let mut s = HealthSettings::default();
    s.application_xids.remove(&13);
    s.application_xids.insert(999);
    s.application_xids.insert(79);
    assert_eq!(classify(13, &s), XidClass::Unlisted);
    assert_eq!(classify(999, &s), XidClass::Application);
    assert_eq!(
        classify(79, &s),
        XidClass::Fatal("GPU has fallen off the bus")
    );
}

#[test]
fn counters_quarantine_reset_when_idle_and_resume_waits_for_the_reset() {
    let s = HealthSettings {
        reset_when_idle: true,
        ..HealthSettings::default()
    };
    let mut r = Registry::default();
    let c = Counters {
        remap_pending: Some(true),
        ecc_uncorrected: Some(0),
        ..Counters::default()
    };
    let obs = Observation::Counters {
        gpu: "GPU-0".into(),
        counters: c,
    };
    let e = r.observe(&obs, &topo(), &s, 5);
    assert!(matches!(
        &e[..],
        [Effect::Quarantined {
            reset_when_idle: true,
            ..
        }]
    ));
    // Seen again: no second effect.
    assert!(r.observe(&obs, &topo(), &s, 6).is_empty());
    assert_eq!(
        r.resume(&topo(), "0", "fixed", "root"),
        Err(HealthError::StillFaulty {
            device: "GPU-0".into(),
            condition: Condition::RemapPending
        })
    );
    assert_eq!(r.reset_candidates(&topo(), &s), ["GPU-0"]);
    assert!(r
        .reset_candidates(&topo(), &HealthSettings::default())
        .is_empty());
    let e = r.reset_done(&topo(), "GPU-0");
    assert!(matches!(&e[..], [Effect::Resumed { .. }]));
    assert!(out(&r).is_empty());
    assert_eq!(r.get("GPU-0").unwrap().resets, 1);
}

#[test]
fn an_idle_reset_waits_for_every_holder_of_the_gpu_or_any_of_its_mig_devices() {
    let held = |pairs: &[(&str, &str)]| {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (d, h) in pairs {
            m.entry(d.to_string()).or_default().push(h.to_string());
        }
        m
    };
    let t = topo();
    assert!(Registry::reset_holders(&t, "GPU-1", &held(&[])).is_empty());
    // Another GPU's holders are not this one's.
    let other = held(&[("GPU-0", "pid 7"), ("MIG-x", "lease of bob")]);
    assert!(Registry::reset_holders(&t, "GPU-1", &other).is_empty());
    // The GPU's own, and each MIG device's: a reset destroys the instances in service too.
    let on = held(&[
        ("MIG-b", "lease of alice (gpuctl-run-1.scope)"),
        ("GPU-1", "pid 42"),
        ("MIG-b", "pid 43"),
        ("GPU-0", "pid 7"),
    ]);
    assert_eq!(
        Registry::reset_holders(&t, "GPU-1", &on),
        ["lease of alice (gpuctl-run-1.scope)", "pid 42", "pid 43"]
    );
    assert_eq!(Registry::reset_holders(&t, "GPU-0", &on), ["pid 7"]);
    // A GPU the topology no longer names is still its own holder's.
    assert_eq!(
        Registry::reset_holders(&t, "GPU-9", &held(&[("GPU-9", "pid 1")])),
        ["pid 1"]
    );
}

#[test]
fn new_uncorrectable_ecc_quarantines_slowdown_only_warns() {
    let s = HealthSettings::default();
    let mut r = Registry::default();
    let read = |ecc, clocks| Observation::Counters {
        gpu: "GPU-0".into(),
        counters: Counters {
            ecc_uncorrected: Some(ecc),
            clocks_event_reasons: Some(clocks),
            ..Counters::default()
        },
    };
    assert!(r.observe(&read(0, 0), &topo(), &s, 1).is_empty());
    let e = r.observe(&read(0, 0x40), &topo(), &s, 2);
    assert!(matches!(&e[..], [Effect::Warning { .. }]));
    assert!(out(&r).is_empty());
    let e = r.observe(&read(2, 0x40), &topo(), &s, 3);
    assert_eq!(
        e,
        vec![Effect::Quarantined {
            device: "GPU-0".into(),
            reason: "2 uncorrectable ECC error(s)".into(),
            reset_when_idle: false
        }]
    );
}

#[test]
fn drain_and_resume_by_hand() {
    let mut r = Registry::default();
    let t = topo();
    assert_eq!(
        r.drain(&t, "MIG-a", "", "root", 1),
        Err(HealthError::BadReason)
    );
    assert!(matches!(
        r.drain(&t, "nope", "x", "root", 1),
        Err(HealthError::UnknownDevice(_))
    ));
    r.drain(&t, "mig-A", "memory test", "alice", 1).unwrap();
    assert_eq!(out(&r), ["MIG-a"]);
    assert!(matches!(
        r.drain(&t, "MIG-a", "again", "alice", 2),
        Err(HealthError::AlreadyOut { since: 1, .. })
    ));
    // An admin's drain is never lifted by a reset.
    assert!(r.reset_done(&t, "GPU-1").is_empty());
    assert!(r.resume(&t, "MIG-a", "done", "alice").is_ok());
    assert_eq!(
        r.resume(&t, "MIG-a", "done", "alice"),
        Err(HealthError::InService("MIG-a".into()))
    );
}

#[test]
fn stop_after_grace_once() {
    let s = HealthSettings {
        on_fault: OnFault::Stop,
        grace: Duration::from_secs(60),
        ..HealthSettings::default()
    };
    let mut r = Registry::default();
    r.observe(&xid("GPU-0", 79), &topo(), &s, 100);
    // An admin's drain is planned maintenance: its holders are never stopped.
    r.drain(&topo(), "GPU-1", "maintenance", "root", 50)
        .unwrap();
    assert_eq!(r.next_stop(&s), Some(160));
    assert!(r.stops_due(&s, 159).is_empty());
    assert_eq!(r.stops_due(&s, 160), ["GPU-0"]);
    r.mark_stopped("GPU-0");
    assert!(r.stops_due(&s, 500).is_empty());
    assert_eq!(r.next_stop(&s), None);
    assert_eq!(r.next_stop(&HealthSettings::default()), None);
    assert!(r.stops_due(&HealthSettings::default(), 500).is_empty());
}

#[test]
fn registry_survives_a_round_trip() {
    let s = HealthSettings::default();
    let mut r = Registry::default();
    r.observe(&xid("GPU-1", 79), &topo(), &s, 10);
    r.drain(&topo(), "0", "maintenance", "root", 11).unwrap();
    let text = serde_json::to_string(&r).unwrap();
    assert_eq!(serde_json::from_str::<Registry>(&text).unwrap(), r);
}

fn any_obs() -> impl Strategy<Value = Observation> {
    let gpu = prop_oneof![Just("GPU-0".to_string()), Just("GPU-1".to_string())];
    prop_oneof![
        (
            gpu.clone(),
            prop_oneof![
                prop::sample::select(DEFAULT_APPLICATION_XIDS.to_vec()),
                prop::sample::select(FATAL_XIDS.iter().map(|x| x.0).collect::<Vec<_>>()),
                0u32..200
            ],
            prop::option::of(7u32..10),
            prop::option::of(0u32..2)
        )
            .prop_map(|(gpu, code, gi, ci)| Observation::Xid { gpu, code, gi, ci }),
        gpu.clone()
            .prop_map(|gpu| Observation::DoubleBitEcc { gpu }),
        gpu.clone().prop_map(|gpu| Observation::Lost { gpu }),
        (
            gpu,
            any::<Option<bool>>(),
            any::<Option<bool>>(),
            prop::option::of(0u64..3),
            prop::option::of(0u64..0x200)
        )
            .prop_map(|(gpu, p, f, ecc, clk)| Observation::Counters {
                gpu,
                counters: Counters {
                    remap_pending: p,
                    remap_failed: f,
                    ecc_uncorrected: ecc,
                    clocks_event_reasons: clk,
                    retired_pages_pending: None,
                },
            }),
    ]
}

proptest! {
    /// Whatever came before, an application XID changes no device's service, a listed fatal
    /// XID always leaves its device out of service, and a device is out exactly when the
    /// effects said so.
    #[test]
    fn xid_rules_hold_after_any_history(
        history in prop::collection::vec(any_obs(), 0..30),
        app in prop::sample::select(DEFAULT_APPLICATION_XIDS.to_vec()),
        fatal in prop::sample::select(FATAL_XIDS.iter().map(|x| x.0).collect::<Vec<_>>()),
        gpu in prop_oneof![Just("GPU-0"), Just("GPU-1")],
    ) {
        let s = HealthSettings::default();
        let t = topo();
        let mut r = Registry::default();
        let mut quarantined = BTreeSet::new();
        for (i, o) in history.iter().enumerate() {
            for e in r.observe(o, &t, &s, i as u64) {
                if let Effect::Quarantined { device, .. } = e {
                    quarantined.insert(device);
                }
            }
        }
        let direct: BTreeSet<String> = r
            .devices
            .iter()
            .filter(|(_, d)| d.service != Service::InService)
            .map(|(u, _)| u.clone())
            .collect();
        prop_assert_eq!(&direct, &quarantined);
        let before = r.out_of_service(&t);
        r.observe(&xid(gpu, app), &t, &s, 100);
        prop_assert_eq!(&r.out_of_service(&t), &before);
        r.observe(&xid(gpu, fatal), &t, &s, 101);
        let after = r.out_of_service(&t);
        prop_assert!(after.contains_key(gpu));
        // Every MIG device of a GPU that is out is out too.
        for g in &t.gpus {
            if after.contains_key(&g.uuid) {
                for m in &g.mig {
                    prop_assert!(after.contains_key(&m.uuid));
                }
            }
        }
    }
}
