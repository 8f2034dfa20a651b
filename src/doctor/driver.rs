//! What the driver reports, read only: versions, and per GPU its identity, MIG mode, GI and
//! CI profile tables (with placements), live instances and processes.
//!
//! Nothing here changes the driver: no MIG mode change, no reset, no instance is created. A CI
//! profile table can only be read through a GPU instance, so it is read for the GI profiles that
//! have a live instance and reported as not read for the others.

use crate::nvml::raw;
use crate::profiles::{CiProfile, GiProfile, Placement};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::ffi::CStr;

/// Versions the library reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Versions {
    /// `nvmlSystemGetDriverVersion`.
    pub driver: Option<String>,
    /// `nvmlSystemGetNVMLVersion`.
    pub nvml: Option<String>,
    /// `nvmlSystemGetCudaDriverVersion_v2`, e.g. 12040.
    pub cuda: Option<i32>,
}

/// A live compute instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CiRead {
    /// CI id.
    pub id: u32,
    /// CI profile id.
    pub profile_id: u32,
    /// Placement in the GI's compute slices.
    pub placement: Placement,
    /// `MIG-…` UUID of its MIG device (empty when the driver lists none).
    pub uuid: String,
}

/// A live GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GiRead {
    /// GI id.
    pub id: u32,
    /// GI profile id.
    pub profile_id: u32,
    /// Placement in memory slices.
    pub placement: Placement,
    /// Its compute instances, by id.
    pub compute: Vec<CiRead>,
}

/// A compute process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcRead {
    /// PID.
    pub pid: u32,
    /// GI id (MIG only).
    pub gi: Option<u32>,
    /// CI id (MIG only).
    pub ci: Option<u32>,
    /// Used memory in bytes, when reported.
    pub used_memory: Option<u64>,
}

/// MIG facts of a MIG-capable GPU.
#[derive(Debug, Clone, Serialize)]
pub struct MigRead {
    /// Mode in force.
    pub current: bool,
    /// Mode after the next reset.
    pub pending: bool,
    /// `nvmlDeviceGetMaxMigDeviceCount`.
    pub max_mig_device_count: Option<u32>,
    /// The GI profile table, or why it could not be read.
    pub gi_profiles: Result<Vec<GiProfile>, String>,
    /// CI profile tables by GI profile id, read through a live GI of that profile.
    pub ci_profiles: BTreeMap<u32, Vec<CiProfile>>,
    /// Live GPU instances, by id.
    pub instances: Vec<GiRead>,
}

/// One GPU as the driver reports it.
#[derive(Debug, Clone, Serialize)]
pub struct GpuRead {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// `nvmlDeviceGetName`.
    pub name: String,
    /// `/dev/nvidiaN` minor.
    pub minor: Option<u32>,
    /// PCI bus number.
    pub pci_bus: Option<u32>,
    /// PCI device id word (`0x233010DE`).
    pub pci_device_id: Option<u32>,
    /// Framebuffer in MiB.
    pub memory_mib: Option<u64>,
    /// `None`: not MIG-capable (`nvmlDeviceGetMigMode` answers NOT_SUPPORTED).
    pub mig: Option<MigRead>,
    /// Compute processes, or why they could not be listed.
    pub processes: Result<Vec<ProcRead>, String>,
    /// Reads that failed on this GPU, each naming the call.
    pub errors: Vec<String>,
}

/// Everything read from the driver.
#[derive(Debug, Clone, Serialize)]
pub struct DriverRead {
    /// Versions.
    pub versions: Versions,
    /// GPUs in index order.
    pub gpus: Vec<GpuRead>,
    /// Set when the GPU count itself could not be read.
    pub error: Option<String>,
}

fn cstr(buf: &[std::ffi::c_char]) -> String {
    // SAFETY: the buffer is NUL-terminated by NVML on success (and zeroed before the call).
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .trim_start_matches("MIG ")
        .to_string()
}

/// The GI profile table: every `NVML_GPU_INSTANCE_PROFILE_*` index the driver answers, with the
/// profile's placements. Indices it does not offer answer NOT_SUPPORTED or INVALID_ARGUMENT;
/// when no index answers and some said NOT_SUPPORTED, the table is not readable now (the fake,
/// and possibly the driver, answer so while MIG is off) and that is the error.
fn gi_table(lib: &NvmlLib, d: nvmlDevice_t) -> Result<Vec<GiProfile>, raw::Code> {
    let version = std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
    let mut out = Vec::new();
    let mut not_supported = false;
    for index in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
        // SAFETY: zeroed POD out-struct carrying its version word; d is live.
        let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        info.version = version;
        match unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfoV(d, index, &mut info) } {
            raw::SUCCESS => {}
            raw::NOT_SUPPORTED => {
                not_supported = true;
                continue;
            }
            raw::INVALID_ARGUMENT => continue,
            e => return Err(e),
        }
        let placements = raw::gi_possible_placements(lib, d, info.id)?;
        out.push(GiProfile {
            index,
            id: info.id,
            name: cstr(&info.name),
            slice_count: info.sliceCount,
            instance_count: info.instanceCount,
            multiprocessor_count: info.multiprocessorCount,
            copy_engine_count: info.copyEngineCount,
            decoder_count: info.decoderCount,
            encoder_count: info.encoderCount,
            jpeg_count: info.jpegCount,
            ofa_count: info.ofaCount,
            memory_size_mb: info.memorySizeMB,
            placements,
        });
    }
    if out.is_empty() && not_supported {
        return Err(raw::NOT_SUPPORTED);
    }
    Ok(out)
}

/// The CI profile table of a live GI (shared engines).
fn ci_table(lib: &NvmlLib, gi: nvmlGpuInstance_t) -> Result<Vec<CiProfile>, raw::Code> {
    let version = std::mem::size_of::<nvmlComputeInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
    let mut out = Vec::new();
    for index in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        // SAFETY: zeroed POD out-struct with its version word; live GI handle.
        let mut info: nvmlComputeInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        info.version = version;
        match unsafe {
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfoV(
                gi,
                index,
                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info,
            )
        } {
            raw::SUCCESS => {}
            raw::NOT_SUPPORTED | raw::INVALID_ARGUMENT => continue,
            e => return Err(e),
        }
        out.push(CiProfile {
            index,
            id: info.id,
            name: cstr(&info.name),
            slice_count: info.sliceCount,
            instance_count: info.instanceCount,
            multiprocessor_count: info.multiprocessorCount,
            placements: raw::ci_possible_placements(lib, gi, info.id)?,
        });
    }
    Ok(out)
}

/// Reads everything doctor reports from an open library.
pub fn read(nvml: &Nvml) -> DriverRead {
    let versions = Versions {
        driver: nvml.sys_driver_version().ok(),
        nvml: nvml.sys_nvml_version().ok(),
        cuda: nvml.sys_cuda_driver_version().ok(),
    };
    let (gpus, error) = match nvml.device_count() {
        Ok(n) => ((0..n).map(|i| read_gpu(nvml, i)).collect(), None),
        Err(e) => (vec![], Some(format!("nvmlDeviceGetCount: {e}"))),
    };
    DriverRead {
        versions,
        gpus,
        error,
    }
}

fn read_gpu(nvml: &Nvml, index: u32) -> GpuRead {
    let mut g = GpuRead {
        index,
        uuid: String::new(),
        name: String::new(),
        minor: None,
        pci_bus: None,
        pci_device_id: None,
        memory_mib: None,
        mig: None,
        processes: Ok(vec![]),
        errors: vec![],
    };
    let dev = match nvml.device_by_index(index) {
        Ok(d) => d,
        Err(e) => {
            g.errors.push(format!("nvmlDeviceGetHandleByIndex: {e}"));
            return g;
        }
    };
    let e = &mut g.errors;
    g.uuid = note(e, "nvmlDeviceGetUUID", dev.uuid()).unwrap_or_default();
    g.name = note(e, "nvmlDeviceGetName", dev.name()).unwrap_or_default();
    g.minor = note(e, "nvmlDeviceGetMinorNumber", dev.minor_number());
    let pci = note(e, "nvmlDeviceGetPciInfo", dev.pci_info());
    g.pci_bus = pci.as_ref().map(|p| p.bus);
    g.pci_device_id = pci.map(|p| p.pci_device_id);
    g.memory_mib = note(e, "nvmlDeviceGetMemoryInfo", dev.memory_info()).map(|m| m.total >> 20);
    g.processes = dev
        .running_compute_processes()
        .map(|ps| {
            ps.into_iter()
                .map(|p| ProcRead {
                    pid: p.pid,
                    gi: p.gpu_instance_id,
                    ci: p.compute_instance_id,
                    used_memory: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                })
                .collect()
        })
        .map_err(|e| g_err("nvmlDeviceGetComputeRunningProcesses", e));
    match dev.mig_mode() {
        Ok(m) => {
            // SAFETY: the handle lives as long as `nvml`, which outlives this function.
            let d = unsafe { dev.handle() };
            g.mig = Some(read_mig(nvml.lib(), d, m.current != 0, m.pending != 0));
        }
        Err(NvmlError::NotSupported) => {}
        Err(e) => g.errors.push(g_err("nvmlDeviceGetMigMode", e)),
    }
    g
}

fn g_err(what: &str, e: NvmlError) -> String {
    format!("{what}: {e}")
}

/// `r`'s value, or `None` with the failed call noted in `errors`.
fn note<T>(errors: &mut Vec<String>, call: &str, r: Result<T, NvmlError>) -> Option<T> {
    r.map_err(|e| errors.push(g_err(call, e))).ok()
}

fn read_mig(lib: &NvmlLib, d: nvmlDevice_t, current: bool, pending: bool) -> MigRead {
    let name = |call: &str, c: raw::Code| format!("{call}: {}", raw::error_string(lib, c));
    let mut max = 0u32;
    // SAFETY: out-pointer to a local.
    let max_mig_device_count = raw::rc(unsafe { lib.nvmlDeviceGetMaxMigDeviceCount(d, &mut max) })
        .ok()
        .map(|_| max);
    let mut m = MigRead {
        current,
        pending,
        max_mig_device_count,
        gi_profiles: gi_table(lib, d).map_err(|c| name("nvmlDeviceGetGpuInstanceProfileInfoV", c)),
        ci_profiles: BTreeMap::new(),
        instances: vec![],
    };
    let (Ok(table), true) = (&m.gi_profiles, current) else {
        return m;
    };
    let uuids: BTreeMap<(u32, u32), String> = raw::mig_devices(lib, d)
        .unwrap_or_default()
        .into_iter()
        .map(|(g, c, u)| ((g, c), u))
        .collect();
    for p in table.clone() {
        let info = raw::GiProfileInfo {
            id: p.id,
            instance_count: p.instance_count,
        };
        let Ok(handles) = raw::gpu_instances(lib, d, &info) else {
            continue;
        };
        for h in handles {
            let Ok((id, profile_id, placement)) = raw::gi_info(lib, h) else {
                continue;
            };
            if let std::collections::btree_map::Entry::Vacant(v) = m.ci_profiles.entry(profile_id) {
                if let Ok(t) = ci_table(lib, h) {
                    v.insert(t);
                }
            }
            let mut compute = Vec::new();
            for cp in m.ci_profiles.get(&profile_id).cloned().unwrap_or_default() {
                for ch in
                    raw::compute_instances(lib, h, cp.id, cp.instance_count).unwrap_or_default()
                {
                    if let Ok((cid, cpid, cpl)) = raw::ci_info(lib, ch) {
                        compute.push(CiRead {
                            id: cid,
                            profile_id: cpid,
                            placement: cpl,
                            uuid: uuids.get(&(id, cid)).cloned().unwrap_or_default(),
                        });
                    }
                }
            }
            compute.sort_by_key(|c| c.id);
            m.instances.push(GiRead {
                id,
                profile_id,
                placement,
                compute,
            });
        }
    }
    m.instances.sort_by_key(|g| g.id);
    m
}
