//! The NVML read-out behind [`Usage`], and the [`Collector`] that bounds it.
//!
//! One collection reads, per GPU: identity, memory, utilisation, power, temperature, MIG mode,
//! the compute and graphics process lists (on the parent GPU: in MIG mode the driver tags each
//! process with its GI and CI ids, so one list serves every MIG device of the GPU), GPM support
//! and samples; per MIG device: UUID, GI and CI ids (raw calls: nvml-wrapper 0.13 has none for
//! MIG device handles), memory and name (the profile is the name's `MIG <profile>` suffix).
//!
//! Sampling is bounded: the [`Collector`] serves one collection to every reader for its
//! interval, and collects only when asked (a bus call), so an idle gpuctld makes no NVML call.
//! GPM activity is the difference between this collection's sample and the previous one's, so
//! it covers the time between two readers' requests and is `None` on the first.

use super::procfs::{self, UserNames};
use super::{GpuUsage, MigUsage, Owners, ProcessUsage, Usage};
use crate::join::Directory;
use crate::paths::Root;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::GpmSample;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::nvmlGpmSample_t;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default time one collection is served for.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);
/// Environment variable overriding the interval (milliseconds) in gpuctld.
pub const ENV_INTERVAL_MS: &str = "GPUCTL_USAGE_INTERVAL_MS";

/// GPM samples kept from the previous collection, by (GPU UUID, GI id or none).
#[derive(Default)]
struct GpmPrev(BTreeMap<(String, Option<u32>), SampleHandle>);

/// A raw sample handle owned by the collector; freed through the `Nvml` that made it.
struct SampleHandle(nvmlGpmSample_t);
// SAFETY: a GPM sample is a heap buffer of the library; the collector uses it from one thread
// at a time (behind its mutex), which is all NVML requires.
unsafe impl Send for SampleHandle {}

impl GpmPrev {
    /// Swap in `new` for `key` and return the activity between the old and new sample.
    fn advance(
        &mut self,
        nvml: &Nvml,
        key: (String, Option<u32>),
        new: GpmSample<'_>,
    ) -> Option<f64> {
        let activity = self.0.get(&key).and_then(|old| {
            // SAFETY: `old` came from `into_handle` of a sample of this same `nvml` and is
            // given back with `into_handle` below, so it is never freed twice.
            let old = unsafe { GpmSample::from_handle(nvml, old.0) };
            let r = nvml_wrapper::gpm::gpm_metrics_get(nvml, &old, &new, &[GpmMetricId::SmUtil]);
            let _ = old.into_handle();
            r.ok()?.into_iter().next()?.ok().map(|m| m.value)
        });
        if let Some(old) = self.0.insert(key, SampleHandle(new.into_handle())) {
            // SAFETY: as above; this is its last owner.
            drop(unsafe { GpmSample::from_handle(nvml, old.0) });
        }
        activity
    }

    fn free_all(&mut self, nvml: &Nvml) {
        for (_, h) in std::mem::take(&mut self.0) {
            // SAFETY: each handle is owned here only.
            drop(unsafe { GpmSample::from_handle(nvml, h.0) });
        }
    }
}

fn opt<T>(what: &str, r: Result<T, NvmlError>) -> Option<T> {
    r.inspect_err(|e| {
        if !matches!(e, NvmlError::NotSupported) {
            tracing::debug!("usage: {what}: {e}");
        }
    })
    .ok()
}

fn memory_of(p: &ProcessInfo) -> Option<u64> {
    match p.used_gpu_memory {
        UsedGpuMemory::Used(b) => Some(b),
        UsedGpuMemory::Unavailable => None,
    }
}

/// GI and CI id of a MIG device handle (nvml-wrapper 0.13 has no call for either).
fn mig_ids(nvml: &Nvml, d: &Device<'_>) -> Option<(u32, u32)> {
    let lib = nvml.lib();
    let (mut gi, mut ci) = (0u32, 0u32);
    // SAFETY: `d` is a live MIG device handle of `nvml`; out-pointers to locals.
    let ok = unsafe {
        lib.nvmlDeviceGetGpuInstanceId(d.handle(), &mut gi) == 0
            && lib.nvmlDeviceGetComputeInstanceId(d.handle(), &mut ci) == 0
    };
    ok.then_some((gi, ci))
}

/// Attribute NVML's processes through `/proc`, skipping those that exited meanwhile.
fn attributed(
    root: &Root,
    users: &mut UserNames<'_>,
    procs: impl IntoIterator<Item = (ProcessInfo, &'static str)>,
) -> Vec<(Option<(u32, u32)>, ProcessUsage)> {
    procs
        .into_iter()
        .filter_map(|(p, kind)| {
            let info = procfs::read(root, p.pid)?;
            let ids = p.gpu_instance_id.zip(p.compute_instance_id);
            Some((
                ids,
                ProcessUsage {
                    pid: p.pid,
                    ns_pid: info.ns_pid,
                    kind: kind.into(),
                    used_memory: memory_of(&p),
                    uid: Some(info.uid),
                    user: Some(users.name(info.uid)),
                    command: info.command,
                    unit: info.unit,
                    team: info.team,
                    team_unit: info.team_unit,
                    slurm_job: info.slurm_job,
                    container: info.container,
                    ..Default::default()
                },
            ))
        })
        .collect()
}

/// A GPU left out of a collection: the two reads nothing else works without failed.
#[derive(Debug, thiserror::Error)]
#[error("GPU {index}: cannot read its {what}: {source}")]
pub struct GpuReadError {
    /// NVML index.
    pub index: u32,
    /// What was read (`handle`, `UUID`).
    pub what: &'static str,
    /// NVML's error.
    #[source]
    pub source: NvmlError,
}

fn collect_gpu(
    nvml: &Nvml,
    index: u32,
    gpm: &mut GpmPrev,
    root: &Root,
    users: &mut UserNames<'_>,
) -> Result<GpuUsage, GpuReadError> {
    let err = |what: &'static str| {
        move |source| GpuReadError {
            index,
            what,
            source,
        }
    };
    let dev = nvml.device_by_index(index).map_err(err("handle"))?;
    let uuid = dev.uuid().map_err(err("UUID"))?;
    let w = |s: &str| format!("GPU {index} {s}");
    let mem = opt(&w("memory"), dev.memory_info());
    let util = opt(&w("utilization"), dev.utilization_rates());
    let mig = opt(&w("MIG mode"), dev.mig_mode()).is_some_and(|m| m.current != 0);
    let mut g = GpuUsage {
        index,
        name: opt(&w("name"), dev.name()).unwrap_or_default(),
        memory_used: mem.as_ref().map(|m| m.used),
        memory_total: mem.as_ref().map(|m| m.total),
        utilization_gpu: util.as_ref().map(|u| u.gpu),
        utilization_memory: util.as_ref().map(|u| u.memory),
        power_mw: opt(&w("power"), dev.power_usage()),
        temperature_c: opt(
            &w("temperature"),
            dev.temperature(nvml_wrapper::enum_wrappers::device::TemperatureSensor::Gpu),
        ),
        mig,
        uuid: uuid.clone(),
        ..Default::default()
    };
    let gpm_ok = opt(&w("GPM support"), dev.gpm_support()).unwrap_or(false);
    if mig {
        let max = opt(&w("MIG device count"), dev.mig_device_count()).unwrap_or(0);
        for i in 0..max {
            let m = dev.mig_device_by_index(i).inspect_err(|e| {
                if !matches!(e, NvmlError::NotFound) {
                    tracing::debug!("usage: GPU {index} MIG device {i}: {e}");
                }
            });
            let Ok(m) = m else { continue };
            let (Some(mig_uuid), Some((gi, ci))) =
                (opt(&w("MIG uuid"), m.uuid()), mig_ids(nvml, &m))
            else {
                continue;
            };
            let mmem = opt(&w("MIG memory"), m.memory_info());
            let name = opt(&w("MIG name"), m.name()).unwrap_or_default();
            g.mig_devices.push(MigUsage {
                uuid: mig_uuid,
                gi_id: gi,
                ci_id: ci,
                profile: name
                    .rsplit_once(" MIG ")
                    .map_or_else(String::new, |(_, p)| p.to_string()),
                memory_used: mmem.as_ref().map(|m| m.used),
                memory_total: mmem.as_ref().map(|m| m.total),
                ..Default::default()
            });
        }
        g.mig_devices.sort_by_key(|m| (m.gi_id, m.ci_id));
        if gpm_ok {
            let gis: std::collections::BTreeSet<u32> =
                g.mig_devices.iter().map(|m| m.gi_id).collect();
            for gi in gis {
                let Some(s) = opt(&w("GPM MIG sample"), dev.gpm_mig_sample(gi)) else {
                    continue;
                };
                let a = gpm.advance(nvml, (uuid.clone(), Some(gi)), s);
                for m in g.mig_devices.iter_mut().filter(|m| m.gi_id == gi) {
                    m.activity = a;
                }
            }
        }
    } else if gpm_ok {
        if let Some(s) = opt(&w("GPM sample"), dev.gpm_sample()) {
            g.activity = gpm.advance(nvml, (uuid.clone(), None), s);
        }
    }
    let compute = opt(&w("compute processes"), dev.running_compute_processes()).unwrap_or_default();
    let graphics =
        opt(&w("graphics processes"), dev.running_graphics_processes()).unwrap_or_default();
    let all = compute
        .into_iter()
        .map(|p| (p, "compute"))
        .chain(graphics.into_iter().map(|p| (p, "graphics")));
    for (ids, p) in attributed(root, users, all) {
        let slot = ids.and_then(|(gi, ci)| {
            g.mig_devices
                .iter_mut()
                .find(|m| m.gi_id == gi && m.ci_id == ci)
        });
        slot.map_or(&mut g.processes, |m| &mut m.processes).push(p);
    }
    Ok(g)
}

/// Read every GPU once. Errors on one GPU leave it out (logged), not the whole collection.
fn collect_all(nvml: &Nvml, gpm: &mut GpmPrev, root: &Root, dir: &dyn Directory) -> Vec<GpuUsage> {
    let mut users = UserNames::new(dir);
    let count = nvml.device_count();
    let Ok(count) = count.inspect_err(|e| tracing::warn!("usage: device count: {e}")) else {
        return vec![];
    };
    (0..count)
        .filter_map(|i| {
            let g = collect_gpu(nvml, i, gpm, root, &mut users);
            g.inspect_err(|e| tracing::warn!("usage: {e}")).ok()
        })
        .collect()
}

#[derive(Default)]
struct Inner {
    nvml: Option<Nvml>,
    gpm: GpmPrev,
    last: Option<(Instant, Arc<Usage>)>,
    collections: u64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(n) = &self.nvml {
            self.gpm.free_all(n);
        }
    }
}

/// A [`Collector`] without NVML ([`Collector::quiet`]).
pub struct Quiet<'a> {
    _inner: std::sync::MutexGuard<'a, Inner>,
}

/// Serves one collection to every reader for `interval`; collects only when asked.
pub struct Collector {
    interval: Duration,
    lib: Option<PathBuf>,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("interval", &self.interval)
            .field("lib", &self.lib)
            .finish()
    }
}

impl Collector {
    /// A collector over the NVML library `lib` (`None`: the loader's default); nothing is
    /// loaded until the first [`Collector::get`].
    pub fn new(lib: Option<PathBuf>, interval: Duration) -> Self {
        Collector {
            interval,
            lib,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The interval from `$GPUCTL_USAGE_INTERVAL_MS`, else [`DEFAULT_INTERVAL`].
    pub fn interval_from_env() -> Duration {
        std::env::var(ENV_INTERVAL_MS)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(DEFAULT_INTERVAL, Duration::from_millis)
    }

    /// How many collections ran (each reads NVML once per device).
    pub fn collections(&self) -> u64 {
        self.inner.lock().map_or(0, |i| i.collections)
    }

    /// Let go of NVML until the guard is dropped; collections wait for it meanwhile. A GPU
    /// reset is refused while any client of the process has the library open.
    pub fn quiet(&self) -> Quiet<'_> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = inner.nvml.take() {
            inner.gpm.free_all(&n);
        }
        Quiet { _inner: inner }
    }

    /// The last collection, however old, without waiting for one that runs now.
    pub fn last(&self) -> Option<Arc<Usage>> {
        let inner = self.inner.try_lock().ok()?;
        inner.last.as_ref().map(|(_, u)| u.clone())
    }

    /// The usage now: the last collection if younger than the interval, else a new one.
    /// Concurrent callers wait on one collection and share it. Owners and strays are applied
    /// on every call, so a policy change shows at once.
    pub fn get(&self, root: &Root, owners: &Owners, dir: &dyn Directory) -> Usage {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = inner
            .last
            .as_ref()
            .filter(|(at, _)| at.elapsed() < self.interval)
            .map(|(_, u)| u.clone());
        let snap = fresh.unwrap_or_else(|| {
            let u = Arc::new(self.collect(&mut inner, root, dir));
            inner.last = Some((Instant::now(), u.clone()));
            u
        });
        drop(inner);
        let mut u = (*snap).clone();
        super::attribute(&mut u, owners);
        u
    }

    fn collect(&self, inner: &mut Inner, root: &Root, dir: &dyn Directory) -> Usage {
        inner.collections += 1;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut u = Usage {
            collected_at_ms: now_ms,
            interval_ms: self.interval.as_millis() as u64,
            ..Default::default()
        };
        if inner.nvml.is_none() {
            let mut b = Nvml::builder();
            if let Some(p) = &self.lib {
                b.lib_path(p.as_os_str());
            }
            match b.init() {
                Ok(n) => inner.nvml = Some(n),
                Err(e) => {
                    // Tried again at the next collection: a driver may be loaded later.
                    u.nvml_unavailable = Some(format!("NVML not available: {e}"));
                    return u;
                }
            }
        }
        let Inner { nvml, gpm, .. } = inner;
        if let Some(n) = nvml.as_ref() {
            u.gpus = collect_all(n, gpm, root, dir);
        }
        u
    }
}
