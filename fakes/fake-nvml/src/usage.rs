//! Usage read-outs: utilisation, power, temperature, graphics processes and GPM samples.
//!
//! Kept apart from [`crate::api`] (MIG and identity) so the usage model can grow on its own.
//! The modelled values live in [`State::usage`](crate::state::State::usage); what the real
//! driver answers on MIG device handles is modelled as NOT_SUPPORTED (see the README, "Usage
//! read-outs", for which of those answers are assumed).
//!
//! GPM is modelled for Hopper and newer (`H100*`, `H200*`): a sample records the SM activity
//! configured for its GPU (or GPU instance) when it was taken, and `nvmlGpmMetricsGet` reports
//! the later sample's value for `NVML_GPM_METRIC_SM_UTIL`/`GRAPHICS_UTIL`/`SM_OCCUPANCY`.

#![allow(clippy::missing_safety_doc)]

use crate::control;
use crate::state::{Process, State};
use crate::types::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_uint, c_void};

/// What the fake reports for usage; every field has a default so old state files load.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UsageModel {
    /// Per physical GPU, by NVML index.
    #[serde(default)]
    pub gpus: BTreeMap<u32, GpuUsage>,
    /// Graphics processes (`nvmlDeviceGetGraphicsRunningProcesses_v3`); compute ones are
    /// `State::processes`.
    #[serde(default)]
    pub graphics: Vec<Process>,
    /// GPM SM activity in percent per GPU instance, keyed `"<gpu>/<gi id>"`.
    #[serde(default)]
    pub gpm_gi: BTreeMap<String, f64>,
}

/// Read-outs of one physical GPU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuUsage {
    /// `nvmlUtilization_t.gpu`, percent.
    #[serde(default)]
    pub utilization_gpu: u32,
    /// `nvmlUtilization_t.memory`, percent.
    #[serde(default)]
    pub utilization_memory: u32,
    /// `nvmlDeviceGetPowerUsage`, milliwatts.
    #[serde(default = "default_power")]
    pub power_mw: u32,
    /// `nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)`, °C.
    #[serde(default = "default_temp")]
    pub temperature_c: u32,
    /// GPM SM activity of the whole GPU, percent.
    #[serde(default)]
    pub gpm_sm_activity: f64,
}

fn default_power() -> u32 {
    70_000
}
fn default_temp() -> u32 {
    34
}

impl Default for GpuUsage {
    fn default() -> Self {
        GpuUsage {
            utilization_gpu: 0,
            utilization_memory: 0,
            power_mw: default_power(),
            temperature_c: default_temp(),
            gpm_sm_activity: 0.0,
        }
    }
}

// Handle layout shared with `api` (kind << 56 | gpu << 40 | serial).
const KIND_DEVICE: u64 = 1;
const KIND_MIG_DEVICE: u64 = 4;

#[derive(Clone, Copy)]
enum Dev {
    Phys(usize),
    Mig,
}

fn resolve(st: &State, h: NvmlDevice) -> Result<Dev, NvmlReturn> {
    let v = h as usize as u64;
    let (kind, gpu, serial) = (v >> 56, ((v >> 40) & 0xFFFF) as usize, v & 0xFF_FFFF_FFFF);
    match kind {
        KIND_DEVICE if gpu < st.gpus.len() && serial == 0 => Ok(Dev::Phys(gpu)),
        KIND_MIG_DEVICE
            if st.gpus.get(gpu).is_some_and(|g| {
                g.gpu_instances
                    .iter()
                    .any(|gi| gi.compute_instances.iter().any(|c| c.serial == serial))
            }) =>
        {
            Ok(Dev::Mig)
        }
        _ => Err(NVML_ERROR_INVALID_ARGUMENT),
    }
}

fn mig_enabled(st: &State, gpu: usize) -> bool {
    st.gpus[gpu].mig.current == NVML_DEVICE_MIG_ENABLE
}

fn gpm_capable(st: &State, gpu: usize) -> bool {
    let name = &st.gpus[gpu].model().nvml_name;
    name.contains("H100") || name.contains("H200")
}

fn usage_of(st: &State, gpu: usize) -> GpuUsage {
    st.usage
        .gpus
        .get(&(gpu as u32))
        .cloned()
        .unwrap_or_default()
}

/// A read-only call through the state, like `api`'s: counted, fault-checked, no write-back.
fn query(name: &str, f: impl FnOnce(&State) -> NvmlReturn) -> NvmlReturn {
    control::count_query();
    if *control::INIT_COUNT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        == 0
    {
        return NVML_ERROR_UNINITIALIZED;
    }
    let Some(path) = control::state_path() else {
        return NVML_ERROR_DRIVER_NOT_LOADED;
    };
    let spec = std::env::var(crate::state::ENV_SPEC).ok();
    let fail_env = std::env::var(crate::state::ENV_FAIL).unwrap_or_default();
    crate::state::with_state(&path, spec.as_deref(), |st| {
        let injected = st
            .faults
            .fail
            .get(name)
            .and_then(|c| parse_return(c))
            .or_else(|| {
                fail_env.split(',').find_map(|item| {
                    let (k, v) = item.trim().rsplit_once(':')?;
                    (k.trim() == name).then(|| parse_return(v)).flatten()
                })
            });
        (injected.unwrap_or_else(|| f(st)), false)
    })
    .unwrap_or_else(|e| {
        eprintln!("fake-nvml: {e}");
        e.code()
    })
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Utilization {
    /// Percent of time a kernel ran.
    pub gpu: c_uint,
    /// Percent of time memory was read or written.
    pub memory: c_uint,
}

/// `nvmlDeviceGetUtilizationRates`: NOT_SUPPORTED on MIG device handles and on a GPU in MIG
/// mode (nvidia-smi shows `N/A` there).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: NvmlDevice,
    out: *mut Utilization,
) -> NvmlReturn {
    query("nvmlDeviceGetUtilizationRates", |st| {
        let g = match resolve(st, device) {
            Ok(Dev::Phys(g)) => g,
            Ok(Dev::Mig) => return NVML_ERROR_NOT_SUPPORTED,
            Err(c) => return c,
        };
        if out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if mig_enabled(st, g) {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let u = usage_of(st, g);
        // SAFETY: non-null, points to an nvmlUtilization_t (NVML contract).
        unsafe {
            out.write(Utilization {
                gpu: u.utilization_gpu,
                memory: u.utilization_memory,
            })
        };
        NVML_SUCCESS
    })
}

/// `nvmlDeviceGetPowerUsage` (mW); NOT_SUPPORTED on MIG device handles.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: NvmlDevice,
    mw: *mut c_uint,
) -> NvmlReturn {
    query("nvmlDeviceGetPowerUsage", |st| match resolve(st, device) {
        Ok(Dev::Phys(g)) if !mw.is_null() => {
            // SAFETY: non-null, points to a c_uint.
            unsafe { mw.write(usage_of(st, g).power_mw) };
            NVML_SUCCESS
        }
        Ok(Dev::Phys(_)) => NVML_ERROR_INVALID_ARGUMENT,
        Ok(Dev::Mig) => NVML_ERROR_NOT_SUPPORTED,
        Err(c) => c,
    })
}

/// `nvmlDeviceGetTemperature` for `NVML_TEMPERATURE_GPU` (0); NOT_SUPPORTED on MIG handles.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: NvmlDevice,
    sensor: c_uint,
    temp: *mut c_uint,
) -> NvmlReturn {
    query("nvmlDeviceGetTemperature", |st| match resolve(st, device) {
        Ok(Dev::Phys(_)) if temp.is_null() || sensor != 0 => NVML_ERROR_INVALID_ARGUMENT,
        Ok(Dev::Phys(g)) => {
            // SAFETY: non-null, points to a c_uint.
            unsafe { temp.write(usage_of(st, g).temperature_c) };
            NVML_SUCCESS
        }
        Ok(Dev::Mig) => NVML_ERROR_NOT_SUPPORTED,
        Err(c) => c,
    })
}

/// `nvmlDeviceGetGraphicsRunningProcesses_v3`: the graphics processes of `State::usage` on the
/// physical GPU (MIG devices run no graphics: empty list).
pub unsafe fn graphics_processes(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    query("nvmlDeviceGetGraphicsRunningProcesses_v3", |st| {
        let dev = match resolve(st, device) {
            Ok(d) => d,
            Err(c) => return c,
        };
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let list: Vec<&Process> = match dev {
            Dev::Phys(g) => st
                .usage
                .graphics
                .iter()
                .filter(|p| p.gpu as usize == g)
                .collect(),
            Dev::Mig => vec![],
        };
        // SAFETY: count non-null (checked), points to a c_uint.
        let cap = if infos.is_null() {
            0
        } else {
            (unsafe { *count }) as usize
        };
        // SAFETY: as above.
        unsafe { count.write(list.len() as c_uint) };
        if list.is_empty() {
            return NVML_SUCCESS;
        }
        if cap < list.len() {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (i, p) in list.iter().enumerate() {
            // SAFETY: infos has cap >= list.len() elements (NVML contract via *count).
            unsafe {
                infos.add(i).write(ProcessInfo {
                    pid: p.pid,
                    used_gpu_memory: p.used_memory_mib << 20,
                    gpu_instance_id: NVML_NO_INSTANCE,
                    compute_instance_id: NVML_NO_INSTANCE,
                })
            };
        }
        NVML_SUCCESS
    })
}

// ---------------------------------------------------------------------------------------
// GPM.

/// A GPM sample buffer (`nvmlGpmSample_t` points at one).
#[derive(Debug, Default)]
struct Sample {
    filled: bool,
    gpu: usize,
    gi: Option<u32>,
    sm_activity: f64,
}

/// `nvmlGpmSupport_t`.
#[repr(C)]
pub struct GpmSupport {
    /// `NVML_GPM_SUPPORT_VERSION` (1).
    pub version: c_uint,
    /// Non-zero when supported.
    pub is_supported_device: c_uint,
}

/// `nvmlGpmMetric_t` info strings.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GpmMetricInfo {
    /// Short name.
    pub short_name: *const c_char,
    /// Long name.
    pub long_name: *const c_char,
    /// Unit.
    pub unit: *const c_char,
}

/// `nvmlGpmMetric_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GpmMetric {
    /// `nvmlGpmMetricId_t`.
    pub metric_id: c_uint,
    /// Per-metric result.
    pub nvml_return: NvmlReturn,
    /// Value.
    pub value: f64,
    /// Names.
    pub info: GpmMetricInfo,
}

/// `nvmlGpmMetricsGet_t` (`NVML_GPM_METRICS_GET_VERSION` 1, 210 metric slots as in the
/// nvml-wrapper-sys 0.10 bindings).
#[repr(C)]
pub struct GpmMetricsGet {
    /// Struct version.
    pub version: c_uint,
    /// Metrics requested.
    pub num_metrics: c_uint,
    /// Earlier sample.
    pub sample1: *mut c_void,
    /// Later sample.
    pub sample2: *mut c_void,
    /// Requests and results.
    pub metrics: [GpmMetric; 210],
}

/// `nvmlGpmQueryDeviceSupport`: supported on Hopper and newer physical GPUs.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: NvmlDevice,
    out: *mut GpmSupport,
) -> NvmlReturn {
    query("nvmlGpmQueryDeviceSupport", |st| {
        let g = match resolve(st, device) {
            Ok(Dev::Phys(g)) => g,
            Ok(Dev::Mig) => return NVML_ERROR_NOT_SUPPORTED,
            Err(c) => return c,
        };
        if out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null, points to an nvmlGpmSupport_t whose version the caller set.
        unsafe {
            if (*out).version != 1 {
                return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
            }
            (*out).is_supported_device = gpm_capable(st, g) as c_uint;
        }
        NVML_SUCCESS
    })
}

/// `nvmlGpmSampleAlloc`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(out: *mut *mut c_void) -> NvmlReturn {
    control::count_query();
    if out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null, points to an nvmlGpmSample_t.
    unsafe { out.write(Box::into_raw(Box::<Sample>::default()).cast()) };
    NVML_SUCCESS
}

/// `nvmlGpmSampleFree`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: *mut c_void) -> NvmlReturn {
    control::count_query();
    if sample.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: allocated by nvmlGpmSampleAlloc above and freed once (NVML contract).
    drop(unsafe { Box::from_raw(sample.cast::<Sample>()) });
    NVML_SUCCESS
}

unsafe fn fill_sample(
    name: &str,
    device: NvmlDevice,
    gi: Option<u32>,
    s: *mut c_void,
) -> NvmlReturn {
    query(name, |st| {
        let g = match resolve(st, device) {
            Ok(Dev::Phys(g)) => g,
            Ok(Dev::Mig) => return NVML_ERROR_INVALID_ARGUMENT,
            Err(c) => return c,
        };
        if s.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if !gpm_capable(st, g) {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let value = match gi {
            None => usage_of(st, g).gpm_sm_activity,
            Some(id) => {
                if !mig_enabled(st, g) {
                    return NVML_ERROR_NOT_SUPPORTED;
                }
                if !st.gpus[g].gpu_instances.iter().any(|i| i.id == id) {
                    return NVML_ERROR_INVALID_ARGUMENT;
                }
                st.usage
                    .gpm_gi
                    .get(&format!("{g}/{id}"))
                    .copied()
                    .unwrap_or(0.0)
            }
        };
        // SAFETY: a sample from nvmlGpmSampleAlloc (NVML contract).
        unsafe {
            s.cast::<Sample>().write(Sample {
                filled: true,
                gpu: g,
                gi,
                sm_activity: value,
            })
        };
        NVML_SUCCESS
    })
}

/// `nvmlGpmSampleGet`: a whole-GPU sample.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleGet(device: NvmlDevice, sample: *mut c_void) -> NvmlReturn {
    // SAFETY: NVML contract on sample.
    unsafe { fill_sample("nvmlGpmSampleGet", device, None, sample) }
}

/// `nvmlGpmMigSampleGet`: a sample of GPU instance `gi` (MIG mode only).
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(
    device: NvmlDevice,
    gi: c_uint,
    sample: *mut c_void,
) -> NvmlReturn {
    // SAFETY: NVML contract on sample.
    unsafe { fill_sample("nvmlGpmMigSampleGet", device, Some(gi), sample) }
}

const SHORT: &[u8] = b"sm_util\0";
const LONG: &[u8] = b"SM activity\0";
const UNIT: &[u8] = b"%\0";

/// `nvmlGpmMetricsGet`: SM_UTIL (2), GRAPHICS_UTIL (1), SM_OCCUPANCY (3) from the later sample;
/// other metric ids get NOT_SUPPORTED in their slot.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMetricsGet(req: *mut GpmMetricsGet) -> NvmlReturn {
    control::count_query();
    if req.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null, points to an nvmlGpmMetricsGet_t (NVML contract).
    let r = unsafe { &mut *req };
    if r.version != 1 {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    if r.sample1.is_null() || r.sample2.is_null() || r.num_metrics as usize > r.metrics.len() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: samples from nvmlGpmSampleAlloc (NVML contract).
    let (a, b) = unsafe { (&*r.sample1.cast::<Sample>(), &*r.sample2.cast::<Sample>()) };
    if !a.filled || !b.filled || a.gpu != b.gpu || a.gi != b.gi {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    for m in r.metrics.iter_mut().take(r.num_metrics as usize) {
        m.info = GpmMetricInfo {
            short_name: SHORT.as_ptr().cast(),
            long_name: LONG.as_ptr().cast(),
            unit: UNIT.as_ptr().cast(),
        };
        if (1..=3).contains(&m.metric_id) {
            m.nvml_return = NVML_SUCCESS;
            m.value = b.sm_activity;
        } else {
            m.nvml_return = NVML_ERROR_NOT_SUPPORTED;
            m.value = 0.0;
        }
    }
    NVML_SUCCESS
}
