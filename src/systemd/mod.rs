//! The systemd layer: a typed D-Bus client for `org.freedesktop.systemd1` ([`client::Systemd`]),
//! the pure property encodings ([`props`]), the MPS unit helpers ([`mps`]), and
//! [`client::BlockingSystemd`], which implements the executor's slice, MPS and unit effectors
//! ([`crate::apply`]) plus [`LiveUnits`], the reads the observer needs.
//!
//! Design decisions, recorded here because they shape every caller:
//! - Live changes use `SetUnitProperties(runtime = true)`: drop-ins under
//!   `/run/systemd/system.control/`, gone at reboot. The *boot* state comes from the generator
//!   ([`crate::daemon::generator`]), which writes `gpu-<team>.slice` unit files from the last
//!   successfully applied state (`/var/lib/gpuctl/slices.json`). One source of boot truth, no
//!   persistent clutter under `/etc/systemd/system.control/` that would outlive a removed team
//!   and override the generator.
//! - `DeviceAllow` on a live unit appends; [`props::slice_properties`] resets the list in the
//!   same call before setting it.
//! - MPS daemons run as `gpuctl-mps@<team>-<n>.service` with `Slice=gpu-%i.slice`: systemd nests
//!   `gpu-infer-0.slice` under `gpu-infer.slice`, so each daemon inherits its team's device list
//!   and limits without a per-instance drop-in or a `daemon-reload`.

use crate::apply::{EffectError, MpsEffector, SliceEffector, UnitEffector};
use crate::observe::{MpsSpec, SliceSpec};
use crate::policy::TeamName;
use std::path::PathBuf;
use thiserror::Error;

pub mod client;
pub mod mps;
pub mod props;
pub mod proxy;
pub mod scope;

pub use client::Systemd;

/// A failed systemd or file operation, naming the unit or path concerned.
#[derive(Debug, Error)]
pub enum SystemdError {
    /// A D-Bus call failed.
    #[error("{unit}: {op}: {source}")]
    Bus {
        /// Unit the call concerned (or the manager).
        unit: String,
        /// Method or property.
        op: &'static str,
        /// zbus' error (boxed: it is large and errors travel through every Result here).
        #[source]
        source: Box<zbus::Error>,
    },
    /// A job ended with a result other than `done`.
    #[error("{unit}: {op} job finished with result '{result}'")]
    Job {
        /// Unit.
        unit: String,
        /// `start`, `stop`, `restart`.
        op: &'static str,
        /// systemd's job result (`failed`, `timeout`, `dependency`, …).
        result: String,
    },
    /// A job did not finish in time.
    #[error("{unit}: {op} job did not finish within {secs} s")]
    JobTimeout {
        /// Unit.
        unit: String,
        /// Operation.
        op: &'static str,
        /// Seconds waited.
        secs: u64,
    },
    /// A file could not be written or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A slice to be removed still has tasks: removing a team from the policy must not kill
    /// its jobs, so the slice stays until it is empty.
    #[error("{unit}: {tasks} tasks still run in it; left in place")]
    Busy {
        /// The slice unit.
        unit: String,
        /// `pids.current` of its cgroup.
        tasks: u64,
    },
    /// A value cannot be expressed as a unit property.
    #[error("{unit}: {message}")]
    Invalid {
        /// Unit.
        unit: String,
        /// What is wrong.
        message: String,
    },
}

impl From<crate::files::FileError> for SystemdError {
    fn from(e: crate::files::FileError) -> Self {
        SystemdError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

/// Live usage of a team slice, for `Status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SliceUsage {
    /// `ActiveState` of the slice unit.
    pub active_state: String,
    /// `memory.current` in bytes, when the cgroup exists.
    pub memory_current: Option<u64>,
    /// `pids.current`, when the cgroup exists.
    pub tasks_current: Option<u64>,
}

impl From<SystemdError> for EffectError {
    /// The executor's error, still naming the unit or path: a busy slice is `InUse` (the
    /// caller reports it as "left in place", not as a failure of the run).
    fn from(e: SystemdError) -> Self {
        match e {
            SystemdError::Busy { .. } => EffectError::InUse {
                what: e.to_string(),
            },
            // The bus, a job's failure or timeout: the next try may succeed (a unit restarted
            // too fast, systemd busy with a daemon-reload).
            SystemdError::Bus { ref unit, .. }
            | SystemdError::Job { ref unit, .. }
            | SystemdError::JobTimeout { ref unit, .. } => EffectError::Transient {
                what: unit.clone(),
                message: without_prefix(&e, unit),
            },
            SystemdError::Invalid { ref unit, .. } => EffectError::Other {
                what: unit.clone(),
                message: without_prefix(&e, unit),
            },
            SystemdError::Io { path, source } => crate::files::FileError { path, source }.into(),
        }
    }
}

/// `e`'s message without the `unit: ` it starts with (the effect error names the unit apart).
fn without_prefix(e: &SystemdError, unit: &str) -> String {
    e.to_string()
        .trim_start_matches(&format!("{unit}: "))
        .to_string()
}

/// What gpuctl reads back from systemd to observe the host: the live team slices and MPS
/// daemons. The writes are the executor's effector traits ([`SliceEffector`],
/// [`MpsEffector`], [`UnitEffector`]).
pub trait LiveUnits {
    /// The live properties of `gpu-<team>.slice` as a [`SliceSpec`], `None` when the slice is
    /// not loaded or not under gpuctl's device control.
    fn read_slice(&mut self, team: &str) -> Result<Option<SliceSpec>, SystemdError>;
    /// Teams that have a running `gpu-<team>.slice`.
    fn list_slices(&mut self) -> Result<Vec<TeamName>, SystemdError>;
    /// Running MPS daemons by instance, as last configured.
    fn list_mps(&mut self) -> Result<Vec<(String, MpsSpec)>, SystemdError>;
    /// The device settings of `slices` (units outside the team shares); a slice that is not
    /// loaded reads as systemd's default, [`crate::observe::Fence::open`]. By default none is
    /// read (a recorder in tests): the planner then takes every one as open.
    fn read_fences(
        &mut self,
        slices: &[&str],
    ) -> Result<std::collections::BTreeMap<String, crate::observe::Fence>, SystemdError> {
        let _ = slices;
        Ok(Default::default())
    }
    /// Every running team slice under gpuctl's device control, with its settings: by default
    /// [`Self::list_slices`] then [`Self::read_slice`] each; the bus client reads them at once.
    fn read_running_slices(
        &mut self,
    ) -> Result<std::collections::BTreeMap<TeamName, SliceSpec>, SystemdError> {
        let mut out = std::collections::BTreeMap::new();
        for team in self.list_slices()? {
            if let Some(spec) = self.read_slice(&team)? {
                out.insert(team, spec);
            }
        }
        Ok(out)
    }
}

/// Everything a host needs from systemd: the three effectors and the live reads.
/// [`client::BlockingSystemd`] is the real one; tests use recorders.
pub trait SystemdSide:
    SliceEffector + MpsEffector + UnitEffector + LiveUnits + Send + std::fmt::Debug
{
}

impl<T> SystemdSide for T where
    T: SliceEffector + MpsEffector + UnitEffector + LiveUnits + Send + std::fmt::Debug
{
}
