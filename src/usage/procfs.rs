//! `/proc` attribution of the PIDs NVML reports: uid and user (through NSS, so LDAP/SSSD
//! users have names), command, systemd unit or scope, team, and the PID inside the process's
//! own pid namespace.
//!
//! NVML reports PIDs in the host's pid namespace (gpuctld runs there), so `/proc/<pid>` under
//! the root is the process even when it runs in a container; `NSpid:` in its `status` gives the
//! PID its container sees. A process can exit between the NVML read and these reads: it is
//! then skipped (`None`), never an error.

use crate::join::Directory;
use crate::paths::Root;
use std::collections::BTreeMap;

/// What `/proc` says about one PID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcInfo {
    /// Real uid.
    pub uid: u32,
    /// Innermost-namespace PID, when it differs from the host PID.
    pub ns_pid: Option<u32>,
    /// `comm`.
    pub command: Option<String>,
    /// systemd unit or scope owning the cgroup.
    pub unit: Option<String>,
    /// Team whose `gpu-<team>.slice` the cgroup path runs in.
    pub team: Option<String>,
    /// The unit directly inside that slice (see [`team_unit_of_cgroup`]).
    pub team_unit: Option<String>,
    /// The Slurm job whose step cgroup it runs in ([`crate::slurm::job_of_cgroup`]).
    pub slurm_job: Option<u64>,
    /// The container it runs in ([`crate::names::container_of_cgroup`]).
    pub container: Option<String>,
}

/// The team whose slice a cgroup path runs in ([`crate::names::cgroup_place`]).
pub fn team_of_cgroup(cgroup: &str) -> Option<String> {
    crate::names::cgroup_place(cgroup).map(|p| p.team.to_string())
}

/// The service or scope directly inside the team's slice ([`crate::names::cgroup_place`]): the
/// unit this host's systemd runs and can stop.
pub fn team_unit_of_cgroup(cgroup: &str) -> Option<String> {
    crate::names::cgroup_place(cgroup)?.unit.map(str::to_string)
}

/// Read `/proc/<pid>/{status,cgroup,comm}` under `root`; `None` when the process is gone.
pub fn read(root: &Root, pid: u32) -> Option<ProcInfo> {
    let status = std::fs::read_to_string(root.join(format!("/proc/{pid}/status"))).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let uid = field("Uid")?.split_whitespace().next()?.parse().ok()?;
    let ns_pid = field("NSpid")
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|p| *p != pid);
    let (cgroup, unit) = crate::real::pid_cgroup(root, pid);
    // No cgroup file any more: it exited between the two reads.
    let cgroup = cgroup?;
    let command = std::fs::read_to_string(root.join(format!("/proc/{pid}/comm")))
        .ok()
        .map(|s| s.trim_end().to_string());
    Some(ProcInfo {
        uid,
        ns_pid,
        command,
        unit,
        team: team_of_cgroup(&cgroup),
        team_unit: team_unit_of_cgroup(&cgroup),
        slurm_job: crate::slurm::job_of_cgroup(&cgroup),
        container: crate::names::container_of_cgroup(&cgroup),
    })
}

/// uid → user name, asked of NSS at most once per uid per collection.
pub struct UserNames<'a> {
    dir: &'a dyn Directory,
    cache: BTreeMap<u32, String>,
}

impl<'a> UserNames<'a> {
    /// Over a directory (the host's NSS in gpuctld).
    pub fn new(dir: &'a dyn Directory) -> Self {
        UserNames {
            dir,
            cache: BTreeMap::new(),
        }
    }

    /// The name of `uid`, or the number when NSS does not know it.
    pub fn name(&mut self, uid: u32) -> String {
        self.cache
            .entry(uid)
            .or_insert_with(|| {
                self.dir
                    .user_by_uid(uid)
                    .map_or_else(|| uid.to_string(), |a| a.name)
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Root, pid: u32, status: &str, cgroup: Option<&str>) {
        let dir = root.join(format!("/proc/{pid}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("status"), status).unwrap();
        std::fs::write(dir.join("comm"), "python3\n").unwrap();
        if let Some(cg) = cgroup {
            std::fs::write(dir.join("cgroup"), format!("0::{cg}\n")).unwrap();
        }
    }

    #[test]
    fn team_comes_from_the_team_slice_not_an_mps_share_inside_it() {
        assert_eq!(
            team_of_cgroup("/gpu.slice/gpu-infer.slice/train.service").as_deref(),
            Some("infer")
        );
        // infer's own MPS server runs in its share's slice inside infer's.
        assert_eq!(
            team_of_cgroup(
                "/gpu.slice/gpu-infer.slice/gpu-infer-gpus.slice/gpuctl-mps@infer-gpus.service"
            )
            .as_deref(),
            Some("infer")
        );
        assert_eq!(team_of_cgroup("/system.slice/cron.service"), None);
        assert_eq!(team_of_cgroup("/gpu.slice/x.service"), None);
    }

    #[test]
    fn team_unit_is_the_unit_directly_in_the_team_slice() {
        let u = |c| team_unit_of_cgroup(c);
        assert_eq!(
            u("/gpu.slice/gpu-infer.slice/train.service/payload").as_deref(),
            Some("train.service")
        );
        // A container with its own systemd: the host knows ctr.scope, not x.service.
        assert_eq!(
            u("/gpu.slice/gpu-infer.slice/ctr.scope/system.slice/x.service").as_deref(),
            Some("ctr.scope")
        );
        assert_eq!(
            u("/gpu.slice/gpu-infer.slice"),
            None,
            "directly in the slice"
        );
        assert_eq!(u("/user.slice/user-1000.slice/session-3.scope"), None);
        assert_eq!(u("/gpu.slice/gpu-a.slice/sub.slice/x.service"), None);
    }

    #[test]
    fn reads_uid_unit_team_and_namespace_pid() {
        let t = tempfile::tempdir().unwrap();
        let root = Root::new(t.path());
        write(
            &root,
            4242,
            "Name:\tpython3\nUid:\t1001\t1001\t1001\t1001\nNSpid:\t4242\t7\n",
            Some("/gpu.slice/gpu-train.slice/gpuctl-run-train-4240.scope"),
        );
        let p = read(&root, 4242).unwrap();
        assert_eq!(p.uid, 1001);
        assert_eq!(p.ns_pid, Some(7), "pid inside its container");
        assert_eq!(p.unit.as_deref(), Some("gpuctl-run-train-4240.scope"));
        assert_eq!(p.team.as_deref(), Some("train"));
        assert_eq!(p.team_unit.as_deref(), Some("gpuctl-run-train-4240.scope"));
        assert_eq!(p.command.as_deref(), Some("python3"));

        // Same namespace: no separate pid.
        write(
            &root,
            9,
            "Uid:\t0\t0\t0\t0\nNSpid:\t9\n",
            Some("/system.slice/x.service"),
        );
        let p = read(&root, 9).unwrap();
        assert_eq!((p.uid, p.ns_pid, p.team), (0, None, None));
    }

    #[test]
    fn a_process_that_exited_is_skipped() {
        let t = tempfile::tempdir().unwrap();
        let root = Root::new(t.path());
        assert_eq!(read(&root, 77), None);
        // Exited between reading status and cgroup.
        write(&root, 78, "Uid:\t0\t0\t0\t0\n", None);
        assert_eq!(read(&root, 78), None);
    }
}
