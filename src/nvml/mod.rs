//! The NVML backend: observes GPUs and MIG state and carries out MIG changes through
//! `nvml-wrapper` (device-level calls) and raw `nvml-wrapper-sys` calls (GPU and compute
//! instances, in the private `raw` module).
//!
//! The library is found, in order: `$GPUCTL_NVML_LIBRARY`, the policy's `[host] nvml-library`,
//! then the loader's default (`libnvidia-ml.so.1`, what nvml-wrapper loads). The environment
//! wins because it is what an operator (or a test) sets for one invocation, e.g. to point
//! `gpuctl apply --local` at a driver outside the loader path while the policy on disk is
//! being repaired.
//!
//! A GPU reset runs `$GPUCTL_GPU_RESET_CMD` (default `nvidia-smi -r -i {index}`), a template
//! with `{index}` and `{uuid}`; only the one GPU is ever reset. The value `fake:` calls the fake
//! library's `fakeNvmlResetGpu(index)` export instead (tests).

use crate::apply::{EffectError, GpuEffector};
use crate::observe::{ComputeInstance, GpuInstance, GpuProcess, GpuState, MigState};
use crate::profiles::{Catalog, GpuModel, Placement};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, NvmlLib};
use std::collections::btree_map::{BTreeMap, Entry};
use std::path::{Path, PathBuf};

pub mod health;
pub(crate) mod raw;

/// Environment variable naming the NVML library; wins over the policy's `nvml-library`.
pub const ENV_LIBRARY: &str = "GPUCTL_NVML_LIBRARY";
/// Environment variable holding the GPU reset command template.
pub const ENV_RESET_CMD: &str = "GPUCTL_GPU_RESET_CMD";
/// Default reset command: resets exactly one GPU.
pub const DEFAULT_RESET_CMD: &str = "nvidia-smi -r -i {index}";

/// The library to load: `$GPUCTL_NVML_LIBRARY`, else the policy's setting, else `None` (the
/// loader's default `libnvidia-ml.so.1`).
pub fn library_path(policy_setting: Option<&Path>) -> Option<PathBuf> {
    std::env::var_os(ENV_LIBRARY)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| policy_setting.map(Path::to_path_buf))
}

/// How a GPU gets reset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetCommand {
    /// Run this argv template (`{index}` and `{uuid}` substituted).
    Exec(Vec<String>),
    /// Call `fakeNvmlResetGpu(index)` in the loaded library (tests against the fake).
    Fake,
}

impl ResetCommand {
    /// From `$GPUCTL_GPU_RESET_CMD`, else [`DEFAULT_RESET_CMD`].
    pub fn from_env() -> Self {
        let v = std::env::var(ENV_RESET_CMD).unwrap_or_default();
        Self::parse(if v.trim().is_empty() {
            DEFAULT_RESET_CMD
        } else {
            &v
        })
    }

    /// Parse a template; `fake:` selects [`ResetCommand::Fake`].
    pub fn parse(s: &str) -> Self {
        if s.trim() == "fake:" {
            ResetCommand::Fake
        } else {
            ResetCommand::Exec(s.split_whitespace().map(str::to_string).collect())
        }
    }
}

/// Run the reset command `argv` for GPU `index` (`uuid`), `{index}` and `{uuid}` substituted.
pub fn run_reset(argv: &[String], index: u32, uuid: &str) -> Result<(), EffectError> {
    let what = format!("reset GPU {index} ({uuid})");
    let args: Vec<String> = argv
        .iter()
        .map(|a| {
            a.replace("{index}", &index.to_string())
                .replace("{uuid}", uuid)
        })
        .collect();
    let fail = |message: String| EffectError::Other {
        what: what.clone(),
        message,
    };
    let Some((prog, rest)) = args.split_first() else {
        return Err(fail(format!("{ENV_RESET_CMD} is empty")));
    };
    let out = std::process::Command::new(prog)
        .args(rest)
        .output()
        .map_err(|e| fail(format!("{}: {e}", args.join(" "))))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(fail(format!(
            "{} exited with {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Driver facts about one GPU that do not change while the driver is loaded: read at most
/// once per full observation (an apply), then reused by targeted observations and creates.
#[derive(Debug, Clone, Default)]
struct Statics {
    /// GI profiles the GPU supports (only read while MIG is on: the driver answers
    /// NOT_SUPPORTED otherwise).
    gi_profiles: Option<Vec<raw::GiProfileInfo>>,
    /// CI profiles (id, instance count) of a GI, by GI profile id: they depend on the profile,
    /// not on the instance.
    ci_profiles: BTreeMap<u32, Vec<(u32, u32)>>,
    /// Placements the driver offers for a GI profile, by profile id.
    placements: BTreeMap<u32, Vec<Placement>>,
}

/// An open NVML library.
pub struct NvmlBackend {
    nvml: Nvml,
    /// What was loaded (for the fake reset and for messages).
    lib_path: Option<PathBuf>,
    reset: ResetCommand,
    /// [`Statics`] by GPU UUID; emptied at every full observation.
    statics: BTreeMap<String, Statics>,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("lib_path", &self.lib_path)
            .field("reset", &self.reset)
            .finish()
    }
}

fn nvml_err(what: impl Into<String>, e: NvmlError) -> EffectError {
    let (what, message) = (what.into(), e.to_string());
    // The driver's own "try again": a timeout, an unknown error, a GPU the driver is still
    // bringing up. Anything else repeats the same answer.
    match e {
        NvmlError::Timeout
        | NvmlError::Unknown
        | NvmlError::Uninitialized
        | NvmlError::DriverNotLoaded => EffectError::Transient { what, message },
        _ => EffectError::Other { what, message },
    }
}

/// NVML could not be loaded or initialised: the library as shown to people, and why. Its
/// message is the one line to show: `NVML not available: <library>: <why>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NVML not available: {library}: {why}")]
pub struct NvmlUnavailable {
    /// The library path, or `libnvidia-ml.so.1 (default)`.
    pub library: String,
    /// NVML's (or the loader's) words.
    pub why: String,
}

impl NvmlBackend {
    /// Load and initialise NVML.
    pub fn open(lib_path: Option<PathBuf>, reset: ResetCommand) -> Result<Self, NvmlUnavailable> {
        let mut b = Nvml::builder();
        if let Some(p) = &lib_path {
            b.lib_path(p.as_os_str());
        }
        let shown = lib_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "libnvidia-ml.so.1 (default)".into());
        let nvml = b.init().map_err(|e| NvmlUnavailable {
            library: shown,
            why: e.to_string(),
        })?;
        Ok(NvmlBackend {
            nvml,
            lib_path,
            reset,
            statics: BTreeMap::new(),
        })
    }

    /// The wrapper, for callers that need more than gpuctl observes.
    pub fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    fn device(&self, uuid: &str) -> Result<nvml_wrapper::Device<'_>, EffectError> {
        self.nvml
            .device_by_uuid(uuid)
            .map_err(|e| nvml_err(format!("GPU {uuid}"), e))
    }

    /// The library and the raw handle of GPU `uuid`, for the `raw` calls.
    fn raw_device(&self, uuid: &str) -> Result<(&NvmlLib, nvmlDevice_t), EffectError> {
        let dev = self.device(uuid)?;
        // SAFETY: the handle stays valid while self.nvml lives.
        Ok((self.nvml.lib(), unsafe { dev.handle() }))
    }

    fn raw_err(&self, what: String, code: raw::Code) -> EffectError {
        raw_err(self.nvml.lib(), what, code)
    }

    /// Observe every GPU: identity, MIG mode, instances with MIG UUIDs, and compute processes
    /// (without cgroups: the caller resolves PIDs under its root). Driver facts that never
    /// change (profile tables) are read again here, once, and reused until the next call.
    pub fn observe_gpus(&mut self) -> Result<Vec<GpuState>, EffectError> {
        self.statics.clear();
        let count = self
            .nvml
            .device_count()
            .map_err(|e| nvml_err("device count", e))?;
        (0..count).map(|i| self.observe_index(i)).collect()
    }

    fn observe_index(&mut self, index: u32) -> Result<GpuState, EffectError> {
        let dev = self
            .nvml
            .device_by_index(index)
            .map_err(|e| nvml_err(format!("GPU {index}"), e))?;
        let uuid = dev
            .uuid()
            .map_err(|e| nvml_err(format!("GPU {index} uuid"), e))?;
        let what = |w: &str| format!("GPU {index} ({uuid}) {w}");
        let name = dev.name().map_err(|e| nvml_err(what("name"), e))?;
        let minor = dev.minor_number().map_err(|e| nvml_err(what("minor"), e))?;
        let memory_mib = dev
            .memory_info()
            .map_err(|e| nvml_err(what("memory"), e))?
            .total
            >> 20;
        let model = Catalog::get().by_nvml_name(&name);
        let mut gpu = GpuState {
            index,
            uuid: uuid.clone(),
            name,
            model: model.map(|m| m.key.clone()),
            minor,
            memory_mib,
            mig: None,
            processes: vec![],
        };
        self.observe_dynamic(&mut gpu)?;
        Ok(gpu)
    }

    /// Observe GPU `prev.uuid` again: MIG mode, instances, MIG UUIDs and processes (without
    /// cgroups). Its identity (index, name, minor, memory, model) is taken from `prev` and the
    /// profile tables from the last full observation, so a GPU the executor just changed costs
    /// only the queries of what can have changed.
    pub fn observe_gpu(&mut self, prev: &GpuState) -> Result<GpuState, EffectError> {
        let mut gpu = GpuState {
            mig: None,
            processes: vec![],
            ..prev.clone()
        };
        self.observe_dynamic(&mut gpu)?;
        Ok(gpu)
    }

    /// MIG state and processes of `gpu` (whose identity fields are filled).
    fn observe_dynamic(&mut self, gpu: &mut GpuState) -> Result<(), EffectError> {
        let (index, uuid) = (gpu.index, gpu.uuid.clone());
        let what = |w: &str| format!("GPU {index} ({uuid}) {w}");
        let model = Catalog::get().by_nvml_name(&gpu.name);
        let dev = self
            .nvml
            .device_by_uuid(uuid.as_str())
            .map_err(|e| nvml_err(what("handle"), e))?;
        // SAFETY: the handle lives as long as self.nvml, which outlives this call.
        let d = unsafe { dev.handle() };
        gpu.mig = match dev.mig_mode() {
            Ok(m) => {
                let st = self.statics.entry(uuid.clone()).or_default();
                Some(observe_mig(
                    &self.nvml,
                    st,
                    d,
                    &uuid,
                    index,
                    model,
                    m.current != 0,
                    m.pending != 0,
                )?)
            }
            Err(NvmlError::NotSupported) => None,
            Err(e) => return Err(nvml_err(what("MIG mode"), e)),
        };
        let procs = dev
            .running_compute_processes()
            .map_err(|e| nvml_err(what("processes"), e))?;
        place_processes(gpu, procs);
        Ok(())
    }

    /// Read the compute processes of `gpu` again (one GPU, one query) and place them on its
    /// instances as observed: what a busy check needs right before a destroy. Without cgroups.
    pub fn refresh_processes(&self, gpu: &mut GpuState) -> Result<(), EffectError> {
        let what = |w: &str| format!("GPU {} ({}) {w}", gpu.index, gpu.uuid);
        let procs = self
            .device(&gpu.uuid)?
            .running_compute_processes()
            .map_err(|e| nvml_err(what("processes"), e))?;
        place_processes(gpu, procs);
        Ok(())
    }

    /// Profile id and placement of GI `gi` on `gpu` (owner labels key on these, not on ids).
    pub fn gi_identity(&self, gpu: &str, gi: u32) -> Result<(u32, Placement), EffectError> {
        let (lib, d) = self.raw_device(gpu)?;
        let what = format!("GPU {gpu} gi{gi}");
        let h = raw::gi_by_id(lib, d, gi).map_err(|c| self.raw_err(what.clone(), c))?;
        let (_, profile, placement) = raw::gi_info(lib, h).map_err(|c| self.raw_err(what, c))?;
        Ok((profile, placement))
    }

    /// The reset command, and GPU `uuid`'s index for it, when it is one to run
    /// ([`ResetCommand::Exec`]); `None` for the fake's reset, which is a call into the library.
    pub fn reset_to_run(&self, uuid: &str) -> Result<Option<(Vec<String>, u32)>, EffectError> {
        match &self.reset {
            ResetCommand::Fake => Ok(None),
            ResetCommand::Exec(argv) => Ok(Some((argv.clone(), self.index_of(uuid)?))),
        }
    }

    fn index_of(&self, uuid: &str) -> Result<u32, EffectError> {
        self.device(uuid)?
            .index()
            .map_err(|e| nvml_err(format!("GPU {uuid} index"), e))
    }

    fn fake_reset(&self, index: u32, uuid: &str) -> Result<(), EffectError> {
        let what = format!("reset GPU {index} ({uuid})");
        let path = self
            .lib_path
            .clone()
            .unwrap_or_else(|| PathBuf::from("libnvidia-ml.so.1"));
        let fail = |message: String| EffectError::Other {
            what: what.clone(),
            message,
        };
        // SAFETY: dlopen of the library already loaded by nvml-wrapper returns the same handle;
        // fakeNvmlResetGpu has the C signature `nvmlReturn_t (unsigned int)`.
        let code = unsafe {
            let lib = libloading::Library::new(&path).map_err(|e| fail(e.to_string()))?;
            let f: libloading::Symbol<unsafe extern "C" fn(u32) -> u32> = lib
                .get(b"fakeNvmlResetGpu\0")
                .map_err(|e| fail(format!("{}: no fakeNvmlResetGpu: {e}", path.display())))?;
            f(index)
        };
        match code {
            raw::SUCCESS => Ok(()),
            c => Err(self.raw_err(what, c)),
        }
    }
}

/// Replace the processes of `gpu` (whole-GPU and per CI) by `procs`, each placed on its CI by
/// GI/CI id.
fn place_processes(
    gpu: &mut GpuState,
    procs: Vec<nvml_wrapper::struct_wrappers::device::ProcessInfo>,
) {
    gpu.processes.clear();
    for c in gpu
        .mig
        .iter_mut()
        .flat_map(|m| m.instances.iter_mut())
        .flat_map(|g| g.compute.iter_mut())
    {
        c.processes.clear();
    }
    for p in procs {
        let gp = GpuProcess {
            pid: p.pid,
            used_memory: match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => b,
                UsedGpuMemory::Unavailable => 0,
            },
            unit: None,
            cgroup: None,
        };
        let slot = match (p.gpu_instance_id, p.compute_instance_id, &mut gpu.mig) {
            (Some(gi), Some(ci), Some(m)) => m
                .instances
                .iter_mut()
                .find(|g| g.id == gi)
                .and_then(|g| g.compute.iter_mut().find(|c| c.id == ci))
                .map(|c| &mut c.processes),
            _ => None,
        };
        // A process whose instance is unknown is still a process on the GPU: counting it
        // there keeps it visible as a holder rather than losing it.
        slot.unwrap_or(&mut gpu.processes).push(gp);
    }
}

fn raw_err(lib: &NvmlLib, what: String, code: raw::Code) -> EffectError {
    match code {
        raw::IN_USE => EffectError::InUse { what },
        raw::INSUFFICIENT_RESOURCES => EffectError::InsufficientResources { what },
        c if raw::is_transient(c) => EffectError::Transient {
            what,
            message: raw::error_string(lib, c),
        },
        c => EffectError::Other {
            what,
            message: raw::error_string(lib, c),
        },
    }
}

/// GPU and compute instances of one GPU, with MIG UUIDs. Profile tables come from `st` when
/// it has them, and are read into it otherwise.
#[allow(clippy::too_many_arguments)]
fn observe_mig(
    nvml: &Nvml,
    st: &mut Statics,
    d: nvmlDevice_t,
    uuid: &str,
    index: u32,
    model: Option<&GpuModel>,
    current: bool,
    pending: bool,
) -> Result<MigState, EffectError> {
    let mut mig = MigState {
        current,
        pending,
        instances: vec![],
    };
    if !current {
        return Ok(mig);
    }
    let lib = nvml.lib();
    let err = |w: String, c| raw_err(lib, format!("GPU {index} ({uuid}) {w}"), c);
    let uuids: BTreeMap<(u32, u32), String> = raw::mig_devices(lib, d)
        .map_err(|c| err("MIG devices".into(), c))?
        .into_iter()
        .map(|(g, c, u)| ((g, c), u))
        .collect();
    let gi_profiles = match st.gi_profiles.clone() {
        Some(p) => p,
        None => st
            .gi_profiles
            .insert(raw::gi_profiles(lib, d).map_err(|c| err("GI profiles".into(), c))?)
            .clone(),
    };
    for p in gi_profiles {
        for h in raw::gpu_instances(lib, d, &p)
            .map_err(|c| err(format!("GIs of profile {}", p.id), c))?
        {
            let (id, profile_id, placement) =
                raw::gi_info(lib, h).map_err(|c| err("GI info".into(), c))?;
            let gi_name = model
                .and_then(|m| m.gi_profile_by_id(profile_id))
                .map(|g| g.name.clone())
                .unwrap_or_else(|| format!("profile-{profile_id}"));
            let ci_profiles = match st.ci_profiles.entry(profile_id) {
                Entry::Occupied(e) => e.get().clone(),
                Entry::Vacant(e) => e
                    .insert(
                        raw::ci_profiles(lib, h)
                            .map_err(|c| err(format!("gi{id} CI profiles"), c))?,
                    )
                    .clone(),
            };
            let mut compute = Vec::new();
            for (cp, n) in ci_profiles {
                for ch in raw::compute_instances(lib, h, cp, n)
                    .map_err(|c| err(format!("gi{id} CIs"), c))?
                {
                    let (cid, cpid, cpl) =
                        raw::ci_info(lib, ch).map_err(|c| err(format!("gi{id} CI"), c))?;
                    let profile = model
                        .and_then(|m| m.ci_profiles(&gi_name).iter().find(|x| x.id == cpid))
                        .map(|x| x.name.clone())
                        .unwrap_or_else(|| format!("ci-profile-{cpid}"));
                    compute.push(ComputeInstance {
                        id: cid,
                        profile_id: cpid,
                        profile,
                        placement: cpl,
                        uuid: uuids.get(&(id, cid)).cloned().unwrap_or_default(),
                        processes: vec![],
                    });
                }
            }
            compute.sort_by_key(|c| c.id);
            mig.instances.push(GpuInstance {
                id,
                profile_id,
                profile: gi_name,
                placement,
                owner: None,
                compute,
            });
        }
    }
    mig.instances.sort_by_key(|g| g.id);
    Ok(mig)
}

impl GpuEffector for NvmlBackend {
    fn set_mig_mode(&mut self, gpu: &str, enable: bool) -> Result<bool, EffectError> {
        let dev = self.device(gpu)?;
        // The activation status says why a change stays pending (IN_USE: processes or another
        // client hold the GPU); the mode read back afterwards is what counts.
        dev.set_mig_mode(enable).map_err(|e| match e {
            NvmlError::InUse => EffectError::InUse {
                what: format!("GPU {gpu} MIG mode"),
            },
            e => nvml_err(format!("GPU {gpu} set MIG mode {enable}"), e),
        })?;
        let m = dev
            .mig_mode()
            .map_err(|e| nvml_err(format!("GPU {gpu} MIG mode"), e))?;
        Ok(m.current != m.pending)
    }

    fn reset_gpu(&mut self, gpu: &str) -> Result<(), EffectError> {
        let index = self.index_of(gpu)?;
        match &self.reset {
            ResetCommand::Fake => self.fake_reset(index, gpu),
            ResetCommand::Exec(argv) => run_reset(argv, index, gpu),
        }
    }

    fn create_gi(
        &mut self,
        gpu: &str,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, EffectError> {
        let dev = self.device(gpu)?;
        // SAFETY: handle valid while self.nvml lives.
        let d = unsafe { dev.handle() };
        let lib = self.nvml.lib();
        let what = format!(
            "GPU {gpu} create GI profile {profile_id} @{}+{}",
            placement.start, placement.size
        );
        // Checked first so that a placement the driver does not offer costs no mutating call.
        // The offer is a property of the GPU and profile, not of what exists.
        let statics = self.statics.entry(gpu.to_string()).or_default();
        let legal = match statics.placements.entry(profile_id) {
            Entry::Occupied(e) => e.get().clone(),
            Entry::Vacant(e) => e
                .insert(
                    raw::gi_possible_placements(lib, d, profile_id)
                        .map_err(|c| raw_err(lib, what.clone(), c))?,
                )
                .clone(),
        };
        if !legal.contains(&placement) {
            return Err(EffectError::Other {
                what,
                message: format!("placement not offered by the driver (offers {legal:?})"),
            });
        }
        let h = raw::create_gi(lib, d, profile_id, placement)
            .map_err(|c| self.raw_err(what.clone(), c))?;
        raw::gi_info(lib, h)
            .map(|(id, _, _)| id)
            .map_err(|c| self.raw_err(what, c))
    }

    fn destroy_gi(&mut self, gpu: &str, gi: u32) -> Result<(), EffectError> {
        let (lib, d) = self.raw_device(gpu)?;
        let what = format!("GPU {gpu} destroy gi{gi}");
        let h = raw::gi_by_id(lib, d, gi).map_err(|c| self.raw_err(what.clone(), c))?;
        raw::destroy_gi(lib, h).map_err(|c| self.raw_err(what, c))
    }

    fn create_ci(
        &mut self,
        gpu: &str,
        gi: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, EffectError> {
        let (lib, d) = self.raw_device(gpu)?;
        let what = format!(
            "GPU {gpu} gi{gi} create CI profile {profile_id} @{}+{}",
            placement.start, placement.size
        );
        let g = raw::gi_by_id(lib, d, gi).map_err(|c| self.raw_err(what.clone(), c))?;
        let h = raw::create_ci(lib, g, profile_id, placement)
            .map_err(|c| self.raw_err(what.clone(), c))?;
        raw::ci_info(lib, h)
            .map(|(id, _, _)| id)
            .map_err(|c| self.raw_err(what, c))
    }

    fn destroy_ci(&mut self, gpu: &str, gi: u32, ci: u32) -> Result<(), EffectError> {
        let (lib, d) = self.raw_device(gpu)?;
        let what = format!("GPU {gpu} gi{gi} destroy ci{ci}");
        let g = raw::gi_by_id(lib, d, gi).map_err(|c| self.raw_err(what.clone(), c))?;
        let h = raw::ci_by_id(lib, g, ci).map_err(|c| self.raw_err(what.clone(), c))?;
        raw::destroy_ci(lib, h).map_err(|c| self.raw_err(what, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_command_templates() {
        assert_eq!(ResetCommand::parse("fake:"), ResetCommand::Fake);
        assert_eq!(
            ResetCommand::parse(DEFAULT_RESET_CMD),
            ResetCommand::Exec(vec![
                "nvidia-smi".into(),
                "-r".into(),
                "-i".into(),
                "{index}".into()
            ])
        );
    }

    #[test]
    fn missing_library_says_why_once() {
        let e = NvmlBackend::open(
            Some("/nonexistent/libnvidia-ml.so.1".into()),
            ResetCommand::Fake,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("NVML not available: /nonexistent/libnvidia-ml.so.1"),
            "{e}"
        );
        assert_eq!(e.matches("NVML not available").count(), 1);
    }
}
