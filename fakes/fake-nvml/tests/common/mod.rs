//! Shared test fixture: locates the built cdylib, gives each test its own state file, and
//! wraps the raw `nvml-wrapper-sys` GI/CI calls (the recipe gpuctl's NVML backend follows).

#![allow(dead_code)]

use fake_nvml::state::State;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::*;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The env vars the fake reads are process-global, so tests in one binary run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Path of `libfake_nvml.so`: `$FAKE_NVML_LIB`, else next to the test executable
/// (`target/<profile>/deps/`) or one level up (`target/<profile>/`). Cargo builds the cdylib
/// as part of the package's lib target, so `cargo test -p fake-nvml` always produces it.
pub fn lib_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FAKE_NVML_LIB") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("exe dir");
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        let p = dir.join("libfake_nvml.so");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "libfake_nvml.so not found near {}; set FAKE_NVML_LIB",
        exe.display()
    );
}

/// One test's private fake host.
pub struct Fake {
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
    pub root: PathBuf,
    _serial: MutexGuard<'static, ()>,
}

impl Fake {
    /// A host built from `spec` on first use (e.g. `"h100-80gb*2,l40s"`).
    pub fn new(spec: &str) -> Fake {
        let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state.json");
        let root = dir.path().join("root");
        // SAFETY (of set_var): serialized by SERIAL; the fake reads env only inside calls.
        std::env::set_var("FAKE_NVML_STATE", &state);
        std::env::set_var("FAKE_NVML_SPEC", spec);
        std::env::set_var("FAKE_NVML_ROOT", &root);
        std::env::remove_var("FAKE_NVML_FAIL");
        std::env::remove_var("FAKE_NVML_FAIL_AT");
        Fake {
            dir,
            state,
            root,
            _serial: guard,
        }
    }

    /// Loads the fake through the real nvml-wrapper.
    pub fn nvml(&self) -> Nvml {
        Nvml::builder()
            .lib_path(lib_path().as_os_str())
            .init()
            .expect("fake NVML init")
    }

    /// Current state file content.
    pub fn read(&self) -> State {
        fake_nvml::control::read(&self.state).expect("state readable")
    }

    /// Edits the state file under the fake's lock.
    pub fn edit(&self, f: impl FnOnce(&mut State)) {
        fake_nvml::control::update(&self.state, f).expect("state writable");
    }

    /// Functions in the call log, in order.
    pub fn log_functions(&self) -> Vec<String> {
        self.read()
            .call_log
            .into_iter()
            .map(|r| r.function)
            .collect()
    }

    pub fn state_path(&self) -> &Path {
        &self.state
    }
}

/// Turns a raw return code into a Result.
pub fn rc(code: nvmlReturn_t) -> Result<(), nvmlReturn_t> {
    if code == nvmlReturn_enum_NVML_SUCCESS {
        Ok(())
    } else {
        Err(code)
    }
}

pub const SUCCESS: u32 = nvmlReturn_enum_NVML_SUCCESS;
pub const INVALID_ARGUMENT: u32 = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub const NOT_SUPPORTED: u32 = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub const NOT_FOUND: u32 = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub const INSUFFICIENT_SIZE: u32 = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
pub const IN_USE: u32 = nvmlReturn_enum_NVML_ERROR_IN_USE;
pub const INSUFFICIENT_RESOURCES: u32 = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
pub const ARGUMENT_VERSION_MISMATCH: u32 = nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
pub const UNKNOWN: u32 = nvmlReturn_enum_NVML_ERROR_UNKNOWN;
pub const UNINITIALIZED: u32 = nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;

/// Raw device handle of GPU `index` (nvml-wrapper's `Device::handle`).
pub fn dev(nvml: &Nvml, index: u32) -> nvmlDevice_t {
    // SAFETY: the handle stays valid while `nvml` lives.
    unsafe { nvml.device_by_index(index).expect("device").handle() }
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: NULL first for the count, then a buffer
/// with `count` set to its capacity.
pub fn gi_placements(
    nvml: &Nvml,
    d: nvmlDevice_t,
    profile_id: u32,
) -> Result<Vec<(u32, u32)>, u32> {
    let lib = nvml.lib();
    let mut count = 0u32;
    // SAFETY: NULL placements asks for the count; count points to a u32.
    rc(unsafe {
        lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            d,
            profile_id,
            std::ptr::null_mut(),
            &mut count,
        )
    })?;
    let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    // SAFETY: buf holds `count` placements.
    rc(unsafe {
        lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            d,
            profile_id,
            buf.as_mut_ptr(),
            &mut count,
        )
    })?;
    buf.truncate(count as usize);
    Ok(buf.into_iter().map(|p| (p.start, p.size)).collect())
}

/// `nvmlDeviceCreateGpuInstance[WithPlacement]`.
pub fn create_gi(
    nvml: &Nvml,
    d: nvmlDevice_t,
    profile_id: u32,
    placement: Option<(u32, u32)>,
) -> Result<nvmlGpuInstance_t, u32> {
    let lib = nvml.lib();
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: out-pointers point to locals.
    let code = unsafe {
        match placement {
            Some((start, size)) => {
                let p = nvmlGpuInstancePlacement_t { start, size };
                lib.nvmlDeviceCreateGpuInstanceWithPlacement(d, profile_id, &p, &mut gi)
            }
            None => lib.nvmlDeviceCreateGpuInstance(d, profile_id, &mut gi),
        }
    };
    rc(code).map(|_| gi)
}

/// `nvmlGpuInstanceGetInfo` → (GI id, profile ID, start, size).
pub fn gi_info(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<(u32, u32, u32, u32), u32> {
    // SAFETY: zeroed POD out-struct.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: info is a valid out-pointer.
    rc(unsafe { nvml.lib().nvmlGpuInstanceGetInfo(gi, &mut info) })?;
    Ok((
        info.id,
        info.profileId,
        info.placement.start,
        info.placement.size,
    ))
}

/// `nvmlDeviceGetGpuInstances` for one profile: buffer sized by the profile's instanceCount.
pub fn gis_of_profile(
    nvml: &Nvml,
    d: nvmlDevice_t,
    profile_id: u32,
    instance_count: u32,
) -> Result<Vec<nvmlGpuInstance_t>, u32> {
    let mut buf = vec![std::ptr::null_mut(); instance_count as usize];
    let mut count = 0u32;
    // SAFETY: buf holds instanceCount handles.
    rc(unsafe {
        nvml.lib()
            .nvmlDeviceGetGpuInstances(d, profile_id, buf.as_mut_ptr(), &mut count)
    })?;
    buf.truncate(count as usize);
    Ok(buf)
}

pub fn gi_remaining(nvml: &Nvml, d: nvmlDevice_t, profile_id: u32) -> Result<u32, u32> {
    let mut n = 0;
    // SAFETY: n is a valid out-pointer.
    rc(unsafe {
        nvml.lib()
            .nvmlDeviceGetGpuInstanceRemainingCapacity(d, profile_id, &mut n)
    })?;
    Ok(n)
}

pub fn destroy_gi(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<(), u32> {
    // SAFETY: plain handle argument.
    rc(unsafe { nvml.lib().nvmlGpuInstanceDestroy(gi) })
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo` (profile INDEX, shared engines).
pub fn ci_profile(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
    index: u32,
) -> Result<nvmlComputeInstanceProfileInfo_t, u32> {
    // SAFETY: zeroed POD out-struct.
    let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: info is a valid out-pointer.
    rc(unsafe {
        nvml.lib().nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi,
            index,
            NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            &mut info,
        )
    })?;
    Ok(info)
}

/// `nvmlGpuInstanceCreateComputeInstance[WithPlacement]` (profile ID).
pub fn create_ci(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
    profile_id: u32,
    placement: Option<(u32, u32)>,
) -> Result<nvmlComputeInstance_t, u32> {
    let lib = nvml.lib();
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: out-pointers point to locals.
    let code = unsafe {
        match placement {
            Some((start, size)) => {
                let p = nvmlComputeInstancePlacement_t { start, size };
                lib.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, profile_id, &p, &mut ci)
            }
            None => lib.nvmlGpuInstanceCreateComputeInstance(gi, profile_id, &mut ci),
        }
    };
    rc(code).map(|_| ci)
}

/// `nvmlComputeInstanceGetInfo_v2` → (CI id, profile ID, start, size).
pub fn ci_info(nvml: &Nvml, ci: nvmlComputeInstance_t) -> Result<(u32, u32, u32, u32), u32> {
    // SAFETY: zeroed POD out-struct.
    let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: info is a valid out-pointer.
    rc(unsafe { nvml.lib().nvmlComputeInstanceGetInfo_v2(ci, &mut info) })?;
    Ok((
        info.id,
        info.profileId,
        info.placement.start,
        info.placement.size,
    ))
}

pub fn destroy_ci(nvml: &Nvml, ci: nvmlComputeInstance_t) -> Result<(), u32> {
    // SAFETY: plain handle argument.
    rc(unsafe { nvml.lib().nvmlComputeInstanceDestroy(ci) })
}
