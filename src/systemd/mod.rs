//! The systemd layer: a typed D-Bus client for `org.freedesktop.systemd1` ([`client::Systemd`]),
//! the pure property encodings ([`props`]), the MPS unit helpers ([`mps`]), and the narrow
//! [`SliceEffector`] trait the reconciler drives.
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

use crate::observe::{MpsSpec, SliceSpec};
use std::path::PathBuf;
use thiserror::Error;

pub mod client;
pub mod mps;
pub mod props;
pub mod proxy;

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
    /// A value cannot be expressed as a unit property.
    #[error("{unit}: {message}")]
    Invalid {
        /// Unit.
        unit: String,
        /// What is wrong.
        message: String,
    },
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

/// The systemd side of making a host match a plan: team slices, MPS daemons, team units.
///
/// Synchronous on purpose, like [`crate::apply::GpuEffector`]: the executor is plain code that
/// runs on a blocking thread. [`client::BlockingSystemd`] implements it over the async client;
/// tests implement it with a recorder.
pub trait SliceEffector {
    /// Make `gpu-<team>.slice` hold exactly `spec` (limits, `DevicePolicy=closed`, the device
    /// list) and make sure it is active, so its cgroup exists.
    fn set_slice(&mut self, team: &str, spec: &SliceSpec) -> Result<(), SystemdError>;
    /// Remove a team's slice. Refuses (error) while processes run in it: removing a team from
    /// the policy must not kill its jobs.
    fn remove_slice(&mut self, team: &str) -> Result<(), SystemdError>;
    /// The live properties of `gpu-<team>.slice` as a [`SliceSpec`], `None` when the slice is
    /// not loaded or not under gpuctl's device control.
    fn read_slice(&mut self, team: &str) -> Result<Option<SliceSpec>, SystemdError>;
    /// Teams that have a `gpu-<team>.slice` loaded.
    fn list_slices(&mut self) -> Result<Vec<String>, SystemdError>;
    /// Write the instance's files and start (or restart, when its settings changed) the MPS
    /// daemon `gpuctl-mps@<instance>.service`.
    fn start_mps(&mut self, instance: &str, spec: &MpsSpec) -> Result<(), SystemdError>;
    /// Stop an MPS daemon (its `ExecStop` sends `quit`).
    fn stop_mps(&mut self, instance: &str) -> Result<(), SystemdError>;
    /// Running MPS daemons by instance, as last configured.
    fn list_mps(&mut self) -> Result<Vec<(String, MpsSpec)>, SystemdError>;
    /// Stop units and wait for each job.
    fn stop_units(&mut self, units: &[String]) -> Result<(), SystemdError>;
    /// Start units and wait for each job.
    fn start_units(&mut self, units: &[String]) -> Result<(), SystemdError>;
}
