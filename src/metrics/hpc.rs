//! dcgm-exporter's HPC job-mapping directory (`--hpc-job-mapping-dir`,
//! `DCGM_HPC_JOB_MAPPING_DIR`), kept current with the teams as the "jobs".
//!
//! Format, from dcgm-exporter's `internal/pkg/transformation/hpc.go`: one regular file per
//! GPU, named by its index (names that are not integers are ignored), one job id per line; on
//! every scrape each series whose `gpu` label matches a file is repeated once per line with an
//! `hpc_job` label. MIG series carry their parent GPU's index in `gpu`, so a file cannot tell a
//! GPU's MIG devices apart: for a MIG GPU gpuctl writes a file only when all of its assigned
//! devices belong to one team, and otherwise none (join on `gpuctl_device_team_info` instead,
//! see docs/monitoring.md). Duplicate lines would duplicate series, so teams are unique.

use crate::usage::Owners;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Environment variable naming the directory gpuctld keeps current (unset: off).
pub const ENV_DIR: &str = "GPUCTL_HPC_JOB_MAPPING_DIR";

/// File name (GPU index) → content, for GPUs with an unambiguous team set.
pub fn files(owners: &Owners, mig_gpu_of: &BTreeMap<String, u32>) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = owners
        .gpus
        .iter()
        .map(|(idx, teams)| (idx.to_string(), lines(teams)))
        .collect();
    let mut mig_gpus: BTreeMap<u32, BTreeSet<&String>> = BTreeMap::new();
    for (uuid, teams) in &owners.mig {
        if let Some(idx) = mig_gpu_of.get(uuid) {
            mig_gpus.entry(*idx).or_default().extend(teams);
        }
    }
    for (idx, teams) in mig_gpus.into_iter().filter(|(_, t)| t.len() == 1) {
        out.entry(idx.to_string()).or_insert_with(|| lines(teams));
    }
    out
}

/// One line per team, sorted and unique.
fn lines<'a>(teams: impl IntoIterator<Item = &'a String>) -> String {
    let unique: BTreeSet<&String> = teams.into_iter().collect();
    unique.iter().map(|t| format!("{t}\n")).collect()
}

/// Make `dir` hold exactly `files` among its integer-named files (others are left alone);
/// each file is replaced atomically so dcgm-exporter never reads half of one.
pub fn sync(dir: &Path, files: &BTreeMap<String, String>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.parse::<u32>().is_ok() && !files.contains_key(&name) && e.path().is_file() {
            std::fs::remove_file(e.path())?;
        }
    }
    for (name, content) in files {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(content) {
            continue;
        }
        let tmp = dir.join(format!(".{name}.gpuctl-tmp"));
        std::fs::write(&tmp, content)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_gpus_and_single_team_mig_gpus_get_files() {
        let owners = Owners {
            gpus: [
                (0, vec!["infer".to_string()]),
                (1, vec!["infer".into(), "research".into()]),
            ]
            .into(),
            mig: [
                ("MIG-a".to_string(), vec!["train".to_string()]),
                ("MIG-b".to_string(), vec!["train".to_string()]),
                ("MIG-c".to_string(), vec!["train".to_string()]),
                ("MIG-d".to_string(), vec!["infer".to_string()]),
            ]
            .into(),
        };
        let gpu_of: BTreeMap<String, u32> = [
            ("MIG-a".to_string(), 2),
            ("MIG-b".to_string(), 2),
            ("MIG-c".to_string(), 3),
            ("MIG-d".to_string(), 3),
        ]
        .into();
        let f = files(&owners, &gpu_of);
        assert_eq!(f.get("0").map(String::as_str), Some("infer\n"));
        assert_eq!(f.get("1").map(String::as_str), Some("infer\nresearch\n"));
        assert_eq!(f.get("2").map(String::as_str), Some("train\n"));
        assert_eq!(
            f.get("3"),
            None,
            "two teams' MIG devices on one GPU: ambiguous"
        );

        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("7"), "old\n").unwrap();
        std::fs::write(t.path().join("README"), "not ours\n").unwrap();
        sync(t.path(), &f).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["0", "1", "2", "README"]);
        assert_eq!(
            std::fs::read_to_string(t.path().join("1")).unwrap(),
            "infer\nresearch\n"
        );
    }
}
