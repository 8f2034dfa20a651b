//! The desired host: which GPUs the policy names and for what, the MIG layout decided for each,
//! and what every team gets (devices, MIG devices, environment, slice, MPS daemons).
//!
//! Instances that do not exist yet have no UUID and no capability minor. Their place in env files,
//! `DeviceAllow=` lists and MPS specs is a visible placeholder (`<new MIG …>`); the executor
//! re-observes after the MIG phases and re-plans, so placeholders never reach the host.

use super::mig::{self, gpu_blocked, team_of_process, LayoutGi, MigOutcome};
use super::Blocked;
use crate::observe::{GpuProcess, MpsSpec, Observed, SliceSpec};
use crate::policy::{GpuUse, Policy, Team, TeamName};
use crate::profiles::Placement;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Device nodes every GPU user needs besides the GPU's own node.
pub const COMMON_DEVICES: &[&str] = &["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// The desired state, as far as it can be known before the MIG changes run.
#[derive(Debug)]
pub struct Desired {
    /// GPUs named by the policy, in index order.
    pub gpus: Vec<GpuDesired>,
    /// What every team of the policy gets.
    pub teams: BTreeMap<TeamName, TeamView>,
    /// Changes held back.
    pub blocked: Vec<Blocked>,
    /// The fences of the slices outside the team shares, by slice; `None`: not planned (the
    /// majors are unknown).
    pub fences: Option<BTreeMap<String, crate::observe::Fence>>,
    /// The loans slice (`gpu-loans.slice`, [`crate::names::LOANS`]) while a team lends: it
    /// allows every device of every lending team's slice, and each borrowed job's scope
    /// narrows itself to its one lent device. No limits of its own: not a team, so no env
    /// file, CDI spec or MPS daemon either.
    pub loans: Option<SliceSpec>,
}

impl Desired {
    /// The slice wanted under `team`'s name: a team's, or the loans slice.
    pub fn slice(&self, team: &str) -> Option<&SliceSpec> {
        match self.teams.get(team) {
            Some(t) => Some(&t.slice),
            None if team == crate::names::LOANS => self.loans.as_ref(),
            None => None,
        }
    }
}

/// The loans slice's spec: the union of the lending teams' device lists; `None` while no team
/// lends. A team that runs MPS lends nothing (its devices are all MPS-shared). While a borrowed
/// job's process is on a GPU, the slice keeps every node it opens now: a lender that stops
/// lending takes its device back through the reclaim's notice and grace, never by a fence
/// change under a running job.
fn loans(
    policy: &Policy,
    teams: &BTreeMap<TeamName, TeamView>,
    observed: &Observed,
) -> Option<SliceSpec> {
    let lenders: Vec<&TeamView> = policy
        .teams
        .values()
        .filter(|t| t.lend.is_some() && t.mps.is_none())
        .filter_map(|t| teams.get(&t.name))
        .collect();
    let mut allow: BTreeSet<String> = lenders
        .iter()
        .flat_map(|t| t.slice.device_allow.iter().cloned())
        .collect();
    let borrowing = observed.gpus.iter().any(|g| {
        g.processes
            .iter()
            .any(|p| super::mig::team_of_process(p) == Some(crate::names::LOANS))
    });
    let live = observed
        .slices
        .iter()
        .find(|(t, _)| &***t == crate::names::LOANS)
        .map(|(_, s)| s);
    if let Some(live) = live.filter(|_| borrowing) {
        allow.extend(live.device_allow.iter().cloned());
    }
    (!allow.is_empty() || !lenders.is_empty()).then(|| SliceSpec {
        device_allow: allow,
        ..SliceSpec::default()
    })
}

/// One GPU the policy names.
#[derive(Debug)]
pub struct GpuDesired {
    /// NVML index.
    pub index: u32,
    /// GPU UUID.
    pub uuid: String,
    /// What the policy wants of it.
    pub usage: GpuUse,
    /// The MIG decision (empty for whole GPUs that are already MIG-off).
    pub mig: MigOutcome,
    /// `Some(teams)` while a handover of the whole GPU waits: processes of a team that would
    /// lose it still run on it, so exactly the teams whose slices allow it now keep it and no
    /// other team gets it yet (issue 17: busy means untouched).
    pub held: Option<BTreeSet<TeamName>>,
}

/// A MIG device (compute instance) a team gets.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct MigDevice {
    /// GPU index.
    pub gpu_index: u32,
    /// GI profile name.
    pub gi_profile: String,
    /// GI placement.
    pub gi_placement: Placement,
    /// CI profile name.
    pub ci_profile: String,
    /// CI placement inside the GI.
    pub ci_placement: Placement,
    /// `MIG-…` UUID, or a placeholder for an instance still to be created.
    pub uuid: String,
    /// Whether the instance exists already.
    pub exists: bool,
    /// Its capability minors (GI and CI `access`), known once it exists: a job placed on it
    /// gets exactly these cap nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cap_minors: Vec<u32>,
}

impl MigDevice {
    /// The MPS daemon instance of this device in `team`'s share (one per MIG device: an MPS
    /// server cannot span MIG devices).
    pub fn mps_instance(&self, team: &str) -> String {
        format!(
            "{team}-mig{}-{}-{}",
            self.gpu_index, self.gi_placement.start, self.ci_placement.start
        )
    }

    /// The nodes a job fenced to this device opens besides [`COMMON_DEVICES`]: the parent GPU's
    /// (minor `gpu_minor`) and its GI and CI capability nodes. `None` while it does not exist or
    /// its capability minors are unknown: nothing could be fenced to it. The CDI entry of the
    /// device and a placed job's `DeviceAllow=` both come from here.
    pub fn fence_nodes(&self, gpu_minor: u32) -> Option<Vec<String>> {
        (self.exists && self.cap_minors.len() >= 2).then(|| {
            std::iter::once(format!("/dev/nvidia{gpu_minor}"))
                .chain(
                    self.cap_minors
                        .iter()
                        .map(|c| format!("/dev/nvidia-caps/nvidia-cap{c}")),
                )
                .collect()
        })
    }
}

/// Everything one team gets.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TeamView {
    /// Team name.
    pub name: TeamName,
    /// Indices of whole GPUs the team owns or shares.
    pub whole_gpus: Vec<u32>,
    /// MIG devices the team owns.
    pub mig_devices: Vec<MigDevice>,
    /// `CUDA_VISIBLE_DEVICES` entries.
    pub visible: Vec<String>,
    /// Env file content.
    pub env: String,
    /// CDI spec content (`/var/run/cdi/gpuctl.io-team-<team>.json`), see [`crate::cdi`].
    pub cdi: String,
    /// Who besides root may read the CDI spec: the team's members (`alice`, `@ml-infer`).
    pub cdi_readers: Vec<String>,
    /// Slice properties, `DeviceAllow=` included.
    pub slice: SliceSpec,
    /// Capability minors the team's MIG devices need (known ones).
    pub cap_minors: BTreeSet<u32>,
    /// MPS daemons by instance name.
    pub mps: BTreeMap<String, MpsSpec>,
    /// Whether some values are placeholders for instances still to be created.
    pub provisional: bool,
}

/// The reference model of an observed GPU. Re-exported from the policy checks so that the
/// validator and the planner agree on what a GPU is.
pub use crate::policy::validate::model_of;

/// Usage of each observed GPU by index, as [`Policy::usage_for`] decides it: the same rules
/// `gpuctl check` validated against (a `model` glob matches the NVML name, the reference key or
/// the simulate name, in any case; `shared` entries naming one GPU add up their teams).
pub fn resolve(policy: &Policy, observed: &Observed) -> BTreeMap<u32, GpuUse> {
    observed
        .gpus
        .iter()
        .filter_map(|g| Some((g.index, policy.usage_for(g)?)))
        .collect()
}

/// Placeholder for the UUID of a MIG device still to be created.
fn placeholder_uuid(gpu: u32, gi: Placement, ci: Placement) -> String {
    format!(
        "<new MIG gpu{gpu} gi@{}+{} ci@{}+{}>",
        gi.start, gi.size, ci.start, ci.size
    )
}

/// Compute the desired state.
pub fn desired(policy: &Policy, observed: &Observed) -> Desired {
    let usage = resolve(policy, observed);
    let mut gpus = Vec::new();
    let mut blocked = Vec::new();
    for g in &observed.gpus {
        let Some(u) = usage.get(&g.index) else {
            continue;
        };
        let want = match u {
            GpuUse::Mig(specs) => Some(specs.as_slice()),
            _ => None,
        };
        let mut out = match model_of(g) {
            Some(m) => mig::plan_gpu(g, m, want, policy.host.reconfigure),
            None => {
                let mut o = MigOutcome::default();
                if want.is_some() || g.mig.as_ref().is_some_and(|m| m.current || m.pending) {
                    let why = format!("unknown GPU model {:?}: MIG left as it is", g.name);
                    o.blocked.push(gpu_blocked(g, None, vec![], why));
                }
                if let Some(m) = &g.mig {
                    o.layout = m.instances.iter().map(LayoutGi::from_existing).collect();
                }
                o
            }
        };
        let held = hold_whole_gpu(g, u, policy, observed, &mut out);
        blocked.extend(out.blocked.iter().cloned());
        gpus.push(GpuDesired {
            index: g.index,
            uuid: g.uuid.clone(),
            usage: u.clone(),
            mig: out,
            held,
        });
    }
    let teams = policy
        .teams
        .values()
        .map(|t| (t.name.clone(), team_view(t, &gpus, observed)))
        .collect();
    Desired {
        gpus,
        loans: loans(policy, &teams, observed),
        teams,
        blocked,
        fences: super::fence::desired(policy.host.outside, observed.majors.as_deref()),
    }
}

/// Whether the whole GPU `g` must stay with the teams that hold it now: a process of a team
/// that the new policy does not give `/dev/nvidiaN` to still runs on it. Under `when-idle` and
/// `never` the handover waits (blocked, holders named); under `drain` the holders are stopped
/// first when each is a drainable unit ([`mig::drain_unit`]), else the handover waits too.
fn hold_whole_gpu(
    g: &crate::observe::GpuState,
    u: &GpuUse,
    policy: &Policy,
    observed: &Observed,
    out: &mut MigOutcome,
) -> Option<BTreeSet<TeamName>> {
    let mut gets: BTreeSet<&str> = match u {
        GpuUse::Owned(t) => [t.as_ref()].into(),
        GpuUse::Shared(ts) => ts.iter().map(AsRef::as_ref).collect(),
        GpuUse::Mig(_) => BTreeSet::new(),
    };
    gets.extend(out.layout.iter().filter_map(|l| l.owner.as_deref()));
    let losing: Vec<&GpuProcess> = g
        .processes
        .iter()
        .filter(|p| team_of_process(p).is_some_and(|t| !gets.contains(t)))
        .collect();
    if losing.is_empty() {
        return None;
    }
    let reconf = policy.host.reconfigure;
    if reconf == crate::policy::Reconfigure::Drain
        && losing.iter().all(|p| mig::drain_unit(p).is_ok())
    {
        for p in &losing {
            if let (Some(t), Ok(unit)) = (team_of_process(p), mig::drain_unit(p)) {
                out.drain.insert((t.to_string(), unit.to_string()));
            }
        }
        return None;
    }
    let node = format!("/dev/nvidia{}", g.minor);
    let keep: BTreeSet<TeamName> = observed
        .slices
        .iter()
        // Any grant of the node counts, also a narrower one read back as `<path> <access>`
        // (a slice set before grants were `rwm`): its processes may hold the GPU.
        .filter(|(_, s)| {
            s.device_allow
                .iter()
                .any(|d| d.split(' ').next() == Some(node.as_str()))
        })
        .map(|(t, _)| t.clone())
        .collect();
    let mut from: Vec<&str> = losing.iter().filter_map(|p| team_of_process(p)).collect();
    from.dedup();
    let to: Vec<&str> = gets.iter().copied().collect();
    let why = match reconf {
        crate::policy::Reconfigure::WhenIdle => "waits until idle (reconfigure = when-idle)",
        crate::policy::Reconfigure::Never => "waits until idle (reconfigure = never)",
        crate::policy::Reconfigure::Drain => {
            "cannot drain: only system services in a team slice are stopped and started again"
        }
    };
    out.blocked.push(gpu_blocked(
        g,
        None,
        losing.iter().map(|p| mig::holder(p)).collect(),
        format!(
            "gpu {} goes from team {} to {}, but team {}'s processes still use it: it is not \
             handed over while they run; {why}",
            g.index,
            from.join(", "),
            if to.is_empty() {
                "no team".to_string()
            } else {
                format!("team {}", to.join(", "))
            },
            from.join(", "),
        ),
    ));
    Some(keep)
}

fn team_view(team: &Team, gpus: &[GpuDesired], observed: &Observed) -> TeamView {
    let name = &team.name;
    let mut slice = team.limits.resolve(observed.host.memory_bytes);
    let mut whole = Vec::new();
    let mut migs = Vec::new();
    let mut cap_minors = BTreeSet::new();
    let mut provisional = false;
    for gd in gpus {
        let Some(g) = observed.gpu(gd.index) else {
            continue;
        };
        let mine = match (&gd.held, &gd.usage) {
            (Some(keep), _) => keep.contains(name.as_ref()),
            (None, GpuUse::Owned(t)) => t == name,
            (None, GpuUse::Shared(ts)) => ts.contains(name),
            (None, GpuUse::Mig(_)) => false,
        };
        if mine {
            whole.push(g.index);
            slice.device_allow.insert(format!("/dev/nvidia{}", g.minor));
        }
        for gi in gd
            .mig
            .layout
            .iter()
            .filter(|l| l.owner.as_deref() == Some(name))
        {
            slice.device_allow.insert(format!("/dev/nvidia{}", g.minor));
            for ci in &gi.cis {
                let mut own_caps = Vec::new();
                let (uuid, exists) = match (&gi.existing, &ci.existing) {
                    (Some(gid), Some((cid, uuid))) => {
                        for key in [
                            format!("gpu{}/gi{gid}/access", g.minor),
                            format!("gpu{}/gi{gid}/ci{cid}/access", g.minor),
                        ] {
                            match observed.mig_minors.get(&key) {
                                Some(m) => {
                                    cap_minors.insert(*m);
                                    own_caps.push(*m);
                                    slice
                                        .device_allow
                                        .insert(format!("/dev/nvidia-caps/nvidia-cap{m}"));
                                }
                                None => {
                                    provisional = true;
                                    slice
                                        .device_allow
                                        .insert(format!("<cap of {key}: not in mig-minors>"));
                                }
                            }
                        }
                        (uuid.clone(), true)
                    }
                    _ => {
                        provisional = true;
                        slice.device_allow.insert(format!(
                            "<cap nodes of new MIG gpu{} gi@{}+{}>",
                            g.index, gi.placement.start, gi.placement.size
                        ));
                        (placeholder_uuid(g.index, gi.placement, ci.placement), false)
                    }
                };
                migs.push(MigDevice {
                    gpu_index: g.index,
                    gi_profile: gi.profile.clone(),
                    gi_placement: gi.placement,
                    ci_profile: ci.profile.clone(),
                    ci_placement: ci.placement,
                    uuid,
                    exists,
                    cap_minors: own_caps,
                });
            }
        }
    }
    if !slice.device_allow.is_empty() {
        slice
            .device_allow
            .extend(COMMON_DEVICES.iter().map(|d| d.to_string()));
    }
    let mut visible: Vec<String> = whole
        .iter()
        .filter_map(|i| observed.gpu(*i))
        .map(|g| g.uuid.clone())
        .collect();
    visible.extend(migs.iter().map(|m| m.uuid.clone()));

    let mut mps = BTreeMap::new();
    if let Some(s) = &team.mps {
        let spec = |devices: Vec<String>| MpsSpec {
            team: name.to_string(),
            devices,
            active_thread_percentage: s.active_thread_percentage,
            pinned_memory_limit: s.pinned_memory_limit,
            user: s.user.clone(),
            group: match team.members.as_slice() {
                [crate::policy::Member::Group(g)] => Some(g.clone()),
                _ => None,
            },
        };
        if !whole.is_empty() {
            // All of a team's whole GPUs share one daemon: one control pipe per share.
            let devs = visible[..whole.len()].to_vec();
            mps.insert(format!("{name}-gpus"), spec(devs));
        }
        for m in &migs {
            mps.insert(m.mps_instance(name), spec(vec![m.uuid.clone()]));
        }
    }
    // A device out of service takes no new work: not in the env file a shell or a service
    // reads, nor in the team's CDI device (its slice keeps it for the jobs that run there).
    let in_service: Vec<String> = visible
        .iter()
        .filter(|u| !observed.out_of_service.contains(*u))
        .cloned()
        .collect();
    let env = env_content(name, &in_service, &mps);
    let instances: Vec<&str> = mps.keys().map(String::as_str).collect();
    let share = crate::cdi::ContainerEdits::new(&slice.device_allow, &env, &instances);
    let cdi = crate::cdi::spec(
        name,
        &share,
        &device_entries(name, &whole, &migs, &mps, observed),
    );
    TeamView {
        name: name.clone(),
        whole_gpus: whole,
        mig_devices: migs,
        visible,
        env,
        cdi,
        cdi_readers: team.members.iter().map(ToString::to_string).collect(),
        slice,
        cap_minors,
        mps,
        provisional,
    }
}

/// A CDI entry per device of the share (`<team>.<UUID>`, [`crate::cdi`]): the device's own
/// nodes and the common ones, its UUID and its MPS daemon, as a placed job on it gets them.
/// A MIG device still to be created, or whose capability nodes are not known, gets none: a
/// container could not be fenced to it.
fn device_entries(
    name: &str,
    whole: &[u32],
    migs: &[MigDevice],
    mps: &BTreeMap<String, MpsSpec>,
    observed: &Observed,
) -> Vec<(String, crate::cdi::ContainerEdits)> {
    let entry = |uuid: &str, mut nodes: BTreeSet<String>, instance: String| {
        nodes.extend(COMMON_DEVICES.iter().map(|d| d.to_string()));
        let mine: BTreeMap<String, MpsSpec> = mps
            .get(&instance)
            .map(|m| (instance.clone(), m.clone()))
            .into_iter()
            .collect();
        let instances: Vec<&str> = mine.keys().map(String::as_str).collect();
        crate::cdi::ContainerEdits::new(
            &nodes,
            &env_content(name, &[uuid.to_string()], &mine),
            &instances,
        )
    };
    let mut out = Vec::new();
    for g in whole.iter().filter_map(|i| observed.gpu(*i)) {
        let nodes = [format!("/dev/nvidia{}", g.minor)].into();
        out.push((
            g.uuid.clone(),
            entry(&g.uuid, nodes, format!("{name}-gpus")),
        ));
    }
    for m in migs {
        let Some(nodes) = observed
            .gpu(m.gpu_index)
            .and_then(|g| m.fence_nodes(g.minor))
        else {
            continue;
        };
        let nodes = nodes.into_iter().collect();
        out.push((m.uuid.clone(), entry(&m.uuid, nodes, m.mps_instance(name))));
    }
    out
}

/// The team env file. With several MPS daemons the first (whole GPUs sort before MIG devices by
/// name) is the default pipe; `GPUCTL_MPS_INSTANCES` lists all so a shell can pick another.
fn env_content(team: &str, visible: &[String], mps: &BTreeMap<String, MpsSpec>) -> String {
    let devs = visible.join(",");
    let nv = if devs.is_empty() {
        "void".to_string()
    } else {
        devs.clone()
    };
    let mut s = format!(
        "# Written by gpuctl for team {team}; changes are overwritten.\n\
         GPUCTL_TEAM={team}\nCUDA_VISIBLE_DEVICES={devs}\nNVIDIA_VISIBLE_DEVICES={nv}\n"
    );
    if devs.is_empty() {
        // A device-less team (or one whose GPUs are missing now): said in so many words, so a
        // member's script can tell "no GPU by design" from a broken view.
        s.push_str("GPUCTL_DEVICES=none\n");
    }
    if let Some(first) = mps.keys().next() {
        s.push_str(&format!(
            "CUDA_MPS_PIPE_DIRECTORY={}\nCUDA_MPS_LOG_DIRECTORY={}\n",
            crate::paths::mps_pipe_dir(first),
            crate::paths::mps_log_dir(first)
        ));
        let all: Vec<&str> = mps.keys().map(String::as_str).collect();
        s.push_str(&format!("GPUCTL_MPS_INSTANCES={}\n", all.join(",")));
    }
    s
}
