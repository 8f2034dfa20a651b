//! Team CDI specs on the host: `/var/run/cdi/gpuctl.io-team-<team>.json` (content from
//! [`crate::cdi::spec`], planned like env files), read back for the observation and written
//! through [`files::write_atomic`](crate::files::write_atomic).

use crate::cdi::{spec_path, CDI_DIR, FILE_PREFIX};
use crate::files::{remove_if_exists, write_atomic, FileError};
use crate::paths::Root;
use crate::policy::TeamName;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn file(root: &Root, team: &str) -> PathBuf {
    root.join(spec_path(team))
}

/// The team specs on the host under `root`, by team: only files named as gpuctl names them
/// (other vendors' specs in the same directory are not ours to read or remove).
pub fn read_all(root: &Root) -> Result<BTreeMap<TeamName, String>, FileError> {
    let dir = root.join(CDI_DIR);
    match std::fs::read_dir(&dir) {
        Ok(rd) => {
            super::read_team_files(rd, |n| n.strip_prefix(FILE_PREFIX)?.strip_suffix(".json"))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(FileError::new(&dir, e)),
    }
}

/// Write a team's spec atomically (temp file, rename): an engine reading the directory sees the
/// old or the new spec, never a torn one (the temp file's name ends in neither `.json` nor
/// `.yaml`, so CDI never reads it).
pub fn write(root: &Root, team: &str, content: &str) -> Result<(), FileError> {
    write_atomic(&file(root, team), content.as_bytes())
}

/// Remove a team's spec (team gone from the policy); a missing file is fine.
pub fn remove(root: &Root, team: &str) -> Result<(), FileError> {
    remove_if_exists(&file(root, team)).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_round_trip_through_files_and_ignore_other_vendors() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        write(&root, "infer", "{}\n").unwrap();
        std::fs::write(root.join("/var/run/cdi/nvidia.com-gpu.yaml"), "x").unwrap();
        std::fs::write(root.join("/var/run/cdi/gpuctl.io-team-Bad.json"), "x").unwrap();
        let got = read_all(&root).unwrap();
        assert_eq!(got.keys().map(|t| &**t).collect::<Vec<_>>(), ["infer"]);
        assert_eq!(got["infer"], "{}\n");
        remove(&root, "infer").unwrap();
        remove(&root, "infer").unwrap();
        assert!(read_all(&root).unwrap().is_empty());
        assert!(root.join("/var/run/cdi/nvidia.com-gpu.yaml").exists());
    }
}
