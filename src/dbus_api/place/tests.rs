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
fn an_unknown_profile_name_is_refused_with_the_closest_known_one() {
    assert_eq!(check_gi_profile_name("3g.40gb"), Ok(()));
    assert_eq!(check_gi_profile_name("1g.10gb+me"), Ok(()));
    let e = check_gi_profile_name("3g.40g").unwrap_err();
    assert!(e.to_string().contains("did you mean '3g.40gb'?"), "{e}");
    let e = check_gi_profile_name("nonsense-profile").unwrap_err();
    assert!(!e.to_string().contains("did you mean"), "{e}");
    assert!(e.to_string().contains("gpuctl teams"), "{e}");
    // A name the driver used before: the one it has now.
    let e = check_gi_profile_name("3g.95gb").unwrap_err();
    assert!(e.to_string().contains("did you mean '3g.93gb'"), "{e}");
}

#[test]
fn options_round_trip_and_unknown_ones_are_refused() {
    let o = JoinOptions {
        gpus: Some(Gpus::All),
        device: Some("MIG-1".into()),
        gpu_memory: Some(1 << 30),
        wait: Some(std::time::Duration::from_secs(5)),
        borrow: Some(true),
        profile: Some("3g.40gb".into()),
    };
    let m: HashMap<String, String> = o.to_map().into_iter().collect();
    assert_eq!(m["profile"], "3g.40gb");
    assert_eq!(JoinOptions::parse(&m), Ok(o.clone()));
    assert_eq!(o.request().profile.as_deref(), Some("3g.40gb"));
    // A profile no GPU model has is refused with the closest known one.
    let bad: HashMap<String, String> = [("profile".to_string(), "3g.40g".to_string())].into();
    let e = JoinOptions::parse(&bad).unwrap_err();
    assert!(matches!(e, OptionError::Profile(_)), "{e}");
    assert!(e.to_string().contains("did you mean '3g.40gb'?"), "{e}");
    let empty: HashMap<String, String> = [("profile".to_string(), String::new())].into();
    assert!(matches!(
        JoinOptions::parse(&empty),
        Err(OptionError::Unknown(_))
    ));
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

fn policy(text: &str) -> crate::policy::Policy {
    let mut d = Vec::new();
    let f = crate::policy::parse::parse_fragment(std::path::Path::new("p.toml"), text, &mut d);
    crate::policy::validate::build(&[f.unwrap()], &mut d)
}

/// GPU 0 gives interns seven 1g.10gb instances by default and train two 3g.40gb at night;
/// GPU 1 is train's whole.
const LAYOUTS: &str = "version = 1\n[teams.interns]\n[teams.train]\n\
[[gpu]]\nindex = [0]\nmig = [{ profile = \"1g.10gb\", owner = \"interns\", count = 7 }]\n\
[[gpu.layout]]\nname = \"night\"\nmig = [{ profile = \"3g.40gb\", owner = \"train\", count = 2 }]\n\
[[gpu]]\nindex = [1]\nowner = \"train\"\n";

fn profile(p: &str) -> JoinOptions {
    JoinOptions {
        profile: Some(p.into()),
        ..Default::default()
    }
}

#[test]
fn a_share_knows_its_profiles_and_a_profile_is_placed_on_one_of_them() {
    let v = view();
    let s = share(&v, "interns");
    assert!(s.iter().all(|d| d.profile.as_deref() == Some("1g.5gb")));
    assert!(share(&v, "train").iter().all(|d| d.profile.is_none()));
    let t = team("interns");
    let held = vec![lease("interns", "a", &["MIG-0"])];
    let p = place(&t, &s, &held, &HashMap::new(), &profile("1g.5gb")).unwrap();
    assert_eq!(p.devices[0].id, "MIG-1");
    // Every one of the profile held: busy, so a --wait queues as for any request.
    let all: Vec<Lease> = (0..4)
        .map(|i| lease("interns", &format!("u{i}"), &[&format!("MIG-{i}")]))
        .collect();
    let e = place(&t, &s, &all, &HashMap::new(), &profile("1g.5gb")).unwrap_err();
    assert!(e.busy && e.no_profile.is_none(), "{e:?}");
    // A profile the share has no device of: refused, with what it has, for the join layer.
    let e = place(&t, &s, &[], &HashMap::new(), &profile("3g.40gb")).unwrap_err();
    assert!(!e.busy);
    assert_eq!(e.no_profile, Some(vec!["1g.5gb".to_string()]));
    assert!(e.message.contains("no 3g.40gb device"), "{}", e.message);
    // Whole GPUs never serve a profile.
    let e = place(
        &team("train"),
        &share(&v, "train"),
        &[],
        &HashMap::new(),
        &profile("1g.5gb"),
    )
    .unwrap_err();
    assert_eq!(e.no_profile, Some(vec![]));
}

#[test]
fn a_profile_whose_only_devices_are_out_of_service_waits_as_busy() {
    use crate::health::OutOfService;
    let v = view();
    let s = share(&v, "interns");
    let t = team("interns");
    let out_one = |id: &str| -> BTreeMap<String, OutOfService> {
        [(
            id.to_string(),
            OutOfService {
                reason: "XID 79".into(),
                since: 60,
                by: "gpuctld".into(),
            },
        )]
        .into()
    };
    // One of four out: the others serve it.
    let r = place_in_service(
        &t,
        &s,
        &[],
        &HashMap::new(),
        &profile("1g.5gb"),
        &out_one("MIG-0"),
    );
    assert_eq!(r.unwrap().devices[0].id, "MIG-1");
    // A profile no device has, in service or out, stays a missing profile.
    let e = place_in_service(
        &t,
        &s,
        &[],
        &HashMap::new(),
        &profile("3g.40gb"),
        &out_one("MIG-0"),
    )
    .unwrap_err();
    assert!(e.no_profile.is_some() && !e.busy, "{e:?}");
    // The only device of a profile out of service: it may come back, so it is busy.
    let mut one = s[..1].to_vec();
    one[0].profile = Some("2g.10gb".into());
    one.extend(s[1..].iter().cloned());
    let e = place_in_service(
        &t,
        &one,
        &[],
        &HashMap::new(),
        &profile("2g.10gb"),
        &out_one("MIG-0"),
    )
    .unwrap_err();
    assert!(e.busy && e.no_profile.is_none(), "{e:?}");
    assert!(e.message.contains("out of service: MIG-0"), "{}", e.message);
}

#[test]
fn a_missing_profile_waits_only_where_a_layout_gives_the_team_one() {
    let p = policy(LAYOUTS);
    let train = layout_profiles(&p, None, "train");
    assert_eq!(
        train,
        vec![
            ("3g.40gb".to_string(), "gpu[0] layout \"night\"".to_string()),
            (
                WHOLE_GPU.to_string(),
                "gpu[1] layout \"default\"".to_string()
            )
        ]
    );
    assert_eq!(
        layout_profiles(&p, None, "interns"),
        vec![(
            "1g.10gb".to_string(),
            "gpu[0] layout \"default\"".to_string()
        )]
    );
    // Only entries that claim a GPU of this host count.
    let host = [gpu(1, 1)];
    assert_eq!(layout_profiles(&p, Some(&host), "train"), train[1..]);
    let host = [gpu(0, 0)];
    assert_eq!(layout_profiles(&p, Some(&host), "train"), train[..1]);
    let host = [gpu(0, 0), gpu(1, 1)];
    assert_eq!(layout_profiles(&p, Some(&host), "train"), train);

    // With --wait: queued, saying for what.
    let why = without_profile("train", Some("3g.40gb"), &[], &train, true).unwrap();
    assert_eq!(
        why,
        "no 3g.40gb device in team train's share now; waiting for a GPU to take a layout that \
         has one (gpu[0] layout \"night\")"
    );
    // Without: refused, pointing at --wait.
    let e = without_profile("train", Some("3g.40gb"), &[], &train, false).unwrap_err();
    assert!(
        e.contains("gpu[0] layout \"night\" has one") && e.contains("--wait"),
        "{e}"
    );
    // No layout has it: refused even with --wait, naming what the team has and may get.
    let e =
        without_profile("train", Some("7g.80gb"), &["1g.10gb".into()], &train, true).unwrap_err();
    assert!(e.contains("its MIG profiles now: 1g.10gb"), "{e}");
    assert!(e.contains("its layouts give it: 3g.40gb"), "{e}");
    let e = without_profile("interns", Some("3g.40gb"), &[], &[], true).unwrap_err();
    assert!(e.contains("no layout gives it a MIG device"), "{e}");
}

#[test]
fn a_team_with_no_device_waits_only_where_a_layout_gives_it_one() {
    let p = policy(LAYOUTS);
    // Train's share is empty on a host with GPU 0 only, in its default layout.
    let empty: Vec<ShareDevice> = Vec::new();
    let e = place(
        &team("train"),
        &empty,
        &[],
        &HashMap::new(),
        &JoinOptions::default(),
    )
    .unwrap_err();
    assert!(!e.busy && e.no_profile == Some(vec![]), "{e:?}");
    let host = [gpu(0, 0)];
    let layouts = layout_profiles(&p, Some(&host), "train");
    let why = without_profile("train", None, &[], &layouts, true).unwrap();
    assert_eq!(
        why,
        "team train has no device now; waiting for a GPU to take a layout that gives it one \
         (gpu[0] layout \"night\")"
    );
    let e = without_profile("train", None, &[], &layouts, false).unwrap_err();
    assert!(
        e.contains("gpu[0] layout \"night\" gives it one") && e.contains("--wait"),
        "{e}"
    );
    // A layout with a whole GPU of the team counts, one that gives it nothing does not.
    let whole = [(WHOLE_GPU.to_string(), "gpu[2] layout \"day\"".to_string())];
    assert!(without_profile("train", None, &[], &whole, true).is_ok());
    assert!(without_profile("train", Some("3g.40gb"), &[], &whole, true).is_err());
    let e = without_profile("research", None, &[], &[], true).unwrap_err();
    assert!(e.contains("no layout of the policy gives it one"), "{e}");
}
