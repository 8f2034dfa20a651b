//! Health: the event API (`nvmlEventSetCreate`, `nvmlDeviceRegisterEvents`,
//! `nvmlEventSetWait_v2`, `nvmlEventSetFree`, `nvmlDeviceGetSupportedEventTypes`) and the
//! counters that show a dying device (retired pages pending, remapped rows, total ECC errors,
//! clocks event reasons), driven from [`State::health`](crate::state::State::health).
//!
//! Events live in the shared state as an append-only queue (tests and VM scripts append with
//! `jq` under the lock, or call [`raise_event`]). An event's sequence number is
//! `dropped + index`, so appending needs no counter. An event set belongs to the process that
//! created it (like the real one) and delivers the events raised after a device was registered.
//!
//! Semantics from nvml.h (NVML 12/13): an empty wait returns `NVML_ERROR_TIMEOUT`; registering
//! a type the device does not support returns `NOT_SUPPORTED`; `eventData` is the XID for
//! `nvmlEventTypeXidCriticalError` and 0 otherwise; `gpuInstanceId`/`computeInstanceId` name
//! the MIG instance an XID is attributable to and are `0xFFFFFFFF` otherwise. Page retirement
//! is pre-Ampere and row remapping Ampere and newer, so each GPU answers one of the two and
//! `NOT_SUPPORTED` for the other.

#![allow(clippy::missing_safety_doc)]

use crate::control;
use crate::state::{State, StateError};
use crate::types::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::{c_uint, c_ulonglong, c_void};
use std::path::Path;
use std::time::{Duration, Instant};

/// `nvmlEventTypeSingleBitEccError`.
pub const EVENT_SINGLE_BIT_ECC: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`.
pub const EVENT_DOUBLE_BIT_ECC: u64 = 0x2;
/// `nvmlEventTypePState`.
pub const EVENT_PSTATE: u64 = 0x4;
/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID: u64 = 0x8;
/// `nvmlEventTypeClock`.
pub const EVENT_CLOCK: u64 = 0x10;
/// What every modelled GPU supports unless its health entry says otherwise.
pub const DEFAULT_SUPPORTED_EVENTS: u64 =
    EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_PSTATE | EVENT_XID | EVENT_CLOCK;
/// Every `nvmlClocksEventReason*` bit the header defines (GpuIdle … DisplayClockSetting).
pub const SUPPORTED_CLOCK_REASONS: u64 = 0x1FF;
/// `NVML_ERROR_TIMEOUT`.
pub const NVML_ERROR_TIMEOUT: NvmlReturn = 10;
/// Events kept in the state; older ones are dropped (their numbers stay used).
pub const MAX_EVENTS: usize = 1024;

/// The health model of the state file; every field has a default so old states load.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HealthModel {
    /// Per physical GPU, by NVML index.
    #[serde(default)]
    pub gpus: BTreeMap<u32, GpuHealth>,
    /// Raised events, oldest first. Event number = `dropped + index`.
    #[serde(default)]
    pub events: Vec<Event>,
    /// Events removed from the front of `events`.
    #[serde(default)]
    pub dropped: u64,
}

/// Counters and capabilities of one physical GPU.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct GpuHealth {
    /// Pre-Ampere GPU: answers retired pages and NOT_SUPPORTED for remapped rows (default
    /// false: row remapping, as on every model the fake has built in).
    #[serde(default)]
    pub page_retirement: bool,
    /// `nvmlDeviceGetRetiredPagesPendingStatus` (page-retirement GPUs only).
    #[serde(default)]
    pub retired_pages_pending: bool,
    /// `nvmlDeviceGetRemappedRows`: correctable rows remapped.
    #[serde(default)]
    pub remapped_correctable: u32,
    /// Uncorrectable rows remapped.
    #[serde(default)]
    pub remapped_uncorrectable: u32,
    /// A remap waits for a GPU reset.
    #[serde(default)]
    pub remap_pending: bool,
    /// A remap failed (no spare rows left).
    #[serde(default)]
    pub remap_failed: bool,
    /// `nvmlDeviceGetTotalEccErrors`, uncorrected, volatile (since the last driver load).
    #[serde(default)]
    pub ecc_uncorrected_volatile: u64,
    /// Uncorrected, aggregate (lifetime).
    #[serde(default)]
    pub ecc_uncorrected_aggregate: u64,
    /// Corrected, volatile.
    #[serde(default)]
    pub ecc_corrected_volatile: u64,
    /// Corrected, aggregate.
    #[serde(default)]
    pub ecc_corrected_aggregate: u64,
    /// ECC mode off: the ECC counters answer NOT_SUPPORTED.
    #[serde(default)]
    pub ecc_disabled: bool,
    /// `nvmlDeviceGetCurrentClocksEventReasons` bits.
    #[serde(default)]
    pub clocks_event_reasons: u64,
    /// Overrides [`DEFAULT_SUPPORTED_EVENTS`].
    #[serde(default)]
    pub supported_events: Option<u64>,
    /// Fallen off the bus: health calls and waits on it answer `NVML_ERROR_GPU_IS_LOST`.
    #[serde(default)]
    pub lost: bool,
}

impl GpuHealth {
    /// What a GPU reset does: the pending remap or page retirement is carried out (a remap
    /// counts as uncorrectable, the cause of the pending ones the fake models), volatile ECC
    /// counts start again.
    pub(crate) fn reset(&mut self) {
        if std::mem::take(&mut self.remap_pending) {
            self.remapped_uncorrectable += 1;
        }
        self.retired_pages_pending = false;
        self.ecc_uncorrected_volatile = 0;
        self.ecc_corrected_volatile = 0;
    }

    fn supported_events(&self) -> u64 {
        self.supported_events.unwrap_or(DEFAULT_SUPPORTED_EVENTS)
    }
}

/// One raised event.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Event {
    /// Physical GPU index.
    pub gpu: u32,
    /// One `nvmlEventType*` bit.
    #[serde(rename = "type")]
    pub event_type: u64,
    /// The XID for an XID event (0 otherwise).
    #[serde(default)]
    pub data: u64,
    /// GPU instance the XID is attributable to (MIG on).
    #[serde(default)]
    pub gi: Option<u32>,
    /// Compute instance the XID is attributable to (MIG on).
    #[serde(default)]
    pub ci: Option<u32>,
}

/// `nvmlEventData_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventData {
    /// The physical device.
    pub device: NvmlDevice,
    /// The event type bit.
    pub event_type: c_ulonglong,
    /// XID, or 0.
    pub event_data: c_ulonglong,
    /// GI id or `0xFFFFFFFF`.
    pub gpu_instance_id: c_uint,
    /// CI id or `0xFFFFFFFF`.
    pub compute_instance_id: c_uint,
}

/// An event set (what `nvmlEventSet_t` points at): per registered GPU, its mask and the first
/// event number it may see; `next` is the first undelivered event number.
#[derive(Debug, Default)]
struct EventSet {
    regs: BTreeMap<usize, (u64, u64)>,
    next: u64,
}

const KIND_DEVICE: u64 = 1;
const KIND_MIG_DEVICE: u64 = 4;

fn device_handle(gpu: usize) -> NvmlDevice {
    ((KIND_DEVICE << 56) | ((gpu as u64) << 40)) as usize as NvmlDevice
}

/// A physical GPU, or the parent of a MIG device handle.
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

fn health_of(st: &State, gpu: usize) -> GpuHealth {
    st.health
        .gpus
        .get(&(gpu as u32))
        .cloned()
        .unwrap_or_default()
}

/// A physical GPU that answers health calls: MIG device handles get NOT_SUPPORTED (the
/// counters are the parent's), a lost GPU GPU_IS_LOST.
fn healthy_phys(st: &State, h: NvmlDevice) -> Result<(usize, GpuHealth), NvmlReturn> {
    match resolve(st, h)? {
        Dev::Mig => Err(NVML_ERROR_NOT_SUPPORTED),
        Dev::Phys(g) => {
            let hl = health_of(st, g);
            if hl.lost {
                Err(NVML_ERROR_GPU_IS_LOST)
            } else {
                Ok((g, hl))
            }
        }
    }
}

fn initialized() -> bool {
    *control::INIT_COUNT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        > 0
}

/// A read-only call through the state: counted, fault-checked, no write-back.
fn query(name: &str, f: impl FnOnce(&State) -> NvmlReturn) -> NvmlReturn {
    control::count_query();
    if !initialized() {
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

/// Writes `v` through a checked out-pointer.
fn out<T>(p: *mut T, v: T) -> NvmlReturn {
    if p.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null; the caller passed a pointer to a `T` (NVML contract).
    unsafe { p.write(v) };
    NVML_SUCCESS
}

/// `nvmlDeviceGetSupportedEventTypes`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: NvmlDevice,
    types: *mut c_ulonglong,
) -> NvmlReturn {
    query(
        "nvmlDeviceGetSupportedEventTypes",
        |st| match healthy_phys(st, device) {
            Ok((_, h)) => out(types, h.supported_events()),
            Err(c) => c,
        },
    )
}

/// `nvmlEventSetCreate`: an empty set, owned by this process.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut c_void) -> NvmlReturn {
    control::count_query();
    if !initialized() {
        return NVML_ERROR_UNINITIALIZED;
    }
    out(set, Box::into_raw(Box::<EventSet>::default()).cast())
}

/// `nvmlEventSetFree`.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: *mut c_void) -> NvmlReturn {
    control::count_query();
    if !initialized() {
        return NVML_ERROR_UNINITIALIZED;
    }
    if set.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: made by nvmlEventSetCreate and freed once (NVML contract).
    drop(unsafe { Box::from_raw(set.cast::<EventSet>()) });
    NVML_SUCCESS
}

/// `nvmlDeviceRegisterEvents`: physical GPUs only (a MIG device's XIDs arrive on its parent
/// with GI/CI ids); types the GPU does not support give NOT_SUPPORTED and register nothing.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: NvmlDevice,
    types: c_ulonglong,
    set: *mut c_void,
) -> NvmlReturn {
    query("nvmlDeviceRegisterEvents", |st| {
        let (g, h) = match healthy_phys(st, device) {
            Ok(v) => v,
            Err(c) => return c,
        };
        if set.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if types & !h.supported_events() != 0 {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let now = st.health.dropped + st.health.events.len() as u64;
        // SAFETY: made by nvmlEventSetCreate (NVML contract); one thread uses a set at a time.
        let s = unsafe { &mut *set.cast::<EventSet>() };
        s.regs.entry(g).or_insert((0, now)).0 |= types;
        NVML_SUCCESS
    })
}

/// The next event for `s` at or after `s.next`, as (number, event).
fn next_event(st: &State, s: &EventSet) -> Option<(u64, Event)> {
    let base = st.health.dropped;
    let skip = s.next.saturating_sub(base) as usize;
    st.health
        .events
        .iter()
        .enumerate()
        .skip(skip)
        .map(|(i, e)| (base + i as u64, e))
        .find(|(n, e)| {
            s.regs
                .get(&(e.gpu as usize))
                .is_some_and(|(mask, since)| mask & e.event_type != 0 && n >= since)
        })
        .map(|(n, e)| (n, e.clone()))
}

/// `nvmlEventSetWait_v2`: the next event raised on a registered GPU after it was registered;
/// `NVML_ERROR_TIMEOUT` when none arrives within `timeout_ms`; `GPU_IS_LOST` when none is
/// pending and a registered GPU is lost.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: *mut c_void,
    data: *mut EventData,
    timeout_ms: c_uint,
) -> NvmlReturn {
    if set.is_null() || data.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    // Set up before the first look, so a change between the look and the sleep still wakes it.
    let watch = control::state_path().and_then(|p| StateWatch::new(&p));
    loop {
        // SAFETY: made by nvmlEventSetCreate (NVML contract).
        let s = unsafe { &mut *set.cast::<EventSet>() };
        let mut got = None;
        let rc = query("nvmlEventSetWait_v2", |st| {
            if let Some(found) = next_event(st, s) {
                got = Some(found);
                return NVML_SUCCESS;
            }
            if s.regs.keys().any(|&g| health_of(st, g).lost) {
                return NVML_ERROR_GPU_IS_LOST;
            }
            NVML_ERROR_TIMEOUT
        });
        if let Some((n, e)) = got {
            s.next = n + 1;
            let mig = |id: Option<u32>| match id {
                Some(v) if e.event_type == EVENT_XID => v,
                _ => NVML_NO_INSTANCE,
            };
            return out(
                data,
                EventData {
                    device: device_handle(e.gpu as usize),
                    event_type: e.event_type,
                    event_data: if e.event_type == EVENT_XID { e.data } else { 0 },
                    gpu_instance_id: mig(e.gi),
                    compute_instance_id: mig(e.ci),
                },
            );
        }
        let now = Instant::now();
        if rc != NVML_ERROR_TIMEOUT || now >= deadline {
            return rc;
        }
        match &watch {
            Some(w) => w.wait_change(deadline),
            None => std::thread::sleep((deadline - now).min(Duration::from_millis(20))),
        }
    }
}

/// inotify on the state file's directory: a wait sleeps until the file is replaced or written
/// (as a real wait sleeps in the kernel), so an idle watcher costs no wakeups.
struct StateWatch {
    fd: std::os::fd::OwnedFd,
    name: std::ffi::OsString,
}

impl StateWatch {
    fn new(path: &Path) -> Option<StateWatch> {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = path.file_name()?.to_os_string();
        let cdir = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        // SAFETY: plain syscalls; the descriptor is owned right away.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mask = libc::IN_MOVED_TO | libc::IN_CLOSE_WRITE | libc::IN_CREATE;
        // SAFETY: valid descriptor and NUL-terminated path.
        let wd = unsafe {
            libc::inotify_add_watch(std::os::fd::AsRawFd::as_raw_fd(&fd), cdir.as_ptr(), mask)
        };
        (wd >= 0).then_some(StateWatch { fd, name })
    }

    /// Returns when the state file changed or at `deadline`. Other files of the directory (the
    /// lock file every call opens) are read and ignored.
    fn wait_change(&self, deadline: Instant) {
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, ms) } <= 0 {
                return;
            }
            // SAFETY: reads into a local buffer of its length.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return;
            }
            let mut at = 0usize;
            let head = std::mem::size_of::<libc::inotify_event>();
            while at + head <= n as usize {
                // SAFETY: the kernel wrote whole events; read_unaligned copes with the layout.
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                let name = &buf[at + head..at + head + ev.len as usize];
                let name = name.split(|b| *b == 0).next().unwrap_or_default();
                if name == self.name.as_bytes() {
                    return;
                }
                at += head + ev.len as usize;
            }
        }
    }
}

/// `nvmlDeviceGetRetiredPagesPendingStatus` (page-retirement GPUs; NOT_SUPPORTED on row
/// remapping ones).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: NvmlDevice,
    pending: *mut c_uint,
) -> NvmlReturn {
    query(
        "nvmlDeviceGetRetiredPagesPendingStatus",
        |st| match healthy_phys(st, device) {
            Ok((_, h)) if h.page_retirement => out(pending, h.retired_pages_pending as c_uint),
            Ok(_) => NVML_ERROR_NOT_SUPPORTED,
            Err(c) => c,
        },
    )
}

/// `nvmlDeviceGetRemappedRows` (row-remapping GPUs; NOT_SUPPORTED on page-retirement ones).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: NvmlDevice,
    corr: *mut c_uint,
    unc: *mut c_uint,
    pending: *mut c_uint,
    failed: *mut c_uint,
) -> NvmlReturn {
    query("nvmlDeviceGetRemappedRows", |st| {
        match healthy_phys(st, device) {
            Ok((_, h)) if !h.page_retirement => {
                if [corr, unc, pending, failed].iter().any(|p| p.is_null()) {
                    return NVML_ERROR_INVALID_ARGUMENT;
                }
                out(corr, h.remapped_correctable);
                out(unc, h.remapped_uncorrectable);
                out(pending, h.remap_pending as c_uint);
                out(failed, h.remap_failed as c_uint)
            }
            Ok(_) => NVML_ERROR_NOT_SUPPORTED,
            Err(c) => c,
        }
    })
}

/// `nvmlDeviceGetTotalEccErrors`: `error_type` 0 corrected / 1 uncorrected, `counter` 0
/// volatile / 1 aggregate; NOT_SUPPORTED with ECC off.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: NvmlDevice,
    error_type: c_uint,
    counter: c_uint,
    count: *mut c_ulonglong,
) -> NvmlReturn {
    query("nvmlDeviceGetTotalEccErrors", |st| {
        let h = match healthy_phys(st, device) {
            Ok((_, h)) => h,
            Err(c) => return c,
        };
        if h.ecc_disabled {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let v = match (error_type, counter) {
            (0, 0) => h.ecc_corrected_volatile,
            (0, 1) => h.ecc_corrected_aggregate,
            (1, 0) => h.ecc_uncorrected_volatile,
            (1, 1) => h.ecc_uncorrected_aggregate,
            _ => return NVML_ERROR_INVALID_ARGUMENT,
        };
        out(count, v)
    })
}

unsafe fn clock_reasons(
    name: &str,
    device: NvmlDevice,
    supported: bool,
    v: *mut c_ulonglong,
) -> NvmlReturn {
    query(name, |st| match healthy_phys(st, device) {
        Ok((_, h)) => out(
            v,
            if supported {
                SUPPORTED_CLOCK_REASONS
            } else {
                h.clocks_event_reasons & SUPPORTED_CLOCK_REASONS
            },
        ),
        Err(c) => c,
    })
}

/// `nvmlDeviceGetCurrentClocksEventReasons`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: NvmlDevice,
    v: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: NVML contract on v.
    unsafe { clock_reasons("nvmlDeviceGetCurrentClocksEventReasons", device, false, v) }
}

/// `nvmlDeviceGetCurrentClocksThrottleReasons` (the deprecated name of the same call).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: NvmlDevice,
    v: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: NVML contract on v.
    unsafe {
        clock_reasons(
            "nvmlDeviceGetCurrentClocksThrottleReasons",
            device,
            false,
            v,
        )
    }
}

/// `nvmlDeviceGetSupportedClocksEventReasons`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksEventReasons(
    device: NvmlDevice,
    v: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: NVML contract on v.
    unsafe { clock_reasons("nvmlDeviceGetSupportedClocksEventReasons", device, true, v) }
}

/// `nvmlDeviceGetSupportedClocksThrottleReasons`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksThrottleReasons(
    device: NvmlDevice,
    v: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: NVML contract on v.
    unsafe {
        clock_reasons(
            "nvmlDeviceGetSupportedClocksThrottleReasons",
            device,
            true,
            v,
        )
    }
}

// ---------------------------------------------------------------------------------------
// Test controls.

/// Raises `e`: NOT_FOUND for a GI/CI that does not exist, INVALID_ARGUMENT for a bad GPU or
/// a type that is not one event bit. A double-bit ECC event also counts one uncorrected
/// error, as the driver does.
pub fn raise_event(path: &Path, e: Event) -> Result<NvmlReturn, StateError> {
    control::update(path, |st| {
        let Some(g) = st.gpus.get(e.gpu as usize) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        if e.event_type.count_ones() != 1 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if let Some(gi) = e.gi {
            let Some(inst) = g.gpu_instances.iter().find(|i| i.id == gi) else {
                return NVML_ERROR_NOT_FOUND;
            };
            if let Some(ci) = e.ci {
                if !inst.compute_instances.iter().any(|c| c.id == ci) {
                    return NVML_ERROR_NOT_FOUND;
                }
            }
        } else if e.ci.is_some() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if e.event_type == EVENT_DOUBLE_BIT_ECC {
            let h = st.health.gpus.entry(e.gpu).or_default();
            h.ecc_uncorrected_volatile += 1;
            h.ecc_uncorrected_aggregate += 1;
        }
        st.health.events.push(e);
        let over = st.health.events.len().saturating_sub(MAX_EVENTS);
        st.health.events.drain(..over);
        st.health.dropped += over as u64;
        NVML_SUCCESS
    })
}

/// Edits GPU `gpu`'s health entry (created with defaults).
pub fn set_health(
    path: &Path,
    gpu: u32,
    f: impl FnOnce(&mut GpuHealth),
) -> Result<NvmlReturn, StateError> {
    control::update(path, |st| {
        if gpu as usize >= st.gpus.len() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        f(st.health.gpus.entry(gpu).or_default());
        NVML_SUCCESS
    })
}

fn on_current(f: impl FnOnce(&Path) -> Result<NvmlReturn, StateError>) -> NvmlReturn {
    let Some(path) = control::state_path() else {
        return NVML_ERROR_DRIVER_NOT_LOADED;
    };
    f(&path).unwrap_or_else(|e| e.code())
}

/// C form of [`raise_event`]; `gi`/`ci` are `0xFFFFFFFF` when the event names no instance.
#[no_mangle]
pub extern "C" fn fakeNvmlRaiseEvent(
    gpu: c_uint,
    event_type: c_ulonglong,
    data: c_ulonglong,
    gi: c_uint,
    ci: c_uint,
) -> NvmlReturn {
    let id = |v: c_uint| (v != NVML_NO_INSTANCE).then_some(v);
    on_current(|p| {
        raise_event(
            p,
            Event {
                gpu,
                event_type,
                data,
                gi: id(gi),
                ci: id(ci),
            },
        )
    })
}

/// Marks GPU `gpu` lost (fallen off the bus) or back.
#[no_mangle]
pub extern "C" fn fakeNvmlSetGpuLost(gpu: c_uint, lost: c_uint) -> NvmlReturn {
    on_current(|p| set_health(p, gpu, |h| h.lost = lost != 0))
}
