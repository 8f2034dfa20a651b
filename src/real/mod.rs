//! The real host: NVML for the GPUs, files under the [`Root`] for everything gpuctl keeps
//! itself (owner labels, team env files, capability nodes), `/proc` for PIDs' cgroups, and
//! systemd (team slices, MPS daemons, draining units) through a [`SystemdSide`] when one is
//! attached ([`RealHost::with_systemd`]).
//!
//! Without systemd (no system bus: a rescue shell, a container) the slice, MPS and unit
//! methods fail with [`no_systemd`], and [`RealHost::phases`] tells the caller which phases to
//! leave out, so `gpuctl apply --local` can say what it skipped.

//! Submodules hold one concern each: [`owners`] (owner labels), [`procfs`] (`/proc` reading),
//! [`devnodes`] (capability nodes), [`envfiles`] (team env files). This file is only the wiring
//! of the effector traits to them, NVML and systemd. Every file written goes through
//! [`crate::files`].

use crate::apply::{
    EffectError, FileEffector, GpuEffector, MpsEffector, Observer, OwnerLabels, SliceEffector,
    SlurmEffector, UnitEffector,
};
use crate::nvml::{NvmlBackend, NvmlUnavailable, ResetCommand};
use crate::observe::{GpuState, MpsSpec, Observed, SliceSpec};
use crate::paths::{Root, MIG_MINORS};
use crate::plan::Phase;
use crate::policy::TeamName;
use crate::profiles::Placement;
use crate::systemd::SystemdSide;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

pub mod cdifiles;
pub mod devnodes;
pub mod envfiles;
pub mod owners;
pub mod procfs;
pub mod slurm;
pub mod tty;

pub use devnodes::CAPS_DIR;
pub use envfiles::TEAMS_DIR;
pub use owners::{OwnerLabel, OwnersFile, OWNERS_FILE};
pub use procfs::pid_cgroup;

/// The error of a systemd-backed effector on a host without a reachable systemd.
pub fn no_systemd(what: &str) -> EffectError {
    EffectError::Other {
        what: what.to_string(),
        message: "needs systemd, and no system bus is reachable".into(),
    }
}

/// The files of `rd` whose name `team_of` maps to a team name, read whole, by team.
fn read_team_files(
    rd: std::fs::ReadDir,
    team_of: impl Fn(&str) -> Option<&str>,
) -> Result<std::collections::BTreeMap<TeamName, String>, crate::files::FileError> {
    let mut out = std::collections::BTreeMap::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(team) = name
            .to_str()
            .and_then(&team_of)
            .and_then(|t| t.parse().ok())
        else {
            continue;
        };
        let p = e.path();
        let text = std::fs::read_to_string(&p).map_err(|e| crate::files::FileError::new(&p, e))?;
        out.insert(team, text);
    }
    Ok(out)
}

/// The process's other NVML clients (gpuctld's health watcher and usage collector): a GPU
/// reset is refused while any of them has the library open, so they let go of it while the
/// guard [`OtherClients::quiet`] returns lives.
pub trait OtherClients: Send {
    /// Have them let go; they may open NVML again once the guard is dropped.
    fn quiet(&self) -> Box<dyn std::any::Any>;
}

impl std::fmt::Debug for dyn OtherClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OtherClients")
    }
}

/// The real host.
#[derive(Debug)]
pub struct RealHost {
    root: Root,
    lib: Option<PathBuf>,
    /// `None`: closed, opened again at the next use ([`RealHost::release_nvml`]).
    nvml: Option<Result<NvmlBackend, NvmlUnavailable>>,
    systemd: Option<Box<dyn SystemdSide>>,
    /// `[slurm]` and its `scontrol`; `None` or not enabled: Slurm is neither read nor touched.
    slurm: Option<slurm::SlurmSide>,
    /// What every observation says is out of service ([`RealHost::set_out_of_service`]).
    out_of_service: BTreeSet<String>,
    /// Quieted around a GPU reset ([`RealHost::with_other_clients`]).
    others: Option<Box<dyn OtherClients>>,
}

impl RealHost {
    /// Open NVML (`lib` as resolved by [`crate::nvml::library_path`]) and use `root` for files.
    /// A missing driver is not an error here: it is recorded and reported by
    /// [`Observer::observe`] in [`Observed::nvml_unavailable`].
    pub fn open(root: Root, lib: Option<PathBuf>) -> Self {
        RealHost {
            nvml: Some(NvmlBackend::open(lib.clone(), ResetCommand::from_env())),
            root,
            lib,
            systemd: None,
            slurm: None,
            out_of_service: BTreeSet::new(),
            others: None,
        }
    }

    /// Quiet `others` around every GPU reset.
    pub fn with_other_clients(mut self, others: Box<dyn OtherClients>) -> Self {
        self.others = Some(others);
        self
    }

    /// The devices out of service now (gpuctld calls this before each observation, from its
    /// health registry): every observation carries them, so a plan after an apply sees the
    /// same.
    pub fn set_out_of_service(&mut self, devices: BTreeSet<String>) {
        self.out_of_service = devices;
    }

    /// Follow the policy's `[slurm]` (gpuctld calls this before each observation). The
    /// `scontrol` runner is kept; the first call installs the real one.
    pub fn set_slurm(&mut self, settings: &crate::policy::SlurmSettings) {
        match &mut self.slurm {
            Some(s) => s.settings = settings.clone(),
            None => {
                self.slurm = Some(slurm::SlurmSide {
                    settings: settings.clone(),
                    scontrol: Box::new(slurm::ScontrolCommand),
                })
            }
        }
    }

    /// Run `scontrol` through `sc` (tests).
    pub fn with_scontrol(mut self, sc: Box<dyn slurm::Scontrol>) -> Self {
        self.slurm = Some(slurm::SlurmSide {
            settings: Default::default(),
            scontrol: sc,
        });
        self
    }

    fn slurm_side(&mut self, what: &str) -> Result<&mut slurm::SlurmSide, EffectError> {
        self.slurm
            .as_mut()
            .filter(|s| s.settings.enabled)
            .ok_or_else(|| EffectError::Other {
                what: what.to_string(),
                message: "[slurm] is not enabled".into(),
            })
    }

    /// Drive slices, MPS daemons and team units through `sd`, and observe the live slices and
    /// daemons from it.
    pub fn with_systemd(mut self, sd: Box<dyn SystemdSide>) -> Self {
        self.systemd = Some(sd);
        self
    }

    /// Use the NVML library `lib` from now on (the policy's `nvml-library` may change while the
    /// daemon runs); reopens, at the next use, only when it differs or when the last open
    /// failed.
    pub fn set_nvml_library(&mut self, lib: Option<PathBuf>) {
        if lib != self.lib || matches!(self.nvml, Some(Err(_))) {
            self.nvml = None;
            self.lib = lib;
        }
    }

    /// Shut NVML down and unload it until the next use. gpuctld calls this when a reconcile
    /// ends: an idle daemon then holds no driver handle, which a GPU reset by an admin
    /// (`nvidia-smi -r` refuses while a monitoring client has the GPU open) would otherwise
    /// meet, and none of the library's mapping (issue 14: 0.8 MB of idle RSS with the fake,
    /// more with a driver's `libnvidia-ml.so`).
    pub fn release_nvml(&mut self) {
        self.nvml = None;
    }

    /// The open NVML library, or why it cannot be opened; opened now if it was released.
    fn nvml(&mut self) -> &mut Result<NvmlBackend, NvmlUnavailable> {
        let lib = &self.lib;
        self.nvml
            .get_or_insert_with(|| NvmlBackend::open(lib.clone(), ResetCommand::from_env()))
    }

    /// The root files are resolved under.
    pub fn root(&self) -> &Root {
        &self.root
    }

    /// Whether this host can carry out actions of `phase`: drain, slices, MPS and resume go
    /// through systemd.
    pub fn supports(&self, phase: Phase) -> bool {
        self.systemd.is_some()
            || matches!(phase, Phase::MigMode | Phase::MigInstances | Phase::Devices)
    }

    /// The phases this host can carry out, for [`crate::apply::execute_with`]; `None`: all.
    pub fn phases(&self) -> Option<BTreeSet<Phase>> {
        self.systemd.is_none().then(|| {
            [Phase::MigMode, Phase::MigInstances, Phase::Devices]
                .into_iter()
                .collect()
        })
    }

    fn systemd(&mut self, what: &str) -> Result<&mut Box<dyn SystemdSide>, EffectError> {
        self.systemd.as_mut().ok_or_else(|| no_systemd(what))
    }

    fn backend(&mut self, what: &str) -> Result<&mut NvmlBackend, EffectError> {
        self.nvml().as_mut().map_err(|why| EffectError::Other {
            what: what.to_string(),
            message: why.to_string(),
        })
    }

    /// Cgroup and unit of every process of `g`, from `/proc/<pid>/cgroup` under the root.
    fn resolve_pids(&self, g: &mut GpuState) {
        let procs = g.processes.iter_mut().chain(
            g.mig
                .iter_mut()
                .flat_map(|m| m.instances.iter_mut())
                .flat_map(|i| i.compute.iter_mut())
                .flat_map(|c| c.processes.iter_mut()),
        );
        for p in procs {
            let (cg, unit) = pid_cgroup(&self.root, p.pid);
            p.cgroup = cg;
            p.unit = unit;
        }
    }

    /// Everything but the GPUs' driver state: owner labels (on `obs.gpus`), MIG minors, team
    /// env files, slices and MPS daemons, capability nodes.
    fn observe_rest(&mut self, obs: &mut Observed) -> Result<(), EffectError> {
        owners::apply(&self.root, &mut obs.gpus)?;
        obs.mig_minors.clear();
        if let Ok(t) = std::fs::read_to_string(self.root.join(MIG_MINORS)) {
            obs.mig_minors = devnodes::parse_mig_minors(&t);
        }
        obs.env_files = envfiles::read_all(&self.root)?;
        obs.cdi_specs = cdifiles::read_all(&self.root)?;
        obs.cdi_readers = obs
            .cdi_specs
            .keys()
            .map(|t| (t.clone(), cdifiles::readers(&self.root, t)))
            .collect();
        obs.slices.clear();
        obs.mps.clear();
        obs.fences.clear();
        // Read at every observation (a unit-drift reconcile included), so a module loaded since
        // the last one is in the next plan's fence.
        obs.majors = procfs::majors(&self.root);
        if let Some(sd) = self.systemd.as_mut() {
            // Only slices gpuctl controls (DevicePolicy=closed) count as existing: any other
            // gpu-<team>.slice is planned to be set, which is what it needs.
            obs.slices = sd.read_running_slices()?;
            obs.mps = sd.list_mps()?.into_iter().collect();
            obs.fences = sd.read_fences(&crate::plan::fence::FENCED_SLICES)?;
        }
        obs.cap_nodes = devnodes::existing(&self.root);
        obs.out_of_service = self.out_of_service.clone();
        obs.slurm = match &mut self.slurm {
            Some(s) if s.settings.enabled => Some(s.observe(&self.root)),
            _ => None,
        };
        Ok(())
    }
}

impl Observer for RealHost {
    fn observe(&mut self) -> Result<Observed, EffectError> {
        let mut obs = Observed {
            host: procfs::host_info(&self.root),
            ..Default::default()
        };
        match self.nvml() {
            Ok(b) => obs.gpus = b.observe_gpus()?,
            Err(why) => obs.nvml_unavailable = Some(why.to_string()),
        }
        for g in &mut obs.gpus {
            self.resolve_pids(g);
        }
        self.observe_rest(&mut obs)?;
        Ok(obs)
    }

    /// Only the GPUs in `gpus` go to NVML, through [`NvmlBackend::observe_gpu`]; without
    /// NVML, or for a GPU `prev` does not know, this is a full observation.
    fn refresh(
        &mut self,
        prev: &Observed,
        gpus: &BTreeSet<String>,
    ) -> Result<Observed, EffectError> {
        let known = gpus.iter().all(|u| prev.gpus.iter().any(|g| &g.uuid == u));
        // No GPU to read: NVML stays closed (a unit drift, a limit change).
        let unusable = !gpus.is_empty() && self.nvml().is_err();
        if unusable || prev.nvml_unavailable.is_some() || !known {
            return self.observe();
        }
        let mut obs = prev.clone();
        for g in &mut obs.gpus {
            if gpus.contains(&g.uuid) {
                let mut fresh = self.backend(&g.uuid)?.observe_gpu(g)?;
                self.resolve_pids(&mut fresh);
                *g = fresh;
            }
        }
        self.observe_rest(&mut obs)?;
        Ok(obs)
    }

    fn refresh_processes(&mut self, obs: &mut Observed, gpu: &str) -> Result<(), EffectError> {
        let Some(g) = obs.gpus.iter_mut().find(|g| g.uuid == gpu) else {
            return Ok(());
        };
        self.backend(gpu)?.refresh_processes(g)?;
        self.resolve_pids(g);
        Ok(())
    }
}

impl GpuEffector for RealHost {
    fn set_mig_mode(&mut self, gpu: &str, enable: bool) -> Result<bool, EffectError> {
        self.backend(gpu)?.set_mig_mode(gpu, enable)
    }
    fn reset_gpu(&mut self, gpu: &str) -> Result<(), EffectError> {
        let run = self.backend(gpu)?.reset_to_run(gpu)?;
        // nvidia-smi(1): a reset needs the GPU free of other clients, monitoring ones (NVML)
        // included: the process's other clients let go, and so does this host (the next call
        // opens it again).
        let _quiet = self.others.as_ref().map(|o| o.quiet());
        let Some((argv, index)) = run else {
            return self.backend(gpu)?.reset_gpu(gpu);
        };
        self.release_nvml();
        crate::nvml::run_reset(&argv, index, gpu)
    }
    fn create_gi(
        &mut self,
        gpu: &str,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, EffectError> {
        self.backend(gpu)?.create_gi(gpu, profile_id, placement)
    }
    fn destroy_gi(&mut self, gpu: &str, gi: u32) -> Result<(), EffectError> {
        self.backend(gpu)?.destroy_gi(gpu, gi)
    }
    fn create_ci(
        &mut self,
        gpu: &str,
        gi: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, EffectError> {
        self.backend(gpu)?.create_ci(gpu, gi, profile_id, placement)
    }
    fn destroy_ci(&mut self, gpu: &str, gi: u32, ci: u32) -> Result<(), EffectError> {
        self.backend(gpu)?.destroy_ci(gpu, gi, ci)
    }
}

impl OwnerLabels for RealHost {
    fn set_owner(&mut self, gpu: &str, gi: u32, owner: &str) -> Result<(), EffectError> {
        let (profile_id, p) = self.backend(gpu)?.gi_identity(gpu, gi)?;
        Ok(owners::set(&self.root, gpu, profile_id, p, owner)?)
    }
}

impl UnitEffector for RealHost {
    fn stop_units(&mut self, units: &[String], timeout: Duration) -> Result<(), EffectError> {
        self.systemd(&format!("stop {}", units.join(" ")))?
            .stop_units(units, timeout)
    }
    fn start_units(&mut self, units: &[String]) -> Result<(), EffectError> {
        self.systemd(&format!("start {}", units.join(" ")))?
            .start_units(units)
    }
    fn restart_units(&mut self, units: &[String]) -> Result<(), EffectError> {
        self.systemd(&format!("restart {}", units.join(" ")))?
            .restart_units(units)
    }
}

impl SlurmEffector for RealHost {
    fn drain_node(&mut self, node: &str, reason: &str) -> Result<(), EffectError> {
        self.slurm_side(node)?.drain(node, reason)
    }
    fn resume_node(&mut self, node: &str) -> Result<(), EffectError> {
        self.slurm_side(node)?.resume(node)
    }
    fn write_gres(&mut self, path: &std::path::Path, content: &str) -> Result<(), EffectError> {
        slurm::write_gres(&self.root, path, content)
    }
    fn reload_slurm(&mut self, restart: &[String]) -> Result<(), EffectError> {
        self.slurm_side("scontrol reconfigure")?.reconfigure()?;
        if restart.is_empty() {
            return Ok(());
        }
        self.restart_units(restart)?;
        self.slurm_side("slurmctld")?
            .wait_controller(Duration::from_secs(20))
    }
}

impl SliceEffector for RealHost {
    fn set_slice(&mut self, team: &TeamName, spec: &SliceSpec) -> Result<(), EffectError> {
        self.systemd(&crate::systemd::props::slice_unit(team))?
            .set_slice(team, spec)
    }
    fn update_slice(
        &mut self,
        team: &TeamName,
        spec: &SliceSpec,
        live: Option<&SliceSpec>,
    ) -> Result<(), EffectError> {
        self.systemd(&crate::systemd::props::slice_unit(team))?
            .update_slice(team, spec, live)
    }
    fn remove_slice(&mut self, team: &TeamName) -> Result<(), EffectError> {
        self.systemd(&crate::systemd::props::slice_unit(team))?
            .remove_slice(team)
    }
    fn set_fence(&mut self, slice: &str, fence: &crate::observe::Fence) -> Result<(), EffectError> {
        self.systemd(slice)?.set_fence(slice, fence)
    }
}

impl MpsEffector for RealHost {
    fn prepare_mps(&mut self, starts: &[(&str, &MpsSpec)]) -> Result<(), EffectError> {
        self.systemd("MPS daemons")?.prepare_mps(starts)
    }
    fn start_mps(&mut self, instance: &str, spec: &MpsSpec) -> Result<(), EffectError> {
        self.systemd(&crate::systemd::mps::unit(instance))?
            .start_mps(instance, spec)
    }
    fn stop_mps(&mut self, instance: &str) -> Result<(), EffectError> {
        self.systemd(&crate::systemd::mps::unit(instance))?
            .stop_mps(instance)
    }
}

impl FileEffector for RealHost {
    fn write_env(&mut self, team: &TeamName, content: &str) -> Result<(), EffectError> {
        Ok(envfiles::write(&self.root, team, content)?)
    }

    fn remove_env(&mut self, team: &TeamName) -> Result<(), EffectError> {
        Ok(envfiles::remove(&self.root, team)?)
    }

    fn write_cdi(
        &mut self,
        team: &TeamName,
        content: &str,
        readers: &[String],
    ) -> Result<(), EffectError> {
        Ok(cdifiles::write(&self.root, team, content, readers)?)
    }

    fn remove_cdi(&mut self, team: &TeamName) -> Result<(), EffectError> {
        Ok(cdifiles::remove(&self.root, team)?)
    }

    fn create_cap_nodes(&mut self, minors: &[u32]) -> Result<(), EffectError> {
        Ok(devnodes::create(&self.root, minors)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_recorded_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = RealHost::open(
            Root::new(dir.path()),
            Some(dir.path().join("libnvidia-ml.so.1")),
        );
        let o = h.observe().unwrap();
        assert!(o.gpus.is_empty());
        let why = o.nvml_unavailable.unwrap();
        assert!(why.starts_with("NVML not available:"), "{why}");
        let e = h.create_gi("GPU-x", 19, Placement { start: 0, size: 1 });
        assert!(e.unwrap_err().to_string().contains("NVML not available"));
        h.write_env(&"prod".parse().unwrap(), "X=1\n").unwrap();
        assert_eq!(h.observe().unwrap().env_files["prod"], "X=1\n");
    }
}
