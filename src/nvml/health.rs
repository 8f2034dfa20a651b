//! What gpuctld's health watcher reads from NVML: one event set with every GPU registered for
//! critical XIDs and double-bit ECC errors (raw calls: nvml-wrapper's `EventData` drops the
//! GI/CI ids that attribute an XID to a MIG device), and at each observation the counters of
//! every GPU. Both become [`crate::health::Observation`]s; the decisions are `health`'s.
//!
//! The watcher holds this handle open (events need a live set), unlike the reconcile side,
//! which lets go of NVML after each run: see docs/health.md for what that means for resets.

use super::NvmlUnavailable;
use crate::health::{Counters, Observation};
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::*;
use std::path::PathBuf;

/// `nvmlEventTypeXidCriticalError`.
const EVENT_XID: u64 = nvmlEventTypeXidCriticalError as u64;
/// `nvmlEventTypeDoubleBitEccError`.
const EVENT_DBE: u64 = nvmlEventTypeDoubleBitEccError as u64;
/// `nvmlEnableState_t`/`unsigned int` "true".
const ENABLED: u32 = 1;

/// One GPU the watcher knows.
#[derive(Debug, Clone)]
struct Watched {
    uuid: String,
    handle: nvmlDevice_t,
}

/// The event set and the GPUs registered on it. Not `Send`: created and used by the watcher's
/// own thread.
pub struct HealthWatch {
    nvml: Nvml,
    set: nvmlEventSet_t,
    gpus: Vec<Watched>,
    /// GPUs (UUIDs) whose driver offers no XID events: watched through the counters only.
    pub without_events: Vec<String>,
}

/// What one wait gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waited {
    /// An event, as an observation.
    Event(Observation),
    /// Nothing within the timeout (`NVML_ERROR_TIMEOUT`).
    Timeout,
    /// A registered GPU is lost (`NVML_ERROR_GPU_IS_LOST`); the counters say which.
    Lost,
    /// Another error, in NVML's words.
    Failed(String),
}

impl HealthWatch {
    /// Load NVML, create the set and register every GPU for what it supports of XID and
    /// double-bit ECC events.
    pub fn open(lib_path: Option<PathBuf>) -> Result<Self, NvmlUnavailable> {
        let mut b = Nvml::builder();
        if let Some(p) = &lib_path {
            b.lib_path(p.as_os_str());
        }
        let shown = lib_path.as_ref().map_or_else(
            || "libnvidia-ml.so.1 (default)".into(),
            |p| p.display().to_string(),
        );
        let unavailable = |why: String| NvmlUnavailable {
            library: shown.clone(),
            why,
        };
        let nvml = b.init().map_err(|e| unavailable(e.to_string()))?;
        let lib = nvml.lib();
        let mut set: nvmlEventSet_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the library is initialised.
        let code = unsafe { lib.nvmlEventSetCreate(&mut set) };
        if code != super::raw::SUCCESS {
            return Err(unavailable(super::raw::error_string(lib, code)));
        }
        let mut w = HealthWatch {
            gpus: Vec::new(),
            without_events: Vec::new(),
            set,
            nvml,
        };
        let count = w
            .nvml
            .device_count()
            .map_err(|e| unavailable(e.to_string()))?;
        for i in 0..count {
            let Ok(d) = w.nvml.device_by_index(i) else {
                continue;
            };
            let Ok(uuid) = d.uuid() else { continue };
            // SAFETY: the handle lives as long as `w.nvml`, which `w` owns.
            let handle = unsafe { d.handle() };
            let lib = w.nvml.lib();
            let mut supported = 0u64;
            // SAFETY: live handle, out-pointer to a local.
            let code = unsafe { lib.nvmlDeviceGetSupportedEventTypes(handle, &mut supported) };
            let mask = if code == super::raw::SUCCESS {
                supported & (EVENT_XID | EVENT_DBE)
            } else {
                0
            };
            // SAFETY: live handle and set.
            let registered = mask != 0
                && unsafe { lib.nvmlDeviceRegisterEvents(handle, mask, w.set) }
                    == super::raw::SUCCESS;
            if !registered {
                w.without_events.push(uuid.clone());
            }
            w.gpus.push(Watched { uuid, handle });
        }
        Ok(w)
    }

    /// The watched GPUs' UUIDs, by index.
    pub fn uuids(&self) -> Vec<String> {
        self.gpus.iter().map(|g| g.uuid.clone()).collect()
    }

    fn uuid_of(&self, handle: nvmlDevice_t) -> Option<String> {
        self.gpus
            .iter()
            .find(|g| g.handle == handle)
            .map(|g| g.uuid.clone())
            .or_else(|| {
                // SAFETY: a handle NVML just returned, valid while `self.nvml` is.
                unsafe { nvml_wrapper::Device::new(handle, &self.nvml) }
                    .uuid()
                    .ok()
            })
    }

    /// Wait up to `timeout_ms` for the next event.
    pub fn wait(&self, timeout_ms: u32) -> Waited {
        let lib = self.nvml.lib();
        // SAFETY: plain-old-data out-struct, zeroed, then filled by NVML.
        let mut d: nvmlEventData_t = unsafe { std::mem::zeroed() };
        // SAFETY: the set is live (freed only in Drop) and `d` is a local.
        let code = unsafe { lib.nvmlEventSetWait_v2(self.set, &mut d, timeout_ms) };
        match code {
            c if c == super::raw::SUCCESS => {
                let Some(gpu) = self.uuid_of(d.device) else {
                    return Waited::Failed("an event on a device NVML does not name".into());
                };
                let id = |v: u32| (v != u32::MAX).then_some(v);
                if d.eventType == EVENT_XID {
                    Waited::Event(Observation::Xid {
                        gpu,
                        code: u32::try_from(d.eventData).unwrap_or(u32::MAX),
                        gi: id(d.gpuInstanceId),
                        ci: id(d.computeInstanceId),
                    })
                } else {
                    Waited::Event(Observation::DoubleBitEcc { gpu })
                }
            }
            c if c == nvmlReturn_enum_NVML_ERROR_TIMEOUT => Waited::Timeout,
            c if c == nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => Waited::Lost,
            c => Waited::Failed(super::raw::error_string(lib, c)),
        }
    }

    /// The counters of every watched GPU: one observation each (`Lost` for a GPU that
    /// answers `GPU_IS_LOST`).
    pub fn counters(&self) -> Vec<Observation> {
        self.gpus.iter().map(|g| self.read(g)).collect()
    }

    fn read(&self, g: &Watched) -> Observation {
        let lib = self.nvml.lib();
        let h = g.handle;
        let mut lost = false;
        let mut ok = |code: nvmlReturn_t| {
            lost |= code == nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
            code == super::raw::SUCCESS
        };
        let mut c = Counters::default();
        // SAFETY (every call below): a live handle and out-pointers to locals.
        let mut pending = 0u32;
        if ok(unsafe { lib.nvmlDeviceGetRetiredPagesPendingStatus(h, &mut pending) }) {
            c.retired_pages_pending = Some(pending == ENABLED);
        }
        let (mut corr, mut unc, mut pend, mut fail) = (0u32, 0u32, 0u32, 0u32);
        if ok(unsafe {
            lib.nvmlDeviceGetRemappedRows(h, &mut corr, &mut unc, &mut pend, &mut fail)
        }) {
            c.remap_pending = Some(pend != 0);
            c.remap_failed = Some(fail != 0);
        }
        let mut n = 0u64;
        if ok(unsafe {
            lib.nvmlDeviceGetTotalEccErrors(
                h,
                nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvmlEccCounterType_enum_NVML_VOLATILE_ECC,
                &mut n,
            )
        }) {
            c.ecc_uncorrected = Some(n);
        }
        let mut reasons = 0u64;
        if ok(unsafe { lib.nvmlDeviceGetCurrentClocksEventReasons(h, &mut reasons) }) {
            c.clocks_event_reasons = Some(reasons);
        }
        if lost {
            Observation::Lost {
                gpu: g.uuid.clone(),
            }
        } else {
            Observation::Counters {
                gpu: g.uuid.clone(),
                counters: c,
            }
        }
    }
}

impl Drop for HealthWatch {
    fn drop(&mut self) {
        // SAFETY: created in `open`, freed once, before `self.nvml` shuts down.
        unsafe { self.nvml.lib().nvmlEventSetFree(self.set) };
    }
}
