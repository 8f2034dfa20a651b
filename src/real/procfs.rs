//! What gpuctl reads from `/proc` and `/sys` about the host: a PID's cgroup and unit, memory
//! and online CPUs.

use crate::observe::HostInfo;
use crate::paths::Root;

/// The cgroup v2 path and unit of a PID, from `/proc/<pid>/cgroup` under `root`, read by the one
/// parser of that file ([`crate::join::cgroup::parse_proc_cgroup`]). The unit is the innermost
/// path component that names a service or scope (`…/train.service/payload` → `train.service`).
pub fn pid_cgroup(root: &Root, pid: u32) -> (Option<String>, Option<String>) {
    let Some(cg) = crate::join::cgroup::read_proc_cgroup(root, pid) else {
        return (None, None);
    };
    let unit = cg
        .rsplit('/')
        .find(|c| c.ends_with(".service") || c.ends_with(".scope"))
        .map(str::to_string);
    (Some(cg), unit)
}

/// Memory (`/proc/meminfo`) and online CPUs (`/sys/devices/system/cpu/online`, else what the
/// process may use).
pub fn host_info(root: &Root) -> HostInfo {
    let memory_bytes = std::fs::read_to_string(root.join("/proc/meminfo"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0);
    let cpus = std::fs::read_to_string(root.join("/sys/devices/system/cpu/online"))
        .ok()
        .and_then(|t| crate::policy::parse::parse_cpus(t.trim()).ok())
        .map(|list| count_cpus(&list))
        .filter(|n| *n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1)
        });
    HostInfo { memory_bytes, cpus }
}

fn count_cpus(list: &str) -> u32 {
    list.split(',')
        .filter_map(|r| match r.split_once('-') {
            Some((a, b)) => Some(b.parse::<u32>().ok()? + 1 - a.parse::<u32>().ok()?),
            None => r.parse::<u32>().ok().map(|_| 1),
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_and_unit_of_a_pid() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let p = root.join("/proc/42/cgroup");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "0::/gpu.slice/gpu-prod.slice/train.service/payload\n").unwrap();
        assert_eq!(
            pid_cgroup(&root, 42),
            (
                Some("/gpu.slice/gpu-prod.slice/train.service/payload".into()),
                Some("train.service".into())
            )
        );
        std::fs::write(&p, "0::/user.slice/user-1000.slice/session-3.scope\n").unwrap();
        assert_eq!(pid_cgroup(&root, 42).1.as_deref(), Some("session-3.scope"));
        assert_eq!(pid_cgroup(&root, 43), (None, None));
    }

    #[test]
    fn cpus_count() {
        assert_eq!(count_cpus("0-3,8,10-11"), 7);
    }
}
