//! Planner behaviour on simulated hosts: minimal MIG changes, busy instances, owner relabels,
//! pending modes, drains, and convergence.

mod common;
#[path = "common/golden.rs"]
mod golden;
use common::*;
use gpuctl::plan::{plan, ActionKind, Phase};
use gpuctl::policy::{GpuUse, Reconfigure, Selector};
use gpuctl::sim::SimHost;

fn is_destroy_gi(k: &ActionKind) -> bool {
    matches!(k, ActionKind::DestroyGi { .. })
}
fn is_create_gi(k: &ActionKind) -> bool {
    matches!(k, ActionKind::CreateGi { .. })
}

#[test]
fn fresh_host_converges_and_replans_empty() {
    let p = policy(
        vec![team("a"), mps_team("b"), team("c")],
        vec![
            mig(0, &[("1g.10gb", "a", 4, &[]), ("1g.10gb", "b", 3, &[])]),
            mig(
                1,
                &[("3g.40gb", "b", 1, &["1c", "2c"]), ("4g.40gb", "a", 1, &[])],
            ),
            assign(
                Selector::Index(vec![2, 3]),
                GpuUse::Shared(vec!["b".parse().unwrap(), "c".parse().unwrap()]),
            ),
            assign(
                Selector::Model("l40s".into()),
                GpuUse::Owned("c".parse().unwrap()),
            ),
        ],
        Reconfigure::WhenIdle,
    );
    let mut h = SimHost::from_spec("h100-80gb*4,l40s").unwrap();
    let (first, remaining) = apply(&p, &mut h);
    assert!(first.replan_after_mig);
    assert_eq!(count(&first, is_create_gi), 9);
    assert!(remaining.is_converged(), "{remaining:#?}");
    assert!(plan(&p, &h.state).is_converged());
    // b: 3 MIG 1g devices, 2 CIs of a 3g split, 2 shared GPUs; MPS: one whole-GPU daemon + 5.
    let env = &h.state.env_files["b"];
    let cvd = env
        .lines()
        .find(|l| l.starts_with("CUDA_VISIBLE_DEVICES="))
        .unwrap();
    assert_eq!(cvd.matches("MIG-").count(), 5, "{env}");
    assert_eq!(cvd.matches("GPU-").count(), 2, "{env}");
    assert_eq!(
        h.state.mps.keys().filter(|k| k.starts_with("b-")).count(),
        6
    );
    assert!(env.contains("CUDA_MPS_PIPE_DIRECTORY=/run/gpuctl/mps/b-gpus"));
    // The slice allows exactly the caps of b's instances: 5 CIs + 4 GIs, plus parent nodes.
    let caps = h.state.slices["b"]
        .device_allow
        .iter()
        .filter(|d| d.starts_with("/dev/nvidia-caps/"))
        .count();
    assert_eq!(caps, 5 + 4);
    assert!(h.state.slices["c"].device_allow.contains("/dev/nvidia4"));
    assert!(!h.state.slices["c"].device_allow.contains("/dev/nvidia0"));
}

#[test]
fn changing_one_instance_of_seven_is_one_destroy_and_one_create() {
    let seven = policy(
        vec![team("a"), team("b")],
        vec![mig(0, &[("1g.10gb", "a", 7, &[])])],
        Reconfigure::WhenIdle,
    );
    let mut h = SimHost::from_spec("h100-80gb").unwrap();
    apply(&seven, &mut h);
    let changed = policy(
        vec![team("a"), team("b")],
        vec![mig(
            0,
            &[("1g.10gb", "a", 6, &[]), ("1g.10gb+me", "b", 1, &[])],
        )],
        Reconfigure::WhenIdle,
    );
    let p = plan(&changed, &h.state);
    assert_eq!(count(&p, is_destroy_gi), 1, "{p:#?}");
    assert_eq!(count(&p, is_create_gi), 1, "{p:#?}");
    // tests/cli_sim.rs checks the same count through a policy file; here, what it means for the
    // users: the six kept MIG devices keep their UUIDs, so team a's running jobs and its
    // CUDA_VISIBLE_DEVICES are undisturbed apart from the one device that goes.
    let gone = p
        .actions
        .iter()
        .find_map(|a| match &a.kind {
            ActionKind::DestroyGi { gi, .. } => Some(gi.placement),
            _ => None,
        })
        .unwrap();
    let uuids = |h: &SimHost| -> std::collections::BTreeMap<u32, String> {
        h.state.gpus[0]
            .mig
            .as_ref()
            .unwrap()
            .instances
            .iter()
            .map(|i| (i.placement.start, i.compute[0].uuid.clone()))
            .collect()
    };
    let mut kept = uuids(&h);
    kept.remove(&gone.start);
    let (_, remaining) = apply(&changed, &mut h);
    assert!(remaining.is_converged());
    let after = uuids(&h);
    assert_eq!(kept.len(), 6);
    for (start, uuid) in &kept {
        assert_eq!(
            after.get(start),
            Some(uuid),
            "instance at {start} was replaced"
        );
        assert!(h.state.env_files["a"].contains(uuid.as_str()));
    }
}

#[test]
fn owner_change_is_a_relabel_without_hardware_change() {
    let mut h = SimHost::from_spec("h100-80gb").unwrap();
    let before = policy(
        vec![team("a"), team("b")],
        vec![mig(0, &[("3g.40gb", "a", 2, &[])])],
        Reconfigure::WhenIdle,
    );
    apply(&before, &mut h);
    let after = policy(
        vec![team("a"), team("b")],
        vec![mig(
            0,
            &[("3g.40gb", "a", 1, &[]), ("3g.40gb", "b", 1, &[])],
        )],
        Reconfigure::WhenIdle,
    );
    let p = plan(&after, &h.state);
    let mig_actions: Vec<_> = p
        .actions
        .iter()
        .filter(|a| a.phase == Phase::MigInstances)
        .collect();
    assert_eq!(mig_actions.len(), 1, "{p:#?}");
    assert!(matches!(&mig_actions[0].kind, ActionKind::SetOwner { to, .. } if to == "b"));
    apply(&after, &mut h);
    let owners: Vec<_> = h.state.gpus[0]
        .mig
        .as_ref()
        .unwrap()
        .instances
        .iter()
        .map(|i| i.owner.clone().unwrap())
        .collect();
    assert_eq!(owners.iter().filter(|o| *o == "a").count(), 1);
    assert_eq!(owners.iter().filter(|o| *o == "b").count(), 1);
}

fn busy_host(at: u32, unit: Option<&str>) -> (SimHost, u32) {
    let mut h = SimHost::from_spec("h100-80gb").unwrap();
    let before = policy(
        vec![team("a")],
        vec![mig(0, &[("3g.40gb", "a", 2, &[])])],
        Reconfigure::WhenIdle,
    );
    apply(&before, &mut h);
    let gi = h.state.gpus[0]
        .mig
        .as_mut()
        .unwrap()
        .instances
        .iter_mut()
        .find(|i| i.placement.start == at)
        .unwrap();
    gi.compute[0].processes.push(proc(4242, unit));
    let id = gi.id;
    (h, id)
}

#[test]
fn busy_instance_is_untouched_and_named() {
    // The 4g can only go at 0, where the busy 3g sits: nothing may change.
    let (mut h, _) = busy_host(0, Some("train.service"));
    let want = policy(
        vec![team("a")],
        vec![mig(
            0,
            &[("4g.40gb", "a", 1, &[]), ("3g.40gb", "a", 1, &[])],
        )],
        Reconfigure::WhenIdle,
    );
    let p = plan(&want, &h.state);
    assert_eq!(count(&p, is_destroy_gi), 0, "{p:#?}");
    assert_eq!(count(&p, is_create_gi), 0);
    assert!(
        p.blocked
            .iter()
            .any(|b| b.holders.iter().any(|x| x == "pid 4242 (train.service)")),
        "{p:#?}"
    );
    let (_, remaining) = apply(&want, &mut h);
    assert!(remaining.actions.is_empty(), "{remaining:#?}");
    assert!(!remaining.blocked.is_empty());

    // With the busy one at 4, the idle one at 0 makes room for the 4g.
    let (h, busy_id) = busy_host(4, None);
    let p = plan(&want, &h.state);
    assert_eq!(count(&p, is_destroy_gi), 1);
    assert!(p
        .actions
        .iter()
        .all(|a| !matches!(&a.kind, ActionKind::DestroyGi { gi, .. } if gi.placement.start == 4)));
    assert!(p.blocked.is_empty(), "the busy 3g matches a slot: {p:#?}");
    let _ = busy_id;
}

#[test]
fn never_mode_leaves_busy_instances_and_drain_mode_stops_units() {
    let want = policy(
        vec![team("a")],
        vec![mig(0, &[("7g.80gb", "a", 1, &[])])],
        Reconfigure::Never,
    );
    let (h, _) = busy_host(0, Some("train.service"));
    let p = plan(&want, &h.state);
    assert_eq!(count(&p, is_destroy_gi), 0);
    assert!(!p.blocked.is_empty());

    let drain = policy(
        vec![team("a")],
        vec![mig(0, &[("7g.80gb", "a", 1, &[])])],
        Reconfigure::Drain,
    );
    let (mut h, _) = busy_host(0, Some("train.service"));
    let p = plan(&drain, &h.state);
    let phases: Vec<_> = p
        .actions
        .iter()
        .map(|a| (a.phase, a.kind.clone()))
        .collect();
    assert!(
        matches!(&phases[0], (Phase::Drain, ActionKind::StopUnits { team, units }) if team == "a" && units == &["train.service".to_string()]),
        "{phases:#?}"
    );
    assert!(matches!(
        &phases.last().unwrap(),
        (Phase::Resume, ActionKind::StartUnits { .. })
    ));
    assert_eq!(count(&p, is_destroy_gi), 2);
    let (_, remaining) = apply(&drain, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");

    // A process without a unit cannot be drained. The 7g cannot be made around it, so the idle
    // 3g stays too rather than leaving the GPU emptier for nothing.
    let (h, _) = busy_host(0, None);
    let p = plan(&drain, &h.state);
    assert!(p.actions.is_empty(), "{p:#?}");
    assert_eq!(p.blocked[0].holders, vec!["pid 4242".to_string()]);
}

#[test]
fn a100_enable_resets_only_that_gpu_and_waits_for_processes() {
    let want = policy(
        vec![team("a")],
        vec![
            mig(0, &[("3g.20gb", "a", 2, &[])]),
            assign(
                Selector::Index(vec![1]),
                GpuUse::Owned("a".parse().unwrap()),
            ),
        ],
        Reconfigure::WhenIdle,
    );
    let mut h = SimHost::from_spec("a100-40gb*2").unwrap();
    let p = plan(&want, &h.state);
    let resets: Vec<u32> = p
        .actions
        .iter()
        .filter_map(|a| match &a.kind {
            ActionKind::ResetGpu { index, .. } => Some(*index),
            _ => None,
        })
        .collect();
    assert_eq!(resets, vec![0]);
    let modes = count(&p, |k| {
        matches!(
            k,
            ActionKind::SetMigMode {
                index: 0,
                enable: true,
                ..
            }
        )
    });
    assert_eq!(modes, 1);

    h.state.gpus[0]
        .processes
        .push(proc(99, Some("job.service")));
    let p = plan(&want, &h.state);
    assert_eq!(count(&p, |k| matches!(k, ActionKind::ResetGpu { .. })), 0);
    assert_eq!(
        count(&p, |k| matches!(k, ActionKind::SetMigMode { .. })),
        1,
        "setting the pending mode is harmless"
    );
    assert!(p
        .blocked
        .iter()
        .any(|b| b.index == 0 && b.reason.contains("needs GPU reset: processes hold it")));
    let (_, remaining) = apply(&want, &mut h);
    assert!(remaining.actions.is_empty(), "{remaining:#?}");
    let m = h.state.gpus[0].mig.as_ref().unwrap();
    assert!(m.is_pending());
    // The job ends: the reset and the instances follow.
    h.state.gpus[0].processes.clear();
    let (_, remaining) = apply(&want, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");
    assert_eq!(h.state.gpus[0].mig.as_ref().unwrap().instances.len(), 2);
}

#[test]
fn whole_gpu_turns_mig_off_and_removed_team_is_cleaned_up() {
    let mut h = SimHost::from_spec("h100-80gb").unwrap();
    let m = policy(
        vec![mps_team("a"), team("b")],
        vec![mig(0, &[("2g.20gb", "a", 3, &["1c", "1c"])])],
        Reconfigure::WhenIdle,
    );
    apply(&m, &mut h);
    assert_eq!(h.state.mps.len(), 6);
    let whole = policy(
        vec![mps_team("a")],
        vec![assign(Selector::All, GpuUse::Owned("a".parse().unwrap()))],
        Reconfigure::WhenIdle,
    );
    let p = plan(&whole, &h.state);
    assert_eq!(count(&p, |k| matches!(k, ActionKind::StopMps { .. })), 6);
    assert_eq!(
        count(
            &p,
            |k| matches!(k, ActionKind::RemoveSlice { team } if team == "b")
        ),
        1
    );
    let (_, remaining) = apply(&whole, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");
    assert!(!h.state.gpus[0].mig.as_ref().unwrap().current);
    assert_eq!(h.state.mps.keys().collect::<Vec<_>>(), vec!["a-gpus"]);
}

/// The policy of `tests/golden/mig-inference-h100`, built by hand: it pins that case's expected
/// plan before the loader exists, and the golden test then checks the loader reproduces it.
#[test]
fn golden_case_rendered_from_hand_built_policy() {
    use gpuctl::policy::{MpsSettings, Size};
    let mut prod = team("prod");
    prod.limits.memory_max = Some(Size::Bytes(128 << 30));
    prod.limits.cpu_weight = Some(1000);
    let mut interns = team("interns");
    interns.limits.memory_max = Some(Size::PercentOfRam(10.0));
    interns.limits.cpu_weight = Some(50);
    interns.mps = Some(MpsSettings {
        active_thread_percentage: Some(50),
        ..Default::default()
    });
    let p = policy(
        vec![prod, interns],
        vec![
            mig(
                0,
                &[
                    ("3g.40gb", "prod", 1, &[]),
                    ("3g.40gb", "interns", 1, &["1c", "2c"]),
                ],
            ),
            assign(
                Selector::Model("l40s".into()),
                GpuUse::Owned("interns".parse().unwrap()),
            ),
        ],
        Reconfigure::WhenIdle,
    );
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/mig-inference-h100");
    let spec = std::fs::read_to_string(dir.join("host")).unwrap();
    let obs = gpuctl::sim::build(spec.trim()).unwrap();
    let d = gpuctl::plan::desired(&p, &obs);
    let got = gpuctl::cli::plan::render(&obs, &d, &gpuctl::plan::diff(&d, &obs));
    golden::check(&dir.join("expected-plan.txt"), &got);
    // Whatever the layout, both 3g halves exist and gpu 1 is left alone.
    assert!(got.contains("gpu 1 ·") && got.contains("not named by the policy"));
    assert_eq!(got.matches("create GI 3g.40gb").count(), 2);
}

/// An H100 with MIG on and idle instances made outside the policy: (profile, start, owner).
fn host_with(instances: &[(&str, u32, &str)]) -> SimHost {
    use gpuctl::apply::{GpuEffector, OwnerLabels};
    use gpuctl::profiles::Placement;
    let mut h = SimHost::from_spec("h100-80gb").unwrap();
    let model = gpuctl::profiles::Catalog::get()
        .by_sim_name("h100-80gb")
        .unwrap();
    let uuid = h.state.gpus[0].uuid.clone();
    h.set_mig_mode(&uuid, true).unwrap();
    h.reset_gpu(&uuid).unwrap();
    for (profile, start, owner) in instances {
        let gp = model.gi_profile(profile).unwrap();
        let size = gp.memory_slices();
        let gi = h
            .create_gi(
                &uuid,
                gp.id,
                Placement {
                    start: *start,
                    size,
                },
            )
            .unwrap();
        h.set_owner(&uuid, gi, owner).unwrap();
        let ci = model.full_ci_profile(profile).unwrap();
        h.create_ci(&uuid, gi, ci.id, ci.placements[0]).unwrap();
    }
    h
}

fn gi_starts(h: &SimHost) -> Vec<(String, u32, Option<String>)> {
    let mut v: Vec<_> = h.state.gpus[0]
        .mig
        .as_ref()
        .unwrap()
        .instances
        .iter()
        .map(|i| (i.profile.clone(), i.placement.start, i.owner.clone()))
        .collect();
    v.sort_by_key(|x| x.1);
    v
}

#[test]
fn never_keeps_idle_instances_and_only_fills_free_slices() {
    // 2g@0 is in nobody's policy; 1g@2 has the shape the policy wants for b but belongs to c.
    let existing = [("2g.20gb", 0, "c"), ("1g.10gb", 2, "c")];
    let want = |r| {
        policy(
            vec![team("a"), team("b")],
            vec![mig(
                0,
                &[("3g.40gb", "a", 1, &[]), ("1g.10gb", "b", 1, &[])],
            )],
            r,
        )
    };

    // when-idle, for contrast: the idle 2g goes, the 1g is relabelled.
    let p = plan(&want(Reconfigure::WhenIdle), &host_with(&existing).state);
    assert_eq!(count(&p, is_destroy_gi), 1, "{p:#?}");
    assert_eq!(
        count(&p, |k| matches!(k, ActionKind::SetOwner { .. })),
        1,
        "{p:#?}"
    );

    // never: nothing that exists is destroyed or relabelled; the new instances go into the free
    // slices around them, and the drift is reported per instance.
    let never = want(Reconfigure::Never);
    let mut h = host_with(&existing);
    let p = plan(&never, &h.state);
    assert_eq!(count(&p, is_destroy_gi), 0, "{p:#?}");
    assert_eq!(
        count(&p, |k| matches!(
            k,
            ActionKind::SetOwner { .. } | ActionKind::DestroyCi { .. }
        )),
        0
    );
    let created: Vec<(String, u32)> = p
        .actions
        .iter()
        .filter_map(|a| match &a.kind {
            ActionKind::CreateGi { gi, owner, .. } => Some((owner.clone(), gi.placement.start)),
            _ => None,
        })
        .collect();
    assert_eq!(created, vec![("a".into(), 4), ("b".into(), 3)], "{p:#?}");
    let mut reasons: Vec<&str> = p.blocked.iter().map(|b| b.reason.as_str()).collect();
    reasons.sort();
    assert_eq!(reasons.len(), 2, "{reasons:#?}");
    assert!(reasons[0].starts_with("1g.10gb@2+1 has a shape the policy wants, but belongs to c"));
    assert!(reasons[1].starts_with("2g.20gb@0+2 is not in the policy's layout"));
    assert!(reasons.iter().all(|r| r.ends_with("(reconfigure = never)")));

    let (_, remaining) = apply(&never, &mut h);
    assert!(remaining.actions.is_empty(), "{remaining:#?}");
    assert_eq!(remaining.blocked.len(), 2, "drift stays reported");
    assert_eq!(
        gi_starts(&h),
        vec![
            ("2g.20gb".into(), 0, Some("c".into())),
            ("1g.10gb".into(), 2, Some("c".into())),
            ("1g.10gb".into(), 3, Some("b".into())),
            ("3g.40gb".into(), 4, Some("a".into())),
        ]
    );
}

#[test]
fn never_creates_nothing_when_the_layout_cannot_be_completed_around_existing_instances() {
    // A 7g needs the whole GPU. Creating part of a layout would pin that part too (never keeps
    // what exists), possibly blocking the full layout for good, so nothing is created.
    let mut h = host_with(&[("1g.10gb", 6, "a")]);
    let p = plan(
        &policy(
            vec![team("a")],
            vec![mig(0, &[("7g.80gb", "a", 1, &[])])],
            Reconfigure::Never,
        ),
        &h.state,
    );
    assert!(
        p.actions.iter().all(|a| a.phase != Phase::MigInstances),
        "{p:#?}"
    );
    assert_eq!(p.blocked.len(), 1);
    assert!(
        p.blocked[0]
            .reason
            .contains("does not fit around the existing instances"),
        "{}",
        p.blocked[0].reason
    );

    // Whole-GPU use would destroy the instance to turn MIG off: blocked too, the mode stays.
    let whole = policy(
        vec![team("a")],
        vec![assign(
            Selector::Index(vec![0]),
            GpuUse::Owned("a".parse().unwrap()),
        )],
        Reconfigure::Never,
    );
    let p = plan(&whole, &h.state);
    assert_eq!(
        count(&p, |k| matches!(
            k,
            ActionKind::SetMigMode { .. } | ActionKind::DestroyGi { .. }
        )),
        0,
        "{p:#?}"
    );
    assert!(p.blocked[0]
        .reason
        .contains("would destroy its 1 MIG instance(s)"));
    let (_, remaining) = apply(&whole, &mut h);
    assert!(remaining.actions.is_empty());
    assert!(h.state.gpus[0].mig.as_ref().unwrap().current);

    // With no instances left (an admin removed it by hand), MIG may be turned off.
    let h = host_with(&[]);
    let p = plan(&whole, &h.state);
    assert_eq!(
        count(&p, |k| matches!(
            k,
            ActionKind::SetMigMode { enable: false, .. }
        )),
        1,
        "{p:#?}"
    );
    assert!(p.blocked.is_empty());
}

#[test]
fn model_globs_select_as_validation_documents_them() {
    // docs/policy.md: a model glob matches the NVML name, the reference key or the simulate
    // name, in any case. The planner once matched only the first and last, so an entry written
    // with the reference key validated and then silently did nothing.
    let h = SimHost::from_spec("h100-80gb,l40s,a100-40gb").unwrap();
    let p = policy(
        vec![team("a"), team("b"), team("c")],
        vec![
            assign(
                Selector::Model("H100-SXM5-*".into()),
                GpuUse::Owned("a".parse().unwrap()),
            ),
            assign(
                Selector::Model("*l40S*".into()),
                GpuUse::Owned("b".parse().unwrap()),
            ),
            assign(
                Selector::Model("A100-SXM4-40GB".into()),
                GpuUse::Owned("c".parse().unwrap()),
            ),
        ],
        Reconfigure::WhenIdle,
    );
    let d = gpuctl::plan::desired(&p, &h.state);
    assert_eq!(d.teams["a"].whole_gpus, vec![0]);
    assert_eq!(d.teams["b"].whole_gpus, vec![1]);
    assert_eq!(d.teams["c"].whole_gpus, vec![2]);
}

#[test]
fn shared_entries_naming_one_gpu_add_up_their_teams() {
    // Validation allows two `shared` entries on one GPU (a drop-in adding a team) and documents
    // that their teams add up; the planner must not let the later entry replace the earlier.
    let mut h = SimHost::from_spec("l40s").unwrap();
    let p = policy(
        vec![team("a"), mps_team("b")],
        vec![
            assign(Selector::All, GpuUse::Shared(vec!["a".parse().unwrap()])),
            assign(
                Selector::Index(vec![0]),
                GpuUse::Shared(vec!["b".parse().unwrap()]),
            ),
        ],
        Reconfigure::WhenIdle,
    );
    let (_, remaining) = apply(&p, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");
    for t in ["a", "b"] {
        assert!(
            h.state.slices[t].device_allow.contains("/dev/nvidia0"),
            "team {t}: {:?}",
            h.state.slices[t]
        );
    }
    assert_eq!(
        h.state.mps["b-gpus"].devices,
        vec![h.state.gpus[0].uuid.clone()]
    );
}

/// `mig = []` on GPU 0: MIG on, no instances, no team.
fn mig_empty(reconfigure: Reconfigure) -> gpuctl::policy::Policy {
    policy(
        vec![team("a")],
        vec![assign(Selector::Index(vec![0]), GpuUse::Mig(vec![]))],
        reconfigure,
    )
}

#[test]
fn empty_mig_turns_mig_on_without_instances_and_gives_no_team_a_device() {
    for (spec, resets) in [("h100-80gb", 0), ("a100-40gb", 1)] {
        let mut h = SimHost::from_spec(spec).unwrap();
        // The GPU was team a's whole: it leaves a's slice and env.
        let whole = policy(
            vec![team("a")],
            vec![assign(
                Selector::Index(vec![0]),
                GpuUse::Owned("a".parse().unwrap()),
            )],
            Reconfigure::WhenIdle,
        );
        apply(&whole, &mut h);
        let want = mig_empty(Reconfigure::WhenIdle);
        let p = plan(&want, &h.state);
        let modes: Vec<&str> = p
            .actions
            .iter()
            .filter(|a| matches!(a.kind, ActionKind::SetMigMode { enable: true, .. }))
            .map(|a| a.reason.as_str())
            .collect();
        assert_eq!(
            modes,
            ["gpu 0 wants MIG mode with no instances (mig = [])"],
            "{spec}: {p:#?}"
        );
        assert_eq!(
            count(&p, |k| matches!(k, ActionKind::ResetGpu { .. })),
            resets,
            "{spec}"
        );
        assert_eq!(count(&p, is_create_gi), 0, "{spec}: {p:#?}");
        assert!(p.blocked.is_empty(), "{spec}: {p:#?}");
        let (_, remaining) = apply(&want, &mut h);
        assert!(remaining.is_converged(), "{spec}: {remaining:#?}");
        assert!(plan(&want, &h.state).actions.is_empty());
        let m = h.state.gpus[0].mig.as_ref().unwrap();
        assert!(m.current && m.pending && m.instances.is_empty(), "{spec}");
        assert!(h.state.env_files["a"].contains("GPUCTL_DEVICES=none"));
        assert!(!h.state.slices["a"].device_allow.contains("/dev/nvidia0"));
    }
}

#[test]
fn empty_mig_destroys_idle_instances_and_keeps_the_mode() {
    let (mut h, _) = busy_host(0, None);
    for gi in &mut h.state.gpus[0].mig.as_mut().unwrap().instances {
        gi.compute[0].processes.clear();
    }
    let want = mig_empty(Reconfigure::WhenIdle);
    let p = plan(&want, &h.state);
    assert_eq!(count(&p, is_destroy_gi), 2, "{p:#?}");
    assert_eq!(count(&p, |k| matches!(k, ActionKind::DestroyCi { .. })), 2);
    assert_eq!(count(&p, |k| matches!(k, ActionKind::SetMigMode { .. })), 0);
    assert_eq!(count(&p, is_create_gi), 0);
    assert!(p
        .actions
        .iter()
        .filter(|a| is_destroy_gi(&a.kind))
        .all(|a| a.phase == Phase::MigInstances
            && a.reason.ends_with("is not in the policy's layout")));
    let (_, remaining) = apply(&want, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");
    let m = h.state.gpus[0].mig.as_ref().unwrap();
    assert!(m.current && m.instances.is_empty());
    assert!(!h.state.env_files["a"].contains("MIG-"));
    assert!(!h.state.slices["a"]
        .device_allow
        .iter()
        .any(|d| d.starts_with("/dev/nvidia-caps/")));
}

#[test]
fn empty_mig_keeps_a_busy_instance_with_the_usual_reason() {
    // when-idle: the idle 3g at 4 goes, the busy one at 0 stays, named with its holder.
    let (mut h, busy) = busy_host(0, Some("train.service"));
    let want = mig_empty(Reconfigure::WhenIdle);
    let p = plan(&want, &h.state);
    assert_eq!(count(&p, is_destroy_gi), 1, "{p:#?}");
    assert!(p
        .actions
        .iter()
        .all(|a| !matches!(&a.kind, ActionKind::DestroyGi { gi, .. } if gi.placement.start == 0)));
    assert_eq!(p.blocked.len(), 1, "{p:#?}");
    let b = &p.blocked[0];
    assert_eq!(b.holders, ["pid 4242 (train.service)"]);
    assert_eq!(
        b.reason,
        "3g.40gb@0+4 is not in the policy but processes hold it; waits until idle \
         (reconfigure = when-idle)"
    );
    let (_, remaining) = apply(&want, &mut h);
    assert!(remaining.actions.is_empty(), "{remaining:#?}");
    assert_eq!(remaining.blocked.len(), 1);
    let gis = &h.state.gpus[0].mig.as_ref().unwrap().instances;
    assert_eq!(gis.len(), 1);
    assert_eq!(gis[0].id, busy);
    // Busy means untouched: its owner keeps the device until the job ends.
    let env = &h.state.env_files["a"];
    assert!(env.contains(&gis[0].compute[0].uuid), "{env}");
    // The job ends: the last instance goes.
    h.state.gpus[0].mig.as_mut().unwrap().instances[0].compute[0]
        .processes
        .clear();
    let (_, remaining) = apply(&want, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");
    assert!(h.state.gpus[0].mig.as_ref().unwrap().instances.is_empty());

    // never: nothing that exists goes, idle or not.
    let (h, _) = busy_host(0, Some("train.service"));
    let p = plan(&mig_empty(Reconfigure::Never), &h.state);
    assert_eq!(count(&p, is_destroy_gi), 0, "{p:#?}");
    assert_eq!(p.blocked.len(), 2, "{p:#?}");
    assert!(p
        .blocked
        .iter()
        .all(|b| b.reason.ends_with("not done (reconfigure = never)")));

    // drain: the unit stops, both go, the unit starts again.
    let (mut h, _) = busy_host(0, Some("train.service"));
    let drain = mig_empty(Reconfigure::Drain);
    let p = plan(&drain, &h.state);
    assert!(
        matches!(&p.actions[0].kind, ActionKind::StopUnits { team, units } if team == "a" && units == &["train.service".to_string()]),
        "{p:#?}"
    );
    assert_eq!(count(&p, is_destroy_gi), 2);
    let (_, remaining) = apply(&drain, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");
}

#[test]
fn empty_mig_waits_for_a_busy_whole_gpu() {
    let mut h = SimHost::from_spec("h100-80gb").unwrap();
    h.state.gpus[0]
        .processes
        .push(proc(77, Some("job.service")));
    let p = plan(&mig_empty(Reconfigure::WhenIdle), &h.state);
    assert_eq!(
        count(&p, |k| matches!(k, ActionKind::SetMigMode { .. })),
        0,
        "{p:#?}"
    );
    assert!(
        p.blocked.iter().any(|b| b.reason
            == "gpu 0 enabling MIG needs the GPU idle: processes hold it; waits until idle \
            (reconfigure = when-idle)"
            && b.holders == ["pid 77 (job.service)"]),
        "{p:#?}"
    );
}

#[test]
fn a_device_out_of_service_leaves_the_env_file_but_not_the_slice_and_comes_back() {
    let p = policy(
        vec![team("a")],
        vec![assign(
            Selector::Index(vec![0, 1]),
            GpuUse::Owned("a".parse().unwrap()),
        )],
        Reconfigure::WhenIdle,
    );
    let mut h = SimHost::from_spec("h100-80gb*2").unwrap();
    let (_, remaining) = apply(&p, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");
    let gpu1 = h.state.gpus[1].uuid.clone();
    let cvd = |h: &SimHost| {
        h.state.env_files["a"]
            .lines()
            .find(|l| l.starts_with("CUDA_VISIBLE_DEVICES="))
            .unwrap_or_default()
            .to_string()
    };
    assert!(cvd(&h).contains(&gpu1));
    h.state.out_of_service.insert(gpu1.clone());
    let (_, remaining) = apply(&p, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");
    assert!(!cvd(&h).contains(&gpu1), "{}", cvd(&h));
    assert!(cvd(&h).contains(&h.state.gpus[0].uuid));
    // Its running jobs keep their device: the slice still allows it.
    assert!(h.state.slices["a"].device_allow.contains("/dev/nvidia1"));
    h.state.out_of_service.clear();
    let (_, remaining) = apply(&p, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");
    assert!(cvd(&h).contains(&gpu1));
}
