//! Golden tests of `gpuctl-generator` (zram-generator style): each case under
//! `tests/generator/<case>/` has a fake root `input/` and the exact unit files expected in the
//! generator's output directory under `expected/`. Set `GPUCTL_UPDATE_GOLDEN=1` to rewrite the
//! expected files after an intended change, then review the diff (tests/common/golden.rs).

#[path = "common/golden.rs"]
mod golden;

use gpuctl::daemon::generator;
use gpuctl::paths::Root;
use std::path::Path;

#[test]
fn generator_golden_cases() {
    let cases = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/generator");
    let mut n = 0;
    for case in std::fs::read_dir(&cases).unwrap().flatten() {
        let dir = case.path();
        let out = tempfile::tempdir().unwrap();
        let root = Root::new(dir.join("input"));
        let rc = generator::main_with(&[out.path().display().to_string()], &root);
        assert_eq!(rc, 0, "{}: a generator must not fail boot", dir.display());
        golden::check_dir(&dir.join("expected"), &golden::read_dir(out.path()));
        n += 1;
    }
    assert!(n >= 3, "golden cases missing");
}

#[test]
fn usage_error_without_output_dir() {
    assert_eq!(generator::main_with(&[], &Root::new("/nonexistent")), 2);
}
