//! Team env files: `/run/gpuctl/teams/<team>.env`, what `EnvironmentFile=` and `gpuctl
//! shell/run/env` read.

use crate::files::{remove_if_exists, write_atomic, FileError};
use crate::paths::{Root, RUN_DIR};
use crate::policy::TeamName;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Team env files directory, under [`RUN_DIR`].
pub const TEAMS_DIR: &str = "teams";

fn path(root: &Root, team: &str) -> PathBuf {
    root.join(RUN_DIR)
        .join(TEAMS_DIR)
        .join(format!("{team}.env"))
}

/// Write a team's env file (atomically), mode 0640 root:root: its readers are systemd
/// (`EnvironmentFile=` of team services, as root) and gpuctld; members get the same content
/// through `Env`/`Join`, which check membership, so no group needs to read it.
pub fn write(root: &Root, team: &str, content: &str) -> Result<(), FileError> {
    use std::os::unix::fs::PermissionsExt;
    let p = path(root, team);
    write_atomic(&p, content.as_bytes())?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640))
        .map_err(|e| FileError::new(&p, e))
}

/// Remove a team's env file, if there is one.
pub fn remove(root: &Root, team: &str) -> Result<(), FileError> {
    remove_if_exists(&path(root, team)).map(|_| ())
}

/// Every team env file's text, by team. A file whose name is no team name was not written by
/// gpuctl and is left alone (as [`super::cdifiles::read_all`] does).
pub fn read_all(root: &Root) -> Result<BTreeMap<TeamName, String>, FileError> {
    let Ok(rd) = std::fs::read_dir(root.join(RUN_DIR).join(TEAMS_DIR)) else {
        return Ok(BTreeMap::new());
    };
    super::read_team_files(rd, |n| n.strip_suffix(".env"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_named_for_a_team_are_read() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        write(&root, "infer", "X=1\n").unwrap();
        let dir = root.join(RUN_DIR).join(TEAMS_DIR);
        std::fs::write(dir.join("Bad-name.env"), "Y=2\n").unwrap();
        std::fs::write(dir.join("train.txt"), "Z=3\n").unwrap();
        let got = read_all(&root).unwrap();
        assert_eq!(got.keys().map(|t| &**t).collect::<Vec<_>>(), ["infer"]);
        assert_eq!(got["infer"], "X=1\n");
    }
}
