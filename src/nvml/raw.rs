//! Raw `nvml-wrapper-sys` calls (crate-private: they take raw driver handles that must be live) for GPU and compute instances, which `nvml-wrapper` 0.13 either
//! lacks or gets wrong (its `possible_placements` returns an empty Vec).
//!
//! Every function takes the library and a raw handle that the caller keeps valid by holding the
//! `Nvml` (handles die with `nvmlShutdown`). Errors are the raw return codes; [`super`] turns
//! them into messages naming the GPU and instance.

use crate::profiles::Placement;
use nvml_wrapper_sys::bindings::*;
use std::ffi::CStr;

/// A raw NVML return code other than success.
pub(crate) type Code = nvmlReturn_t;

/// Success.
pub(crate) const SUCCESS: Code = nvmlReturn_enum_NVML_SUCCESS;
/// No such instance / index.
pub(crate) const NOT_FOUND: Code = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
/// Busy: processes or child instances.
pub(crate) const IN_USE: Code = nvmlReturn_enum_NVML_ERROR_IN_USE;
/// No room for the instance.
pub(crate) const INSUFFICIENT_RESOURCES: Code = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
/// The feature (MIG) is off or absent.
pub(crate) const NOT_SUPPORTED: Code = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
/// Argument out of range (an unknown profile index, for instance).
pub(crate) const INVALID_ARGUMENT: Code = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;

/// Codes that a repeated call may not give again (the driver's timeout, its unknown error, a
/// library not yet initialised), as [`super::nvml_err`] sorts `nvml-wrapper`'s errors.
pub(crate) fn is_transient(code: Code) -> bool {
    code == nvmlReturn_enum_NVML_ERROR_TIMEOUT
        || code == nvmlReturn_enum_NVML_ERROR_UNKNOWN
        || code == nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        || code == nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED
}

/// `SUCCESS` as `Ok`, any other code as the error.
pub(crate) fn rc(code: Code) -> Result<(), Code> {
    if code == SUCCESS {
        Ok(())
    } else {
        Err(code)
    }
}

/// `nvmlErrorString`, with the numeric code for searching.
pub(crate) fn error_string(lib: &NvmlLib, code: Code) -> String {
    // SAFETY: nvmlErrorString returns a static NUL-terminated string (or NULL).
    let s = unsafe {
        let p = lib.nvmlErrorString(code);
        if p.is_null() {
            String::from("unknown error")
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    format!("{s} (NVML code {code})")
}

/// A GI profile as the driver describes it: published id and instance count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GiProfileInfo {
    /// Published profile id.
    pub id: u32,
    /// Maximum instances of this profile.
    pub instance_count: u32,
}

/// GI profiles the device supports. Indices the device lacks answer NOT_SUPPORTED or
/// INVALID_ARGUMENT and are skipped.
pub(crate) fn gi_profiles(lib: &NvmlLib, d: nvmlDevice_t) -> Result<Vec<GiProfileInfo>, Code> {
    let mut out = Vec::new();
    for index in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
        // SAFETY: zeroed POD out-struct; d is a live handle.
        let mut info: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        let code = unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfo(d, index, &mut info) };
        match code {
            SUCCESS => out.push(GiProfileInfo {
                id: info.id,
                instance_count: info.instanceCount,
            }),
            NOT_SUPPORTED | INVALID_ARGUMENT => {}
            e => return Err(e),
        }
    }
    Ok(out)
}

/// NVML's placement queries: NULL first for the count, then a buffer whose capacity is passed
/// in `count` (the header calls it output-only; passing the capacity works either way).
/// `call(buffer, count)` makes the call; `empty` fills the buffer.
fn placements<P: Clone>(
    empty: P,
    mut call: impl FnMut(*mut P, &mut u32) -> Code,
    placement: impl Fn(&P) -> Placement,
) -> Result<Vec<Placement>, Code> {
    let mut count = 0u32;
    rc(call(std::ptr::null_mut(), &mut count))?;
    let mut buf = vec![empty; count as usize];
    rc(call(buf.as_mut_ptr(), &mut count))?;
    buf.truncate(count as usize);
    Ok(buf.iter().map(placement).collect())
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2` for one GI profile.
pub(crate) fn gi_possible_placements(
    lib: &NvmlLib,
    d: nvmlDevice_t,
    profile_id: u32,
) -> Result<Vec<Placement>, Code> {
    placements(
        nvmlGpuInstancePlacement_t { start: 0, size: 0 },
        // SAFETY: `buf` is NULL (asks for the count) or holds `count` placements; d is live.
        |buf, count| unsafe {
            lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, profile_id, buf, count)
        },
        |p| Placement::new(p.start, p.size),
    )
}

/// `nvmlGpuInstanceGetComputeInstancePossiblePlacements` for one CI profile of a live GI.
pub(crate) fn ci_possible_placements(
    lib: &NvmlLib,
    gi: nvmlGpuInstance_t,
    profile_id: u32,
) -> Result<Vec<Placement>, Code> {
    placements(
        nvmlComputeInstancePlacement_t { start: 0, size: 0 },
        // SAFETY: `buf` is NULL (asks for the count) or holds `count` placements; gi is live.
        |buf, count| unsafe {
            lib.nvmlGpuInstanceGetComputeInstancePossiblePlacements(gi, profile_id, buf, count)
        },
        |p| Placement::new(p.start, p.size),
    )
}

/// GPU instances of one profile; the buffer holds the profile's `instance_count`.
pub(crate) fn gpu_instances(
    lib: &NvmlLib,
    d: nvmlDevice_t,
    p: &GiProfileInfo,
) -> Result<Vec<nvmlGpuInstance_t>, Code> {
    let mut buf = vec![std::ptr::null_mut(); p.instance_count.max(1) as usize];
    let mut count = 0u32;
    // SAFETY: buf holds instance_count handles.
    rc(unsafe { lib.nvmlDeviceGetGpuInstances(d, p.id, buf.as_mut_ptr(), &mut count) })?;
    buf.truncate(count as usize);
    Ok(buf)
}

/// `nvmlGpuInstanceGetInfo` → (GI id, profile id, placement).
pub(crate) fn gi_info(lib: &NvmlLib, gi: nvmlGpuInstance_t) -> Result<(u32, u32, Placement), Code> {
    // SAFETY: zeroed POD out-struct, live handle.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    rc(unsafe { lib.nvmlGpuInstanceGetInfo(gi, &mut info) })?;
    Ok((
        info.id,
        info.profileId,
        Placement::new(info.placement.start, info.placement.size),
    ))
}

/// `nvmlDeviceGetGpuInstanceById`.
pub(crate) fn gi_by_id(lib: &NvmlLib, d: nvmlDevice_t, id: u32) -> Result<nvmlGpuInstance_t, Code> {
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    rc(unsafe { lib.nvmlDeviceGetGpuInstanceById(d, id, &mut gi) })?;
    Ok(gi)
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement` → the new GI's handle.
pub(crate) fn create_gi(
    lib: &NvmlLib,
    d: nvmlDevice_t,
    profile_id: u32,
    p: Placement,
) -> Result<nvmlGpuInstance_t, Code> {
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    let pl = nvmlGpuInstancePlacement_t {
        start: p.start,
        size: p.size,
    };
    // SAFETY: pointers to locals.
    rc(unsafe { lib.nvmlDeviceCreateGpuInstanceWithPlacement(d, profile_id, &pl, &mut gi) })?;
    Ok(gi)
}

/// `nvmlGpuInstanceDestroy`.
pub(crate) fn destroy_gi(lib: &NvmlLib, gi: nvmlGpuInstance_t) -> Result<(), Code> {
    // SAFETY: live handle.
    rc(unsafe { lib.nvmlGpuInstanceDestroy(gi) })
}

/// CI profiles of a GI: (profile id, instance count), shared engines.
pub(crate) fn ci_profiles(lib: &NvmlLib, gi: nvmlGpuInstance_t) -> Result<Vec<(u32, u32)>, Code> {
    let mut out = Vec::new();
    for index in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        // SAFETY: zeroed POD out-struct, live handle.
        let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        let code = unsafe {
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                index,
                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info,
            )
        };
        match code {
            SUCCESS => out.push((info.id, info.instanceCount)),
            NOT_SUPPORTED | INVALID_ARGUMENT => {}
            e => return Err(e),
        }
    }
    Ok(out)
}

/// Compute instances of one CI profile in a GI.
pub(crate) fn compute_instances(
    lib: &NvmlLib,
    gi: nvmlGpuInstance_t,
    profile_id: u32,
    instance_count: u32,
) -> Result<Vec<nvmlComputeInstance_t>, Code> {
    let mut buf = vec![std::ptr::null_mut(); instance_count.max(1) as usize];
    let mut count = 0u32;
    // SAFETY: buf holds instance_count handles.
    rc(unsafe {
        lib.nvmlGpuInstanceGetComputeInstances(gi, profile_id, buf.as_mut_ptr(), &mut count)
    })?;
    buf.truncate(count as usize);
    Ok(buf)
}

/// `nvmlComputeInstanceGetInfo_v2` → (CI id, profile id, placement).
pub(crate) fn ci_info(
    lib: &NvmlLib,
    ci: nvmlComputeInstance_t,
) -> Result<(u32, u32, Placement), Code> {
    // SAFETY: zeroed POD out-struct, live handle.
    let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
    rc(unsafe { lib.nvmlComputeInstanceGetInfo_v2(ci, &mut info) })?;
    Ok((
        info.id,
        info.profileId,
        Placement::new(info.placement.start, info.placement.size),
    ))
}

/// `nvmlGpuInstanceGetComputeInstanceById`.
pub(crate) fn ci_by_id(
    lib: &NvmlLib,
    gi: nvmlGpuInstance_t,
    id: u32,
) -> Result<nvmlComputeInstance_t, Code> {
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    rc(unsafe { lib.nvmlGpuInstanceGetComputeInstanceById(gi, id, &mut ci) })?;
    Ok(ci)
}

/// `nvmlGpuInstanceCreateComputeInstanceWithPlacement` → the new CI's handle.
pub(crate) fn create_ci(
    lib: &NvmlLib,
    gi: nvmlGpuInstance_t,
    profile_id: u32,
    p: Placement,
) -> Result<nvmlComputeInstance_t, Code> {
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    let pl = nvmlComputeInstancePlacement_t {
        start: p.start,
        size: p.size,
    };
    // SAFETY: pointers to locals.
    rc(unsafe {
        lib.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, profile_id, &pl, &mut ci)
    })?;
    Ok(ci)
}

/// `nvmlComputeInstanceDestroy`.
pub(crate) fn destroy_ci(lib: &NvmlLib, ci: nvmlComputeInstance_t) -> Result<(), Code> {
    // SAFETY: live handle.
    rc(unsafe { lib.nvmlComputeInstanceDestroy(ci) })
}

/// MIG devices of a GPU as (GI id, CI id, `MIG-…` UUID). Indices run `0..max` and may have
/// holes on real drivers (assumed), so NOT_FOUND is skipped rather than ending the loop.
pub(crate) fn mig_devices(lib: &NvmlLib, d: nvmlDevice_t) -> Result<Vec<(u32, u32, String)>, Code> {
    let mut max = 0u32;
    // SAFETY: out-pointer to a local.
    rc(unsafe { lib.nvmlDeviceGetMaxMigDeviceCount(d, &mut max) })?;
    let mut out = Vec::new();
    for i in 0..max {
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        match unsafe { lib.nvmlDeviceGetMigDeviceHandleByIndex(d, i, &mut h) } {
            SUCCESS => {}
            NOT_FOUND => continue,
            e => return Err(e),
        }
        let (mut gi, mut ci) = (0u32, 0u32);
        // SAFETY: h is a live MIG handle; out-pointers to locals.
        rc(unsafe { lib.nvmlDeviceGetGpuInstanceId(h, &mut gi) })?;
        rc(unsafe { lib.nvmlDeviceGetComputeInstanceId(h, &mut ci) })?;
        let mut buf = [0 as std::ffi::c_char; 96];
        // SAFETY: buf holds 96 bytes, more than NVML_DEVICE_UUID_V2_BUFFER_SIZE (96).
        rc(unsafe { lib.nvmlDeviceGetUUID(h, buf.as_mut_ptr(), buf.len() as u32) })?;
        // SAFETY: NVML NUL-terminates within the buffer on success.
        let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        out.push((gi, ci, uuid));
    }
    Ok(out)
}
