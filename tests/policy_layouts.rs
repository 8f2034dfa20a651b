//! `[[gpu.layout]]` and `[gpu.reslice]`: the layouts a GPU may take besides its entry's own use.
//! Good ones become `GpuAssignment::layouts`; every layout is checked as the entry is, with
//! `file:line:col` errors at its keys.

mod common;

use gpuctl::policy::{GpuUse, DEFAULT_RESLICE_AFTER};
use std::time::Duration;

/// Lines 1-7: two teams; GPU 1 with seven interns slices (the default). A tail's first line is
/// line 8.
const HEAD: &str = "version = 1\n[teams.interns]\n[teams.train]\n[[gpu]]\nindex = [1]\n\
mig = [{ profile = \"1g.10gb\", owner = \"interns\", count = 7 }]\n\n";

/// Whether `HEAD` + `tail` is accepted, the policy, and its diagnostics without the temp dir.
fn load(tail: &str) -> (Option<gpuctl::policy::Policy>, Vec<String>) {
    common::load_text(&format!("{HEAD}{tail}"))
}

const NIGHT: &str = "[[gpu.layout]]\nname = \"night\"\n\
mig = [{ profile = \"3g.40gb\", owner = \"train\", count = 2 }]\nwhen = \"Mon..Fri 20:00..08:00\"\n";

#[test]
fn layouts_parse_with_their_windows_and_the_default_times() {
    let (p, d) = load(&format!(
        "{NIGHT}[[gpu.layout]]\nname = \"train-whole\"\nowner = \"train\"\n\
         [gpu.reslice]\nhold = \"1h\"\n"
    ));
    let p = p.unwrap_or_else(|| panic!("{d:?}"));
    assert!(d.is_empty(), "{d:?}");
    let ls = p.gpus[0].layouts.clone().unwrap();
    assert_eq!(ls.after, DEFAULT_RESLICE_AFTER);
    assert_eq!(ls.hold, Duration::from_secs(3600));
    let all = ls.all(&p.gpus[0].usage);
    let names: Vec<&str> = all.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["default", "night", "train-whole"]);
    assert_eq!(all[1].when[0].text, "Mon..Fri 20:00..08:00");
    assert!(matches!(&all[1].usage, GpuUse::Mig(m) if m[0].count == 2));
    assert_eq!(all[2].usage, GpuUse::Owned("train".parse().unwrap()));
}

#[test]
fn an_entry_without_layouts_is_as_before() {
    // train is named by no layout now, so it has no GPUs (with a layout naming it, it has).
    let (p, d) = load("");
    assert_eq!(d.len(), 1);
    assert!(d[0].contains("team 'train' has no GPUs"), "{d:?}");
    assert_eq!(p.unwrap().gpus[0].layouts, None);
}

#[test]
fn every_layout_is_checked_as_the_entry_is_at_its_own_keys() {
    let cases = [
        (
            "[[gpu.layout]]\nname = \"night\"\nmig = [{ profile = \"3g.40gb\", owner = \"train\", count = 3 }]\n",
            "p.toml:8:1: error: gpu[0].layout[0].mig: gpu 1 (A100 80GB PCIe, A100-SXM4-80GB, A800 80GB PCIe, A800-SXM4-80GB, H100 PCIe, H100 80GB HBM3, H800 PCIe, H800): 3g.40gb x3 needs 12 of 8 memory slices",
        ),
        (
            "[[gpu.layout]]\nname = \"night\"\nmig = [{ profile = \"3g.41gb\", owner = \"train\" }]\n",
            "p.toml:10:20: error: gpu[0].layout[0].mig[0].profile: no GPU model has a MIG profile '3g.41gb' (did you mean '3g.40gb'?",
        ),
        (
            "[[gpu.layout]]\nname = \"night\"\nowner = \"trian\"\n",
            "p.toml:10:9: error: gpu[0].layout[0].owner: ",
        ),
        (
            "[[gpu.layout]]\nname = \"night\"\n",
            "p.toml:8:1: error: gpu[0].layout[0]: the layout says nothing about what the GPUs are for",
        ),
        (
            "[[gpu.layout]]\nname = \"night\"\nowner = \"train\"\nshared = [\"interns\"]\n",
            "p.toml:11:1: error: gpu[0].layout[0].shared: several uses: owner, shared",
        ),
        (
            "[[gpu.layout]]\nowner = \"train\"\n",
            "p.toml:8:1: error: gpu[0].layout[0]: missing name",
        ),
        (
            "[[gpu.layout]]\nname = \"default\"\nowner = \"train\"\n",
            "p.toml:9:8: error: gpu[0].layout[0].name: `default` names the entry's own use",
        ),
        (
            "[[gpu.layout]]\nname = \"a b\"\nowner = \"train\"\n",
            "p.toml:9:8: error: gpu[0].layout[0].name: 'a b' is not a layout name",
        ),
        (
            "[[gpu.layout]]\nname = \"x\"\nowner = \"train\"\n[[gpu.layout]]\nname = \"x\"\nowner = \"interns\"\n",
            "p.toml:12:8: error: gpu[0].layout[1].name: layout 'x' is named twice in this entry",
        ),
        (
            "[[gpu.layout]]\nname = \"x\"\nowner = \"train\"\nwhen = \"Fri..Mon\"\n",
            "p.toml:11:8: error: gpu[0].layout[0].when: 'Fri..Mon': a weekday range runs forward",
        ),
        (
            "[[gpu.layout]]\nname = \"x\"\nowner = \"train\"\nwhen = []\n",
            "p.toml:11:8: error: gpu[0].layout[0].when: no window: the layout would never be preferred",
        ),
        (
            "[[gpu.layout]]\nname = \"x\"\nowner = \"train\"\nwhenn = \"Sat\"\n",
            "p.toml:11:1: error: gpu[0].layout[0].whenn: unknown key 'whenn' (did you mean 'when'?",
        ),
        (
            "[gpu.reslice]\nafter = \"10m\"\n",
            "p.toml:8:1: error: gpu[0].reslice: `reslice` without any [[gpu.layout]]",
        ),
        (
            &format!("{NIGHT}[gpu.reslice]\nhold = 0\n"),
            "p.toml:13:8: error: gpu[0].reslice.hold: the hold time must be longer than 0",
        ),
        (
            &format!("{NIGHT}[gpu.reslice]\nafterr = \"1m\"\n"),
            "p.toml:13:1: error: gpu[0].reslice.afterr: unknown key 'afterr' (did you mean 'after'?",
        ),
    ];
    let mut wrong = Vec::new();
    for (tail, want) in cases {
        let (p, d) = load(tail);
        if p.is_some() || !d.iter().any(|l| l.starts_with(want)) {
            wrong.push(format!("{tail}\nwant {want}\ngot {d:#?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

#[test]
fn plan_lists_each_gpus_layouts_and_which_one_each_gpu_has_now() {
    let (p, d) = load(&format!(
        "{NIGHT}[[gpu.layout]]\nname = \"train-whole\"\nowner = \"train\"\n"
    ));
    let p = p.unwrap_or_else(|| panic!("{d:?}"));
    let obs = gpuctl::sim::build("h100-80gb*2").unwrap();
    assert_eq!(
        gpuctl::cli::plan::render_layouts(&p, &obs),
        "\nLayouts (gpuctld switches each GPU among its entry's; `gpuctl status` shows which it has)\n  \
         gpu[0] (gpu 1): reslice after 10 min, hold 30 min\n    \
         default: MIG 7x1g.10gb → interns · now on gpu 1\n    \
         night: MIG 2x3g.40gb → train · preferred Mon..Fri 20:00..08:00\n    \
         train-whole: whole GPU, owned by train\n"
    );
    // gpuctld switched GPU 1 to "night": the plan says so.
    let mut night = p.clone();
    night.layouts_in_force.insert(1, "night".into());
    assert!(gpuctl::cli::plan::render_layouts(&night, &obs).contains(
        "    default: MIG 7x1g.10gb → interns\n    \
         night: MIG 2x3g.40gb → train · preferred Mon..Fri 20:00..08:00 · now on gpu 1\n"
    ));
    let (plain, _) = load("");
    assert_eq!(gpuctl::cli::plan::render_layouts(&plain.unwrap(), &obs), "");
}

#[test]
fn the_host_check_fits_every_layout_on_the_real_model() {
    // 3g.20gb is an A100-40GB profile: an index entry is checked offline against every model,
    // and on the host against the H100 it names.
    let (p, d) = load(
        "[[gpu.layout]]\nname = \"small\"\nmig = [{ profile = \"3g.20gb\", owner = \"train\" }]\n",
    );
    let p = p.unwrap_or_else(|| panic!("{d:?}"));
    let obs = gpuctl::sim::build("h100-80gb*2").unwrap();
    let errs: Vec<String> = gpuctl::policy::validate::check_against_host(&p, &obs)
        .iter()
        .map(|d| d.to_string())
        .collect();
    assert!(
        errs.iter().any(
            |e| e.contains("error: gpu[0].layout[0].mig: gpu 1 (H100") && e.contains("3g.20gb")
        ),
        "{errs:#?}"
    );
}

#[test]
fn the_last_good_copy_keeps_the_layouts_and_its_recheck_covers_them() {
    let (p, d) = load(&format!("{NIGHT}[gpu.reslice]\nafter = \"5m\"\n"));
    let p = p.unwrap_or_else(|| panic!("{d:?}"));
    let back: gpuctl::policy::Policy =
        serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back.gpus, p.gpus);
    assert_eq!(gpuctl::policy::caps::check_policy(&back), Ok(()));
    let mut bad = back.clone();
    let ls = bad.gpus[0].layouts.as_mut().unwrap();
    ls.other[0].usage = GpuUse::Owned("nobody".parse().unwrap());
    assert!(gpuctl::policy::caps::check_policy(&bad)
        .unwrap_err()
        .contains("unknown team"));
    let mut bad = back;
    bad.gpus[0].layouts.as_mut().unwrap().hold = Duration::ZERO;
    assert!(gpuctl::policy::caps::check_policy(&bad).is_err());
}
