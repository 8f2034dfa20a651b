//! Test controls that have no NVML equivalent: GPU reset, reboot, fake processes, faults.
//!
//! Each operation exists twice: as a Rust function taking the state path explicitly (for
//! Rust tests that depend on this crate as an rlib) and as an exported C function
//! (`fakeNvml*`) acting on the library's current state path, for callers that only `dlopen`
//! the library. None of them needs `nvmlInit`, and none counts as a mutating NVML call
//! (faults by function name still apply to `fakeNvmlResetGpu`).

#![allow(clippy::missing_safety_doc)]

use crate::state::{self, FailAt, Process, State, StateError};
use crate::types::*;
use std::ffi::{c_char, c_uint, c_ulonglong, CStr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// `nvmlInit` reference count (process-wide, like the real library).
pub(crate) static INIT_COUNT: Mutex<u32> = Mutex::new(0);
static PATH_OVERRIDE: Mutex<Option<PathBuf>> = Mutex::new(None);
/// Read-only NVML calls (`nvmlInit` included) made by this process. Kept in memory, not in the
/// state file: counting there would turn every query into a write.
static QUERY_CALLS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn count_query() {
    QUERY_CALLS.fetch_add(1, Ordering::Relaxed);
}

/// Read-only NVML calls this process made through this copy of the library (each one locks
/// and reads the state file). Callers that `dlopen` the library use
/// `fakeNvmlQueryCallCount`: an rlib copy linked into a test has its own counter.
pub fn query_calls() -> u64 {
    QUERY_CALLS.load(Ordering::Relaxed)
}

/// The state file in use: the `fakeNvmlSetStatePath` override, else `$FAKE_NVML_STATE`
/// (read at every call).
pub fn state_path() -> Option<PathBuf> {
    let o = PATH_OVERRIDE.lock().unwrap_or_else(|e| e.into_inner());
    o.clone()
        .or_else(|| std::env::var_os(state::ENV_STATE).map(PathBuf::from))
}

fn spec() -> Option<String> {
    std::env::var(state::ENV_SPEC).ok()
}

/// Reads the state (creating it from `$FAKE_NVML_SPEC` if missing).
pub fn read(path: &Path) -> Result<State, StateError> {
    state::with_state(path, spec().as_deref(), |st| (st.clone(), false))
}

/// Applies `f` to the state under the lock and writes it back.
pub fn update<R>(path: &Path, f: impl FnOnce(&mut State) -> R) -> Result<R, StateError> {
    state::with_state(path, spec().as_deref(), |st| (f(st), true))
}

fn logged(st: &mut State, function: &str, args: serde_json::Value, rc: NvmlReturn) -> NvmlReturn {
    st.call_log.push(state::CallRecord {
        seq: st.mutating_calls,
        function: function.into(),
        args,
        result: return_name(rc),
    });
    rc
}

/// Models `nvidia-smi -r -i <gpu>`: fails with `NVML_ERROR_IN_USE` while processes hold the
/// GPU (or, through [`fakeNvmlResetGpu`], another client of the calling process has NVML
/// open), `NVML_ERROR_GPU_IS_LOST` for a GPU that fell off the bus; otherwise applies the
/// pending MIG mode, drops all GPU/compute instances and what a reset clears of its health:
/// a pending row remap or page retirement is carried out, volatile ECC counts start again.
/// Logged in `call_log` with `seq` = current `mutating_calls` (not counted).
pub fn reset_gpu(path: &Path, gpu: u32) -> Result<NvmlReturn, StateError> {
    reset_gpu_from(path, gpu, false)
}

fn reset_gpu_from(path: &Path, gpu: u32, other_clients: bool) -> Result<NvmlReturn, StateError> {
    update(path, |st| {
        let args = serde_json::json!({"gpu": gpu});
        let injected = st
            .faults
            .fail
            .get("fakeNvmlResetGpu")
            .and_then(|c| parse_return(c));
        let lost = st.health.gpus.get(&gpu).is_some_and(|h| h.lost);
        let rc = if let Some(c) = injected {
            c
        } else if gpu as usize >= st.gpus.len() {
            NVML_ERROR_INVALID_ARGUMENT
        } else if other_clients || crate::mig::busy(st, gpu, None, None) {
            NVML_ERROR_IN_USE
        } else if lost {
            NVML_ERROR_GPU_IS_LOST
        } else {
            let g = &mut st.gpus[gpu as usize];
            g.mig.current = g.mig.pending;
            g.gpu_instances.clear();
            if let Some(h) = st.health.gpus.get_mut(&gpu) {
                h.reset();
            }
            NVML_SUCCESS
        };
        logged(st, "fakeNvmlResetGpu", args, rc)
    })
}

/// Models a reboot: all processes end, pending MIG modes apply, all instances are gone.
pub fn reboot(path: &Path) -> Result<(), StateError> {
    update(path, |st| {
        st.processes.clear();
        for g in &mut st.gpus {
            g.mig.current = g.mig.pending;
            g.gpu_instances.clear();
        }
        logged(st, "fakeNvmlReboot", serde_json::json!({}), NVML_SUCCESS);
    })
}

/// Adds a process on GPU `gpu`; `gi`/`ci` name an existing compute instance (MIG) or are
/// `None`. Fails with NOT_FOUND for an absent CI, INVALID_ARGUMENT for a bad GPU index or a
/// GI without CI. An existing entry with the same `pid` is replaced.
pub fn add_process(path: &Path, p: Process) -> Result<NvmlReturn, StateError> {
    update(path, |st| {
        let Some(g) = st.gpus.get(p.gpu as usize) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        match (p.gi, p.ci) {
            (None, None) => {}
            (Some(gi), Some(ci)) => {
                let found = g
                    .gpu_instances
                    .iter()
                    .any(|i| i.id == gi && i.compute_instances.iter().any(|c| c.id == ci));
                if !found {
                    return NVML_ERROR_NOT_FOUND;
                }
            }
            _ => return NVML_ERROR_INVALID_ARGUMENT,
        }
        st.processes.retain(|q| q.pid != p.pid);
        st.processes.push(p);
        NVML_SUCCESS
    })
}

/// Removes process `pid`; NOT_FOUND if absent.
pub fn remove_process(path: &Path, pid: u32) -> Result<NvmlReturn, StateError> {
    update(path, |st| {
        let before = st.processes.len();
        st.processes.retain(|q| q.pid != pid);
        if st.processes.len() == before {
            NVML_ERROR_NOT_FOUND
        } else {
            NVML_SUCCESS
        }
    })
}

/// Makes `function` fail with `code` until cleared (`code == NVML_SUCCESS` clears it).
pub fn set_function_fault(path: &Path, function: &str, code: NvmlReturn) -> Result<(), StateError> {
    update(path, |st| {
        if code == NVML_SUCCESS {
            st.faults.fail.remove(function);
        } else {
            st.faults
                .fail
                .insert(function.to_string(), return_name(code));
        }
    })
}

/// Makes the `n`-th mutating call from now (1 = the next one) fail once with `code`.
/// Returns the absolute call number armed.
pub fn fail_nth_mutating_call(path: &Path, n: u64, code: NvmlReturn) -> Result<u64, StateError> {
    update(path, |st| {
        let call = st.mutating_calls + n.max(1);
        st.faults.fail_at.push(FailAt {
            call,
            code: return_name(code),
        });
        call
    })
}

/// Removes all faults stored in the state (env-var faults stay).
pub fn clear_faults(path: &Path) -> Result<(), StateError> {
    update(path, |st| st.faults = Default::default())
}

fn with_path<T>(
    f: impl FnOnce(&Path) -> Result<T, StateError>,
    ok: impl FnOnce(T) -> NvmlReturn,
) -> NvmlReturn {
    let Some(path) = state_path() else {
        return NVML_ERROR_DRIVER_NOT_LOADED;
    };
    match f(&path) {
        Ok(v) => ok(v),
        Err(e) => {
            eprintln!("fake-nvml: {e}");
            e.code()
        }
    }
}

fn opt_id(v: c_uint) -> Option<u32> {
    (v != NVML_NO_INSTANCE).then_some(v)
}

/// Sets the state path for this process (NULL: back to `$FAKE_NVML_STATE`).
#[no_mangle]
pub unsafe extern "C" fn fakeNvmlSetStatePath(path: *const c_char) -> NvmlReturn {
    let mut o = PATH_OVERRIDE.lock().unwrap_or_else(|e| e.into_inner());
    *o = if path.is_null() {
        None
    } else {
        // SAFETY: non-null NUL-terminated string (caller contract).
        let s = unsafe { CStr::from_ptr(path) };
        Some(PathBuf::from(s.to_string_lossy().into_owned()))
    };
    NVML_SUCCESS
}

/// C form of [`reset_gpu`], called through the library a client has open: `IN_USE` while more
/// than that one `nvmlInit` of this process is open. nvidia-smi(1) refuses a reset while any
/// other client, a monitoring one included, has the GPU open.
#[no_mangle]
pub extern "C" fn fakeNvmlResetGpu(gpu: c_uint) -> NvmlReturn {
    let others = *INIT_COUNT.lock().unwrap_or_else(|e| e.into_inner()) > 1;
    with_path(|p| reset_gpu_from(p, gpu, others), |rc| rc)
}

/// C form of [`reboot`].
#[no_mangle]
pub extern "C" fn fakeNvmlReboot() -> NvmlReturn {
    with_path(reboot, |_| NVML_SUCCESS)
}

/// C form of [`add_process`]; pass `0xFFFFFFFF` for `gi`/`ci` outside MIG.
#[no_mangle]
pub extern "C" fn fakeNvmlAddProcess(
    gpu: c_uint,
    gi: c_uint,
    ci: c_uint,
    pid: c_uint,
    used_mib: c_ulonglong,
) -> NvmlReturn {
    let p = Process {
        pid,
        gpu,
        gi: opt_id(gi),
        ci: opt_id(ci),
        used_memory_mib: used_mib,
    };
    with_path(|path| add_process(path, p), |rc| rc)
}

/// C form of [`remove_process`].
#[no_mangle]
pub extern "C" fn fakeNvmlRemoveProcess(pid: c_uint) -> NvmlReturn {
    with_path(|p| remove_process(p, pid), |rc| rc)
}

/// C form of [`set_function_fault`].
#[no_mangle]
pub unsafe extern "C" fn fakeNvmlSetFault(function: *const c_char, code: NvmlReturn) -> NvmlReturn {
    if function.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null NUL-terminated string (caller contract).
    let f = unsafe { CStr::from_ptr(function) }
        .to_string_lossy()
        .into_owned();
    with_path(|p| set_function_fault(p, &f, code), |_| NVML_SUCCESS)
}

/// C form of [`fail_nth_mutating_call`].
#[no_mangle]
pub extern "C" fn fakeNvmlFailNthMutatingCall(n: c_ulonglong, code: NvmlReturn) -> NvmlReturn {
    with_path(|p| fail_nth_mutating_call(p, n, code), |_| NVML_SUCCESS)
}

/// C form of [`clear_faults`].
#[no_mangle]
pub extern "C" fn fakeNvmlClearFaults() -> NvmlReturn {
    with_path(clear_faults, |_| NVML_SUCCESS)
}

/// Number of mutating NVML calls made so far.
#[no_mangle]
pub unsafe extern "C" fn fakeNvmlMutatingCallCount(count: *mut c_ulonglong) -> NvmlReturn {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_path(read, |st| {
        // SAFETY: non-null, points to an unsigned long long (caller contract).
        unsafe { count.write(st.mutating_calls) };
        NVML_SUCCESS
    })
}

/// Number of read-only NVML calls (queries, `nvmlInit` included) this process made so far.
#[no_mangle]
pub unsafe extern "C" fn fakeNvmlQueryCallCount(count: *mut c_ulonglong) -> NvmlReturn {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null, points to an unsigned long long (caller contract).
    unsafe { count.write(query_calls()) };
    NVML_SUCCESS
}

/// The `nvmlInit` reference count: how many initialisations are not yet shut down.
#[no_mangle]
pub unsafe extern "C" fn fakeNvmlInitCount(count: *mut c_uint) -> NvmlReturn {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let n = *INIT_COUNT.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: non-null, points to an unsigned int (caller contract).
    unsafe { count.write(n) };
    NVML_SUCCESS
}
