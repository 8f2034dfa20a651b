//! The real host: NVML for the GPUs, files under the [`Root`] for everything gpuctl keeps
//! itself (owner labels, team env files, capability nodes), `/proc` for PIDs' cgroups, and
//! systemd (team slices, MPS daemons, draining units) through a [`SystemdSide`] when one is
//! attached ([`RealHost::with_systemd`]).
//!
//! Without systemd (no system bus: a rescue shell, a container) the slice, MPS and unit
//! methods fail with [`no_systemd`], and [`RealHost::phases`] tells the caller which phases to
//! leave out, so `gpuctl apply --local` can say what it skipped.

use crate::apply::{
    EffectError, FileEffector, GpuEffector, MpsEffector, Observer, OwnerLabels, SliceEffector,
    UnitEffector,
};
use crate::nvml::{NvmlBackend, ResetCommand};
use crate::observe::{GpuState, HostInfo, MpsSpec, Observed, SliceSpec};
use crate::paths::{Root, MIG_MINORS, RUN_DIR, STATE_DIR};
use crate::plan::Phase;
use crate::profiles::Placement;
use crate::systemd::SystemdSide;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Owner labels file, under [`STATE_DIR`].
pub const OWNERS_FILE: &str = "owners.json";
/// Where capability device nodes live.
pub const CAPS_DIR: &str = "/dev/nvidia-caps";
/// Team env files directory, under [`RUN_DIR`].
pub const TEAMS_DIR: &str = "teams";

/// The error of a systemd-backed effector on a host without a reachable systemd.
pub fn no_systemd(what: &str) -> EffectError {
    EffectError::Other {
        what: what.to_string(),
        message: "needs systemd, and no system bus is reachable".into(),
    }
}

/// One owner label: a GI named by placement and profile (driver ids change across reboots and
/// resets; the placement of a re-created instance does not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerLabel {
    /// Placement start.
    pub start: u32,
    /// Placement size.
    pub size: u32,
    /// GI profile id: a label never carries over to a different instance at the same place.
    pub profile_id: u32,
    /// Team.
    pub owner: String,
}

/// `/var/lib/gpuctl/owners.json`: labels by GPU UUID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnersFile {
    /// Format version (1).
    pub version: u32,
    /// Labels by GPU UUID.
    pub gpus: BTreeMap<String, Vec<OwnerLabel>>,
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> EffectError {
    EffectError::Other {
        what: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Write `content` to `path` atomically and durably: temp file, fsync, rename, fsync of the
/// directory (so a crash leaves either the old or the new file, never a torn one).
pub fn write_atomic(path: &Path, content: &[u8]) -> Result<(), EffectError> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
        f.write_all(content).map_err(|e| io_err(&tmp, e))?;
        f.sync_all().map_err(|e| io_err(&tmp, e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| io_err(path, e))?;
    if let Ok(d) = std::fs::File::open(dir) {
        // Some filesystems refuse fsync on directories; the rename is done either way.
        let _ = d.sync_all();
    }
    Ok(())
}

/// The cgroup (v2 unified line, else the first line) and unit of a PID, from
/// `/proc/<pid>/cgroup` under `root`. The unit is the innermost path component that names a
/// service or scope (`…/train.service/payload` → `train.service`).
pub fn pid_cgroup(root: &Root, pid: u32) -> (Option<String>, Option<String>) {
    let Ok(text) = std::fs::read_to_string(root.join(format!("/proc/{pid}/cgroup"))) else {
        return (None, None);
    };
    let line = text
        .lines()
        .find(|l| l.starts_with("0::"))
        .or_else(|| text.lines().next());
    let Some(cg) = line.and_then(|l| l.splitn(3, ':').nth(2)) else {
        return (None, None);
    };
    let unit = cg
        .rsplit('/')
        .find(|c| c.ends_with(".service") || c.ends_with(".scope"))
        .map(str::to_string);
    (Some(cg.to_string()), unit)
}

/// Parse `/proc/driver/nvidia-caps/mig-minors` (`gpu0/gi1/access 12` per line).
pub fn parse_mig_minors(text: &str) -> BTreeMap<String, u32> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (k, v) = (it.next()?, it.next()?);
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn host_info(root: &Root) -> HostInfo {
    let memory_bytes = std::fs::read_to_string(root.join("/proc/meminfo"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0);
    let cpus = std::fs::read_to_string(root.join("/sys/devices/system/cpu/online"))
        .ok()
        .and_then(|t| crate::policy::parse::parse_cpus(t.trim()).ok())
        .map(|list| count_cpus(&list))
        .filter(|n| *n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1)
        });
    HostInfo { memory_bytes, cpus }
}

fn count_cpus(list: &str) -> u32 {
    list.split(',')
        .filter_map(|r| match r.split_once('-') {
            Some((a, b)) => Some(b.parse::<u32>().ok()? + 1 - a.parse::<u32>().ok()?),
            None => r.parse::<u32>().ok().map(|_| 1),
        })
        .sum()
}

/// The real host.
#[derive(Debug)]
pub struct RealHost {
    root: Root,
    lib: Option<PathBuf>,
    nvml: Result<NvmlBackend, String>,
    systemd: Option<Box<dyn SystemdSide>>,
}

impl RealHost {
    /// Open NVML (`lib` as resolved by [`crate::nvml::library_path`]) and use `root` for files.
    /// A missing driver is not an error here: it is recorded and reported by
    /// [`Observer::observe`] in [`Observed::nvml_unavailable`].
    pub fn open(root: Root, lib: Option<PathBuf>) -> Self {
        let nvml = NvmlBackend::open(lib.clone(), ResetCommand::from_env());
        RealHost {
            root,
            lib,
            nvml,
            systemd: None,
        }
    }

    /// Drive slices, MPS daemons and team units through `sd`, and observe the live slices and
    /// daemons from it.
    pub fn with_systemd(mut self, sd: Box<dyn SystemdSide>) -> Self {
        self.systemd = Some(sd);
        self
    }

    /// Whether a systemd is attached.
    pub fn has_systemd(&self) -> bool {
        self.systemd.is_some()
    }

    /// Use the NVML library `lib` from now on (the policy's `nvml-library` may change while the
    /// daemon runs); reopens only when it differs, or when the last open failed.
    pub fn set_nvml_library(&mut self, lib: Option<PathBuf>) {
        if lib != self.lib || self.nvml.is_err() {
            self.nvml = NvmlBackend::open(lib.clone(), ResetCommand::from_env());
            self.lib = lib;
        }
    }

    /// Why NVML cannot be used, if it cannot.
    pub fn nvml_unavailable(&self) -> Option<&str> {
        self.nvml.as_ref().err().map(String::as_str)
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

    fn owners_path(&self) -> PathBuf {
        self.root.join(STATE_DIR).join(OWNERS_FILE)
    }

    fn load_owners(&self) -> Result<OwnersFile, EffectError> {
        let p = self.owners_path();
        match std::fs::read_to_string(&p) {
            Ok(t) => serde_json::from_str(&t).map_err(|e| io_err(&p, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(OwnersFile {
                version: 1,
                ..Default::default()
            }),
            Err(e) => Err(io_err(&p, e)),
        }
    }

    fn save_owners(&self, o: &OwnersFile) -> Result<(), EffectError> {
        let p = self.owners_path();
        let text = serde_json::to_string_pretty(o).map_err(|e| io_err(&p, e))?;
        write_atomic(&p, (text + "\n").as_bytes())
    }

    fn backend(&mut self, what: &str) -> Result<&mut NvmlBackend, EffectError> {
        self.nvml.as_mut().map_err(|why| EffectError::Other {
            what: what.to_string(),
            message: why.clone(),
        })
    }

    /// Label instances from the owners file, then drop labels of instances that are gone (a
    /// label must not stick to a future instance someone else creates at that place).
    fn apply_owners(&self, gpus: &mut [GpuState]) -> Result<(), EffectError> {
        let mut file = self.load_owners()?;
        let before = file.clone();
        let seen: BTreeSet<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        for g in gpus.iter_mut() {
            let Some(labels) = file.gpus.get_mut(&g.uuid) else {
                continue;
            };
            let insts = g
                .mig
                .as_mut()
                .map(|m| &mut m.instances[..])
                .unwrap_or(&mut []);
            labels.retain(|l| {
                insts.iter().any(|i| {
                    i.profile_id == l.profile_id
                        && i.placement
                            == Placement {
                                start: l.start,
                                size: l.size,
                            }
                })
            });
            for i in insts.iter_mut() {
                i.owner = labels
                    .iter()
                    .find(|l| {
                        l.profile_id == i.profile_id
                            && l.start == i.placement.start
                            && l.size == i.placement.size
                    })
                    .map(|l| l.owner.clone());
            }
        }
        // GPUs that vanished (unplugged, or a different host booted from this disk) lose their
        // labels too; GPUs that fell off the bus come back with new instances anyway.
        file.gpus.retain(|u, l| seen.contains(u) && !l.is_empty());
        if file != before {
            self.save_owners(&file)?;
        }
        Ok(())
    }
}

impl RealHost {
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
        self.apply_owners(&mut obs.gpus)?;
        obs.mig_minors.clear();
        if let Ok(t) = std::fs::read_to_string(self.root.join(MIG_MINORS)) {
            obs.mig_minors = parse_mig_minors(&t);
        }
        obs.env_files.clear();
        let teams = self.root.join(RUN_DIR).join(TEAMS_DIR);
        if let Ok(rd) = std::fs::read_dir(&teams) {
            for e in rd.flatten() {
                let p = e.path();
                if let (Some(team), Some("env")) = (
                    p.file_stem().and_then(|s| s.to_str()),
                    p.extension().and_then(|s| s.to_str()),
                ) {
                    let text = std::fs::read_to_string(&p).map_err(|e| io_err(&p, e))?;
                    obs.env_files.insert(team.to_string(), text);
                }
            }
        }
        obs.slices.clear();
        obs.mps.clear();
        if let Some(sd) = self.systemd.as_mut() {
            // Only slices gpuctl controls (DevicePolicy=closed) count as existing: any other
            // gpu-<team>.slice is planned to be set, which is what it needs.
            for team in sd.list_slices()? {
                if let Some(spec) = sd.read_slice(&team)? {
                    obs.slices.insert(team, spec);
                }
            }
            obs.mps = sd.list_mps()?.into_iter().collect();
        }
        obs.cap_nodes.clear();
        if let Ok(rd) = std::fs::read_dir(self.root.join(CAPS_DIR)) {
            for e in rd.flatten() {
                if let Some(n) = e
                    .file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix("nvidia-cap"))
                    .and_then(|n| n.parse().ok())
                {
                    obs.cap_nodes.insert(n);
                }
            }
        }
        Ok(())
    }
}

impl Observer for RealHost {
    fn observe(&mut self) -> Result<Observed, EffectError> {
        let mut obs = Observed {
            host: host_info(&self.root),
            ..Default::default()
        };
        match &mut self.nvml {
            Ok(b) => obs.gpus = b.observe_gpus()?,
            Err(why) => obs.nvml_unavailable = Some(why.clone()),
        }
        let mut gpus = std::mem::take(&mut obs.gpus);
        for g in &mut gpus {
            self.resolve_pids(g);
        }
        obs.gpus = gpus;
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
        if self.nvml.is_err() || prev.nvml_unavailable.is_some() || !known {
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
        self.backend(gpu)?.reset_gpu(gpu)
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
        let mut file = self.load_owners()?;
        file.version = 1;
        let labels = file.gpus.entry(gpu.to_string()).or_default();
        labels.retain(|l| !(l.start == p.start && l.size == p.size));
        labels.push(OwnerLabel {
            start: p.start,
            size: p.size,
            profile_id,
            owner: owner.to_string(),
        });
        labels.sort_by_key(|l| (l.start, l.size));
        self.save_owners(&file)
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
}

impl SliceEffector for RealHost {
    fn set_slice(&mut self, team: &str, spec: &SliceSpec) -> Result<(), EffectError> {
        self.systemd(&format!("gpu-{team}.slice"))?
            .set_slice(team, spec)
    }
    fn remove_slice(&mut self, team: &str) -> Result<(), EffectError> {
        self.systemd(&format!("gpu-{team}.slice"))?
            .remove_slice(team)
    }
}

impl MpsEffector for RealHost {
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
    fn write_env(&mut self, team: &str, content: &str) -> Result<(), EffectError> {
        let p = self
            .root
            .join(RUN_DIR)
            .join(TEAMS_DIR)
            .join(format!("{team}.env"));
        write_atomic(&p, content.as_bytes())
    }

    fn remove_env(&mut self, team: &str) -> Result<(), EffectError> {
        let p = self
            .root
            .join(RUN_DIR)
            .join(TEAMS_DIR)
            .join(format!("{team}.env"));
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(&p, e)),
            _ => Ok(()),
        }
    }

    /// On the real root, character devices with the `nvidia-caps` major from `/proc/devices`
    /// (what `nvidia-modprobe -f` does). Under another root (tests, image builds) there is no
    /// driver to own the major and mknod needs privileges, so the nodes are plain files there.
    fn create_cap_nodes(&mut self, minors: &[u32]) -> Result<(), EffectError> {
        let dir = self.root.join(CAPS_DIR);
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        let real_root = self.root.dir() == Path::new("/");
        let major = if real_root {
            let pd = self.root.join("/proc/devices");
            let t = std::fs::read_to_string(&pd).map_err(|e| io_err(&pd, e))?;
            Some(
                t.lines()
                    .find_map(|l| {
                        let (n, name) = l.trim().split_once(' ')?;
                        (name.trim() == "nvidia-caps").then(|| n.parse::<u64>().ok())?
                    })
                    .ok_or_else(|| io_err(&pd, "no nvidia-caps major (is the driver loaded?)"))?,
            )
        } else {
            None
        };
        for m in minors {
            let p = dir.join(format!("nvidia-cap{m}"));
            if p.exists() {
                continue;
            }
            match major {
                Some(maj) => {
                    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
                    // Read-only for everyone, as nvidia-modprobe makes them; access is gated by
                    // the slices' DeviceAllow=, not by file modes.
                    mknod(
                        &p,
                        SFlag::S_IFCHR,
                        Mode::from_bits_truncate(0o444),
                        makedev(maj, u64::from(*m)),
                    )
                    .map_err(|e| io_err(&p, e))?;
                }
                None => {
                    std::fs::write(&p, b"").map_err(|e| io_err(&p, e))?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_and_unit_of_a_pid() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let p = root.join("/proc/42/cgroup");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "0::/gpu.slice/gpu-prod.slice/train.service/payload\n").unwrap();
        assert_eq!(
            pid_cgroup(&root, 42),
            (
                Some("/gpu.slice/gpu-prod.slice/train.service/payload".into()),
                Some("train.service".into())
            )
        );
        std::fs::write(&p, "0::/user.slice/user-1000.slice/session-3.scope\n").unwrap();
        assert_eq!(pid_cgroup(&root, 42).1.as_deref(), Some("session-3.scope"));
        assert_eq!(pid_cgroup(&root, 43), (None, None));
    }

    #[test]
    fn mig_minors_and_cpus_parse() {
        let m = parse_mig_minors("config 1\nmonitor 2\ngpu0/gi1/access 12\nbroken\n");
        assert_eq!(m.len(), 3);
        assert_eq!(m["gpu0/gi1/access"], 12);
        assert_eq!(count_cpus("0-3,8,10-11"), 7);
    }

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
        h.write_env("prod", "X=1\n").unwrap();
        assert_eq!(h.observe().unwrap().env_files["prod"], "X=1\n");
    }
}
