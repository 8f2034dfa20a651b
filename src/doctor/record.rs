//! `gpuctl doctor --record FILE`: what the driver reported, in the fake NVML's own state format
//! (`fakes/fake-nvml/README.md`), so that a recorded host can be replayed: point
//! `FAKE_NVML_STATE` at (a copy of) the file and load the fake.
//!
//! What is recorded is what the fake can model: per GPU its model (the driver's name, PCI
//! device id, memory, and the GI/CI profile tables with placements, under `models`), UUID,
//! minor, PCI bus, MIG mode, live GPU and compute instances with their MIG UUIDs; and the
//! compute processes with their GI/CI and memory. Two facts are not observable read-only and
//! are taken from the reference data by model name (false when unknown): whether enabling MIG
//! needs a reset, and, with it, the fake's `inline_reset_ok` stays at its default. CI tables
//! exist only for GI profiles that had a live instance (see [`super::driver`]).
//!
//! The types here mirror the fake's serde types instead of depending on the fake crate:
//! gpuctl ships without it. `tests/doctor.rs` loads recordings into the fake to keep the two
//! in step.

use super::driver::{DriverRead, GpuRead};
use crate::observe::{ComputeInstance, GpuInstance, GpuProcess, GpuState, MigState};
use crate::profiles::{Catalog, CiProfile, GiProfile, Placement};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A fake NVML state file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recording {
    /// Where the recording came from (driver version, tool): ignored by the fake.
    #[serde(default)]
    pub recorded_by: String,
    /// GPUs in index order.
    pub gpus: Vec<RecGpu>,
    /// Compute processes.
    #[serde(default)]
    pub processes: Vec<RecProcess>,
    /// Models by key, in the reference file's schema.
    #[serde(default)]
    pub models: BTreeMap<String, RecModel>,
}

/// A model definition (one `gpus` entry of `data/gpu-profiles.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RecModel {
    /// `nvmlDeviceGetName`.
    pub nvml_name: String,
    /// PCI device id words.
    pub pci_device_ids: Vec<String>,
    /// Framebuffer in MiB.
    pub memory_total_mib: u64,
    /// Whether `nvmlDeviceGetMigMode` answered.
    pub mig_capable: bool,
    /// Memory slices (the end of the largest GI placement).
    #[serde(default)]
    pub memory_slices: u32,
    /// `nvmlDeviceGetMaxMigDeviceCount`.
    #[serde(default)]
    pub max_mig_device_count: u32,
    /// From the reference data by name (not observable without changing the mode).
    #[serde(default)]
    pub enable_requires_gpu_reset: bool,
    /// GI profiles.
    #[serde(default)]
    pub gi_profiles: Vec<GiProfile>,
    /// CI profiles by GI profile name.
    #[serde(default)]
    pub ci_profiles_by_gi: BTreeMap<String, Vec<CiProfile>>,
}

/// MIG mode as 0/1 words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct RecMigMode {
    pub current: u32,
    pub pending: u32,
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct RecGpu {
    /// A key of `models`.
    pub model: String,
    pub uuid: String,
    pub minor: Option<u32>,
    pub pci_bus: Option<u32>,
    #[serde(default)]
    pub mig: RecMigMode,
    #[serde(default)]
    pub gpu_instances: Vec<RecGi>,
}

/// A GPU instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct RecGi {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    #[serde(default)]
    pub compute_instances: Vec<RecCi>,
}

/// A compute instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct RecCi {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    pub uuid: String,
}

/// A compute process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct RecProcess {
    pub pid: u32,
    pub gpu: u32,
    pub gi: Option<u32>,
    pub ci: Option<u32>,
    pub used_memory_mib: u64,
}

fn model_of(g: &GpuRead) -> RecModel {
    let reference = Catalog::get().by_nvml_name(&g.name);
    let mut m = RecModel {
        nvml_name: g.name.clone(),
        pci_device_ids: g
            .pci_device_id
            .map(|id| vec![format!("0x{id:08X}")])
            .unwrap_or_default(),
        memory_total_mib: g.memory_mib.unwrap_or(0),
        mig_capable: g.mig.is_some(),
        enable_requires_gpu_reset: reference.is_some_and(|r| r.enable_requires_gpu_reset),
        ..RecModel::default()
    };
    if let Some(mig) = &g.mig {
        m.max_mig_device_count = mig.max_mig_device_count.unwrap_or(0);
        if let Ok(t) = &mig.gi_profiles {
            m.gi_profiles = t.clone();
            m.memory_slices = t
                .iter()
                .flat_map(|p| p.placements.iter())
                .map(|p| p.start + p.size)
                .max()
                .unwrap_or(0);
            for p in t {
                if let Some(ct) = mig.ci_profiles.get(&p.id) {
                    m.ci_profiles_by_gi.insert(p.name.clone(), ct.clone());
                }
            }
        }
    }
    m
}

/// The recording of what `d` reports.
pub fn record(d: &DriverRead) -> Recording {
    let mut r = Recording {
        recorded_by: format!(
            "gpuctl {} doctor --record; driver {}",
            env!("CARGO_PKG_VERSION"),
            d.versions.driver.as_deref().unwrap_or("unknown")
        ),
        ..Recording::default()
    };
    for g in &d.gpus {
        let model = model_of(g);
        // The reference key when the name is known (the recorded table then shadows the
        // built-in one in the fake), else the driver's name.
        let key = Catalog::get()
            .by_nvml_name(&g.name)
            .map_or(g.name.clone(), |m| m.key.clone());
        let unreadable = g.mig.as_ref().is_some_and(|m| m.gi_profiles.is_err());
        let key = if unreadable && Catalog::get().by_key(&key).is_some() {
            // The table could not be read (MIG off): the GPU names the fake's built-in model
            // of that name rather than a definition with an empty table.
            key
        } else {
            // Two GPUs of one name with different tables (a tampered or odd driver) keep both.
            let key = match r.models.get(&key) {
                Some(existing) if *existing != model => format!("{key}#{}", g.index),
                _ => key,
            };
            r.models.insert(key.clone(), model);
            key
        };
        let mig = g.mig.as_ref();
        r.gpus.push(RecGpu {
            model: key,
            uuid: g.uuid.clone(),
            minor: g.minor,
            pci_bus: g.pci_bus,
            mig: RecMigMode {
                current: mig.is_some_and(|m| m.current) as u32,
                pending: mig.is_some_and(|m| m.pending) as u32,
            },
            gpu_instances: mig
                .map(|m| {
                    m.instances
                        .iter()
                        .map(|gi| RecGi {
                            id: gi.id,
                            profile_id: gi.profile_id,
                            start: gi.placement.start,
                            size: gi.placement.size,
                            compute_instances: gi
                                .compute
                                .iter()
                                .map(|c| RecCi {
                                    id: c.id,
                                    profile_id: c.profile_id,
                                    start: c.placement.start,
                                    size: c.placement.size,
                                    uuid: c.uuid.clone(),
                                })
                                .collect(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        });
        for p in g.processes.iter().flatten() {
            r.processes.push(RecProcess {
                pid: p.pid,
                gpu: g.index,
                gi: p.gi,
                ci: p.ci,
                used_memory_mib: p.used_memory.unwrap_or(0) >> 20,
            });
        }
    }
    r
}

impl Recording {
    /// What gpuctl's NVML observer (`NvmlBackend::observe_gpus`) must report for the replayed
    /// host: the recording read the way the observer reads a host (profile names from the
    /// reference data, processes on their CI, no cgroups).
    pub fn expected_observation(&self) -> Vec<GpuState> {
        let mut out = Vec::new();
        for (index, g) in self.gpus.iter().enumerate() {
            let def = self.models.get(&g.model);
            let builtin = Catalog::get().by_key(&g.model);
            let (name, memory_mib) = match (def, builtin) {
                (Some(d), _) => (d.nvml_name.clone(), d.memory_total_mib),
                (None, Some(b)) => (b.nvml_name.clone(), b.memory_total_mib),
                (None, None) => (String::new(), 0),
            };
            let model = Catalog::get().by_nvml_name(&name);
            let mig_capable =
                def.map_or(builtin.is_some_and(|b| b.mig_capable()), |d| d.mig_capable);
            let mig = mig_capable.then(|| MigState {
                current: g.mig.current != 0,
                pending: g.mig.pending != 0,
                instances: g
                    .gpu_instances
                    .iter()
                    .map(|gi| {
                        let gi_name = model
                            .and_then(|m| m.gi_profile_by_id(gi.profile_id))
                            .map_or(format!("profile-{}", gi.profile_id), |p| p.name.clone());
                        let mut compute: Vec<ComputeInstance> = gi
                            .compute_instances
                            .iter()
                            .map(|c| ComputeInstance {
                                id: c.id,
                                profile_id: c.profile_id,
                                profile: model
                                    .and_then(|m| {
                                        m.ci_profiles(&gi_name)
                                            .iter()
                                            .find(|x| x.id == c.profile_id)
                                    })
                                    .map_or(format!("ci-profile-{}", c.profile_id), |x| {
                                        x.name.clone()
                                    }),
                                placement: Placement {
                                    start: c.start,
                                    size: c.size,
                                },
                                uuid: c.uuid.clone(),
                                processes: vec![],
                            })
                            .collect();
                        compute.sort_by_key(|c| c.id);
                        GpuInstance {
                            id: gi.id,
                            profile_id: gi.profile_id,
                            profile: gi_name,
                            placement: Placement {
                                start: gi.start,
                                size: gi.size,
                            },
                            owner: None,
                            compute,
                        }
                    })
                    .collect(),
            });
            let mut gpu = GpuState {
                index: index as u32,
                uuid: g.uuid.clone(),
                name,
                model: model.map(|m| m.key.clone()),
                minor: g.minor.unwrap_or(index as u32),
                memory_mib,
                mig,
                processes: vec![],
            };
            for p in self.processes.iter().filter(|p| p.gpu == index as u32) {
                let gp = GpuProcess {
                    pid: p.pid,
                    used_memory: p.used_memory_mib << 20,
                    unit: None,
                    cgroup: None,
                };
                let slot = match (p.gi, p.ci, gpu.mig.as_mut()) {
                    (Some(gi), Some(ci), Some(m)) => m
                        .instances
                        .iter_mut()
                        .find(|x| x.id == gi)
                        .and_then(|x| x.compute.iter_mut().find(|c| c.id == ci))
                        .map(|c| &mut c.processes),
                    _ => None,
                };
                slot.unwrap_or(&mut gpu.processes).push(gp);
            }
            out.push(gpu);
        }
        out
    }
}
