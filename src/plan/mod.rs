//! The pure planner: `plan(&Policy, &Observed) -> Plan`.
//!
//! No I/O happens here. The plan is a list of actions in phase order, each with a one-line reason,
//! plus the changes that are blocked (busy instances, pending mode changes) and why.
//!
//! MIG instances are named by their placement, not their driver-chosen id: a placement is unique
//! on a GPU and known before the instance exists, so a plan can name what it will create.

use crate::observe::{MpsSpec, SliceSpec};
use crate::profiles::Placement;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Phases in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Stop units that hold instances about to change (reconfigure = drain), and MPS daemons
    /// on devices about to change.
    Drain,
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
    CreateCapNodes,
    /// Write `/run/gpuctl/teams/<team>.env`.
    WriteEnv {
        /// Team.
        team: String,
        /// File content.
        content: String,
    },
    /// Remove a team's env file.
    RemoveEnv {
        /// Team.
        team: String,
    },
    /// Create or update `gpu-<team>.slice`.
    SetSlice {
        /// Team.
        team: String,
        /// Properties to hold.
        spec: SliceSpec,
    },
    /// Remove `gpu-<team>.slice` (team gone from the policy).
    RemoveSlice {
        /// Team.
        team: String,
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
