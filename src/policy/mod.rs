//! Policy v1: the typed host policy, built from TOML drop-ins.
//!
//! Loading happens in three steps, each its own module:
//! - [`load`]: find the fragments under a root (`/usr/lib` < `/run` < `/etc`, same-name
//!   replacement, `/dev/null` masking, lexical merge order);
//! - [`parse`]: turn one file into a raw document with source locations;
//! - [`validate`]: merge the fragments, check everything, and build a [`Policy`], reporting every
//!   problem found in one pass.
//!
//! Nothing here touches the GPU or systemd; only `load` reads files.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub mod inplace;
pub mod load;
pub mod parse;
pub mod validate;

pub use load::{load, load_files, LoadOutcome};

/// A place in a policy file, for error messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loc {
    /// The file as the admin knows it (the host path, not the test root).
    pub file: PathBuf,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.col)
    }
}

/// How bad a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The policy is rejected.
    Error,
    /// The policy is accepted, but an admin should look.
    Warning,
}

/// One problem found in a policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// Where, when known.
    pub loc: Option<Loc>,
    /// Key path within the file, e.g. `teams.infer.memory-max` or `gpu[1].mig[0].profile`.
    pub key: String,
    /// What is wrong.
    pub message: String,
    /// What would be valid, when that can be said.
    pub help: Option<String>,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(loc) = &self.loc {
            write!(f, "{loc}: ")?;
        }
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{sev}: ")?;
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        write!(f, "{}", self.message)?;
        if let Some(help) = &self.help {
            write!(f, " ({help})")?;
        }
        Ok(())
    }
}

/// The whole, validated host policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// Host-wide settings.
    pub host: HostSettings,
    /// Teams by name.
    pub teams: BTreeMap<String, Team>,
    /// GPU assignments in merge order.
    pub gpus: Vec<GpuAssignment>,
    /// The files merged, in merge order (host paths).
    pub sources: Vec<PathBuf>,
}

/// What to do when a MIG change meets instances with running processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Reconfigure {
    /// Leave busy instances alone, report who blocks, retry later.
    #[default]
    WhenIdle,
    /// Stop the owning team's units, wait up to the drain timeout, then change.
    Drain,
    /// Never destroy or relabel an existing instance (busy or idle), nor turn MIG off while
    /// instances exist; only create new instances in free slices, and report the drift.
    Never,
}

/// Host-wide settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostSettings {
    /// Busy-instance behaviour.
    pub reconfigure: Reconfigure,
    /// How long `drain` waits for a team's units to stop.
    pub drain_timeout: Duration,
    /// Path of `nvidia-cuda-mps-control`.
    pub mps_control: PathBuf,
    /// Explicit `libnvidia-ml.so` path; `None` means the loader's default.
    pub nvml_library: Option<PathBuf>,
}

impl Default for HostSettings {
    fn default() -> Self {
        HostSettings {
            reconfigure: Reconfigure::WhenIdle,
            drain_timeout: Duration::from_secs(300),
            mps_control: PathBuf::from("/usr/bin/nvidia-cuda-mps-control"),
            nvml_library: None,
        }
    }
}

/// A team: who is in it, what limits its slice carries, and its MPS settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Team {
    /// `[a-z][a-z0-9_]{0,30}`; the slice is `gpu-<name>.slice`.
    pub name: String,
    /// Users and groups allowed to join.
    pub members: Vec<Member>,
    /// cgroup limits of the team slice.
    pub limits: Limits,
    /// MPS settings; `None` means the team runs no MPS daemon.
    pub mps: Option<MpsSettings>,
    /// Where the team was (last) defined.
    pub loc: Option<Loc>,
}

/// A team member.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Member {
    /// A Unix user name.
    User(String),
    /// A Unix group (written `@group`), resolved through NSS.
    Group(String),
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Member::User(u) => write!(f, "{u}"),
            Member::Group(g) => write!(f, "@{g}"),
        }
    }
}

/// A size: absolute bytes or a share of host RAM.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Size {
    /// Bytes.
    Bytes(u64),
    /// Percent of host RAM (0 < p ≤ 100).
    PercentOfRam(f64),
}

impl Size {
    /// Bytes on a host with `host_ram` bytes of memory.
    pub fn resolve(&self, host_ram: u64) -> u64 {
        match *self {
            Size::Bytes(b) => b,
            Size::PercentOfRam(p) => ((host_ram as f64) * p / 100.0) as u64,
        }
    }
}

/// cgroup limits of a team slice. `None` leaves systemd's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// `MemoryMax=`.
    pub memory_max: Option<Size>,
    /// `MemoryHigh=`.
    pub memory_high: Option<Size>,
    /// `CPUWeight=` (1..=10000).
    pub cpu_weight: Option<u64>,
    /// `AllowedCPUs=`, normalised (`0-7,16`).
    pub allowed_cpus: Option<String>,
    /// `TasksMax=`.
    pub tasks_max: Option<u64>,
    /// `IOWeight=` (1..=10000).
    pub io_weight: Option<u64>,
}

/// MPS settings of a team.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MpsSettings {
    /// `set_default_active_thread_percentage` (1..=100).
    pub active_thread_percentage: Option<u32>,
    /// `set_default_device_pinned_mem_limit`, in bytes.
    pub pinned_memory_limit: Option<u64>,
    /// The Unix user the MPS control daemon runs as; `None` means root.
    pub user: Option<String>,
}

/// Which GPUs an assignment names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Selector {
    /// NVML indices.
    Index(Vec<u32>),
    /// GPU UUIDs (`GPU-…`).
    Uuid(Vec<String>),
    /// A glob over the NVML name (`*H100*`) or the simulate name (`h100-80gb`).
    Model(String),
    /// Every GPU on the host.
    All,
}

/// What the selected GPUs are used for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuUse {
    /// Whole GPUs owned by one team (MIG off).
    Owned(String),
    /// Whole GPUs shared by several teams (MIG off).
    Shared(Vec<String>),
    /// MIG on, with this geometry on every selected GPU.
    Mig(Vec<MigSpec>),
}

/// `count` GPU instances of one profile for one team.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigSpec {
    /// GI profile name (`3g.40gb`).
    pub profile: String,
    /// Owning team.
    pub owner: String,
    /// How many instances.
    pub count: u32,
    /// Compute-instance split by short name (`1c`, `2c`, …); empty means one full-size CI.
    pub compute: Vec<String>,
}

/// One `[[gpu]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuAssignment {
    /// Which GPUs.
    pub selector: Selector,
    /// What for.
    pub usage: GpuUse,
    /// Where the entry starts.
    pub loc: Option<Loc>,
    /// Key path of the entry in its own file (`gpu[0]`).
    pub key: String,
}

/// Team names become unit names (`gpu-<team>.slice`); a `-` would nest the slice.
pub fn valid_team_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 31
        && b[0].is_ascii_lowercase()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn team_names() {
        for ok in ["a", "infer", "ml_team2", &"a".repeat(31)] {
            assert!(valid_team_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Infer",
            "ml-team",
            "2team",
            "_x",
            &"a".repeat(32),
            "a.b",
            "a/b",
        ] {
            assert!(!valid_team_name(bad), "{bad}");
        }
    }

    #[test]
    fn percent_resolves() {
        assert_eq!(Size::PercentOfRam(25.0).resolve(1 << 40), 1 << 38);
        assert_eq!(Size::Bytes(5).resolve(1 << 40), 5);
    }
}
