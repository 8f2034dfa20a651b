//! The executor.
//!
//! MIG instances are named in plans by placement; the driver names them by id. The executor
//! learns the ids from an observation taken before it starts and from what each create returns.
//!
//! Applying happens in two rounds because the later phases depend on things that only exist
//! after the MIG phases (MIG UUIDs, GI/CI ids and so capability minors):
//! 1. run the plan's drain, MIG-mode and MIG-instance actions;
//! 2. if any of those ran, observe again and plan again, then run the device, slice and MPS
//!    actions of that new plan (its MIG actions, if some remain because a step failed, are not
//!    retried in the same run); finally run the original plan's resume actions.
//!
//! A failed MIG step stops the remaining MIG steps of that GPU only, so one GPU's trouble never
//! leaves another half-done, and nothing is destroyed after a create failed.

use super::{EffectError, Host};
use crate::observe::Observed;
use crate::plan::{self, Action, ActionKind, Phase, Plan};
use crate::policy::Policy;
use crate::profiles::Placement;
use std::collections::{BTreeMap, BTreeSet};

/// What an execution did.
#[derive(Debug, Default)]
pub struct Report {
    /// Actions carried out, in order (second-round actions included).
    pub done: Vec<Action>,
    /// Actions that failed, with the error.
    pub failed: Vec<(Action, EffectError)>,
    /// Actions skipped because an earlier step on the same GPU failed.
    pub skipped: Vec<Action>,
    /// The plan computed against the host after execution: empty when converged.
    pub remaining: Plan,
}

/// Driver ids of instances by placement, per GPU UUID.
#[derive(Default)]
struct Ids {
    gi: BTreeMap<(String, Placement), u32>,
    ci: BTreeMap<(String, Placement, Placement), u32>,
}

impl Ids {
    fn from(obs: &Observed) -> Self {
        let mut ids = Ids::default();
        for g in &obs.gpus {
            for gi in g.mig.iter().flat_map(|m| &m.instances) {
                ids.gi.insert((g.uuid.clone(), gi.placement), gi.id);
                for ci in &gi.compute {
                    ids.ci
                        .insert((g.uuid.clone(), gi.placement, ci.placement), ci.id);
                }
            }
        }
        ids
    }

    fn gi(&self, gpu: &str, p: Placement) -> Result<u32, EffectError> {
        self.gi
            .get(&(gpu.to_string(), p))
            .copied()
            .ok_or_else(|| EffectError::Other {
                what: format!("{gpu} gi@{}+{}", p.start, p.size),
                message: "no GPU instance at this placement".into(),
            })
    }

    fn ci(&self, gpu: &str, gi: Placement, ci: Placement) -> Result<u32, EffectError> {
        self.ci
            .get(&(gpu.to_string(), gi, ci))
            .copied()
            .ok_or_else(|| EffectError::Other {
                what: format!(
                    "{gpu} gi@{}+{} ci@{}+{}",
                    gi.start, gi.size, ci.start, ci.size
                ),
                message: "no compute instance at this placement".into(),
            })
    }

    fn forget_gpu(&mut self, gpu: &str) {
        self.gi.retain(|(g, _), _| g != gpu);
        self.ci.retain(|(g, _, _), _| g != gpu);
    }
}

/// The GPU UUID an action concerns.
fn gpu_of(k: &ActionKind) -> Option<&str> {
    match k {
        ActionKind::SetMigMode { gpu, .. } | ActionKind::ResetGpu { gpu, .. } => Some(gpu),
        ActionKind::DestroyCi { ci, .. } | ActionKind::CreateCi { ci, .. } => Some(&ci.gi.gpu),
        ActionKind::DestroyGi { gi, .. }
        | ActionKind::CreateGi { gi, .. }
        | ActionKind::SetOwner { gi, .. } => Some(&gi.gpu),
        _ => None,
    }
}

fn run_one<H: Host + ?Sized>(
    policy: &Policy,
    host: &mut H,
    ids: &mut Ids,
    k: &ActionKind,
) -> Result<(), EffectError> {
    match k {
        ActionKind::StopUnits { units, .. } => host.stop_units(units, policy.host.drain_timeout),
        ActionKind::StartUnits { units, .. } => host.start_units(units),
        ActionKind::StopMps { instance } => host.stop_mps(instance),
        ActionKind::StartMps { instance, spec } => host.start_mps(instance, spec),
        ActionKind::SetMigMode { gpu, enable, .. } => host.set_mig_mode(gpu, *enable).map(|_| ()),
        ActionKind::ResetGpu { gpu, .. } => {
            host.reset_gpu(gpu)?;
            // Instances never survive a reset.
            ids.forget_gpu(gpu);
            Ok(())
        }
        ActionKind::DestroyCi { ci, .. } => {
            let g = ids.gi(&ci.gi.gpu, ci.gi.placement)?;
            let c = ids.ci(&ci.gi.gpu, ci.gi.placement, ci.placement)?;
            host.destroy_ci(&ci.gi.gpu, g, c)?;
            ids.ci
                .remove(&(ci.gi.gpu.clone(), ci.gi.placement, ci.placement));
            Ok(())
        }
        ActionKind::DestroyGi { gi, .. } => {
            let g = ids.gi(&gi.gpu, gi.placement)?;
            host.destroy_gi(&gi.gpu, g)?;
            ids.gi.remove(&(gi.gpu.clone(), gi.placement));
            Ok(())
        }
        ActionKind::CreateGi {
            gi,
            profile_id,
            owner,
            ..
        } => {
            let id = host.create_gi(&gi.gpu, *profile_id, gi.placement)?;
            ids.gi.insert((gi.gpu.clone(), gi.placement), id);
            host.set_owner(&gi.gpu, id, owner)
        }
        ActionKind::CreateCi { ci, profile_id, .. } => {
            let g = ids.gi(&ci.gi.gpu, ci.gi.placement)?;
            let id = host.create_ci(&ci.gi.gpu, g, *profile_id, ci.placement)?;
            ids.ci
                .insert((ci.gi.gpu.clone(), ci.gi.placement, ci.placement), id);
            Ok(())
        }
        ActionKind::SetOwner { gi, to, .. } => {
            let g = ids.gi(&gi.gpu, gi.placement)?;
            host.set_owner(&gi.gpu, g, to)
        }
        ActionKind::CreateCapNodes { minors } => host.create_cap_nodes(minors),
        ActionKind::WriteEnv { team, content } => host.write_env(team, content),
        ActionKind::RemoveEnv { team } => host.remove_env(team),
        ActionKind::SetSlice { team, spec } => host.set_slice(team, spec),
        ActionKind::RemoveSlice { team } => host.remove_slice(team),
    }
}

/// Run `actions`, skipping MIG steps on a GPU after one of its steps failed.
fn run_all<'a, H: Host + ?Sized>(
    policy: &Policy,
    host: &mut H,
    ids: &mut Ids,
    actions: impl IntoIterator<Item = &'a Action>,
    report: &mut Report,
) {
    let mut failed_gpus: BTreeSet<String> = BTreeSet::new();
    for a in actions {
        if let Some(g) = gpu_of(&a.kind) {
            if failed_gpus.contains(g) {
                report.skipped.push(a.clone());
                continue;
            }
        }
        match run_one(policy, host, ids, &a.kind) {
            Ok(()) => report.done.push(a.clone()),
            Err(e) => {
                if let Some(g) = gpu_of(&a.kind) {
                    failed_gpus.insert(g.to_string());
                }
                report.failed.push((a.clone(), e));
            }
        }
    }
}

fn is_mig_round(p: Phase) -> bool {
    matches!(p, Phase::Drain | Phase::MigMode | Phase::MigInstances)
}

/// Carry out `plan` (computed from `policy` against the host's state) on `host`, re-planning the
/// device, slice and MPS phases after the MIG phases. Errors of single actions are collected in
/// the report; only a failed observation aborts.
pub fn execute<H: Host + ?Sized>(
    policy: &Policy,
    plan: &Plan,
    host: &mut H,
) -> Result<Report, EffectError> {
    let mut report = Report::default();
    let before = host.observe()?;
    let mut ids = Ids::from(&before);

    let first: Vec<&Action> = plan
        .actions
        .iter()
        .filter(|a| is_mig_round(a.phase))
        .collect();
    run_all(policy, host, &mut ids, first.iter().copied(), &mut report);

    let ran_mig = first
        .iter()
        .any(|a| matches!(a.phase, Phase::MigMode | Phase::MigInstances));
    let second = if ran_mig || plan.replan_after_mig {
        plan::plan(policy, &host.observe()?)
    } else {
        plan.clone()
    };
    let later: Vec<&Action> = second
        .actions
        .iter()
        .filter(|a| {
            matches!(a.phase, Phase::Devices | Phase::Slices | Phase::Mps)
                // Daemons on devices that went away in round one show up as stops now.
                || matches!(a.kind, ActionKind::StopMps { .. })
        })
        .collect();
    run_all(policy, host, &mut ids, later, &mut report);

    let resume = plan.actions.iter().filter(|a| a.phase == Phase::Resume);
    run_all(policy, host, &mut ids, resume, &mut report);

    report.remaining = plan::plan(policy, &host.observe()?);
    Ok(report)
}
