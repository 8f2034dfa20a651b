//! Golden tests of `gpuctl-generator` (zram-generator style): each case under
//! `tests/generator/<case>/` has a fake root `input/` and the exact unit files expected in the
//! generator's output directory under `expected/`. Set `GPUCTL_UPDATE_GOLDEN=1` to rewrite the
//! expected files after an intended change, then review the diff.

use gpuctl::daemon::generator;
use gpuctl::paths::Root;
use std::collections::BTreeMap;
use std::path::Path;

fn read_dir(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == ".keep" {
                continue;
            }
            out.insert(name, std::fs::read_to_string(e.path()).unwrap());
        }
    }
    out
}

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
        let got = read_dir(out.path());
        let expected_dir = dir.join("expected");
        if std::env::var_os("GPUCTL_UPDATE_GOLDEN").is_some() {
            let _ = std::fs::remove_dir_all(&expected_dir);
            std::fs::create_dir_all(&expected_dir).unwrap();
            std::fs::write(expected_dir.join(".keep"), "").unwrap();
            for (name, text) in &got {
                std::fs::write(expected_dir.join(name), text).unwrap();
            }
        }
        assert_eq!(got, read_dir(&expected_dir), "case {}", dir.display());
        n += 1;
    }
    assert!(n >= 3, "golden cases missing");
}

#[test]
fn usage_error_without_output_dir() {
    assert_eq!(generator::main_with(&[], &Root::new("/nonexistent")), 2);
}
