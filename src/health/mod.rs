//! Device health: what an NVML event or a counter read means for a device (docs/health.md).
//!
//! Pure: the daemon's watcher turns NVML events and counter reads into [`Observation`]s, hands
//! them with the host's [`Topology`] and the policy's [`HealthSettings`] to
//! [`Registry::observe`], and acts on the [`Effect`]s it returns (journal, terminals, metrics).
//! The registry is the one record of which devices are out of service; placement asks it
//! through [`Registry::out_of_service`]. A leaf: `policy` imports it for the settings type.
//!
//! Rules, each tested below:
//! - an application XID (default [`DEFAULT_APPLICATION_XIDS`]) is counted and reported to the
//!   holders, never quarantines;
//! - any other XID quarantines (as NVIDIA's device plugin does); the [`FATAL_XIDS`] can never be
//!   made application XIDs (policy validation refuses them);
//! - on MIG, an XID that names a GPU instance quarantines that instance's MIG devices only,
//!   unless it is one of the [`GPU_WIDE_XIDS`] (the whole board is affected);
//! - a lost GPU, a failed row remap and new uncorrectable ECC errors quarantine the GPU; a
//!   pending row remap or retired page quarantines it as "reset when idle";
//! - hardware slowdown and thermal throttling are reported, never quarantine;
//! - a device comes back by an admin's resume (refused while a standing condition such as a
//!   pending remap remains: those need a reset) or after an idle reset of its GPU.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

#[cfg(test)]
mod tests;

/// XIDs that are the application's fault (its own bad access, a kernel it killed), after
/// NVIDIA's k8s-device-plugin (`health.go`: 13, 31, 43, 45, 68, 109) and NVIDIA's XID catalogue
/// ("Xid Errors", r555: "user application fault" as the likely cause).
pub const DEFAULT_APPLICATION_XIDS: [u32; 6] = [13, 31, 43, 45, 68, 109];

/// XIDs that always quarantine, with the catalogue's name. Source: NVIDIA's "Xid Errors"
/// catalogue (r555) and DCGM's health watches (`DCGM_HEALTH_WATCH_MEM`, `…_NVLINK`, `…_SM`).
pub const FATAL_XIDS: &[(u32, &str)] = &[
    (48, "double-bit ECC error"),
    (61, "internal micro-controller breakpoint"),
    (62, "internal micro-controller halt"),
    (63, "ECC page retirement or row remapping recorded"),
    (64, "ECC page retirement or row remapping failed"),
    (74, "NVLink error"),
    (79, "GPU has fallen off the bus"),
    (92, "high single-bit ECC error rate"),
    (94, "contained ECC error"),
    (95, "uncontained ECC error"),
    (119, "GSP RPC timeout"),
    (120, "GSP error"),
    (140, "unrecovered ECC error"),
];

/// Fatal XIDs that affect the whole board even when the driver names a GPU instance: bus,
/// memory-controller, NVLink and firmware faults. Of the fatal list only 94 (contained to the
/// instance whose memory it hit) stays with its MIG device.
pub const GPU_WIDE_XIDS: &[u32] = &[48, 61, 62, 63, 64, 74, 79, 92, 95, 119, 120, 140];

/// Clock event reasons that mean the hardware is protecting itself
/// (`nvmlClocksEventReasonHwSlowdown`, `…HwThermalSlowdown`, `…HwPowerBrakeSlowdown`).
pub const HW_SLOWDOWN_REASONS: u64 = 0x8 | 0x40 | 0x80;

/// The catalogue name of `xid`, when it is a listed fatal one.
pub fn fatal_name(xid: u32) -> Option<&'static str> {
    FATAL_XIDS.iter().find(|(c, _)| *c == xid).map(|(_, n)| *n)
}

/// What happens to jobs running on a device that was quarantined (`[host.health] on-fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum OnFault {
    /// They may finish or fail on their own; only new work is kept off.
    #[default]
    Keep,
    /// Their units are stopped after `grace`.
    Stop,
}

/// `[host.health]`: the policy's health settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthSettings {
    /// XIDs counted and reported but never quarantining.
    pub application_xids: BTreeSet<u32>,
    /// What happens to running jobs on a quarantined device.
    pub on_fault: OnFault,
    /// With `on-fault = "stop"`: how long holders have before their units are stopped.
    pub grace: Duration,
    /// Whether gpuctld resets a quarantined GPU once no process holds it.
    pub reset_when_idle: bool,
}

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings {
            application_xids: DEFAULT_APPLICATION_XIDS.into_iter().collect(),
            on_fault: OnFault::Keep,
            grace: Duration::from_secs(300),
            reset_when_idle: false,
        }
    }
}

/// How an XID is treated under `settings`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XidClass {
    /// Counted and reported; the device stays in service.
    Application,
    /// A listed fatal XID.
    Fatal(&'static str),
    /// Neither list: quarantines, as the device plugin treats every non-application XID.
    Unlisted,
}

/// Classify `xid`. A fatal XID is fatal whatever the settings say.
pub fn classify(xid: u32, settings: &HealthSettings) -> XidClass {
    match fatal_name(xid) {
        Some(n) => XidClass::Fatal(n),
        None if settings.application_xids.contains(&xid) => XidClass::Application,
        None => XidClass::Unlisted,
    }
}

/// One MIG device of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    /// GPU instance id.
    pub gi: u32,
    /// Compute instance id.
    pub ci: u32,
    /// `MIG-…` UUID.
    pub uuid: String,
}

/// One GPU as the daemon last observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTopo {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Its MIG devices (empty with MIG off).
    pub mig: Vec<MigDevice>,
}

/// The devices health decisions name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// GPUs by index order.
    pub gpus: Vec<GpuTopo>,
}

impl Topology {
    fn gpu(&self, uuid: &str) -> Option<&GpuTopo> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// The parent GPU of a MIG device.
    pub fn parent_of(&self, mig: &str) -> Option<&GpuTopo> {
        self.gpus
            .iter()
            .find(|g| g.mig.iter().any(|m| m.uuid == mig))
    }

    /// A device named by UUID (GPU or MIG) or by GPU index, as the UUID.
    pub fn resolve(&self, name: &str) -> Option<String> {
        let name = name.trim();
        if let Ok(i) = name.parse::<u32>() {
            return self
                .gpus
                .iter()
                .find(|g| g.index == i)
                .map(|g| g.uuid.clone());
        }
        let known = self.gpus.iter().any(|g| {
            g.uuid.eq_ignore_ascii_case(name)
                || g.mig.iter().any(|m| m.uuid.eq_ignore_ascii_case(name))
        });
        known.then(|| {
            self.gpus
                .iter()
                .flat_map(|g| std::iter::once(&g.uuid).chain(g.mig.iter().map(|m| &m.uuid)))
                .find(|u| u.eq_ignore_ascii_case(name))
                .expect("found above")
                .clone()
        })
    }
}

/// Counters read at an observation; `None`: not supported or not readable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Retired pages waiting for a reset (pre-Ampere).
    pub retired_pages_pending: Option<bool>,
    /// A row remap waits for a reset (Ampere and newer).
    pub remap_pending: Option<bool>,
    /// A row remap failed: no spare rows.
    pub remap_failed: Option<bool>,
    /// Uncorrectable ECC errors since the driver loaded (volatile).
    pub ecc_uncorrected: Option<u64>,
    /// `nvmlDeviceGetCurrentClocksEventReasons`.
    pub clocks_event_reasons: Option<u64>,
}

/// What the watcher saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// An XID event on GPU `gpu`, attributed to GPU instance `gi` (and compute instance `ci`)
    /// where the driver says so.
    Xid {
        /// GPU UUID.
        gpu: String,
        /// The XID.
        code: u32,
        /// GPU instance id, MIG only.
        gi: Option<u32>,
        /// Compute instance id, MIG only.
        ci: Option<u32>,
    },
    /// A double-bit ECC event.
    DoubleBitEcc {
        /// GPU UUID.
        gpu: String,
    },
    /// The counters of GPU `gpu`.
    Counters {
        /// GPU UUID.
        gpu: String,
        /// What was read.
        counters: Counters,
    },
    /// The GPU stopped answering (`NVML_ERROR_GPU_IS_LOST`).
    Lost {
        /// GPU UUID.
        gpu: String,
    },
}

impl Observation {
    /// The GPU it is about.
    pub fn gpu(&self) -> &str {
        match self {
            Observation::Xid { gpu, .. }
            | Observation::DoubleBitEcc { gpu }
            | Observation::Counters { gpu, .. }
            | Observation::Lost { gpu } => gpu,
        }
    }
}

/// A condition that stays until the GPU is reset; resume is refused while one holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Condition {
    /// The GPU stopped answering.
    Lost,
    /// A row remap failed: the board needs service.
    RemapFailed,
    /// A row remap waits for a reset.
    RemapPending,
    /// Retired pages wait for a reset.
    RetiredPagesPending,
}

impl Condition {
    /// In words.
    pub fn describe(self) -> &'static str {
        match self {
            Condition::Lost => "GPU is lost (fallen off the bus)",
            Condition::RemapFailed => "row remapping failed",
            Condition::RemapPending => "row remapping pending: reset needed",
            Condition::RetiredPagesPending => "retired pages pending: reset needed",
        }
    }
}

/// Who took a device out of service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Actor {
    /// gpuctld's health watcher, on a fault.
    Watcher,
    /// An admin (`gpuctl device drain`), by user name.
    Admin {
        /// User name.
        who: String,
    },
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Actor::Watcher => f.write_str("gpuctld"),
            Actor::Admin { who } => f.write_str(who),
        }
    }
}

/// Whether a device takes new work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Service {
    /// Takes new work.
    #[default]
    InService,
    /// Takes no new work.
    Out {
        /// Why, in words.
        reason: String,
        /// Unix seconds.
        since: u64,
        /// Who.
        by: Actor,
        /// A reset would clear the cause (pending remap or retired pages).
        reset_when_idle: bool,
        /// With `on-fault = "stop"`: the holders' units were stopped.
        #[serde(default)]
        stopped: bool,
    },
}

/// What the registry knows of one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DeviceHealth {
    /// Whether it takes new work.
    #[serde(default)]
    pub service: Service,
    /// XIDs seen on it, by code.
    #[serde(default)]
    pub xids: BTreeMap<u32, u64>,
    /// Conditions from the last counter read (GPUs only).
    #[serde(default)]
    pub conditions: BTreeSet<Condition>,
    /// Hardware slowdown seen at the last counter read.
    #[serde(default)]
    pub slowdown: bool,
    /// The uncorrectable ECC count at the last read.
    #[serde(default)]
    pub ecc_uncorrected: Option<u64>,
    /// Times it was taken out of service by a fault.
    #[serde(default)]
    pub quarantines: u64,
    /// Times gpuctld reset it (a GPU) while idle to bring it back.
    #[serde(default)]
    pub resets: u64,
}

/// What the daemon does after an observation or a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// `device` went out of service on a fault: journal, tell its holders.
    Quarantined {
        /// UUID.
        device: String,
        /// Why.
        reason: String,
        /// A reset would clear it.
        reset_when_idle: bool,
    },
    /// An application XID: counted; tell the holders.
    ApplicationXid {
        /// UUID.
        device: String,
        /// The XID.
        code: u32,
    },
    /// A new warning (slowdown) or a fault on a device already out: journal only.
    Warning {
        /// UUID.
        device: String,
        /// What.
        reason: String,
    },
    /// An admin drained `device`.
    Drained {
        /// UUID.
        device: String,
        /// Why.
        reason: String,
        /// Who.
        by: String,
    },
    /// `device` is back in service.
    Resumed {
        /// UUID.
        device: String,
        /// Why.
        reason: String,
        /// Who (`reset` after an idle reset).
        by: String,
    },
}

/// A refused drain or resume.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HealthError {
    /// No such GPU, MIG device or index.
    #[error("no device {0:?}: name a GPU index, a GPU-… or a MIG-… UUID")]
    UnknownDevice(String),
    /// Resume of a device that is in service.
    #[error("{0} is in service")]
    InService(String),
    /// Drain of a device that is already out.
    #[error("{device} is already out of service since {since} ({reason})")]
    AlreadyOut {
        /// UUID.
        device: String,
        /// Why it is out.
        reason: String,
        /// Unix seconds.
        since: u64,
    },
    /// Resume while the GPU still shows a condition a reset must clear.
    #[error("{device} cannot resume: {} (reset the GPU when idle, then resume)", .condition.describe())]
    StillFaulty {
        /// UUID.
        device: String,
        /// The standing condition.
        condition: Condition,
    },
    /// A reason is required and must be one printable line.
    #[error("a reason is required: one line of at most {MAX_REASON} printable characters")]
    BadReason,
}

/// Longest admin reason kept.
pub const MAX_REASON: usize = 200;

fn check_reason(r: &str) -> Result<String, HealthError> {
    let r = r.trim();
    if r.is_empty() || r.chars().count() > MAX_REASON || r.chars().any(char::is_control) {
        return Err(HealthError::BadReason);
    }
    Ok(r.to_string())
}

/// Every device's health; persisted by the daemon so a restart keeps a quarantine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Registry {
    /// By UUID (GPU or MIG).
    #[serde(default)]
    pub devices: BTreeMap<String, DeviceHealth>,
}

/// Why a device is out, for placement and display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfService {
    /// Why.
    pub reason: String,
    /// Unix seconds.
    pub since: u64,
    /// Who.
    pub by: String,
}

impl Registry {
    /// The record of `uuid`.
    pub fn get(&self, uuid: &str) -> Option<&DeviceHealth> {
        self.devices.get(uuid)
    }

    fn quarantine(
        &mut self,
        device: &str,
        reason: String,
        reset_when_idle: bool,
        now: u64,
        out: &mut Vec<Effect>,
    ) {
        let d = self.devices.entry(device.to_string()).or_default();
        match &mut d.service {
            Service::Out {
                by: Actor::Watcher,
                reset_when_idle: r,
                ..
            } => {
                // Already quarantined: keep when and why it started; a cause a reset cannot
                // clear makes the whole quarantine need more than a reset.
                *r &= reset_when_idle;
                out.push(Effect::Warning {
                    device: device.to_string(),
                    reason,
                });
            }
            s => {
                // In service, or drained by an admin: the fault takes over.
                *s = Service::Out {
                    reason: reason.clone(),
                    since: now,
                    by: Actor::Watcher,
                    reset_when_idle,
                    stopped: false,
                };
                d.quarantines += 1;
                out.push(Effect::Quarantined {
                    device: device.to_string(),
                    reason,
                    reset_when_idle,
                });
            }
        }
    }

    /// Apply one observation at `now` (unix seconds).
    pub fn observe(
        &mut self,
        obs: &Observation,
        topo: &Topology,
        settings: &HealthSettings,
        now: u64,
    ) -> Vec<Effect> {
        let mut out = Vec::new();
        match obs {
            Observation::Xid { gpu, code, gi, ci } => {
                let targets = attribute(topo, gpu, *code, *gi, *ci);
                for t in &targets {
                    *self
                        .devices
                        .entry(t.clone())
                        .or_default()
                        .xids
                        .entry(*code)
                        .or_default() += 1;
                }
                match classify(*code, settings) {
                    XidClass::Application => {
                        out.extend(targets.into_iter().map(|device| Effect::ApplicationXid {
                            device,
                            code: *code,
                        }))
                    }
                    class => {
                        let reason = match class {
                            XidClass::Fatal(n) => format!("XID {code} ({n})"),
                            _ => format!("XID {code} (not an application XID)"),
                        };
                        for t in targets {
                            self.quarantine(&t, reason.clone(), false, now, &mut out);
                        }
                    }
                }
            }
            Observation::DoubleBitEcc { gpu } => {
                self.quarantine(gpu, "double-bit ECC error".into(), false, now, &mut out);
            }
            Observation::Lost { gpu } => {
                let d = self.devices.entry(gpu.clone()).or_default();
                if d.conditions.insert(Condition::Lost) {
                    let r = Condition::Lost.describe().to_string();
                    self.quarantine(gpu, r, false, now, &mut out);
                }
            }
            Observation::Counters { gpu, counters } => {
                self.counters(gpu, counters, now, &mut out);
            }
        }
        out
    }

    fn counters(&mut self, gpu: &str, c: &Counters, now: u64, out: &mut Vec<Effect>) {
        let d = self.devices.entry(gpu.to_string()).or_default();
        let before = std::mem::take(&mut d.conditions);
        let mut now_conds = BTreeSet::new();
        if c.remap_failed == Some(true) {
            now_conds.insert(Condition::RemapFailed);
        }
        if c.remap_pending == Some(true) {
            now_conds.insert(Condition::RemapPending);
        }
        if c.retired_pages_pending == Some(true) {
            now_conds.insert(Condition::RetiredPagesPending);
        }
        // A counter read answered: the GPU is not lost (any more).
        d.conditions = now_conds.clone();
        let new_ecc = match (d.ecc_uncorrected, c.ecc_uncorrected) {
            (Some(old), Some(n)) if n > old => Some(n - old),
            (None, Some(n)) if n > 0 => Some(n),
            _ => None,
        };
        if c.ecc_uncorrected.is_some() {
            d.ecc_uncorrected = c.ecc_uncorrected;
        }
        let slow = c
            .clocks_event_reasons
            .is_some_and(|r| r & HW_SLOWDOWN_REASONS != 0);
        let slow_started = slow && !d.slowdown;
        if c.clocks_event_reasons.is_some() {
            d.slowdown = slow;
        }
        for cond in now_conds.difference(&before) {
            let reset = matches!(
                cond,
                Condition::RemapPending | Condition::RetiredPagesPending
            );
            self.quarantine(gpu, cond.describe().to_string(), reset, now, out);
        }
        if let Some(n) = new_ecc {
            let r = format!("{n} uncorrectable ECC error(s)");
            self.quarantine(gpu, r, false, now, out);
        }
        if slow_started {
            out.push(Effect::Warning {
                device: gpu.to_string(),
                reason: "hardware slowdown (thermal or power brake)".into(),
            });
        }
    }

    /// An admin takes `name` (index or UUID) out of service.
    pub fn drain(
        &mut self,
        topo: &Topology,
        name: &str,
        reason: &str,
        by: &str,
        now: u64,
    ) -> Result<Effect, HealthError> {
        let reason = check_reason(reason)?;
        let device = topo
            .resolve(name)
            .ok_or_else(|| HealthError::UnknownDevice(name.to_string()))?;
        let d = self.devices.entry(device.clone()).or_default();
        if let Service::Out {
            reason: r, since, ..
        } = &d.service
        {
            return Err(HealthError::AlreadyOut {
                device,
                reason: r.clone(),
                since: *since,
            });
        }
        d.service = Service::Out {
            reason: reason.clone(),
            since: now,
            by: Actor::Admin { who: by.into() },
            reset_when_idle: false,
            stopped: false,
        };
        Ok(Effect::Drained {
            device,
            reason,
            by: by.into(),
        })
    }

    /// An admin brings `name` back; refused while its GPU shows a condition only a reset clears.
    pub fn resume(
        &mut self,
        topo: &Topology,
        name: &str,
        reason: &str,
        by: &str,
    ) -> Result<Effect, HealthError> {
        let reason = check_reason(reason)?;
        let device = topo
            .resolve(name)
            .ok_or_else(|| HealthError::UnknownDevice(name.to_string()))?;
        let gpu = topo
            .parent_of(&device)
            .map_or(device.clone(), |g| g.uuid.clone());
        if !matches!(
            self.devices.get(&device).map(|d| &d.service),
            Some(Service::Out { .. })
        ) {
            return Err(HealthError::InService(device));
        }
        if let Some(&condition) = self
            .devices
            .get(&gpu)
            .and_then(|g| g.conditions.iter().next())
        {
            return Err(HealthError::StillFaulty { device, condition });
        }
        self.devices.get_mut(&device).expect("checked").service = Service::InService;
        Ok(Effect::Resumed {
            device,
            reason,
            by: by.into(),
        })
    }

    /// GPUs gpuctld may reset now: quarantined by a fault that a reset can clear, and the
    /// policy allows it. The caller checks that no process holds the GPU.
    pub fn reset_candidates(&self, topo: &Topology, settings: &HealthSettings) -> Vec<String> {
        if !settings.reset_when_idle {
            return Vec::new();
        }
        topo.gpus
            .iter()
            .filter(|g| {
                let Some(d) = self.devices.get(&g.uuid) else {
                    return false;
                };
                let gpu_fault = matches!(
                    d.service,
                    Service::Out {
                        by: Actor::Watcher,
                        ..
                    }
                );
                let mig_fault = g.mig.iter().any(|m| {
                    matches!(
                        self.devices.get(&m.uuid).map(|d| &d.service),
                        Some(Service::Out {
                            by: Actor::Watcher,
                            ..
                        })
                    )
                });
                (gpu_fault || mig_fault) && !d.conditions.contains(&Condition::RemapFailed)
            })
            .map(|g| g.uuid.clone())
            .collect()
    }

    /// What keeps GPU `gpu` from an idle reset, from `held` (device UUID → its holders, e.g.
    /// leases and processes): anything on the GPU or on any of its MIG devices, in service or
    /// not, since a reset destroys every MIG instance. Empty: idle.
    pub fn reset_holders(
        topo: &Topology,
        gpu: &str,
        held: &BTreeMap<String, Vec<String>>,
    ) -> Vec<String> {
        let mut out: Vec<String> = std::iter::once(gpu)
            .chain(
                topo.gpu(gpu)
                    .into_iter()
                    .flat_map(|g| g.mig.iter().map(|m| m.uuid.as_str())),
            )
            .filter_map(|d| held.get(d))
            .flatten()
            .cloned()
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// After gpuctld reset GPU `gpu`: the conditions a reset clears are gone and the faults
    /// on it and its MIG devices are lifted; an admin's drain stays.
    pub fn reset_done(&mut self, topo: &Topology, gpu: &str) -> Vec<Effect> {
        let mut out = Vec::new();
        self.devices.entry(gpu.to_string()).or_default().resets += 1;
        let migs: Vec<String> = topo
            .gpu(gpu)
            .map(|g| g.mig.iter().map(|m| m.uuid.clone()).collect())
            .unwrap_or_default();
        for uuid in std::iter::once(gpu.to_string()).chain(migs) {
            let Some(d) = self.devices.get_mut(&uuid) else {
                continue;
            };
            d.conditions.retain(|c| *c == Condition::RemapFailed);
            // Volatile ECC counts start again at the reset.
            d.ecc_uncorrected = None;
            if matches!(
                d.service,
                Service::Out {
                    by: Actor::Watcher,
                    ..
                }
            ) && d.conditions.is_empty()
            {
                d.service = Service::InService;
                out.push(Effect::Resumed {
                    device: uuid,
                    reason: "GPU reset while idle".into(),
                    by: "reset".into(),
                });
            }
        }
        out
    }

    /// Devices whose holders' units are due to be stopped (`on-fault = "stop"` and the grace
    /// has passed); [`Registry::mark_stopped`] records that it was done.
    pub fn stops_due(&self, settings: &HealthSettings, now: u64) -> Vec<String> {
        if settings.on_fault != OnFault::Stop {
            return Vec::new();
        }
        self.devices
            .iter()
            .filter(|(_, d)| match &d.service {
                Service::Out {
                    by: Actor::Watcher,
                    since,
                    stopped: false,
                    ..
                } => now >= since.saturating_add(settings.grace.as_secs()),
                _ => false,
            })
            .map(|(u, _)| u.clone())
            .collect()
    }

    /// When the next stop falls due (seconds since the epoch): the watcher sleeps until then
    /// rather than polling, so an idle host wakes nobody.
    pub fn next_stop(&self, settings: &HealthSettings) -> Option<u64> {
        if settings.on_fault != OnFault::Stop {
            return None;
        }
        self.devices
            .values()
            .filter_map(|d| match &d.service {
                Service::Out {
                    by: Actor::Watcher,
                    since,
                    stopped: false,
                    ..
                } => Some(since.saturating_add(settings.grace.as_secs())),
                _ => None,
            })
            .min()
    }

    /// Records that the holders of `device` were stopped.
    pub fn mark_stopped(&mut self, device: &str) {
        if let Some(Service::Out { stopped, .. }) =
            self.devices.get_mut(device).map(|d| &mut d.service)
        {
            *stopped = true;
        }
    }

    /// Every device that takes no new work, by UUID: those out themselves and every MIG device
    /// of a GPU that is out.
    pub fn out_of_service(&self, topo: &Topology) -> BTreeMap<String, OutOfService> {
        let mut out = BTreeMap::new();
        let of = |uuid: &str| match self.devices.get(uuid).map(|d| &d.service) {
            Some(Service::Out {
                reason, since, by, ..
            }) => Some(OutOfService {
                reason: reason.clone(),
                since: *since,
                by: by.to_string(),
            }),
            _ => None,
        };
        for (uuid, _) in self.devices.iter() {
            if let Some(o) = of(uuid) {
                out.insert(uuid.clone(), o);
            }
        }
        for g in &topo.gpus {
            if let Some(o) = of(&g.uuid) {
                for m in &g.mig {
                    out.entry(m.uuid.clone()).or_insert_with(|| o.clone());
                }
            }
        }
        out
    }

    /// Forget MIG devices that no longer exist (their UUIDs are never reused); GPUs stay.
    pub fn prune(&mut self, topo: &Topology) {
        let live: BTreeSet<&str> = topo
            .gpus
            .iter()
            .flat_map(|g| g.mig.iter().map(|m| m.uuid.as_str()))
            .collect();
        self.devices
            .retain(|u, _| !u.starts_with("MIG-") || live.contains(u.as_str()));
    }
}

/// The devices an XID on `gpu` concerns: the MIG devices of the named instance where the XID
/// is the instance's own, else the GPU.
pub fn attribute(
    topo: &Topology,
    gpu: &str,
    code: u32,
    gi: Option<u32>,
    ci: Option<u32>,
) -> Vec<String> {
    let whole = vec![gpu.to_string()];
    let (Some(gi), Some(g)) = (gi, topo.gpu(gpu)) else {
        return whole;
    };
    if GPU_WIDE_XIDS.contains(&code) {
        return whole;
    }
    let migs: Vec<String> = g
        .mig
        .iter()
        .filter(|m| m.gi == gi && ci.is_none_or(|c| m.ci == c))
        .map(|m| m.uuid.clone())
        .collect();
    if migs.is_empty() {
        whole
    } else {
        migs
    }
}
