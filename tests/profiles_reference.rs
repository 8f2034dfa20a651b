//! A few values of the compiled-in reference data (`data/gpu-profiles.json`) against numbers
//! written here by hand from NVIDIA's MIG User Guide (the "Supported MIG Profiles" tables and the
//! `nvidia-smi mig -lgip` / `-lgipp` listings it shows for A100 40GB and H100 80GB).
//!
//! Why: the fake NVML embeds the same file as the code under test, so every geometry test
//! through the fake (tests/nvml_fake.rs, tests/nvml_cli.rs) checks that gpuctl agrees with the
//! data, never that the data agrees with a driver. A wrong profile ID or placement in the file
//! would pass all of them; here it fails.

use gpuctl::profiles::Catalog;

/// (GI profile, profile ID, instances at most, placements as (start, size)).
type Row = (&'static str, u32, u32, &'static [(u32, u32)]);

const ONES: &[(u32, u32)] = &[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)];
const TWOS: &[(u32, u32)] = &[(0, 2), (2, 2), (4, 2)];
const HALVES: &[(u32, u32)] = &[(0, 4), (4, 4)];

const A100_40GB: &[Row] = &[
    ("1g.5gb", 19, 7, ONES),
    ("2g.10gb", 14, 3, TWOS),
    ("3g.20gb", 9, 2, HALVES),
    ("4g.20gb", 5, 1, &[(0, 4)]),
    ("7g.40gb", 0, 1, &[(0, 8)]),
];

const H100_80GB: &[Row] = &[
    ("1g.10gb", 19, 7, ONES),
    ("1g.20gb", 15, 4, &[(0, 2), (2, 2), (4, 2), (6, 2)]),
    ("2g.20gb", 14, 3, TWOS),
    ("3g.40gb", 9, 2, HALVES),
    ("4g.40gb", 5, 1, &[(0, 4)]),
    ("7g.80gb", 0, 1, &[(0, 8)]),
];

fn check(sim: &str, rows: &[Row]) {
    let m = Catalog::get()
        .by_sim_name(sim)
        .unwrap_or_else(|| panic!("{sim} in the catalog"));
    assert_eq!(m.memory_slices, 8, "{sim}: memory slices");
    for (name, id, count, placements) in rows {
        let p = m
            .gi_profile(name)
            .unwrap_or_else(|| panic!("{sim}: GI profile {name}"));
        assert_eq!(p.id, *id, "{sim} {name}: profile ID");
        assert_eq!(p.instance_count, *count, "{sim} {name}: instances");
        let got: Vec<(u32, u32)> = p.placements.iter().map(|x| (x.start, x.size)).collect();
        assert_eq!(got, placements.to_vec(), "{sim} {name}: placements");
    }
}

#[test]
fn a100_40gb_matches_the_mig_user_guide() {
    check("a100-40gb", A100_40GB);
}

#[test]
fn h100_80gb_matches_the_mig_user_guide() {
    check("h100-80gb", H100_80GB);
}

#[test]
fn profile_ids_are_not_profile_indexes() {
    // 3g.40gb is NVML_GPU_INSTANCE_PROFILE_3_SLICE (index 2) with profile ID 9.
    let m = Catalog::get().by_sim_name("h100-80gb").unwrap();
    let p = m.gi_profile("3g.40gb").unwrap();
    assert_eq!((p.index, p.id), (2, 9));
}
