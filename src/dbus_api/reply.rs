//! The typed replies of `org.gpuctl.Agent1`, defined once and used by both sides: gpuctld
//! serialises them into the JSON strings its methods return, `gpuctl` deserialises the same
//! types. Fields are declared in alphabetical order, the order the documents have always had
//! (they used to be built with `json!`, whose maps sort their keys); `gpuctl --json` prints
//! the document through `serde_json::Value`, which sorts nested keys too, so its output is the
//! same as before. Status structs take `#[serde(default)]`: a client reads what an older or
//! newer daemon sends.

use crate::join::Via;
use crate::observe::{GpuInstance, GpuState, MpsSpec, SliceSpec};
use crate::plan::desired::MigDevice;
use crate::plan::TeamView;
use crate::policy::{Limits, MpsSettings, TeamName};
use crate::profiles::Placement;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The outcome of one reconcile (or of a dry run, for `Plan`): the daemon's own record, which
/// its retry and `Status` read. Never serialised: the bus carries [`RunReport`], converted from
/// it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReconcileReport {
    /// Unix time (seconds) of the end of the run.
    pub at: u64,
    /// Teams in the policy.
    pub teams: usize,
    /// GPUs the policy assigns.
    pub gpus: usize,
    /// What was changed (or, in a dry run, would be), one line each.
    pub changes: Vec<String>,
    /// What failed, one line each, naming the unit or path.
    pub errors: Vec<String>,
    /// What was left alone and why: blocked MIG changes, pending modes, slices kept because
    /// jobs still run in them, NVML missing.
    pub warnings: Vec<String>,
    /// Where the host still differs from the policy although nothing failed: blocked changes
    /// (with their holders), slices kept because jobs still run in them, pending modes. While
    /// this is not empty the host is not "converged" (issue 17).
    pub differs: Vec<String>,
    /// Units the policy wants to exist (team slices, MPS daemons): systemd removing one of
    /// these triggers a reconcile; removals of any other unit are noise.
    pub units: Vec<String>,
    /// What the host looked like at the end of the run, for `Status` (not part of the JSON
    /// report).
    pub view: Option<HostView>,
    /// How the run's failures may heal, for gpuctld's retry (not part of the JSON).
    pub heal: Heal,
}

/// What a run that did not converge waits for: the daemon's requeue reads it
/// ([`crate::dbus_api::Trigger::Retry`], [`crate::dbus_api::Trigger::Recheck`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Heal {
    /// An error may not recur (the bus, a job, the driver timing out; a lock held by the other
    /// writer): retried soon, with backoff.
    pub transient: bool,
    /// A change waits only for holders to go (busy MIG instances, jobs in a removed team's
    /// slice, a Slurm node draining): checked again shortly, nothing else tells gpuctld.
    pub holders: bool,
}

/// The host as the last reconcile left it: what each team gets and the GPUs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostView {
    /// Team views (devices, MIG devices with UUIDs, slice, MPS instances) by team.
    pub teams: BTreeMap<TeamName, TeamView>,
    /// GPUs as observed, MIG state included.
    pub gpus: Vec<GpuState>,
}

/// Who owns which device, from the daemon's last reconcile: every team's whole GPUs and
/// existing MIG devices (here, not in `usage`, which sits below the bus API).
impl From<&HostView> for crate::usage::Owners {
    fn from(view: &HostView) -> crate::usage::Owners {
        let mut o = crate::usage::Owners::default();
        for (team, tv) in &view.teams {
            for i in &tv.whole_gpus {
                o.gpus.entry(*i).or_default().push(team.to_string());
            }
            for m in tv.mig_devices.iter().filter(|m| m.exists) {
                o.mig
                    .entry(m.uuid.clone())
                    .or_default()
                    .push(team.to_string());
            }
        }
        o
    }
}

impl ReconcileReport {
    /// The host matches the policy as far as this run could tell.
    pub fn converged(&self) -> bool {
        self.errors.is_empty() && self.differs.is_empty()
    }

    /// Record a failure of the run; `transient` when repeating may succeed
    /// ([`crate::apply::EffectError::is_transient`]).
    pub fn error(&mut self, line: String, transient: bool) {
        self.errors.push(line);
        self.heal.transient |= transient;
    }

    /// `converged`, `differs` (something waits: blocked, in use) or `errors`.
    pub fn result(&self) -> &'static str {
        if !self.errors.is_empty() {
            "errors"
        } else if !self.differs.is_empty() {
            "differs"
        } else {
            "converged"
        }
    }

    /// One line for `STATUS=`.
    pub fn summary(&self) -> String {
        let head = format!("{} teams, {} GPUs", self.teams, self.gpus);
        match (self.errors.first(), self.differs.first()) {
            (None, None) => format!("{head} converged"),
            (None, Some(first)) => {
                let n = self.differs.len();
                format!("{head}: not converged, {n} change(s) waiting, first: {first}")
            }
            (Some(first), _) => format!("{head}: {} error(s), first: {first}", self.errors.len()),
        }
    }
}

/// `Plan`, `Apply` and `Reload`: the report and whether the host converged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportReply {
    /// No errors and nothing waiting.
    pub converged: bool,
    /// The report.
    pub report: RunReport,
}

impl From<ReconcileReport> for ReportReply {
    fn from(report: ReconcileReport) -> Self {
        ReportReply {
            converged: report.converged(),
            report: RunReport::from(&report),
        }
    }
}

/// One reconcile (or dry run) as `Plan`, `Apply` and `Reload` send it: the lines of a
/// [`ReconcileReport`], in the order its JSON always had (scripts' `jq` queries read it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunReport {
    /// Unix time (seconds) of the end of the run.
    pub at: u64,
    /// Teams in the policy.
    pub teams: usize,
    /// GPUs the policy assigns.
    pub gpus: usize,
    /// What was changed (or, in a dry run, would be), one line each.
    pub changes: Vec<String>,
    /// What failed, one line each, naming the unit or path.
    pub errors: Vec<String>,
    /// What was left alone and why.
    pub warnings: Vec<String>,
    /// Where the host still differs from the policy although nothing failed.
    pub differs: Vec<String>,
    /// Units the policy wants to exist (team slices, MPS daemons).
    pub units: Vec<String>,
}

impl From<&ReconcileReport> for RunReport {
    fn from(r: &ReconcileReport) -> Self {
        RunReport {
            at: r.at,
            teams: r.teams,
            gpus: r.gpus,
            changes: r.changes.clone(),
            errors: r.errors.clone(),
            warnings: r.warnings.clone(),
            differs: r.differs.clone(),
            units: r.units.clone(),
        }
    }
}

/// `Status`: what `gpuctl status` shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StatusReply {
    /// Per GPU: node, owning teams, MIG state.
    pub gpus: Vec<GpuStatus>,
    /// The last reconcile.
    pub last_reconcile: Option<LastReconcile>,
    /// The last policy error (`file:line:col: key: message`), cleared by a good load.
    pub policy_error: Option<String>,
    /// `current` or `last-good`.
    pub policy_in_force: Option<String>,
    /// The files of the policy in force.
    pub policy_sources: Option<Vec<PathBuf>>,
    /// `--wait` requests that found no free device, in the order they will be served.
    #[serde(default)]
    pub queue: Vec<QueuedRequest>,
    /// The one-line truth (`STATUS=`).
    pub status: String,
    /// Per team: devices, slice, MPS daemons.
    pub teams: BTreeMap<String, TeamStatus>,
    /// Live leases: which job holds which devices (`gpuctl status`).
    #[serde(default)]
    pub leases: Vec<LeaseStatus>,
}

/// A placement lease: which job holds which devices of its team's share (`Status`, `Teams`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseStatus {
    /// Device UUIDs.
    pub devices: Vec<String>,
    /// The job's MPS pinned device memory limit in bytes, where one was set.
    #[serde(default)]
    pub gpu_memory: Option<u64>,
    /// The pid that was placed.
    pub pid: u32,
    /// When it was placed, seconds since the epoch.
    pub since: u64,
    /// The team.
    pub team: String,
    /// The holder's uid.
    pub uid: u32,
    /// The job's scope.
    pub unit: String,
    /// The holder's name (`uid N` when NSS does not know it).
    pub user: String,
    /// The team that lent the devices, for a borrowed job (preemptible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowed_from: Option<String>,
}

impl From<&crate::placement::Lease> for LeaseStatus {
    fn from(l: &crate::placement::Lease) -> Self {
        LeaseStatus {
            devices: l.devices.clone(),
            gpu_memory: l.gpu_memory,
            pid: l.pid,
            since: l.since,
            team: l.team.clone(),
            uid: l.uid,
            unit: l.unit.clone(),
            user: l.user.clone(),
            borrowed_from: l.borrowed_from.clone(),
        }
    }
}

/// One waiting `gpuctl run --wait` request (`gpuctl status`; the waiting client prints its own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedRequest {
    /// 1-based, in the team's round-robin order across users.
    pub position: usize,
    /// `--profile`: the MIG GPU-instance profile it asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Why it waits, when that is more than a busy device (a profile no device has yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The team whose device it waits for.
    pub team: String,
    /// The caller that waits.
    pub uid: u32,
    /// The uid's name, when NSS knows it.
    pub user: Option<String>,
}

impl StatusReply {
    /// No policy error pending and the last reconcile converged (`gpuctl status` exits 0).
    pub fn healthy(&self) -> bool {
        self.policy_error.is_none()
            && self
                .last_reconcile
                .as_ref()
                .is_some_and(|r| r.result == "converged")
    }
}

/// The last reconcile, in `Status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LastReconcile {
    /// Unix time of its end.
    pub at: u64,
    /// What it changed.
    pub changes: Vec<String>,
    /// Where the host still differs from the policy (blocked, in use, pending).
    pub differs: Vec<String>,
    /// What failed.
    pub errors: Vec<String>,
    /// `converged`, `differs` or `errors`.
    pub result: String,
    /// What was left alone and why.
    pub warnings: Vec<String>,
}

impl From<&ReconcileReport> for LastReconcile {
    fn from(r: &ReconcileReport) -> Self {
        LastReconcile {
            at: r.at,
            changes: r.changes.clone(),
            differs: r.differs.clone(),
            errors: r.errors.clone(),
            result: r.result().into(),
            warnings: r.warnings.clone(),
        }
    }
}

/// One team in `Status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TeamStatus {
    /// Whole GPUs.
    pub gpus: Vec<GpuRef>,
    /// MIG devices, with UUIDs.
    pub mig_instances: Vec<MigInstance>,
    /// MPS daemons.
    pub mps: Vec<MpsUnitStatus>,
    /// The team slice.
    pub slice: SliceStatus,
}

/// A MIG device a team has, in `Status`: the planner's [`MigDevice`] as the bus sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigInstance {
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
    /// Its capability minors, known once it exists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cap_minors: Vec<u32>,
}

impl From<&MigDevice> for MigInstance {
    fn from(m: &MigDevice) -> Self {
        MigInstance {
            gpu_index: m.gpu_index,
            gi_profile: m.gi_profile.clone(),
            gi_placement: m.gi_placement,
            ci_profile: m.ci_profile.clone(),
            ci_placement: m.ci_placement,
            uuid: m.uuid.clone(),
            exists: m.exists,
            cap_minors: m.cap_minors.clone(),
        }
    }
}

/// A whole GPU a team has.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuRef {
    /// NVML index.
    pub index: u32,
    /// UUID, when the GPU was seen.
    pub uuid: Option<String>,
}

/// A team slice in `Status`: wanted and live settings, live usage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SliceStatus {
    /// `ActiveState`, when the unit is loaded.
    pub active_state: Option<String>,
    /// What systemd has now.
    pub live: Option<SliceSpec>,
    /// `memory.current`.
    pub memory_current: Option<u64>,
    /// `pids.current`.
    pub tasks_current: Option<u64>,
    /// `gpu-<team>.slice`.
    pub unit: String,
    /// What the policy wants.
    pub wanted: Option<SliceSpec>,
}

/// An MPS daemon in `Status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MpsUnitStatus {
    /// `ActiveState`.
    pub active_state: Option<String>,
    /// Its settings as last configured.
    pub settings: Option<MpsSpec>,
    /// `SubState`.
    pub sub_state: Option<String>,
    /// `gpuctl-mps@<instance>.service`.
    pub unit: String,
}

/// One GPU in `Status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuStatus {
    /// NVML index.
    pub index: u32,
    /// MIG instances, on MIG-capable GPUs.
    pub instances: Option<Vec<GpuInstance>>,
    /// MIG mode in words (`on, 3 instance(s)`), on MIG-capable GPUs.
    pub mig: Option<String>,
    /// Product name.
    pub name: String,
    /// `/dev/nvidiaN`.
    pub node: String,
    /// Teams with a share of it.
    pub teams: Vec<String>,
    /// UUID.
    pub uuid: String,
    /// The GPU, or MIG devices of it, out of service (docs/health.md); absent when none is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub out_of_service: Vec<DeviceOutStatus>,
    /// The layout it has now, where its `[[gpu]]` entry allows several; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<LayoutStatus>,
}

/// A GPU's layout among those its entry allows (`Status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutStatus {
    /// Its name (`default`: the entry's own use).
    pub name: String,
    /// When gpuctld switched to it, Unix seconds; absent: not switched since boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// Why gpuctld chose it; absent: not switched since boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A device that takes no new work, and why (`Status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceOutStatus {
    /// GPU or MIG UUID.
    pub device: String,
    /// Why.
    pub reason: String,
    /// Since when, Unix seconds.
    pub since: u64,
    /// Who took it out (`gpuctld` for a fault, else the admin).
    pub by: String,
}

/// One entry of `Teams`: a team the caller may use and what it gives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeamInfo {
    /// `CUDA_VISIBLE_DEVICES`, when the team has devices.
    pub devices: Option<String>,
    /// The team's environment, when it has devices.
    pub env: Option<BTreeMap<String, String>>,
    /// Its slice limits.
    pub limits: Limits,
    /// Members as written in the policy (`alice`, `@ml`).
    #[serde(default)]
    pub members: Vec<String>,
    /// MPS settings, when the team runs MPS.
    pub mps: Option<MpsSettings>,
    /// `gpu-<team>.slice`.
    pub slice: String,
    /// The team.
    pub team: String,
    /// Why the caller may use it.
    pub via: Via,
    /// Per device of the share: free or held, and by whom (empty when the team places no
    /// jobs, `jobs-per-device = 0`).
    #[serde(default)]
    pub share: Vec<DeviceHold>,
}

/// One device of a team's share in `Teams`: how many jobs hold it and how many it takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceHold {
    /// Its number in the share (what `--device N` takes).
    pub index: usize,
    /// UUID.
    pub id: String,
    /// A MIG device.
    pub mig: bool,
    /// A MIG device's GPU-instance profile (what `--profile` takes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Jobs it takes (`None`: no cap).
    pub capacity: Option<u32>,
    /// The leases on it.
    pub leases: Vec<LeaseStatus>,
    /// Why it takes no new job, when it is out of service (docs/health.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_service: Option<DeviceOutStatus>,
}

/// `Health`: every device's health as gpuctld's watcher and the admins left it (`gpuctl
/// device list`, `gpuctl doctor`): GPUs by index, each followed by its MIG devices.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthReply {
    /// The watcher is reading NVML; `false` with the reason in `watcher_error`.
    pub watching: bool,
    /// Why the watcher cannot read NVML, when it cannot.
    pub watcher_error: Option<String>,
    /// Devices.
    pub devices: Vec<DeviceHealthStatus>,
}

/// One device in [`HealthReply`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceHealthStatus {
    /// `GPU-…` or `MIG-…` UUID.
    pub uuid: String,
    /// NVML index of the GPU (of the parent GPU for a MIG device).
    pub gpu_index: u32,
    /// A MIG device.
    pub mig: bool,
    /// Takes new work.
    pub in_service: bool,
    /// Why it is out (its own reason, or its GPU's).
    pub reason: Option<String>,
    /// Unix seconds since it is out.
    pub since: Option<u64>,
    /// Who took it out: `gpuctld` (a fault) or an admin's user name.
    pub by: Option<String>,
    /// A reset would clear the cause.
    pub reset_when_idle: bool,
    /// XIDs seen, by code.
    pub xids: BTreeMap<u32, u64>,
    /// Standing conditions only a reset clears (`lost`, `remap-pending`, …).
    pub conditions: Vec<crate::health::Condition>,
    /// Hardware slowdown at the last read.
    pub slowdown: bool,
    /// Times a fault took it out of service.
    pub quarantines: u64,
    /// Times gpuctld reset it (a GPU) while idle (`reset-when-idle`).
    pub resets: u64,
}

impl HealthReply {
    /// From the registry, over the devices of `topo` (and any other device the registry
    /// still holds out of service).
    pub fn from_registry(
        reg: &crate::health::Registry,
        topo: &crate::health::Topology,
    ) -> HealthReply {
        let out = reg.out_of_service(topo);
        let entry = |uuid: &str, gpu_index: u32, mig: bool| {
            let d = reg.get(uuid).cloned().unwrap_or_default();
            let o = out.get(uuid);
            DeviceHealthStatus {
                uuid: uuid.to_string(),
                gpu_index,
                mig,
                in_service: o.is_none(),
                reason: o.map(|o| o.reason.clone()),
                since: o.map(|o| o.since),
                by: o.map(|o| o.by.clone()),
                reset_when_idle: matches!(
                    d.service,
                    crate::health::Service::Out {
                        reset_when_idle: true,
                        ..
                    }
                ),
                xids: d.xids,
                conditions: d.conditions.into_iter().collect(),
                slowdown: d.slowdown,
                quarantines: d.quarantines,
                resets: d.resets,
            }
        };
        let mut devices = Vec::new();
        for g in &topo.gpus {
            devices.push(entry(&g.uuid, g.index, false));
            for m in &g.mig {
                devices.push(entry(&m.uuid, g.index, true));
            }
        }
        HealthReply {
            watching: false,
            watcher_error: None,
            devices,
        }
    }
}

/// `DeviceDrain`/`DeviceResume`: the device and its new state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceChangeReply {
    /// The device's UUID.
    pub device: String,
    /// Takes new work now.
    pub in_service: bool,
    /// The reason given.
    pub reason: String,
    /// Who.
    pub by: String,
}

/// `Idle`: the holders gpuctld's idle rules track (`gpuctl idle`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct IdleReply {
    /// Unix ms of the last sample; 0 before the first.
    pub at_ms: u64,
    /// ms between samples.
    pub interval_ms: u64,
    /// Some team has an idle rule, so gpuctld samples.
    pub sampling: bool,
    /// Every tracked holder (busy ones too: `phase` says), by team, unit, device.
    pub holders: Vec<crate::idle::IdleHolder>,
}

impl IdleReply {
    /// The pending idle actions in words (`gpuctl plan`).
    pub fn pending(&self) -> Vec<String> {
        self.holders
            .iter()
            .filter_map(|h| h.pending(self.at_ms))
            .collect()
    }
}

/// `Events`: the caller's events after the position asked (`gpuctl events`, docs/events.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventsReply {
    /// When this gpuctld started (Unix ms): positions are this start's; a reader whose
    /// position came from another start asks from 0 again.
    pub started_ms: u64,
    /// The position to ask from next.
    pub next: u64,
    /// Events after the asked position were forgotten before this read (gpuctld keeps the
    /// last 1,024; the journal has them all).
    pub lost: bool,
    /// The events, oldest first: those of the caller's teams and the host's own (root: all).
    pub events: Vec<EventRecord>,
}

/// One event of an [`EventsReply`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventRecord {
    /// Position in this gpuctld's sequence.
    pub seq: u64,
    /// Unix ms.
    pub at_ms: u64,
    /// `idle-warn`, `idle-stop`, `queue-placed`, `loan-reclaim`, `loan-stop`, `device-out`,
    /// `device-back`, `device-stop`.
    pub kind: String,
    /// The team it concerns; none: the host's (a device's service state).
    pub team: Option<String>,
    /// The user it concerns, by name where known.
    pub user: Option<String>,
    /// The user's uid where known.
    pub uid: Option<u32>,
    /// The job's unit.
    pub unit: Option<String>,
    /// The device(s).
    pub device: Option<String>,
    /// What the user is told.
    pub message: String,
}

impl From<&crate::events::Event> for EventRecord {
    fn from(e: &crate::events::Event) -> Self {
        EventRecord {
            seq: e.seq,
            at_ms: e.at_ms,
            kind: e.kind.as_str().to_string(),
            team: e.team.clone(),
            user: e.user.clone(),
            uid: e.uid,
            unit: e.unit.clone(),
            device: e.device.clone(),
            message: e.message.clone(),
        }
    }
}

/// `Report`: GPU device-time held and used over whole UTC days (`gpuctl report`,
/// docs/ledger.md). Times are seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LedgerReply {
    /// `[host] accounting` in force (`auto`, `on`, `off`).
    pub accounting: String,
    /// The caller sees every team (root); otherwise only the teams it may use.
    pub all_teams: bool,
    /// How rows are grouped: `team`, `user` or `device`.
    pub by: String,
    /// First day, `YYYY-MM-DD` (UTC).
    pub from: String,
    /// Teams with an idle rule now (their reclaimed time is meaningful).
    pub idle_rule_teams: Vec<String>,
    /// Day files that could not be read (they count as no data).
    pub problems: Vec<String>,
    /// One row per group, most held first.
    pub rows: Vec<LedgerRow>,
    /// Last day, `YYYY-MM-DD` (UTC), inclusive.
    pub to: String,
    /// Holders (team, user) with the most idle time, most first.
    pub top_idle: Vec<LedgerRow>,
}

/// One group of a [`LedgerReply`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LedgerRow {
    /// Device-seconds held with activity at or above the team's idle threshold.
    pub active_s: f64,
    /// GPU index or MIG UUID (`by = device`).
    pub device: Option<String>,
    /// Device-seconds held.
    pub held_s: f64,
    /// Held with activity known and below the threshold: held − active − unknown.
    pub idle_s: f64,
    /// `gpu` or the MIG profile (`by = device`).
    pub kind: Option<String>,
    /// GPU-memory GiB-hours.
    pub memory_gib_hours: f64,
    /// Held seconds of stretches that an idle stop ended.
    pub reclaimed_s: f64,
    /// Idle stops.
    pub stops: u64,
    /// Team (`by = team` or `user`); empty: processes outside every team slice.
    pub team: Option<String>,
    /// Device-seconds held on devices reporting no activity.
    pub unknown_s: f64,
    /// User (`by = user`).
    pub user: Option<String>,
    /// active / (held − unknown), 0–1; `None` when no held time has known activity.
    pub utilisation: Option<f64>,
    /// Of held, on devices borrowed from other teams.
    pub borrowed_s: f64,
    /// The team's device-seconds held by borrowers (a line with no user, `by = user`).
    pub lent_s: f64,
}

/// Version 1 of the documents `org.gpuctl.Agent1` returns, the one this build speaks: gpuctld
/// says which it speaks in the `InterfaceVersion` property and `gpuctl` refuses another
/// ([`crate::cli::shell::interface_mismatch`]) instead of misreading it. A field added with a
/// default keeps the version (both sides read what the other sends); a field removed, renamed or
/// changed in meaning makes a `v2`. The JSON of each is fixed by `tests/golden_json.rs`.
pub mod v1 {
    /// The interface version of this build.
    pub const VERSION: u32 = 1;

    // `Status`.
    pub use super::{DeviceOutStatus, GpuRef, GpuStatus, LastReconcile, LayoutStatus, MigInstance};
    pub use super::{LeaseStatus, QueuedRequest, StatusReply, TeamStatus};
    pub use super::{MpsUnitStatus, SliceStatus};
    // `Plan`, `Apply`, `Reload`.
    pub use super::{ReportReply, RunReport};
    // `Teams` (an array of them).
    pub use super::{DeviceHold, TeamInfo};
    // `Idle`.
    pub use super::IdleReply;
    // `Health`, `DeviceDrain`, `DeviceResume`.
    pub use super::{DeviceChangeReply, DeviceHealthStatus, HealthReply};
    // `Report`.
    pub use super::{LedgerReply, LedgerRow};
    // `Events`.
    pub use super::{EventRecord, EventsReply};
    // `Usage`.
    pub use crate::usage::Usage;
}
