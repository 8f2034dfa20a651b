//! Every MIG model of `data/gpu-profiles.json`: its tables add up the way NVIDIA's MIG user
//! guide describes (slices and instance counts, placements inside the GPU, a full CI per GI),
//! every added value carries a source or an "unverified" mark, and the planner reaches each
//! model's full layouts (all-1g, all-balanced, one whole GPU) on the simulator and on the fake
//! NVML alike.

mod fakehost;

use fakehost::{layout, mig_part, policy, FakeHost};
use gpuctl::apply::execute;
use gpuctl::plan;
use gpuctl::profiles::{Catalog, GiProfile, GpuModel};
use gpuctl::sim::SimHost;
use std::collections::BTreeSet;

fn mig_models() -> Vec<&'static GpuModel> {
    Catalog::get()
        .models()
        .iter()
        .filter(|m| m.mig_capable())
        .collect()
}

/// A plain profile (no `+me`, `+gfx`, `-me` variant) of `slices` compute slices, the one with
/// the most instances (on Hopper `1g.10gb`, not `1g.20gb`).
fn plain(m: &GpuModel, slices: u32) -> &GiProfile {
    m.gi_profiles
        .iter()
        .filter(|p| p.slice_count == slices && !p.name.contains(['+', '-']))
        .max_by_key(|p| (p.instance_count, std::cmp::Reverse(p.memory_size_mb)))
        .unwrap_or_else(|| panic!("{} has no plain {slices}-slice profile", m.key))
}

/// mig-parted's `all-balanced` shape for every family in its default config: two 1g, one 2g
/// and (on 8-slice GPUs) one 3g.
fn balanced(m: &GpuModel) -> Vec<(&GiProfile, u32)> {
    let mut v = vec![(plain(m, 1), 2), (plain(m, 2), 1)];
    if m.memory_slices == 8 {
        v.push((plain(m, 3), 1));
    }
    v
}

#[test]
fn every_model_adds_up_as_the_guide_says() {
    let mut names = BTreeSet::new();
    let mut ids = BTreeSet::new();
    let mut sims = BTreeSet::new();
    for m in Catalog::get().models() {
        assert!(
            names.insert(&m.nvml_name),
            "NVML name {} twice",
            m.nvml_name
        );
        for s in &m.sim_names {
            assert!(sims.insert(s.clone()), "sim name {s} twice");
        }
        for id in &m.pci_device_ids {
            let hex = id.split_whitespace().next().unwrap();
            assert!(
                hex.len() == 10 && hex.starts_with("0x") && hex.ends_with("10DE"),
                "{}: PCI id {id} is not 0x<device>10DE",
                m.key
            );
            u32::from_str_radix(&hex[2..], 16).unwrap();
            assert!(ids.insert(hex.to_string()), "{}: PCI id {hex} twice", m.key);
        }
    }
    let models = mig_models();
    assert!(models.len() >= 20, "{} MIG models", models.len());
    for m in models {
        let k = &m.key;
        // -lgipp's units: 8 on A100 to B300, 4 on A30, 12 on the RTX PRO 6000 (GB202).
        assert!(
            matches!(
                (m.memory_slices, m.compute_slices),
                (8, 7) | (4, 4) | (12, 4)
            ),
            "{k}"
        );
        assert_eq!(m.max_mig_device_count, m.compute_slices, "{k}");
        let mut seen = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        for p in &m.gi_profiles {
            let at = format!("{k} {}", p.name);
            assert!(seen.0.insert(&p.name), "{at}: name twice");
            assert!(seen.1.insert(p.id), "{at}: profile id twice");
            assert!(seen.2.insert(p.index), "{at}: NVML index twice");
            // The name says the compute slices: "3g.40gb" is 3 of them.
            assert_eq!(
                p.name.split('g').next(),
                Some(&*p.slice_count.to_string()),
                "{at}"
            );
            let size = p.memory_slices();
            assert!(size >= p.slice_count, "{at}: {size} memory slices");
            assert!(!p.placements.is_empty(), "{at}: no placements");
            for pl in &p.placements {
                assert_eq!(pl.size, size, "{at}: placements of one size");
                assert!(
                    pl.start + pl.size <= m.memory_slices,
                    "{at}: {pl:?} outside"
                );
                assert_eq!(pl.start % size, 0, "{at}: {pl:?} unaligned");
            }
            assert!(p.instance_count as usize <= p.placements.len(), "{at}");
            assert!(p.instance_count * p.slice_count <= m.compute_slices, "{at}");
            assert!(p.instance_count * size <= m.memory_slices, "{at}");
            assert!(p.memory_size_mb <= m.memory_total_mib, "{at}: memory");
            // Every GI has its full-size CI, and its CI profiles fit it.
            let full = m.full_ci_profile(&p.name);
            assert_eq!(full.map(|c| c.slice_count), Some(p.slice_count), "{at}");
            for c in m.ci_profiles(&p.name) {
                assert!(
                    c.instance_count * c.slice_count <= p.slice_count,
                    "{at} {}",
                    c.name
                );
                for pl in &c.placements {
                    assert!(
                        pl.start + pl.size <= p.slice_count,
                        "{at} {}: {pl:?}",
                        c.name
                    );
                }
            }
        }
        // The guide's "1/7 × 7" (or 1/4 × 4) and one instance spanning the whole GPU.
        assert_eq!(plain(m, 1).instance_count, m.compute_slices, "{k}");
        let whole = plain(m, m.compute_slices);
        assert_eq!(whole.instance_count, 1, "{k}");
        assert_eq!(whole.placements.len(), 1, "{k}");
        assert_eq!(whole.placements[0].size, m.memory_slices, "{k}");
    }
}

#[test]
fn every_added_model_says_where_its_values_come_from() {
    let raw: serde_json::Value =
        serde_json::from_str(include_str!("../data/gpu-profiles.json")).unwrap();
    for (key, m) in raw["gpus"].as_object().unwrap() {
        for p in m["gi_profiles"].as_array().unwrap() {
            assert!(p["source"].is_string(), "{key} {}: no source", p["name"]);
        }
        if let Some(base) = m.get("tables_from") {
            assert!(raw["gpus"][base.as_str().unwrap()].is_object(), "{key}");
        }
        if m.get("tables_from").is_some() || m.get("sources").is_some() {
            let u = m["unverified"].as_array();
            assert!(
                u.is_some_and(|u| !u.is_empty()),
                "{key}: say what is unverified"
            );
        }
    }
}

fn toml_for(m: &GpuModel, shape: &[(&GiProfile, u32)]) -> String {
    let entries: Vec<String> = shape
        .iter()
        .map(|(p, n)| format!("{{ profile = \"{}\", owner = \"t\", count = {n} }}", p.name))
        .collect();
    format!(
        "version = 1\n[teams.t]\nmembers = [\"@t\"]\n[[gpu]]\nmodel = \"{}\"\nmig = [{}]\n",
        m.key,
        entries.join(", ")
    )
}

#[test]
fn full_layouts_of_every_model_apply_on_the_simulator_and_the_fake_nvml_alike() {
    let dir = tempfile::tempdir().unwrap();
    for m in mig_models() {
        let shapes = [
            ("all-1g", vec![(plain(m, 1), m.compute_slices)]),
            ("all-balanced", balanced(m)),
            ("whole", vec![(plain(m, m.compute_slices), 1)]),
        ];
        for (what, shape) in shapes {
            let at = format!("{} {what}", m.key);
            let p = policy(dir.path(), "p.toml", &toml_for(m, &shape));
            let mut sim = SimHost::from_spec(m.sim_name()).unwrap();
            let report = execute(&p, &plan::plan(&p, &sim.state), &mut sim).unwrap();
            assert!(report.failed.is_empty(), "{at}: {:?}", report.failed);
            assert!(mig_part(&plan::plan(&p, &sim.state)).is_empty(), "{at}");
            let want = layout(&sim.state, 0);
            let n: u32 = shape.iter().map(|(_, n)| n).sum();
            assert_eq!(want.len() as u32, n, "{at}: {want:?}");

            let fake = FakeHost::new(m.sim_name());
            let r = fake.apply(&p);
            assert!(r.failed.is_empty(), "{at} on the fake: {:?}", r.failed);
            assert_eq!(
                layout(&fake.observe(), 0),
                want,
                "{at}: fake and sim differ"
            );
        }
    }
}

#[test]
fn an_all_entry_with_profiles_only_some_models_have_is_warned_with_those_models() {
    let dir = tempfile::tempdir().unwrap();
    let load = |sel: &str, profile: &str| {
        let f = dir.path().join("p.toml");
        let text = format!(
            "version = 1\n[teams.t]\nmembers = [\"@t\"]\n[[gpu]]\n{sel}\n\
             mig = [{{ profile = \"{profile}\", owner = \"t\" }}]\n"
        );
        std::fs::write(&f, text).unwrap();
        gpuctl::policy::load_files(&[f])
            .diagnostics
            .iter()
            .filter(|d| d.severity == gpuctl::policy::Severity::Warning)
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
    };
    let w = load("all = true", "3g.20gb");
    assert_eq!(w.len(), 1, "{w:?}");
    let having: Vec<&str> = mig_models()
        .into_iter()
        .filter(|m| m.gi_profile("3g.20gb").is_some())
        .map(|m| m.key.as_str())
        .collect();
    assert!(having.len() >= 4 && having.contains(&"A800-PCIe-40GB"));
    assert!(
        w[0].contains(&format!("exist only on {}:", having.join(", "))),
        "{w:?}"
    );
    assert!(!w[0].contains("H100"), "{w:?}");
    // A model entry says which GPUs it is for; index entries are matched on the host.
    assert!(load("model = \"A100*40GB\"", "3g.20gb").is_empty());
    assert!(load("index = [0]", "3g.20gb").is_empty());
}

/// The RTX PRO 6000 Blackwell counts placements in 12 units. Its public `-cgi
/// 2g.48gb,1g.24gb,1g.24gb` output shows GI 1 at 0:6 and GIs 5 and 6 at 6:3 and 9:3; the planner
/// and the fake reach that layout with those ids.
#[test]
fn rtx_pro_6000_balanced_layout_is_the_one_its_public_lgi_shows() {
    let dir = tempfile::tempdir().unwrap();
    let m = Catalog::get()
        .by_key("RTX-PRO-6000-Blackwell-Server")
        .unwrap();
    assert_eq!(m.memory_slices, 12);
    let p = policy(dir.path(), "p.toml", &toml_for(m, &balanced(m)));
    let fake = FakeHost::new(m.sim_name());
    let r = fake.apply(&p);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let obs = fake.observe();
    let mut got: Vec<(u32, String, u32, u32)> = obs.gpus[0]
        .mig
        .as_ref()
        .unwrap()
        .instances
        .iter()
        .map(|g| (g.id, g.profile.clone(), g.placement.start, g.placement.size))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (1, "2g.48gb".to_string(), 0, 6),
            (5, "1g.24gb".to_string(), 6, 3),
            (6, "1g.24gb".to_string(), 9, 3),
        ]
    );
}
