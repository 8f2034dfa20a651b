//! C ABI types and constants, written independently from `nvml.h`
//! (layouts checked against `data/gpu-profiles.json` → `struct_layouts_x86_64`).

#![allow(missing_docs)]

use std::ffi::{c_char, c_uint, c_ulonglong, c_void};

/// `nvmlReturn_t`.
pub type NvmlReturn = c_uint;
/// Opaque `nvmlDevice_t` (physical GPU or MIG device).
pub type NvmlDevice = *mut c_void;
/// Opaque `nvmlGpuInstance_t`.
pub type NvmlGpuInstance = *mut c_void;
/// Opaque `nvmlComputeInstance_t`.
pub type NvmlComputeInstance = *mut c_void;

pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub const NVML_ERROR_NO_PERMISSION: NvmlReturn = 4;
pub const NVML_ERROR_ALREADY_INITIALIZED: NvmlReturn = 5;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
pub const NVML_ERROR_GPU_IS_LOST: NvmlReturn = 15;
pub const NVML_ERROR_RESET_REQUIRED: NvmlReturn = 16;
pub const NVML_ERROR_IN_USE: NvmlReturn = 19;
pub const NVML_ERROR_INSUFFICIENT_RESOURCES: NvmlReturn = 23;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// Names of every return code in the NVML 12.x/13.x header, for `nvmlErrorString`,
/// the fault knobs and the call log.
pub const RETURN_NAMES: &[(NvmlReturn, &str, &str)] = &[
    (0, "NVML_SUCCESS", "Success"),
    (1, "NVML_ERROR_UNINITIALIZED", "Uninitialized"),
    (2, "NVML_ERROR_INVALID_ARGUMENT", "Invalid Argument"),
    (3, "NVML_ERROR_NOT_SUPPORTED", "Not Supported"),
    (4, "NVML_ERROR_NO_PERMISSION", "Insufficient Permissions"),
    (5, "NVML_ERROR_ALREADY_INITIALIZED", "Already Initialized"),
    (6, "NVML_ERROR_NOT_FOUND", "Not Found"),
    (7, "NVML_ERROR_INSUFFICIENT_SIZE", "Insufficient Size"),
    (
        8,
        "NVML_ERROR_INSUFFICIENT_POWER",
        "Insufficient External Power",
    ),
    (9, "NVML_ERROR_DRIVER_NOT_LOADED", "Driver Not Loaded"),
    (10, "NVML_ERROR_TIMEOUT", "Timeout"),
    (11, "NVML_ERROR_IRQ_ISSUE", "Interrupt Request Issue"),
    (
        12,
        "NVML_ERROR_LIBRARY_NOT_FOUND",
        "NVML Shared Library Not Found",
    ),
    (13, "NVML_ERROR_FUNCTION_NOT_FOUND", "Function Not Found"),
    (14, "NVML_ERROR_CORRUPTED_INFOROM", "Corrupted infoROM"),
    (15, "NVML_ERROR_GPU_IS_LOST", "GPU is lost"),
    (16, "NVML_ERROR_RESET_REQUIRED", "GPU requires restart"),
    (
        17,
        "NVML_ERROR_OPERATING_SYSTEM",
        "The operating system has blocked the request.",
    ),
    (
        18,
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        "RM has detected an NVML/RM version mismatch.",
    ),
    (19, "NVML_ERROR_IN_USE", "In use by another client"),
    (20, "NVML_ERROR_MEMORY", "Insufficient Memory"),
    (21, "NVML_ERROR_NO_DATA", "No data"),
    (
        22,
        "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
        "vGPU ECC not supported",
    ),
    (
        23,
        "NVML_ERROR_INSUFFICIENT_RESOURCES",
        "Insufficient resources",
    ),
    (
        24,
        "NVML_ERROR_FREQ_NOT_SUPPORTED",
        "Frequency not supported",
    ),
    (
        25,
        "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
        "Argument version mismatch",
    ),
    (26, "NVML_ERROR_DEPRECATED", "Deprecated"),
    (27, "NVML_ERROR_NOT_READY", "Not ready"),
    (28, "NVML_ERROR_GPU_NOT_FOUND", "GPU not found"),
    (29, "NVML_ERROR_INVALID_STATE", "Invalid state"),
    (
        30,
        "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED",
        "Reset type not supported",
    ),
    (999, "NVML_ERROR_UNKNOWN", "Unknown Error"),
];

/// Symbolic name of a return code (`"NVML_ERROR_IN_USE"`), or the number for unknown codes.
pub fn return_name(code: NvmlReturn) -> String {
    RETURN_NAMES
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, n, _)| (*n).to_string())
        .unwrap_or_else(|| code.to_string())
}

/// Parses `"NVML_ERROR_UNKNOWN"`, `"ERROR_UNKNOWN"`, `"UNKNOWN"` or `"999"` into a code.
pub fn parse_return(s: &str) -> Option<NvmlReturn> {
    let s = s.trim();
    if let Ok(n) = s.parse::<u32>() {
        return Some(n);
    }
    let up = s.to_ascii_uppercase();
    RETURN_NAMES
        .iter()
        .find(|(_, n, _)| {
            *n == up
                || n.strip_prefix("NVML_") == Some(up.as_str())
                || n.strip_prefix("NVML_ERROR_") == Some(up.as_str())
        })
        .map(|(c, _, _)| *c)
}

pub const NVML_DEVICE_MIG_DISABLE: c_uint = 0;
pub const NVML_DEVICE_MIG_ENABLE: c_uint = 1;
/// `NVML_GPU_INSTANCE_PROFILE_COUNT` in the NVML 13 header (the reference file).
pub const NVML_GPU_INSTANCE_PROFILE_COUNT: c_uint = 18;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` in the NVML 13 header (the reference file).
pub const NVML_COMPUTE_INSTANCE_PROFILE_COUNT: c_uint = 9;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`, the only engine profile.
pub const NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: c_uint = 0;
/// GPU/compute-instance id reported for processes outside MIG.
pub const NVML_NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2)`.
pub const GPU_INSTANCE_PROFILE_INFO_V2: c_uint = 0x0200_0098;
/// `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 3)`.
pub const GPU_INSTANCE_PROFILE_INFO_V3: c_uint = 0x0300_0098;
/// `NVML_STRUCT_VERSION(ComputeInstanceProfileInfo, 2)`.
pub const COMPUTE_INSTANCE_PROFILE_INFO_V2: c_uint = 0x0200_0088;
/// `NVML_STRUCT_VERSION(ComputeInstanceProfileInfo, 3)`.
pub const COMPUTE_INSTANCE_PROFILE_INFO_V3: c_uint = 0x0300_008c;
/// `NVML_STRUCT_VERSION(Memory, 2)`.
pub const MEMORY_V2: c_uint = 0x0200_0028;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [c_char; 32],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub start: c_uint,
    pub size: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GpuInstanceProfileInfo {
    pub id: c_uint,
    pub is_p2p_supported: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub copy_engine_count: c_uint,
    pub decoder_count: c_uint,
    pub encoder_count: c_uint,
    pub jpeg_count: c_uint,
    pub ofa_count: c_uint,
    pub memory_size_mb: c_ulonglong,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GpuInstanceProfileInfoV2 {
    pub version: c_uint,
    pub id: c_uint,
    pub is_p2p_supported: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub copy_engine_count: c_uint,
    pub decoder_count: c_uint,
    pub encoder_count: c_uint,
    pub jpeg_count: c_uint,
    pub ofa_count: c_uint,
    pub memory_size_mb: c_ulonglong,
    pub name: [c_char; 96],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GpuInstanceProfileInfoV3 {
    pub version: c_uint,
    pub id: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub copy_engine_count: c_uint,
    pub decoder_count: c_uint,
    pub encoder_count: c_uint,
    pub jpeg_count: c_uint,
    pub ofa_count: c_uint,
    pub memory_size_mb: c_ulonglong,
    pub name: [c_char; 96],
    pub capabilities: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GpuInstanceInfo {
    pub device: NvmlDevice,
    pub id: c_uint,
    pub profile_id: c_uint,
    pub placement: Placement,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ComputeInstanceProfileInfo {
    pub id: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub shared_copy_engine_count: c_uint,
    pub shared_decoder_count: c_uint,
    pub shared_encoder_count: c_uint,
    pub shared_jpeg_count: c_uint,
    pub shared_ofa_count: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ComputeInstanceProfileInfoV2 {
    pub version: c_uint,
    pub id: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub shared_copy_engine_count: c_uint,
    pub shared_decoder_count: c_uint,
    pub shared_encoder_count: c_uint,
    pub shared_jpeg_count: c_uint,
    pub shared_ofa_count: c_uint,
    pub name: [c_char; 96],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ComputeInstanceProfileInfoV3 {
    pub version: c_uint,
    pub id: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub shared_copy_engine_count: c_uint,
    pub shared_decoder_count: c_uint,
    pub shared_encoder_count: c_uint,
    pub shared_jpeg_count: c_uint,
    pub shared_ofa_count: c_uint,
    pub name: [c_char; 96],
    pub capabilities: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ComputeInstanceInfo {
    pub device: NvmlDevice,
    pub gpu_instance: NvmlGpuInstance,
    pub id: c_uint,
    pub profile_id: c_uint,
    pub placement: Placement,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
}

/// `nvmlProcessInfo_t` (= `nvmlProcessInfo_v2_t`), used by the `_v2`/`_v3` process APIs.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// Copies `s` into a fixed C char array, truncating and always NUL-terminating.
pub fn fill_c_array<const N: usize>(dst: &mut [c_char; N], s: &str) {
    let bytes = s.as_bytes();
    let n = bytes.len().min(N - 1);
    for (d, b) in dst.iter_mut().zip(bytes[..n].iter()) {
        *d = *b as c_char;
    }
    for d in dst.iter_mut().skip(n) {
        *d = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Sizes and offsets from `struct_layouts_x86_64` in the reference file.
    #[test]
    fn layouts_match_reference() {
        assert_eq!(size_of::<Placement>(), 8);
        assert_eq!(size_of::<GpuInstanceProfileInfo>(), 48);
        assert_eq!(offset_of!(GpuInstanceProfileInfo, memory_size_mb), 40);
        assert_eq!(size_of::<GpuInstanceProfileInfoV2>(), 152);
        assert_eq!(offset_of!(GpuInstanceProfileInfoV2, memory_size_mb), 48);
        assert_eq!(offset_of!(GpuInstanceProfileInfoV2, name), 56);
        assert_eq!(size_of::<GpuInstanceProfileInfoV3>(), 152);
        assert_eq!(offset_of!(GpuInstanceProfileInfoV3, memory_size_mb), 40);
        assert_eq!(offset_of!(GpuInstanceProfileInfoV3, name), 48);
        assert_eq!(offset_of!(GpuInstanceProfileInfoV3, capabilities), 144);
        assert_eq!(size_of::<GpuInstanceInfo>(), 24);
        assert_eq!(offset_of!(GpuInstanceInfo, placement), 16);
        assert_eq!(size_of::<ComputeInstanceProfileInfo>(), 36);
        assert_eq!(size_of::<ComputeInstanceProfileInfoV2>(), 136);
        assert_eq!(offset_of!(ComputeInstanceProfileInfoV2, name), 40);
        assert_eq!(size_of::<ComputeInstanceProfileInfoV3>(), 140);
        assert_eq!(offset_of!(ComputeInstanceProfileInfoV3, capabilities), 136);
        assert_eq!(size_of::<ComputeInstanceInfo>(), 32);
        assert_eq!(offset_of!(ComputeInstanceInfo, id), 16);
        assert_eq!(offset_of!(ComputeInstanceInfo, placement), 24);
        assert_eq!(size_of::<ProcessInfo>(), 24);
        assert_eq!(offset_of!(ProcessInfo, gpu_instance_id), 16);
        assert_eq!(size_of::<ProcessInfoV1>(), 16);
        assert_eq!(size_of::<Memory>(), 24);
        assert_eq!(size_of::<MemoryV2>(), 40);
        assert_eq!(offset_of!(MemoryV2, free), 24);
        // Version words encode the struct size in the low bits.
        assert_eq!(GPU_INSTANCE_PROFILE_INFO_V2 & 0xFFFFFF, 152);
        assert_eq!(COMPUTE_INSTANCE_PROFILE_INFO_V2 & 0xFFFFFF, 136);
        assert_eq!(COMPUTE_INSTANCE_PROFILE_INFO_V3 & 0xFFFFFF, 140);
        assert_eq!(MEMORY_V2 & 0xFFFFFF, 40);
        assert_eq!(size_of::<PciInfo>(), 68);
    }

    #[test]
    fn return_code_names_round_trip() {
        assert_eq!(parse_return("NVML_ERROR_IN_USE"), Some(NVML_ERROR_IN_USE));
        assert_eq!(parse_return("unknown"), Some(NVML_ERROR_UNKNOWN));
        assert_eq!(parse_return("23"), Some(NVML_ERROR_INSUFFICIENT_RESOURCES));
        assert_eq!(parse_return("bogus"), None);
        assert_eq!(return_name(NVML_ERROR_NOT_FOUND), "NVML_ERROR_NOT_FOUND");
    }
}
