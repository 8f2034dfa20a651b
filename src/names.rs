//! Team names: parsed once where a name enters (a policy file, argv, the bus), then carried as
//! a type. A leaf: `observe` (below `policy`) and `policy` both name teams, and neither may import
//! the other for it.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A team name that may become a unit name (`gpu-<team>.slice`) and a file name
/// (`<team>.env`): `[a-z][a-z0-9_]{0,30}`. Parsed once where a name enters (argv, the bus);
/// what takes a `TeamName` does not check again.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TeamName(String);

impl std::str::FromStr for TeamName {
    type Err = BadTeamName;
    fn from_str(s: &str) -> Result<TeamName, BadTeamName> {
        if valid_team_name(s) {
            Ok(TeamName(s.to_string()))
        } else {
            Err(BadTeamName(s.to_string()))
        }
    }
}

impl TryFrom<String> for TeamName {
    type Error = BadTeamName;
    fn try_from(s: String) -> Result<TeamName, BadTeamName> {
        s.parse()
    }
}

impl From<TeamName> for String {
    fn from(t: TeamName) -> String {
        t.0
    }
}

impl std::ops::Deref for TeamName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// Maps keyed by name are looked up with a `&str` (a name read back from systemd or a file is
/// compared, not trusted).
impl std::borrow::Borrow<str> for TeamName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for TeamName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TeamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A name compares with the text it was parsed from, as `String` does.
impl PartialEq<str> for TeamName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<String> for TeamName {
    fn eq(&self, other: &String) -> bool {
        self.0 == *other
    }
}

/// The slice borrowed jobs run in (`gpu-loans.slice`): its own slice, because cgroup device
/// filters are hierarchical and a team slice cannot open another team's device. Policy
/// validation refuses it as a team name.
pub const LOANS: &str = "loans";

/// A string that is not a team name (kept whole; callers decide how much of it to show).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid team name {0:?}")]
pub struct BadTeamName(pub String);

/// Team names become unit names (`gpu-<team>.slice`); a `-` would nest the slice.
pub fn valid_team_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 31
        && b[0].is_ascii_lowercase()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

/// Why `name` is no team name, in words (for a name [`valid_team_name`] refused).
pub fn team_name_problem(name: &str) -> String {
    if name.contains('-') {
        format!(
            "a '-' would nest the slice: systemd reads gpu-{name}.slice as a child of \
             gpu-{}.slice; use '_' instead",
            name.split('-').next().unwrap_or_default()
        )
    } else {
        "team names become unit names (gpu-NAME.slice)".into()
    }
}

/// The team name `name` was most likely meant to be: lower case, `-` and `.` as `_`
/// (`ML-Infer` → `ml_infer`); `None` when that is no team name either.
pub fn team_name_fix(name: &str) -> Option<String> {
    let fixed: String = name
        .chars()
        .map(|c| match c {
            '-' | '.' | ' ' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    (fixed != name && valid_team_name(&fixed)).then_some(fixed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_get_the_name_meant() {
        assert_eq!(team_name_fix("ml-infer").as_deref(), Some("ml_infer"));
        assert_eq!(team_name_fix("ML.Infer").as_deref(), Some("ml_infer"));
        assert_eq!(team_name_fix("../x"), None);
        assert_eq!(team_name_fix("infer"), None);
        assert!(team_name_problem("ml-infer").contains("use '_' instead"));
    }

    #[test]
    fn team_names() {
        for ok in ["a", "infer", "ml_team2", &"a".repeat(31)] {
            assert!(valid_team_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Infer",
            "ml-team",
            "2team",
            "_x",
            &"a".repeat(32),
            "a.b",
            "a/b",
        ] {
            assert!(!valid_team_name(bad), "{bad}");
            assert_eq!(bad.parse::<TeamName>(), Err(BadTeamName(bad.to_string())));
        }
        let t: TeamName = "ml_team2".parse().unwrap();
        assert_eq!((&*t, t.to_string()), ("ml_team2", "ml_team2".to_string()));
        assert_eq!(serde_json::to_string(&t).unwrap(), "\"ml_team2\"");
        assert!(serde_json::from_str::<TeamName>("\"../x\"").is_err());
    }
}

/// Where a cgroup v2 path (`/proc/<pid>/cgroup`) runs in gpuctl's terms: the one reading of that
/// fact, for usage, idle reclaim, drain and the planner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupPlace<'a> {
    /// The team whose `gpu-<team>.slice` holds the path: the outermost `gpu-<x>.slice` whose
    /// `x` is a team name. A team's MPS shares nest slices of their own inside it
    /// (`gpu-infer.slice/gpu-infer-gpus.slice/…`); team names have no `-`, so the outermost
    /// one names the team and the inner ones never do.
    pub team: &'a str,
    /// The service or scope directly inside the team's slice: the unit the host's systemd runs
    /// and can stop. `None` when a slice comes next (an MPS share) or nothing does. Under a
    /// nested manager (a container's own systemd: `…/ctr.scope/…/x.service`) it is the outer
    /// unit, which the host knows.
    pub unit: Option<&'a str>,
}

/// Read `path` ([`CgroupPlace`]); `None` outside every team slice.
pub fn cgroup_place(path: &str) -> Option<CgroupPlace<'_>> {
    let mut parts = path.split('/').filter(|c| !c.is_empty());
    let team = parts.by_ref().find_map(|c| {
        let t = c.strip_prefix("gpu-")?.strip_suffix(".slice")?;
        valid_team_name(t).then_some(t)
    })?;
    let unit = parts
        .next()
        .filter(|c| c.ends_with(".service") || c.ends_with(".scope"));
    Some(CgroupPlace { team, unit })
}

/// The container a cgroup path runs in, as `<engine> <short id>` (`docker 0123456789ab`): the
/// innermost `docker-<id>.scope` (Docker's systemd cgroup driver, under `--cgroup-parent` a
/// team slice), `docker/<id>` (its cgroupfs driver) or `libpod-<id>.scope` (podman). `None` for
/// a path in no container. The short id is what `docker ps` shows.
pub fn container_of_cgroup(path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let long_id = |id: &str| id.len() >= 12 && id.chars().all(|c| c.is_ascii_hexdigit());
    parts.iter().enumerate().rev().find_map(|(i, c)| {
        let (engine, id) = if let Some(id) = c.strip_prefix("docker-") {
            ("docker", id.strip_suffix(".scope")?)
        } else if let Some(id) = c.strip_prefix("libpod-") {
            ("podman", id.strip_suffix(".scope")?)
        } else if i > 0 && parts[i - 1] == "docker" {
            ("docker", *c)
        } else {
            return None;
        };
        long_id(id).then(|| format!("{engine} {}", &id[..12]))
    })
}

/// The unit a process runs in, as its own systemd sees it: the innermost service or scope of the
/// path (`…/train.service/payload` → `train.service`), nested managers included.
pub fn innermost_unit(path: &str) -> Option<&str> {
    path.rsplit('/')
        .find(|c| c.ends_with(".service") || c.ends_with(".scope"))
}

/// The Slurm job a path belongs to: slurmstepd puts job steps under
/// `…/slurmstepd.scope/job_<id>/step_<s>/…` (cgroup/v2 plugin), or `<node>_slurmstepd.scope`
/// as Slurm 22.05 names it (so that several slurmd of one host keep apart).
pub fn slurm_job_of_cgroup(path: &str) -> Option<u64> {
    let mut parts = path.split('/');
    parts.find(|p| *p == "slurmstepd.scope" || p.ends_with("_slurmstepd.scope"))?;
    parts.next()?.strip_prefix("job_")?.parse().ok()
}

#[cfg(test)]
mod cgroup_tests {
    use super::*;

    #[test]
    fn the_innermost_unit_and_the_slurm_job_of_a_path() {
        let u = innermost_unit;
        assert_eq!(
            u("/gpu.slice/gpu-prod.slice/train.service/payload"),
            Some("train.service")
        );
        assert_eq!(
            u("/gpu.slice/gpu-infer.slice/ctr.scope/system.slice/x.service"),
            Some("x.service"),
            "a nested manager's own unit"
        );
        assert_eq!(u("/gpu.slice/gpu-infer.slice"), None);
        let j = slurm_job_of_cgroup;
        assert_eq!(j("/system.slice/slurmstepd.scope/job_42/step_0"), Some(42));
        assert_eq!(j("/system.slice/node1_slurmstepd.scope/job_5"), Some(5));
        assert_eq!(j("/system.slice/notslurmstepd.scope/job_5"), None);
        assert_eq!(j("/gpu.slice/gpu-infer.slice/job_3"), None);
    }

    #[test]
    fn one_reading_of_a_cgroup_path() {
        let p = |s| cgroup_place(s).map(|p| (p.team, p.unit));
        assert_eq!(
            p("/gpu.slice/gpu-infer.slice/train.service/payload"),
            Some(("infer", Some("train.service")))
        );
        // A team's MPS share: its own server is the team's, in no unit of the team slice.
        assert_eq!(
            p("/gpu.slice/gpu-infer.slice/gpu-infer-gpus.slice/gpuctl-mps@infer-gpus.service"),
            Some(("infer", None))
        );
        assert_eq!(
            p("/gpu.slice/gpu-train.slice/gpu-train-0.slice/gpuctl-mps@train-0.service"),
            Some(("train", None))
        );
        // A container with its own manager: the outer scope is the unit the host can stop.
        assert_eq!(
            p("/gpu.slice/gpu-infer.slice/ctr.scope/system.slice/x.service"),
            Some(("infer", Some("ctr.scope")))
        );
        assert_eq!(
            p("/gpu.slice/gpu-train.slice/gpuctl-run-train-4240.scope"),
            Some(("train", Some("gpuctl-run-train-4240.scope")))
        );
        // The bare slice; paths outside team slices; names that are no team.
        assert_eq!(p("/gpu.slice/gpu-infer.slice"), Some(("infer", None)));
        assert_eq!(p("/system.slice/cron.service"), None);
        assert_eq!(p("/gpu.slice/x.service"), None);
        assert_eq!(p("/gpu.slice/gpu-.slice/x.service"), None);
        assert_eq!(p("/gpu.slice/gpu-Bad.slice/x.service"), None);
        assert_eq!(p("/user.slice/user-1000.slice/session-3.scope"), None);
        // A slice of a removed team is still read as that team's: the planner and usage name
        // the team its jobs run in, policy or not.
        assert_eq!(
            p("/gpu.slice/gpu-gone.slice/old.service"),
            Some(("gone", Some("old.service")))
        );
    }

    #[test]
    fn the_container_a_cgroup_runs_in() {
        let id = "4f1c2a9b8e7d6c5b4a3928170615f4e3d2c1b0a99887766554433221100ffee";
        let c = |s: &str| container_of_cgroup(s);
        // Docker with the systemd driver under a team slice: the team's, and named.
        let in_team = format!("/gpu.slice/gpu-infer.slice/docker-{id}.scope");
        assert_eq!(c(&in_team).as_deref(), Some("docker 4f1c2a9b8e7d"));
        assert_eq!(
            cgroup_place(&in_team).map(|p| (p.team, p.unit)),
            Some(("infer", Some(&*format!("docker-{id}.scope"))))
        );
        // Outside any team slice (a stray), with either driver, and podman's.
        assert_eq!(
            c(&format!("/system.slice/docker-{id}.scope")).as_deref(),
            Some("docker 4f1c2a9b8e7d")
        );
        assert_eq!(
            c(&format!("/docker/{id}")).as_deref(),
            Some("docker 4f1c2a9b8e7d")
        );
        assert_eq!(
            c(&format!("/machine.slice/libpod-{id}.scope/container")).as_deref(),
            Some("podman 4f1c2a9b8e7d")
        );
        // Not containers: Docker's own daemon, a unit named docker-something, short or odd ids.
        for no in [
            "/system.slice/docker.service",
            "/system.slice/docker-cleanup.service",
            "/system.slice/docker-abc.scope",
            "/docker",
            "/user.slice/user-1000.slice/session-3.scope",
            "/gpu.slice/gpu-infer.slice/gpuctl-run-infer-42.scope",
        ] {
            assert_eq!(c(no), None, "{no}");
        }
    }
}
