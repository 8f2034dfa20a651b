//! The executor.
//!
//! MIG instances are named in plans by placement; the driver names them by id. The executor
//! learns the ids from an observation taken before it starts and from what each create returns.
//!
//! Applying happens in two rounds because the later phases depend on things that only exist
//! after the MIG phases (MIG UUIDs, GI/CI ids and so capability minors):
//! 1. run the plan's drain, MIG-mode and MIG-instance actions;
//! 2. if any of those ran, observe again (only the GPUs whose MIG state changed: see
//!    [`super::Observer::refresh`]) and plan again, then run the device, slice and MPS
//!    actions of that new plan (its MIG actions, if some remain because a step failed, are not
//!    retried in the same run); finally run the original plan's resume actions.
//!
//! MIG changes are transactional per GPU (see [`super::journal`]):
//! - before every mutating MIG step the journal records the GPU, its last good geometry, the
//!   target and the step;
//! - creates that fit next to the existing instances run before the destroys (so a GPU is
//!   never emptier than it must be), the others after;
//! - an instance with processes is never destroyed: right before each destroy the executor reads
//!   the processes of that GPU again and refuses without calling the effector;
//! - a failed step stops the remaining MIG steps of that GPU only (other GPUs proceed) and
//!   restores the destroyed instances of the last good geometry that still have room;
//! - a journal left by an earlier run (crash, failed step) is rolled forward by running the
//!   plan made from the observed state, or, for a GPU whose target the planner cannot reach
//!   any more, rolled back to the last good geometry.

use super::journal::{records_of, CiRecord, GiRecord, GpuTxn, Journal, JournalStore, Step};
use super::journal::{MemoryJournal, JOURNAL_VERSION};
use super::{EffectError, Host};
use crate::observe::{GpuState, MpsSpec, Observed};
use crate::plan::{self, Action, ActionKind, CiRef, GiRef, Phase, Plan};
use crate::policy::Policy;
use crate::profiles::{GpuModel, Placement};
use std::borrow::Cow;
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
    /// Steps that put back instances of the last good geometry after a failed step or, for a
    /// journal left by an earlier run, when its target could not be reached.
    pub restored: Vec<Action>,
    /// Actions of phases the host cannot carry out (e.g. slices without systemd), not run.
    pub not_run: Vec<Action>,
    /// GPUs whose MIG mode change is still pending, with the reason.
    pub pending: Vec<PendingMode>,
    /// What the journal of an earlier, unfinished apply said, when there was one.
    pub recovered: Vec<String>,
    /// The host as the run left it: read after its last step ([`Self::remaining`] was planned
    /// from it), with the GPUs it did not change taken from the observation it started from.
    pub end: Observed,
}

/// A GPU whose MIG mode change waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingMode {
    /// NVML index.
    pub index: u32,
    /// GPU UUID.
    pub gpu: String,
    /// `needs GPU reset: processes hold it (pid …)` or `reboot required: …`.
    pub reason: String,
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
    k.gpu().map(|(g, _)| g)
}

/// Holders of the instance at `placement` on `gpu` in `obs`: `pid 42 (train.service)`, or the
/// cgroup when the PID has no unit.
fn gi_holders(obs: &Observed, gpu: &str, placement: Placement) -> Vec<String> {
    obs.gpus
        .iter()
        .filter(|g| g.uuid == gpu)
        .flat_map(|g| g.mig.iter().flat_map(|m| &m.instances))
        .filter(|gi| gi.placement == placement)
        .flat_map(|gi| gi.compute.iter().flat_map(|c| &c.processes))
        .map(plan::mig::holder)
        .collect()
}

/// Everything an execution carries along.
struct Ctx<'a> {
    policy: &'a Policy,
    ids: Ids,
    journal: Journal,
    store: &'a mut dyn JournalStore,
    /// The latest observation; the processes of a GPU are read into it right before each
    /// destroy on that GPU, and the busy check reads them there.
    live: Observed,
    /// Phases the host can run; `None`: all.
    phases: Option<&'a BTreeSet<Phase>>,
    /// GPUs whose GPU reset failed in this run, with the error.
    reset_failed: BTreeMap<String, String>,
}

impl Ctx<'_> {
    /// Record `k` as the step about to run on `gpu`, durably, before it runs.
    fn announce(&mut self, gpu: &str, index: u32, k: &ActionKind) -> Result<(), EffectError> {
        self.journal.seq += 1;
        let seq = self.journal.seq;
        let txn = self.journal.gpus.entry(gpu.to_string()).or_insert(GpuTxn {
            index,
            ..Default::default()
        });
        txn.step = Some(Step {
            seq,
            action: k.clone(),
        });
        self.store.save(&self.journal)
    }

    fn runs(&self, p: Phase) -> bool {
        self.phases.is_none_or(|s| s.contains(&p))
    }
}

fn is_mutating_mig(k: &ActionKind) -> bool {
    matches!(
        k,
        ActionKind::SetMigMode { .. }
            | ActionKind::ResetGpu { .. }
            | ActionKind::DestroyCi { .. }
            | ActionKind::DestroyGi { .. }
            | ActionKind::CreateGi { .. }
            | ActionKind::CreateCi { .. }
    )
}

fn run_one<H: Host + ?Sized>(
    ctx: &mut Ctx<'_>,
    host: &mut H,
    k: &ActionKind,
) -> Result<(), EffectError> {
    // Busy instances are refused here, before the journal and the effector: the driver would
    // refuse too (IN_USE), but gpuctl must never even try to take an instance from a job. The
    // processes are read again first (that GPU only): a job may have started, or a drain
    // ended one, since the last observation.
    if let ActionKind::DestroyCi {
        ci: CiRef { gi, .. },
        ..
    }
    | ActionKind::DestroyGi { gi, .. } = k
    {
        host.refresh_processes(&mut ctx.live, &gi.gpu)?;
        let h = gi_holders(&ctx.live, &gi.gpu, gi.placement);
        if !h.is_empty() {
            let what = match k {
                ActionKind::DestroyCi { ci, .. } => ci.to_string(),
                _ => gi.to_string(),
            };
            return Err(EffectError::InUse {
                what: format!("{what} ({}): held by {}", gi.gpu, h.join(", ")),
            });
        }
    }
    if let Some((g, i)) = k.gpu().filter(|_| is_mutating_mig(k)) {
        ctx.announce(g, i, k)?;
    }
    let policy = ctx.policy;
    let ids = &mut ctx.ids;
    match k {
        ActionKind::StopUnits { units, .. } => host.stop_units(units, policy.host.drain_timeout),
        ActionKind::StartUnits { units, .. } => host.start_units(units),
        ActionKind::StopMps { instance } => host.stop_mps(instance),
        ActionKind::StartMps { instance, spec } => host.start_mps(instance, spec),
        ActionKind::SetMigMode { gpu, enable, .. } => host.set_mig_mode(gpu, *enable).map(|_| ()),
        ActionKind::ResetGpu { gpu, .. } => {
            if let Err(e) = host.reset_gpu(gpu) {
                ctx.reset_failed.insert(gpu.clone(), e.to_string());
                return Err(e);
            }
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
        ActionKind::WriteCdi {
            team,
            content,
            readers,
        } => host.write_cdi(team, content, readers),
        ActionKind::RemoveCdi { team } => host.remove_cdi(team),
        // From the observation the plan was made on: only what differs is sent.
        ActionKind::SetSlice { team, spec } => {
            host.update_slice(team, spec, ctx.live.slices.get(team))
        }
        ActionKind::RemoveSlice { team } => host.remove_slice(team),
        ActionKind::SetFence { slice, fence } => host.set_fence(slice, fence),
        ActionKind::SlurmDrain { node, reason } => host.drain_node(node, reason),
        ActionKind::WriteGres { path, content } => host.write_gres(path, content),
        ActionKind::SlurmReload { restart } => host.reload_slurm(restart),
        ActionKind::SlurmResume { node } => host.resume_node(node),
    }
}

/// Run `actions`, skipping MIG steps on a GPU after one of its steps failed (`failed_gpus`
/// carries that across calls) and leaving out phases the host cannot run.
fn run_all<'a, H: Host + ?Sized>(
    ctx: &mut Ctx<'_>,
    host: &mut H,
    actions: impl IntoIterator<Item = &'a Action>,
    failed_gpus: &mut BTreeSet<String>,
    report: &mut Report,
) {
    for a in actions {
        if !ctx.runs(a.phase) {
            report.not_run.push(a.clone());
            continue;
        }
        if gpu_of(&a.kind).is_some_and(|g| failed_gpus.contains(g)) {
            report.skipped.push(a.clone());
            continue;
        }
        match run_one(ctx, host, &a.kind) {
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

/// What exists on one GPU while its transaction runs: GI placement → (profile id, CI
/// placements).
type Present = BTreeMap<Placement, (u32, BTreeSet<Placement>)>;

fn present_of(g: Option<&GpuState>) -> Present {
    g.into_iter()
        .flat_map(|g| g.mig.iter().flat_map(|m| &m.instances))
        .map(|gi| {
            (
                gi.placement,
                (
                    gi.profile_id,
                    gi.compute.iter().map(|c| c.placement).collect(),
                ),
            )
        })
        .collect()
}

/// Whether a GI of `profile_id` at `p` can be created next to `present` (the driver's rules:
/// no overlap, compute-slice budget, per-profile and per-GPU instance limits). Unknown models
/// answer no, which only means the create waits for the destroys.
fn fits(model: Option<&GpuModel>, present: &Present, profile_id: u32, p: Placement) -> bool {
    let present: Vec<(u32, Placement)> = present.iter().map(|(q, (id, _))| (*id, *q)).collect();
    model.is_some_and(|m| {
        m.gi_profile_by_id(profile_id)
            .is_some_and(|prof| m.gi_has_room(&present, prof, p))
    })
}

/// A unit of work within one GPU's MIG-instances actions.
enum Group<'a> {
    /// Relabel (no hardware change).
    Owner(&'a Action),
    /// Destroy a GI: its CIs first, then the GI.
    Destroy(Vec<&'a Action>),
    /// Create a GI and its CIs.
    Create(Vec<&'a Action>),
}

fn groups<'a>(actions: &[&'a Action]) -> Vec<Group<'a>> {
    let mut out: Vec<Group<'a>> = Vec::new();
    let mut pending_cis: Vec<&'a Action> = Vec::new();
    for a in actions {
        match &a.kind {
            ActionKind::SetOwner { .. } => out.push(Group::Owner(a)),
            ActionKind::DestroyCi { .. } => pending_cis.push(a),
            ActionKind::DestroyGi { .. } => {
                let mut g = std::mem::take(&mut pending_cis);
                g.push(a);
                out.push(Group::Destroy(g));
            }
            ActionKind::CreateGi { .. } => out.push(Group::Create(vec![a])),
            ActionKind::CreateCi { ci, .. } => match out.last_mut() {
                Some(Group::Create(g)) if matches!(&g[0].kind, ActionKind::CreateGi { gi, .. } if gi.placement == ci.gi.placement) => {
                    g.push(a)
                }
                _ => out.push(Group::Create(vec![a])),
            },
            _ => out.push(Group::Create(vec![a])),
        }
    }
    // CI destroys without their GI (a split changes inside a kept GI) stay a group of their own.
    if !pending_cis.is_empty() {
        out.push(Group::Destroy(pending_cis));
    }
    out
}

/// Apply one action's effect on the model of what exists.
fn track(present: &mut Present, k: &ActionKind) {
    match k {
        ActionKind::CreateGi { gi, profile_id, .. } => {
            present.insert(gi.placement, (*profile_id, BTreeSet::new()));
        }
        ActionKind::CreateCi { ci, .. } => {
            if let Some((_, cis)) = present.get_mut(&ci.gi.placement) {
                cis.insert(ci.placement);
            }
        }
        ActionKind::DestroyCi { ci, .. } => {
            if let Some((_, cis)) = present.get_mut(&ci.gi.placement) {
                cis.remove(&ci.placement);
            }
        }
        ActionKind::DestroyGi { gi, .. } => {
            present.remove(&gi.placement);
        }
        _ => {}
    }
}

/// Run one group; `Err` after the first failed action (the rest are reported skipped).
fn run_group<H: Host + ?Sized>(
    ctx: &mut Ctx<'_>,
    host: &mut H,
    group: &[&Action],
    present: &mut Present,
    report: &mut Report,
) -> Result<(), ()> {
    for (i, a) in group.iter().enumerate() {
        match run_one(ctx, host, &a.kind) {
            Ok(()) => {
                track(present, &a.kind);
                report.done.push((*a).clone());
            }
            Err(e) => {
                // A GI whose create succeeded but whose labelling failed exists all the same.
                if let ActionKind::CreateGi { gi, .. } = &a.kind {
                    if ctx.ids.gi.contains_key(&(gi.gpu.clone(), gi.placement)) {
                        track(present, &a.kind);
                    }
                }
                report.failed.push(((*a).clone(), e));
                report
                    .skipped
                    .extend(group[i + 1..].iter().map(|a| (*a).clone()));
                return Err(());
            }
        }
    }
    Ok(())
}

/// The MIG-instances actions of one GPU, as a transaction: relabels, the creates that fit
/// now, the destroys, the other creates. On failure the rest is skipped and the last good
/// geometry is restored where it has room.
#[allow(clippy::too_many_arguments)]
fn run_gpu_txn<H: Host + ?Sized>(
    ctx: &mut Ctx<'_>,
    host: &mut H,
    gpu: &str,
    index: u32,
    model: Option<&'static GpuModel>,
    actions: &[&Action],
    present: &mut Present,
    report: &mut Report,
) -> bool {
    let gs = groups(actions);
    let mut order: Vec<&Group<'_>> = gs.iter().filter(|g| matches!(g, Group::Owner(_))).collect();
    let mut sim = present.clone();
    let mut early = BTreeSet::new();
    for (i, g) in gs.iter().enumerate() {
        if let Group::Create(acts) = g {
            if let ActionKind::CreateGi { gi, profile_id, .. } = &acts[0].kind {
                if fits(model, &sim, *profile_id, gi.placement) {
                    sim.insert(gi.placement, (*profile_id, BTreeSet::new()));
                    early.insert(i);
                    order.push(g);
                }
            }
        }
    }
    order.extend(gs.iter().filter(|g| matches!(g, Group::Destroy(_))));
    order.extend(
        gs.iter()
            .enumerate()
            .filter(|(i, g)| matches!(g, Group::Create(_)) && !early.contains(i))
            .map(|(_, g)| g),
    );

    let mut ok = true;
    for g in order {
        let acts: Vec<&Action> = match g {
            Group::Owner(a) => vec![*a],
            Group::Destroy(v) | Group::Create(v) => v.clone(),
        };
        if !ok {
            report.skipped.extend(acts.into_iter().cloned());
            continue;
        }
        ok = run_group(ctx, host, &acts, present, report).is_ok();
    }
    if !ok {
        if let Some(txn) = ctx.journal.gpus.get_mut(gpu) {
            txn.failed = report.failed.last().map(|(_, e)| e.to_string());
        }
        restore(ctx, host, gpu, index, present, report);
    }
    ok
}

/// Put back the last good geometry where it has room: missing CIs of GIs that are still there,
/// and GIs that are gone and whose slices are free. Nothing is destroyed.
fn restore<H: Host + ?Sized>(
    ctx: &mut Ctx<'_>,
    host: &mut H,
    gpu: &str,
    index: u32,
    present: &mut Present,
    report: &mut Report,
) {
    let Some(last_good) = ctx.journal.gpus.get(gpu).map(|t| t.last_good.clone()) else {
        return;
    };
    let gi_ref = |p: Placement| GiRef {
        gpu: gpu.to_string(),
        index,
        placement: p,
    };
    for rec in &last_good {
        let mut acts = Vec::new();
        match present.get(&rec.placement) {
            Some((pid, _)) if *pid != rec.profile_id => continue,
            Some(_) => {}
            None if present.keys().any(|q| q.overlaps(&rec.placement)) => continue,
            None => acts.push(ActionKind::CreateGi {
                gi: gi_ref(rec.placement),
                profile: rec.profile.clone(),
                profile_id: rec.profile_id,
                owner: rec.owner.clone().unwrap_or_default(),
            }),
        }
        let have: BTreeSet<Placement> = present
            .get(&rec.placement)
            .map(|(_, c)| c.clone())
            .unwrap_or_default();
        for c in &rec.cis {
            if !have.iter().any(|h| h.overlaps(&c.placement)) {
                acts.push(ActionKind::CreateCi {
                    ci: CiRef {
                        gi: gi_ref(rec.placement),
                        placement: c.placement,
                    },
                    profile: c.profile.clone(),
                    profile_id: c.profile_id,
                });
            }
        }
        for k in acts {
            let a = Action {
                phase: Phase::MigInstances,
                kind: k,
                reason: "restore the last good geometry after a failed step".into(),
            };
            let res = match &a.kind {
                // An instance that had no owner label gets none back.
                ActionKind::CreateGi {
                    gi,
                    profile_id,
                    owner,
                    ..
                } if owner.is_empty() => ctx.announce(gpu, index, &a.kind).and_then(|()| {
                    let id = host.create_gi(gpu, *profile_id, gi.placement)?;
                    ctx.ids.gi.insert((gpu.to_string(), gi.placement), id);
                    Ok(())
                }),
                k => run_one(ctx, host, k),
            };
            match res {
                Ok(()) => {
                    track(present, &a.kind);
                    report.restored.push(a);
                }
                Err(e) => {
                    report.failed.push((a, e));
                    break;
                }
            }
        }
    }
}

fn mig_gpus(plan: &Plan) -> BTreeMap<String, u32> {
    plan.actions
        .iter()
        .filter(|a| matches!(a.phase, Phase::MigMode | Phase::MigInstances))
        .filter_map(|a| a.kind.gpu().map(|(g, i)| (g.to_string(), i)))
        .collect()
}

/// The instances `plan` leaves on `g`: the observed ones minus the destroyed, plus the created.
fn target_of(g: &GpuState, plan: &Plan) -> Vec<GiRecord> {
    let mut t: BTreeMap<Placement, GiRecord> = records_of(g)
        .into_iter()
        .map(|r| (r.placement, r))
        .collect();
    for a in plan
        .actions
        .iter()
        .filter(|a| gpu_of(&a.kind) == Some(&g.uuid))
    {
        match &a.kind {
            ActionKind::ResetGpu { .. } => t.clear(),
            ActionKind::DestroyGi { gi, .. } => {
                t.remove(&gi.placement);
            }
            ActionKind::DestroyCi { ci, .. } => {
                if let Some(r) = t.get_mut(&ci.gi.placement) {
                    r.cis.retain(|c| c.placement != ci.placement);
                }
            }
            ActionKind::CreateGi {
                gi,
                profile,
                profile_id,
                owner,
            } => {
                t.insert(
                    gi.placement,
                    GiRecord {
                        profile_id: *profile_id,
                        profile: profile.clone(),
                        placement: gi.placement,
                        owner: Some(owner.clone()),
                        cis: vec![],
                    },
                );
            }
            ActionKind::CreateCi {
                ci,
                profile,
                profile_id,
            } => {
                if let Some(r) = t.get_mut(&ci.gi.placement) {
                    r.cis.push(CiRecord {
                        profile_id: *profile_id,
                        profile: profile.clone(),
                        placement: ci.placement,
                    });
                }
            }
            ActionKind::SetOwner { gi, to, .. } => {
                if let Some(r) = t.get_mut(&gi.placement) {
                    r.owner = Some(to.clone());
                }
            }
            _ => {}
        }
    }
    t.into_values().collect()
}

/// GPUs of an earlier, unfinished transaction whose target the planner can no longer reach:
/// MIG is on and the plan leaves the layout alone with a GPU-wide blocked entry.
fn unreachable_gpus(j: &Journal, plan: &Plan, obs: &Observed) -> Vec<String> {
    j.gpus
        .keys()
        .filter(|u| {
            obs.gpus
                .iter()
                .any(|g| &g.uuid == *u && g.mig.as_ref().is_some_and(|m| m.current))
                && plan.blocked.iter().any(|b| &b.gpu == *u && b.gi.is_none())
        })
        .cloned()
        .collect()
}

/// Carry out `plan` (computed from `policy` against the host's state) on `host`, re-planning the
/// device, slice and MPS phases after the MIG phases. The journal is kept in memory: use
/// [`execute_with`] on a real host. Errors of single actions are collected in the report; only
/// a failed observation aborts.
pub fn execute<H: Host + ?Sized>(
    policy: &Policy,
    plan: &Plan,
    host: &mut H,
) -> Result<Report, EffectError> {
    execute_with(policy, plan, host, &mut MemoryJournal::default(), None)
}

/// [`execute`] with a journal store and, optionally, the set of phases the host can run (the
/// actions of other phases are reported in [`Report::not_run`]).
pub fn execute_with<H: Host + ?Sized>(
    policy: &Policy,
    plan: &Plan,
    host: &mut H,
    store: &mut dyn JournalStore,
    phases: Option<&BTreeSet<Phase>>,
) -> Result<Report, EffectError> {
    let before = host.observe()?;
    execute_observed(policy, plan, before, host, store, phases)
}

/// [`execute_with`] for a caller that has just observed the host and made `plan` from that
/// observation, `before`: the host is not observed again at the start. After the MIG phases
/// only the GPUs whose MIG state this run changed are queried again ([`super::Observer::refresh`]);
/// a run that changed no MIG state queries no GPU again; the busy checks read the processes
/// of the GPU concerned right before each destroy.
pub fn execute_observed<H: Host + ?Sized>(
    policy: &Policy,
    plan: &Plan,
    mut before: Observed,
    host: &mut H,
    store: &mut dyn JournalStore,
    phases: Option<&BTreeSet<Phase>>,
) -> Result<Report, EffectError> {
    let mut report = Report::default();
    let journal = store.load()?.unwrap_or(Journal {
        version: JOURNAL_VERSION,
        ..Default::default()
    });
    let mut ctx = Ctx {
        policy,
        ids: Ids::from(&before),
        journal,
        store,
        live: before.clone(),
        phases,
        reset_failed: BTreeMap::new(),
    };
    let mut plan = Cow::Borrowed(plan);

    // An earlier apply did not finish: roll forward (the plan from the observed state does
    // that), or back where the target cannot be reached any more.
    if !ctx.journal.gpus.is_empty() {
        for (u, t) in &ctx.journal.gpus {
            report.recovered.push(format!(
                "gpu {} ({u}): unfinished MIG transaction{}{}",
                t.index,
                t.step
                    .as_ref()
                    .map(|s| format!(", last step #{}: {}", s.seq, s.action))
                    .unwrap_or_default(),
                t.failed
                    .as_ref()
                    .map(|f| format!(", failed: {f}"))
                    .unwrap_or_default()
            ));
        }
        let back = unreachable_gpus(&ctx.journal, &plan, &before);
        let mut changed = false;
        for u in &back {
            let g = before.gpus.iter().find(|g| &g.uuid == u).cloned();
            let Some(g) = g else { continue };
            let mut present = present_of(Some(&g));
            let n = report.restored.len();
            restore(&mut ctx, host, u, g.index, &mut present, &mut report);
            changed |= report.restored.len() > n;
            report
                .recovered
                .push(format!("gpu {}: target unreachable, rolled back", g.index));
            ctx.journal.gpus.remove(u);
        }
        if changed {
            before = host.refresh(&before, &back.iter().cloned().collect())?;
            ctx.ids = Ids::from(&before);
            ctx.live = before.clone();
            plan = Cow::Owned(plan::plan(policy, &before));
        }
    }

    // Open (or extend) the transaction of every GPU the plan changes.
    for (u, index) in mig_gpus(&plan) {
        let Some(g) = before.gpus.iter().find(|g| g.uuid == u) else {
            continue;
        };
        let target = target_of(g, &plan);
        let t = ctx.journal.gpus.entry(u.clone()).or_insert(GpuTxn {
            index,
            // The geometry before the first of possibly several attempts stays the one to
            // fall back to.
            last_good: records_of(g),
            ..Default::default()
        });
        t.target = target;
    }

    let mut failed_gpus = BTreeSet::new();
    // No observation after a drain: every destroy reads the processes of its GPU first, so the
    // busy checks see the processes the drain ended as gone, and only those.
    // Withdrawals run before MIG changes: a destroyed instance's capability minor can come
    // back for another team's new instance.
    for phase in [Phase::Drain, Phase::Fence, Phase::MigMode] {
        let actions = plan.actions.iter().filter(|a| a.phase == phase);
        run_all(&mut ctx, host, actions, &mut failed_gpus, &mut report);
    }

    let mut by_gpu: BTreeMap<(u32, String), Vec<&Action>> = BTreeMap::new();
    for a in plan
        .actions
        .iter()
        .filter(|a| a.phase == Phase::MigInstances)
    {
        if let Some((g, i)) = a.kind.gpu() {
            by_gpu.entry((i, g.to_string())).or_default().push(a);
        }
    }
    for ((index, gpu), acts) in by_gpu {
        if !ctx.runs(Phase::MigInstances) {
            report.not_run.extend(acts.into_iter().cloned());
            continue;
        }
        if failed_gpus.contains(&gpu) {
            report.skipped.extend(acts.into_iter().cloned());
            continue;
        }
        let g = ctx.live.gpus.iter().find(|g| g.uuid == gpu).cloned();
        let model = g.as_ref().and_then(plan::desired::model_of);
        // After a mode change or reset in this run no instance is left from the observation.
        let mode_ran = report
            .done
            .iter()
            .any(|a| a.phase == Phase::MigMode && gpu_of(&a.kind) == Some(gpu.as_str()));
        let mut present = if mode_ran {
            Present::new()
        } else {
            present_of(g.as_ref())
        };
        if !run_gpu_txn(
            &mut ctx,
            host,
            &gpu,
            index,
            model,
            &acts,
            &mut present,
            &mut report,
        ) {
            failed_gpus.insert(gpu);
        }
    }

    // GPUs whose MIG state this run may have changed: a failed step may have changed it too.
    let touched: BTreeSet<String> = report
        .done
        .iter()
        .chain(report.failed.iter().map(|(a, _)| a))
        .chain(&report.restored)
        .filter(|a| matches!(a.phase, Phase::MigMode | Phase::MigInstances))
        .filter(|a| is_mutating_mig(&a.kind))
        .filter_map(|a| gpu_of(&a.kind).map(str::to_string))
        .collect();
    let ran_mig = plan
        .actions
        .iter()
        .any(|a| matches!(a.phase, Phase::MigMode | Phase::MigInstances));
    // The host as it is now, as far as this run can tell without querying GPUs it left alone.
    let replanned = ran_mig || plan.replan_after_mig;
    let (mut now, second) = if replanned {
        let now = host.refresh(&ctx.live, &touched)?;
        let second = plan::plan(policy, &now);
        (now, second)
    } else {
        (ctx.live.clone(), plan.clone().into_owned())
    };
    let later: Vec<&Action> = second
        .actions
        .iter()
        .filter(|a| {
            matches!(a.phase, Phase::Devices | Phase::Slices | Phase::Mps)
                // The first round ran this plan's fence phase; a new plan's is still to run.
                || (replanned && a.phase == Phase::Fence)
                // Daemons on devices that went away in round one show up as stops now.
                || matches!(a.kind, ActionKind::StopMps { .. })
        })
        .collect();
    // The slice and MPS steps compare against what is there now (update_slice sends only what
    // differs from it).
    ctx.live = now.clone();
    let starts: Vec<(&str, &MpsSpec)> = later
        .iter()
        .filter(|a| ctx.runs(a.phase))
        .filter_map(|a| match &a.kind {
            ActionKind::StartMps { instance, spec } => Some((instance.as_str(), spec)),
            _ => None,
        })
        .collect();
    if !starts.is_empty() {
        // Not final (MpsEffector::prepare_mps): each start does its own work then.
        let _ = host.prepare_mps(&starts);
    }
    run_all(&mut ctx, host, later, &mut failed_gpus, &mut report);

    let resume = plan.actions.iter().filter(|a| a.phase == Phase::Resume);
    run_all(&mut ctx, host, resume, &mut failed_gpus, &mut report);

    // The device, slice, MPS and resume phases change no GPU: the files and systemd are read
    // again, the GPUs are taken from `now`.
    now = host.refresh(&now, &BTreeSet::new())?;
    report.end = now;
    report.remaining = plan::plan(policy, &report.end);

    // A GPU's transaction ends when nothing MIG-related remains for it.
    let open = mig_gpus(&report.remaining);
    let rem = &report.remaining;
    ctx.journal
        .gpus
        .retain(|u, _| open.contains_key(u) || rem.blocked.iter().any(|b| &b.gpu == u));
    for t in ctx.journal.gpus.values_mut() {
        t.step = None;
    }
    if ctx.journal.gpus.is_empty() {
        ctx.store.clear()?;
    } else {
        ctx.store.save(&ctx.journal)?;
    }

    for g in &report.end.gpus {
        let Some(m) = g.mig.as_ref().filter(|m| m.is_pending()) else {
            continue;
        };
        let procs: Vec<String> = g
            .processes
            .iter()
            .map(|p| match &p.unit {
                Some(u) => format!("pid {} ({u})", p.pid),
                None => format!("pid {}", p.pid),
            })
            .collect();
        let reason = if !procs.is_empty() {
            format!("needs GPU reset: processes hold it ({})", procs.join(", "))
        } else if let Some(e) = ctx.reset_failed.get(&g.uuid) {
            format!("reboot required: the GPU reset failed: {e}")
        } else {
            format!(
                "needs GPU reset to turn MIG {}",
                if m.pending { "on" } else { "off" }
            )
        };
        report.pending.push(PendingMode {
            index: g.index,
            gpu: g.uuid.clone(),
            reason,
        });
    }
    Ok(report)
}
