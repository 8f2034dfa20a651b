//! The pure planner: `plan(&Policy, &Observed) -> Plan`.
//!
//! No I/O happens here. The plan is a list of actions in phase order, each with a one-line reason,
//! plus the changes that are blocked (busy instances, pending mode changes) and why.
//!
//! MIG instances are named by their placement, not their driver-chosen id: a placement is unique
//! on a GPU and known before the instance exists, so a plan can name what it will create.

use crate::observe::{Fence, MpsSpec, Observed, SliceSpec};
use crate::policy::{Policy, TeamName};
use crate::profiles::Placement;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

pub mod desired;
pub mod fence;
pub mod mig;
pub mod slurm;

pub use desired::{desired, Desired, TeamView};

/// Phases in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Stop units that hold instances about to change (reconfigure = drain), and MPS daemons
    /// on devices about to change.
    Drain,
    /// Withdraw devices from slices that lose them, and fence the slices outside the team
    /// shares: before anything is granted or created ([`fence`]).
    Fence,
    /// Enable or disable MIG mode, reset GPUs whose mode change is pending.
    MigMode,
    /// Destroy, then create GPU and compute instances; relabel owners.
    MigInstances,
    /// Device nodes and team environment files.
    Devices,
    /// Team slices.
    Slices,
    /// MPS daemons.
    Mps,
    /// Start again what `Drain` stopped.
    Resume,
}

/// A GPU instance named by GPU and placement.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GiRef {
    /// GPU UUID.
    pub gpu: String,
    /// GPU index, for humans.
    pub index: u32,
    /// Placement in memory slices.
    pub placement: Placement,
}

/// A compute instance named by its GI and its placement inside it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CiRef {
    /// The GPU instance.
    pub gi: GiRef,
    /// Placement in compute slices of the GI.
    pub placement: Placement,
}

/// One step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ActionKind {
    /// Stop a team's units (drain).
    StopUnits {
        /// Team.
        team: String,
        /// Units to stop.
        units: Vec<String>,
    },
    /// Stop an MPS daemon.
    StopMps {
        /// Instance name.
        instance: String,
    },
    /// Set MIG mode.
    SetMigMode {
        /// GPU UUID.
        gpu: String,
        /// GPU index.
        index: u32,
        /// New mode.
        enable: bool,
    },
    /// Reset one GPU so a pending mode change takes effect.
    ResetGpu {
        /// GPU UUID.
        gpu: String,
        /// GPU index.
        index: u32,
    },
    /// Destroy a compute instance.
    DestroyCi {
        /// Which.
        ci: CiRef,
        /// Profile name, for humans.
        profile: String,
    },
    /// Destroy a GPU instance (its CIs first, as separate actions).
    DestroyGi {
        /// Which.
        gi: GiRef,
        /// Profile name.
        profile: String,
    },
    /// Create a GPU instance at a placement.
    CreateGi {
        /// Where.
        gi: GiRef,
        /// Profile name.
        profile: String,
        /// Published profile ID.
        profile_id: u32,
        /// Owning team.
        owner: String,
    },
    /// Create a compute instance in a GI.
    CreateCi {
        /// Where.
        ci: CiRef,
        /// CI profile name.
        profile: String,
        /// CI profile ID.
        profile_id: u32,
    },
    /// Change the recorded owner of an existing GI (no hardware change).
    SetOwner {
        /// Which.
        gi: GiRef,
        /// Old owner.
        from: Option<String>,
        /// New owner.
        to: String,
    },
    /// Create missing `/dev/nvidia-caps/nvidia-capN` nodes for MIG devices.
    CreateCapNodes {
        /// Capability minors (`N`) whose nodes are missing.
        minors: Vec<u32>,
    },
    /// Write `/run/gpuctl/teams/<team>.env`.
    WriteEnv {
        /// Team.
        team: TeamName,
        /// File content.
        content: String,
    },
    /// Remove a team's env file.
    RemoveEnv {
        /// Team.
        team: TeamName,
    },
    /// Write a team's CDI spec (`/var/run/cdi/gpuctl.io-team-<team>.json`), readable by root
    /// and `readers` only.
    WriteCdi {
        /// Team.
        team: TeamName,
        /// File content.
        content: String,
        /// The team's members as the policy names them (`alice`, `@ml-infer`).
        #[serde(default)]
        readers: Vec<String>,
    },
    /// Remove a team's CDI spec.
    RemoveCdi {
        /// Team.
        team: TeamName,
    },
    /// Create or update `gpu-<team>.slice`.
    SetSlice {
        /// Team.
        team: TeamName,
        /// Properties to hold.
        spec: SliceSpec,
    },
    /// Remove `gpu-<team>.slice` (team gone from the policy).
    RemoveSlice {
        /// Team.
        team: TeamName,
    },
    /// Set the device filter of a slice outside the team shares ([`fence`]).
    SetFence {
        /// The slice unit (`user.slice`).
        slice: String,
        /// Its `DevicePolicy=` and `DeviceAllow=`.
        fence: Fence,
    },
    /// Start (or restart with new settings) an MPS daemon.
    StartMps {
        /// Instance name (`<team>-<n>`).
        instance: String,
        /// Settings.
        spec: MpsSpec,
    },
    /// Start units stopped in the drain phase.
    StartUnits {
        /// Team.
        team: String,
        /// Units.
        units: Vec<String>,
    },
    /// Drain the Slurm node (`scontrol update … State=DRAIN Reason=…`) before a MIG change.
    SlurmDrain {
        /// `NodeName`.
        node: String,
        /// Drain reason, starting with `gpuctl:`.
        reason: String,
    },
    /// Write the GRES file Slurm includes.
    WriteGres {
        /// Host path.
        path: std::path::PathBuf,
        /// File content.
        content: String,
    },
    /// Have Slurm read the GRES file again: `scontrol reconfigure`, then restart these units.
    SlurmReload {
        /// Units to restart (slurmd reads `Type=` changes only at start).
        restart: Vec<String>,
    },
    /// Resume the node gpuctl drained.
    SlurmResume {
        /// `NodeName`.
        node: String,
    },
}

/// An action with its phase and reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Action {
    /// When it runs.
    pub phase: Phase,
    /// What it does.
    #[serde(flatten)]
    pub kind: ActionKind,
    /// Why, in one line.
    pub reason: String,
}

/// A change the planner wants but will not make now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocked {
    /// GPU index.
    pub index: u32,
    /// GPU UUID.
    pub gpu: String,
    /// The instance, when one is at stake.
    pub gi: Option<GiRef>,
    /// Who blocks it, e.g. `pid 4242 (train.service)`.
    pub holders: Vec<String>,
    /// Why, in one line.
    pub reason: String,
}

/// The ordered plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Actions in phase order.
    pub actions: Vec<Action>,
    /// Changes held back.
    pub blocked: Vec<Blocked>,
    /// The MIG phases change which devices exist: the later phases shown here hold placeholders
    /// and the executor recomputes them from a fresh observation after the MIG phases.
    #[serde(default)]
    pub replan_after_mig: bool,
}

impl Plan {
    /// Nothing to do and nothing held back: the host matches the policy.
    pub fn is_converged(&self) -> bool {
        self.actions.is_empty() && self.blocked.is_empty()
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Phase::Drain => "drain",
            Phase::Fence => "fence",
            Phase::MigMode => "mig-mode",
            Phase::MigInstances => "mig-instances",
            Phase::Devices => "devices",
            Phase::Slices => "slices",
            Phase::Mps => "mps",
            Phase::Resume => "resume",
        };
        f.write_str(s)
    }
}

/// Plan the changes that make `observed` match `policy`.
///
/// Two steps: [`desired()`] decides the target (including the MIG layout of each GPU, which
/// depends on what exists), then [`diff`] lists the actions in phase order.
pub fn plan(policy: &Policy, observed: &Observed) -> Plan {
    slurm::around(policy, observed, diff(&desired(policy, observed), observed))
}

fn push(actions: &mut Vec<Action>, phase: Phase, kind: ActionKind, reason: impl Into<String>) {
    actions.push(Action {
        phase,
        kind,
        reason: reason.into(),
    });
}

/// Turn a desired state into the ordered actions that reach it from `observed`.
pub fn diff(d: &Desired, observed: &Observed) -> Plan {
    let mut actions = Vec::new();

    // Drain: units holding instances that change, and MPS daemons whose devices change or go.
    let mut drain: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut removed_devices = BTreeSet::new();
    for g in &d.gpus {
        for (team, unit) in &g.mig.drain {
            drain.entry(team.clone()).or_default().insert(unit.clone());
        }
        removed_devices.extend(g.mig.removed_devices.iter().cloned());
        if g.mig.mode_changes {
            removed_devices.insert(g.uuid.clone());
        }
    }
    for (team, units) in &drain {
        push(
            &mut actions,
            Phase::Drain,
            ActionKind::StopUnits {
                team: team.clone(),
                units: units.iter().cloned().collect(),
            },
            format!("reconfigure = drain: team {team}'s units hold MIG instances that change"),
        );
    }
    let wanted_mps: BTreeMap<&String, &MpsSpec> =
        d.teams.values().flat_map(|t| t.mps.iter()).collect();
    let mut stopped = BTreeSet::new();
    for (inst, spec) in &observed.mps {
        let reason = if !wanted_mps.contains_key(inst) {
            "no longer in the policy"
        } else if spec.devices.iter().any(|u| removed_devices.contains(u)) {
            "its device changes"
        } else {
            continue;
        };
        stopped.insert(inst.clone());
        push(
            &mut actions,
            Phase::Drain,
            ActionKind::StopMps {
                instance: inst.clone(),
            },
            format!("MPS daemon {inst}: {reason}"),
        );
    }

    // Withdrawals and the fences outside the shares, before anything is granted.
    let withdrawn = fence::diff(&mut actions, d, observed);

    // MIG mode, then instances, GPU by GPU.
    for g in &d.gpus {
        for (k, r) in &g.mig.mode {
            push(&mut actions, Phase::MigMode, k.clone(), r.clone());
        }
    }
    for g in &d.gpus {
        for (k, r) in &g.mig.instances {
            push(&mut actions, Phase::MigInstances, k.clone(), r.clone());
        }
    }
    let replan_after_mig = actions
        .iter()
        .any(|a| matches!(a.phase, Phase::MigMode | Phase::MigInstances));

    // Devices: capability nodes, env files.
    let need: BTreeSet<u32> = d
        .teams
        .values()
        .flat_map(|t| t.cap_minors.iter().copied())
        .collect();
    let missing: Vec<u32> = need.difference(&observed.cap_nodes).copied().collect();
    if !missing.is_empty() {
        push(
            &mut actions,
            Phase::Devices,
            ActionKind::CreateCapNodes { minors: missing },
            "MIG devices of teams need their /dev/nvidia-caps nodes",
        );
    }
    team_files(
        &mut actions,
        d,
        &observed.env_files,
        |t| &t.env,
        ("device view", "env file"),
        |t| ActionKind::WriteEnv {
            team: t.name.clone(),
            content: t.env.clone(),
        },
        |team| ActionKind::RemoveEnv { team },
    );
    team_files(
        &mut actions,
        d,
        &observed.cdi_specs,
        |t| &t.cdi,
        ("CDI device", "CDI spec"),
        |t| ActionKind::WriteCdi {
            team: t.name.clone(),
            content: t.cdi.clone(),
            readers: t.cdi_readers.clone(),
        },
        |team| ActionKind::RemoveCdi { team },
    );
    // A spec whose content is current but that someone outside the team can read (a member
    // removed from the policy): written again, with the members' ACL. A member added later
    // reads it after the next write (fail closed; a name NSS does not know never matches).
    for t in d.teams.values() {
        if observed.cdi_specs.get(&*t.name) != Some(&t.cdi) {
            continue;
        }
        let outsiders: Vec<&String> = observed
            .cdi_readers
            .get(&*t.name)
            .into_iter()
            .flatten()
            .filter(|r| !t.cdi_readers.contains(r))
            .collect();
        if !outsiders.is_empty() {
            push(
                &mut actions,
                Phase::Devices,
                ActionKind::WriteCdi {
                    team: t.name.clone(),
                    content: t.cdi.clone(),
                    readers: t.cdi_readers.clone(),
                },
                format!(
                    "team {}'s CDI spec is readable by {} outside the team",
                    t.name,
                    outsiders
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
    }

    // Slices.
    for t in d.teams.values() {
        match observed.slices.get(&*t.name) {
            Some(s) if *s == t.slice => {}
            Some(_) if withdrawn.get(&*t.name) == Some(&t.slice) => {}
            have => push(
                &mut actions,
                Phase::Slices,
                ActionKind::SetSlice {
                    team: t.name.clone(),
                    spec: t.slice.clone(),
                },
                if let Some(h) = have {
                    format!(
                        "gpu-{}.slice (team {}) differs from the policy: {}",
                        t.name,
                        t.name,
                        slice_drift(h, &t.slice)
                    )
                } else {
                    format!("team {} has no slice yet", t.name)
                },
            ),
        }
    }
    if let Some(want) = &d.loans {
        let team: TeamName = crate::names::LOANS.parse().expect("a team name");
        match observed.slices.get(&team) {
            Some(s) if s == want => {}
            Some(_) if withdrawn.get(&team) == Some(want) => {}
            have => push(
                &mut actions,
                Phase::Slices,
                ActionKind::SetSlice {
                    team,
                    spec: want.clone(),
                },
                match have {
                    Some(h) => format!(
                        "gpu-{}.slice (borrowed jobs) differs from the lending teams' devices: {}",
                        crate::names::LOANS,
                        slice_drift(h, want)
                    ),
                    None => "a team lends devices and borrowed jobs have no slice yet".into(),
                },
            ),
        }
    }
    for team in observed.slices.keys() {
        if d.slice(team).is_none() {
            push(
                &mut actions,
                Phase::Slices,
                ActionKind::RemoveSlice { team: team.clone() },
                if &**team == crate::names::LOANS {
                    "no team lends devices any more".into()
                } else {
                    format!("team {team} is no longer in the policy")
                },
            );
        }
    }

    // MPS daemons: (re)start what is missing, different, or stopped above for a device change.
    for (inst, spec) in &wanted_mps {
        let have = observed.mps.get(*inst);
        if have == Some(*spec) && !stopped.contains(*inst) {
            continue;
        }
        push(
            &mut actions,
            Phase::Mps,
            ActionKind::StartMps {
                instance: (*inst).clone(),
                spec: (*spec).clone(),
            },
            match have {
                None => format!("team {} uses MPS", spec.team),
                Some(_) if stopped.contains(*inst) => "restart after its device changed".into(),
                Some(_) => "settings differ from the policy".into(),
            },
        );
    }

    for (team, units) in drain {
        // A removed team's units are not started again: its slice is going away, and a unit
        // started in it would bring the slice back without gpuctl's device filter.
        if !d.teams.contains_key(team.as_str()) {
            continue;
        }
        push(
            &mut actions,
            Phase::Resume,
            ActionKind::StartUnits {
                team: team.clone(),
                units: units.into_iter().collect(),
            },
            format!("start team {team}'s units again after the MIG change"),
        );
    }

    Plan {
        actions,
        blocked: d.blocked.clone(),
        replan_after_mig,
    }
}

/// What differs between a live slice and the policy's, in systemd's words: `MemoryMax=1073741824
/// (policy: 5368709120)`, `DeviceAllow +/dev/nvidia1`. The drift log line of issue 17.
pub fn slice_drift(have: &SliceSpec, want: &SliceSpec) -> String {
    let mut out = have.drift(want);
    for d in have.device_allow.difference(&want.device_allow) {
        out.push(format!("DeviceAllow +{d}"));
    }
    for d in want.device_allow.difference(&have.device_allow) {
        out.push(format!("DeviceAllow -{d}"));
    }
    if out.is_empty() {
        "(no field differs)".into()
    } else {
        out.join(", ")
    }
}

/// Per-team files (env files, CDI specs, see [`crate::cdi`]) follow the team views: written
/// where they differ (the reason names what `changed`, or the missing `file`), removed for teams
/// gone from the policy.
fn team_files(
    actions: &mut Vec<Action>,
    d: &Desired,
    have: &BTreeMap<TeamName, String>,
    want: fn(&TeamView) -> &String,
    (changed, file): (&str, &str),
    write: fn(&TeamView) -> ActionKind,
    remove: fn(TeamName) -> ActionKind,
) {
    for t in d.teams.values() {
        let content = want(t);
        if have.get(&*t.name) != Some(content) {
            let reason = if have.contains_key(&*t.name) {
                format!("team {}'s {changed} changed", t.name)
            } else {
                format!("team {} has no {file} yet", t.name)
            };
            let k = write(t);
            push(actions, Phase::Devices, k, reason);
        }
    }
    for team in have.keys().filter(|t| !d.teams.contains_key(*t)) {
        let reason = format!("team {team} is no longer in the policy");
        push(actions, Phase::Devices, remove(team.clone()), reason);
    }
}

fn pl(p: &Placement) -> String {
    format!("@{}+{}", p.start, p.size)
}

impl fmt::Display for GiRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gpu {} gi{}", self.index, pl(&self.placement))
    }
}

impl fmt::Display for CiRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ci{}", self.gi, pl(&self.placement))
    }
}

impl ActionKind {
    /// The GPU (UUID and index) the action concerns, if any.
    pub fn gpu(&self) -> Option<(&str, u32)> {
        match self {
            ActionKind::SetMigMode { gpu, index, .. } | ActionKind::ResetGpu { gpu, index } => {
                Some((gpu, *index))
            }
            ActionKind::DestroyCi { ci, .. } | ActionKind::CreateCi { ci, .. } => {
                Some((&ci.gi.gpu, ci.gi.index))
            }
            ActionKind::DestroyGi { gi, .. }
            | ActionKind::CreateGi { gi, .. }
            | ActionKind::SetOwner { gi, .. } => Some((&gi.gpu, gi.index)),
            _ => None,
        }
    }

    /// The GPU index the action concerns, if any.
    pub fn gpu_index(&self) -> Option<u32> {
        self.gpu().map(|(_, i)| i)
    }

    /// The team the action concerns, if any.
    pub fn team(&self) -> Option<&str> {
        match self {
            ActionKind::StopUnits { team, .. } | ActionKind::StartUnits { team, .. } => Some(team),
            ActionKind::WriteEnv { team, .. }
            | ActionKind::RemoveEnv { team }
            | ActionKind::WriteCdi { team, .. }
            | ActionKind::RemoveCdi { team }
            | ActionKind::SetSlice { team, .. }
            | ActionKind::RemoveSlice { team } => Some(team),
            ActionKind::StartMps { spec, .. } => Some(&spec.team),
            _ => None,
        }
    }
}

impl fmt::Display for ActionKind {
    /// One line saying what the action does (the reason is printed separately).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ActionKind::StopUnits { team, units } => {
                write!(f, "stop {} of team {team}", units.join(" "))
            }
            ActionKind::StartUnits { team, units } => {
                write!(f, "start {} of team {team}", units.join(" "))
            }
            ActionKind::StopMps { instance } => write!(f, "stop MPS daemon {instance}"),
            ActionKind::StartMps { instance, spec } => {
                write!(
                    f,
                    "start MPS daemon {instance} on {}",
                    spec.devices.join(",")
                )?;
                if let Some(p) = spec.active_thread_percentage {
                    write!(f, " threads={p}%")?;
                }
                if let Some(m) = spec.pinned_memory_limit {
                    write!(f, " pinned-mem={m}")?;
                }
                if let Some(u) = &spec.user {
                    write!(f, " user={u}")?;
                }
                Ok(())
            }
            ActionKind::SetMigMode { index, enable, .. } => write!(
                f,
                "{} MIG mode on gpu {index}",
                if *enable { "enable" } else { "disable" }
            ),
            ActionKind::ResetGpu { index, .. } => write!(f, "reset gpu {index}"),
            ActionKind::DestroyCi { ci, profile } => write!(f, "destroy CI {profile} {ci}"),
            ActionKind::DestroyGi { gi, profile } => write!(f, "destroy GI {profile} {gi}"),
            ActionKind::CreateGi {
                gi, profile, owner, ..
            } => write!(f, "create GI {profile} {gi} for {owner}"),
            ActionKind::CreateCi { ci, profile, .. } => write!(f, "create CI {profile} {ci}"),
            ActionKind::SetOwner { gi, from, to } => write!(
                f,
                "relabel {gi} from {} to {to}",
                from.as_deref().unwrap_or("(none)")
            ),
            ActionKind::CreateCapNodes { minors } => {
                let m: Vec<String> = minors.iter().map(|m| format!("nvidia-cap{m}")).collect();
                write!(f, "create /dev/nvidia-caps/{{{}}}", m.join(","))
            }
            ActionKind::WriteEnv { team, .. } => write!(f, "write /run/gpuctl/teams/{team}.env"),
            ActionKind::RemoveEnv { team } => write!(f, "remove /run/gpuctl/teams/{team}.env"),
            ActionKind::WriteCdi { team, .. } => {
                write!(f, "write {}", crate::cdi::spec_path(team))
            }
            ActionKind::RemoveCdi { team } => write!(f, "remove {}", crate::cdi::spec_path(team)),
            ActionKind::SetSlice { team, .. } => write!(f, "set gpu-{team}.slice"),
            ActionKind::RemoveSlice { team } => write!(f, "remove gpu-{team}.slice"),
            ActionKind::SetFence { slice, fence } if fence.is_open() => {
                write!(f, "open {slice} to NVIDIA devices")
            }
            ActionKind::SetFence { slice, fence } => write!(
                f,
                "fence {slice}: DevicePolicy={}, every device major but NVIDIA's ({} entries)",
                fence.policy,
                fence.allow.len()
            ),
            ActionKind::SlurmDrain { node, reason } => {
                write!(f, "drain Slurm node {node} (Reason=\"{reason}\")")
            }
            ActionKind::WriteGres { path, .. } => write!(f, "write {}", path.display()),
            ActionKind::SlurmReload { restart } => {
                write!(f, "scontrol reconfigure")?;
                if !restart.is_empty() {
                    write!(f, ", restart {}", restart.join(" "))?;
                }
                Ok(())
            }
            ActionKind::SlurmResume { node } => write!(f, "resume Slurm node {node}"),
        }
    }
}

#[cfg(test)]
mod drift_tests {
    use super::*;

    /// Every setting of the table takes part in the drift line, from the table itself: a drifted
    /// IO bandwidth limit is named, not "(no field differs)".
    #[test]
    fn slice_drift_names_every_differing_setting() {
        let want = SliceSpec::default();
        assert_eq!(slice_drift(&want, &want), "(no field differs)");
        let have = SliceSpec {
            memory_max: Some(1 << 30),
            io_read_bandwidth_max: Some([("/dev/sda".to_string(), 10 << 20)].into()),
            io_write_bandwidth_max: Some([("/dev/sdb".to_string(), 1 << 20)].into()),
            device_allow: ["/dev/nvidia1".to_string()].into(),
            ..Default::default()
        };
        assert_eq!(
            slice_drift(&have, &want),
            "MemoryMax=1073741824 (policy: (unset)), \
             IOReadBandwidthMax=/dev/sda 10485760 (policy: (unset)), \
             IOWriteBandwidthMax=/dev/sdb 1048576 (policy: (unset)), \
             DeviceAllow +/dev/nvidia1"
        );
        let settings = crate::settings::KEYS.len();
        let all = SliceSpec {
            memory_max: Some(1),
            memory_high: Some(1),
            cpu_weight: Some(1),
            allowed_cpus: Some("0".parse().unwrap()),
            tasks_max: Some(1),
            io_weight: Some(1),
            io_read_bandwidth_max: Some([("/dev/a".to_string(), 1)].into()),
            io_write_bandwidth_max: Some([("/dev/a".to_string(), 1)].into()),
            device_allow: Default::default(),
        };
        assert_eq!(all.drift(&want).len(), settings);
    }
}
