//! Per-team cgroup statistics of `gpu-<team>.slice`, read with cgroups-rs (memory.current,
//! memory.max, cpu.stat, pids.current). `memory.events` is read directly: cgroups-rs 0.5
//! parses the OOM-kill count only from cgroup v1's `memory.oom_control`.

use crate::paths::Root;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;

/// What one team slice's cgroup says; `None` for what cannot be read (no slice yet, a
/// controller not enabled), never 0.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TeamCgroup {
    /// `memory.current`, bytes.
    pub memory_current: Option<u64>,
    /// `memory.max`, bytes; `None` when `max` (unlimited).
    pub memory_max: Option<u64>,
    /// `oom_kill` of `memory.events`.
    pub oom_kills: Option<u64>,
    /// `usage_usec` of `cpu.stat`, in seconds.
    pub cpu_seconds: Option<f64>,
    /// `pids.current`.
    pub pids: Option<u64>,
}

/// Read `gpu.slice/gpu-<team>.slice` under `root`'s `/sys/fs/cgroup`.
pub fn read(root: &Root, team: &str) -> TeamCgroup {
    use cgroups_rs::fs::cpu::CpuController;
    use cgroups_rs::fs::memory::MemController;
    use cgroups_rs::fs::pid::PidController;
    let base = root.join("/sys/fs/cgroup");
    let dir = base.join(crate::systemd::props::slice_cgroup(team));
    if !dir.is_dir() {
        return TeamCgroup::default();
    }
    let has = |f: &str| dir.join(f).exists();
    // cgroups-rs reports 0 for an unreadable file, which would read as an idle slice, so each
    // file is checked first and "unknown" stays unknown.
    let mem = has("memory.current")
        .then(|| MemController::new(dir.clone(), base.clone(), true).memory_stat());
    let memory_max = has("memory.max")
        .then(|| mem.as_ref().map(|m| m.limit_in_bytes))
        .flatten()
        .filter(|v| *v >= 0)
        .map(|v| v as u64);
    let cpu_seconds = has("cpu.stat")
        .then(|| {
            CpuController::new(dir.clone(), base.clone(), true)
                .cpu()
                .stat
        })
        .and_then(|stat| field(&stat, "usage_usec"))
        .map(|us| us as f64 / 1e6);
    let oom_kills = std::fs::read_to_string(dir.join("memory.events"))
        .ok()
        .and_then(|t| field(&t, "oom_kill"));
    let pids = PidController::new(dir.clone(), base, true)
        .get_pid_current()
        .ok()
        .filter(|_| has("pids.current"));
    TeamCgroup {
        memory_current: mem.map(|m| m.usage_in_bytes),
        memory_max,
        oom_kills,
        cpu_seconds,
        pids,
    }
}

/// `key value` per line (cpu.stat, memory.events).
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Counters read from the kernel (not counted by us): encoded as constant counters per scrape.
#[derive(Debug)]
pub(super) struct CounterCollector {
    pub(super) oom: Vec<(super::Labels, u64)>,
    pub(super) cpu: Vec<(super::Labels, f64)>,
}

impl prometheus_client::collector::Collector for CounterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut e = encoder.encode_descriptor(
            "team_oom_kills",
            "OOM kills in the team's slice (memory.events oom_kill)",
            None,
            MetricType::Counter,
        )?;
        for (labels, v) in &self.oom {
            ConstCounter::new(*v).encode(e.encode_family(labels)?)?;
        }
        let mut e = encoder.encode_descriptor(
            "team_cpu_usage_seconds",
            "CPU time used by the team's slice (cpu.stat usage_usec)",
            None,
            MetricType::Counter,
        )?;
        for (labels, v) in &self.cpu {
            ConstCounter::new(*v).encode(e.encode_family(labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_slice_and_leaves_unknowns_unknown() {
        let t = tempfile::tempdir().unwrap();
        let root = Root::new(t.path());
        let dir = root.join("/sys/fs/cgroup/gpu.slice/gpu-infer.slice");
        std::fs::create_dir_all(&dir).unwrap();
        let put = |file: &str, text: &str| std::fs::write(dir.join(file), text).unwrap();
        put("memory.current", "1048576\n");
        put("memory.max", "max\n");
        put(
            "memory.events",
            "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n",
        );
        put("cpu.stat", "usage_usec 2500000\nuser_usec 2000000\n");
        put("pids.current", "4\n");
        let c = read(&root, "infer");
        assert_eq!(c.memory_current, Some(1 << 20));
        assert_eq!(c.memory_max, None, "max means unlimited");
        assert_eq!(c.oom_kills, Some(2));
        assert_eq!(c.cpu_seconds, Some(2.5));
        assert_eq!(c.pids, Some(4));

        put("memory.max", "8589934592\n");
        std::fs::remove_file(dir.join("pids.current")).unwrap();
        let c = read(&root, "infer");
        assert_eq!(c.memory_max, Some(8 << 30));
        assert_eq!(c.pids, None, "no pids controller: unknown, not 0");
        assert_eq!(read(&root, "nobody"), TeamCgroup::default());
    }
}
