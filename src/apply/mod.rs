//! Carrying out a plan: the executor and the small effector traits it drives.
//!
//! Each effector is one narrow trait so that a real backend (NVML, systemd over D-Bus, files
//! under a root) and a simulated one are interchangeable, and tests can verify the exact calls.
//! [`Host`] bundles them for the executor; a real host is a struct that delegates each trait to
//! its backend, the simulated host ([`crate::sim::SimHost`]) implements them all itself.

use crate::observe::{Fence, MpsSpec, Observed, SliceSpec};
use crate::policy::TeamName;
use crate::profiles::Placement;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;
use thiserror::Error;

mod execute;
pub mod journal;
pub mod lock;
pub use execute::{execute, execute_observed, execute_with, PendingMode, Report};

/// A failed effector call, carrying what it concerned.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EffectError {
    /// The thing is busy (NVML_ERROR_IN_USE): processes or child instances hold it.
    #[error("{what}: in use")]
    InUse {
        /// What was being changed.
        what: String,
    },
    /// Not enough free slices (NVML_ERROR_INSUFFICIENT_RESOURCES).
    #[error("{what}: insufficient resources")]
    InsufficientResources {
        /// What was being created.
        what: String,
    },
    /// A call that may succeed when repeated: the bus or the driver did not answer in time,
    /// a systemd job failed or timed out. gpuctld retries these with backoff.
    #[error("{what}: {message}")]
    Transient {
        /// What was being changed.
        what: String,
        /// The backend's message.
        message: String,
    },
    /// Anything else, with the backend's words: repeating the call gives the same answer.
    #[error("{what}: {message}")]
    Other {
        /// What was being changed.
        what: String,
        /// The backend's message.
        message: String,
    },
}

impl EffectError {
    /// Whether the failure may heal without a change of policy or host: a transient error, or a
    /// thing busy now. Drives gpuctld's retry ([`crate::daemon::requeue`]).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            EffectError::Transient { .. } | EffectError::InUse { .. }
        )
    }
}

impl From<crate::files::FileError> for EffectError {
    /// A state file that could not be written, named by its path.
    fn from(e: crate::files::FileError) -> Self {
        journal::file_err(&e.path, e.source)
    }
}

/// MIG mutations on one host. GPUs are named by UUID, instances by driver id.
pub trait GpuEffector {
    /// Set MIG mode; returns `true` when the change is pending a GPU reset.
    fn set_mig_mode(&mut self, gpu: &str, enable: bool) -> Result<bool, EffectError>;
    /// Reset one GPU (never more than the one named).
    fn reset_gpu(&mut self, gpu: &str) -> Result<(), EffectError>;
    /// Create a GPU instance at a placement; returns the driver-chosen GI id.
    fn create_gi(
        &mut self,
        gpu: &str,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, EffectError>;
    /// Destroy a GPU instance.
    fn destroy_gi(&mut self, gpu: &str, gi: u32) -> Result<(), EffectError>;
    /// Create a compute instance at a placement inside a GI; returns the CI id.
    fn create_ci(
        &mut self,
        gpu: &str,
        gi: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, EffectError>;
    /// Destroy a compute instance.
    fn destroy_ci(&mut self, gpu: &str, gi: u32, ci: u32) -> Result<(), EffectError>;
}

/// Takes a fresh snapshot of the host.
///
/// Only [`Observer::observe`] is required. The two narrower calls let a backend whose queries
/// cost something (NVML) do only the work the executor needs; their defaults observe the
/// whole host, which is always correct.
pub trait Observer {
    /// Observe everything the planner reads.
    fn observe(&mut self) -> Result<Observed, EffectError>;

    /// `prev`, brought up to date after this process itself changed the MIG state of `gpus`
    /// (UUIDs): those GPUs are queried again (MIG mode, instances, MIG UUIDs, processes), the
    /// others are kept as in `prev`, and the parts that are not GPUs (files, MIG minors, owner
    /// labels, slices, MPS daemons) are read again. Facts that never change (model, memory,
    /// minor, profile tables) need not be read again.
    fn refresh(
        &mut self,
        prev: &Observed,
        gpus: &BTreeSet<String>,
    ) -> Result<Observed, EffectError> {
        let _ = (prev, gpus);
        self.observe()
    }

    /// Read the processes of GPU `gpu` in `obs` again, placed on its instances (with their
    /// cgroups and units): what a busy check needs right before a destroy.
    fn refresh_processes(&mut self, obs: &mut Observed, gpu: &str) -> Result<(), EffectError> {
        let fresh = self.observe()?;
        if let (Some(slot), Some(g)) = (
            obs.gpus.iter_mut().find(|g| g.uuid == gpu),
            fresh.gpus.into_iter().find(|g| g.uuid == gpu),
        ) {
            *slot = g;
        }
        Ok(())
    }
}

/// gpuctl's own record of which team owns which GPU instance (the driver has no such notion).
pub trait OwnerLabels {
    /// Record `owner` for GI `gi` of `gpu`.
    fn set_owner(&mut self, gpu: &str, gi: u32, owner: &str) -> Result<(), EffectError>;
}

/// systemd units of teams (drain and resume).
pub trait UnitEffector {
    /// Stop units and wait until they are gone, at most `timeout`.
    fn stop_units(&mut self, units: &[String], timeout: Duration) -> Result<(), EffectError>;
    /// Start units again.
    fn start_units(&mut self, units: &[String]) -> Result<(), EffectError>;
    /// Restart units (Slurm's daemons after their GRES file changed). By default a stop, then
    /// a start.
    fn restart_units(&mut self, units: &[String]) -> Result<(), EffectError> {
        self.stop_units(units, Duration::from_secs(90))?;
        self.start_units(units)
    }
}

/// Team slices (`gpu-<team>.slice`), set through systemd unit properties.
pub trait SliceEffector {
    /// Create or update a slice.
    fn set_slice(&mut self, team: &TeamName, spec: &SliceSpec) -> Result<(), EffectError>;
    /// Update a slice last observed as `live` (`None`: not observed, set it whole). An effector
    /// may send only what differs; by default the whole slice is set.
    fn update_slice(
        &mut self,
        team: &TeamName,
        spec: &SliceSpec,
        live: Option<&SliceSpec>,
    ) -> Result<(), EffectError> {
        let _ = live;
        self.set_slice(team, spec)
    }
    /// Remove a slice.
    fn remove_slice(&mut self, team: &TeamName) -> Result<(), EffectError>;
    /// Set the device filter of a slice outside the team shares (`user.slice`): exactly
    /// `fence`'s policy and entries. A host that cannot says so.
    fn set_fence(&mut self, slice: &str, fence: &Fence) -> Result<(), EffectError> {
        let _ = fence;
        Err(EffectError::Other {
            what: slice.to_string(),
            message: "this host cannot set device filters outside the team slices".into(),
        })
    }
}

/// MPS control daemons.
pub trait MpsEffector {
    /// Called once before the `start_mps` calls of a run, with all of them: an effector may do
    /// once here what each start would do (systemd: write every drop-in, then one
    /// daemon-reload). An error here is not final: each start then does its own work and
    /// reports its own error. By default nothing.
    fn prepare_mps(&mut self, starts: &[(&str, &MpsSpec)]) -> Result<(), EffectError> {
        let _ = starts;
        Ok(())
    }
    /// Start, or restart with new settings, a daemon instance.
    fn start_mps(&mut self, instance: &str, spec: &MpsSpec) -> Result<(), EffectError>;
    /// Stop a daemon instance.
    fn stop_mps(&mut self, instance: &str) -> Result<(), EffectError>;
}

/// Files gpuctl owns: team env files, team CDI specs and MIG capability device nodes.
pub trait FileEffector {
    /// Write `/run/gpuctl/teams/<team>.env` atomically.
    fn write_env(&mut self, team: &TeamName, content: &str) -> Result<(), EffectError>;
    /// Remove a team's env file.
    fn remove_env(&mut self, team: &TeamName) -> Result<(), EffectError>;
    /// Write a team's CDI spec (`/var/run/cdi/gpuctl.io-team-<team>.json`) atomically,
    /// readable by root and `readers` (members as the policy names them) only.
    fn write_cdi(
        &mut self,
        team: &TeamName,
        content: &str,
        readers: &[String],
    ) -> Result<(), EffectError>;
    /// Remove a team's CDI spec.
    fn remove_cdi(&mut self, team: &TeamName) -> Result<(), EffectError>;
    /// Create `/dev/nvidia-caps/nvidia-capN` for each minor.
    fn create_cap_nodes(&mut self, minors: &[u32]) -> Result<(), EffectError>;
}

/// Slurm on a Slurm node (`[slurm] enabled`, docs/slurm.md): `scontrol` and the GRES file.
pub trait SlurmEffector {
    /// `scontrol update NodeName=node State=DRAIN Reason=reason`.
    fn drain_node(&mut self, node: &str, reason: &str) -> Result<(), EffectError>;
    /// `scontrol update NodeName=node State=RESUME`.
    fn resume_node(&mut self, node: &str) -> Result<(), EffectError>;
    /// Write the GRES file atomically.
    fn write_gres(&mut self, path: &Path, content: &str) -> Result<(), EffectError>;
    /// `scontrol reconfigure`, then restart `restart` (units) so Slurm reads the new types.
    fn reload_slurm(&mut self, restart: &[String]) -> Result<(), EffectError>;
}

/// Everything the executor drives.
pub trait Host:
    Observer
    + GpuEffector
    + OwnerLabels
    + UnitEffector
    + SliceEffector
    + MpsEffector
    + FileEffector
    + SlurmEffector
{
}

impl<T> Host for T where
    T: Observer
        + GpuEffector
        + OwnerLabels
        + UnitEffector
        + SliceEffector
        + MpsEffector
        + FileEffector
        + SlurmEffector
{
}
