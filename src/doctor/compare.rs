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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::Catalog;

    fn h100() -> &'static GpuModel {
        Catalog::get().by_key("H100-SXM5-80GB").unwrap()
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
