//! MIG planning for one GPU: the keep/destroy/create decision.
//!
//! Where instances go is decided by [`crate::geometry::fit`], the exact placement search that
//! policy validation uses too; this module decides *which* existing instances stay. It tries every
//! subset of the reusable existing instances, biggest first, and keeps the first one around which
//! the remaining instances fit, so when no fit exists around everything it releases the smallest
//! set of idle instances. A GPU holds at most `max_mig_device_count` (7) instances, so there are
//! at most 128 subsets.
//!
//! `reconfigure` decides what may go: `when-idle` releases idle instances only, `drain` also
//! those whose processes all belong to units it can stop, and `never` releases and relabels
//! nothing; it only creates instances in free slices and reports the rest as blocked.

use super::{ActionKind, Blocked, CiRef, GiRef};
use crate::geometry::{fit, fit_compute, Misfit};
use crate::observe::{ComputeInstance, GpuInstance, GpuProcess, GpuState};
use crate::policy::{MigSpec, Reconfigure};
use crate::profiles::{CiProfile, GiProfile, GpuModel, Placement};
use std::collections::{BTreeMap, BTreeSet};

/// One GPU instance the policy asks for.
#[derive(Debug, Clone)]
pub struct Slot<'m> {
    /// GI profile.
    pub gi: &'m GiProfile,
    /// Owning team.
    pub owner: String,
    /// Compute instances, with their placements inside the GI (found when the slot was built).
    pub cis: Vec<(&'m CiProfile, Placement)>,
}

impl Slot<'_> {
    fn key(&self) -> Key {
        let mut cis: Vec<u32> = self.cis.iter().map(|(c, _)| c.id).collect();
        cis.sort_unstable();
        (self.gi.id, cis)
    }
}

/// GI profile id and the sorted CI profile ids: what must match for an instance to be reused.
type Key = (u32, Vec<u32>);

fn gi_key(gi: &GpuInstance) -> Key {
    let mut cis: Vec<u32> = gi.compute.iter().map(|c| c.profile_id).collect();
    cis.sort_unstable();
    (gi.profile_id, cis)
}

/// Expand a MIG geometry into slots, resolving the compute split of each. Problems (unknown
/// profiles, splits that do not fit) become blocked entries and the slot is dropped.
pub fn slots<'m>(
    model: &'m GpuModel,
    specs: &[MigSpec],
    gpu: &GpuState,
    blocked: &mut Vec<Blocked>,
) -> Vec<Slot<'m>> {
    let mut out = Vec::new();
    let mut block = |reason: String| blocked.push(gpu_blocked(gpu, None, vec![], reason));
    for spec in specs {
        let Some(gi) = model.gi_profile(&spec.profile) else {
            block(format!(
                "MIG profile {} does not exist on {}",
                spec.profile, model.nvml_name
            ));
            continue;
        };
        let names: Vec<String> = if spec.compute.is_empty() {
            vec![gi.name.clone()]
        } else {
            spec.compute.clone()
        };
        let mut cis = Vec::new();
        for n in &names {
            match model.ci_profile(&gi.name, n) {
                Some(c) => cis.push(c),
                None => block(format!(
                    "compute profile {n} does not exist in a {} instance",
                    gi.name
                )),
            }
        }
        if cis.len() != names.len() {
            continue;
        }
        let places = match fit_compute(gi, &cis) {
            Ok(p) => p,
            Err(m) => {
                block(format!(
                    "compute split {} does not fit in a {} instance: {m}",
                    names.join(","),
                    gi.name
                ));
                continue;
            }
        };
        let cis: Vec<_> = cis.into_iter().zip(places).collect();
        out.extend((0..spec.count).map(|_| Slot {
            gi,
            owner: spec.owner.to_string(),
            cis: cis.clone(),
        }));
    }
    out
}

/// A GPU instance as it will be after the plan: kept, created, or left alone.
#[derive(Debug, Clone, PartialEq)]
pub struct LayoutGi {
    /// GI profile name.
    pub profile: String,
    /// GI profile id.
    pub profile_id: u32,
    /// Placement in memory slices.
    pub placement: Placement,
    /// Owner after the plan.
    pub owner: Option<String>,
    /// Driver id when the instance exists now and stays.
    pub existing: Option<u32>,
    /// Compute instances.
    pub cis: Vec<LayoutCi>,
}

/// A compute instance as it will be after the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct LayoutCi {
    /// CI profile name.
    pub profile: String,
    /// CI profile id.
    pub profile_id: u32,
    /// Placement in the GI's compute slices.
    pub placement: Placement,
    /// Driver id and MIG UUID when the instance exists now and stays.
    pub existing: Option<(u32, String)>,
}

impl LayoutGi {
    /// The layout entry of an instance that stays as it is.
    pub fn from_existing(gi: &GpuInstance) -> Self {
        LayoutGi {
            profile: gi.profile.clone(),
            profile_id: gi.profile_id,
            placement: gi.placement,
            owner: gi.owner.clone(),
            existing: Some(gi.id),
            cis: gi
                .compute
                .iter()
                .map(|c| LayoutCi {
                    profile: c.profile.clone(),
                    profile_id: c.profile_id,
                    placement: c.placement,
                    existing: Some((c.id, c.uuid.clone())),
                })
                .collect(),
        }
    }
}

/// What the planner decided for the MIG side of one GPU.
#[derive(Debug, Default)]
pub struct MigOutcome {
    /// Actions of the MIG-mode phase, with reasons.
    pub mode: Vec<(ActionKind, String)>,
    /// Actions of the MIG-instances phase, with reasons.
    pub instances: Vec<(ActionKind, String)>,
    /// Instances present after the plan (empty when MIG ends up off or not yet on).
    pub layout: Vec<LayoutGi>,
    /// Changes held back.
    pub blocked: Vec<Blocked>,
    /// Units to stop before, and start after, the change: (team, unit).
    pub drain: BTreeSet<(String, String)>,
    /// MIG device UUIDs that go away (their MPS daemons must stop first).
    pub removed_devices: BTreeSet<String>,
    /// Whether the GPU's MIG mode changes (whole-GPU MPS daemons must stop first).
    pub mode_changes: bool,
}

impl MigOutcome {
    /// Change the MIG mode of `gpu` (whole-GPU MPS daemons stop first).
    fn set_mode(&mut self, gpu: &GpuState, enable: bool, why: String) {
        let (uuid, index) = (gpu.uuid.clone(), gpu.index);
        let k = ActionKind::SetMigMode {
            gpu: uuid,
            index,
            enable,
        };
        self.mode.push((k, why));
        self.mode_changes = true;
    }

    fn reset(&mut self, gpu: &GpuState, why: String) {
        let (uuid, index) = (gpu.uuid.clone(), gpu.index);
        self.mode
            .push((ActionKind::ResetGpu { gpu: uuid, index }, why));
    }
}

/// `pid 4242 (train.service)`, or `pid 4242 (cgroup /user.slice/…)` for a PID outside any
/// service or scope, so that whoever must free the instance knows where to look.
pub fn holder(p: &GpuProcess) -> String {
    match (&p.unit, &p.cgroup) {
        (Some(u), _) => format!("pid {} ({u})", p.pid),
        (None, Some(cg)) => format!("pid {} (cgroup {cg})", p.pid),
        (None, None) => format!("pid {}", p.pid),
    }
}

/// The team of a process from its cgroup (`…/gpu-<team>.slice/…`), `None` outside team slices.
pub(crate) fn team_of_process(p: &GpuProcess) -> Option<&str> {
    crate::names::cgroup_place(p.cgroup.as_deref()?).map(|c| c.team)
}

/// The team a process belongs to: the instance owner, else the `gpu-<team>.slice` in its cgroup.
fn process_team(p: &GpuProcess, owner: Option<&str>) -> String {
    owner
        .or_else(|| team_of_process(p))
        .unwrap_or("unmanaged")
        .to_string()
}

pub(crate) fn gpu_blocked(
    gpu: &GpuState,
    gi: Option<GiRef>,
    holders: Vec<String>,
    reason: String,
) -> Blocked {
    Blocked {
        index: gpu.index,
        gpu: gpu.uuid.clone(),
        gi,
        holders,
        reason,
    }
}

fn gi_ref(gpu: &GpuState, placement: Placement) -> GiRef {
    GiRef {
        gpu: gpu.uuid.clone(),
        index: gpu.index,
        placement,
    }
}

fn gi_procs(gi: &GpuInstance) -> Vec<&GpuProcess> {
    gi.compute.iter().flat_map(|c| c.processes.iter()).collect()
}

/// The unit gpuctl may stop to free a device held by `p`, and start again afterwards, or why it
/// may not (issue 17, "safe drain"). Only a system service inside a team slice
/// (`…/gpu-<team>.slice/<x>.service`) qualifies:
/// - a login session (`session-N.scope`) is someone's whole SSH login, never a job;
/// - a unit under `user@UID.service` belongs to a user manager: stopping its name through the
///   system manager would stop something else or nothing;
/// - a transient scope (`gpuctl-run-*.scope`, `run-*.scope`) cannot be started again after a
///   drain, so stopping it would kill the job for good;
/// - a service outside a team slice is not a team's job.
///
/// Without a cgroup (simulated hosts), a `.service` that is not a user manager counts.
pub fn drain_unit(p: &GpuProcess) -> Result<&str, String> {
    let Some(unit) = p.unit.as_deref() else {
        return Err("no systemd unit".into());
    };
    if let Some(cg) = p.cgroup.as_deref() {
        let parts: Vec<&str> = cg.split('/').filter(|c| !c.is_empty()).collect();
        if let Some(s) = parts
            .iter()
            .find(|c| c.starts_with("session-") && c.ends_with(".scope"))
        {
            return Err(format!("login session {s}"));
        }
        if let Some(u) = parts
            .iter()
            .find(|c| c.starts_with("user@") && c.ends_with(".service"))
        {
            return Err(format!("a unit of the user manager {u}"));
        }
        if unit.ends_with(".scope") {
            return Err(format!("transient scope {unit} cannot be started again"));
        }
        let in_team_slice = crate::names::cgroup_place(cg).and_then(|c| c.unit) == Some(unit);
        if !in_team_slice {
            return Err(format!("{unit} is not a service in a team slice"));
        }
        return Ok(unit);
    }
    if unit.starts_with("user@") || !unit.ends_with(".service") {
        return Err(format!("{unit} is not a system service gpuctl can restart"));
    }
    Ok(unit)
}

/// Whether processes can be moved out of the way: only by draining, and only when each is held
/// by a unit [`drain_unit`] accepts (a bare PID in someone's shell is never killed).
fn drainable(procs: &[&GpuProcess], reconf: Reconfigure) -> bool {
    procs.is_empty()
        || (reconf == Reconfigure::Drain && procs.iter().all(|p| drain_unit(p).is_ok()))
}

fn add_drain(out: &mut MigOutcome, procs: &[&GpuProcess], owner: Option<&str>) {
    for p in procs {
        if let Ok(u) = drain_unit(p) {
            out.drain.insert((process_team(p, owner), u.to_string()));
        }
    }
}

fn busy_reason(reconf: Reconfigure) -> &'static str {
    match reconf {
        Reconfigure::WhenIdle => "waits until idle (reconfigure = when-idle)",
        Reconfigure::Never => "not done (reconfigure = never)",
        Reconfigure::Drain => {
            "cannot drain: only system services in a team slice are stopped and started again \
             (never a login session, a user manager's unit or a transient scope)"
        }
    }
}

fn destroy_ci(r: &GiRef, c: &ComputeInstance) -> ActionKind {
    let ci = CiRef {
        gi: r.clone(),
        placement: c.placement,
    };
    ActionKind::DestroyCi {
        ci,
        profile: c.profile.clone(),
    }
}

/// Create a CI of profile `c` at `p` in the GI `r`, and return its layout entry.
fn create_ci(
    out: &mut Vec<(ActionKind, String)>,
    r: &GiRef,
    (c, p): (&CiProfile, Placement),
    why: String,
) -> LayoutCi {
    let ci = CiRef {
        gi: r.clone(),
        placement: p,
    };
    let (profile, profile_id) = (c.name.clone(), c.id);
    out.push((
        ActionKind::CreateCi {
            ci,
            profile: profile.clone(),
            profile_id,
        },
        why,
    ));
    LayoutCi {
        profile,
        profile_id,
        placement: p,
        existing: None,
    }
}

/// `3g.40gb@0+4`: an instance by profile and placement.
fn gi_name(gi: &GpuInstance) -> String {
    format!(
        "{}@{}+{}",
        gi.profile, gi.placement.start, gi.placement.size
    )
}

impl MigOutcome {
    /// Release `gi`: drain its holders, then destroy its CIs and itself, in the MIG-mode phase
    /// when `mode_phase`, else in the MIG-instances phase.
    fn destroy_gi(&mut self, gpu: &GpuState, gi: &GpuInstance, why: &str, mode_phase: bool) {
        add_drain(self, &gi_procs(gi), gi.owner.as_deref());
        self.removed_devices
            .extend(gi.compute.iter().map(|c| c.uuid.clone()));
        let r = gi_ref(gpu, gi.placement);
        let out = if mode_phase {
            &mut self.mode
        } else {
            &mut self.instances
        };
        for c in &gi.compute {
            let why = format!("{why} (compute instances go first)");
            out.push((destroy_ci(&r, c), why));
        }
        let profile = gi.profile.clone();
        out.push((ActionKind::DestroyGi { gi: r, profile }, why.to_string()));
    }
}

/// Plan the MIG side of one GPU. `want` is `None` when the policy wants the whole GPU (MIG off),
/// or the geometry when it wants MIG; an empty geometry (`mig = []`) is MIG on with no instances,
/// reached by the same rules: idle instances go, busy ones stay and are reported.
pub fn plan_gpu(
    gpu: &GpuState,
    model: &GpuModel,
    want: Option<&[MigSpec]>,
    reconf: Reconfigure,
) -> MigOutcome {
    let mut out = MigOutcome::default();
    let Some(mig) = &gpu.mig else {
        if want.is_some() {
            let why = format!("{} cannot do MIG", gpu.name);
            out.blocked.push(gpu_blocked(gpu, None, vec![], why));
        }
        return out;
    };
    let needs_reset = model.enable_requires_gpu_reset;
    let all_procs: Vec<&GpuProcess> = gpu
        .processes
        .iter()
        .chain(mig.instances.iter().flat_map(gi_procs))
        .collect();
    let holders = |ps: &[&GpuProcess]| ps.iter().map(|p| holder(p)).collect::<Vec<_>>();

    match want {
        None => {
            if !mig.current && !mig.pending {
                return out;
            }
            if !mig.current {
                // Enable pending, never took effect: cancelling needs no reset.
                out.set_mode(
                    gpu,
                    false,
                    format!(
                        "gpu {} is used whole: cancel the pending MIG enable",
                        gpu.index
                    ),
                );
                return out;
            }
            // MIG is on: everything goes, then the mode. A busy GPU is left exactly as it is, and
            // under `never` so is one that still has instances.
            let never_blocks = reconf == Reconfigure::Never && !mig.instances.is_empty();
            if never_blocks || !drainable(&all_procs, reconf) {
                out.layout = mig.instances.iter().map(LayoutGi::from_existing).collect();
                let what = if never_blocks {
                    format!(
                        " would destroy its {} MIG instance(s);",
                        mig.instances.len()
                    )
                } else {
                    String::new()
                };
                out.blocked.push(gpu_blocked(
                    gpu,
                    None,
                    holders(&all_procs),
                    format!(
                        "turning MIG off on gpu {}{what} {}",
                        gpu.index,
                        busy_reason(reconf)
                    ),
                ));
                return out;
            }
            let why = format!("gpu {} is used whole: MIG instances must go", gpu.index);
            for gi in &mig.instances {
                // Destroys run in the MIG-mode phase: the mode cannot change while they exist.
                out.destroy_gi(gpu, gi, &why, true);
            }
            add_drain(&mut out, &gpu.processes.iter().collect::<Vec<_>>(), None);
            out.mode_changes = true;
            if mig.pending {
                let why = format!("gpu {} is used whole: turn MIG off", gpu.index);
                out.set_mode(gpu, false, why);
            }
            if needs_reset {
                out.reset(
                    gpu,
                    format!(
                        "{} applies a MIG mode change only after a GPU reset",
                        model.nvml_name
                    ),
                );
            }
            out
        }
        Some(specs) => {
            let all_slots = slots(model, specs, gpu, &mut out.blocked);
            if mig.current {
                if !mig.pending {
                    let why = format!("gpu {} wants MIG: cancel the pending disable", gpu.index);
                    out.set_mode(gpu, true, why);
                }
                plan_instances(gpu, model, &mig.instances, all_slots, reconf, &mut out);
                return out;
            }
            // MIG off now. Turning it on needs the whole GPU idle, except that on models where
            // the change waits for a reset, only the reset needs it.
            let gpu_procs: Vec<&GpuProcess> = gpu.processes.iter().collect();
            let idle_ok = drainable(&gpu_procs, reconf);
            if !mig.pending && (idle_ok || needs_reset) {
                let what = if specs.is_empty() {
                    " mode with no instances (mig = [])"
                } else {
                    ""
                };
                out.set_mode(gpu, true, format!("gpu {} wants MIG{what}", gpu.index));
            }
            if !idle_ok {
                let what = if needs_reset {
                    "needs GPU reset: processes hold it"
                } else {
                    "enabling MIG needs the GPU idle: processes hold it"
                };
                out.blocked.push(gpu_blocked(
                    gpu,
                    None,
                    holders(&gpu_procs),
                    format!("gpu {} {what}; {}", gpu.index, busy_reason(reconf)),
                ));
                return out;
            }
            add_drain(&mut out, &gpu_procs, None);
            out.mode_changes = true;
            if needs_reset {
                let why = format!(
                    "{} enables MIG only after a reset of this GPU",
                    model.nvml_name
                );
                out.reset(gpu, why);
            }
            plan_instances(gpu, model, &[], all_slots, reconf, &mut out);
            out
        }
    }
}

/// Result of assigning kept instances to slots.
struct Assignment {
    /// (existing index, slot index) pairs.
    pairs: Vec<(usize, usize)>,
    /// Same-owner pairs plus pairs whose compute split already matches.
    score: usize,
}

/// Assign the instances in `pool` (immovable ones first) to slots of the same GI profile:
/// same owner and same compute split first, then same owner with another split (only the CIs
/// change, issue 17 item 4); with `relabel`, movable instances then go to slots of another
/// owner (a relabel). A busy instance is never relabelled: it keeps its owner, its devices and
/// its env entries until it is idle. Returns `None` when a movable instance finds no slot.
fn assign(
    existing: &[GpuInstance],
    keys: &[Key],
    pool: &[usize],
    immovable: &[bool],
    slots: &[Slot<'_>],
    slot_keys: &[Key],
    relabel: bool,
) -> Option<Assignment> {
    let mut taken = vec![false; slots.len()];
    let mut pairs = Vec::new();
    let mut placed = vec![false; existing.len()];
    let mut score = 0;
    let same_owner = |i: usize, s: usize| existing[i].owner.as_deref() == Some(&slots[s].owner);
    // Pass 0: exact shape, same owner. Pass 1: same GI, same owner, other split. Passes 2 and
    // 3: the same with another owner, movable instances only.
    for pass in 0..4 {
        for &i in pool {
            if placed[i] || (pass >= 2 && (!relabel || immovable[i])) {
                continue;
            }
            let exact = pass % 2 == 0;
            let hit = (0..slots.len()).find(|&s| {
                !taken[s]
                    && if exact {
                        slot_keys[s] == keys[i]
                    } else {
                        slot_keys[s].0 == keys[i].0
                    }
                    && (pass >= 2 || same_owner(i, s))
            });
            if let Some(s) = hit {
                taken[s] = true;
                placed[i] = true;
                pairs.push((i, s));
                score += usize::from(pass < 2) + usize::from(exact);
            }
        }
    }
    if pool.iter().any(|&i| !placed[i] && !immovable[i]) {
        return None;
    }
    Some(Assignment { pairs, score })
}

fn plan_instances(
    gpu: &GpuState,
    model: &GpuModel,
    existing: &[GpuInstance],
    slots: Vec<Slot<'_>>,
    reconf: Reconfigure,
    out: &mut MigOutcome,
) {
    let never = reconf == Reconfigure::Never;
    let keys: Vec<Key> = existing.iter().map(gi_key).collect();
    let slot_keys: Vec<Key> = slots.iter().map(Slot::key).collect();
    let procs: Vec<Vec<&GpuProcess>> = existing.iter().map(gi_procs).collect();
    // `never` pins every existing instance, idle or not: the admin asked that nothing that
    // exists is changed automatically.
    let immovable: Vec<bool> = procs
        .iter()
        .map(|p| never || !drainable(p, reconf))
        .collect();
    let immov: Vec<usize> = (0..existing.len()).filter(|&i| immovable[i]).collect();
    // Reusable: a slot wants the same GI profile (a different compute split only rebuilds CIs).
    let candidates: Vec<usize> = (0..existing.len())
        .filter(|&i| !immovable[i] && slot_keys.iter().any(|k| k.0 == keys[i].0))
        .collect();

    // Every subset of reusable instances, ranked: keep more, then more same-owner matches, then
    // more busy ones (fewer drains), then a fixed order so the plan is deterministic.
    let mut ranked = Vec::new();
    for m in 0u32..(1 << candidates.len()) {
        let mut pool = immov.clone();
        pool.extend(
            candidates
                .iter()
                .enumerate()
                .filter(|(b, _)| m & (1 << b) != 0)
                .map(|(_, &i)| i),
        );
        let Some(a) = assign(
            existing, &keys, &pool, &immovable, &slots, &slot_keys, !never,
        ) else {
            continue;
        };
        let busy = pool.iter().filter(|&&i| !procs[i].is_empty()).count();
        ranked.push((m.count_ones(), a.score, busy, std::cmp::Reverse(m), pool, a));
    }
    ranked.sort_by_key(|r| std::cmp::Reverse((r.0, r.1, r.2, r.3)));

    // The subset keeping nothing movable always assigns (immovable instances never fail), so it
    // is tried last and its misfit is the one reported: the geometry does not fit even around
    // the instances that cannot go.
    let mut last_misfit: Option<Misfit> = None;
    for (_, _, _, _, pool, a) in ranked {
        let fixed: Vec<(u32, Placement)> = pool
            .iter()
            .map(|&i| (existing[i].profile_id, existing[i].placement))
            .collect();
        let used: BTreeSet<usize> = a.pairs.iter().map(|&(_, s)| s).collect();
        let rest: Vec<usize> = (0..slots.len()).filter(|s| !used.contains(s)).collect();
        let wanted: Vec<&GiProfile> = rest.iter().map(|&s| slots[s].gi).collect();
        match fit(model, &wanted, &fixed) {
            Ok(places) => {
                emit(
                    gpu, existing, &slots, &pool, &a, &rest, &places, &procs, &immovable, reconf,
                    out,
                );
                return;
            }
            Err(m) => last_misfit = Some(m),
        }
    }

    // Nothing fits: keep what is there rather than tear down instances for a layout that cannot
    // be completed.
    out.layout = existing.iter().map(LayoutGi::from_existing).collect();
    let busy: Vec<String> = immov
        .iter()
        .flat_map(|&i| procs[i].iter().map(|p| holder(p)))
        .collect();
    // Say what actually stands in the way: each busy instance the policy wants changed, with
    // its holders, rather than a slice count that counts the busy instance twice.
    for &i in immov.iter().filter(|&&i| !procs[i].is_empty()) {
        let gi = &existing[i];
        let name = gi_name(gi);
        let owner = gi.owner.as_deref().unwrap_or("(none)");
        let what = if let Some(s) = slots
            .iter()
            .find(|s| s.gi.id == gi.profile_id && s.owner != owner)
        {
            format!(
                "is held by team {owner}'s processes and the policy gives it to team {}; \
                 it keeps its owner, devices and env entries until it is idle",
                s.owner
            )
        } else if slots.iter().any(|s| s.gi.id == gi.profile_id) {
            "is held by processes, and the policy's layout cannot be placed around it".into()
        } else {
            "is not in the policy but processes hold it".into()
        };
        out.blocked.push(gpu_blocked(
            gpu,
            Some(gi_ref(gpu, gi.placement)),
            procs[i].iter().map(|p| holder(p)).collect(),
            format!("{name} {what}; {}", busy_reason(reconf)),
        ));
    }
    let why = last_misfit.map(|m| format!(": {m}")).unwrap_or_default();
    let reason = if never && !existing.is_empty() {
        format!(
            "the policy's MIG layout does not fit around the existing instances of gpu {}{why}; \
             they are left as they are ({})",
            gpu.index,
            busy_reason(reconf)
        )
    } else if busy.is_empty() {
        format!(
            "the MIG geometry does not fit gpu {} ({}){why}; instances left as they are",
            gpu.index, model.nvml_name
        )
    } else {
        format!(
            "the MIG layout of gpu {} cannot change around busy instances{why}; {}",
            gpu.index,
            busy_reason(reconf)
        )
    };
    out.blocked.push(gpu_blocked(gpu, None, busy, reason));
}

fn split_names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.collect::<Vec<_>>().join(",")
}

/// A kept GI whose compute split changes: destroy the CIs the policy's split does not have
/// (same profile at the same placement stays), create the missing ones. The GI itself stays,
/// so a split change costs CI mutations only.
fn rebuild_cis(
    gpu: &GpuState,
    gi: &GpuInstance,
    slot: &Slot<'_>,
    have: &str,
    want: &str,
    out: &mut MigOutcome,
    l: &mut LayoutGi,
) {
    let r = gi_ref(gpu, gi.placement);
    let why = format!(
        "the compute split of {} changes from [{have}] to [{want}]; the GPU instance stays",
        gi_name(gi)
    );
    let wanted: BTreeSet<(u32, Placement)> = slot.cis.iter().map(|(c, p)| (c.id, *p)).collect();
    let kept: BTreeSet<(u32, Placement)> = gi
        .compute
        .iter()
        .map(|c| (c.profile_id, c.placement))
        .filter(|k| wanted.contains(k))
        .collect();
    // Processes on a CI that goes are drained first (only reached when they may be).
    for c in gi
        .compute
        .iter()
        .filter(|c| !kept.contains(&(c.profile_id, c.placement)))
    {
        add_drain(
            out,
            &c.processes.iter().collect::<Vec<_>>(),
            gi.owner.as_deref(),
        );
        out.removed_devices.insert(c.uuid.clone());
        out.instances.push((destroy_ci(&r, c), why.clone()));
    }
    l.cis
        .retain(|c| kept.contains(&(c.profile_id, c.placement)));
    for &(c, p) in slot.cis.iter().filter(|(c, p)| !kept.contains(&(c.id, *p))) {
        l.cis
            .push(create_ci(&mut out.instances, &r, (c, p), why.clone()));
    }
    l.cis.sort_by_key(|c| c.placement);
}

#[allow(clippy::too_many_arguments)]
fn emit(
    gpu: &GpuState,
    existing: &[GpuInstance],
    slots: &[Slot<'_>],
    pool: &[usize],
    a: &Assignment,
    rest: &[usize],
    places: &[Placement],
    procs: &[Vec<&GpuProcess>],
    immovable: &[bool],
    reconf: Reconfigure,
    out: &mut MigOutcome,
) {
    let slot_of: BTreeMap<usize, usize> = a.pairs.iter().copied().collect();
    // Destroys first: they free the slices the creates need.
    for (i, gi) in existing.iter().enumerate() {
        if pool.contains(&i) {
            continue;
        }
        let why = format!(
            "{} on gpu {} is not in the policy's layout",
            gi_name(gi),
            gpu.index
        );
        out.destroy_gi(gpu, gi, &why, false);
    }
    for &i in pool {
        let gi = &existing[i];
        let mut l = LayoutGi::from_existing(gi);
        let name = gi_name(gi);
        let holders: Vec<String> = procs[i].iter().map(|p| holder(p)).collect();
        match slot_of.get(&i) {
            Some(&s) => {
                let slot = &slots[s];
                let to = &slot.owner;
                if gi.owner.as_deref() != Some(to.as_str()) {
                    // `assign` relabels movable instances only; under drain their holders
                    // stop first, so no job of the old team keeps a device of the new one.
                    add_drain(out, &procs[i], gi.owner.as_deref());
                    out.instances.push((
                        ActionKind::SetOwner {
                            gi: gi_ref(gpu, gi.placement),
                            from: gi.owner.clone(),
                            to: to.clone(),
                        },
                        format!("{name} already has the right shape; only its owner changes"),
                    ));
                    l.owner = Some(to.clone());
                }
                if slot.key() != gi_key(gi) {
                    let have = split_names(gi.compute.iter().map(|c| c.profile.as_str()));
                    let want = split_names(slot.cis.iter().map(|(c, _)| c.name.as_str()));
                    if immovable[i] {
                        out.blocked.push(gpu_blocked(
                            gpu,
                            Some(gi_ref(gpu, gi.placement)),
                            holders,
                            format!(
                                "the compute split of {name} changes from [{have}] to [{want}] \
                                 (the GPU instance stays); {}",
                                busy_reason(reconf)
                            ),
                        ));
                    } else {
                        rebuild_cis(gpu, gi, slot, &have, &want, out, &mut l);
                    }
                }
            }
            None => {
                debug_assert!(immovable[i]);
                let other_owner = slots
                    .iter()
                    .find(|s| s.gi.id == gi.profile_id && Some(&s.owner) != gi.owner.as_ref());
                let what = match (procs[i].is_empty(), other_owner) {
                    (false, Some(s)) => format!(
                        "is held by team {}'s processes and the policy gives it to team {}; \
                         it keeps its owner, devices and env entries until it is idle",
                        gi.owner.as_deref().unwrap_or("(none)"),
                        s.owner
                    ),
                    (false, None) => "is not in the policy but processes hold it".to_string(),
                    // Only `never` keeps an idle instance it could have relabelled.
                    (true, Some(_)) => format!(
                        "has a shape the policy wants, but belongs to {}",
                        gi.owner.as_deref().unwrap_or("no team")
                    ),
                    (true, None) => "is not in the policy's layout".to_string(),
                };
                out.blocked.push(gpu_blocked(
                    gpu,
                    Some(gi_ref(gpu, gi.placement)),
                    holders,
                    format!("{name} {what}; {}", busy_reason(reconf)),
                ));
            }
        }
        out.layout.push(l);
    }
    for (&s, &p) in rest.iter().zip(places) {
        let slot = &slots[s];
        let r = gi_ref(gpu, p);
        out.instances.push((
            ActionKind::CreateGi {
                gi: r.clone(),
                profile: slot.gi.name.clone(),
                profile_id: slot.gi.id,
                owner: slot.owner.clone(),
            },
            format!(
                "policy gives team {} a {} on gpu {}",
                slot.owner, slot.gi.name, gpu.index
            ),
        ));
        let why = if slot.cis.len() == 1 {
            "one compute instance spanning the GPU instance"
        } else {
            "compute split from the policy"
        };
        let cis = slot
            .cis
            .iter()
            .map(|&c| create_ci(&mut out.instances, &r, c, why.into()))
            .collect();
        out.layout.push(LayoutGi {
            profile: slot.gi.name.clone(),
            profile_id: slot.gi.id,
            placement: p,
            owner: Some(slot.owner.clone()),
            existing: None,
            cis,
        });
    }
    out.layout.sort_by_key(|g| g.placement);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::Catalog;

    fn h100_gpu() -> (GpuState, &'static GpuModel) {
        let m = Catalog::get().by_key("H100-SXM5-80GB").unwrap();
        let g = GpuState {
            index: 0,
            uuid: "GPU-test".into(),
            name: m.nvml_name.clone(),
            model: Some(m.key.clone()),
            minor: 0,
            memory_mib: m.memory_total_mib,
            mig: Some(crate::observe::MigState {
                current: true,
                pending: true,
                instances: vec![],
            }),
            processes: vec![],
        };
        (g, m)
    }

    fn spec(profile: &str, count: u32, compute: &[&str]) -> MigSpec {
        MigSpec {
            profile: profile.into(),
            owner: "a".parse().unwrap(),
            count,
            compute: compute.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn slots_place_compute_splits_and_explain_misfits() {
        let (g, m) = h100_gpu();
        let mut blocked = Vec::new();
        let s = slots(m, &[spec("3g.40gb", 2, &["1c", "2c"])], &g, &mut blocked);
        assert!(blocked.is_empty(), "{blocked:?}");
        assert_eq!(s.len(), 2);
        // 2c.3g.40gb has one legal placement (0-1), so the 1c listed first goes to slice 2.
        let places: Vec<Placement> = s[0].cis.iter().map(|(_, p)| *p).collect();
        assert_eq!(places, vec![Placement::new(2, 1), Placement::new(0, 2)]);

        let s = slots(m, &[spec("3g.40gb", 1, &["2c", "2c"])], &g, &mut blocked);
        assert!(s.is_empty());
        assert_eq!(blocked.len(), 1);
        assert!(
            blocked[0].reason.contains("needs 4 of 3 compute slices"),
            "{}",
            blocked[0].reason
        );
    }

    #[test]
    fn misfit_on_a_gpu_is_explained_in_the_blocked_reason() {
        // Validation rejects this before planning; a planner fed it anyway (a library caller)
        // must leave the GPU alone and say why in words.
        let (g, m) = h100_gpu();
        let out = plan_gpu(
            &g,
            m,
            Some(&[spec("3g.40gb", 3, &[])]),
            Reconfigure::WhenIdle,
        );
        assert!(out.instances.is_empty());
        assert_eq!(out.blocked.len(), 1);
        assert!(
            out.blocked[0]
                .reason
                .contains("3g.40gb x3 needs 12 of 8 memory slices"),
            "{}",
            out.blocked[0].reason
        );
    }
}
