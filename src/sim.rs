//! Simulated GPU hosts: `--simulate h100-80gb*8` or `a100-40gb*4,h200*2`.
//!
//! A spec is a comma-separated list of `NAME` or `NAME*COUNT`; names are each model's
//! `sim_names` in `data/gpu-profiles.json` (`h100-80gb`, `a800-80gb`, `b200`, …, `l40s`), aliases
//! included (`h100`, `a800`: the names the fake NVML's `FAKE_NVML_SPEC` takes), in any case.
//! GPUs get indices and minors in spec order. The simulated host has 2 TiB of RAM and
//! 128 CPUs, a typical 8-GPU server, so percentage limits resolve to realistic sizes.
//!
//! [`SimHost`] implements every effector trait faithfully enough for the planner's properties
//! to be tested against it:
//! - GI creation fails with `InsufficientResources` on overlap, over the compute-slice budget,
//!   over a profile's `instance_count` or the GPU's `max_mig_device_count`;
//! - destroying a CI with processes, or a GI with CIs, fails with `InUse`;
//! - on models with `enable_requires_gpu_reset` (A100, A30) a mode change stays pending until
//!   [`GpuEffector::reset_gpu`], which fails while processes run and drops every instance;
//! - GI ids come from per-size pools, like the driver: on an 8-slice GPU the 8-slice profile gets
//!   id 0, 4-slice profiles 1–2, 2-slice 3–6, and 1-slice profiles take the first free id of
//!   `9, 7, 8, 11, 12, 13, 14, 10`, the order the driver showed when creating seven 1g instances.
//!   A 4-slice GPU (A30) uses 0 / 1–2 / 3–6. CI ids are the lowest free id 0..=7 of the GI.
//! - UUIDs (GPU and MIG) are hashes of the spec position and instance ids, so runs repeat.
//!
//! The state file is the JSON of the [`Observed`] snapshot; a simulated apply rewrites it.

use crate::apply::{
    EffectError, FileEffector, GpuEffector, MpsEffector, Observer, OwnerLabels, SliceEffector,
    SlurmEffector, UnitEffector,
};
use crate::observe::{
    ComputeInstance, GpuInstance, GpuState, HostInfo, MigState, MpsSpec, Observed, SliceSpec,
};
use crate::policy::parse::suggest;
use crate::policy::TeamName;
use crate::profiles::{Catalog, GpuModel, Placement};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use thiserror::Error;

/// Host RAM of a simulated host: 2 TiB.
pub const SIM_MEMORY_BYTES: u64 = 2 << 40;
/// CPUs of a simulated host.
pub const SIM_CPUS: u32 = 128;

/// A bad `--simulate` spec or state file.
#[derive(Debug, Error)]
pub enum SimError {
    /// The spec does not parse.
    #[error("bad --simulate spec {spec:?}: {message}")]
    Spec {
        /// The spec as given.
        spec: String,
        /// What is wrong, with the valid names.
        message: String,
    },
    /// The state file cannot be read or written.
    #[error("state file {path}: {message}")]
    State {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

fn valid_names() -> String {
    Catalog::get()
        .models()
        .iter()
        .map(|m| match m.sim_names.split_first() {
            Some((first, rest)) if !rest.is_empty() => format!("{first} (or {})", rest.join(", ")),
            _ => m.sim_name().to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parse a spec into models in GPU order.
pub fn parse_spec(spec: &str) -> Result<Vec<&'static GpuModel>, SimError> {
    let err = |message: String| SimError::Spec {
        spec: spec.to_string(),
        message,
    };
    let mut out = Vec::new();
    for part in spec.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(err("empty entry; write NAME or NAME*COUNT".into()));
        }
        let (name, count) = match part.split_once('*') {
            Some((n, c)) => {
                let c: u32 = c.trim().parse().map_err(|_| {
                    err(format!("count {c:?} in {part:?} is not a positive number"))
                })?;
                (n.trim(), c)
            }
            None => (part, 1),
        };
        if count == 0 || count > 64 {
            return Err(err(format!("count in {part:?} must be 1..=64")));
        }
        let model = Catalog::get().by_sim_name(name).ok_or_else(|| {
            let lower = name.to_ascii_lowercase();
            let help = format!("valid names: {}", valid_names());
            err(format!(
                "unknown GPU model {name:?}; {}",
                suggest(&lower, Catalog::get().sim_names(), help)
            ))
        })?;
        for _ in 0..count {
            out.push(model);
        }
    }
    Ok(out)
}

/// 64-bit FNV-1a followed by a splitmix finaliser: stable across platforms and releases.
fn hash64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

fn uuid(prefix: &str, parts: &[&[u8]]) -> String {
    let a = hash64(parts);
    let b = hash64(&[&a.to_le_bytes(), b"2"]);
    let x = format!("{a:016x}{b:016x}");
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        &x[0..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..32]
    )
}

/// The driver's `/proc/driver/nvidia-caps/mig-minors` layout for GPUs with these minors.
pub fn mig_minors(gpu_minors: &[u32]) -> BTreeMap<String, u32> {
    let mut m = BTreeMap::new();
    m.insert("config".to_string(), 1);
    m.insert("monitor".to_string(), 2);
    let mut n = 3;
    let mut minors = gpu_minors.to_vec();
    minors.sort_unstable();
    for g in minors {
        for gi in 0..=14 {
            m.insert(format!("gpu{g}/gi{gi}/access"), n);
            n += 1;
            for ci in 0..=7 {
                m.insert(format!("gpu{g}/gi{gi}/ci{ci}/access"), n);
                n += 1;
            }
        }
    }
    m
}

/// Build the observed state of a fresh simulated host: MIG off, nothing configured.
pub fn build(spec: &str) -> Result<Observed, SimError> {
    let models = parse_spec(spec)?;
    let gpus: Vec<GpuState> = models
        .iter()
        .enumerate()
        .map(|(i, m)| GpuState {
            index: i as u32,
            uuid: uuid(
                "GPU",
                &[b"gpuctl-sim", &(i as u64).to_le_bytes(), m.key.as_bytes()],
            ),
            name: m.nvml_name.clone(),
            model: Some(m.key.clone()),
            minor: i as u32,
            memory_mib: m.memory_total_mib,
            mig: m.mig_capable().then(MigState::default),
            processes: vec![],
        })
        .collect();
    let minors: Vec<u32> = gpus.iter().map(|g| g.minor).collect();
    Ok(Observed {
        host: HostInfo {
            memory_bytes: SIM_MEMORY_BYTES,
            cpus: SIM_CPUS,
        },
        nvml_unavailable: None,
        mig_minors: mig_minors(&minors),
        gpus,
        ..Default::default()
    })
}

/// A simulated host: the observed snapshot, mutated by the effector calls.
#[derive(Debug, Clone, PartialEq)]
pub struct SimHost {
    /// Current state.
    pub state: Observed,
}

impl SimHost {
    /// A fresh host from a spec.
    pub fn from_spec(spec: &str) -> Result<Self, SimError> {
        Ok(SimHost {
            state: build(spec)?,
        })
    }

    /// Load a state file.
    pub fn load(path: &Path) -> Result<Self, SimError> {
        let err = state_err(path);
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let state = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        Ok(SimHost { state })
    }

    /// Write the state file (atomically, through [`crate::files::write_atomic`]).
    pub fn save(&self, path: &Path) -> Result<(), SimError> {
        let err = state_err(path);
        let text = serde_json::to_string_pretty(&self.state).map_err(|e| err(e.to_string()))?;
        crate::files::write_atomic(path, (text + "\n").as_bytes())
            .map_err(|e| err(e.source.to_string()))
    }

    fn gpu(&mut self, uuid: &str) -> Result<(&mut GpuState, &'static GpuModel), EffectError> {
        let g = self
            .state
            .gpus
            .iter_mut()
            .find(|g| g.uuid == uuid)
            .ok_or_else(|| other(uuid, "no such GPU"))?;
        let m = crate::plan::desired::model_of(g).ok_or_else(|| other(uuid, "unknown model"))?;
        Ok((g, m))
    }
}

fn state_err(path: &Path) -> impl Fn(String) -> SimError + '_ {
    |message| SimError::State {
        path: path.display().to_string(),
        message,
    }
}

fn other(what: &str, message: &str) -> EffectError {
    EffectError::Other {
        what: what.to_string(),
        message: message.to_string(),
    }
}

fn no_room(what: String) -> EffectError {
    EffectError::InsufficientResources { what }
}

/// GI id preference order for a profile occupying `size` of `slices` memory slices.
fn gi_id_pool(slices: u32, size: u32) -> Vec<u32> {
    if slices == 8 && size == 1 {
        return vec![9, 7, 8, 11, 12, 13, 14, 10];
    }
    // Ids number the nodes of the binary tree of slice ranges, level by level.
    let (mut first, mut width) = (0u32, slices);
    while width > size.max(1) {
        first += slices / width;
        width /= 2;
    }
    (first..first + slices / width).collect()
}

fn mig_of<'a>(g: &'a mut GpuState, what: &str) -> Result<&'a mut MigState, EffectError> {
    match &mut g.mig {
        Some(m) if m.current => Ok(m),
        Some(_) => Err(other(what, "MIG mode is off")),
        None => Err(other(what, "GPU cannot do MIG")),
    }
}

/// GPU instance `gi` of `mig`.
fn gi_of<'a>(
    mig: &'a mut MigState,
    gi: u32,
    what: &str,
) -> Result<&'a mut GpuInstance, EffectError> {
    mig.instances
        .iter_mut()
        .find(|i| i.id == gi)
        .ok_or_else(|| other(what, "no such GPU instance"))
}

impl GpuEffector for SimHost {
    fn set_mig_mode(&mut self, gpu: &str, enable: bool) -> Result<bool, EffectError> {
        let (g, m) = self.gpu(gpu)?;
        let busy = !g.processes.is_empty();
        let mig = g
            .mig
            .as_mut()
            .ok_or_else(|| other(gpu, "GPU cannot do MIG"))?;
        if !enable && !mig.instances.is_empty() {
            return Err(EffectError::InUse {
                what: format!("{gpu}: MIG instances exist"),
            });
        }
        if m.enable_requires_gpu_reset {
            mig.pending = enable;
            return Ok(mig.current != mig.pending);
        }
        if busy && mig.current != enable {
            return Err(EffectError::InUse {
                what: format!("{gpu}: processes run"),
            });
        }
        mig.current = enable;
        mig.pending = enable;
        Ok(false)
    }

    fn reset_gpu(&mut self, gpu: &str) -> Result<(), EffectError> {
        let (g, _) = self.gpu(gpu)?;
        let busy = !g.processes.is_empty()
            || g.mig
                .iter()
                .flat_map(|m| &m.instances)
                .any(|gi| gi.compute.iter().any(|c| !c.processes.is_empty()));
        if busy {
            return Err(EffectError::InUse {
                what: format!("{gpu}: processes run"),
            });
        }
        if let Some(m) = &mut g.mig {
            m.current = m.pending;
            m.instances.clear();
        }
        Ok(())
    }

    fn create_gi(
        &mut self,
        gpu: &str,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, EffectError> {
        let (g, m) = self.gpu(gpu)?;
        let what = format!(
            "{gpu} profile {profile_id} @{}+{}",
            placement.start, placement.size
        );
        let p = m
            .gi_profile_by_id(profile_id)
            .ok_or_else(|| other(&what, "no such GPU instance profile"))?;
        if !p.placements.contains(&placement) {
            return Err(other(&what, "not a legal placement for this profile"));
        }
        let mig = mig_of(g, &what)?;
        let present: Vec<_> = mig
            .instances
            .iter()
            .map(|i| (i.profile_id, i.placement))
            .collect();
        if !m.gi_has_room(&present, p, placement) {
            return Err(no_room(what));
        }
        let id = gi_id_pool(m.memory_slices, placement.size)
            .into_iter()
            .chain(0..=14)
            .find(|id| !mig.instances.iter().any(|i| i.id == *id))
            .ok_or_else(|| no_room(what.clone()))?;
        mig.instances.push(GpuInstance {
            id,
            profile_id,
            profile: p.name.clone(),
            placement,
            owner: None,
            compute: vec![],
        });
        mig.instances.sort_by_key(|i| i.id);
        Ok(id)
    }

    fn destroy_gi(&mut self, gpu: &str, gi: u32) -> Result<(), EffectError> {
        let (g, _) = self.gpu(gpu)?;
        let what = format!("{gpu} gi{gi}");
        let mig = mig_of(g, &what)?;
        let pos = mig
            .instances
            .iter()
            .position(|i| i.id == gi)
            .ok_or_else(|| other(&what, "no such GPU instance"))?;
        if !mig.instances[pos].compute.is_empty() {
            return Err(EffectError::InUse { what });
        }
        mig.instances.remove(pos);
        Ok(())
    }

    fn create_ci(
        &mut self,
        gpu: &str,
        gi: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, EffectError> {
        let (g, m) = self.gpu(gpu)?;
        let gpu_uuid = g.uuid.clone();
        let what = format!(
            "{gpu} gi{gi} CI profile {profile_id} @{}+{}",
            placement.start, placement.size
        );
        let inst = gi_of(mig_of(g, &what)?, gi, &what)?;
        let p = m
            .ci_profiles(&inst.profile)
            .iter()
            .find(|c| c.id == profile_id)
            .ok_or_else(|| other(&what, "no such compute instance profile in this GI"))?;
        if !p.placements.contains(&placement) {
            return Err(other(&what, "not a legal placement for this profile"));
        }
        let same = inst
            .compute
            .iter()
            .filter(|c| c.profile_id == profile_id)
            .count() as u32;
        if inst
            .compute
            .iter()
            .any(|c| c.placement.overlaps(&placement))
            || same >= p.instance_count
        {
            return Err(no_room(what));
        }
        let id = (0..=7)
            .find(|id| !inst.compute.iter().any(|c| c.id == *id))
            .ok_or_else(|| no_room(what.clone()))?;
        inst.compute.push(ComputeInstance {
            id,
            profile_id,
            profile: p.name.clone(),
            placement,
            uuid: uuid(
                "MIG",
                &[gpu_uuid.as_bytes(), &gi.to_le_bytes(), &id.to_le_bytes()],
            ),
            processes: vec![],
        });
        inst.compute.sort_by_key(|c| c.id);
        Ok(id)
    }

    fn destroy_ci(&mut self, gpu: &str, gi: u32, ci: u32) -> Result<(), EffectError> {
        let (g, _) = self.gpu(gpu)?;
        let what = format!("{gpu} gi{gi} ci{ci}");
        let inst = gi_of(mig_of(g, &what)?, gi, &what)?;
        let pos = inst
            .compute
            .iter()
            .position(|c| c.id == ci)
            .ok_or_else(|| other(&what, "no such compute instance"))?;
        if !inst.compute[pos].processes.is_empty() {
            return Err(EffectError::InUse { what });
        }
        inst.compute.remove(pos);
        Ok(())
    }
}

impl Observer for SimHost {
    fn observe(&mut self) -> Result<Observed, EffectError> {
        Ok(self.state.clone())
    }
}

impl OwnerLabels for SimHost {
    fn set_owner(&mut self, gpu: &str, gi: u32, owner: &str) -> Result<(), EffectError> {
        let (g, _) = self.gpu(gpu)?;
        let what = format!("{gpu} gi{gi}");
        let inst = gi_of(mig_of(g, &what)?, gi, &what)?;
        inst.owner = Some(owner.to_string());
        Ok(())
    }
}

impl UnitEffector for SimHost {
    /// Stopping a unit ends its processes everywhere on the host.
    fn stop_units(&mut self, units: &[String], _timeout: Duration) -> Result<(), EffectError> {
        let gone =
            |p: &crate::observe::GpuProcess| p.unit.as_ref().is_some_and(|u| units.contains(u));
        for g in &mut self.state.gpus {
            g.processes.retain(|p| !gone(p));
            let instances = g.mig.iter_mut().flat_map(|m| m.instances.iter_mut());
            for c in instances.flat_map(|gi| gi.compute.iter_mut()) {
                c.processes.retain(|p| !gone(p));
            }
        }
        Ok(())
    }

    /// Started units get no GPU processes in the simulation: which device they open is up to
    /// them.
    fn start_units(&mut self, _units: &[String]) -> Result<(), EffectError> {
        Ok(())
    }
}

impl SliceEffector for SimHost {
    fn set_slice(&mut self, team: &TeamName, spec: &SliceSpec) -> Result<(), EffectError> {
        self.state.slices.insert(team.clone(), spec.clone());
        Ok(())
    }
    fn remove_slice(&mut self, team: &TeamName) -> Result<(), EffectError> {
        self.state.slices.remove(team);
        Ok(())
    }
    fn set_fence(&mut self, slice: &str, fence: &crate::observe::Fence) -> Result<(), EffectError> {
        self.state.fences.insert(slice.to_string(), fence.clone());
        Ok(())
    }
}

impl MpsEffector for SimHost {
    fn start_mps(&mut self, instance: &str, spec: &MpsSpec) -> Result<(), EffectError> {
        self.state.mps.insert(instance.to_string(), spec.clone());
        Ok(())
    }
    fn stop_mps(&mut self, instance: &str) -> Result<(), EffectError> {
        self.state.mps.remove(instance);
        Ok(())
    }
}

/// Slurm as the planner sees it: the node's drain flag and reason, the GRES file. A host
/// without `state.slurm` has no Slurm, and every call fails.
impl SlurmEffector for SimHost {
    fn drain_node(&mut self, node: &str, reason: &str) -> Result<(), EffectError> {
        let n = self.slurm_node(node)?;
        n.drain = true;
        n.reason = Some(reason.to_string());
        Ok(())
    }
    fn resume_node(&mut self, node: &str) -> Result<(), EffectError> {
        let n = self.slurm_node(node)?;
        n.drain = false;
        n.reason = None;
        Ok(())
    }
    fn write_gres(&mut self, path: &std::path::Path, content: &str) -> Result<(), EffectError> {
        let s = self
            .state
            .slurm
            .as_mut()
            .ok_or_else(|| no_slurm(&path.display().to_string()))?;
        // The simulated host knows no policy paths: the node file is the one that sets
        // NodeName=DEFAULT, the GRES file the other.
        if content.contains("\nNodeName=DEFAULT ") {
            s.node_file = Some(content.to_string());
        } else {
            s.gres_file = Some(content.to_string());
        }
        Ok(())
    }
    fn reload_slurm(&mut self, _restart: &[String]) -> Result<(), EffectError> {
        self.state
            .slurm
            .as_ref()
            .map(|_| ())
            .ok_or_else(|| no_slurm("scontrol reconfigure"))
    }
}

fn no_slurm(what: &str) -> EffectError {
    EffectError::Other {
        what: what.to_string(),
        message: "the simulated host has no Slurm".into(),
    }
}

impl SimHost {
    fn slurm_node(&mut self, node: &str) -> Result<&mut crate::observe::SlurmNode, EffectError> {
        match self.state.slurm.as_mut().map(|s| s.node.as_mut()) {
            Some(Ok(n)) if n.name == node => Ok(n),
            _ => Err(no_slurm(node)),
        }
    }
}

impl FileEffector for SimHost {
    fn write_env(&mut self, team: &TeamName, content: &str) -> Result<(), EffectError> {
        self.state.env_files.insert(team.clone(), content.into());
        Ok(())
    }
    fn remove_env(&mut self, team: &TeamName) -> Result<(), EffectError> {
        self.state.env_files.remove(team);
        Ok(())
    }
    fn write_cdi(
        &mut self,
        team: &TeamName,
        content: &str,
        readers: &[String],
    ) -> Result<(), EffectError> {
        self.state.cdi_specs.insert(team.clone(), content.into());
        self.state
            .cdi_readers
            .insert(team.clone(), readers.to_vec());
        Ok(())
    }
    fn remove_cdi(&mut self, team: &TeamName) -> Result<(), EffectError> {
        self.state.cdi_specs.remove(team);
        self.state.cdi_readers.remove(team);
        Ok(())
    }
    fn create_cap_nodes(&mut self, minors: &[u32]) -> Result<(), EffectError> {
        self.state.cap_nodes.extend(minors.iter().copied());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        let m = parse_spec("a100-40gb*4, h200*2").unwrap();
        assert_eq!(m.len(), 6);
        assert_eq!(m[0].key, "A100-SXM4-40GB");
        assert_eq!(m[5].key, "H200-141GB");
        assert_eq!(parse_spec("h100-80gb").unwrap().len(), 1);
        // The fake NVML's short names, in any case.
        assert_eq!(parse_spec("H100*2").unwrap()[1].key, "H100-SXM5-80GB");
        assert_eq!(parse_spec("a800").unwrap()[0].key, "A800-SXM4-80GB");
        assert_eq!(parse_spec("h800-80gb*8").unwrap().len(), 8);
        let e = parse_spec("h800-80g*2").unwrap_err().to_string();
        assert!(e.contains("did you mean 'h800-80gb'?"), "{e}");
        assert!(e.contains("b200") && e.contains("a30"), "{e}");
        let e = parse_spec("zzz").unwrap_err().to_string();
        assert!(
            !e.contains("did you mean") && e.contains("valid names: "),
            "{e}"
        );
        assert!(parse_spec("h200*0").is_err());
        assert!(parse_spec("h200*x").is_err());
        assert!(parse_spec("h200,,a30").is_err());
    }

    #[test]
    fn build_is_deterministic_and_distinct() {
        let a = build("h100-80gb*2,l40s").unwrap();
        assert_eq!(a, build("h100-80gb*2,l40s").unwrap());
        assert_ne!(a.gpus[0].uuid, a.gpus[1].uuid);
        assert!(a.gpus[0].uuid.starts_with("GPU-") && a.gpus[0].uuid.len() == 40);
        assert!(a.gpus[2].mig.is_none());
        assert_eq!(a.mig_minors["config"], 1);
        assert_eq!(a.mig_minors["gpu0/gi0/access"], 3);
        assert_eq!(a.mig_minors["gpu0/gi0/ci0/access"], 4);
        assert_eq!(a.mig_minors["gpu0/gi1/access"], 12);
        assert_eq!(a.mig_minors["gpu1/gi0/access"], 3 + 135);
    }

    #[test]
    fn gi_ids_follow_the_driver() {
        let mut h = SimHost::from_spec("h100-80gb").unwrap();
        let g = h.state.gpus[0].uuid.clone();
        h.set_mig_mode(&g, true).unwrap();
        let ids: Vec<u32> = (0..7)
            .map(|s| h.create_gi(&g, 19, Placement::new(s, 1)).unwrap())
            .collect();
        assert_eq!(ids, vec![9, 7, 8, 11, 12, 13, 14]);
        assert!(matches!(
            h.create_gi(&g, 19, Placement::new(0, 1)),
            Err(EffectError::InsufficientResources { .. })
        ));
        assert_eq!(gi_id_pool(8, 8), vec![0]);
        assert_eq!(gi_id_pool(8, 4), vec![1, 2]);
        assert_eq!(gi_id_pool(8, 2), vec![3, 4, 5, 6]);
        assert_eq!(gi_id_pool(4, 1), vec![3, 4, 5, 6]);
    }

    #[test]
    fn a100_mode_is_pending_until_reset_and_busy_things_refuse() {
        let mut h = SimHost::from_spec("a100-40gb").unwrap();
        let g = h.state.gpus[0].uuid.clone();
        assert!(h.set_mig_mode(&g, true).unwrap());
        assert!(h.create_gi(&g, 9, Placement::new(0, 4)).is_err());
        h.reset_gpu(&g).unwrap();
        let gi = h.create_gi(&g, 9, Placement::new(0, 4)).unwrap();
        let ci = h.create_ci(&g, gi, 2, Placement::new(0, 3)).unwrap();
        assert!(matches!(
            h.destroy_gi(&g, gi),
            Err(EffectError::InUse { .. })
        ));
        h.state.gpus[0].mig.as_mut().unwrap().instances[0].compute[0]
            .processes
            .push(crate::observe::GpuProcess {
                pid: 7,
                used_memory: 0,
                unit: Some("x.service".into()),
                cgroup: None,
            });
        assert!(matches!(
            h.destroy_ci(&g, gi, ci),
            Err(EffectError::InUse { .. })
        ));
        assert!(matches!(h.reset_gpu(&g), Err(EffectError::InUse { .. })));
        h.stop_units(&["x.service".into()], Duration::ZERO).unwrap();
        h.destroy_ci(&g, gi, ci).unwrap();
        h.destroy_gi(&g, gi).unwrap();
    }
}
