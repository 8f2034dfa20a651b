//! The one golden-file harness of the test suite (golden plans, CDI specs, the planner's
//! rendered plan, the doctor's recording, the generator's unit files): `got` is compared with a
//! checked-in file, and `GPUCTL_UPDATE_GOLDEN=1` rewrites the file instead, to be reviewed with
//! `git diff`. With the switch set, a golden test passes by construction: `.ci/run` unsets it and
//! fails when the tests leave any tracked file changed.
//!
//! Included with `#[path = "common/golden.rs"] mod golden;`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The one update switch.
pub const UPDATE: &str = "GPUCTL_UPDATE_GOLDEN";

/// Whether this run rewrites golden files.
pub fn updating() -> bool {
    std::env::var_os(UPDATE).is_some()
}

/// A path under the repository root.
pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// `got` against the golden file `path` (written first when updating): `Err` says which file
/// differs or is missing, and how to rewrite it.
pub fn compare(path: &Path, got: &str) -> Result<(), String> {
    if updating() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, got).unwrap();
    }
    match std::fs::read_to_string(path) {
        Ok(want) if want == got => Ok(()),
        Ok(want) => Err(format!(
            "{} differs ({UPDATE}=1 rewrites it; review the diff)\n--- want:\n{want}\n--- got:\n{got}",
            path.display()
        )),
        Err(e) => Err(format!("{}: {e} ({UPDATE}=1 writes it)", path.display())),
    }
}

/// `compare`, panicking on a difference.
pub fn check(path: &Path, got: &str) {
    if let Err(e) = compare(path, got) {
        panic!("{e}");
    }
}

/// The files of a directory tree by path relative to `dir` (`user.slice.d/x.conf`), `.keep`,
/// which holds an empty directory in git, left out.
pub fn read_dir(dir: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = format!("{prefix}{}", e.file_name().to_string_lossy());
            if e.path().is_dir() {
                walk(&e.path(), &format!("{name}/"), out);
            } else if !name.ends_with(".keep") {
                out.insert(name, std::fs::read_to_string(e.path()).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, "", &mut out);
    out
}

/// A whole directory of golden files: exactly `got`'s files with `got`'s contents (the directory
/// is replaced when updating, with a `.keep` so that an empty one stays in git).
pub fn check_dir(dir: &Path, got: &BTreeMap<String, String>) {
    if updating() {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(".keep"), "").unwrap();
        for (name, text) in got {
            let p = dir.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
    }
    assert_eq!(
        got,
        &read_dir(dir),
        "{} differs ({UPDATE}=1 rewrites it; review the diff)",
        dir.display()
    );
}
