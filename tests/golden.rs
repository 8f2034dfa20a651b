//! Golden plans: each `tests/golden/<case>/` is a fake root (policy drop-ins under `usr/lib`,
//! `run` and `etc`) plus `host` (a `--simulate` spec) and `expected-plan.txt`, the rendered plan.
//! `GPUCTL_UPDATE_GOLDEN=1 cargo test --test golden` rewrites the expectations (tests/common/golden.rs).

#[path = "common/golden.rs"]
mod golden;

use gpuctl::paths::Root;
use gpuctl::plan::{desired, diff};
use std::path::Path;

fn render_case(dir: &Path) -> String {
    let spec = std::fs::read_to_string(dir.join("host")).expect("host file");
    let observed = gpuctl::sim::build(spec.trim()).expect("valid host spec");
    let outcome = gpuctl::policy::load(&Root::new(dir));
    let policy = outcome.policy.unwrap_or_else(|| {
        panic!(
            "{}: policy invalid: {:#?}",
            dir.display(),
            outcome.diagnostics
        )
    });
    let d = desired(&policy, &observed);
    gpuctl::cli::plan::render(&observed, &d, &diff(&d, &observed))
}

#[test]
fn golden_plans() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut cases: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("host").exists())
        .collect();
    cases.sort();
    assert!(!cases.is_empty());
    let mut failed = Vec::new();
    for case in cases {
        let got = render_case(&case);
        if let Err(e) = golden::compare(&case.join("expected-plan.txt"), &got) {
            eprintln!("{e}");
            failed.push(case);
        }
    }
    assert!(failed.is_empty(), "golden plans differ: {failed:?}");
}
