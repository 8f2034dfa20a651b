//! What the daemon calls to make the host match a policy.
//!
//! [`Reconciler`] is the seam between the daemon loop and the shared planner/executor: the lead
//! swaps [`SliceReconciler`] for a `policy → observe → plan → execute` implementation at merge.
//! Until then `SliceReconciler` does the systemd part directly — team slices, team environment
//! files and MPS daemons for whole-GPU assignments — against any [`SliceEffector`], so the VM
//! can prove the systemd behaviour and unit tests can check the calls.

use super::state::{AppliedState, STATE_FILE};
use crate::observe::{MpsSpec, SliceSpec};
use crate::paths::Root;
use crate::policy::{GpuUse, Policy, Selector};
use crate::systemd::{mps, SliceEffector};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tracing::{error, info, warn};

/// Device nodes every team with at least one GPU needs.
pub const BASE_NODES: [&str; 3] = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// The outcome of one reconcile (or of a dry run, for `Plan`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReconcileReport {
    /// Unix time (seconds) of the end of the run.
    pub at: u64,
    /// Teams in the policy.
    pub teams: usize,
    /// GPUs the policy assigns.
    pub gpus: usize,
    /// What was changed (or, in a dry run, would be), one line each.
    pub changes: Vec<String>,
    /// What failed, one line each, naming the unit or path.
    pub errors: Vec<String>,
    /// What could not be done by this implementation yet.
    pub warnings: Vec<String>,
    /// Units the policy wants to exist (team slices, MPS daemons): systemd removing one of
    /// these triggers a reconcile; removals of any other unit are noise.
    #[serde(default)]
    pub units: Vec<String>,
}

impl ReconcileReport {
    /// The host matches the policy as far as this run could tell.
    pub fn converged(&self) -> bool {
        self.errors.is_empty()
    }

    /// One line for `STATUS=`.
    pub fn summary(&self) -> String {
        if self.converged() {
            format!("{} teams, {} GPUs converged", self.teams, self.gpus)
        } else {
            format!(
                "{} teams, {} GPUs: {} error(s), first: {}",
                self.teams,
                self.gpus,
                self.errors.len(),
                self.errors[0]
            )
        }
    }
}

/// Makes the host match a policy. Must be idempotent: a second call with the same policy and an
/// unchanged host changes nothing, and a call after a crash mid-way finishes the job.
pub trait Reconciler: Send {
    /// Apply `policy`.
    fn reconcile(&mut self, policy: &Policy) -> ReconcileReport;
    /// Report what [`Reconciler::reconcile`] would change, changing nothing.
    fn plan(&mut self, policy: &Policy) -> ReconcileReport;
}

/// What the host offers, as far as the interim reconciler needs to know.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// Bytes of RAM (for `%` sizes).
    pub memory_bytes: u64,
    /// GPU index → minor number (`/dev/nvidia<minor>`).
    pub gpus: BTreeMap<u32, u32>,
}

impl HostFacts {
    /// Probe under `root`: RAM from `/proc/meminfo`, GPUs from `/dev/nvidiaN` nodes.
    ///
    /// Without NVML the index of a GPU is taken to be its minor number, which holds on hosts
    /// where the driver enumerates in PCI order; the NVML observer replaces this at merge.
    pub fn probe(root: &Root) -> Self {
        let memory_bytes = std::fs::read_to_string(root.join("/proc/meminfo"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            })
            .map_or(0, |kib| kib * 1024);
        let mut gpus = BTreeMap::new();
        if let Ok(rd) = std::fs::read_dir(root.join("/dev")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(n) = name
                    .strip_prefix("nvidia")
                    .and_then(|n| n.parse::<u32>().ok())
                {
                    gpus.insert(n, n);
                }
            }
        }
        HostFacts { memory_bytes, gpus }
    }
}

/// What the policy asks of systemd on this host.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Desired {
    /// Slice spec by team (every team gets a slice, device-less teams an empty device list).
    pub slices: BTreeMap<String, SliceSpec>,
    /// GPU indices by team.
    pub devices: BTreeMap<String, BTreeSet<u32>>,
    /// MPS daemons by instance.
    pub mps: BTreeMap<String, MpsSpec>,
    /// Parts of the policy this implementation cannot carry out.
    pub warnings: Vec<String>,
}

/// Compute [`Desired`] from the policy and host facts. Pure.
pub fn desired(policy: &Policy, host: &HostFacts) -> Desired {
    let mut d = Desired::default();
    for g in &policy.gpus {
        let indices: Vec<u32> = match &g.selector {
            Selector::Index(ix) => ix.clone(),
            Selector::All => host.gpus.keys().copied().collect(),
            other => {
                d.warnings.push(format!(
                    "{}: selector {other:?} needs NVML; skipped by the interim reconciler",
                    g.key
                ));
                continue;
            }
        };
        let teams: Vec<&String> = match &g.usage {
            GpuUse::Owned(t) => vec![t],
            GpuUse::Shared(ts) => ts.iter().collect(),
            GpuUse::Mig(_) => {
                d.warnings.push(format!(
                    "{}: MIG geometry needs the NVML executor; skipped",
                    g.key
                ));
                continue;
            }
        };
        for t in teams {
            d.devices
                .entry(t.clone())
                .or_default()
                .extend(indices.iter().copied());
        }
    }
    for (name, team) in &policy.teams {
        let l = &team.limits;
        let mut spec = SliceSpec {
            memory_max: l.memory_max.map(|s| s.resolve(host.memory_bytes)),
            memory_high: l.memory_high.map(|s| s.resolve(host.memory_bytes)),
            cpu_weight: l.cpu_weight,
            allowed_cpus: l.allowed_cpus.clone(),
            tasks_max: l.tasks_max,
            io_weight: l.io_weight,
            device_allow: BTreeSet::new(),
        };
        let idx = d.devices.get(name).cloned().unwrap_or_default();
        if !idx.is_empty() {
            spec.device_allow
                .extend(BASE_NODES.iter().map(|s| s.to_string()));
            for i in &idx {
                let minor = host.gpus.get(i).copied().unwrap_or(*i);
                spec.device_allow.insert(format!("/dev/nvidia{minor}"));
            }
            if let Some(m) = &team.mps {
                d.mps.insert(
                    format!("{name}-0"),
                    MpsSpec {
                        team: name.clone(),
                        devices: idx.iter().map(u32::to_string).collect(),
                        active_thread_percentage: m.active_thread_percentage,
                        pinned_memory_limit: m.pinned_memory_limit,
                        user: m.user.clone(),
                    },
                );
            }
        }
        d.slices.insert(name.clone(), spec);
    }
    d
}

/// Content of `/run/gpuctl/teams/<team>.env` for services (`EnvironmentFile=`) and shells.
pub fn team_env(team: &str, devices: &BTreeSet<u32>, mps_instance: Option<&str>) -> String {
    let list: Vec<String> = devices.iter().map(u32::to_string).collect();
    let mut s = format!(
        "GPUCTL_TEAM={team}\nCUDA_VISIBLE_DEVICES={0}\nNVIDIA_VISIBLE_DEVICES={0}\n",
        list.join(",")
    );
    if let Some(inst) = mps_instance {
        s.push_str(&format!(
            "CUDA_MPS_PIPE_DIRECTORY={}\nCUDA_MPS_LOG_DIRECTORY={}\n",
            mps::pipe_dir(inst),
            mps::log_dir(inst)
        ));
    }
    s
}

/// The interim reconciler: slices, env files and MPS daemons through a [`SliceEffector`].
pub struct SliceReconciler<E> {
    effector: E,
    root: Root,
}

impl<E: SliceEffector + Send> SliceReconciler<E> {
    /// Drive `effector`; files go under `root`.
    pub fn new(effector: E, root: Root) -> Self {
        SliceReconciler { effector, root }
    }

    /// The effector (tests inspect recorded calls).
    pub fn effector(&self) -> &E {
        &self.effector
    }

    fn run(&mut self, policy: &Policy, apply: bool) -> ReconcileReport {
        let host = HostFacts::probe(&self.root);
        let want = desired(policy, &host);
        let mut r = ReconcileReport {
            teams: policy.teams.len(),
            gpus: want
                .devices
                .values()
                .flatten()
                .collect::<BTreeSet<_>>()
                .len(),
            warnings: want.warnings.clone(),
            units: want
                .slices
                .keys()
                .map(|t| crate::systemd::props::slice_unit(t))
                .chain(want.mps.keys().map(|i| mps::unit(i)))
                .collect(),
            ..Default::default()
        };
        let verb = if apply { "" } else { "would " };

        // Slices first: an MPS daemon started before its team slice has its device list
        // would briefly run without the team's limits.
        for (team, spec) in &want.slices {
            match self.effector.read_slice(team) {
                Ok(Some(live)) if &live == spec => continue,
                Ok(_) => {}
                Err(e) => {
                    r.errors.push(e.to_string());
                    continue;
                }
            }
            r.changes.push(format!("{verb}set gpu-{team}.slice"));
            if apply {
                match self.effector.set_slice(team, spec) {
                    Ok(()) => info!(
                        gpuctl_team = %team,
                        gpuctl_action = "set-slice",
                        devices = spec.device_allow.len(),
                        "set gpu-{team}.slice"
                    ),
                    Err(e) => {
                        error!(gpuctl_team = %team, gpuctl_action = "set-slice", "{e}");
                        r.errors.push(e.to_string());
                    }
                }
            }
        }
        for (team, devices) in &want.devices {
            let inst = want
                .mps
                .contains_key(&format!("{team}-0"))
                .then(|| format!("{team}-0"));
            let path = self.root.join(format!("/run/gpuctl/teams/{team}.env"));
            let content = team_env(team, devices, inst.as_deref());
            if std::fs::read_to_string(&path).ok().as_deref() == Some(content.as_str()) {
                continue;
            }
            r.changes
                .push(format!("{verb}write /run/gpuctl/teams/{team}.env"));
            if apply {
                if let Err(e) = crate::systemd::client::write_if_changed(&path, &content) {
                    r.errors.push(e.to_string());
                }
            }
        }

        // Env files of teams that lost their last device or left the policy go: `gpuctl run`
        // and `EnvironmentFile=` read them, and a stale file would hand out devices the slice
        // no longer allows (or, for a team gone, a share that no longer exists).
        if let Ok(rd) = std::fs::read_dir(self.root.join(crate::join::TEAM_ENV_DIR)) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(team) = name.strip_suffix(".env") else {
                    continue;
                };
                if want.devices.get(team).is_some_and(|d| !d.is_empty()) {
                    continue;
                }
                r.changes
                    .push(format!("{verb}remove /run/gpuctl/teams/{name}"));
                if apply {
                    if let Err(err) = std::fs::remove_file(e.path()) {
                        r.errors.push(format!("{}: {err}", e.path().display()));
                    }
                }
            }
        }

        // MPS daemons: stop the unwanted, then (re)start the wanted with their settings.
        let live_mps = match self.effector.list_mps() {
            Ok(v) => v.into_iter().collect::<BTreeMap<_, _>>(),
            Err(e) => {
                r.errors.push(e.to_string());
                BTreeMap::new()
            }
        };
        for inst in live_mps.keys().filter(|i| !want.mps.contains_key(*i)) {
            r.changes.push(format!("{verb}stop {}", mps::unit(inst)));
            if apply {
                if let Err(e) = self.effector.stop_mps(inst) {
                    r.errors.push(e.to_string());
                }
            }
        }
        for (inst, spec) in &want.mps {
            if live_mps.get(inst) == Some(spec) {
                continue;
            }
            r.changes.push(format!("{verb}start {}", mps::unit(inst)));
            if apply {
                match self.effector.start_mps(inst, spec) {
                    Ok(()) => info!(
                        gpuctl_team = %spec.team,
                        gpuctl_action = "start-mps",
                        "started {}", mps::unit(inst)
                    ),
                    Err(e) => r.errors.push(e.to_string()),
                }
            }
        }

        // Teams gone from the policy: their slices go only once empty (never kill jobs).
        match self.effector.list_slices() {
            Ok(live) => {
                for team in live.iter().filter(|t| !want.slices.contains_key(*t)) {
                    r.changes.push(format!("{verb}remove gpu-{team}.slice"));
                    if apply {
                        if let Err(e) = self.effector.remove_slice(team) {
                            warn!(gpuctl_team = %team, gpuctl_action = "remove-slice", "{e}");
                            r.warnings.push(e.to_string());
                        }
                    }
                }
            }
            Err(e) => r.errors.push(e.to_string()),
        }

        if apply && r.errors.is_empty() {
            // The generator builds boot-time slices from this file, so it is written only
            // after a run that fully succeeded: a half-applied state never becomes boot truth.
            let state = AppliedState {
                version: 1,
                slices: want.slices.clone(),
            };
            if let Err(e) = state.save(&self.root.join(STATE_FILE)) {
                r.errors.push(e);
            }
        }
        r.at = super::unix_now();
        r
    }
}

impl<E: SliceEffector + Send> Reconciler for SliceReconciler<E> {
    fn reconcile(&mut self, policy: &Policy) -> ReconcileReport {
        self.run(policy, true)
    }
    fn plan(&mut self, policy: &Policy) -> ReconcileReport {
        self.run(policy, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systemd::SystemdError;

    /// A host held in memory; records every mutating call.
    #[derive(Default)]
    struct FakeSystemd {
        slices: BTreeMap<String, SliceSpec>,
        mps: BTreeMap<String, MpsSpec>,
        busy: BTreeSet<String>,
        calls: Vec<String>,
    }

    impl SliceEffector for FakeSystemd {
        fn set_slice(&mut self, team: &str, spec: &SliceSpec) -> Result<(), SystemdError> {
            self.calls.push(format!("set {team}"));
            self.slices.insert(team.into(), spec.clone());
            Ok(())
        }
        fn remove_slice(&mut self, team: &str) -> Result<(), SystemdError> {
            self.calls.push(format!("remove {team}"));
            if self.busy.contains(team) {
                return Err(SystemdError::Invalid {
                    unit: format!("gpu-{team}.slice"),
                    message: "1 tasks still run in it; left in place".into(),
                });
            }
            self.slices.remove(team);
            Ok(())
        }
        fn read_slice(&mut self, team: &str) -> Result<Option<SliceSpec>, SystemdError> {
            Ok(self.slices.get(team).cloned())
        }
        fn list_slices(&mut self) -> Result<Vec<String>, SystemdError> {
            Ok(self.slices.keys().cloned().collect())
        }
        fn start_mps(&mut self, i: &str, spec: &MpsSpec) -> Result<(), SystemdError> {
            self.calls.push(format!("start-mps {i}"));
            self.mps.insert(i.into(), spec.clone());
            Ok(())
        }
        fn stop_mps(&mut self, i: &str) -> Result<(), SystemdError> {
            self.calls.push(format!("stop-mps {i}"));
            self.mps.remove(i);
            Ok(())
        }
        fn list_mps(&mut self) -> Result<Vec<(String, MpsSpec)>, SystemdError> {
            Ok(self.mps.clone().into_iter().collect())
        }
        fn stop_units(&mut self, _: &[String]) -> Result<(), SystemdError> {
            Ok(())
        }
        fn start_units(&mut self, _: &[String]) -> Result<(), SystemdError> {
            Ok(())
        }
    }

    fn policy(text: &str) -> Policy {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let p = root.join("/etc/gpuctl/policy.toml");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
        super::super::interim_policy::load(&root).unwrap()
    }

    fn host(dir: &std::path::Path, gpus: u32) -> Root {
        let root = Root::new(dir);
        std::fs::create_dir_all(root.join("/dev")).unwrap();
        std::fs::create_dir_all(root.join("/proc")).unwrap();
        std::fs::write(root.join("/proc/meminfo"), "MemTotal: 1048576 kB\n").unwrap();
        for i in 0..gpus {
            std::fs::write(root.join(format!("/dev/nvidia{i}")), "").unwrap();
        }
        root
    }

    const TWO_TEAMS: &str = r#"
version = 1
[teams.infer]
memory-max = "50%"
[teams.infer.mps]
active-thread-percentage = 40
[teams.train]
tasks-max = 64
[[gpu]]
index = [0]
owner = "infer"
[[gpu]]
index = [1]
owner = "train"
"#;

    #[test]
    fn desired_slices_hold_limits_and_exact_devices() {
        let d = tempfile::tempdir().unwrap();
        let want = desired(&policy(TWO_TEAMS), &HostFacts::probe(&host(d.path(), 2)));
        let infer = &want.slices["infer"];
        assert_eq!(infer.memory_max, Some(512 << 20));
        assert!(infer.device_allow.contains("/dev/nvidia0"));
        assert!(!infer.device_allow.contains("/dev/nvidia1"));
        assert!(infer.device_allow.contains("/dev/nvidiactl"));
        assert_eq!(want.slices["train"].tasks_max, Some(64));
        assert_eq!(want.mps["infer-0"].devices, vec!["0".to_string()]);
        assert!(!want.mps.contains_key("train-0"));
    }

    #[test]
    fn second_run_changes_nothing_and_state_is_written() {
        let d = tempfile::tempdir().unwrap();
        let root = host(d.path(), 2);
        let mut r = SliceReconciler::new(FakeSystemd::default(), root.clone());
        let p = policy(TWO_TEAMS);
        let first = r.reconcile(&p);
        assert!(first.converged(), "{first:?}");
        assert_eq!(first.summary(), "2 teams, 2 GPUs converged");
        assert_eq!(
            r.effector().calls,
            vec!["set infer", "set train", "start-mps infer-0"]
        );
        let n = r.effector().calls.len();
        let second = r.reconcile(&p);
        assert!(second.changes.is_empty(), "{second:?}");
        assert_eq!(r.effector().calls.len(), n);
        let state = AppliedState::load(&root.join(STATE_FILE)).unwrap();
        assert_eq!(state.slices.len(), 2);
        let env = std::fs::read_to_string(root.join("/run/gpuctl/teams/infer.env")).unwrap();
        assert!(env.contains("CUDA_MPS_PIPE_DIRECTORY=/run/gpuctl/mps/infer-0/pipe"));
    }

    #[test]
    fn moving_a_gpu_shrinks_the_first_team_and_plan_changes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let root = host(d.path(), 2);
        let mut r = SliceReconciler::new(FakeSystemd::default(), root.clone());
        r.reconcile(&policy(TWO_TEAMS));
        let train_env = root.join("/run/gpuctl/teams/train.env");
        assert!(train_env.exists());
        let moved = TWO_TEAMS.replace(
            "index = [1]\nowner = \"train\"",
            "index = [1]\nowner = \"infer\"",
        );
        let p = policy(&moved);
        let calls = r.effector().calls.len();
        let plan = r.plan(&p);
        assert_eq!(r.effector().calls.len(), calls, "plan must not mutate");
        assert!(plan
            .changes
            .contains(&"would set gpu-train.slice".to_string()));
        r.reconcile(&p);
        let slices = &r.effector().slices;
        assert!(slices["infer"].device_allow.contains("/dev/nvidia1"));
        assert!(!slices["train"].device_allow.contains("/dev/nvidia1"));
        assert!(
            slices["train"].device_allow.is_empty(),
            "no GPU left: no nodes at all"
        );
        assert!(
            !train_env.exists(),
            "a team without devices keeps no env file for `gpuctl run` to hand out"
        );
        let infer = std::fs::read_to_string(root.join("/run/gpuctl/teams/infer.env")).unwrap();
        assert!(infer.contains("CUDA_VISIBLE_DEVICES=0,1\n"), "{infer}");
        assert!(r.reconcile(&p).changes.is_empty(), "removal is idempotent");
    }

    #[test]
    fn removed_team_with_jobs_is_kept() {
        let d = tempfile::tempdir().unwrap();
        let mut fake = FakeSystemd::default();
        fake.busy.insert("train".into());
        let mut r = SliceReconciler::new(fake, host(d.path(), 2));
        r.reconcile(&policy(TWO_TEAMS));
        let only_infer = "version = 1\n[teams.infer]\n[[gpu]]\nindex = [0]\nowner = \"infer\"\n";
        let rep = r.reconcile(&policy(only_infer));
        assert!(rep.converged());
        assert!(
            rep.warnings.iter().any(|w| w.contains("left in place")),
            "{rep:?}"
        );
        assert!(r.effector().slices.contains_key("train"));
        assert!(r.effector().calls.contains(&"stop-mps infer-0".to_string()));
    }
}
