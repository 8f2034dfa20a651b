//! The exported NVML C functions.
//!
//! Every function takes the state lock, reads the state file, and (for mutating calls)
//! writes it back. Handles are opaque tagged integers that are never dereferenced:
//! `kind << 56 | gpu << 40 | serial`, where serial identifies a GI or CI, so a handle to a
//! destroyed instance stays invalid (`NVML_ERROR_INVALID_ARGUMENT`) even if an instance with
//! the same id is created again.
//!
//! Safety contract for every `unsafe extern "C"` function here (the NVML one): pointer
//! arguments are NULL or point to writable memory of the documented type (arrays: of the
//! documented length). NULL is detected and answered with `NVML_ERROR_INVALID_ARGUMENT`.

#![allow(clippy::missing_safety_doc)]

use crate::control;
use crate::mig::{self, CreateError};
use crate::model::{CiProfile, GiProfile, MigModel, Span};
use crate::state::{self, ComputeInstance, GpuInstance, State};
use crate::types::*;
use serde_json::{json, Value};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr;

const KIND_DEVICE: u64 = 1;
const KIND_GI: u64 = 2;
const KIND_CI: u64 = 3;
const KIND_MIG_DEVICE: u64 = 4;

fn handle(kind: u64, gpu: usize, serial: u64) -> *mut c_void {
    ((kind << 56) | ((gpu as u64) << 40) | serial) as usize as *mut c_void
}

fn decode(h: *mut c_void) -> (u64, usize, u64) {
    let v = h as usize as u64;
    (v >> 56, ((v >> 40) & 0xFFFF) as usize, v & 0xFF_FFFF_FFFF)
}

/// Writes `v` to `p`.
///
/// # Safety
/// `p` is non-null and points to writable memory for a `T` (NVML contract).
unsafe fn put<T>(p: *mut T, v: T) {
    // SAFETY: guaranteed by the caller; `write` because the target may be uninitialised.
    unsafe { p.write(v) }
}

/// Copies `s` into a caller buffer of `len` bytes.
///
/// # Safety
/// `buf` is null or points to `len` writable bytes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> NvmlReturn {
    if buf.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (len as usize) < s.len() + 1 {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: buf has at least s.len()+1 writable bytes (checked against len above).
    unsafe {
        ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        put(buf.add(s.len()), 0);
    }
    NVML_SUCCESS
}

// ---------------------------------------------------------------------------------------
// Call plumbing: init refcount, faults, logging.

fn initialized() -> bool {
    *control::INIT_COUNT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        > 0
}

fn report(e: &state::StateError) {
    eprintln!("fake-nvml: {e}");
}

fn env_fault_list(var: &str) -> Vec<(String, NvmlReturn)> {
    std::env::var(var)
        .unwrap_or_default()
        .split(',')
        .filter_map(|item| {
            let (k, v) = item.trim().rsplit_once(':')?;
            Some((k.trim().to_string(), parse_return(v)?))
        })
        .collect()
}

fn named_fault(st: &State, name: &str) -> Option<NvmlReturn> {
    st.faults
        .fail
        .get(name)
        .and_then(|c| parse_return(c))
        .or_else(|| {
            env_fault_list(state::ENV_FAIL)
                .into_iter()
                .find(|(f, _)| f == name)
                .map(|(_, c)| c)
        })
}

fn nth_fault(st: &State, seq: u64) -> Option<NvmlReturn> {
    st.faults
        .fail_at
        .iter()
        .find(|f| f.call == seq)
        .and_then(|f| parse_return(&f.code))
        .or_else(|| {
            env_fault_list(state::ENV_FAIL_AT)
                .into_iter()
                .find(|(n, _)| n.parse::<u64>().ok() == Some(seq))
                .map(|(_, c)| c)
        })
}

/// A read-only call: no write-back.
fn query(name: &str, f: impl FnOnce(&mut State) -> NvmlReturn) -> NvmlReturn {
    control::count_query();
    if !initialized() {
        return NVML_ERROR_UNINITIALIZED;
    }
    let Some(path) = control::state_path() else {
        return NVML_ERROR_DRIVER_NOT_LOADED;
    };
    let spec = std::env::var(state::ENV_SPEC).ok();
    let r = state::with_state(&path, spec.as_deref(), |st| match named_fault(st, name) {
        Some(c) => (c, false),
        None => (f(st), false),
    });
    r.unwrap_or_else(|e| {
        report(&e);
        e.code()
    })
}

/// A mutating call: counted, fault-checked, logged, written back. `f` gets the injected
/// fault (if any) and must return it, after decoding its arguments for the log, without
/// changing anything.
fn mutate(
    name: &str,
    f: impl FnOnce(&mut State, Option<NvmlReturn>) -> (NvmlReturn, Value),
) -> NvmlReturn {
    if !initialized() {
        return NVML_ERROR_UNINITIALIZED;
    }
    let Some(path) = control::state_path() else {
        return NVML_ERROR_DRIVER_NOT_LOADED;
    };
    let spec = std::env::var(state::ENV_SPEC).ok();
    let r = state::with_state(&path, spec.as_deref(), |st| {
        st.mutating_calls += 1;
        let seq = st.mutating_calls;
        // A one-shot fault is used up only by the call it fails.
        let fault = nth_fault(st, seq)
            .or_else(|| {
                st.faults
                    .fail_once
                    .remove(name)
                    .and_then(|c| parse_return(&c))
            })
            .or_else(|| named_fault(st, name));
        let (rc, args) = f(st, fault);
        st.call_log.push(state::CallRecord {
            seq,
            function: name.to_string(),
            args,
            result: return_name(rc),
        });
        (rc, true)
    });
    r.unwrap_or_else(|e| {
        report(&e);
        e.code()
    })
}

// ---------------------------------------------------------------------------------------
// Handle resolution.

#[derive(Clone, Copy)]
enum Dev {
    Phys(usize),
    Mig { gpu: usize, gi: usize, ci: usize },
}

fn find_ci_serial(st: &State, gpu: usize, serial: u64) -> Option<(usize, usize)> {
    st.gpus
        .get(gpu)?
        .gpu_instances
        .iter()
        .enumerate()
        .find_map(|(gi, g)| {
            g.compute_instances
                .iter()
                .position(|c| c.serial == serial)
                .map(|ci| (gi, ci))
        })
}

fn resolve_dev(st: &State, h: NvmlDevice) -> Result<Dev, NvmlReturn> {
    let (kind, gpu, serial) = decode(h);
    match kind {
        KIND_DEVICE if gpu < st.gpus.len() && serial == 0 => Ok(Dev::Phys(gpu)),
        KIND_MIG_DEVICE => find_ci_serial(st, gpu, serial)
            .map(|(gi, ci)| Dev::Mig { gpu, gi, ci })
            .ok_or(NVML_ERROR_INVALID_ARGUMENT),
        _ => Err(NVML_ERROR_INVALID_ARGUMENT),
    }
}

fn resolve_phys(st: &State, h: NvmlDevice) -> Result<usize, NvmlReturn> {
    match resolve_dev(st, h)? {
        Dev::Phys(g) => Ok(g),
        Dev::Mig { .. } => Err(NVML_ERROR_INVALID_ARGUMENT),
    }
}

fn resolve_gi(st: &State, h: NvmlGpuInstance) -> Result<(usize, usize), NvmlReturn> {
    let (kind, gpu, serial) = decode(h);
    if kind != KIND_GI {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    st.gpus
        .get(gpu)
        .and_then(|g| g.gpu_instances.iter().position(|gi| gi.serial == serial))
        .map(|gi| (gpu, gi))
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

fn resolve_ci(st: &State, h: NvmlComputeInstance) -> Result<(usize, usize, usize), NvmlReturn> {
    let (kind, gpu, serial) = decode(h);
    if kind != KIND_CI {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    find_ci_serial(st, gpu, serial)
        .map(|(gi, ci)| (gpu, gi, ci))
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

/// The MIG model of GPU `gpu` if MIG is supported *and* currently enabled.
fn mig_on(st: &State, gpu: usize) -> Result<&'static MigModel, NvmlReturn> {
    let g = &st.gpus[gpu];
    let mig = g.model().mig.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    if g.mig.current != NVML_DEVICE_MIG_ENABLE {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    Ok(mig)
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}

/// Like `tri!` inside `mutate` closures, keeping the args for the log.
macro_rules! tri_m {
    ($e:expr, $args:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return (code, $args),
        }
    };
}

fn gi_profile_of(mig: &'static MigModel, gi: &GpuInstance) -> &'static GiProfile {
    mig.gi_by_id(gi.profile_id)
        .expect("GI profile exists in model")
}

/// MIG devices of a GPU in index order: (GI index, CI index) sorted by (GI id, CI id).
fn mig_devices(st: &State, gpu: usize) -> Vec<(usize, usize)> {
    let g = &st.gpus[gpu];
    let mut v: Vec<(u32, u32, usize, usize)> = g
        .gpu_instances
        .iter()
        .enumerate()
        .flat_map(|(gi_i, gi)| {
            gi.compute_instances
                .iter()
                .enumerate()
                .map(move |(ci_i, ci)| (gi.id, ci.id, gi_i, ci_i))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, _, a, b)| (a, b)).collect()
}

// ---------------------------------------------------------------------------------------
// Init / system.

/// `nvmlInit_v2`: loads the state (creating it from `FAKE_NVML_SPEC` if missing) and
/// writes `mig-minors` under `FAKE_NVML_ROOT`. Reference-counted like the real library.
#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    control::count_query();
    let Some(path) = control::state_path() else {
        return NVML_ERROR_DRIVER_NOT_LOADED;
    };
    let spec = std::env::var(state::ENV_SPEC).ok();
    let root = std::env::var_os(state::ENV_ROOT);
    let r = state::with_state(&path, spec.as_deref(), |st| {
        if let Some(root) = &root {
            if let Err(e) = state::write_mig_minors(std::path::Path::new(root), st) {
                eprintln!("fake-nvml: writing mig-minors under {root:?}: {e}");
                return (NVML_ERROR_UNKNOWN, false);
            }
        }
        (NVML_SUCCESS, false)
    });
    match r {
        Ok(NVML_SUCCESS) => {
            *control::INIT_COUNT
                .lock()
                .unwrap_or_else(|e| e.into_inner()) += 1;
            NVML_SUCCESS
        }
        Ok(code) => code,
        Err(e) => {
            report(&e);
            e.code()
        }
    }
}

/// Legacy `nvmlInit`.
#[no_mangle]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    nvmlInit_v2()
}

/// `nvmlInitWithFlags`; flags are accepted and ignored.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    nvmlInit_v2()
}

/// `nvmlShutdown`.
#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    let mut n = control::INIT_COUNT
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if *n == 0 {
        return NVML_ERROR_UNINITIALIZED;
    }
    *n -= 1;
    NVML_SUCCESS
}

/// `nvmlErrorString`: static strings as in the real library.
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let s: &'static CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt Request Issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"vGPU ECC not supported",
        23 => c"Insufficient resources",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"Deprecated",
        27 => c"Not ready",
        28 => c"GPU not found",
        29 => c"Invalid state",
        30 => c"Reset type not supported",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

/// Driver version reported by the fake.
pub const DRIVER_VERSION: &str = "550.54.15";
/// NVML version reported by the fake.
pub const NVML_VERSION: &str = "12.550.54.15";

/// `nvmlSystemGetDriverVersion`.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    // SAFETY: the caller provides `length` bytes at `version` (NVML contract).
    query("nvmlSystemGetDriverVersion", |_| unsafe {
        put_str(version, length, DRIVER_VERSION)
    })
}

/// `nvmlSystemGetNVMLVersion`.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    // SAFETY: the caller provides `length` bytes at `version` (NVML contract).
    query("nvmlSystemGetNVMLVersion", |_| unsafe {
        put_str(version, length, NVML_VERSION)
    })
}

/// `nvmlSystemGetCudaDriverVersion` (12.4).
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> NvmlReturn {
    query("nvmlSystemGetCudaDriverVersion", |_| {
        if v.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null, points to a c_int (NVML contract).
        unsafe { put(v, 12040) };
        NVML_SUCCESS
    })
}

/// `nvmlSystemGetCudaDriverVersion_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> NvmlReturn {
    // SAFETY: same contract as the v1 function.
    unsafe { nvmlSystemGetCudaDriverVersion(v) }
}

// ---------------------------------------------------------------------------------------
// Devices.

/// `nvmlDeviceGetCount_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    query("nvmlDeviceGetCount_v2", |st| {
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null, points to a c_uint.
        unsafe { put(count, st.gpus.len() as c_uint) };
        NVML_SUCCESS
    })
}

/// Legacy `nvmlDeviceGetCount`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

/// `nvmlDeviceGetHandleByIndex_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    query("nvmlDeviceGetHandleByIndex_v2", |st| {
        if device.is_null() || index as usize >= st.gpus.len() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null, points to an nvmlDevice_t.
        unsafe { put(device, handle(KIND_DEVICE, index as usize, 0)) };
        NVML_SUCCESS
    })
}

/// Legacy `nvmlDeviceGetHandleByIndex`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// `nvmlDeviceGetHandleByUUID`: accepts `GPU-…` and `MIG-…` UUIDs.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    query("nvmlDeviceGetHandleByUUID", |st| {
        if uuid.is_null() || device.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null NUL-terminated string (NVML contract).
        let want = unsafe { CStr::from_ptr(uuid) }
            .to_string_lossy()
            .into_owned();
        for (i, g) in st.gpus.iter().enumerate() {
            if g.uuid == want {
                // SAFETY: non-null, points to an nvmlDevice_t.
                unsafe { put(device, handle(KIND_DEVICE, i, 0)) };
                return NVML_SUCCESS;
            }
            for gi in &g.gpu_instances {
                if let Some(ci) = gi.compute_instances.iter().find(|c| c.uuid == want) {
                    // SAFETY: as above.
                    unsafe { put(device, handle(KIND_MIG_DEVICE, i, ci.serial)) };
                    return NVML_SUCCESS;
                }
            }
        }
        NVML_ERROR_NOT_FOUND
    })
}

fn pci_bus(st: &State, gpu: usize) -> u32 {
    st.gpus[gpu].pci_bus.unwrap_or(0x10 + 0x10 * gpu as u32) & 0xFF
}

/// `nvmlDeviceGetHandleByPciBusId_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    query("nvmlDeviceGetHandleByPciBusId_v2", |st| {
        if bus_id.is_null() || device.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null NUL-terminated string.
        let want = unsafe { CStr::from_ptr(bus_id) }
            .to_string_lossy()
            .to_ascii_uppercase();
        for i in 0..st.gpus.len() {
            let b = pci_bus(st, i);
            if want == format!("00000000:{b:02X}:00.0") || want == format!("0000:{b:02X}:00.0") {
                // SAFETY: non-null, points to an nvmlDevice_t.
                unsafe { put(device, handle(KIND_DEVICE, i, 0)) };
                return NVML_SUCCESS;
            }
        }
        NVML_ERROR_NOT_FOUND
    })
}

/// `nvmlDeviceGetName`; MIG devices are named `<GPU name> MIG <profile>`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: NvmlDevice,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    query("nvmlDeviceGetName", |st| {
        let s = match tri!(resolve_dev(st, device)) {
            Dev::Phys(g) => st.gpus[g].model().nvml_name.clone(),
            Dev::Mig { gpu, gi, ci } => {
                let g = &st.gpus[gpu];
                let mig = g.model().mig.as_ref().expect("MIG device on MIG model");
                let gi = &g.gpu_instances[gi];
                let ci = &gi.compute_instances[ci];
                let pname = mig
                    .ci_profiles(gi.profile_id)
                    .iter()
                    .find(|p| p.profile_id == ci.profile_id)
                    .map_or_else(|| gi_profile_of(mig, gi).name.clone(), |p| p.name.clone());
                format!("{} MIG {pname}", g.model().nvml_name)
            }
        };
        // SAFETY: caller provides `length` bytes at `name`.
        unsafe { put_str(name, length, &s) }
    })
}

/// `nvmlDeviceGetUUID`: `GPU-<uuid>` or, for MIG devices, `MIG-<uuid>`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: NvmlDevice,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    query("nvmlDeviceGetUUID", |st| {
        let s = match tri!(resolve_dev(st, device)) {
            Dev::Phys(g) => st.gpus[g].uuid.clone(),
            Dev::Mig { gpu, gi, ci } => st.gpus[gpu].gpu_instances[gi].compute_instances[ci]
                .uuid
                .clone(),
        };
        // SAFETY: caller provides `length` bytes at `uuid`.
        unsafe { put_str(uuid, length, &s) }
    })
}

/// `nvmlDeviceGetMinorNumber`; NOT_SUPPORTED on MIG devices (assumed).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: NvmlDevice,
    minor: *mut c_uint,
) -> NvmlReturn {
    query("nvmlDeviceGetMinorNumber", |st| {
        match tri!(resolve_dev(st, device)) {
            Dev::Mig { .. } => NVML_ERROR_NOT_SUPPORTED,
            Dev::Phys(_) if minor.is_null() => NVML_ERROR_INVALID_ARGUMENT,
            Dev::Phys(g) => {
                // SAFETY: non-null, points to a c_uint.
                unsafe { put(minor, st.gpus[g].minor_number(g)) };
                NVML_SUCCESS
            }
        }
    })
}

/// `nvmlDeviceGetIndex`; NOT_SUPPORTED on MIG devices (assumed).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) -> NvmlReturn {
    query("nvmlDeviceGetIndex", |st| {
        match tri!(resolve_dev(st, device)) {
            Dev::Mig { .. } => NVML_ERROR_NOT_SUPPORTED,
            Dev::Phys(_) if index.is_null() => NVML_ERROR_INVALID_ARGUMENT,
            Dev::Phys(g) => {
                // SAFETY: non-null, points to a c_uint.
                unsafe { put(index, g as c_uint) };
                NVML_SUCCESS
            }
        }
    })
}

const MIB: u64 = 1024 * 1024;

/// (total, used) bytes of a device: the GPU's framebuffer, or the GI's memory for MIG devices.
fn memory_of(st: &State, dev: Dev) -> (u64, u64) {
    match dev {
        Dev::Phys(g) => {
            let used: u64 = st
                .processes
                .iter()
                .filter(|p| p.gpu as usize == g)
                .map(|p| p.used_memory_mib)
                .sum();
            (st.gpus[g].model().memory_total_mib * MIB, used * MIB)
        }
        Dev::Mig { gpu, gi, .. } => {
            let g = &st.gpus[gpu];
            let gi = &g.gpu_instances[gi];
            let mig = g.model().mig.as_ref().expect("MIG model");
            let used: u64 = st
                .processes
                .iter()
                .filter(|p| p.gpu as usize == gpu && p.gi == Some(gi.id))
                .map(|p| p.used_memory_mib)
                .sum();
            (gi_profile_of(mig, gi).memory_size_mb * MIB, used * MIB)
        }
    }
}

/// `nvmlDeviceGetMemoryInfo` (v1 struct).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    memory: *mut Memory,
) -> NvmlReturn {
    query("nvmlDeviceGetMemoryInfo", |st| {
        let dev = tri!(resolve_dev(st, device));
        if memory.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let (total, used) = memory_of(st, dev);
        let used = used.min(total);
        // SAFETY: non-null, points to an nvmlMemory_t.
        unsafe {
            put(
                memory,
                Memory {
                    total,
                    free: total - used,
                    used,
                },
            )
        };
        NVML_SUCCESS
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: requires version word 0x02000028.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut MemoryV2,
) -> NvmlReturn {
    query("nvmlDeviceGetMemoryInfo_v2", |st| {
        let dev = tri!(resolve_dev(st, device));
        if memory.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null, points to an nvmlMemory_v2_t whose version the caller set.
        let version = unsafe { (*memory).version };
        if version != MEMORY_V2 {
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let (total, used) = memory_of(st, dev);
        let used = used.min(total);
        // SAFETY: as above.
        unsafe {
            put(
                memory,
                MemoryV2 {
                    version,
                    total,
                    reserved: 0,
                    free: total - used,
                    used,
                },
            )
        };
        NVML_SUCCESS
    })
}

/// `nvmlDeviceGetPciInfo_v3` (MIG devices report their parent's PCI info).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: NvmlDevice,
    pci: *mut PciInfo,
) -> NvmlReturn {
    query("nvmlDeviceGetPciInfo_v3", |st| {
        let gpu = match tri!(resolve_dev(st, device)) {
            Dev::Phys(g) | Dev::Mig { gpu: g, .. } => g,
        };
        if pci.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let bus = pci_bus(st, gpu);
        let mut info = PciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus,
            device: 0,
            pci_device_id: st.gpus[gpu].model().pci_device_id,
            pci_sub_system_id: 0x16C1_10DE,
            bus_id: [0; 32],
        };
        fill_c_array(&mut info.bus_id_legacy, &format!("0000:{bus:02X}:00.0"));
        fill_c_array(&mut info.bus_id, &format!("00000000:{bus:02X}:00.0"));
        // SAFETY: non-null, points to an nvmlPciInfo_t.
        unsafe { put(pci, info) };
        NVML_SUCCESS
    })
}

/// Legacy `nvmlDeviceGetPciInfo_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: NvmlDevice,
    pci: *mut PciInfo,
) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetPciInfo_v3(device, pci) }
}

/// Legacy `nvmlDeviceGetPciInfo`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(device: NvmlDevice, pci: *mut PciInfo) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetPciInfo_v3(device, pci) }
}

// ---------------------------------------------------------------------------------------
// Processes.

/// Writes the processes matching `dev` with NVML's count-query protocol.
///
/// # Safety
/// `count` null or a valid c_uint; `out` null or `*count` writable `T`s.
unsafe fn put_processes<T>(
    st: &State,
    device: NvmlDevice,
    count: *mut c_uint,
    out: *mut T,
    conv: impl Fn(&state::Process) -> T,
) -> NvmlReturn {
    let dev = tri!(resolve_dev(st, device));
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let list: Vec<&state::Process> = st
        .processes
        .iter()
        .filter(|p| match dev {
            Dev::Phys(g) => p.gpu as usize == g,
            Dev::Mig { gpu, gi, ci } => {
                let gi = &st.gpus[gpu].gpu_instances[gi];
                p.gpu as usize == gpu
                    && p.gi == Some(gi.id)
                    && p.ci == Some(gi.compute_instances[ci].id)
            }
        })
        .collect();
    // SAFETY: count non-null (checked), points to a c_uint.
    let cap = if out.is_null() {
        0
    } else {
        (unsafe { *count }) as usize
    };
    // SAFETY: as above.
    unsafe { put(count, list.len() as c_uint) };
    if list.is_empty() {
        return NVML_SUCCESS;
    }
    if cap < list.len() {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (i, p) in list.iter().enumerate() {
        // SAFETY: out has `cap >= list.len()` elements (caller contract via *count).
        unsafe { put(out.add(i), conv(p)) };
    }
    NVML_SUCCESS
}

fn proc_v2(p: &state::Process) -> ProcessInfo {
    ProcessInfo {
        pid: p.pid,
        used_gpu_memory: p.used_memory_mib * MIB,
        gpu_instance_id: p.gi.unwrap_or(NVML_NO_INSTANCE),
        compute_instance_id: p.ci.unwrap_or(NVML_NO_INSTANCE),
    }
}

/// `nvmlDeviceGetComputeRunningProcesses_v3` (what nvml-wrapper 0.13 calls).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    // SAFETY: NVML contract on count/infos.
    query("nvmlDeviceGetComputeRunningProcesses_v3", |st| unsafe {
        put_processes(st, device, count, infos, proc_v2)
    })
}

/// `nvmlDeviceGetComputeRunningProcesses_v2` (same struct as v3).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    // SAFETY: NVML contract on count/infos.
    query("nvmlDeviceGetComputeRunningProcesses_v2", |st| unsafe {
        put_processes(st, device, count, infos, proc_v2)
    })
}

/// Legacy `nvmlDeviceGetComputeRunningProcesses` (v1 struct without instance ids).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> NvmlReturn {
    // SAFETY: NVML contract on count/infos.
    query("nvmlDeviceGetComputeRunningProcesses", |st| unsafe {
        put_processes(st, device, count, infos, |p| ProcessInfoV1 {
            pid: p.pid,
            used_gpu_memory: p.used_memory_mib * MIB,
        })
    })
}

/// Graphics and MPS process lists: the fake models compute processes only, so these are empty.
unsafe fn no_processes(name: &str, device: NvmlDevice, count: *mut c_uint) -> NvmlReturn {
    query(name, |st| {
        tri!(resolve_dev(st, device));
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null, points to a c_uint.
        unsafe { put(count, 0) };
        NVML_SUCCESS
    })
}

/// `nvmlDeviceGetGraphicsRunningProcesses_v3` (the graphics processes of `usage`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    d: NvmlDevice,
    c: *mut c_uint,
    i: *mut ProcessInfo,
) -> NvmlReturn {
    // SAFETY: NVML contract on c and i.
    unsafe { crate::usage::graphics_processes(d, c, i) }
}

/// `nvmlDeviceGetMPSComputeRunningProcesses_v3` (always empty).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    d: NvmlDevice,
    c: *mut c_uint,
    _i: *mut ProcessInfo,
) -> NvmlReturn {
    // SAFETY: NVML contract on c.
    unsafe { no_processes("nvmlDeviceGetMPSComputeRunningProcesses_v3", d, c) }
}

// ---------------------------------------------------------------------------------------
// MIG mode.

/// `nvmlDeviceGetMigMode`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: NvmlDevice,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> NvmlReturn {
    query("nvmlDeviceGetMigMode", |st| {
        let g = tri!(resolve_phys(st, device));
        if current.is_null() || pending.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let gpu = &st.gpus[g];
        if gpu.model().mig.is_none() {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        // SAFETY: both non-null, point to c_uints.
        unsafe {
            put(current, gpu.mig.current);
            put(pending, gpu.mig.pending);
        }
        NVML_SUCCESS
    })
}

/// `nvmlDeviceSetMigMode`. The new mode becomes pending; activation (which the real driver
/// does by resetting the GPU inside this call) succeeds only when no process holds the GPU
/// and, on models that need a reset (A100/A30), the GPU's `inline_reset_ok` is set. Otherwise
/// `*activationStatus = NVML_ERROR_IN_USE` and the mode stays pending until
/// `fakeNvmlResetGpu`. Disabling while GPU instances exist fails with `NVML_ERROR_IN_USE`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: NvmlDevice,
    mode: c_uint,
    activation_status: *mut NvmlReturn,
) -> NvmlReturn {
    mutate("nvmlDeviceSetMigMode", |st, fault| {
        let g = resolve_phys(st, device);
        let args = json!({"gpu": g.ok(), "mode": mode});
        if let Some(c) = fault {
            return (c, args);
        }
        let g = tri_m!(g, args);
        let Some(mig) = st.gpus[g].model().mig.as_ref() else {
            return (NVML_ERROR_NOT_SUPPORTED, args);
        };
        if activation_status.is_null() || mode > 1 {
            return (NVML_ERROR_INVALID_ARGUMENT, args);
        }
        if mode == NVML_DEVICE_MIG_DISABLE && !st.gpus[g].gpu_instances.is_empty() {
            return (NVML_ERROR_IN_USE, args);
        }
        let busy = mig::busy(st, g as u32, None, None);
        let gpu = &mut st.gpus[g];
        gpu.mig.pending = mode;
        let status = if gpu.mig.current == mode {
            NVML_SUCCESS
        } else if busy || (mig.enable_requires_gpu_reset && !gpu.inline_reset_ok) {
            NVML_ERROR_IN_USE
        } else {
            gpu.mig.current = mode;
            gpu.gpu_instances.clear();
            NVML_SUCCESS
        };
        // SAFETY: non-null (checked), points to an nvmlReturn_t.
        unsafe { put(activation_status, status) };
        (
            NVML_SUCCESS,
            json!({"gpu": g, "mode": mode, "activationStatus": return_name(status)}),
        )
    })
}

// ---------------------------------------------------------------------------------------
// GPU instances.

fn gi_profile_for_index(
    st: &State,
    g: usize,
    index: c_uint,
) -> Result<&'static GiProfile, NvmlReturn> {
    if index >= NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    mig_on(st, g)?
        .gi_by_index(index)
        .ok_or(NVML_ERROR_NOT_SUPPORTED)
}

fn gi_info_v1(p: &GiProfile) -> GpuInstanceProfileInfo {
    GpuInstanceProfileInfo {
        id: p.profile_id,
        is_p2p_supported: 0,
        slice_count: p.slice_count,
        instance_count: p.instance_count,
        multiprocessor_count: p.multiprocessor_count,
        copy_engine_count: p.copy_engine_count,
        decoder_count: p.decoder_count,
        encoder_count: p.encoder_count,
        jpeg_count: p.jpeg_count,
        ofa_count: p.ofa_count,
        memory_size_mb: p.memory_size_mb,
    }
}

/// Writes a v2 or v3 GI profile info according to the caller's version word.
///
/// # Safety
/// `info` non-null, pointing to a struct of the size its version word announces.
unsafe fn put_gi_info_v(p: &GiProfile, info: *mut GpuInstanceProfileInfoV2) -> NvmlReturn {
    // SAFETY: caller guarantees at least the leading version word is readable.
    let version = unsafe { *info.cast::<c_uint>() };
    let name = format!("MIG {}", p.name);
    let v1 = gi_info_v1(p);
    match version {
        GPU_INSTANCE_PROFILE_INFO_V2 => {
            let mut out = GpuInstanceProfileInfoV2 {
                version,
                id: v1.id,
                is_p2p_supported: 0,
                slice_count: v1.slice_count,
                instance_count: v1.instance_count,
                multiprocessor_count: v1.multiprocessor_count,
                copy_engine_count: v1.copy_engine_count,
                decoder_count: v1.decoder_count,
                encoder_count: v1.encoder_count,
                jpeg_count: v1.jpeg_count,
                ofa_count: v1.ofa_count,
                memory_size_mb: v1.memory_size_mb,
                name: [0; 96],
            };
            fill_c_array(&mut out.name, &name);
            // SAFETY: version word says the buffer is a v2 struct.
            unsafe { put(info, out) };
            NVML_SUCCESS
        }
        GPU_INSTANCE_PROFILE_INFO_V3 => {
            let mut out = GpuInstanceProfileInfoV3 {
                version,
                id: v1.id,
                slice_count: v1.slice_count,
                instance_count: v1.instance_count,
                multiprocessor_count: v1.multiprocessor_count,
                copy_engine_count: v1.copy_engine_count,
                decoder_count: v1.decoder_count,
                encoder_count: v1.encoder_count,
                jpeg_count: v1.jpeg_count,
                ofa_count: v1.ofa_count,
                memory_size_mb: v1.memory_size_mb,
                name: [0; 96],
                capabilities: 0,
            };
            fill_c_array(&mut out.name, &name);
            // SAFETY: version word says the buffer is a v3 struct.
            unsafe { put(info.cast::<GpuInstanceProfileInfoV3>(), out) };
            NVML_SUCCESS
        }
        _ => NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    }
}

/// `nvmlDeviceGetGpuInstanceProfileInfo`: takes a profile **index**
/// (`NVML_GPU_INSTANCE_PROFILE_*`), returns the published profile **ID** in `info.id`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: NvmlDevice,
    profile: c_uint,
    info: *mut GpuInstanceProfileInfo,
) -> NvmlReturn {
    query("nvmlDeviceGetGpuInstanceProfileInfo", |st| {
        let g = tri!(resolve_phys(st, device));
        if info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let p = tri!(gi_profile_for_index(st, g, profile));
        // SAFETY: non-null, points to an nvmlGpuInstanceProfileInfo_t.
        unsafe { put(info, gi_info_v1(p)) };
        NVML_SUCCESS
    })
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV` (profile index; v2 or v3 struct by version word).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: NvmlDevice,
    profile: c_uint,
    info: *mut GpuInstanceProfileInfoV2,
) -> NvmlReturn {
    query("nvmlDeviceGetGpuInstanceProfileInfoV", |st| {
        let g = tri!(resolve_phys(st, device));
        if info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let p = tri!(gi_profile_for_index(st, g, profile));
        // SAFETY: non-null; struct size given by its version word.
        unsafe { put_gi_info_v(p, info) }
    })
}

/// `nvmlDeviceGetGpuInstanceProfileInfoByIdV` (published profile ID).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoByIdV(
    device: NvmlDevice,
    profile_id: c_uint,
    info: *mut GpuInstanceProfileInfoV2,
) -> NvmlReturn {
    query("nvmlDeviceGetGpuInstanceProfileInfoByIdV", |st| {
        let g = tri!(resolve_phys(st, device));
        if info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let mig = tri!(mig_on(st, g));
        let p = tri!(mig.gi_by_id(profile_id).ok_or(NVML_ERROR_INVALID_ARGUMENT));
        // SAFETY: non-null; struct size given by its version word.
        unsafe { put_gi_info_v(p, info) }
    })
}

/// Physical GPU with MIG on, and the GI profile for a published ID (unknown ID → INVALID_ARGUMENT).
fn gpu_and_gi_profile(
    st: &State,
    device: NvmlDevice,
    profile_id: c_uint,
) -> Result<(usize, &'static MigModel, &'static GiProfile), NvmlReturn> {
    let g = resolve_phys(st, device)?;
    let mig = mig_on(st, g)?;
    let p = mig
        .gi_by_id(profile_id)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    Ok((g, mig, p))
}

/// Writes placements with count-query semantics: `out == NULL` → `*count = n`, SUCCESS;
/// otherwise `*count` is the buffer capacity (`INSUFFICIENT_SIZE` if smaller than n).
///
/// # Safety
/// `count` valid; `out` null or `*count` writable placements.
unsafe fn put_placements(list: &[Span], out: *mut Placement, count: *mut c_uint) -> NvmlReturn {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if out.is_null() {
        // SAFETY: non-null, points to a c_uint.
        unsafe { put(count, list.len() as c_uint) };
        return NVML_SUCCESS;
    }
    // SAFETY: non-null, points to a c_uint holding the capacity.
    let cap = (unsafe { *count }) as usize;
    // SAFETY: as above.
    unsafe { put(count, list.len() as c_uint) };
    if cap < list.len() {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (i, p) in list.iter().enumerate() {
        // SAFETY: out holds `cap >= list.len()` placements.
        unsafe {
            put(
                out.add(i),
                Placement {
                    start: p.start,
                    size: p.size,
                },
            )
        };
    }
    NVML_SUCCESS
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: all placements of the profile (occupied
/// or not). Pass `placements = NULL` to get the count.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: NvmlDevice,
    profile_id: c_uint,
    placements: *mut Placement,
    count: *mut c_uint,
) -> NvmlReturn {
    query("nvmlDeviceGetGpuInstancePossiblePlacements_v2", |st| {
        let (_, _, p) = tri!(gpu_and_gi_profile(st, device, profile_id));
        // SAFETY: NVML contract on placements/count.
        unsafe { put_placements(&p.placements, placements, count) }
    })
}

/// Legacy `nvmlDeviceGetGpuInstancePossiblePlacements` (same semantics here).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements(
    device: NvmlDevice,
    profile_id: c_uint,
    placements: *mut Placement,
    count: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profile_id, placements, count) }
}

/// `nvmlDeviceGetGpuInstanceRemainingCapacity`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: NvmlDevice,
    profile_id: c_uint,
    count: *mut c_uint,
) -> NvmlReturn {
    query("nvmlDeviceGetGpuInstanceRemainingCapacity", |st| {
        let (g, mig, p) = tri!(gpu_and_gi_profile(st, device, profile_id));
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null, points to a c_uint.
        unsafe { put(count, mig::gi_remaining(mig, &st.gpus[g].gpu_instances, p)) };
        NVML_SUCCESS
    })
}

fn create_gi(
    st: &mut State,
    fault: Option<NvmlReturn>,
    device: NvmlDevice,
    profile_id: c_uint,
    placement: Option<*const Placement>,
    out: *mut NvmlGpuInstance,
) -> (NvmlReturn, Value) {
    let g = resolve_phys(st, device);
    // SAFETY: placement is null or points to an nvmlGpuInstancePlacement_t.
    let req: Option<Span> = placement.and_then(|p| unsafe { p.as_ref() }).map(|p| Span {
        start: p.start,
        size: p.size,
    });
    let mut args = json!({"gpu": g.ok(), "profileId": profile_id});
    if let Some(r) = req {
        args["placement"] = json!({"start": r.start, "size": r.size});
    }
    if let Some(c) = fault {
        return (c, args);
    }
    let (g, mig, prof) = tri_m!(gpu_and_gi_profile(st, device, profile_id), args);
    if out.is_null() || (placement.is_some() && req.is_none()) {
        return (NVML_ERROR_INVALID_ARGUMENT, args);
    }
    let gis = &st.gpus[g].gpu_instances;
    let span = match req {
        Some(r) => r,
        None => tri_m!(
            mig::auto_gi_placement(mig, gis, prof).ok_or(NVML_ERROR_INSUFFICIENT_RESOURCES),
            args
        ),
    };
    let id = match mig::check_gi(mig, gis, prof, span) {
        Ok(id) => id,
        Err(CreateError::BadPlacement) => return (NVML_ERROR_INVALID_ARGUMENT, args),
        Err(CreateError::NoResources) => return (NVML_ERROR_INSUFFICIENT_RESOURCES, args),
    };
    let serial = st.alloc_serial();
    st.gpus[g].gpu_instances.push(GpuInstance {
        id,
        profile_id,
        start: span.start,
        size: span.size,
        serial,
        compute_instances: Vec::new(),
    });
    // SAFETY: non-null (checked), points to an nvmlGpuInstance_t.
    unsafe { put(out, handle(KIND_GI, g, serial)) };
    args["placement"] = json!({"start": span.start, "size": span.size});
    args["gpuInstanceId"] = json!(id);
    (NVML_SUCCESS, args)
}

/// `nvmlDeviceCreateGpuInstance`: the driver picks the placement (see `mig` module docs).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    device: NvmlDevice,
    profile_id: c_uint,
    gpu_instance: *mut NvmlGpuInstance,
) -> NvmlReturn {
    mutate("nvmlDeviceCreateGpuInstance", |st, fault| {
        create_gi(st, fault, device, profile_id, None, gpu_instance)
    })
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`: placement not among the profile's →
/// INVALID_ARGUMENT; overlapping/full → INSUFFICIENT_RESOURCES.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: NvmlDevice,
    profile_id: c_uint,
    placement: *const Placement,
    gpu_instance: *mut NvmlGpuInstance,
) -> NvmlReturn {
    mutate("nvmlDeviceCreateGpuInstanceWithPlacement", |st, fault| {
        create_gi(st, fault, device, profile_id, Some(placement), gpu_instance)
    })
}

/// `nvmlGpuInstanceDestroy`: IN_USE while it has compute instances or processes.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gpu_instance: NvmlGpuInstance) -> NvmlReturn {
    mutate("nvmlGpuInstanceDestroy", |st, fault| {
        let r = resolve_gi(st, gpu_instance);
        let args = match r {
            Ok((g, gi)) => json!({"gpu": g, "gpuInstanceId": st.gpus[g].gpu_instances[gi].id}),
            Err(_) => json!({"gpuInstance": "invalid"}),
        };
        if let Some(c) = fault {
            return (c, args);
        }
        let (g, gi) = tri_m!(r, args);
        let inst = &st.gpus[g].gpu_instances[gi];
        if !inst.compute_instances.is_empty() || mig::busy(st, g as u32, Some(inst.id), None) {
            return (NVML_ERROR_IN_USE, args);
        }
        st.gpus[g].gpu_instances.remove(gi);
        (NVML_SUCCESS, args)
    })
}

/// `nvmlDeviceGetGpuInstances`: existing GIs of one profile, by id. The buffer must hold
/// the profile's `instanceCount` handles; `*count` is output only (as in the header).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: NvmlDevice,
    profile_id: c_uint,
    gpu_instances: *mut NvmlGpuInstance,
    count: *mut c_uint,
) -> NvmlReturn {
    query("nvmlDeviceGetGpuInstances", |st| {
        let (g, _, _) = tri!(gpu_and_gi_profile(st, device, profile_id));
        if gpu_instances.is_null() || count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let mut list: Vec<&GpuInstance> = st.gpus[g]
            .gpu_instances
            .iter()
            .filter(|gi| gi.profile_id == profile_id)
            .collect();
        list.sort_by_key(|gi| gi.id);
        for (i, gi) in list.iter().enumerate() {
            // SAFETY: the buffer holds instanceCount >= list.len() handles (NVML contract).
            unsafe { put(gpu_instances.add(i), handle(KIND_GI, g, gi.serial)) };
        }
        // SAFETY: non-null, points to a c_uint.
        unsafe { put(count, list.len() as c_uint) };
        NVML_SUCCESS
    })
}

/// `nvmlDeviceGetGpuInstanceById`: id > 14 → INVALID_ARGUMENT, absent → NOT_FOUND.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: NvmlDevice,
    id: c_uint,
    gpu_instance: *mut NvmlGpuInstance,
) -> NvmlReturn {
    query("nvmlDeviceGetGpuInstanceById", |st| {
        let g = tri!(resolve_phys(st, device));
        tri!(mig_on(st, g));
        if gpu_instance.is_null() || id > 14 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        match st.gpus[g].gpu_instances.iter().find(|gi| gi.id == id) {
            Some(gi) => {
                // SAFETY: non-null, points to an nvmlGpuInstance_t.
                unsafe { put(gpu_instance, handle(KIND_GI, g, gi.serial)) };
                NVML_SUCCESS
            }
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}

/// `nvmlGpuInstanceGetInfo`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: NvmlGpuInstance,
    info: *mut GpuInstanceInfo,
) -> NvmlReturn {
    query("nvmlGpuInstanceGetInfo", |st| {
        let (g, gi) = tri!(resolve_gi(st, gpu_instance));
        if info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let inst = &st.gpus[g].gpu_instances[gi];
        let v = GpuInstanceInfo {
            device: handle(KIND_DEVICE, g, 0),
            id: inst.id,
            profile_id: inst.profile_id,
            placement: Placement {
                start: inst.start,
                size: inst.size,
            },
        };
        // SAFETY: non-null, points to an nvmlGpuInstanceInfo_t.
        unsafe { put(info, v) };
        NVML_SUCCESS
    })
}

// ---------------------------------------------------------------------------------------
// Compute instances.

fn gi_ctx(st: &State, h: NvmlGpuInstance) -> Result<(usize, usize, &'static MigModel), NvmlReturn> {
    let (g, gi) = resolve_gi(st, h)?;
    Ok((g, gi, mig_on(st, g)?))
}

fn ci_profile_by_index(
    mig: &'static MigModel,
    gi: &GpuInstance,
    index: c_uint,
) -> Result<&'static CiProfile, NvmlReturn> {
    if index >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    mig.ci_profiles(gi.profile_id)
        .iter()
        .find(|p| p.nvml_profile_index == index)
        .ok_or(NVML_ERROR_NOT_SUPPORTED)
}

fn ci_profile_by_id(
    mig: &'static MigModel,
    gi: &GpuInstance,
    id: c_uint,
) -> Result<&'static CiProfile, NvmlReturn> {
    mig.ci_profiles(gi.profile_id)
        .iter()
        .find(|p| p.profile_id == id)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

fn ci_info_v1(gp: &GiProfile, p: &CiProfile) -> ComputeInstanceProfileInfo {
    // CIs share their GI's engines.
    ComputeInstanceProfileInfo {
        id: p.profile_id,
        slice_count: p.slice_count,
        instance_count: p.instance_count,
        multiprocessor_count: p.multiprocessor_count,
        shared_copy_engine_count: gp.copy_engine_count,
        shared_decoder_count: gp.decoder_count,
        shared_encoder_count: gp.encoder_count,
        shared_jpeg_count: gp.jpeg_count,
        shared_ofa_count: gp.ofa_count,
    }
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo`: profile **index**, engine profile must be
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpu_instance: NvmlGpuInstance,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut ComputeInstanceProfileInfo,
) -> NvmlReturn {
    query("nvmlGpuInstanceGetComputeInstanceProfileInfo", |st| {
        let (g, gi, mig) = tri!(gi_ctx(st, gpu_instance));
        if info.is_null() || eng_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let inst = &st.gpus[g].gpu_instances[gi];
        let p = tri!(ci_profile_by_index(mig, inst, profile));
        // SAFETY: non-null, points to an nvmlComputeInstanceProfileInfo_t.
        unsafe { put(info, ci_info_v1(gi_profile_of(mig, inst), p)) };
        NVML_SUCCESS
    })
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfoV` (v2 0x02000088 or v3 0x0300008c).
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gpu_instance: NvmlGpuInstance,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut ComputeInstanceProfileInfoV2,
) -> NvmlReturn {
    query("nvmlGpuInstanceGetComputeInstanceProfileInfoV", |st| {
        let (g, gi, mig) = tri!(gi_ctx(st, gpu_instance));
        if info.is_null() || eng_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let inst = &st.gpus[g].gpu_instances[gi];
        let p = tri!(ci_profile_by_index(mig, inst, profile));
        let v = ci_info_v1(gi_profile_of(mig, inst), p);
        // SAFETY: non-null; the leading version word is readable.
        let version = unsafe { *info.cast::<c_uint>() };
        let mut out = ComputeInstanceProfileInfoV3 {
            version,
            id: v.id,
            slice_count: v.slice_count,
            instance_count: v.instance_count,
            multiprocessor_count: v.multiprocessor_count,
            shared_copy_engine_count: v.shared_copy_engine_count,
            shared_decoder_count: v.shared_decoder_count,
            shared_encoder_count: v.shared_encoder_count,
            shared_jpeg_count: v.shared_jpeg_count,
            shared_ofa_count: v.shared_ofa_count,
            name: [0; 96],
            capabilities: 0,
        };
        fill_c_array(&mut out.name, &format!("MIG {}", p.name));
        match version {
            COMPUTE_INSTANCE_PROFILE_INFO_V2 => {
                // SAFETY: v2 struct is the v3 prefix without `capabilities`; copy that prefix.
                unsafe {
                    ptr::copy_nonoverlapping(
                        (&out as *const ComputeInstanceProfileInfoV3).cast::<u8>(),
                        info.cast::<u8>(),
                        std::mem::size_of::<ComputeInstanceProfileInfoV2>(),
                    )
                };
                NVML_SUCCESS
            }
            COMPUTE_INSTANCE_PROFILE_INFO_V3 => {
                // SAFETY: version word says the buffer is a v3 struct.
                unsafe { put(info.cast::<ComputeInstanceProfileInfoV3>(), out) };
                NVML_SUCCESS
            }
            _ => NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        }
    })
}

/// `nvmlGpuInstanceGetComputeInstanceRemainingCapacity` (profile ID).
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    gpu_instance: NvmlGpuInstance,
    profile_id: c_uint,
    count: *mut c_uint,
) -> NvmlReturn {
    query("nvmlGpuInstanceGetComputeInstanceRemainingCapacity", |st| {
        let (g, gi, mig) = tri!(gi_ctx(st, gpu_instance));
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let inst = &st.gpus[g].gpu_instances[gi];
        let p = tri!(ci_profile_by_id(mig, inst, profile_id));
        // SAFETY: non-null, points to a c_uint.
        unsafe { put(count, mig::ci_remaining(inst, p)) };
        NVML_SUCCESS
    })
}

/// `nvmlGpuInstanceGetComputeInstancePossiblePlacements` (profile ID; NULL array → count).
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    gpu_instance: NvmlGpuInstance,
    profile_id: c_uint,
    placements: *mut Placement,
    count: *mut c_uint,
) -> NvmlReturn {
    query(
        "nvmlGpuInstanceGetComputeInstancePossiblePlacements",
        |st| {
            let (g, gi, mig) = tri!(gi_ctx(st, gpu_instance));
            let p = tri!(ci_profile_by_id(
                mig,
                &st.gpus[g].gpu_instances[gi],
                profile_id
            ));
            // SAFETY: NVML contract on placements/count.
            unsafe { put_placements(&p.placements, placements, count) }
        },
    )
}

fn create_ci(
    st: &mut State,
    fault: Option<NvmlReturn>,
    gpu_instance: NvmlGpuInstance,
    profile_id: c_uint,
    placement: Option<*const Placement>,
    out: *mut NvmlComputeInstance,
) -> (NvmlReturn, Value) {
    let r = resolve_gi(st, gpu_instance);
    // SAFETY: placement is null or points to an nvmlComputeInstancePlacement_t.
    let req: Option<Span> = placement.and_then(|p| unsafe { p.as_ref() }).map(|p| Span {
        start: p.start,
        size: p.size,
    });
    let mut args = match r {
        Ok((g, gi)) => {
            json!({"gpu": g, "gpuInstanceId": st.gpus[g].gpu_instances[gi].id, "profileId": profile_id})
        }
        Err(_) => json!({"gpuInstance": "invalid", "profileId": profile_id}),
    };
    if let Some(r) = req {
        args["placement"] = json!({"start": r.start, "size": r.size});
    }
    if let Some(c) = fault {
        return (c, args);
    }
    let (g, gi, mig) = tri_m!(gi_ctx(st, gpu_instance), args);
    let inst = &st.gpus[g].gpu_instances[gi];
    let prof = tri_m!(ci_profile_by_id(mig, inst, profile_id), args);
    if out.is_null() || (placement.is_some() && req.is_none()) {
        return (NVML_ERROR_INVALID_ARGUMENT, args);
    }
    let span = match req {
        Some(r) => r,
        None => tri_m!(
            mig::auto_ci_placement(inst, prof).ok_or(NVML_ERROR_INSUFFICIENT_RESOURCES),
            args
        ),
    };
    let id = match mig::check_ci(inst, prof, span) {
        Ok(id) => id,
        Err(CreateError::BadPlacement) => return (NVML_ERROR_INVALID_ARGUMENT, args),
        Err(CreateError::NoResources) => return (NVML_ERROR_INSUFFICIENT_RESOURCES, args),
    };
    let serial = st.alloc_serial();
    let uuid = format!(
        "MIG-{}",
        state::derive_uuid(&format!("{}/{}", st.gpus[g].uuid, serial))
    );
    st.gpus[g].gpu_instances[gi]
        .compute_instances
        .push(ComputeInstance {
            id,
            profile_id,
            start: span.start,
            size: span.size,
            serial,
            uuid: uuid.clone(),
        });
    // SAFETY: non-null (checked), points to an nvmlComputeInstance_t.
    unsafe { put(out, handle(KIND_CI, g, serial)) };
    args["placement"] = json!({"start": span.start, "size": span.size});
    args["computeInstanceId"] = json!(id);
    args["uuid"] = json!(uuid);
    (NVML_SUCCESS, args)
}

/// `nvmlGpuInstanceCreateComputeInstance` (profile ID; lowest free placement).
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gpu_instance: NvmlGpuInstance,
    profile_id: c_uint,
    compute_instance: *mut NvmlComputeInstance,
) -> NvmlReturn {
    mutate("nvmlGpuInstanceCreateComputeInstance", |st, fault| {
        create_ci(st, fault, gpu_instance, profile_id, None, compute_instance)
    })
}

/// `nvmlGpuInstanceCreateComputeInstanceWithPlacement`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    gpu_instance: NvmlGpuInstance,
    profile_id: c_uint,
    placement: *const Placement,
    compute_instance: *mut NvmlComputeInstance,
) -> NvmlReturn {
    mutate(
        "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
        |st, fault| {
            create_ci(
                st,
                fault,
                gpu_instance,
                profile_id,
                Some(placement),
                compute_instance,
            )
        },
    )
}

/// `nvmlComputeInstanceDestroy`: IN_USE while processes run in it.
#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(
    compute_instance: NvmlComputeInstance,
) -> NvmlReturn {
    mutate("nvmlComputeInstanceDestroy", |st, fault| {
        let r = resolve_ci(st, compute_instance);
        let args = match r {
            Ok((g, gi, ci)) => {
                let inst = &st.gpus[g].gpu_instances[gi];
                json!({"gpu": g, "gpuInstanceId": inst.id, "computeInstanceId": inst.compute_instances[ci].id})
            }
            Err(_) => json!({"computeInstance": "invalid"}),
        };
        if let Some(c) = fault {
            return (c, args);
        }
        let (g, gi, ci) = tri_m!(r, args);
        let inst = &st.gpus[g].gpu_instances[gi];
        if mig::busy(
            st,
            g as u32,
            Some(inst.id),
            Some(inst.compute_instances[ci].id),
        ) {
            return (NVML_ERROR_IN_USE, args);
        }
        st.gpus[g].gpu_instances[gi].compute_instances.remove(ci);
        (NVML_SUCCESS, args)
    })
}

/// `nvmlGpuInstanceGetComputeInstances`: CIs of one profile; buffer sized by the profile's
/// `instanceCount`, `*count` output only.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpu_instance: NvmlGpuInstance,
    profile_id: c_uint,
    compute_instances: *mut NvmlComputeInstance,
    count: *mut c_uint,
) -> NvmlReturn {
    query("nvmlGpuInstanceGetComputeInstances", |st| {
        let (g, gi, mig) = tri!(gi_ctx(st, gpu_instance));
        let inst = &st.gpus[g].gpu_instances[gi];
        tri!(ci_profile_by_id(mig, inst, profile_id));
        if compute_instances.is_null() || count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let mut list: Vec<&ComputeInstance> = inst
            .compute_instances
            .iter()
            .filter(|c| c.profile_id == profile_id)
            .collect();
        list.sort_by_key(|c| c.id);
        for (i, c) in list.iter().enumerate() {
            // SAFETY: the buffer holds instanceCount >= list.len() handles (NVML contract).
            unsafe { put(compute_instances.add(i), handle(KIND_CI, g, c.serial)) };
        }
        // SAFETY: non-null, points to a c_uint.
        unsafe { put(count, list.len() as c_uint) };
        NVML_SUCCESS
    })
}

/// `nvmlGpuInstanceGetComputeInstanceById`: id > 7 → INVALID_ARGUMENT, absent → NOT_FOUND.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpu_instance: NvmlGpuInstance,
    id: c_uint,
    compute_instance: *mut NvmlComputeInstance,
) -> NvmlReturn {
    query("nvmlGpuInstanceGetComputeInstanceById", |st| {
        let (g, gi, _) = tri!(gi_ctx(st, gpu_instance));
        if compute_instance.is_null() || id > 7 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        match st.gpus[g].gpu_instances[gi]
            .compute_instances
            .iter()
            .find(|c| c.id == id)
        {
            Some(c) => {
                // SAFETY: non-null, points to an nvmlComputeInstance_t.
                unsafe { put(compute_instance, handle(KIND_CI, g, c.serial)) };
                NVML_SUCCESS
            }
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}

/// `nvmlComputeInstanceGetInfo_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute_instance: NvmlComputeInstance,
    info: *mut ComputeInstanceInfo,
) -> NvmlReturn {
    query("nvmlComputeInstanceGetInfo_v2", |st| {
        let (g, gi, ci) = tri!(resolve_ci(st, compute_instance));
        if info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let inst = &st.gpus[g].gpu_instances[gi];
        let c = &inst.compute_instances[ci];
        let v = ComputeInstanceInfo {
            device: handle(KIND_DEVICE, g, 0),
            gpu_instance: handle(KIND_GI, g, inst.serial),
            id: c.id,
            profile_id: c.profile_id,
            placement: Placement {
                start: c.start,
                size: c.size,
            },
        };
        // SAFETY: non-null, points to an nvmlComputeInstanceInfo_t.
        unsafe { put(info, v) };
        NVML_SUCCESS
    })
}

/// Legacy `nvmlComputeInstanceGetInfo` (same struct).
#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo(
    compute_instance: NvmlComputeInstance,
    info: *mut ComputeInstanceInfo,
) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe { nvmlComputeInstanceGetInfo_v2(compute_instance, info) }
}

// ---------------------------------------------------------------------------------------
// MIG device handles.

/// `nvmlDeviceIsMigDeviceHandle`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: NvmlDevice,
    is_mig: *mut c_uint,
) -> NvmlReturn {
    query("nvmlDeviceIsMigDeviceHandle", |st| {
        let d = tri!(resolve_dev(st, device));
        if is_mig.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null, points to a c_uint.
        unsafe { put(is_mig, matches!(d, Dev::Mig { .. }) as c_uint) };
        NVML_SUCCESS
    })
}

fn mig_ids(st: &State, device: NvmlDevice, out: *mut c_uint, ci_id: bool) -> NvmlReturn {
    match tri!(resolve_dev(st, device)) {
        Dev::Phys(_) => NVML_ERROR_NOT_SUPPORTED,
        Dev::Mig { .. } if out.is_null() => NVML_ERROR_INVALID_ARGUMENT,
        Dev::Mig { gpu, gi, ci } => {
            let inst = &st.gpus[gpu].gpu_instances[gi];
            let v = if ci_id {
                inst.compute_instances[ci].id
            } else {
                inst.id
            };
            // SAFETY: non-null, points to a c_uint (NVML contract).
            unsafe { put(out, v) };
            NVML_SUCCESS
        }
    }
}

/// `nvmlDeviceGetGpuInstanceId` of a MIG device (NOT_SUPPORTED on a physical GPU).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: NvmlDevice,
    id: *mut c_uint,
) -> NvmlReturn {
    query("nvmlDeviceGetGpuInstanceId", |st| {
        mig_ids(st, device, id, false)
    })
}

/// `nvmlDeviceGetComputeInstanceId` of a MIG device (NOT_SUPPORTED on a physical GPU).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: NvmlDevice,
    id: *mut c_uint,
) -> NvmlReturn {
    query("nvmlDeviceGetComputeInstanceId", |st| {
        mig_ids(st, device, id, true)
    })
}

/// `nvmlDeviceGetMaxMigDeviceCount`: the model's maximum whatever the mode.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: NvmlDevice,
    count: *mut c_uint,
) -> NvmlReturn {
    query("nvmlDeviceGetMaxMigDeviceCount", |st| {
        let g = tri!(resolve_phys(st, device));
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let Some(mig) = st.gpus[g].model().mig.as_ref() else {
            return NVML_ERROR_NOT_SUPPORTED;
        };
        // SAFETY: non-null, points to a c_uint.
        unsafe { put(count, mig.max_mig_device_count) };
        NVML_SUCCESS
    })
}

/// `nvmlDeviceGetMigDeviceHandleByIndex`: MIG devices ordered by (GI id, CI id);
/// index ≥ max count → INVALID_ARGUMENT, unused index → NOT_FOUND.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: NvmlDevice,
    index: c_uint,
    mig_device: *mut NvmlDevice,
) -> NvmlReturn {
    query("nvmlDeviceGetMigDeviceHandleByIndex", |st| {
        let g = tri!(resolve_phys(st, device));
        let mig = tri!(mig_on(st, g));
        if mig_device.is_null() || index >= mig.max_mig_device_count {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        match mig_devices(st, g).get(index as usize) {
            Some(&(gi, ci)) => {
                let serial = st.gpus[g].gpu_instances[gi].compute_instances[ci].serial;
                // SAFETY: non-null, points to an nvmlDevice_t.
                unsafe { put(mig_device, handle(KIND_MIG_DEVICE, g, serial)) };
                NVML_SUCCESS
            }
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}

/// `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: NvmlDevice,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    query(
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        |st| match tri!(resolve_dev(st, mig_device)) {
            Dev::Phys(_) => NVML_ERROR_INVALID_ARGUMENT,
            Dev::Mig { .. } if device.is_null() => NVML_ERROR_INVALID_ARGUMENT,
            Dev::Mig { gpu, .. } => {
                // SAFETY: non-null, points to an nvmlDevice_t.
                unsafe { put(device, handle(KIND_DEVICE, gpu, 0)) };
                NVML_SUCCESS
            }
        },
    )
}
