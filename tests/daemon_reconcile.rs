//! gpuctld's reconcile on the shared core: the real NVML code against the fake library, a
//! recording systemd in place of the bus (no systemd PID 1 here; the VM scenarios run the real
//! one).

mod fakehost;

use fakehost::{lib_path, FakeHost};
use gpuctl::apply::{EffectError, MpsEffector, SliceEffector, UnitEffector};
use gpuctl::daemon::reconcile::{CoreReconciler, ReconcileReport, Reconciler};
use gpuctl::daemon::requeue::{Backoff, Requeue, FIRST_RETRY, RECHECK, RETRY_CAP};
use gpuctl::daemon::state::{AppliedState, STATE_FILE};
use gpuctl::daemon::{load_keeping_last_good, persist_last_good, Shared};
use gpuctl::dbus_api::ResetError;
use gpuctl::observe::{MpsSpec, Observed, SliceSpec};
use gpuctl::paths::Root;
use gpuctl::policy::{Policy, TeamName};
use gpuctl::real::{OtherClients, RealHost};
use gpuctl::systemd::{LiveUnits, SystemdError};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the recording systemd holds and was told.
#[derive(Debug, Default)]
struct Rec {
    slices: BTreeMap<TeamName, SliceSpec>,
    mps: BTreeMap<String, MpsSpec>,
    /// Teams whose slice still has tasks.
    busy: BTreeSet<String>,
    /// Mutating calls, each with the fake NVML's mutating-call count at that moment, so tests
    /// can place them relative to the MIG changes.
    calls: Vec<(String, u64)>,
    /// Reads of the live units (one per observation of systemd's side).
    reads: usize,
    /// The next `set_slice` fails with this (a systemd job that timed out, say).
    fail_next_set: Option<SystemdError>,
}

/// A systemd in memory; clones share the state, so the test keeps a handle.
#[derive(Debug, Clone)]
struct RecSystemd {
    rec: Arc<Mutex<Rec>>,
    nvml_state: PathBuf,
}

impl RecSystemd {
    fn log(&self, call: String) {
        let n = fake_nvml::control::read(&self.nvml_state)
            .map(|s| s.mutating_calls)
            .unwrap_or(0);
        self.rec.lock().unwrap().calls.push((call, n));
    }
    fn calls(&self) -> Vec<String> {
        self.rec
            .lock()
            .unwrap()
            .calls
            .iter()
            .map(|c| c.0.clone())
            .collect()
    }
}

impl SliceEffector for RecSystemd {
    fn set_slice(&mut self, team: &TeamName, spec: &SliceSpec) -> Result<(), EffectError> {
        self.log(format!("set {team}"));
        let mut r = self.rec.lock().unwrap();
        if let Some(e) = r.fail_next_set.take() {
            return Err(e.into());
        }
        r.slices.insert(team.clone(), spec.clone());
        Ok(())
    }
    /// Recorded with the live spec it was given, so tests see that the executor passes what
    /// the plan was made on (the bus client then sends only what differs).
    fn update_slice(
        &mut self,
        team: &TeamName,
        spec: &SliceSpec,
        live: Option<&SliceSpec>,
    ) -> Result<(), EffectError> {
        let live_mem = live.map(|l| format!("{:?}", l.memory_max));
        self.log(format!("update {team} from {live_mem:?}"));
        self.set_slice(team, spec)
    }
    fn remove_slice(&mut self, team: &TeamName) -> Result<(), EffectError> {
        self.log(format!("remove {team}"));
        let mut r = self.rec.lock().unwrap();
        if r.busy.contains(&**team) {
            return Err(SystemdError::Busy {
                unit: format!("gpu-{team}.slice"),
                tasks: 1,
            }
            .into());
        }
        r.slices.remove(team);
        Ok(())
    }
}

impl MpsEffector for RecSystemd {
    fn prepare_mps(&mut self, starts: &[(&str, &MpsSpec)]) -> Result<(), EffectError> {
        let names: Vec<&str> = starts.iter().map(|(i, _)| *i).collect();
        self.log(format!("prepare-mps {}", names.join(" ")));
        Ok(())
    }
    fn start_mps(&mut self, i: &str, spec: &MpsSpec) -> Result<(), EffectError> {
        self.log(format!("start-mps {i}"));
        self.rec.lock().unwrap().mps.insert(i.into(), spec.clone());
        Ok(())
    }
    fn stop_mps(&mut self, i: &str) -> Result<(), EffectError> {
        self.log(format!("stop-mps {i}"));
        self.rec.lock().unwrap().mps.remove(i);
        Ok(())
    }
}

impl UnitEffector for RecSystemd {
    fn stop_units(&mut self, units: &[String], timeout: Duration) -> Result<(), EffectError> {
        self.log(format!(
            "stop {} within {}s",
            units.join(" "),
            timeout.as_secs()
        ));
        Ok(())
    }
    fn start_units(&mut self, units: &[String]) -> Result<(), EffectError> {
        self.log(format!("start {}", units.join(" ")));
        Ok(())
    }
}

impl LiveUnits for RecSystemd {
    fn read_slice(&mut self, team: &str) -> Result<Option<SliceSpec>, SystemdError> {
        Ok(self.rec.lock().unwrap().slices.get(team).cloned())
    }
    fn list_slices(&mut self) -> Result<Vec<TeamName>, SystemdError> {
        Ok(self.rec.lock().unwrap().slices.keys().cloned().collect())
    }
    fn list_mps(&mut self) -> Result<Vec<(String, MpsSpec)>, SystemdError> {
        let mut r = self.rec.lock().unwrap();
        r.reads += 1;
        Ok(r.mps.clone().into_iter().collect())
    }
}

/// A fake host, its reconciler and the recorder.
struct Daemon {
    fake: FakeHost,
    sd: RecSystemd,
    rec: CoreReconciler,
    /// The fake's query counter is per process: tests that count NVML calls must not share
    /// the process with another test's calls, so every test here runs alone.
    _serial: std::sync::MutexGuard<'static, ()>,
}

static SERIAL: Mutex<()> = Mutex::new(());

impl Daemon {
    fn new(spec: &str) -> Daemon {
        Daemon::with_others(spec, None)
    }

    /// With `others` quieted around a GPU reset, as gpuctld's watcher and collector are.
    fn with_others(spec: &str, others: Option<Box<dyn OtherClients>>) -> Daemon {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let fake = FakeHost::new(spec);
        // The reconciler opens the library the environment names, as gpuctld would, and resets
        // through the fake as the VM scenarios' gpuctld does.
        std::env::set_var("GPUCTL_NVML_LIBRARY", lib_path());
        std::env::set_var("GPUCTL_GPU_RESET_CMD", "fake:");
        let sd = RecSystemd {
            rec: Arc::default(),
            nvml_state: fake.state.clone(),
        };
        let mut host = RealHost::open(Root::new(&fake.root), Some(lib_path()))
            .with_systemd(Box::new(sd.clone()));
        if let Some(o) = others {
            host = host.with_other_clients(o);
        }
        Daemon {
            rec: CoreReconciler::new(host),
            fake,
            sd,
            _serial: serial,
        }
    }

    fn root(&self) -> Root {
        Root::new(&self.fake.root)
    }

    /// Write the admin's policy file (as config management would) and load it as gpuctld does.
    fn put(&self, name: &str, text: &str) {
        let p = self.root().join(format!("/etc/gpuctl/policy.d/{name}"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn load(&self) -> Policy {
        gpuctl::daemon::load_policy(&self.root()).expect("policy loads")
    }

    fn env(&self, team: &str) -> String {
        std::fs::read_to_string(self.root().join(format!("/run/gpuctl/teams/{team}.env")))
            .unwrap_or_default()
    }

    fn observe(&self) -> Observed {
        self.fake.observe()
    }

    fn slice(&self, team: &str) -> SliceSpec {
        self.sd.rec.lock().unwrap().slices[team].clone()
    }
}

fn converged(r: &ReconcileReport) {
    assert!(r.converged(), "{r:#?}");
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
fn whole_gpus_get_uuids_in_env_minors_in_device_allow_and_a_second_run_changes_nothing() {
    let mut d = Daemon::new("h100*2");
    d.put("10-teams.toml", TWO_TEAMS);
    let p = d.load();
    let first = d.rec.reconcile(&p);
    converged(&first);
    assert_eq!(first.summary(), "2 teams, 2 GPUs converged");

    let obs = d.observe();
    let (g0, g1) = (&obs.gpus[0], &obs.gpus[1]);
    let env = d.env("infer");
    assert!(
        env.contains(&format!("CUDA_VISIBLE_DEVICES={}\n", g0.uuid)),
        "UUIDs, not indices: {env}"
    );
    assert!(g0.uuid.starts_with("GPU-"));
    assert!(
        env.contains("CUDA_MPS_PIPE_DIRECTORY=/run/gpuctl/mps/infer-gpus\n"),
        "{env}"
    );
    let infer = d.slice("infer");
    assert!(infer
        .device_allow
        .contains(&format!("/dev/nvidia{}", g0.minor)));
    assert!(!infer
        .device_allow
        .contains(&format!("/dev/nvidia{}", g1.minor)));
    assert!(infer.device_allow.contains("/dev/nvidiactl"));
    assert_eq!(infer.memory_max, Some(2113929216 * 1024 / 2));
    assert_eq!(d.slice("train").tasks_max, Some(64));
    let mps = d.sd.rec.lock().unwrap().mps.clone();
    assert_eq!(mps.keys().collect::<Vec<_>>(), ["infer-gpus"]);
    assert_eq!(mps["infer-gpus"].devices, vec![g0.uuid.clone()]);
    assert_eq!(mps["infer-gpus"].active_thread_percentage, Some(40));
    assert!(first
        .units
        .contains(&"gpuctl-mps@infer-gpus.service".to_string()));

    let state = AppliedState::load(&d.root().join(STATE_FILE)).unwrap();
    assert_eq!(state.slices["infer"], infer);

    let calls = d.sd.calls().len();
    let nvml = d.fake.mutating_calls();
    let second = d.rec.reconcile(&p);
    converged(&second);
    assert!(second.changes.is_empty(), "{second:#?}");
    assert_eq!(
        d.sd.calls().len(),
        calls,
        "no systemd call on a converged host"
    );
    assert_eq!(
        d.fake.mutating_calls(),
        nvml,
        "no NVML mutation on a converged host"
    );
}

/// Issue 14 item 2: a change of limits only is as cheap as a hand `set-property`: the GPUs are
/// as the last converged run left them, so NVML is not asked. Running the same policy again
/// (what start, drift events and the drift timer do) still observes everything.
#[test]
fn a_limit_only_change_makes_no_nvml_call_and_the_same_policy_again_observes_all() {
    let mut d = Daemon::new("h100*2");
    d.put("10-teams.toml", TWO_TEAMS);
    converged(&d.rec.reconcile(&d.load()));

    d.put(
        "10-teams.toml",
        &TWO_TEAMS.replace("memory-max = \"50%\"", "memory-max = \"25%\""),
    );
    let limits = d.load();
    let q0 = d.fake.query_calls();
    let r = d.rec.reconcile(&limits);
    converged(&r);
    assert_eq!(d.fake.query_calls(), q0, "a limit-only change queried NVML");
    assert_eq!(d.slice("infer").memory_max, Some(2113929216 * 1024 / 4));
    assert_eq!(r.changes.len(), 1, "{:#?}", r.changes);
    // The slice is updated from what was observed (the old limit), not set blind.
    let half = format!("{:?}", Some(2113929216u64 * 1024 / 2));
    assert!(
        d.sd.calls()
            .contains(&format!("update infer from {:?}", Some(half))),
        "{:?}",
        d.sd.calls()
    );
    let env = d.env("infer");
    assert!(env.contains("CUDA_VISIBLE_DEVICES=GPU-"), "env kept: {env}");

    // The same policy again: a drift check, which must see the GPUs.
    let q1 = d.fake.query_calls();
    converged(&d.rec.reconcile(&limits));
    assert!(
        d.fake.query_calls() > q1,
        "a drift run did not observe NVML"
    );

    // A change of who owns which GPU is not limit-only.
    a_gpu_change_asks_nvml(&mut d, CoreReconciler::reconcile);
}

/// Issue 14 item 2: when a policy file was the only trigger, a limit change reads nothing
/// before it acts, neither NVML nor the units: the host is as the last converged run left it.
/// The executor's read after the change still checks the result. The same trigger with the
/// same policy, or a GPU change, reads again.
#[test]
fn a_limit_change_from_a_policy_file_reads_nothing_before_it_acts() {
    let mut d = Daemon::new("h100*2");
    d.put("10-teams.toml", TWO_TEAMS);
    converged(&d.rec.reconcile(&d.load()));
    let reads = || d_reads(&d.sd);

    d.put(
        "10-teams.toml",
        &TWO_TEAMS.replace("memory-max = \"50%\"", "memory-max = \"25%\""),
    );
    let limits = d.load();
    let (q0, u0) = (d.fake.query_calls(), reads());
    let r = d.rec.reconcile_policy(&limits);
    converged(&r);
    assert_eq!(d.fake.query_calls(), q0, "NVML was asked");
    assert_eq!(reads(), u0 + 1, "units read other than after the change");
    assert_eq!(d.slice("infer").memory_max, Some(2113929216 * 1024 / 4));
    assert_eq!(r.changes.len(), 1, "{:#?}", r.changes);

    // The same change through a full trigger reads the units before acting as well.
    d.put("10-teams.toml", TWO_TEAMS);
    let back = d.load();
    let u1 = reads();
    converged(&d.rec.reconcile(&back));
    assert_eq!(reads(), u1 + 2, "a full trigger must read the units first");

    // The same policy from a policy trigger (a file touched) reads everything again.
    let (q2, u2) = (d.fake.query_calls(), reads());
    converged(&d.rec.reconcile_policy(&back));
    assert!(
        d.fake.query_calls() > q2 && reads() > u2,
        "an unchanged policy used the cache"
    );

    // A GPU change is never planned from the cache.
    a_gpu_change_asks_nvml(&mut d, CoreReconciler::reconcile_policy);
}

/// Issue 14 item 3: between reconciles gpuctld holds NVML neither initialised nor loaded (an
/// admin's `nvidia-smi -r` needs no monitoring client on the GPU; the library's mapping is
/// idle memory). The next reconcile opens it again and still sees and changes the GPUs.
#[test]
fn nvml_is_shut_down_between_reconciles_and_opened_again_when_needed() {
    let mut d = Daemon::new("h100*2");
    assert_eq!(
        fakehost::open_inits(),
        1,
        "opened at start, as gpuctld reports a missing driver at once"
    );
    d.put("10-teams.toml", TWO_TEAMS);
    converged(&d.rec.reconcile(&d.load()));
    assert_eq!(
        fakehost::open_inits(),
        0,
        "NVML still open after a reconcile"
    );

    // A full reconcile opens it again, observes the GPUs, and closes it.
    let q = d.fake.query_calls();
    converged(&d.rec.reconcile(&d.load()));
    assert!(
        d.fake.query_calls() > q,
        "the second reconcile did not ask NVML"
    );
    assert_eq!(fakehost::open_inits(), 0);

    // A GPU change after the release: the reopened library moves the GPU.
    a_gpu_change_asks_nvml(&mut d, CoreReconciler::reconcile);
    assert_eq!(fakehost::open_inits(), 0, "NVML left open by a plan");
}

/// Moves GPU 1 from `train` to `infer` through `run`: NVML must be asked, and the run must
/// converge.
fn a_gpu_change_asks_nvml(
    d: &mut Daemon,
    run: fn(&mut CoreReconciler, &Policy) -> ReconcileReport,
) {
    d.put(
        "10-teams.toml",
        &TWO_TEAMS.replace(
            "index = [1]\nowner = \"train\"",
            "index = [1]\nowner = \"infer\"",
        ),
    );
    let moved = d.load();
    let q = d.fake.query_calls();
    converged(&run(&mut d.rec, &moved));
    assert!(d.fake.query_calls() > q, "a GPU change used the cache");
    assert_eq!(d.rec.plan(&moved).changes, Vec::<String>::new());
}

fn d_reads(sd: &RecSystemd) -> usize {
    sd.rec.lock().unwrap().reads
}

/// Issue 17: a hand `set-property` on a team slice is repaired by a units-only run (what a
/// control drop-in event triggers), which reads the units again but not NVML; the drift timer's
/// full run still does.
#[test]
fn a_hand_change_of_a_slice_is_repaired_without_asking_nvml() {
    let mut d = Daemon::new("h100*2");
    d.put("10-teams.toml", TWO_TEAMS);
    let policy = d.load();
    converged(&d.rec.reconcile(&policy));
    let want = d.slice("infer");

    // The hand change: a higher memory limit and train's GPU allowed.
    {
        let mut r = d.sd.rec.lock().unwrap();
        let s = r.slices.get_mut("infer").unwrap();
        s.memory_max = Some(1 << 30);
        s.device_allow.insert("/dev/nvidia1 rw".into());
    }
    let q0 = d.fake.query_calls();
    let r = d.rec.reconcile_units(&policy);
    converged(&r);
    assert_eq!(d.fake.query_calls(), q0, "a unit drift queried NVML");
    assert_eq!(d.slice("infer"), want, "the slice was not put back");
    assert_eq!(r.changes.len(), 1, "{:#?}", r.changes);

    // Nothing differs now: a units-only run changes nothing.
    assert!(d.rec.reconcile_units(&policy).changes.is_empty());
    // The drift timer's run reads the GPUs.
    let q1 = d.fake.query_calls();
    converged(&d.rec.reconcile(&policy));
    assert!(d.fake.query_calls() > q1, "a full run did not observe NVML");
}

#[test]
fn mig_devices_bring_exactly_their_cap_nodes_into_device_allow() {
    let mut d = Daemon::new("h100");
    d.put(
        "10-mig.toml",
        r#"
version = 1
[teams.infer]
[teams.train]
[[gpu]]
index = [0]
mig = [{ profile = "1g.10gb", owner = "infer" }, { profile = "3g.40gb", owner = "train" }]
"#,
    );
    let p = d.load();
    converged(&d.rec.reconcile(&p));
    let obs = d.observe();
    let g = &obs.gpus[0];
    let mig = g.mig.as_ref().unwrap();
    let mine = |team: &str| {
        let gi = mig
            .instances
            .iter()
            .find(|i| i.owner.as_deref() == Some(team))
            .unwrap();
        let ci = &gi.compute[0];
        let minor = |k: String| obs.mig_minors[&k];
        (
            ci.uuid.clone(),
            [
                minor(format!("gpu{}/gi{}/access", g.minor, gi.id)),
                minor(format!("gpu{}/gi{}/ci{}/access", g.minor, gi.id, ci.id)),
            ],
        )
    };
    let (infer_uuid, infer_caps) = mine("infer");
    let (_, train_caps) = mine("train");
    let slice = d.slice("infer");
    for m in infer_caps {
        assert!(
            slice
                .device_allow
                .contains(&format!("/dev/nvidia-caps/nvidia-cap{m}")),
            "{slice:?}"
        );
        assert!(d
            .root()
            .join(format!("/dev/nvidia-caps/nvidia-cap{m}"))
            .exists());
    }
    for m in train_caps {
        assert!(!slice
            .device_allow
            .contains(&format!("/dev/nvidia-caps/nvidia-cap{m}")));
    }
    assert!(slice
        .device_allow
        .contains(&format!("/dev/nvidia{}", g.minor)));
    assert!(
        !slice.device_allow.iter().any(|p| p.contains('<')),
        "no placeholder reaches the host: {slice:?}"
    );
    assert!(infer_uuid.starts_with("MIG-"));
    assert!(d
        .env("infer")
        .contains(&format!("CUDA_VISIBLE_DEVICES={infer_uuid}\n")));
    let calls = d.sd.calls().len();
    assert!(d.rec.reconcile(&p).changes.is_empty());
    assert_eq!(d.sd.calls().len(), calls);
}

#[test]
fn mps_daemon_stops_before_its_mig_device_changes_and_starts_after() {
    let mut d = Daemon::new("h100");
    let geometry = |profile: &str| {
        format!(
            r#"
version = 1
[teams.infer]
[teams.infer.mps]
active-thread-percentage = 50
[[gpu]]
index = [0]
mig = [{{ profile = "{profile}", owner = "infer" }}]
"#
        )
    };
    d.put("10-mig.toml", &geometry("1g.10gb"));
    converged(&d.rec.reconcile(&d.load()));
    let old_uuid =
        d.sd.rec
            .lock()
            .unwrap()
            .mps
            .values()
            .next()
            .unwrap()
            .devices[0]
            .clone();
    assert!(old_uuid.starts_with("MIG-"));

    d.put("10-mig.toml", &geometry("2g.20gb"));
    let before = d.fake.mutating_calls();
    let n = d.sd.calls().len();
    let r = d.rec.reconcile(&d.load());
    converged(&r);
    let after = d.fake.mutating_calls();
    assert!(after > before, "the geometry changed through NVML");
    let calls = d.sd.rec.lock().unwrap().calls[n..].to_vec();
    let stop = calls
        .iter()
        .find(|c| c.0.starts_with("stop-mps"))
        .expect("MPS stopped");
    let start = calls
        .iter()
        .find(|c| c.0.starts_with("start-mps"))
        .expect("MPS started again");
    // One prepare names every daemon about to start, before the first start.
    let starts: Vec<&str> = calls
        .iter()
        .filter_map(|c| c.0.strip_prefix("start-mps "))
        .collect();
    let prepares: Vec<usize> = (0..calls.len())
        .filter(|&i| calls[i].0.starts_with("prepare-mps"))
        .collect();
    let first_start = calls.iter().position(|c| c.0.starts_with("start-mps"));
    assert_eq!(prepares.len(), 1, "{calls:?}");
    assert!(Some(prepares[0]) < first_start, "{calls:?}");
    assert_eq!(
        calls[prepares[0]].0,
        format!("prepare-mps {}", starts.join(" "))
    );
    assert_eq!(
        stop.1, before,
        "stopped before the first MIG mutation: {calls:?}"
    );
    assert_eq!(
        start.1, after,
        "started after the last MIG mutation: {calls:?}"
    );
    let new =
        d.sd.rec
            .lock()
            .unwrap()
            .mps
            .values()
            .next()
            .unwrap()
            .clone();
    assert_ne!(new.devices[0], old_uuid);
    let obs = d.observe();
    let ci = &obs.gpus[0].mig.as_ref().unwrap().instances[0].compute[0];
    assert_eq!(
        new.devices,
        vec![ci.uuid.clone()],
        "the new MIG device's UUID"
    );
}

#[test]
fn bad_policy_keeps_the_last_good_one_and_names_file_and_line() {
    let mut d = Daemon::new("h100*2");
    d.put("10-teams.toml", TWO_TEAMS);
    let shared = Mutex::new(Shared::default());
    let mut last_good = None;
    let good = load_keeping_last_good(&d.root(), &mut last_good, &shared).unwrap();
    converged(&d.rec.reconcile(&good));
    let mut saved = None;
    persist_last_good(&d.root(), &last_good, &mut saved);
    assert_eq!(saved.as_ref(), Some(&good), "the disk copy was written");
    let calls = d.sd.calls().len();

    d.put(
        "20-bad.toml",
        "version = 1\n[teams.infer]\nmemory-max = \"lots\"\n",
    );
    let p = load_keeping_last_good(&d.root(), &mut last_good, &shared).unwrap();
    assert_eq!(p, good, "the last good policy stays in force");
    let err = shared.lock().unwrap().policy_error.clone().unwrap();
    assert!(
        err.starts_with("/etc/gpuctl/policy.d/20-bad.toml:3:"),
        "file:line:col first: {err}"
    );
    assert!(err.contains("memory-max"), "{err}");
    assert_eq!(shared.lock().unwrap().policy_origin, Some("last-good"));
    converged(&d.rec.reconcile(&p));
    persist_last_good(&d.root(), &last_good, &mut saved);
    assert_eq!(d.sd.calls().len(), calls, "nothing changed on the host");

    // After a restart the disk copy is the memory.
    let mut fresh = None;
    let p = load_keeping_last_good(&d.root(), &mut fresh, &shared).unwrap();
    assert_eq!(p, good);

    std::fs::remove_file(d.root().join("/etc/gpuctl/policy.d/20-bad.toml")).unwrap();
    load_keeping_last_good(&d.root(), &mut last_good, &shared).unwrap();
    assert_eq!(shared.lock().unwrap().policy_error, None);
}

#[test]
fn moving_a_gpu_shrinks_the_first_team_and_plan_changes_nothing() {
    let mut d = Daemon::new("h100*2");
    d.put("10-teams.toml", TWO_TEAMS);
    converged(&d.rec.reconcile(&d.load()));
    d.put(
        "10-teams.toml",
        &TWO_TEAMS.replace(
            "index = [1]\nowner = \"train\"",
            "index = [1]\nowner = \"infer\"",
        ),
    );
    let p = d.load();
    let calls = d.sd.calls().len();
    let plan = d.rec.plan(&p);
    assert_eq!(d.sd.calls().len(), calls, "plan must not mutate");
    assert!(
        plan.changes
            .iter()
            .any(|c| c.starts_with("would set gpu-train.slice")),
        "{plan:#?}"
    );
    converged(&d.rec.reconcile(&p));
    let obs = d.observe();
    let minor1 = format!("/dev/nvidia{}", obs.gpus[1].minor);
    assert!(d.slice("infer").device_allow.contains(&minor1));
    assert!(
        d.slice("train").device_allow.is_empty(),
        "no GPU left: no nodes at all"
    );
    assert!(d.env("train").contains("CUDA_VISIBLE_DEVICES=\n"));
    assert!(d.env("infer").contains(&format!(
        "CUDA_VISIBLE_DEVICES={},{}\n",
        obs.gpus[0].uuid, obs.gpus[1].uuid
    )));
    // The MPS daemon follows its share: restarted on both GPUs.
    let mps = d.sd.rec.lock().unwrap().mps["infer-gpus"].clone();
    assert_eq!(mps.devices.len(), 2);
    assert!(d.rec.reconcile(&p).changes.is_empty());
}

#[test]
fn a_removed_team_with_jobs_keeps_its_slice() {
    let mut d = Daemon::new("h100*2");
    d.put("10-teams.toml", TWO_TEAMS);
    converged(&d.rec.reconcile(&d.load()));
    d.sd.rec.lock().unwrap().busy.insert("train".into());
    d.put(
        "10-teams.toml",
        "version = 1\n[teams.infer]\n[[gpu]]\nindex = [0]\nowner = \"infer\"\n",
    );
    let r = d.rec.reconcile(&d.load());
    // Nothing failed, but the host differs from the policy while the jobs run (issue 17):
    // never "converged".
    assert!(r.errors.is_empty(), "{r:#?}");
    assert!(!r.converged(), "{r:#?}");
    assert_eq!(r.result(), "differs");
    assert!(
        r.differs.iter().any(|w| w.contains("left in place")),
        "{r:#?}"
    );
    assert!(r.summary().contains("not converged"), "{}", r.summary());
    assert!(d.sd.rec.lock().unwrap().slices.contains_key("train"));
    assert!(d.sd.calls().contains(&"stop-mps infer-gpus".to_string()));
    assert!(!d.root().join("/run/gpuctl/teams/train.env").exists());
}

#[test]
fn without_nvml_slices_and_env_still_converge_and_say_why() {
    let mut d = Daemon::new("h100*2");
    std::env::set_var(
        "GPUCTL_NVML_LIBRARY",
        d.fake.dir.path().join("no-such-libnvidia-ml.so"),
    );
    d.put("10-teams.toml", TWO_TEAMS);
    let r = d.rec.reconcile(&d.load());
    converged(&r);
    assert!(
        r.warnings.iter().any(|w| w.contains("NVML not available")),
        "{r:#?}"
    );
    assert_eq!(r.gpus, 0);
    assert!(d.slice("infer").device_allow.is_empty());
    assert_eq!(d.slice("infer").memory_max, Some(2113929216 * 1024 / 2));
    assert!(d.env("infer").contains("CUDA_VISIBLE_DEVICES=\n"));
}

/// The daemon checks the policy against the host as `gpuctl check` does: a drop-in naming a
/// GPU the host lacks leaves the run not converged, saying which entry and why, while the rest
/// of the policy is applied; removing the drop-in converges.
#[test]
fn a_policy_naming_a_missing_gpu_is_not_converged_and_says_why() {
    let mut d = Daemon::new("h100*2");
    d.put("10-teams.toml", TWO_TEAMS);
    d.put(
        "20-ghost.toml",
        "version = 1\n[teams.ghost]\n[[gpu]]\nindex = [7]\nowner = \"ghost\"\n",
    );
    let r = d.rec.reconcile(&d.load());
    assert!(!r.converged(), "{r:#?}");
    let why = r.errors.join("\n");
    assert!(why.contains("does not fit this host"), "{why}");
    assert!(
        why.contains("20-ghost.toml:3:1"),
        "names file and line: {why}"
    );
    assert!(why.contains("gpu 7 does not exist"), "{why}");
    assert!(
        r.summary()
            .contains("error(s), first: the policy does not fit"),
        "{}",
        r.summary()
    );
    // The rest is in force all the same.
    assert!(
        d.env("infer").contains("CUDA_VISIBLE_DEVICES=GPU-"),
        "{}",
        d.env("infer")
    );

    std::fs::remove_file(d.root().join("/etc/gpuctl/policy.d/20-ghost.toml")).unwrap();
    converged(&d.rec.reconcile(&d.load()));
}

/// The next mutating NVML call fails with `code` (the fake's one-shot fault).
fn fail_next_nvml_call(d: &Daemon, code: &str) {
    fake_nvml::control::update(&d.fake.state, |st| {
        let call = st.mutating_calls + 1;
        st.faults.fail_at.push(fake_nvml::state::FailAt {
            call,
            code: code.into(),
        });
    })
    .unwrap();
}

const ONE_MIG: &str = r#"
version = 1
[teams.infer]
[[gpu]]
index = [0]
mig = [{ profile = "3g.40gb", owner = "infer" }]
"#;

#[test]
fn an_nvml_call_that_times_out_once_is_retried_soon_and_the_retry_converges() {
    let mut d = Daemon::new("h100");
    d.put("10-mig.toml", ONE_MIG);
    let p = d.load();
    d.observe();
    fail_next_nvml_call(&d, "TIMEOUT");
    let first = d.rec.reconcile(&p);
    assert!(!first.errors.is_empty(), "{first:#?}");
    assert!(first.heal.transient, "a timeout may not recur: {first:#?}");
    let mut backoff = Backoff::default();
    assert_eq!(
        backoff.after(&first).0,
        Requeue::Retry {
            after: FIRST_RETRY,
            attempt: 1
        }
    );
    let retry = d.rec.reconcile(&p);
    converged(&retry);
    assert_eq!(backoff.after(&retry).0, Requeue::Idle);
    assert!(d.env("infer").contains("CUDA_VISIBLE_DEVICES=MIG-"));
}

#[test]
fn an_nvml_refusal_that_would_repeat_waits_at_the_cap() {
    let mut d = Daemon::new("h100");
    d.put("10-mig.toml", ONE_MIG);
    let p = d.load();
    d.observe();
    fail_next_nvml_call(&d, "INVALID_ARGUMENT");
    let first = d.rec.reconcile(&p);
    assert!(!first.errors.is_empty(), "{first:#?}");
    assert!(!first.heal.transient, "{first:#?}");
    let (q, new) = Backoff::default().after(&first);
    assert_eq!(
        q,
        Requeue::Retry {
            after: RETRY_CAP,
            attempt: 1
        }
    );
    assert!(new);
}

#[test]
fn a_systemd_job_that_times_out_once_is_retried_soon_and_the_retry_converges() {
    let mut d = Daemon::new("h100*2");
    d.put("10-teams.toml", TWO_TEAMS);
    let p = d.load();
    d.sd.rec.lock().unwrap().fail_next_set = Some(SystemdError::JobTimeout {
        unit: "gpu-infer.slice".into(),
        op: "start",
        secs: 30,
    });
    let first = d.rec.reconcile(&p);
    assert!(
        first.errors.iter().any(|e| e.contains("gpu-infer.slice")),
        "{first:#?}"
    );
    assert!(first.heal.transient, "{first:#?}");
    let mut backoff = Backoff::default();
    assert!(matches!(
        backoff.after(&first).0,
        Requeue::Retry { after, .. } if after == FIRST_RETRY
    ));
    let retry = d.rec.reconcile(&p);
    converged(&retry);
    assert!(d.slice("infer").memory_max.is_some());
}

#[test]
fn a_mig_change_blocked_by_a_busy_instance_is_rechecked_shortly() {
    let mut d = Daemon::new("h100");
    d.put("10-mig.toml", ONE_MIG);
    let p = d.load();
    converged(&d.rec.reconcile(&p));
    let gi = d.observe().gpus[0].mig.as_ref().unwrap().instances[0].id;
    d.fake.add_process(0, gi, 0, 4242, "job.service");
    d.put("10-mig.toml", &ONE_MIG.replace("3g.40gb", "2g.20gb"));
    let p = d.load();
    let blocked = d.rec.reconcile(&p);
    assert!(blocked.errors.is_empty(), "{blocked:#?}");
    assert!(!blocked.differs.is_empty(), "{blocked:#?}");
    assert!(blocked.heal.holders, "{blocked:#?}");
    assert_eq!(
        Backoff::default().after(&blocked).0,
        Requeue::Recheck(RECHECK)
    );
}

/// Another NVML client of the process (gpuctld's health watcher): it lets go when quieted.
struct Watcher {
    nvml: Arc<Mutex<Option<nvml_wrapper::Nvml>>>,
    quieted: Arc<Mutex<u32>>,
}

impl OtherClients for Watcher {
    fn quiet(&self) -> Box<dyn std::any::Any> {
        *self.quieted.lock().unwrap() += 1;
        self.nvml.lock().unwrap().take();
        Box::new(())
    }
}

fn open_nvml() -> nvml_wrapper::Nvml {
    nvml_wrapper::Nvml::builder()
        .lib_path(lib_path().as_os_str())
        .init()
        .unwrap()
}

/// gpuctld's idle reset of a quarantined GPU: nothing is tried while a process holds it; the
/// driver (the fake, as nvidia-smi) refuses it while another NVML client of the process is
/// open, so the host has the others let go first; then it resets and the next run reads the
/// host again.
#[test]
fn an_idle_reset_refuses_a_held_gpu_and_has_the_other_nvml_clients_let_go_first() {
    let resets = |d: &Daemon| {
        d.fake
            .log()
            .into_iter()
            .filter(|(f, _, _)| f == "fakeNvmlResetGpu")
            .map(|(_, r, _)| r)
            .collect::<Vec<_>>()
    };
    // No hook: the other client stays open and the driver refuses.
    let mut d = Daemon::new("h100*2");
    let watcher = open_nvml();
    d.put("10-teams.toml", TWO_TEAMS);
    let p = d.load();
    converged(&d.rec.reconcile(&p));
    let g1 = d.observe().gpus[1].uuid.clone();
    let add = fake_nvml::control::add_process(
        &d.fake.state,
        fake_nvml::state::Process {
            pid: 77,
            gpu: 1,
            gi: None,
            ci: None,
            used_memory_mib: 100,
        },
    );
    assert_eq!(add.unwrap(), 0);
    match d.rec.reset_gpu(&p, &g1) {
        Err(ResetError::Busy(who)) => assert!(who.contains("pid 77"), "{who}"),
        r => panic!("a held GPU: {r:?}"),
    }
    assert!(resets(&d).is_empty(), "tried on a held GPU");
    fake_nvml::control::remove_process(&d.fake.state, 77).unwrap();
    match d.rec.reset_gpu(&p, &g1) {
        Err(ResetError::Failed(why)) => assert!(why.contains("in use"), "{why}"),
        r => panic!("another client open: {r:?}"),
    }
    assert_eq!(resets(&d), ["NVML_ERROR_IN_USE"]);
    drop(d);
    drop(watcher);

    // With the hook: the watcher lets go, the reset goes through, nothing stays open.
    let (nvml, quieted) = (Arc::new(Mutex::new(None)), Arc::new(Mutex::new(0)));
    let w = Watcher {
        nvml: nvml.clone(),
        quieted: quieted.clone(),
    };
    let mut d = Daemon::with_others("h100*2", Some(Box::new(w)));
    *nvml.lock().unwrap() = Some(open_nvml());
    d.put("10-teams.toml", TWO_TEAMS);
    let p = d.load();
    converged(&d.rec.reconcile(&p));
    let g1 = d.observe().gpus[1].uuid.clone();
    d.rec.reset_gpu(&p, &g1).unwrap();
    assert_eq!(resets(&d), ["NVML_SUCCESS"]);
    assert_eq!(*quieted.lock().unwrap(), 1);
    assert!(nvml.lock().unwrap().is_none());
    assert_eq!(fakehost::open_inits(), 0, "NVML left open by the reset");
    converged(&d.rec.reconcile(&p));
}
