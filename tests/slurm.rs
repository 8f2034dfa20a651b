//! A MIG change on a Slurm node (docs/slurm.md, "The drain cycle") on the simulated host:
//! drain first, wait for Slurm's jobs, change, rewrite the GRES file, resume; and never resume
//! a node someone else drained.

mod common;

use common::{apply, count, mig, policy, team};
use gpuctl::observe::{SlurmNode, SlurmObserved};
use gpuctl::plan::{plan, ActionKind, Phase};
use gpuctl::policy::{Policy, Reconfigure};
use gpuctl::sim::SimHost;

fn slurm_policy(layout: &[(&str, &str, u32, &[&str])]) -> Policy {
    let mut p = policy(
        vec![team("infer"), team("interns")],
        vec![mig(0, layout)],
        Reconfigure::WhenIdle,
    );
    p.slurm.enabled = true;
    p.slurm.node_name = Some("n1".into());
    p
}

fn node(drain: bool, busy: bool, reason: Option<&str>) -> SlurmNode {
    SlurmNode {
        name: "n1".into(),
        drain,
        busy,
        reason: reason.map(String::from),
    }
}

/// An H100 host converged on `layout` under Slurm, node idle and up.
fn converged(layout: &[(&str, &str, u32, &[&str])]) -> SimHost {
    let mut h = SimHost::from_spec("h100-80gb").unwrap();
    h.state.slurm = Some(SlurmObserved {
        node: Ok(node(false, false, None)),
        gres_file: None,
        node_file: None,
    });
    let (first, remaining) = apply(&slurm_policy(layout), &mut h);
    // Even the first MIG layout waits for a drain: Slurm may have a job on the whole GPU.
    assert!(
        count(&first, |k| matches!(k, ActionKind::SlurmDrain { .. })) == 1,
        "{first:#?}"
    );
    assert!(!remaining.is_converged());
    h
}

fn n(h: &SimHost) -> &SlurmNode {
    h.state.slurm.as_ref().unwrap().node.as_ref().unwrap()
}

fn gres(h: &SimHost) -> &str {
    h.state
        .slurm
        .as_ref()
        .unwrap()
        .gres_file
        .as_deref()
        .unwrap_or("")
}

const OLD: &[(&str, &str, u32, &[&str])] = &[("1g.10gb", "interns", 7, &[])];
const NEW: &[(&str, &str, u32, &[&str])] =
    &[("3g.40gb", "infer", 1, &[]), ("1g.10gb", "interns", 4, &[])];

#[test]
fn a_mig_change_drains_waits_for_jobs_applies_rewrites_gres_and_resumes() {
    // First layout: the plan only drains; nothing of the MIG change runs yet.
    let mut h = converged(OLD);
    assert!(n(&h).drain && n(&h).drained_by_gpuctl(), "{:?}", n(&h));
    assert!(h.state.gpus[0]
        .mig
        .as_ref()
        .is_none_or(|m| m.instances.is_empty()));

    // Slurm still runs a job on the node (DRAINING): the change keeps waiting, said per GPU.
    h.state.slurm.as_mut().unwrap().node = Ok(node(true, true, n(&h).reason.as_deref()));
    let p = slurm_policy(OLD);
    let pl = plan(&p, &h.state);
    assert!(
        pl.actions.iter().all(|a| matches!(
            a.kind,
            ActionKind::WriteGres { .. } | ActionKind::SlurmReload { .. }
        )),
        "{pl:#?}"
    );
    assert!(
        pl.blocked
            .iter()
            .any(|b| b.reason.contains("waiting for the jobs on Slurm node n1")),
        "{pl:#?}"
    );

    // The job ended (DRAINED): the change runs, the GRES file follows, the node is resumed.
    h.state.slurm.as_mut().unwrap().node = Ok(node(true, false, n(&h).reason.as_deref()));
    let (first, remaining) = apply(&p, &mut h);
    assert!(first
        .actions
        .iter()
        .any(|a| a.phase == Phase::Resume && matches!(a.kind, ActionKind::SlurmResume { .. })));
    assert!(remaining.is_converged(), "{remaining:#?}");
    assert!(plan(&p, &h.state).is_converged());
    assert!(!n(&h).drain);
    assert_eq!(
        gres(&h)
            .matches("Type=1g.10gb MultipleFiles=/dev/nvidia0,")
            .count(),
        7,
        "{}",
        gres(&h)
    );
    assert!(gres(&h).contains("Gres=gpu:1g.10gb:7"));

    // A policy change of the layout: drain, then (idle) change, new types, resume.
    let p2 = slurm_policy(NEW);
    let pl = plan(&p2, &h.state);
    assert_eq!(
        count(&pl, |k| matches!(k, ActionKind::SlurmDrain { .. })),
        1,
        "{pl:#?}"
    );
    assert_eq!(
        count(&pl, |k| matches!(k, ActionKind::DestroyGi { .. })),
        0,
        "{pl:#?}"
    );
    let (_, remaining) = apply(&p2, &mut h);
    assert!(!remaining.is_converged());
    let (_, remaining) = apply(&p2, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");
    assert!(!n(&h).drain);
    assert!(
        gres(&h).contains("Gres=gpu:1g.10gb:4,gpu:3g.40gb:1"),
        "{}",
        gres(&h)
    );
}

#[test]
fn the_node_file_carries_the_nodes_gres_as_a_default_line() {
    let mut h = converged(OLD);
    let mut p = slurm_policy(OLD);
    p.slurm.node_file = Some("/etc/slurm/gres.d/node.conf".into());
    apply(&p, &mut h);
    let (_, remaining) = apply(&p, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");
    let nf = h
        .state
        .slurm
        .as_ref()
        .unwrap()
        .node_file
        .as_deref()
        .unwrap();
    assert!(
        nf.ends_with("\nNodeName=DEFAULT Gres=gpu:1g.10gb:7\n"),
        "{nf}"
    );
    assert!(
        gres(&h).contains("Type=1g.10gb MultipleFiles="),
        "{}",
        gres(&h)
    );
}

#[test]
fn a_node_the_admin_drained_is_changed_when_idle_but_never_resumed() {
    let mut h = converged(OLD);
    apply(&slurm_policy(OLD), &mut h); // drained by gpuctl, idle: change + resume
    assert!(!n(&h).drain);
    h.state.slurm.as_mut().unwrap().node = Ok(node(true, false, Some("disk swap")));
    let p2 = slurm_policy(NEW);
    let (first, remaining) = apply(&p2, &mut h);
    assert_eq!(
        count(&first, |k| matches!(
            k,
            ActionKind::SlurmDrain { .. } | ActionKind::SlurmResume { .. }
        )),
        0,
        "{first:#?}"
    );
    assert!(remaining.is_converged(), "{remaining:#?}");
    assert_eq!(n(&h).reason.as_deref(), Some("disk swap"));
    assert!(n(&h).drain);
}

#[test]
fn an_unknown_node_state_holds_mig_changes_and_nothing_without_slurm_changes() {
    let mut h = SimHost::from_spec("h100-80gb").unwrap();
    h.state.slurm = Some(SlurmObserved {
        node: Err("Unable to contact slurm controller".into()),
        gres_file: None,
        node_file: None,
    });
    let p = slurm_policy(OLD);
    let pl = plan(&p, &h.state);
    assert!(pl.actions.is_empty(), "{pl:#?}");
    assert!(
        pl.blocked[0].reason.contains("Unable to contact"),
        "{pl:#?}"
    );

    // [slurm] off: the same host plans as before, with no Slurm action.
    let mut off = p.clone();
    off.slurm.enabled = false;
    let pl = plan(&off, &h.state);
    assert!(count(&pl, |k| matches!(k, ActionKind::CreateGi { .. })) == 7);
    assert_eq!(
        count(&pl, |k| matches!(
            k,
            ActionKind::SlurmDrain { .. } | ActionKind::WriteGres { .. }
        )),
        0
    );
}

#[test]
fn export_slurm_prints_the_gres_lines_and_the_node_gres_of_a_simulated_host() {
    let dir = tempfile::tempdir().unwrap();
    let pol = dir.path().join("p.toml");
    std::fs::write(
        &pol,
        "version = 1\n[slurm]\nenabled = true\nteam-types = true\n[teams.interns]\n\
         [teams.infer]\n[[gpu]]\nindex = 0\nmig = [{ profile = \"3g.40gb\", owner = \"infer\" }, \
         { profile = \"1g.10gb\", owner = \"interns\", count = 4 }]\n",
    )
    .unwrap();
    let state = dir.path().join("state.json");
    let gpuctl = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpuctl"))
            .args(args)
            .arg("--state")
            .arg(&state)
            .arg(&pol)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    gpuctl(&["apply", "--simulate", "h100-80gb"]);
    let conf = gpuctl(&["export", "slurm", "--node", "n7"]);
    let lines: Vec<&str> = conf.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 5, "{conf}");
    assert!(lines
        .iter()
        .all(|l| l.starts_with("NodeName=n7 Name=gpu Type=")
            && l.contains(" MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap")));
    assert_eq!(
        gpuctl(&["export", "slurm", "--gres"]).trim(),
        "gpu:infer_3g.40gb:1,gpu:interns_1g.10gb:4"
    );
}

#[test]
fn a_device_out_of_service_drains_the_node_until_it_is_back() {
    let mut h = converged(OLD);
    let p = slurm_policy(OLD);
    apply(&p, &mut h); // drained by gpuctl for the first layout, idle: change + resume
    assert!(!n(&h).drain);
    let mig_uuid = h.state.gpus[0].mig.as_ref().unwrap().instances[2].compute[0]
        .uuid
        .clone();

    // One MIG device of GPU 0 out of service: the node drains, naming the GPU.
    h.state.out_of_service.insert(mig_uuid.clone());
    let (first, remaining) = apply(&p, &mut h);
    assert_eq!(
        count(
            &first,
            |k| matches!(k, ActionKind::SlurmDrain { reason, .. } if reason == "gpuctl: GPU 0 out of service")
        ),
        1,
        "{first:#?}"
    );
    assert!(remaining.is_converged(), "{remaining:#?}");
    assert!(n(&h).drain && n(&h).drained_by_gpuctl(), "{:?}", n(&h));

    // Drained and idle, still out of service: no resume, nothing to do.
    h.state.slurm.as_mut().unwrap().node = Ok(node(true, false, n(&h).reason.as_deref()));
    assert!(
        plan(&p, &h.state).is_converged(),
        "{:#?}",
        plan(&p, &h.state)
    );
    // ... not even after a MIG change that needed the drain.
    let p2 = slurm_policy(NEW);
    let (first, _) = apply(&p2, &mut h);
    assert_eq!(
        count(&first, |k| matches!(k, ActionKind::SlurmResume { .. })),
        0,
        "{first:#?}"
    );
    assert!(n(&h).drain);

    // Back in service: gpuctl resumes the node it drained.
    h.state.out_of_service.clear();
    let (first, remaining) = apply(&p2, &mut h);
    assert_eq!(
        count(&first, |k| matches!(k, ActionKind::SlurmResume { .. })),
        1,
        "{first:#?}"
    );
    assert!(remaining.is_converged(), "{remaining:#?}");
    assert!(!n(&h).drain);

    // The whole GPU out of service while an admin drained the node: gpuctl leaves it as is.
    h.state.slurm.as_mut().unwrap().node = Ok(node(true, false, Some("disk swap")));
    h.state.out_of_service.insert(h.state.gpus[0].uuid.clone());
    let pl = plan(&p2, &h.state);
    assert!(pl.is_converged(), "{pl:#?}");
    h.state.out_of_service.clear();
    assert!(plan(&p2, &h.state).is_converged());
    assert_eq!(n(&h).reason.as_deref(), Some("disk swap"));
}
