//! A typed snapshot of the host: GPUs and their MIG state, team slices, MPS daemons, team
//! environment files.
//!
//! The snapshot is plain data. It is filled by effectors (NVML, systemd, files) on a real host and
//! by [`crate::sim`] on a simulated one; the planner only reads it.

use crate::names::TeamName;
use crate::profiles::Placement;
pub use crate::settings::SliceSpec;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Everything the planner needs to know about the host.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    /// RAM and CPUs.
    pub host: HostInfo,
    /// Whether NVML could be used; `Some(reason)` when it could not (no driver, no library).
    #[serde(default)]
    pub nvml_unavailable: Option<String>,
    /// GPUs by NVML index order.
    pub gpus: Vec<GpuState>,
    /// Contents of `/proc/driver/nvidia-caps/mig-minors`: `gpu0/gi1/ci0/access` → minor.
    #[serde(default)]
    pub mig_minors: BTreeMap<String, u32>,
    /// Live team slices by team name (only `gpu-<team>.slice` units gpuctl manages; a unit
    /// whose name is no valid team name is not one of them).
    #[serde(default)]
    pub slices: BTreeMap<TeamName, SliceSpec>,
    /// Running MPS daemons by instance name.
    #[serde(default)]
    pub mps: BTreeMap<String, MpsSpec>,
    /// `/run/gpuctl/teams/<team>.env` contents by team.
    #[serde(default)]
    pub env_files: BTreeMap<TeamName, String>,
    /// Team CDI specs (`/var/run/cdi/gpuctl.io-team-<team>.json`) by team.
    #[serde(default)]
    pub cdi_specs: BTreeMap<TeamName, String>,
    /// Who each team spec's ACL lets read it, named as the policy names members (`alice`,
    /// `@ml-infer`; `#1234` for an id without a name).
    #[serde(default)]
    pub cdi_readers: BTreeMap<TeamName, Vec<String>>,
    /// Minors `N` whose `/dev/nvidia-caps/nvidia-capN` node exists.
    #[serde(default)]
    pub cap_nodes: BTreeSet<u32>,
    /// The device majors the kernel has registered (`/proc/devices`); `None` when they were
    /// not read (a simulated host, a root without the file): no fence is planned then.
    #[serde(default)]
    pub majors: Option<Vec<Major>>,
    /// Device settings of the slices fenced outside the team shares (`user.slice`,
    /// `machine.slice`), by unit, as systemd reads them back.
    #[serde(default)]
    pub fences: BTreeMap<String, Fence>,
    /// Slurm, read only when the policy's `[slurm]` is enabled.
    #[serde(default)]
    pub slurm: Option<SlurmObserved>,
    /// Devices (GPU or MIG UUIDs) out of service (a fatal health event, `gpuctl device
    /// drain`): gpuctld's own state, not the host's, handed to the observer so that the team
    /// env files leave them out.
    #[serde(default)]
    pub out_of_service: BTreeSet<String>,
}

/// One line of `/proc/devices`: a registered character or block major and its driver's name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Major {
    /// A block major (the `Block devices:` section), else a character one.
    pub block: bool,
    /// The major number.
    pub number: u32,
    /// The name the driver registered it under (`nvidia-uvm`, `drm`, `misc`).
    pub name: String,
}

/// The device settings of a slice outside the team shares: `DevicePolicy=` and
/// `DeviceAllow=` entries (`char-drm`, or `char-drm r` for an access other than `rwm`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// `DevicePolicy=`: `auto` (systemd's default), `closed` or `strict`.
    pub policy: String,
    /// `DeviceAllow=` entries.
    pub allow: BTreeSet<String>,
}

impl Fence {
    /// systemd's default: no device filter.
    pub fn open() -> Self {
        Fence {
            policy: "auto".into(),
            allow: BTreeSet::new(),
        }
    }

    /// Whether the slice filters devices at all (`auto` with no entries does not).
    pub fn is_open(&self) -> bool {
        self.policy == "auto" && self.allow.is_empty()
    }
}

/// Host RAM and CPUs, for percentage limits and CPU sets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostInfo {
    /// Bytes of RAM.
    pub memory_bytes: u64,
    /// Online CPUs.
    pub cpus: u32,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuState {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Name NVML reports.
    pub name: String,
    /// Reference key of the model, when known (`H100-SXM5-80GB`).
    pub model: Option<String>,
    /// Minor number: the `N` of `/dev/nvidiaN`.
    pub minor: u32,
    /// Framebuffer in MiB.
    pub memory_mib: u64,
    /// MIG state; `None` when the GPU cannot do MIG.
    pub mig: Option<MigState>,
    /// Compute processes on the whole GPU (outside MIG).
    #[serde(default)]
    pub processes: Vec<GpuProcess>,
}

/// MIG mode and instances of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MigState {
    /// Mode in force.
    pub current: bool,
    /// Mode that takes effect after a GPU reset (differs from `current` while pending).
    pub pending: bool,
    /// GPU instances.
    pub instances: Vec<GpuInstance>,
}

impl MigState {
    /// Whether a mode change waits for a GPU reset.
    pub fn is_pending(&self) -> bool {
        self.current != self.pending
    }
}

/// A GPU instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInstance {
    /// GI id, chosen by the driver (0..=14).
    pub id: u32,
    /// Published profile ID.
    pub profile_id: u32,
    /// Profile name (`3g.40gb`), from the reference data.
    pub profile: String,
    /// Placement in memory slices; unique per GPU, so it names the instance in plans.
    pub placement: Placement,
    /// Team gpuctl assigned it to (from its own state), `None` when gpuctl did not create it.
    pub owner: Option<String>,
    /// Compute instances.
    pub compute: Vec<ComputeInstance>,
}

/// A compute instance: one MIG device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComputeInstance {
    /// CI id within its GI (0..=7).
    pub id: u32,
    /// CI profile ID.
    pub profile_id: u32,
    /// Profile name (`1c.3g.40gb` or the GI name for a full CI).
    pub profile: String,
    /// Placement in compute slices of the GI.
    pub placement: Placement,
    /// `MIG-…` UUID of the MIG device.
    pub uuid: String,
    /// Compute processes on this MIG device.
    #[serde(default)]
    pub processes: Vec<GpuProcess>,
}

/// A process using a GPU or a MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    /// PID.
    pub pid: u32,
    /// Bytes of GPU memory used.
    #[serde(default)]
    pub used_memory: u64,
    /// systemd unit owning the PID (from its cgroup), when known.
    #[serde(default)]
    pub unit: Option<String>,
    /// cgroup path of the PID, when known.
    #[serde(default)]
    pub cgroup: Option<String>,
}

/// One MPS control daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsSpec {
    /// Owning team.
    pub team: String,
    /// `CUDA_VISIBLE_DEVICES` of the daemon: GPU or MIG UUIDs.
    pub devices: Vec<String>,
    /// Default active thread percentage.
    pub active_thread_percentage: Option<u32>,
    /// Default pinned device memory limit in bytes.
    pub pinned_memory_limit: Option<u64>,
    /// Unix user of the daemon; `None` is the default `gpuctl-mps`.
    pub user: Option<String>,
    /// Group of the daemon and its pipe directory (0750): the team's group when the team is
    /// exactly one `@group`; `None` leaves the pipe directory world-searchable (0755), because
    /// no one group holds every member.
    #[serde(default)]
    pub group: Option<String>,
}

impl Observed {
    /// GPU by index.
    pub fn gpu(&self, index: u32) -> Option<&GpuState> {
        self.gpus.iter().find(|g| g.index == index)
    }
}

/// A node as `scontrol show node -o` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmNode {
    /// `NodeName`.
    pub name: String,
    /// The node carries the DRAIN flag.
    pub drain: bool,
    /// Jobs still run on it (ALLOCATED, MIXED or COMPLETING): a drain has not finished.
    pub busy: bool,
    /// `Reason=`, when set.
    pub reason: Option<String>,
}

/// What gpuctl observed of Slurm, when `[slurm]` is enabled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmObserved {
    /// The node, or why `scontrol` could not say.
    pub node: Result<SlurmNode, String>,
    /// The GRES file as it is on disk; `None` when it does not exist.
    pub gres_file: Option<String>,
    /// The `node-file` as it is on disk, when the policy names one and it exists.
    #[serde(default)]
    pub node_file: Option<String>,
}
