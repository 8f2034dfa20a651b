//! Who uses what: a typed snapshot of GPU and MIG-device usage with each process attributed
//! to a user, a systemd unit and a team, and strays flagged.
//!
//! - [`collect`]: the NVML read-out (through nvml-wrapper; GPM for MIG activity) and the
//!   [`collect::Collector`] that serves every reader from one collection per interval and
//!   reads nothing while nobody asks;
//! - [`procfs`]: `/proc` attribution (uid → name through NSS, cgroup → unit and team,
//!   the pid inside the process's own pid namespace);
//! - this module: the types (the `Usage` bus reply, one definition for gpuctld and its
//!   clients) and the pure steps (ownership, attribution, stray detection).
//!
//! A value the driver does not offer is `None` ("not available"), never 0: NVML has no
//! utilisation for MIG device handles, and GPM activity exists only on Hopper and newer.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub mod collect;
pub mod procfs;

/// One collection: every GPU, its MIG devices and their processes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Unix time (ms) of the collection.
    pub collected_at_ms: u64,
    /// How long one collection is served to every reader, ms.
    pub interval_ms: u64,
    /// Why NVML could not be read, when it could not (no driver, no library).
    #[serde(default)]
    pub nvml_unavailable: Option<String>,
    /// GPUs by NVML index.
    pub gpus: Vec<GpuUsage>,
}

/// One physical GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuUsage {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Name NVML reports.
    pub name: String,
    /// Teams that own or share the whole GPU (empty for a MIG GPU: see its devices).
    #[serde(default)]
    pub teams: Vec<String>,
    /// Framebuffer bytes in use, total.
    pub memory_used: Option<u64>,
    /// Framebuffer bytes.
    pub memory_total: Option<u64>,
    /// Percent of time a kernel ran (`None` in MIG mode: the driver does not report it).
    pub utilization_gpu: Option<u32>,
    /// Percent of time memory was read or written.
    pub utilization_memory: Option<u32>,
    /// GPM SM activity percent over the last collection interval (Hopper+, not in MIG mode).
    pub activity: Option<f64>,
    /// Board power, mW.
    pub power_mw: Option<u32>,
    /// GPU temperature, °C.
    pub temperature_c: Option<u32>,
    /// MIG mode is on.
    pub mig: bool,
    /// MIG devices (compute instances), by GI then CI id.
    #[serde(default)]
    pub mig_devices: Vec<MigUsage>,
    /// Processes on the whole GPU (outside MIG devices).
    #[serde(default)]
    pub processes: Vec<ProcessUsage>,
    /// Processes the caller may not see one by one, per team ([`Usage::redact`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<HiddenProcesses>,
    /// Placement leases on it (`gpuctl run`/`shell`), filled by gpuctld's `Usage` call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<DeviceLease>,
    /// Out of service (a fatal health event or `gpuctl device drain`), filled by gpuctld's
    /// `Usage` call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_service: Option<DeviceOut>,
}

/// One MIG device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MigUsage {
    /// `MIG-…` UUID.
    pub uuid: String,
    /// GPU-instance id (dcgm-exporter's `GPU_I_ID`).
    pub gi_id: u32,
    /// Compute-instance id.
    pub ci_id: u32,
    /// Profile (dcgm-exporter's `GPU_I_PROFILE`, e.g. `3g.40gb`).
    pub profile: String,
    /// Teams the device is assigned to.
    #[serde(default)]
    pub teams: Vec<String>,
    /// Bytes in use (of the GPU instance's memory).
    pub memory_used: Option<u64>,
    /// Bytes of the GPU instance.
    pub memory_total: Option<u64>,
    /// GPM SM activity percent of its GPU instance over the last interval; `None` where GPM is
    /// not offered (before Hopper) or before a second sample exists.
    pub activity: Option<f64>,
    /// Processes on it.
    #[serde(default)]
    pub processes: Vec<ProcessUsage>,
    /// Processes the caller may not see one by one, per team ([`Usage::redact`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<HiddenProcesses>,
    /// Placement leases on it (`gpuctl run`/`shell`), filled by gpuctld's `Usage` call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<DeviceLease>,
    /// Out of service (a fatal health event or `gpuctl device drain`), filled by gpuctld's
    /// `Usage` call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_service: Option<DeviceOut>,
}

/// Processes of a team whose per-process detail (user, pid, command, unit) the caller may not
/// read ([`crate::join::Viewer`]): how many there are and their memory, nothing that names them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HiddenProcesses {
    /// The team whose slice they run in (`None`: no team's).
    pub team: Option<String>,
    /// They run outside every owning team's slice.
    pub stray: bool,
    /// How many.
    pub processes: u32,
    /// Their GPU memory together; `None` when the driver did not say for one of them.
    pub used_memory: Option<u64>,
}

/// A placement lease on a device (docs/shell.md, "Placement"): which job holds it. Who holds
/// it (user, uid, unit) only for callers who may read the team's per-process detail
/// ([`Usage::redact`]); team and since always, as the device is seen as held either way.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceLease {
    /// The team whose share the device is.
    pub team: String,
    /// The holder's name; `None` once redacted.
    pub user: Option<String>,
    /// The holder's uid; `None` once redacted.
    pub uid: Option<u32>,
    /// The job's scope; `None` once redacted.
    pub unit: Option<String>,
    /// When it was placed, seconds since the epoch.
    pub since: u64,
    /// The job's MPS pinned device memory limit in bytes, where one was set.
    #[serde(default)]
    pub gpu_memory: Option<u64>,
}

/// Why and since when a device takes no new work.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceOut {
    /// The fault or the admin's reason.
    pub reason: String,
    /// Unix seconds.
    pub since: u64,
    /// `gpuctld` (a health event) or the admin who drained it.
    pub by: String,
}

/// One process on a GPU or MIG device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessUsage {
    /// PID in gpuctld's (the host's) pid namespace, as NVML reports it.
    pub pid: u32,
    /// PID inside the process's own pid namespace, when that differs (a container).
    #[serde(default)]
    pub ns_pid: Option<u32>,
    /// `compute` or `graphics`.
    pub kind: String,
    /// GPU memory bytes; `None` when the driver does not say.
    pub used_memory: Option<u64>,
    /// Real uid.
    pub uid: Option<u32>,
    /// User name (NSS), else the uid as text.
    pub user: Option<String>,
    /// Command name (`/proc/<pid>/comm`).
    pub command: Option<String>,
    /// systemd unit or scope.
    pub unit: Option<String>,
    /// Team whose `gpu-<team>.slice` it runs in.
    pub team: Option<String>,
    /// The unit directly in that slice: what the host's systemd can stop (idle reclaim).
    #[serde(default)]
    pub team_unit: Option<String>,
    /// The Slurm job it belongs to (its cgroup is a slurmstepd job step's): Slurm gave it
    /// the device, so it is not a stray.
    #[serde(default)]
    pub slurm_job: Option<u64>,
    /// The container it runs in, `docker <short id>` ([`crate::names::container_of_cgroup`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// On a team's device but outside every owning team's slice (and no Slurm job).
    #[serde(default)]
    pub stray: bool,
    /// Flagged by its team's idle rule: `idle`, `warned`, `stopping`, or `activity unknown`
    /// (filled by gpuctld's `Usage` call from the idle tracker; `None` otherwise).
    #[serde(default)]
    pub idle: Option<String>,
    /// A borrowed job's lender (its `team` is then the borrower's, from its lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowed_from: Option<String>,
}

/// Which teams own which devices: whole GPUs by index, MIG devices by UUID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owners {
    /// GPU index → teams.
    pub gpus: BTreeMap<u32, Vec<String>>,
    /// MIG UUID → teams.
    pub mig: BTreeMap<String, Vec<String>>,
}

/// Fill device owners and flag strays: a process on a device some team owns that runs
/// outside every owning team's slice (root jobs, another team through a leaked device,
/// a container runtime). Processes on devices no team owns are never strays.
pub fn attribute(usage: &mut Usage, owners: &Owners) {
    fn flag(procs: &mut [ProcessUsage], teams: &[String]) {
        for p in procs {
            p.stray = !teams.is_empty()
                && !p.team.as_ref().is_some_and(|t| teams.contains(t))
                && p.slurm_job.is_none()
                // A borrowed job: the loans slice opens only the devices lent to it.
                && p.team.as_deref() != Some(crate::names::LOANS);
        }
    }
    for g in &mut usage.gpus {
        g.teams = owners.gpus.get(&g.index).cloned().unwrap_or_default();
        flag(&mut g.processes, &g.teams);
        for m in &mut g.mig_devices {
            m.teams = owners.mig.get(&m.uuid).cloned().unwrap_or_default();
            flag(&mut m.processes, &m.teams);
        }
    }
}

/// Move the processes `sees` refuses out of `procs` into per-(team, stray) counts.
fn hide(
    procs: &mut Vec<ProcessUsage>,
    hidden: &mut Vec<HiddenProcesses>,
    sees: &dyn Fn(Option<&str>) -> bool,
) {
    let (shown, gone): (Vec<_>, Vec<_>) = std::mem::take(procs)
        .into_iter()
        .partition(|p| sees(p.team.as_deref()));
    *procs = shown;
    for p in gone {
        let at = hidden
            .iter()
            .position(|h| h.team == p.team && h.stray == p.stray);
        let h = match at {
            Some(i) => &mut hidden[i],
            None => {
                hidden.push(HiddenProcesses {
                    team: p.team.clone(),
                    stray: p.stray,
                    processes: 0,
                    used_memory: Some(0),
                });
                hidden.last_mut().expect("just pushed")
            }
        };
        h.processes += 1;
        h.used_memory = h.used_memory.zip(p.used_memory).map(|(a, b)| a + b);
    }
}

impl Usage {
    /// Leave per-process detail only where `sees(team)` allows (the caller's
    /// [`crate::join::Viewer`]); every other process becomes a count with its memory in its
    /// device's `hidden`, so device and team totals stay whole.
    pub fn redact(&mut self, sees: impl Fn(Option<&str>) -> bool) {
        let unname = |leases: &mut Vec<DeviceLease>| {
            for l in leases.iter_mut().filter(|l| !sees(Some(&l.team))) {
                (l.user, l.uid, l.unit) = (None, None, None);
            }
        };
        for g in &mut self.gpus {
            hide(&mut g.processes, &mut g.hidden, &sees);
            unname(&mut g.leases);
            for m in &mut g.mig_devices {
                hide(&mut m.processes, &mut m.hidden, &sees);
                unname(&mut m.leases);
            }
        }
    }

    /// Mark the device whose (GPU or MIG) UUID is `device` out of service; a device not in
    /// this collection (gone since) is skipped.
    pub fn mark_out(&mut self, device: &str, out: DeviceOut) {
        for g in &mut self.gpus {
            if g.uuid == device {
                g.out_of_service = Some(out);
                return;
            }
            if let Some(m) = g.mig_devices.iter_mut().find(|m| m.uuid == device) {
                m.out_of_service = Some(out);
                return;
            }
        }
    }

    /// Put `lease` on the device whose (GPU or MIG) UUID is `device`; a device not in this
    /// collection (gone since) is skipped.
    pub fn add_lease(&mut self, device: &str, lease: DeviceLease) {
        for g in &mut self.gpus {
            if g.uuid == device {
                g.leases.push(lease);
                return;
            }
            if let Some(m) = g.mig_devices.iter_mut().find(|m| m.uuid == device) {
                m.leases.push(lease);
                return;
            }
        }
    }

    /// Processes counted in `hidden` entries, and how many of them are strays.
    pub fn hidden_counts(&self) -> (u32, u32) {
        let all = self.gpus.iter().flat_map(|g| {
            g.hidden
                .iter()
                .chain(g.mig_devices.iter().flat_map(|m| &m.hidden))
        });
        all.fold((0, 0), |(n, s), h| {
            (n + h.processes, s + if h.stray { h.processes } else { 0 })
        })
    }

    /// Keep only what concerns `team`: devices it owns, and processes it runs anywhere.
    pub fn filter_team(&mut self, team: &str) {
        let t = |teams: &[String]| teams.iter().any(|x| x == team);
        let p = |p: &ProcessUsage| p.team.as_deref() == Some(team);
        let h = |h: &HiddenProcesses| h.team.as_deref() == Some(team);
        self.gpus.retain_mut(|g| {
            g.mig_devices.retain_mut(|m| {
                if t(&m.teams) {
                    return true;
                }
                m.processes.retain(p);
                m.hidden.retain(h);
                !m.processes.is_empty() || !m.hidden.is_empty()
            });
            let keep = t(&g.teams)
                || g.processes.iter().any(p)
                || g.hidden.iter().any(h)
                || !g.mig_devices.is_empty();
            if !t(&g.teams) {
                g.processes.retain(p);
                g.hidden.retain(h);
            }
            keep
        });
    }

    /// Every process, to change in place.
    #[cfg(test)]
    fn processes_mut(&mut self) -> impl Iterator<Item = &mut ProcessUsage> {
        self.gpus.iter_mut().flat_map(|g| {
            g.processes.iter_mut().chain(
                g.mig_devices
                    .iter_mut()
                    .flat_map(|m| m.processes.iter_mut()),
            )
        })
    }

    /// Every process with the device it runs on (GPU index, MIG UUID if any).
    pub fn processes(&self) -> impl Iterator<Item = (&GpuUsage, Option<&MigUsage>, &ProcessUsage)> {
        self.gpus.iter().flat_map(|g| {
            g.processes.iter().map(move |p| (g, None, p)).chain(
                g.mig_devices
                    .iter()
                    .flat_map(move |m| m.processes.iter().map(move |p| (g, Some(m), p))),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_in(pid: u32, team: Option<&str>) -> ProcessUsage {
        ProcessUsage {
            pid,
            kind: "compute".into(),
            team: team.map(str::to_string),
            ..Default::default()
        }
    }

    fn sample() -> Usage {
        Usage {
            gpus: vec![
                GpuUsage {
                    index: 0,
                    processes: vec![proc_in(1, Some("infer")), proc_in(2, None)],
                    ..Default::default()
                },
                GpuUsage {
                    index: 1,
                    mig: true,
                    mig_devices: vec![
                        MigUsage {
                            uuid: "MIG-a".into(),
                            processes: vec![proc_in(3, Some("train")), proc_in(4, Some("infer"))],
                            ..Default::default()
                        },
                        MigUsage {
                            uuid: "MIG-free".into(),
                            processes: vec![proc_in(5, None)],
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    fn owners() -> Owners {
        Owners {
            gpus: [(0, vec!["infer".to_string()])].into(),
            mig: [("MIG-a".to_string(), vec!["train".to_string()])].into(),
        }
    }

    #[test]
    fn leases_go_on_their_devices_and_lose_their_holder_when_redacted() {
        let mut u = Usage {
            gpus: vec![
                GpuUsage {
                    uuid: "GPU-0".into(),
                    ..Default::default()
                },
                GpuUsage {
                    uuid: "GPU-1".into(),
                    mig_devices: vec![MigUsage {
                        uuid: "MIG-a".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let l = |team: &str| DeviceLease {
            team: team.into(),
            user: Some("alice".into()),
            uid: Some(1000),
            unit: Some("gpuctl-run-x-1.scope".into()),
            since: 5,
            gpu_memory: None,
        };
        u.add_lease("MIG-a", l("interns"));
        u.add_lease("GPU-0", l("train"));
        u.add_lease("GPU-gone", l("train"));
        assert_eq!(u.gpus[1].mig_devices[0].leases, vec![l("interns")]);
        assert_eq!(u.gpus[0].leases, vec![l("train")]);
        assert!(u.gpus[1].leases.is_empty());
        u.redact(|t| t == Some("interns"));
        assert_eq!(u.gpus[1].mig_devices[0].leases, vec![l("interns")]);
        let hidden = &u.gpus[0].leases[0];
        assert_eq!(
            (&hidden.user, hidden.uid, &hidden.unit),
            (&None, None, &None)
        );
        assert_eq!((hidden.team.as_str(), hidden.since), ("train", 5));
    }
    #[test]
    fn strays_are_processes_outside_the_owning_teams_slices() {
        let mut u = sample();
        attribute(&mut u, &owners());
        let strays: Vec<u32> = u
            .processes()
            .filter(|(_, _, p)| p.stray)
            .map(|(_, _, p)| p.pid)
            .collect();
        // 2: root job on infer's GPU; 4: infer's job on train's MIG device. 5 runs on a device
        // nobody owns, so it is not a stray.
        assert_eq!(strays, vec![2, 4]);
        assert_eq!(u.gpus[0].teams, vec!["infer"]);
        assert_eq!(u.gpus[1].mig_devices[0].teams, vec!["train"]);
        assert!(u.gpus[1].mig_devices[1].teams.is_empty());
    }

    #[test]
    fn a_teams_own_mps_server_is_not_a_stray() {
        let mut u = sample();
        let cg = "/gpu.slice/gpu-infer.slice/gpu-infer-gpus.slice/gpuctl-mps@infer-gpus.service";
        u.gpus[0].processes.push(ProcessUsage {
            pid: 7,
            team: procfs::team_of_cgroup(cg),
            team_unit: procfs::team_unit_of_cgroup(cg),
            ..proc_in(7, None)
        });
        attribute(&mut u, &owners());
        let mps = u.gpus[0].processes.iter().find(|p| p.pid == 7).unwrap();
        assert_eq!(mps.team.as_deref(), Some("infer"));
        assert!(!mps.stray, "{mps:?}");
        // Not a unit idle reclaim could stop: it sits in the share's slice, not the team's.
        assert_eq!(mps.team_unit, None);
    }

    #[test]
    fn a_slurm_job_on_a_teams_device_is_named_not_a_stray() {
        let mut u = sample();
        let mut job = proc_in(7, None);
        job.slurm_job = crate::slurm::job_of_cgroup("/system.slice/slurmstepd.scope/job_12/step_0");
        u.gpus[0].processes.push(job);
        attribute(&mut u, &owners());
        let p = u.gpus[0].processes.iter().find(|p| p.pid == 7).unwrap();
        assert_eq!((p.slurm_job, p.stray), (Some(12), false));
        // The same process outside Slurm's cgroups would be one.
        u.gpus[0].processes.last_mut().unwrap().slurm_job = None;
        attribute(&mut u, &owners());
        assert!(u.gpus[0].processes.last().unwrap().stray);
    }

    #[test]
    fn a_shared_gpu_accepts_every_owner() {
        let mut u = sample();
        let mut o = owners();
        o.gpus.insert(0, vec!["infer".into(), "research".into()]);
        u.gpus[0].processes.push(proc_in(9, Some("research")));
        attribute(&mut u, &o);
        let stray: Vec<(u32, bool)> = u.gpus[0]
            .processes
            .iter()
            .map(|p| (p.pid, p.stray))
            .collect();
        assert_eq!(stray, vec![(1, false), (2, true), (9, false)]);
    }

    #[test]
    fn redaction_leaves_detail_of_visible_teams_and_counts_the_rest() {
        let mut u = sample();
        for p in u.processes_mut() {
            p.user = Some(format!("user{}", p.pid));
            p.command = Some("secret".into());
            p.unit = Some(format!("job{}.service", p.pid));
            p.used_memory = Some(u64::from(p.pid) << 20);
        }
        u.gpus[1].mig_devices[0].processes[1].used_memory = None;
        attribute(&mut u, &owners());
        // alice, a member of infer only.
        u.redact(|t| t == Some("infer"));
        let pids: Vec<u32> = u.processes().map(|(_, _, p)| p.pid).collect();
        assert_eq!(pids, vec![1, 4], "only infer's processes keep their detail");
        let json = serde_json::to_string(&u).unwrap();
        for gone in [
            "user2",
            "user3",
            "user5",
            "job3.service",
            "\"pid\":3",
            "\"pid\":5",
        ] {
            assert!(!json.contains(gone), "{gone} leaked: {json}");
        }
        // The root job on infer's GPU: a stray of no team, counted with its memory.
        assert_eq!(
            u.gpus[0].hidden,
            vec![HiddenProcesses {
                team: None,
                stray: true,
                processes: 1,
                used_memory: Some(2 << 20),
            }]
        );
        // train's job on its own MIG device; the unowned device's process.
        assert_eq!(u.gpus[1].mig_devices[0].hidden.len(), 1);
        assert_eq!(
            u.gpus[1].mig_devices[0].hidden[0].team.as_deref(),
            Some("train")
        );
        assert_eq!(u.gpus[1].mig_devices[1].hidden[0].team, None);
        assert!(!u.gpus[1].mig_devices[1].hidden[0].stray);
        assert_eq!(u.hidden_counts(), (3, 1));

        // Two hidden processes of one team on one device are one entry; an unknown memory
        // makes the sum unknown, never a partial figure.
        let mut u = sample();
        u.gpus[1].mig_devices[0].processes[1].team = Some("train".into());
        u.gpus[1].mig_devices[0].processes[0].used_memory = Some(7);
        attribute(&mut u, &owners());
        u.redact(|_| false);
        let h = &u.gpus[1].mig_devices[0].hidden;
        assert_eq!(h.len(), 1);
        assert_eq!((h[0].processes, h[0].used_memory), (2, None));
        assert_eq!(u.processes().count(), 0);

        // Root (or an admin) sees everything as it was.
        let mut u = sample();
        attribute(&mut u, &owners());
        let before = u.clone();
        u.redact(|_| true);
        assert_eq!(u, before);
        assert!(!serde_json::to_string(&u).unwrap().contains("hidden"));
    }

    #[test]
    fn team_filter_keeps_owned_devices_and_own_processes() {
        let mut u = sample();
        attribute(&mut u, &owners());
        u.filter_team("train");
        assert_eq!(u.gpus.len(), 1);
        assert_eq!(u.gpus[0].index, 1);
        assert_eq!(u.gpus[0].mig_devices.len(), 1);
        assert_eq!(u.gpus[0].mig_devices[0].processes.len(), 2);

        let mut u = sample();
        attribute(&mut u, &owners());
        u.filter_team("infer");
        // Its GPU with everything on it, and its one process on train's device.
        assert_eq!(u.gpus.len(), 2);
        assert_eq!(u.gpus[0].processes.len(), 2);
        assert_eq!(u.gpus[1].mig_devices.len(), 1);
        assert_eq!(u.gpus[1].mig_devices[0].uuid, "MIG-a");
        let pids: Vec<u32> = u.gpus[1].mig_devices[0]
            .processes
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(pids, vec![4]);
    }
}
