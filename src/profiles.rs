//! MIG reference data: GPU models, GPU-instance and compute-instance profiles and their legal
//! placements.
//!
//! The data is `data/gpu-profiles.json`, a copy of the project's reference file, compiled into the
//! binary so that validation and simulation work on hosts without a driver. NVML's profile
//! *index* (the `NVML_GPU_INSTANCE_PROFILE_*` constant) and the published profile *ID* differ; both
//! are kept, and every other GI call takes the ID.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// A placement in slices: memory slices for GPU instances, compute slices for compute instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// First slice.
    pub start: u32,
    /// Number of slices occupied.
    pub size: u32,
}

impl Placement {
    /// `size` slices from `start`.
    pub const fn new(start: u32, size: u32) -> Self {
        Placement { start, size }
    }

    /// Whether two placements share a slice.
    pub fn overlaps(&self, other: &Placement) -> bool {
        self.start < other.start + other.size && other.start < self.start + self.size
    }

    /// Slices as a bit mask (bit `i` set when slice `i` is occupied).
    pub fn mask(&self) -> u32 {
        ((1u64 << self.size) - 1) as u32 * (1 << self.start)
    }
}

/// A GPU-instance profile as `nvmlDeviceGetGpuInstanceProfileInfo` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GiProfile {
    /// Name as nvidia-smi prints it, e.g. `3g.40gb` or `1g.10gb+me`.
    pub name: String,
    /// NVML profile index (`NVML_GPU_INSTANCE_PROFILE_*`), the argument of the profile-info call.
    #[serde(rename = "nvml_profile_index")]
    pub index: u32,
    /// Published profile ID, taken by every other GI call.
    #[serde(rename = "profile_id")]
    pub id: u32,
    /// Compute slices.
    pub slice_count: u32,
    /// How many instances of this profile the GPU can hold.
    pub instance_count: u32,
    /// Streaming multiprocessors.
    pub multiprocessor_count: u32,
    /// Copy engines.
    #[serde(default)]
    pub copy_engine_count: u32,
    /// Video decoders.
    #[serde(default)]
    pub decoder_count: u32,
    /// Video encoders.
    #[serde(default)]
    pub encoder_count: u32,
    /// JPEG engines.
    #[serde(default)]
    pub jpeg_count: u32,
    /// Optical-flow accelerators.
    #[serde(default)]
    pub ofa_count: u32,
    /// Memory in MiB.
    pub memory_size_mb: u64,
    /// Legal placements in memory slices.
    pub placements: Vec<Placement>,
}

impl GiProfile {
    /// Memory slices one instance occupies (all placements of a profile have the same size).
    pub fn memory_slices(&self) -> u32 {
        self.placements.first().map(|p| p.size).unwrap_or(0)
    }
}

/// A compute-instance profile inside a GPU instance of a given profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CiProfile {
    /// Name as nvidia-smi prints it: `1c.3g.40gb`, or the GI name for the full-size CI.
    pub name: String,
    /// NVML profile index (`NVML_COMPUTE_INSTANCE_PROFILE_*`); equal to the ID on real drivers.
    #[serde(rename = "nvml_profile_index")]
    pub index: u32,
    /// Profile ID.
    #[serde(rename = "profile_id")]
    pub id: u32,
    /// Compute slices.
    pub slice_count: u32,
    /// How many instances fit in the GI.
    pub instance_count: u32,
    /// Streaming multiprocessors.
    pub multiprocessor_count: u32,
    /// Legal placements in compute slices of the GI.
    pub placements: Vec<Placement>,
}

impl CiProfile {
    /// The short name used in policies: `1c`, `2c`, … for a split, or the full GI name.
    pub fn short_name(&self) -> &str {
        match self.name.split_once('.') {
            Some((head, _)) if head.ends_with('c') => head,
            _ => &self.name,
        }
    }
}

/// One GPU model.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuModel {
    /// Key in the reference file, e.g. `H100-SXM5-80GB`.
    #[serde(skip_deserializing)]
    pub key: String,
    /// Name NVML reports, e.g. `NVIDIA H100 80GB HBM3`.
    pub nvml_name: String,
    /// PCI device IDs (`0x233010DE`, as mig-parted's `device-filter` writes them), each maybe
    /// followed by a note in parentheses (`0x20F110DE (PCIE-40GB)`).
    #[serde(default)]
    pub pci_device_ids: Vec<String>,
    /// `--simulate` names (and the fake NVML's `FAKE_NVML_SPEC` names): the canonical one
    /// first, then aliases.
    #[serde(default)]
    pub sim_names: Vec<String>,
    /// Framebuffer in MiB outside MIG.
    pub memory_total_mib: u64,
    /// SMs outside MIG.
    #[serde(rename = "sm_total_non_mig", default)]
    pub sm_total: u32,
    /// Memory slices (0 when the model has no MIG).
    #[serde(default)]
    pub memory_slices: u32,
    /// Compute slices (0 when the model has no MIG).
    #[serde(default)]
    pub compute_slices: u32,
    /// Most MIG devices the GPU can hold.
    #[serde(default)]
    pub max_mig_device_count: u32,
    /// Whether MIG mode survives a reboot.
    #[serde(default)]
    pub mig_mode_persistent_across_reboot: bool,
    /// Whether enabling MIG stays pending until a GPU reset (Ampere) or takes effect at once.
    #[serde(default)]
    pub enable_requires_gpu_reset: bool,
    /// Values of this entry no driver recording confirms (the reference file's `unverified`);
    /// `doctor` names them next to any difference it finds.
    #[serde(default)]
    pub unverified: Vec<String>,
    /// GPU-instance profiles, empty when the model has no MIG.
    #[serde(default)]
    pub gi_profiles: Vec<GiProfile>,
    /// Compute-instance profiles keyed by GI profile name.
    #[serde(default)]
    pub ci_profiles_by_gi: BTreeMap<String, Vec<CiProfile>>,
    /// Names earlier releases gave this model's profiles (mig-parted kept GB200's first
    /// names), each to the profile of the same shape that the model has now.
    #[serde(default)]
    pub former_profile_names: BTreeMap<String, String>,
}

impl GpuModel {
    /// Whether the model supports MIG at all.
    pub fn mig_capable(&self) -> bool {
        !self.gi_profiles.is_empty()
    }

    /// GI profile by name (`3g.40gb`).
    pub fn gi_profile(&self, name: &str) -> Option<&GiProfile> {
        self.gi_profiles.iter().find(|p| p.name == name)
    }

    /// GI profile by published ID.
    pub fn gi_profile_by_id(&self, id: u32) -> Option<&GiProfile> {
        self.gi_profiles.iter().find(|p| p.id == id)
    }

    /// Whether the driver has room for a GI of profile `p` at `at` next to the `present`
    /// instances (profile id, placement): no overlap, the compute-slice budget, and the
    /// profile's and the GPU's instance limits (a GPU limit of 0: none).
    pub fn gi_has_room(&self, present: &[(u32, Placement)], p: &GiProfile, at: Placement) -> bool {
        let used: u32 = present
            .iter()
            .filter_map(|(id, _)| self.gi_profile_by_id(*id))
            .map(|q| q.slice_count)
            .sum();
        let same = present.iter().filter(|(id, _)| *id == p.id).count() as u32;
        let max = self.max_mig_device_count;
        !present.iter().any(|(_, q)| q.overlaps(&at))
            && used + p.slice_count <= self.compute_slices
            && same < p.instance_count
            && (max == 0 || (present.len() as u32) < max)
    }

    /// CI profiles available inside a GI of the given profile.
    pub fn ci_profiles(&self, gi_profile: &str) -> &[CiProfile] {
        self.ci_profiles_by_gi
            .get(gi_profile)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The CI profile spanning the whole GI (its name equals the GI's name).
    pub fn full_ci_profile(&self, gi_profile: &str) -> Option<&CiProfile> {
        self.ci_profiles(gi_profile)
            .iter()
            .find(|c| c.name == gi_profile)
    }

    /// A CI profile inside `gi_profile` by short name (`1c`, `2c`, or the GI name).
    pub fn ci_profile(&self, gi_profile: &str, short: &str) -> Option<&CiProfile> {
        let cis = self.ci_profiles(gi_profile);
        // The GI name itself means the full-size CI; `Nc` means the split of N slices whose name
        // is `Nc.<gi>`. On Hopper two 1-slice profiles exist in 1g GIs; the full one wins.
        cis.iter()
            .find(|c| c.name == short && short == gi_profile)
            .or_else(|| cis.iter().find(|c| c.short_name() == short))
            .or_else(|| {
                let slices: u32 = short.strip_suffix('c')?.parse().ok()?;
                self.full_ci_profile(gi_profile)
                    .filter(|c| c.slice_count == slices)
            })
    }

    /// The canonical `--simulate` name (`h100-80gb`).
    pub fn sim_name(&self) -> &str {
        self.sim_names.first().map_or("unknown", String::as_str)
    }

    /// The model whose profile was once called `former`, and that profile's name now.
    pub fn renamed(former: &str) -> Option<(&'static GpuModel, &'static str)> {
        Catalog::get().models().iter().find_map(|m| {
            m.former_profile_names
                .get(former)
                .map(|now| (m, now.as_str()))
        })
    }

    /// The models that offer a GI profile of this name, in catalog order.
    pub fn offering(profile: &str) -> Vec<&'static GpuModel> {
        Catalog::get()
            .models()
            .iter()
            .filter(|m| m.gi_profile(profile).is_some())
            .collect()
    }
}

/// All known GPU models.
#[derive(Debug)]
pub struct Catalog {
    models: Vec<GpuModel>,
}

#[derive(Deserialize)]
struct RefFile {
    gpus: BTreeMap<String, GpuModel>,
}

/// A static, not a const: one copy at one address, the one parsed and then released.
static REFERENCE_JSON: &str = include_str!("../data/gpu-profiles.json");

/// Hand the pages of `bytes`, static read-only data read for the last time, back to the kernel
/// (`MADV_PAGEOUT`). The reference JSON is a few hundred kB of the binary, parsed once; without
/// this its pages stay in a long-running gpuctld's resident set for nothing. Contents never
/// change: a later read faults the same bytes back from the binary. A kernel without
/// `MADV_PAGEOUT` (before 5.4) refuses the hint, which changes nothing.
fn release_pages(bytes: &'static [u8]) {
    #[cfg(target_os = "linux")]
    {
        use nix::libc;
        // SAFETY: sysconf reads a constant of the system.
        let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            p if p > 0 => p as usize,
            _ => return,
        };
        let (at, len) = (bytes.as_ptr() as usize, bytes.len());
        let (start, end) = (at.next_multiple_of(page), (at + len) / page * page);
        if end > start {
            // SAFETY: whole pages inside a static's bytes, which nothing writes; MADV_PAGEOUT
            // only reclaims them (it never changes what a later read sees), and its result is
            // a hint's.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT);
            }
        }
    }
}

impl Catalog {
    /// The compiled-in catalog.
    pub fn get() -> &'static Catalog {
        static CATALOG: OnceLock<Catalog> = OnceLock::new();
        CATALOG.get_or_init(|| {
            let file: RefFile = serde_json::from_str(REFERENCE_JSON)
                .expect("data/gpu-profiles.json is compiled in and checked by tests");
            release_pages(REFERENCE_JSON.as_bytes());
            let mut models: Vec<GpuModel> = file
                .gpus
                .into_iter()
                .map(|(key, mut m)| {
                    m.key = key;
                    m
                })
                .collect();
            // One model without MIG, so that "not MIG capable" paths are exercised. Data from
            // NVIDIA's L40S datasheet (48 GB GDDR6, 142 SMs); not in the reference file.
            models.push(GpuModel {
                key: "L40S-48GB".into(),
                nvml_name: "NVIDIA L40S".into(),
                memory_total_mib: 46068,
                sm_total: 142,
                sim_names: vec!["l40s".into()],
                ..Default::default()
            });
            Catalog { models }
        })
    }

    /// Every model.
    pub fn models(&self) -> &[GpuModel] {
        &self.models
    }

    /// Model by reference key (`H100-SXM5-80GB`).
    pub fn by_key(&self, key: &str) -> Option<&GpuModel> {
        self.models.iter().find(|m| m.key == key)
    }

    /// Model by `--simulate` name or alias (`h100-80gb`, `h100`), case-insensitive.
    pub fn by_sim_name(&self, name: &str) -> Option<&GpuModel> {
        self.models
            .iter()
            .find(|m| m.sim_names.iter().any(|n| n.eq_ignore_ascii_case(name)))
    }

    /// Every `--simulate` name, aliases included, in catalog order.
    pub fn sim_names(&self) -> impl Iterator<Item = &str> {
        self.models
            .iter()
            .flat_map(|m| m.sim_names.iter().map(String::as_str))
    }

    /// Model by the name NVML reports.
    pub fn by_nvml_name(&self, name: &str) -> Option<&GpuModel> {
        self.models.iter().find(|m| m.nvml_name == name)
    }

    /// The model with this PCI device ID (`0x20B010DE`, case-insensitive).
    pub fn by_pci_device_id(&self, id: &str) -> Option<&GpuModel> {
        self.models.iter().find(|m| {
            m.pci_device_ids.iter().any(|p| {
                p.split_whitespace()
                    .next()
                    .is_some_and(|p| p.eq_ignore_ascii_case(id))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Once parsed, the reference text's pages are out of the process's resident set
    /// (`/proc/self/pagemap`'s "present" bit), save a few a neighbour's read may map back.
    #[test]
    #[cfg(target_os = "linux")]
    fn the_reference_text_leaves_the_resident_set_once_parsed() {
        use std::io::{Read, Seek, SeekFrom};
        assert!(!Catalog::get().models().is_empty());
        let page = 4096;
        let at = REFERENCE_JSON.as_ptr() as usize;
        let (first, last) = (at / page + 1, (at + REFERENCE_JSON.len()) / page);
        let mut map = std::fs::File::open("/proc/self/pagemap").unwrap();
        map.seek(SeekFrom::Start(first as u64 * 8)).unwrap();
        let mut raw = vec![0u8; (last - first) * 8];
        map.read_exact(&mut raw).unwrap();
        let present = raw
            .chunks(8)
            .filter(|e| u64::from_le_bytes((*e).try_into().unwrap()) >> 63 == 1)
            .count();
        let pages = last - first;
        assert!(pages > 50, "{pages} pages");
        assert!(
            present * 5 < pages,
            "{present} of the reference text's {pages} pages still resident"
        );
    }

    #[test]
    fn every_sim_name_resolves_to_its_own_model_and_every_model_has_one() {
        let c = Catalog::get();
        for m in c.models() {
            assert_ne!(m.sim_name(), "unknown", "{} has no sim name", m.key);
            for n in &m.sim_names {
                assert_eq!(
                    c.by_sim_name(n).map(|x| x.key.as_str()),
                    Some(m.key.as_str())
                );
                assert_eq!(c.by_sim_name(&n.to_uppercase()).unwrap().key, m.key);
            }
        }
        let names: Vec<&str> = c.sim_names().collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "a sim name names two models");
        assert_eq!(c.by_sim_name("h800").unwrap().key, "H800-SXM5-80GB");
    }

    #[test]
    fn index_and_id_differ_as_published() {
        let h100 = Catalog::get().by_key("H100-SXM5-80GB").unwrap();
        let p = h100.gi_profile("1g.10gb").unwrap();
        assert_eq!((p.index, p.id), (0, 19));
        let p = h100.gi_profile("7g.80gb").unwrap();
        assert_eq!((p.index, p.id, p.memory_slices()), (4, 0, 8));
        let p = h100.gi_profile("3g.40gb").unwrap();
        assert_eq!((p.slice_count, p.memory_slices()), (3, 4));
    }

    #[test]
    fn ci_short_names() {
        let a100 = Catalog::get().by_key("A100-SXM4-40GB").unwrap();
        assert_eq!(a100.ci_profile("3g.20gb", "1c").unwrap().slice_count, 1);
        assert_eq!(a100.ci_profile("3g.20gb", "2c").unwrap().id, 1);
        assert_eq!(a100.ci_profile("3g.20gb", "3g.20gb").unwrap().id, 2);
        assert_eq!(a100.ci_profile("3g.20gb", "3c").unwrap().id, 2);
        assert!(a100.ci_profile("3g.20gb", "4c").is_none());
        let h100 = Catalog::get().by_key("H100-SXM5-80GB").unwrap();
        assert_eq!(h100.full_ci_profile("1g.20gb").unwrap().id, 7);
    }

    #[test]
    fn placement_overlap_and_mask() {
        let a = Placement { start: 0, size: 4 };
        let b = Placement { start: 4, size: 4 };
        assert!(!a.overlaps(&b));
        assert!(a.overlaps(&Placement { start: 3, size: 1 }));
        assert_eq!(a.mask(), 0b1111);
        assert_eq!(b.mask(), 0b1111_0000);
    }
}
