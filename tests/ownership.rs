//! Issue 17, "gpuctl owns what it manages", on simulated hosts: a busy share is never handed to
//! another team under `when-idle`/`never` (MIG instances and whole GPUs, a removed team's GPU
//! included), `drain` stops the holder first and only units it can start again, and a change of
//! a compute split rebuilds only compute instances.

mod common;
use common::*;
use gpuctl::apply::{execute, GpuEffector, OwnerLabels};
use gpuctl::observe::GpuProcess;
use gpuctl::plan::mig::drain_unit;
use gpuctl::plan::{plan, ActionKind, Phase};
use gpuctl::policy::{GpuUse, MigSpec, Reconfigure, Selector};
use gpuctl::profiles::Catalog;
use gpuctl::sim::SimHost;
use proptest::prelude::*;

fn proc_in(pid: u32, cgroup: &str) -> GpuProcess {
    GpuProcess {
        pid,
        used_memory: 1 << 30,
        unit: cgroup
            .rsplit('/')
            .find(|c| c.ends_with(".service") || c.ends_with(".scope"))
            .map(String::from),
        cgroup: Some(cgroup.into()),
    }
}

fn is_gi_mutation(k: &ActionKind) -> bool {
    matches!(
        k,
        ActionKind::DestroyGi { .. } | ActionKind::CreateGi { .. }
    )
}

/// One H100 with a 3g.40gb for team a at 0 and a 4g.40gb for team b at 4 (wait: the 4g can
/// only go at 0, so the 3g is at 4); a's job runs on the 3g when `busy`.
fn two_teams(busy: Option<&str>) -> (SimHost, String) {
    let mut h = SimHost::from_spec("h100-80gb").unwrap();
    let before = policy(
        vec![team("a"), team("b")],
        vec![mig(
            0,
            &[("3g.40gb", "a", 1, &[]), ("4g.40gb", "b", 1, &[])],
        )],
        Reconfigure::WhenIdle,
    );
    apply(&before, &mut h);
    let gi = h.state.gpus[0]
        .mig
        .as_mut()
        .unwrap()
        .instances
        .iter_mut()
        .find(|i| i.profile == "3g.40gb")
        .unwrap();
    let uuid = gi.compute[0].uuid.clone();
    if let Some(cg) = busy {
        gi.compute[0].processes.push(proc_in(4242, cg));
    }
    (h, uuid)
}

fn moved(reconf: Reconfigure) -> gpuctl::policy::Policy {
    policy(
        vec![team("a"), team("b")],
        vec![mig(
            0,
            &[("3g.40gb", "b", 1, &[]), ("4g.40gb", "b", 1, &[])],
        )],
        reconf,
    )
}

#[test]
fn busy_mig_instance_keeps_owner_devices_and_env_under_when_idle_and_never() {
    for reconf in [Reconfigure::WhenIdle, Reconfigure::Never] {
        let (mut h, uuid) = two_teams(Some("/gpu.slice/gpu-a.slice/job.service"));
        let want = moved(reconf);
        let p = plan(&want, &h.state);
        assert_eq!(
            count(&p, |k| matches!(k, ActionKind::SetOwner { .. })),
            0,
            "{reconf:?}: a busy instance was relabelled: {p:#?}"
        );
        let b = p
            .blocked
            .iter()
            .find(|b| b.gi.is_some())
            .unwrap_or_else(|| panic!("{reconf:?}: not blocked: {p:#?}"));
        assert_eq!(b.holders, vec!["pid 4242 (job.service)".to_string()]);
        assert!(
            b.reason.contains("policy gives it to team b"),
            "{}",
            b.reason
        );
        let (_, remaining) = apply(&want, &mut h);
        assert!(!remaining.is_converged());
        assert!(h.state.env_files["a"].contains(&uuid), "a keeps its device");
        assert!(!h.state.env_files["b"].contains(&uuid), "b must not get it");
        let gi = &h.state.gpus[0].mig.as_ref().unwrap().instances;
        assert!(gi
            .iter()
            .any(|g| g.profile == "3g.40gb" && g.owner.as_deref() == Some("a")));
    }
}

#[test]
fn busy_mig_instance_under_drain_stops_the_holder_first() {
    let (h, _) = two_teams(Some("/gpu.slice/gpu-a.slice/job.service"));
    let p = plan(&moved(Reconfigure::Drain), &h.state);
    let first = &p.actions[0];
    assert!(
        matches!(&first.kind, ActionKind::StopUnits { team, units } if team == "a" && units == &["job.service".to_string()]),
        "{p:#?}"
    );
    assert_eq!(count(&p, |k| matches!(k, ActionKind::SetOwner { .. })), 1);
    // A login session's job is never drained: the change waits and names it.
    let (h, _) = two_teams(Some("/user.slice/user-1000.slice/session-3.scope"));
    let p = plan(&moved(Reconfigure::Drain), &h.state);
    assert_eq!(count(&p, |k| matches!(k, ActionKind::StopUnits { .. })), 0);
    assert_eq!(count(&p, |k| matches!(k, ActionKind::SetOwner { .. })), 0);
    assert!(p
        .blocked
        .iter()
        .any(|b| b.holders == vec!["pid 4242 (session-3.scope)".to_string()]));
}

#[test]
fn drain_targets_only_restartable_system_services_in_team_slices() {
    let ok = proc_in(1, "/gpu.slice/gpu-a.slice/train.service");
    assert_eq!(drain_unit(&ok), Ok("train.service"));
    let ok_nested = proc_in(1, "/gpu.slice/gpu-a.slice/train.service/worker");
    assert_eq!(drain_unit(&ok_nested), Ok("train.service"));
    for (cg, why) in [
        (
            "/user.slice/user-1000.slice/session-4.scope",
            "login session",
        ),
        (
            "/user.slice/user-1000.slice/user@1000.service/app.slice/job.service",
            "user manager",
        ),
        (
            "/gpu.slice/gpu-a.slice/gpuctl-run-a-77.scope",
            "cannot be started again",
        ),
        (
            "/system.slice/cron.service",
            "not a service in a team slice",
        ),
    ] {
        let e = drain_unit(&proc_in(1, cg)).unwrap_err();
        assert!(e.contains(why), "{cg}: {e}");
    }
    assert!(drain_unit(&GpuProcess {
        pid: 1,
        used_memory: 0,
        unit: None,
        cgroup: None
    })
    .is_err());
}

#[test]
fn compute_split_change_rebuilds_only_compute_instances() {
    let mut h = SimHost::from_spec("h100-80gb").unwrap();
    let before = policy(
        vec![team("a")],
        vec![mig(
            0,
            &[("3g.40gb", "a", 1, &[]), ("4g.40gb", "a", 1, &[])],
        )],
        Reconfigure::WhenIdle,
    );
    apply(&before, &mut h);
    let after = policy(
        vec![team("a")],
        vec![mig(
            0,
            &[
                ("3g.40gb", "a", 1, &["1c", "1c", "1c"]),
                ("4g.40gb", "a", 1, &[]),
            ],
        )],
        Reconfigure::WhenIdle,
    );
    let p = plan(&after, &h.state);
    assert_eq!(count(&p, is_gi_mutation), 0, "{p:#?}");
    assert_eq!(
        count(&p, |k| matches!(k, ActionKind::DestroyCi { .. })),
        1,
        "{p:#?}"
    );
    assert_eq!(count(&p, |k| matches!(k, ActionKind::CreateCi { .. })), 3);
    let reason = &p
        .actions
        .iter()
        .find(|a| matches!(a.kind, ActionKind::DestroyCi { .. }))
        .unwrap()
        .reason;
    assert!(reason.contains("compute split"), "{reason}");
    assert!(!reason.contains("not in the policy's layout"), "{reason}");
    let (_, remaining) = apply(&after, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");
    let env = &h.state.env_files["a"];
    let cvd = env
        .lines()
        .find(|l| l.starts_with("CUDA_VISIBLE_DEVICES="))
        .unwrap();
    assert_eq!(cvd.matches("MIG-").count(), 4, "{env}");

    // The same change while a job runs on the 3g waits, and says why in words.
    let gi = h.state.gpus[0]
        .mig
        .as_mut()
        .unwrap()
        .instances
        .iter_mut()
        .find(|i| i.profile == "3g.40gb")
        .unwrap();
    gi.compute[0]
        .processes
        .push(proc_in(9, "/gpu.slice/gpu-a.slice/job.service"));
    let p = plan(&before, &h.state);
    assert!(
        p.actions.iter().all(|a| a.phase != Phase::MigInstances),
        "{p:#?}"
    );
    let b = &p.blocked[0];
    assert!(
        b.reason.contains("compute split") && !b.reason.contains("memory slices"),
        "{}",
        b.reason
    );
}

fn whole(team_of_gpu: &str) -> gpuctl::policy::GpuAssignment {
    assign(
        Selector::Index(vec![0]),
        GpuUse::Owned(team_of_gpu.parse().unwrap()),
    )
}

#[test]
fn whole_gpu_is_not_handed_over_while_the_old_team_uses_it() {
    let mut h = SimHost::from_spec("l40s").unwrap();
    apply(
        &policy(
            vec![team("infer"), team("train")],
            vec![whole("infer")],
            Reconfigure::WhenIdle,
        ),
        &mut h,
    );
    h.state.gpus[0].processes.push(proc_in(
        4242,
        "/gpu.slice/gpu-infer.slice/gpuctl-run-infer-4242.scope",
    ));
    // The GPU moves to train; then team infer is removed altogether.
    for teams in [vec![team("infer"), team("train")], vec![team("train")]] {
        for reconf in [
            Reconfigure::WhenIdle,
            Reconfigure::Never,
            Reconfigure::Drain,
        ] {
            let want = policy(teams.clone(), vec![whole("train")], reconf);
            let mut h2 = SimHost {
                state: h.state.clone(),
            };
            let p = plan(&want, &h2.state);
            let b = p
                .blocked
                .iter()
                .find(|b| b.reason.contains("not handed over"))
                .unwrap_or_else(|| panic!("{reconf:?}: {p:#?}"));
            assert_eq!(
                b.holders,
                vec!["pid 4242 (gpuctl-run-infer-4242.scope)".to_string()]
            );
            let (_, remaining) = apply(&want, &mut h2);
            assert!(!remaining.is_converged());
            assert!(
                !h2.state.slices["train"]
                    .device_allow
                    .contains("/dev/nvidia0"),
                "{reconf:?}: train got the GPU while infer's job runs"
            );
            if let Some(s) = h2.state.slices.get("infer") {
                assert!(s.device_allow.contains("/dev/nvidia0"));
            }
            // Once the job ends, the GPU moves.
            h2.state.gpus[0].processes.clear();
            let (_, remaining) = apply(&want, &mut h2);
            assert!(remaining.blocked.is_empty(), "{remaining:#?}");
            assert!(h2.state.slices["train"]
                .device_allow
                .contains("/dev/nvidia0"));
        }
    }
}

/// A slice set by a version that granted `rw` (before `rwm`) reads back as `<path> rw`: it is
/// still the grant the running job holds, so the GPU stays with that team; the slice is set
/// again with the full grant.
#[test]
fn an_old_rw_grant_still_holds_a_busy_whole_gpu_and_is_upgraded() {
    let mut h = SimHost::from_spec("l40s").unwrap();
    let infer = policy(
        vec![team("infer"), team("train")],
        vec![whole("infer")],
        Reconfigure::WhenIdle,
    );
    apply(&infer, &mut h);
    let s = h.state.slices.get_mut("infer").unwrap();
    s.device_allow = std::mem::take(&mut s.device_allow)
        .into_iter()
        .map(|d| format!("{d} rw"))
        .collect();
    assert!(
        !plan(&infer, &h.state).actions.is_empty(),
        "an rw slice must be set again"
    );
    h.state.gpus[0].processes.push(proc_in(
        4242,
        "/gpu.slice/gpu-infer.slice/gpuctl-run-infer-4242.scope",
    ));
    let want = policy(
        vec![team("infer"), team("train")],
        vec![whole("train")],
        Reconfigure::WhenIdle,
    );
    let p = plan(&want, &h.state);
    assert!(
        p.blocked
            .iter()
            .any(|b| b.reason.contains("not handed over")),
        "{p:#?}"
    );
    apply(&want, &mut h);
    assert!(!h.state.slices["train"]
        .device_allow
        .contains("/dev/nvidia0"));
    assert!(h.state.slices["infer"]
        .device_allow
        .contains("/dev/nvidia0"));
}

#[test]
fn whole_gpu_under_drain_stops_a_team_service_first() {
    let mut h = SimHost::from_spec("l40s").unwrap();
    apply(
        &policy(
            vec![team("infer"), team("train")],
            vec![whole("infer")],
            Reconfigure::Drain,
        ),
        &mut h,
    );
    h.state.gpus[0]
        .processes
        .push(proc_in(7, "/gpu.slice/gpu-infer.slice/serve.service"));
    let want = policy(
        vec![team("infer"), team("train")],
        vec![whole("train")],
        Reconfigure::Drain,
    );
    let p = plan(&want, &h.state);
    assert!(
        matches!(&p.actions[0].kind, ActionKind::StopUnits { team, units } if team == "infer" && units == &["serve.service".to_string()]),
        "{p:#?}"
    );
    assert!(p.blocked.is_empty(), "{p:#?}");
}

const TEAMS: [&str; 3] = ["alpha", "beta", "gamma"];

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]
    /// Random hosts with busy instances, random policies: under `when-idle` and `never` a busy
    /// instance keeps its placement, owner and compute instances, its MIG devices appear in
    /// no other team's env file or slice, and its owner (when still in the policy) keeps them.
    #[test]
    fn busy_instances_are_untouched(
        existing in prop::collection::vec((0..16usize, 0..8usize, 0..3usize, any::<bool>(), any::<bool>()), 1..6),
        // From 0: `mig = []` (no instances wanted) is one of the geometries.
        specs in prop::collection::vec((0..16usize, 0..3usize, 0..3usize), 0..6),
        never in any::<bool>(),
        drop_team in 0..4usize,
    ) {
        let model = Catalog::get().by_key("H100-SXM5-80GB").unwrap();
        let mut h = SimHost::from_spec("h100-80gb").unwrap();
        let uuid = h.state.gpus[0].uuid.clone();
        h.set_mig_mode(&uuid, true).unwrap();
        let mut pid = 100;
        for (pp, pl, owner, split, busy) in &existing {
            let gp = &model.gi_profiles[pp % model.gi_profiles.len()];
            let place = gp.placements[pl % gp.placements.len()];
            let Ok(gi) = h.create_gi(&uuid, gp.id, place) else { continue };
            h.set_owner(&uuid, gi, TEAMS[*owner]).unwrap();
            let cis = model.ci_profiles(&gp.name);
            let full = model.full_ci_profile(&gp.name).unwrap();
            let ci = if *split && cis.len() > 1 { &cis[0] } else { full };
            let Ok(cid) = h.create_ci(&uuid, gi, ci.id, ci.placements[0]) else { continue };
            if *busy {
                pid += 1;
                let inst = h.state.gpus[0].mig.as_mut().unwrap().instances.iter_mut().find(|x| x.id == gi).unwrap();
                let c = inst.compute.iter_mut().find(|c| c.id == cid).unwrap();
                c.processes.push(proc_in(pid, &format!("/gpu.slice/gpu-{}.slice/job{pid}.service", TEAMS[*owner])));
            }
        }
        let mut out: Vec<MigSpec> = Vec::new();
        for (pp, owner, cp) in &specs {
            let gp = &model.gi_profiles[pp % model.gi_profiles.len()];
            let cis = model.ci_profiles(&gp.name);
            let compute = match cp {
                1 if cis.len() > 1 => vec![cis[0].short_name().to_string(); (gp.slice_count / cis[0].slice_count).min(cis[0].instance_count) as usize],
                _ => vec![],
            };
            out.push(MigSpec { profile: gp.name.clone(), owner: TEAMS[*owner].parse().unwrap(), count: 1, compute });
            let wanted: Vec<_> = out.iter().map(|s| model.gi_profile(&s.profile).unwrap()).collect();
            if gpuctl::geometry::fit(model, &wanted, &[]).is_err() { out.pop(); }
        }
        let teams: Vec<_> = TEAMS.iter().enumerate().filter(|(i, _)| *i != drop_team).map(|(_, t)| team(t)).collect();
        out.retain(|s| teams.iter().any(|t| t.name == s.owner));
        let reconf = if never { Reconfigure::Never } else { Reconfigure::WhenIdle };
        let p = policy(teams, vec![assign(Selector::Index(vec![0]), GpuUse::Mig(out))], reconf);

        let busy_before: Vec<_> = h.state.gpus[0].mig.as_ref().unwrap().instances.iter()
            .filter(|gi| gi.compute.iter().any(|c| !c.processes.is_empty()))
            .cloned().collect();
        let first = plan(&p, &h.state);
        let report = execute(&p, &first, &mut h).unwrap();
        prop_assert!(report.failed.is_empty(), "{:#?}", report.failed);
        let after = &h.state.gpus[0].mig.as_ref().unwrap().instances;
        for b in &busy_before {
            let now = after.iter().find(|gi| gi.placement == b.placement && gi.profile_id == b.profile_id);
            prop_assert!(now.is_some(), "busy {} destroyed\n{first:#?}", b.profile);
            let now = now.unwrap();
            prop_assert_eq!(&now.owner, &b.owner, "owner of a busy instance changed\n{:#?}", first);
            let uuids = |g: &gpuctl::observe::GpuInstance| g.compute.iter().map(|c| c.uuid.clone()).collect::<Vec<_>>();
            prop_assert_eq!(uuids(now), uuids(b), "compute instances of a busy instance changed");
            let owner = b.owner.clone().unwrap();
            for (t, env) in &h.state.env_files {
                for c in &b.compute {
                    prop_assert_eq!(env.contains(&c.uuid), *t == owner,
                        "env of {} and busy device of {}\n{:#?}", t, owner, first);
                }
            }
            for (t, s) in &h.state.slices {
                if *t != owner {
                    prop_assert!(!s.device_allow.iter().any(|d| d.starts_with("/dev/nvidia-caps/")
                        && h.state.mig_minors.iter().any(|(k, m)| k.starts_with(&format!("gpu0/gi{}/", b.id)) && d.ends_with(&format!("nvidia-cap{m}")))),
                        "slice of {t} allows a cap of {owner}'s busy instance");
                }
            }
        }
    }

    /// A change of only the compute splits never creates or destroys a GPU instance.
    #[test]
    fn compute_only_changes_make_no_gi_mutations(
        gis in prop::collection::vec((0..16usize, any::<bool>()), 1..5),
        flips in prop::collection::vec(any::<bool>(), 5),
    ) {
        let model = Catalog::get().by_key("H100-SXM5-80GB").unwrap();
        let mk = |flip: &dyn Fn(usize) -> bool| -> Vec<MigSpec> {
            let mut out: Vec<MigSpec> = Vec::new();
            for (i, (pp, split)) in gis.iter().enumerate() {
                let gp = &model.gi_profiles[pp % model.gi_profiles.len()];
                let cis = model.ci_profiles(&gp.name);
                let split = *split != flip(i);
                let compute = if split && cis.len() > 1 {
                    vec![cis[0].short_name().to_string(); (gp.slice_count / cis[0].slice_count).min(cis[0].instance_count) as usize]
                } else { vec![] };
                out.push(MigSpec { profile: gp.name.clone(), owner: "alpha".parse().unwrap(), count: 1, compute });
                let wanted: Vec<_> = out.iter().map(|s| model.gi_profile(&s.profile).unwrap()).collect();
                if gpuctl::geometry::fit(model, &wanted, &[]).is_err() { out.pop(); }
            }
            out
        };
        let before = mk(&|_| false);
        let after: Vec<MigSpec> = before.iter().enumerate().map(|(i, s)| {
            let gp = model.gi_profile(&s.profile).unwrap();
            let cis = model.ci_profiles(&gp.name);
            let compute = if flips[i % flips.len()] && cis.len() > 1 {
                if s.compute.is_empty() { vec![cis[0].short_name().to_string(); (gp.slice_count / cis[0].slice_count).min(cis[0].instance_count) as usize] } else { vec![] }
            } else { s.compute.clone() };
            MigSpec { compute, ..s.clone() }
        }).collect();
        let mut h = SimHost::from_spec("h100-80gb").unwrap();
        let p0 = policy(vec![team("alpha")], vec![assign(Selector::Index(vec![0]), GpuUse::Mig(before))], Reconfigure::WhenIdle);
        apply(&p0, &mut h);
        let p1 = policy(vec![team("alpha")], vec![assign(Selector::Index(vec![0]), GpuUse::Mig(after))], Reconfigure::WhenIdle);
        let pl = plan(&p1, &h.state);
        prop_assert_eq!(count(&pl, is_gi_mutation), 0, "{:#?}", pl);
        let (_, remaining) = apply(&p1, &mut h);
        prop_assert!(remaining.is_converged(), "{:#?}", remaining);
    }
}
