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

pub mod caps;
pub mod inplace;
pub mod lend;
pub mod load;
pub mod parse;
pub mod validate;

pub use crate::names::{valid_team_name, BadTeamName, TeamName};
pub use crate::settings::value::{escape_controls, Loc, Size};
pub use crate::settings::Limits;
pub use lend::{LendRule, LendTo, Window};
pub use load::{load, load_files, LoadOutcome, Rejected};

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

impl Diagnostic {
    /// An error about `key` (empty: none) at `loc`.
    pub fn error(loc: Option<Loc>, key: &str, message: String, help: Option<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            loc,
            key: key.to_string(),
            message,
            help,
        }
    }

    /// A warning about `key` (empty: none) at `loc`.
    pub fn warning(loc: Option<Loc>, key: &str, message: String, help: Option<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Self::error(loc, key, message, help)
        }
    }
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
            write!(f, "{}: ", escape_controls(&self.key))?;
        }
        write!(f, "{}", escape_controls(&self.message))?;
        if let Some(help) = &self.help {
            write!(f, " ({})", escape_controls(help))?;
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
    pub teams: BTreeMap<TeamName, Team>,
    /// GPU assignments in merge order.
    pub gpus: Vec<GpuAssignment>,
    /// The files merged, in merge order (host paths).
    pub sources: Vec<PathBuf>,
    /// `[slurm]`: whether this host is a Slurm node, and how gpuctl keeps Slurm informed.
    #[serde(default)]
    pub slurm: SlurmSettings,
    /// The layout each re-sliced GPU has now, by NVML index (gpuctld's choice, not the file's):
    /// a name of its entry's `[[gpu.layout]]`; a GPU not named keeps the entry's own use.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub layouts_in_force: BTreeMap<u32, String>,
}

/// `[slurm]` (docs/slurm.md). Off by default: with `enabled = false` nothing Slurm-related runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmSettings {
    /// This host is a Slurm node: keep the GRES file current, drain around MIG changes.
    pub enabled: bool,
    /// The GRES file gpuctl owns, included from the admin's `gres.conf`.
    pub gres_file: PathBuf,
    /// The node's Slurm `NodeName`; `None`: the host's short name, as slurmd assumes.
    pub node_name: Option<String>,
    /// Type each device by its team (`interns_1g.10gb`), so jobs can ask for a team's share.
    pub team_types: bool,
    /// Units restarted after the GRES file changed (Slurm re-reads `Type=` only on a restart).
    pub restart: Vec<String>,
    /// A slurm.conf fragment gpuctl keeps: `NodeName=DEFAULT Gres=…`, included right before
    /// the node's own line (one-node clusters; `None`: config management writes `Gres=`).
    #[serde(default)]
    pub node_file: Option<PathBuf>,
}

impl SlurmSettings {
    /// Default `gres-file`.
    pub const DEFAULT_GRES_FILE: &'static str = "/etc/slurm/gres.d/gpuctl.conf";
}

impl Default for SlurmSettings {
    fn default() -> Self {
        SlurmSettings {
            enabled: false,
            gres_file: PathBuf::from(Self::DEFAULT_GRES_FILE),
            node_name: None,
            team_types: false,
            restart: vec!["slurmd.service".into()],
            node_file: None,
        }
    }
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

/// Whether NVIDIA devices open outside the team shares (`[host] outside`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Outside {
    /// `user.slice` and `machine.slice` are fenced: every device but NVIDIA's opens there.
    #[default]
    Closed,
    /// No fence outside the shares (gpuctl before the setting existed).
    Open,
}

/// Host-wide settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostSettings {
    /// Busy-instance behaviour.
    pub reconfigure: Reconfigure,
    /// How long `drain` waits for a team's units to stop.
    pub drain_timeout: Duration,
    /// Explicit `libnvidia-ml.so` path; `None` means the loader's default.
    pub nvml_library: Option<PathBuf>,
    /// When the GPU-hours ledger samples (docs/ledger.md).
    #[serde(default)]
    pub accounting: Accounting,
    /// NVIDIA devices outside the team shares; a last good policy from before the setting
    /// reads as the default.
    #[serde(default)]
    pub outside: Outside,
    /// Members of this group (and root) read every team's per-process detail (user, pid,
    /// command, unit) from `Usage`, `Idle` and `Metrics`; others only their own teams'.
    #[serde(default)]
    pub admin_group: Option<String>,
    /// `[host.health]`: which XIDs are the application's, what happens to jobs on a
    /// quarantined device, idle resets (docs/health.md).
    #[serde(default)]
    pub health: crate::health::HealthSettings,
    /// `fair-share-half-life`: how fast past usage stops counting in the `--wait` queue's
    /// order ([`crate::lending::fair_order`]).
    #[serde(default = "default_half_life")]
    pub fair_share_half_life: Duration,
}

fn default_half_life() -> Duration {
    lend::DEFAULT_HALF_LIFE
}

/// `[host] accounting`: when gpuctld keeps the GPU-hours ledger (docs/ledger.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Accounting {
    /// Account from the samples the idle rules take anyway: no extra wakeup or NVML read, and
    /// nothing while no team has an idle rule.
    #[default]
    Auto,
    /// Sample every idle interval even when no team has an idle rule.
    On,
    /// Keep no ledger.
    Off,
}

impl Default for HostSettings {
    fn default() -> Self {
        HostSettings {
            reconfigure: Reconfigure::WhenIdle,
            drain_timeout: Duration::from_secs(300),
            nvml_library: None,
            accounting: Accounting::Auto,
            outside: Outside::Closed,
            admin_group: None,
            health: crate::health::HealthSettings::default(),
            fair_share_half_life: lend::DEFAULT_HALF_LIFE,
        }
    }
}

/// A team: who is in it, what limits its slice carries, and its MPS settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Team {
    /// The slice is `gpu-<name>.slice`.
    pub name: TeamName,
    /// Users and groups allowed to join.
    pub members: Vec<Member>,
    /// cgroup limits of the team slice.
    pub limits: Limits,
    /// MPS settings; `None` means the team runs no MPS daemon.
    pub mps: Option<MpsSettings>,
    /// `[teams.NAME.idle]`: what to do about idle holders; `None` means nothing happens.
    #[serde(default)]
    pub idle: Option<IdleRule>,
    /// `[teams.NAME.placement]`: how jobs are placed on the share's devices.
    #[serde(default)]
    pub placement: PlacementSettings,
    /// `[teams.NAME.lend]`: which of its idle devices other teams may borrow; `None`: none.
    #[serde(default)]
    pub lend: Option<LendRule>,
    /// `borrow`: its members' jobs borrow without `--borrow` when its own share is full.
    #[serde(default)]
    pub borrow: bool,
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

/// How a team's jobs are placed on its share's devices (`[teams.NAME.placement]`, see
/// [`crate::placement`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementSettings {
    /// Jobs per device: `None` is 1 per MIG device or whole GPU without MPS and no cap on MPS
    /// devices; `Some(0)` turns placement off (every job gets the whole share).
    pub jobs_per_device: Option<u32>,
    /// Devices a job gets unless it asks (`None`: 1).
    pub gpus: Option<crate::placement::Gpus>,
    /// A job's MPS pinned device memory limit in bytes unless it asks.
    pub gpu_memory: Option<u64>,
}

impl PlacementSettings {
    /// Whether every job is placed, asked or not: unless the team turns placement off
    /// (`jobs-per-device = 0`). A CUDA process uses one MIG device, and frameworks take the
    /// first GPU they see: a job handed the whole share piles onto its first device.
    pub fn enabled(&self) -> bool {
        self.jobs_per_device != Some(0)
    }
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

/// What gpuctld does about a holder found idle (or over its memory alarm).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum IdleAction {
    /// A metric and a journal entry.
    #[default]
    Report,
    /// Also a message on the holder's terminals and a journal entry with its uid.
    Warn,
    /// Warn, then stop the holding unit after `grace`.
    Stop,
}

impl fmt::Display for IdleAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdleAction::Report => "report",
            IdleAction::Warn => "warn",
            IdleAction::Stop => "stop",
        })
    }
}

/// `[teams.NAME.idle]`: when a holder of the team's GPU share counts as idle, and what then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleRule {
    /// How long the device's activity must stay below `below` (observed time, see `idle`).
    pub after: Duration,
    /// Activity threshold, percent (0 < p ≤ 100).
    pub below: f64,
    /// What to do.
    pub action: IdleAction,
    /// With `stop`: time between the warning and the stop.
    pub grace: Duration,
    /// Unit-name globs (`*`, `?`) never acted on.
    pub exclude: Vec<String>,
    /// Percent of the share's memory at which a holder is reported as a memory runaway.
    pub memory_alarm: Option<f64>,
}

impl IdleRule {
    /// Defaults of the keys not written (`after` has none: it is required).
    pub const DEFAULT_BELOW: f64 = 5.0;
    /// Default `grace`.
    pub const DEFAULT_GRACE: Duration = Duration::from_secs(15 * 60);
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
    Owned(TeamName),
    /// Whole GPUs shared by several teams (MIG off).
    Shared(Vec<TeamName>),
    /// MIG on, with this geometry on every selected GPU. Empty (`mig = []`): MIG on with no
    /// instances, a GPU held for later carving that gives no team anything.
    Mig(Vec<MigSpec>),
}

/// `count` GPU instances of one profile for one team.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigSpec {
    /// GI profile name (`3g.40gb`).
    pub profile: String,
    /// Owning team.
    pub owner: TeamName,
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
    /// `[[gpu.layout]]` and `[gpu.reslice]`: other layouts the GPUs may take, besides `usage`
    /// (the default); gpuctld picks one per GPU (`Policy::layouts_in_force`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layouts: Option<Layouts>,
}

/// `reslice.after` unless set: as long as a lender's `after`.
pub const DEFAULT_RESLICE_AFTER: std::time::Duration = std::time::Duration::from_secs(600);
/// `reslice.hold` unless set.
pub const DEFAULT_RESLICE_HOLD: std::time::Duration = std::time::Duration::from_secs(1800);

/// The layout of a `[[gpu]]` entry's own use: the one a GPU takes unless demand or the
/// calendar picks another.
pub const DEFAULT_LAYOUT: &str = "default";

/// One more layout a GPU may take (`[[gpu.layout]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Layout {
    /// `name`, unique within the entry (`default` is the entry's own use).
    pub name: String,
    /// `owner`, `shared` or `mig`, as in the entry itself.
    pub usage: GpuUse,
    /// `when`: calendar windows in which this layout is preferred; empty: taken only for demand.
    pub when: Vec<Window>,
}

/// The layouts a `[[gpu]]` entry allows besides its own use, and when a GPU may switch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Layouts {
    /// The other layouts, in file order (the first open window wins a calendar preference).
    pub other: Vec<Layout>,
    /// `reslice.after`: how long every instance a switch destroys must have been idle.
    pub after: std::time::Duration,
    /// `reslice.hold`: the least time a GPU stays in a layout before it switches again.
    pub hold: std::time::Duration,
}

impl Layouts {
    /// Every layout the entry allows, the default (`usage`) first.
    pub fn all(&self, usage: &GpuUse) -> Vec<Layout> {
        std::iter::once(Layout {
            name: DEFAULT_LAYOUT.to_string(),
            usage: usage.clone(),
            when: Vec::new(),
        })
        .chain(self.other.iter().cloned())
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_resolves() {
        assert_eq!(Size::PercentOfRam(25.0).resolve(1 << 40), 1 << 38);
        assert_eq!(Size::Bytes(5).resolve(1 << 40), 5);
    }

    #[test]
    fn every_job_is_placed_unless_the_team_turns_placement_off() {
        let with = |jobs_per_device| PlacementSettings {
            jobs_per_device,
            ..Default::default()
        };
        assert!(with(None).enabled(), "the default places");
        assert!(with(Some(2)).enabled());
        assert!(!with(Some(0)).enabled());
    }
}
