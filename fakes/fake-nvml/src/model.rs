//! GPU models the fake can impersonate: the MIG models from the reference file
//! (`data/gpu-profiles.json`, embedded at build time) plus built-in non-MIG models.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, OnceLock};

const REFERENCE_JSON: &str = include_str!("../../../data/gpu-profiles.json");

/// A `{start, size}` placement in memory slices (GI) or compute slices (CI).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Span {
    /// First slice.
    pub start: u32,
    /// Number of slices.
    pub size: u32,
}

impl Span {
    /// Whether two spans share a slice.
    pub fn overlaps(&self, other: &Span) -> bool {
        self.start < other.start + other.size && other.start < self.start + self.size
    }
}

/// A GPU-instance profile as the driver publishes it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GiProfile {
    /// Profile name without the `MIG ` prefix, e.g. `1g.10gb`.
    pub name: String,
    /// `NVML_GPU_INSTANCE_PROFILE_*` index accepted by `nvmlDeviceGetGpuInstanceProfileInfo`.
    pub nvml_profile_index: u32,
    /// Published profile ID taken by every other GI call.
    pub profile_id: u32,
    /// Compute slices.
    pub slice_count: u32,
    /// Maximum number of instances of this profile.
    pub instance_count: u32,
    /// SMs.
    pub multiprocessor_count: u32,
    /// Copy engines.
    pub copy_engine_count: u32,
    /// Decoders.
    pub decoder_count: u32,
    /// Encoders.
    pub encoder_count: u32,
    /// JPEG engines.
    pub jpeg_count: u32,
    /// OFA engines.
    pub ofa_count: u32,
    /// Memory in MiB.
    pub memory_size_mb: u64,
    /// Valid placements in memory slices.
    pub placements: Vec<Span>,
}

/// A compute-instance profile valid inside one GI profile.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CiProfile {
    /// Name without `MIG ` prefix, e.g. `1c.3g.20gb`.
    pub name: String,
    /// `NVML_COMPUTE_INSTANCE_PROFILE_*` index.
    pub nvml_profile_index: u32,
    /// Published ID (equal to the index on every observed driver).
    pub profile_id: u32,
    /// Compute slices.
    pub slice_count: u32,
    /// Maximum instances inside one GI.
    pub instance_count: u32,
    /// SMs.
    pub multiprocessor_count: u32,
    /// Placements in the GI's compute slices.
    pub placements: Vec<Span>,
}

/// MIG capabilities of a model.
#[derive(Debug, Clone)]
pub struct MigModel {
    /// Memory slices (8 or 4); GI placements and GI ids are expressed in these.
    pub memory_slices: u32,
    /// `nvmlDeviceGetMaxMigDeviceCount`.
    pub max_mig_device_count: u32,
    /// Whether a mode change needs a GPU reset (Ampere) rather than applying at once (Hopper).
    pub enable_requires_gpu_reset: bool,
    /// GI profiles.
    pub gi_profiles: Vec<GiProfile>,
    /// CI profiles by GI profile name.
    pub ci_profiles_by_gi: BTreeMap<String, Vec<CiProfile>>,
}

/// One GPU model.
#[derive(Debug, Clone)]
pub struct Model {
    /// Key used in the state file (`H100-SXM5-80GB`).
    pub key: String,
    /// `nvmlDeviceGetName`.
    pub nvml_name: String,
    /// PCI device id word (`0x233010DE`).
    pub pci_device_id: u32,
    /// Framebuffer in MiB.
    pub memory_total_mib: u64,
    /// `None` for GPUs without MIG.
    pub mig: Option<MigModel>,
    /// Short names accepted in `FAKE_NVML_SPEC` besides the key (the reference file's
    /// `sim_names`, which `gpuctl --simulate` takes too).
    pub aliases: Vec<String>,
}

impl MigModel {
    /// GI profile by published ID.
    pub fn gi_by_id(&self, id: u32) -> Option<&GiProfile> {
        self.gi_profiles.iter().find(|p| p.profile_id == id)
    }
    /// GI profile by `NVML_GPU_INSTANCE_PROFILE_*` index.
    pub fn gi_by_index(&self, index: u32) -> Option<&GiProfile> {
        self.gi_profiles
            .iter()
            .find(|p| p.nvml_profile_index == index)
    }
    /// CI profiles usable in a GI of profile `gi_profile_id`.
    pub fn ci_profiles(&self, gi_profile_id: u32) -> &[CiProfile] {
        self.gi_by_id(gi_profile_id)
            .and_then(|g| self.ci_profiles_by_gi.get(&g.name))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
}

#[derive(Deserialize)]
struct RefFile {
    gpus: BTreeMap<String, ModelDef>,
}

/// A model definition in the reference file's schema (`data/gpu-profiles.json`, one entry of
/// `gpus`). A state file may carry its own under `models` (a recorded host, a tampered table);
/// keys the reference file has for documentation only are ignored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelDef {
    /// `nvmlDeviceGetName`.
    pub nvml_name: String,
    /// PCI device ids (`"0x233010DE"`, optionally followed by words); the first is reported.
    #[serde(default)]
    pub pci_device_ids: Vec<String>,
    /// Framebuffer in MiB.
    pub memory_total_mib: u64,
    /// Short names (`h100`, `a800`), shared with `gpuctl --simulate`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sim_names: Vec<String>,
    /// Whether the GPU can do MIG at all; absent means "has GI profiles".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_capable: Option<bool>,
    /// Memory slices (8 or 4).
    #[serde(default)]
    pub memory_slices: u32,
    /// `nvmlDeviceGetMaxMigDeviceCount`.
    #[serde(default)]
    pub max_mig_device_count: u32,
    /// Whether a MIG mode change needs a GPU reset.
    #[serde(default)]
    pub enable_requires_gpu_reset: bool,
    /// GI profiles.
    #[serde(default)]
    pub gi_profiles: Vec<GiProfile>,
    /// CI profiles by GI profile name.
    #[serde(default)]
    pub ci_profiles_by_gi: BTreeMap<String, Vec<CiProfile>>,
}

impl ModelDef {
    /// The model this definition describes, under `key`.
    pub fn to_model(&self, key: &str) -> Model {
        let mig_capable = self.mig_capable.unwrap_or(!self.gi_profiles.is_empty());
        Model {
            key: key.to_string(),
            nvml_name: self.nvml_name.clone(),
            pci_device_id: self.pci_device_ids.first().map_or(0, |s| parse_pci_id(s)),
            memory_total_mib: self.memory_total_mib,
            aliases: self.sim_names.clone(),
            mig: mig_capable.then(|| MigModel {
                memory_slices: self.memory_slices,
                max_mig_device_count: self.max_mig_device_count,
                enable_requires_gpu_reset: self.enable_requires_gpu_reset,
                gi_profiles: self.gi_profiles.clone(),
                ci_profiles_by_gi: self.ci_profiles_by_gi.clone(),
            }),
        }
    }
}

/// A model defined in a state file, made `'static` like the built-in ones. Every call re-reads
/// the state, so definitions are interned: each distinct (key, definition) is leaked once, and
/// the memory held is bounded by the number of distinct definitions a process ever sees.
pub fn intern_model(key: &str, def: &ModelDef) -> &'static Model {
    static INTERNED: OnceLock<Mutex<HashMap<String, &'static Model>>> = OnceLock::new();
    let id = format!(
        "{key}\0{}",
        serde_json::to_string(def).expect("model definition serializes")
    );
    let mut map = INTERNED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    map.entry(id)
        .or_insert_with(|| Box::leak(Box::new(def.to_model(key))))
}

fn parse_pci_id(s: &str) -> u32 {
    let hex = s.split_whitespace().next().unwrap_or("0");
    u32::from_str_radix(hex.trim_start_matches("0x"), 16).unwrap_or(0)
}

/// All models, MIG ones from the reference file first.
pub fn models() -> &'static [Model] {
    static MODELS: OnceLock<Vec<Model>> = OnceLock::new();
    MODELS.get_or_init(|| {
        let file: RefFile =
            serde_json::from_str(REFERENCE_JSON).expect("embedded gpu-profiles.json parses");
        let mut out: Vec<Model> = file.gpus.iter().map(|(key, g)| g.to_model(key)).collect();
        // Non-MIG models are not in the reference file; values from nvidia-smi on L40S.
        out.push(Model {
            key: "L40S".into(),
            nvml_name: "NVIDIA L40S".into(),
            pci_device_id: 0x26B5_10DE,
            memory_total_mib: 46068,
            mig: None,
            aliases: vec!["l40s".into()],
        });
        out
    })
}

/// Finds a model by key or by one of its short names (the reference file's `sim_names`),
/// case-insensitively.
pub fn find_model(name: &str) -> Option<&'static Model> {
    let n = name.trim();
    models().iter().find(|m| {
        m.key.eq_ignore_ascii_case(n) || m.aliases.iter().any(|a| a.eq_ignore_ascii_case(n))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_models_load_with_index_distinct_from_id() {
        let a100 = find_model("a100-40gb").unwrap();
        let mig = a100.mig.as_ref().unwrap();
        let p = mig.gi_by_index(0).unwrap();
        assert_eq!((p.name.as_str(), p.profile_id), ("1g.5gb", 19));
        assert_eq!(mig.gi_by_id(0).unwrap().name, "7g.40gb");
        assert!(!mig.ci_profiles(9).is_empty());
        assert!(find_model("l40s").unwrap().mig.is_none());
        assert!(find_model("H100-SXM5-80GB").is_some());
        assert!(find_model("nope").is_none());
        assert_eq!(find_model("h800").unwrap().key, "H800-SXM5-80GB");
        assert_eq!(find_model("A800").unwrap().key, "A800-SXM4-80GB");
    }
}
