//! The share, fence and environment of a placed job, on a hand-made host view: GPU 0 in MIG
//! mode with four 1g instances of team `interns`, GPUs 1 and 2 whole for team `train` (MPS).

use super::*;
use crate::observe::{GpuState, MpsSpec};
use crate::plan::desired::{MigDevice, TeamView};
use crate::policy::{MpsSettings, PlacementSettings};
use crate::profiles::Placement;

fn gpu(index: u32, minor: u32) -> GpuState {
    GpuState {
        index,
        uuid: format!("GPU-{index}"),
        name: "NVIDIA A100-SXM4-40GB".into(),
        model: None,
        minor,
        memory_mib: 40_960,
        mig: None,
        processes: vec![],
    }
}

fn tv(name: &str) -> TeamView {
    TeamView {
        name: name.parse().unwrap(),
        whole_gpus: vec![],
        mig_devices: vec![],
        visible: vec![],
        env: String::new(),
        cdi: String::new(),
        slice: Default::default(),
        cap_minors: Default::default(),
        mps: Default::default(),
        cdi_readers: vec![],
        provisional: false,
    }
}

fn view() -> HostView {
    let mut interns = tv("interns");
    for i in 0..4u32 {
        interns.mig_devices.push(MigDevice {
            gpu_index: 0,
            gi_profile: "1g.5gb".into(),
            gi_placement: Placement { start: i, size: 1 },
            ci_profile: "1c.1g.5gb".into(),
            ci_placement: Placement { start: 0, size: 1 },
            uuid: format!("MIG-{i}"),
            exists: true,
            cap_minors: vec![10 + 2 * i, 11 + 2 * i],
        });
    }
    // Still to be created: never placed on.
    interns.mig_devices.push(MigDevice {
        uuid: "<new MIG gpu0 gi@6+1 ci@0+1>".into(),
        exists: false,
        cap_minors: vec![],
        ..interns.mig_devices[0].clone()
    });
    let mut train = tv("train");
    train.whole_gpus = vec![1, 2];
    train.mps.insert("train-gpus".into(), MpsSpec::default());
    HostView {
        teams: [
            ("interns".parse().unwrap(), interns),
            ("train".parse().unwrap(), train),
        ]
        .into_iter()
        .collect(),
        gpus: vec![gpu(0, 0), gpu(1, 1), gpu(2, 2)],
    }
}

fn team(name: &str) -> Team {
    Team {
        name: name.parse().unwrap(),
        members: vec![],
        limits: Default::default(),
        mps: None,
        idle: None,
        placement: PlacementSettings::default(),
        lend: None,
        borrow: false,
        loc: None,
    }
}

fn lease(team: &str, user: &str, devices: &[&str]) -> Lease {
    Lease {
        unit: format!("gpuctl-run-{team}-{user}.scope"),
        team: team.into(),
        user: user.into(),
        uid: 1000,
        pid: 1,
        devices: devices.iter().map(|d| d.to_string()).collect(),
        since: 1_764_783_110,
        gpu_memory: None,
        borrowed_from: None,
    }
}

#[test]
fn a_mig_share_is_its_existing_instances_with_their_own_cap_nodes() {
    let s = share(&view(), "interns");
    assert_eq!(
        s.len(),
        4,
        "the instance still to be created is not placeable"
    );
    assert_eq!(s[2].id, "MIG-2");
    assert_eq!(
        s[2].nodes,
        vec![
            "/dev/nvidia0",
            "/dev/nvidia-caps/nvidia-cap14",
            "/dev/nvidia-caps/nvidia-cap15"
        ]
    );
    assert!(s.iter().all(|d| d.mig && d.mps.is_none()));
    assert!(share(&view(), "nobody").is_empty());
}

#[test]
fn four_jobs_get_four_instances_fenced_apart_and_the_fifth_names_the_holders() {
    let v = view();
    let s = share(&v, "interns");
    let t = team("interns");
    // Another team's lease on a device holds it all the same (a GPU the teams share, a loan).
    let mut held = vec![lease("train", "x", &["MIG-0"])];
    let mut got = Vec::new();
    for n in 1..4 {
        let p = place(&t, &s, &held, &HashMap::new(), &JoinOptions::default()).unwrap();
        assert_eq!(p.devices.len(), 1);
        let id = p.devices[0].id.clone();
        // Its own cap nodes and the control nodes, nobody else's caps.
        assert!(p.allow.contains(&"/dev/nvidiactl".to_string()));
        assert!(p.allow.contains(&"/dev/nvidia-uvm".to_string()));
        assert_eq!(
            p.allow
                .iter()
                .filter(|a| a.starts_with("/dev/nvidia-caps/"))
                .count(),
            2
        );
        held.push(lease("interns", &format!("u{n}"), &[&id]));
        got.push(id);
    }
    assert_eq!(got, vec!["MIG-1", "MIG-2", "MIG-3"]);
    let e = place(&t, &s, &held, &HashMap::new(), &JoinOptions::default()).unwrap_err();
    assert!(e.busy);
    assert!(
        e.message
            .contains("MIG-0: a job of team train since 2025-12-03T17:31:50Z"),
        "another team's holder is named by its team alone: {}",
        e.message
    );
    assert!(
        e.message
            .contains("MIG-1: u1 (gpuctl-run-interns-u1.scope) since 2025-12-03T17:31:50Z"),
        "{}",
        e.message
    );
    let two = JoinOptions {
        gpus: Some(Gpus::Count(2)),
        ..Default::default()
    };
    let e = place(&t, &s, &[], &HashMap::new(), &two).unwrap_err();
    assert!(!e.busy);
    assert!(e.message.contains("only one MIG device"), "{}", e.message);
}

#[test]
fn whole_gpus_with_mps_get_the_daemon_and_a_memory_cap_within_its_limit() {
    let v = view();
    let s = share(&v, "train");
    let mut t = team("train");
    t.mps = Some(MpsSettings {
        pinned_memory_limit: Some(8 << 30),
        ..Default::default()
    });
    let load: HashMap<String, Load> = [(
        "GPU-1".to_string(),
        Load {
            memory_used: Some(5 << 30),
            activity: Some(0.5),
            outside: None,
        },
    )]
    .into();
    let opts = JoinOptions {
        gpu_memory: Some(2 << 30),
        ..Default::default()
    };
    let p = place(&t, &s, &[], &load, &opts).unwrap();
    assert_eq!(p.devices[0].id, "GPU-2", "the less loaded one");
    assert_eq!(
        p.allow,
        vec![
            "/dev/nvidia2",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools"
        ]
    );
    let team_env: BTreeMap<String, String> = [
        ("CUDA_VISIBLE_DEVICES", "GPU-1,GPU-2"),
        ("NVIDIA_VISIBLE_DEVICES", "GPU-1,GPU-2"),
        ("GPUCTL_TEAM", "train"),
        ("CUDA_MPS_PIPE_DIRECTORY", "/old"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .into();
    let env = placed_env("train", &team_env, &p, opts.gpu_memory);
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-2");
    assert_eq!(env["GPUCTL_CDI_DEVICE"], "gpuctl.io/team=train.GPU-2");
    assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], "GPU-2");
    assert_eq!(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=2048M");
    assert_eq!(
        env["CUDA_MPS_PIPE_DIRECTORY"],
        crate::paths::mps_pipe_dir("train-gpus")
    );
    assert_eq!(env["GPUCTL_TEAM"], "train");
    // Above the daemon's own limit: refused, not trimmed.
    let big = JoinOptions {
        gpu_memory: Some(9 << 30),
        ..Default::default()
    };
    let e = place(&t, &s, &[], &load, &big).unwrap_err();
    assert!(
        e.message.contains("above the MPS daemon's own limit"),
        "{}",
        e.message
    );
    // Without MPS nothing can enforce it: said, not pretended.
    let interns = share(&v, "interns");
    let e = place(&team("interns"), &interns, &[], &load, &opts).unwrap_err();
    assert!(e.message.contains("nothing can enforce"), "{}", e.message);
    // Two devices: both CDI names, space-separated, in the order the job sees them.
    let two = JoinOptions {
        gpus: Some(Gpus::Count(2)),
        ..Default::default()
    };
    let p = place(&t, &s, &[], &load, &two).unwrap();
    let env = placed_env("train", &team_env, &p, None);
    assert_eq!(
        env["GPUCTL_CDI_DEVICE"],
        "gpuctl.io/team=train.GPU-1 gpuctl.io/team=train.GPU-2"
    );
}

#[test]
fn options_round_trip_and_unknown_ones_are_refused() {
    let o = JoinOptions {
        gpus: Some(Gpus::All),
        device: Some("MIG-1".into()),
        gpu_memory: Some(1 << 30),
        wait: Some(std::time::Duration::from_secs(5)),
        borrow: Some(true),
    };
    let m: HashMap<String, String> = o.to_map().into_iter().collect();
    assert_eq!(JoinOptions::parse(&m), Ok(o));
    let bad: HashMap<String, String> = [("gpus".to_string(), "0".to_string())].into();
    assert!(JoinOptions::parse(&bad).is_err());
    let bad: HashMap<String, String> = [("evil\n".to_string(), "x".to_string())].into();
    let e = JoinOptions::parse(&bad).unwrap_err();
    assert!(matches!(e, OptionError::Unknown(_)), "{e}");
    assert!(!e.to_string().contains('\n'), "{e}");
    assert!(JoinOptions::parse(&HashMap::new()).unwrap().is_empty());
    let forever: HashMap<String, String> = [("wait".to_string(), "forever".to_string())].into();
    assert_eq!(JoinOptions::parse(&forever).unwrap().wait, Some(MAX_WAIT));
    let no: HashMap<String, String> = [("borrow".to_string(), "false".to_string())].into();
    assert_eq!(JoinOptions::parse(&no).unwrap().borrow, Some(false));
    let bad: HashMap<String, String> = [("borrow".to_string(), "yes".to_string())].into();
    assert_eq!(
        JoinOptions::parse(&bad),
        Err(OptionError::Borrow("yes".into()))
    );
}

#[test]
fn an_emptied_scope_holds_nothing() {
    assert!(populated("populated 1\nfrozen 0\n"));
    assert!(!populated("populated 0\nfrozen 0\n"));
    assert!(populated(""), "unreadable or odd: the listing decides");
}

#[test]
fn a_non_member_status_keeps_only_the_leases_of_teams_it_may_join() {
    use crate::join::Viewer;
    let all: Vec<crate::dbus_api::reply::v1::LeaseStatus> = [
        lease("interns", "alice", &["MIG-a"]),
        lease("train", "carol", &["GPU-1"]),
    ]
    .iter()
    .map(Into::into)
    .collect();
    let mut bob = all.clone();
    crate::dbus_api::usage::redact_leases(&mut bob, &Viewer::Teams(Default::default()));
    assert!(bob.is_empty(), "bob is in no team: {bob:?}");
    let mut alice = all.clone();
    let interns = Viewer::Teams(["interns".to_string()].into());
    crate::dbus_api::usage::redact_leases(&mut alice, &interns);
    assert_eq!(alice, all[..1]);
    let mut root = all.clone();
    crate::dbus_api::usage::redact_leases(&mut root, &Viewer::All);
    assert_eq!(root, all);
}

fn out_of_service(ids: &[&str]) -> BTreeMap<String, crate::health::OutOfService> {
    ids.iter()
        .map(|id| {
            let o = crate::health::OutOfService {
                reason: "XID 79 (GPU has fallen off the bus)".into(),
                since: 1_764_783_000,
                by: "gpuctld".into(),
            };
            (id.to_string(), o)
        })
        .collect()
}

#[test]
fn an_out_of_service_device_is_never_placed_on_nor_made_visible() {
    let v = view();
    let s = share(&v, "train");
    let t = team("train");
    let all = JoinOptions {
        gpus: Some(Gpus::All),
        ..JoinOptions::default()
    };
    let none = HashMap::new();
    let out = out_of_service(&["GPU-1"]);
    let p = place_in_service(&t, &s, &[], &none, &all, &out).unwrap();
    let env = placed_env("train", &BTreeMap::new(), &p, None);
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-2");
    assert!(
        !p.allow.contains(&"/dev/nvidia1".to_string()),
        "{:?}",
        p.allow
    );
    // By position in the whole share (0 is GPU-1): refused with the reason, as "busy".
    let at0 = JoinOptions {
        device: Some("0".into()),
        ..JoinOptions::default()
    };
    let e = place_in_service(&t, &s, &[], &none, &at0, &out).unwrap_err();
    assert!(
        e.busy && e.message.contains("GPU-1 since 1764783000 (XID 79"),
        "{e:?}"
    );
    // Position 1 is still GPU-2, not shifted by the filter.
    let at1 = JoinOptions {
        device: Some("1".into()),
        ..JoinOptions::default()
    };
    let p = place_in_service(&t, &s, &[], &none, &at1, &out).unwrap();
    assert_eq!(p.devices[0].id, "GPU-2");
    // Nothing left: "busy", so a --wait keeps waiting for the device to come back.
    let e = place_in_service(
        &t,
        &s,
        &[],
        &none,
        &JoinOptions::default(),
        &out_of_service(&["GPU-1", "GPU-2"]),
    )
    .unwrap_err();
    assert!(
        e.busy && e.message.contains("no device in service"),
        "{e:?}"
    );
}

/// A usage collection of GPU 0's four MIG devices, each with the processes given as
/// (pid, unit).
fn mig_usage(procs: [&[(u32, &str)]; 4]) -> crate::usage::Usage {
    use crate::usage::{GpuUsage, MigUsage, ProcessUsage, Usage};
    let mig_devices = procs
        .iter()
        .enumerate()
        .map(|(i, ps)| MigUsage {
            uuid: format!("MIG-{i}"),
            processes: ps
                .iter()
                .map(|(pid, unit)| ProcessUsage {
                    pid: *pid,
                    kind: "compute".into(),
                    used_memory: Some(2 << 30),
                    command: Some("python".into()),
                    unit: Some(unit.to_string()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    Usage {
        gpus: vec![GpuUsage {
            uuid: "GPU-0".into(),
            mig: true,
            mig_devices,
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[test]
fn a_process_outside_every_gpuctl_job_makes_its_device_busy_and_the_refusal_names_it() {
    let s = share(&view(), "interns");
    let t = team("interns");
    let bob = lease("interns", "bob", &["MIG-1"]);
    // MIG-0: a service started in the slice by hand; MIG-1: bob's job; MIG-2: a job whose
    // scope has just ended (the collection still lists it); MIG-3: nothing.
    let u = mig_usage([
        &[(42, "train-server.service")],
        &[(43, &bob.unit)],
        &[(44, "gpuctl-run-0ended.scope")],
        &[],
    ]);
    let leases = [bob];
    let load = load_of(&u);
    assert_eq!(
        load["MIG-0"].outside.as_deref(),
        Some("pid 42 (python) holds 2048 MiB")
    );
    assert_eq!(load["MIG-1"].outside, None, "a lease's own process");
    assert_eq!(load["MIG-2"].outside, None, "an ending job's process");
    let opts = |device: &str| JoinOptions {
        device: Some(device.into()),
        ..Default::default()
    };
    let e = place(&t, &s, &leases, &load, &opts("MIG-0")).unwrap_err();
    assert!(e.busy);
    assert!(
        e.message
            .contains("MIG-0 is busy: pid 42 (python) holds 2048 MiB, outside every lease"),
        "{}",
        e.message
    );
    assert_eq!(
        place(&t, &s, &leases, &load, &opts("MIG-2"))
            .unwrap()
            .devices[0]
            .id,
        "MIG-2"
    );
    let p = place(&t, &s, &leases, &load, &JoinOptions::default()).unwrap();
    assert_eq!(p.devices[0].id, "MIG-2", "the first free one, never MIG-0");
    // Without NVML nothing is known to be outside: placed by the leases alone.
    let blind = crate::usage::Usage {
        nvml_unavailable: Some("no driver".into()),
        ..u
    };
    let load = load_of(&blind);
    assert!(load.values().all(|l| l.outside.is_none()));
    let p = place(&t, &s, &leases, &load, &JoinOptions::default()).unwrap();
    assert_eq!(p.devices[0].id, "MIG-0");
}
