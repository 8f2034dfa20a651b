//! The driver's MIG profile tables against the reference data (`data/gpu-profiles.json`), field
//! by field, every difference named. Pure: no I/O.
//!
//! Severity follows what gpuctl does with a field: ids, indices, names, slice and instance
//! counts and placements drive validation and the placement search, so a difference there is
//! a FAIL (a plan could ask the driver for something it does not offer); SM, engine and memory
//! figures are only shown to people, so a difference there is a WARN.

use crate::profiles::{CiProfile, GiProfile, GpuModel, Placement};

/// Where the reference tables come from, as named in messages.
pub const REFERENCE: &str = "data/gpu-profiles.json";

/// How much a difference matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weight {
    /// gpuctl plans with this field.
    Fail,
    /// Shown only.
    Warn,
}

/// One named difference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// How much it matters.
    pub weight: Weight,
    /// Stable id fragment: `gi-profile.19` or `ci-profile.3g.40gb.1`.
    pub id: String,
    /// The sentence: what differs, the driver's value, the reference value.
    pub text: String,
}

fn places(p: &[Placement]) -> String {
    let v: Vec<String> = p
        .iter()
        .map(|p| format!("{}+{}", p.start, p.size))
        .collect();
    format!("[{}]", v.join(" "))
}

#[derive(Default)]
struct Fields {
    out: Vec<Difference>,
    id: String,
    subject: String,
}

impl Fields {
    fn cmp<T: PartialEq + std::fmt::Display>(&mut self, w: Weight, field: &str, drv: T, refv: T) {
        if drv != refv {
            self.out.push(Difference {
                weight: w,
                id: format!("{}.{field}", self.id),
                text: format!(
                    "{}: {field}: driver {drv}, {REFERENCE} {refv}",
                    self.subject
                ),
            });
        }
    }
}

fn gi_fields(f: &mut Fields, d: &GiProfile, r: &GiProfile) {
    use Weight::*;
    f.cmp(Fail, "name", d.name.as_str(), r.name.as_str());
    f.cmp(Fail, "nvml_profile_index", d.index, r.index);
    f.cmp(Fail, "slice_count", d.slice_count, r.slice_count);
    f.cmp(Fail, "instance_count", d.instance_count, r.instance_count);
    f.cmp(
        Fail,
        "placements",
        places(&d.placements),
        places(&r.placements),
    );
    f.cmp(Warn, "memory_size_mb", d.memory_size_mb, r.memory_size_mb);
    f.cmp(
        Warn,
        "multiprocessor_count",
        d.multiprocessor_count,
        r.multiprocessor_count,
    );
    f.cmp(
        Warn,
        "copy_engine_count",
        d.copy_engine_count,
        r.copy_engine_count,
    );
    f.cmp(Warn, "decoder_count", d.decoder_count, r.decoder_count);
    f.cmp(Warn, "encoder_count", d.encoder_count, r.encoder_count);
    f.cmp(Warn, "jpeg_count", d.jpeg_count, r.jpeg_count);
    f.cmp(Warn, "ofa_count", d.ofa_count, r.ofa_count);
}

/// Differences between the driver's GI profile table and the reference model's, matched by
/// published profile id.
pub fn gi_differences(driver: &[GiProfile], model: &GpuModel) -> Vec<Difference> {
    let mut f = Fields::default();
    for d in driver {
        f.id = format!("gi-profile.{}", d.id);
        f.subject = format!("GI profile {} ({})", d.id, d.name);
        match model.gi_profile_by_id(d.id) {
            Some(r) => gi_fields(&mut f, d, r),
            None => f.out.push(Difference {
                weight: Weight::Warn,
                id: f.id.clone(),
                text: format!(
                    "{}: offered by the driver (index {}), absent from {REFERENCE} {}: \
                     gpuctl cannot place it",
                    f.subject, d.index, model.key
                ),
            }),
        }
    }
    for r in &model.gi_profiles {
        if !driver.iter().any(|d| d.id == r.id) {
            f.out.push(Difference {
                weight: Weight::Fail,
                id: format!("gi-profile.{}", r.id),
                text: format!(
                    "GI profile {} ({}): in {REFERENCE} {}, not offered by the driver",
                    r.id, r.name, model.key
                ),
            });
        }
    }
    f.out
}

fn ci_fields(f: &mut Fields, d: &CiProfile, r: &CiProfile) {
    use Weight::*;
    f.cmp(Fail, "name", d.name.as_str(), r.name.as_str());
    f.cmp(Fail, "nvml_profile_index", d.index, r.index);
    f.cmp(Fail, "slice_count", d.slice_count, r.slice_count);
    f.cmp(Fail, "instance_count", d.instance_count, r.instance_count);
    f.cmp(
        Fail,
        "placements",
        places(&d.placements),
        places(&r.placements),
    );
    f.cmp(
        Warn,
        "multiprocessor_count",
        d.multiprocessor_count,
        r.multiprocessor_count,
    );
}

/// Differences between the CI profile table the driver reports inside a GI of profile
/// `gi_name` and the reference model's, matched by CI profile id.
pub fn ci_differences(gi_name: &str, driver: &[CiProfile], model: &GpuModel) -> Vec<Difference> {
    let reference = model.ci_profiles(gi_name);
    let mut f = Fields::default();
    for d in driver {
        f.id = format!("ci-profile.{gi_name}.{}", d.id);
        f.subject = format!("CI profile {} ({}) in {gi_name}", d.id, d.name);
        match reference.iter().find(|r| r.id == d.id) {
            Some(r) => ci_fields(&mut f, d, r),
            None => f.out.push(Difference {
                weight: Weight::Warn,
                id: f.id.clone(),
                text: format!(
                    "{}: offered by the driver, absent from {REFERENCE} {}: gpuctl cannot place it",
                    f.subject, model.key
                ),
            }),
        }
    }
    for r in reference {
        if !driver.iter().any(|d| d.id == r.id) {
            f.out.push(Difference {
                weight: Weight::Fail,
                id: format!("ci-profile.{gi_name}.{}", r.id),
                text: format!(
                    "CI profile {} ({}) in {gi_name}: in {REFERENCE} {}, not offered by the driver",
                    r.id, r.name, model.key
                ),
            });
        }
    }
    f.out
}

/// What the driver says of the GPU as a whole, for [`gpu_differences`].
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuFacts {
    /// Framebuffer in MiB.
    pub memory_mib: Option<u64>,
    /// PCI device id word (`0x233010DE`).
    pub pci_device_id: Option<u32>,
    /// Whether the driver reports a MIG mode at all.
    pub mig_capable: bool,
    /// `nvmlDeviceGetMaxMigDeviceCount`.
    pub max_mig_device_count: Option<u32>,
}

/// Differences between what the driver says of a GPU and its reference entry: the PCI device
/// id, the memory, MIG capability and the most MIG devices (the planner's instance limit).
pub fn gpu_differences(d: &GpuFacts, model: &GpuModel) -> Vec<Difference> {
    let mut f = Fields {
        id: "model".into(),
        subject: format!("{} ({})", model.key, model.nvml_name),
        ..Default::default()
    };
    // A model without listed ids (the built-in non-MIG one) has nothing to compare.
    if let (Some(id), false) = (d.pci_device_id, model.pci_device_ids.is_empty()) {
        let hex = format!("0x{id:08X}");
        let listed = model.pci_device_ids.iter().any(|p| {
            p.split_whitespace()
                .next()
                .is_some_and(|p| p.eq_ignore_ascii_case(&hex))
        });
        if !listed {
            let ids: Vec<&str> = model
                .pci_device_ids
                .iter()
                .filter_map(|p| p.split_whitespace().next())
                .collect();
            f.cmp(
                Weight::Warn,
                "pci_device_id",
                hex,
                format!("[{}]", ids.join(" ")),
            );
        }
    }
    if let Some(mib) = d.memory_mib {
        f.cmp(
            Weight::Warn,
            "memory_total_mib",
            mib,
            model.memory_total_mib,
        );
    }
    f.cmp(
        Weight::Fail,
        "mig_capable",
        d.mig_capable,
        model.mig_capable(),
    );
    if let (Some(max), true) = (d.max_mig_device_count, model.mig_capable()) {
        f.cmp(
            Weight::Fail,
            "max_mig_device_count",
            max,
            model.max_mig_device_count,
        );
    }
    f.out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::Catalog;

    fn h100() -> &'static GpuModel {
        Catalog::get().by_key("H100-SXM5-80GB").unwrap()
    }

    #[test]
    fn gpu_level_differences_are_named_with_both_values() {
        let same = GpuFacts {
            memory_mib: Some(81559),
            pci_device_id: Some(0x2330_10DE),
            mig_capable: true,
            max_mig_device_count: Some(7),
        };
        assert_eq!(gpu_differences(&same, h100()), vec![]);
        let other = GpuFacts {
            memory_mib: Some(81920),
            pci_device_id: Some(0x2324_10DE),
            mig_capable: true,
            max_mig_device_count: Some(4),
        };
        let d = gpu_differences(&other, h100());
        let texts: Vec<_> = d.iter().map(|d| (d.weight, d.text.as_str())).collect();
        assert_eq!(
            texts,
            vec![
                (
                    Weight::Warn,
                    "H100-SXM5-80GB (NVIDIA H100 80GB HBM3): pci_device_id: driver 0x232410DE, \
                     data/gpu-profiles.json [0x233010DE]"
                ),
                (
                    Weight::Warn,
                    "H100-SXM5-80GB (NVIDIA H100 80GB HBM3): memory_total_mib: driver 81920, \
                     data/gpu-profiles.json 81559"
                ),
                (
                    Weight::Fail,
                    "H100-SXM5-80GB (NVIDIA H100 80GB HBM3): max_mig_device_count: driver 4, \
                     data/gpu-profiles.json 7"
                ),
            ]
        );
        let no_mig = GpuFacts {
            mig_capable: false,
            ..same
        };
        assert_eq!(gpu_differences(&no_mig, h100())[0].id, "model.mig_capable");
    }

    #[test]
    fn identical_tables_have_no_difference() {
        let t: Vec<_> = h100().gi_profiles.clone();
        assert_eq!(gi_differences(&t, h100()), vec![]);
    }

    #[test]
    fn every_changed_field_missing_and_extra_profile_is_named() {
        let mut t: Vec<_> = h100().gi_profiles.clone();
        let one = t.iter_mut().find(|p| p.name == "1g.10gb").unwrap();
        one.memory_size_mb = 9000;
        one.placements.pop();
        let gone = t.iter().position(|p| p.name == "7g.80gb").unwrap();
        t.remove(gone);
        let mut extra = t[0].clone();
        extra.id = 99;
        extra.name = "1g.12gb+x".into();
        t.push(extra);
        let d = gi_differences(&t, h100());
        let texts: Vec<_> = d.iter().map(|d| (d.weight, d.text.as_str())).collect();
        assert_eq!(d.len(), 4, "{texts:#?}");
        assert!(texts.contains(&(
            Weight::Warn,
            "GI profile 19 (1g.10gb): memory_size_mb: driver 9000, data/gpu-profiles.json 9984"
        )));
        assert!(texts.contains(&(
            Weight::Fail,
            "GI profile 19 (1g.10gb): placements: driver [0+1 1+1 2+1 3+1 4+1 5+1], \
             data/gpu-profiles.json [0+1 1+1 2+1 3+1 4+1 5+1 6+1]"
        )));
        assert!(d.iter().any(|x| x.weight == Weight::Fail
            && x.text.contains("7g.80gb")
            && x.text.contains("not offered by the driver")));
        assert!(d
            .iter()
            .any(|x| x.weight == Weight::Warn && x.id == "gi-profile.99"));
    }
}
