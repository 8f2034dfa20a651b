use super::*;
use crate::observe::{ComputeInstance, GpuInstance, MigState};
use crate::policy::{GpuAssignment, MpsSettings, Selector, SlurmSettings, Team};
use crate::profiles::Placement;

fn whole(index: u32, minor: u32, model: &str) -> GpuState {
    GpuState {
        index,
        uuid: format!("GPU-{index:08}-0000-0000-0000-000000000000"),
        name: format!("NVIDIA {model}"),
        model: Some(model.into()),
        minor,
        memory_mib: 81920,
        mig: None,
        processes: vec![],
    }
}

/// A GI at `start` with one CI per `(ci_start, ci_size, profile)`.
fn gi(
    id: u32,
    profile: &str,
    start: u32,
    size: u32,
    owner: &str,
    cis: &[(u32, u32, &str)],
) -> GpuInstance {
    GpuInstance {
        id,
        profile_id: 0,
        profile: profile.into(),
        placement: Placement { start, size },
        owner: Some(owner.into()),
        compute: cis
            .iter()
            .enumerate()
            .map(|(n, (s, z, p))| ComputeInstance {
                id: n as u32,
                profile_id: 0,
                profile: (*p).into(),
                placement: Placement {
                    start: *s,
                    size: *z,
                },
                uuid: format!("MIG-{id}-{n}"),
                processes: vec![],
            })
            .collect(),
    }
}

fn mig(mut g: GpuState, instances: Vec<GpuInstance>) -> GpuState {
    g.mig = Some(MigState {
        current: true,
        pending: true,
        instances,
    });
    g
}

/// mig-minors as the driver numbers them: GPU `m`'s GI `g` access is `3 + m*135 + g*9`, its
/// CI `c` the next ones (the layout `sim::mig_minors` models).
fn minors(gpus: &[&GpuState]) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for g in gpus {
        for gi in g.mig.iter().flat_map(|m| &m.instances) {
            let base = 3 + g.minor * 135 + gi.id * 9;
            out.insert(format!("gpu{}/gi{}/access", g.minor, gi.id), base);
            for ci in &gi.compute {
                out.insert(
                    format!("gpu{}/gi{}/ci{}/access", g.minor, gi.id, ci.id),
                    base + 1 + ci.id,
                );
            }
        }
    }
    out
}

fn host(gpus: Vec<GpuState>) -> Observed {
    let refs: Vec<&GpuState> = gpus.iter().collect();
    let mig_minors = minors(&refs);
    Observed {
        gpus,
        mig_minors,
        ..Default::default()
    }
}

fn team(name: &str, mps: bool) -> Team {
    Team {
        name: name.parse().unwrap(),
        members: vec![],
        limits: Default::default(),
        mps: mps.then(MpsSettings::default),
        idle: None,
        placement: Default::default(),
        lend: None,
        borrow: false,
        loc: None,
    }
}

fn policy(team_types: bool, gpus: Vec<GpuAssignment>, teams: Vec<Team>) -> Policy {
    Policy {
        host: Default::default(),
        teams: teams.into_iter().map(|t| (t.name.clone(), t)).collect(),
        gpus,
        sources: vec![],
        slurm: SlurmSettings {
            enabled: true,
            team_types,
            ..Default::default()
        },
        layouts_in_force: Default::default(),
    }
}

fn owned(index: u32, team: &str) -> GpuAssignment {
    GpuAssignment {
        selector: Selector::Index(vec![index]),
        usage: GpuUse::Owned(team.parse().unwrap()),
        loc: None,
        key: format!("gpu[{index}]"),
        layouts: None,
    }
}

fn lines(g: &Gres) -> Vec<String> {
    g.render("n1").lines().skip(2).map(str::to_string).collect()
}

#[test]
fn whole_gpus_are_one_file_each_typed_by_model() {
    let obs = host(vec![
        whole(0, 0, "H100-SXM5-80GB"),
        whole(1, 3, "H100-SXM5-80GB"),
    ]);
    let g = gres(&policy(false, vec![], vec![]), &obs);
    assert_eq!(
        lines(&g),
        [
            "NodeName=n1 Name=gpu Type=h100-sxm5-80gb File=/dev/nvidia0",
            "NodeName=n1 Name=gpu Type=h100-sxm5-80gb File=/dev/nvidia3",
        ]
    );
    assert_eq!(g.node_gres(), "gpu:h100-sxm5-80gb:2");
    assert!(g
        .render("n1")
        .contains("# slurm.conf: NodeName=n1 Gres=gpu:h100-sxm5-80gb:2\n"));
}

#[test]
fn h100_mig_devices_name_their_gpu_and_both_cap_nodes() {
    // Minor 2: the GPU node is /dev/nvidia2 whatever its index; caps come from mig-minors.
    let g1 = mig(
        whole(1, 2, "H100-SXM5-80GB"),
        vec![
            gi(5, "3g.40gb", 4, 4, "infer", &[(0, 3, "3g.40gb")]),
            gi(9, "1g.10gb", 0, 1, "interns", &[(0, 1, "1g.10gb")]),
            gi(10, "1g.10gb", 1, 1, "interns", &[(0, 1, "1g.10gb")]),
        ],
    );
    let obs = host(vec![g1]);
    let g = gres(&policy(false, vec![], vec![]), &obs);
    let (c9, c10, c5) = (
        3 + 2 * 135 + 9 * 9,
        3 + 2 * 135 + 10 * 9,
        3 + 2 * 135 + 5 * 9,
    );
    assert_eq!(
        lines(&g),
        [
            // By placement: slices 0, 1, then 4.
            format!("NodeName=n1 Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia2,/dev/nvidia-caps/nvidia-cap{c9},/dev/nvidia-caps/nvidia-cap{}", c9 + 1),
            format!("NodeName=n1 Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia2,/dev/nvidia-caps/nvidia-cap{c10},/dev/nvidia-caps/nvidia-cap{}", c10 + 1),
            format!("NodeName=n1 Name=gpu Type=3g.40gb MultipleFiles=/dev/nvidia2,/dev/nvidia-caps/nvidia-cap{c5},/dev/nvidia-caps/nvidia-cap{}", c5 + 1),
        ]
    );
    assert_eq!(g.node_gres(), "gpu:1g.10gb:2,gpu:3g.40gb:1");
    assert!(g.skipped.is_empty());
}

#[test]
fn a100_compute_split_gives_one_device_per_ci_and_team_types_prefix_the_owner() {
    // A100-40GB: a 3g.20gb GI split into three 1c CIs, and a 4g.20gb GI whole.
    let g0 = mig(
        whole(0, 0, "A100-SXM4-40GB"),
        vec![
            gi(
                1,
                "3g.20gb",
                4,
                4,
                "train",
                &[
                    (0, 1, "1c.3g.20gb"),
                    (1, 1, "1c.3g.20gb"),
                    (2, 1, "1c.3g.20gb"),
                ],
            ),
            gi(2, "4g.20gb", 0, 4, "interns", &[(0, 4, "4g.20gb")]),
        ],
    );
    let obs = host(vec![g0]);
    let g = gres(&policy(true, vec![], vec![]), &obs);
    let kinds: Vec<&str> = g.devices.iter().map(|d| d.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "interns_4g.20gb",
            "train_1c.3g.20gb",
            "train_1c.3g.20gb",
            "train_1c.3g.20gb"
        ]
    );
    // Each CI has its own compute cap; all three share the GI's.
    let gi1 = 3 + 9;
    for (n, d) in g.devices[1..].iter().enumerate() {
        assert_eq!(
            d.files,
            [
                "/dev/nvidia0".to_string(),
                format!("/dev/nvidia-caps/nvidia-cap{gi1}"),
                format!("/dev/nvidia-caps/nvidia-cap{}", gi1 + 1 + n as u32),
            ]
        );
    }
    assert_eq!(
        g.node_gres(),
        "gpu:interns_4g.20gb:1,gpu:train_1c.3g.20gb:3"
    );
}

#[test]
fn a_mig_device_without_its_cap_minors_is_left_out_and_said() {
    let g0 = mig(
        whole(0, 0, "H100-SXM5-80GB"),
        vec![gi(1, "7g.80gb", 0, 8, "infer", &[(0, 7, "7g.80gb")])],
    );
    let mut obs = host(vec![g0]);
    obs.mig_minors.remove("gpu0/gi1/ci0/access");
    let g = gres(&policy(false, vec![], vec![]), &obs);
    assert!(g.devices.is_empty());
    assert_eq!(g.skipped.len(), 1);
    assert!(
        g.skipped[0].contains("gpu0/gi1/ci0/access"),
        "{:?}",
        g.skipped
    );
    assert_eq!(g.node_gres(), "");
}

#[test]
fn mps_teams_get_plain_gpu_lines_and_owned_whole_gpus_carry_the_team() {
    let obs = host(vec![
        whole(0, 0, "H100-SXM5-80GB"),
        whole(1, 1, "H100-SXM5-80GB"),
    ]);
    let p = policy(true, vec![owned(0, "infer")], vec![team("infer", true)]);
    let g = gres(&p, &obs);
    let text = g.render("n1");
    assert!(!text.contains("Name=mps"), "{text}");
    assert_eq!(
        lines(&g),
        [
            "NodeName=n1 Name=gpu Type=infer_h100-sxm5-80gb File=/dev/nvidia0",
            // GPU 1 is no team's: untyped by team.
            "NodeName=n1 Name=gpu Type=h100-sxm5-80gb File=/dev/nvidia1",
        ]
    );
}

#[test]
fn types_are_single_gres_tokens() {
    assert_eq!(slurm_token("1g.10gb+me"), "1g.10gb_me");
    assert_eq!(slurm_token("a:b,c d"), "a_b_c_d");
}

#[test]
fn scontrol_node_lines_parse() {
    let n = parse_node(
        "NodeName=n1 Arch=x86_64 CoresPerSocket=1 State=MIXED+DRAIN ThreadsPerCore=1 \
         Reason=gpuctl: MIG change on GPU 0 [root@2026-12-03T17:00:00]",
    )
    .unwrap();
    assert_eq!(n.name, "n1");
    assert!(n.drain && n.busy);
    assert_eq!(n.reason.as_deref(), Some("gpuctl: MIG change on GPU 0"));
    assert!(n.drained_by_gpuctl());

    let n = parse_node("NodeName=n1 State=IDLE+DRAIN Reason=disk swap [admin@2026-12-03T17:00:00]")
        .unwrap();
    assert!(n.drain && !n.busy && !n.drained_by_gpuctl());

    let n = parse_node("NodeName=n1 State=IDLE ThreadsPerCore=1").unwrap();
    assert!(!n.drain && !n.busy && n.reason.is_none());
    let n = parse_node("NodeName=n1 State=ALLOCATED").unwrap();
    assert!(n.busy);
    assert!(parse_node("garbage").is_none());
}

#[test]
fn slurm_job_cgroups_are_recognised() {
    assert_eq!(
        job_of_cgroup("/system.slice/slurmstepd.scope/job_42/step_0/user/task_0"),
        Some(42)
    );
    assert_eq!(
        job_of_cgroup("/system.slice/slurmstepd.scope/job_7"),
        Some(7)
    );
    // Slurm 22.05 (Debian 12) prefixes the node name.
    assert_eq!(
        job_of_cgroup("/system.slice/vmtest_slurmstepd.scope/job_5/step_batch/user/task_0"),
        Some(5)
    );
    assert_eq!(
        job_of_cgroup("/system.slice/notslurmstepd.scope/job_5"),
        None
    );
    assert_eq!(job_of_cgroup("/system.slice/slurmstepd.scope/system"), None);
    assert_eq!(job_of_cgroup("/gpu.slice/gpu-infer.slice/job_3"), None);
}

#[test]
fn the_job_submit_script_lists_the_teams_and_exempts_root() {
    let lua = job_submit_lua(["infer", "train_big"]);
    assert!(lua.starts_with("-- Written by `gpuctl export slurm --job-submit`"));
    let table: Vec<&str> = lua
        .lines()
        .skip_while(|l| *l != "local teams = {")
        .skip(1)
        .take_while(|l| *l != "}")
        .collect();
    assert_eq!(
        table,
        ["  [\"infer\"] = true,", "  [\"train_big\"] = true,"]
    );
    // Both entry points slurmctld calls, each letting root through first.
    for f in ["slurm_job_submit(", "slurm_job_modify("] {
        let body = &lua[lua.find(&format!("function {f}")).unwrap()..];
        let first = body.lines().nth(1).unwrap().trim();
        assert!(first.contains("_uid == 0"), "{f}: {first}");
    }
    assert!(lua.trim_end().ends_with("return slurm.SUCCESS"));
}
