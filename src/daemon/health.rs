//! The health watcher at work (docs/health.md): a thread of its own waits on NVML's event set
//! ([`crate::nvml::health`], up to `GPUCTL_HEALTH_INTERVAL_MS`) and reads every GPU's counters
//! after each wait; the observations go to a task on the runtime that feeds them to the pure
//! [`crate::health::Registry`] and carries out its effects: journal entries
//! (`GPUCTL_ACTION=health-quarantine|health-xid|health-warn|health-drain|health-resume`,
//! `GPUCTL_GPU`, `GPUCTL_REASON`, `GPUCTL_XID`, `GPUCTL_USER`), messages on the holders'
//! terminals ([`crate::real::tty`]), the out-of-service set placement reads
//! ([`crate::dbus_api::health`]) and the registry file under `/run/gpuctl` (through
//! [`crate::files::write_atomic`]), so that a restart of gpuctld keeps a quarantine. A reboot
//! clears it: the board is reset by then, and a fault that persists is seen again. With
//! `reset-when-idle`, the task also resets a quarantined GPU once nothing holds it
//! ([`reset_idle`]), through the reconcile loop, which owns the host.

use super::Shared;
use crate::dbus_api::reply::{DeviceChangeReply, HealthReply};
use crate::dbus_api::Backend;
use crate::events::Kind;
use crate::health::{Effect, GpuTopo, HealthError, MigDevice, Observation, Registry, Topology};
use crate::nvml::health::{HealthWatch, Waited};
use crate::observe::GpuState;
use crate::paths::Root;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::paths::HEALTH_REGISTRY as REGISTRY_FILE;
/// Environment variable: ms between counter reads (events wake the watcher at once).
pub const ENV_INTERVAL_MS: &str = "GPUCTL_HEALTH_INTERVAL_MS";
/// Default time between counter reads: a wakeup per interval is the watcher's whole idle cost.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// Most events taken in one batch after a wait, so a storm still lets the counters be read.
const MAX_BATCH: usize = 64;

/// The interval from `$GPUCTL_HEALTH_INTERVAL_MS`, else [`DEFAULT_INTERVAL`] (at least 100 ms).
pub fn interval_from_env() -> Duration {
    std::env::var(ENV_INTERVAL_MS)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_INTERVAL, Duration::from_millis)
        .max(Duration::from_millis(100))
}

/// The registry and where it is kept; shared by the watcher task and the bus methods.
pub struct HealthSide {
    root: Root,
    registry: Registry,
    watcher_error: Option<String>,
    watching: bool,
}

/// Shared handle.
pub type SharedHealth = Arc<Mutex<HealthSide>>;

impl HealthSide {
    /// The registry as the last gpuctld left it (none, or unreadable: everything in service,
    /// with a warning for the latter).
    pub fn load(root: &Root) -> HealthSide {
        let path = root.join(REGISTRY_FILE);
        let registry = match std::fs::read(&path) {
            Err(_) => Registry::default(),
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                warn!(gpuctl_action = "health", "{}: ignored: {e}", path.display());
                Registry::default()
            }),
        };
        HealthSide {
            root: root.clone(),
            registry,
            watcher_error: None,
            watching: false,
        }
    }

    fn save(&self) {
        let path = self.root.join(REGISTRY_FILE);
        let text = serde_json::to_string_pretty(&self.registry).unwrap_or_default() + "\n";
        if let Err(e) = crate::files::write_atomic(&path, text.as_bytes()) {
            warn!(
                gpuctl_action = "health",
                "cannot keep the health registry: {e}"
            );
        }
    }

    /// Whether the devices out of service changed.
    fn publish(&self, topo: &Topology) -> bool {
        crate::dbus_api::health::publish(self.registry.out_of_service(topo))
    }
}

/// The devices health decisions name, from the last reconcile's observation.
pub fn topology(gpus: &[GpuState]) -> Topology {
    Topology {
        gpus: gpus
            .iter()
            .map(|g| GpuTopo {
                index: g.index,
                uuid: g.uuid.clone(),
                mig: g
                    .mig
                    .iter()
                    .flat_map(|m| m.instances.iter())
                    .flat_map(|gi| {
                        gi.compute.iter().map(|ci| MigDevice {
                            gi: gi.id,
                            ci: ci.id,
                            uuid: ci.uuid.clone(),
                        })
                    })
                    .filter(|m| m.uuid.starts_with("MIG-"))
                    .collect(),
            })
            .collect(),
    }
}

fn topology_of(shared: &Mutex<Shared>) -> Topology {
    let sh = super::lock(shared);
    sh.last_report
        .as_ref()
        .and_then(|r| r.view.as_ref())
        .map(|v| topology(&v.gpus))
        .unwrap_or_default()
}

fn settings_of(shared: &Mutex<Shared>) -> crate::health::HealthSettings {
    super::lock(shared)
        .policy
        .as_ref()
        .map(|p| p.host.health.clone())
        .unwrap_or_default()
}

fn library_of(shared: &Mutex<Shared>) -> Option<PathBuf> {
    let sh = super::lock(shared);
    crate::nvml::library_path(
        sh.policy
            .as_ref()
            .and_then(|p| p.host.nvml_library.as_deref()),
    )
}

/// What the watcher thread sends: when it read them and the observations, or why it cannot
/// read NVML (`Err`).
type Batch = (Instant, Result<Vec<Observation>, String>);

/// Lets a GPU reset have the watcher thread let go of NVML. The watcher looks between its
/// waits, so a hold waits up to one wait (the interval) for it; an event wait cannot be
/// interrupted, and a shorter wait would cost the idle host wakeups.
#[derive(Debug, Default)]
pub struct WatchGate {
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    /// Holds asked for and not dropped.
    holds: usize,
    /// The watcher has NVML open, or may open it before it looks again.
    open: bool,
}

/// The watcher stays off NVML while this lives.
#[derive(Debug)]
pub struct GateHold(Arc<WatchGate>);

impl Drop for GateHold {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        s.holds -= 1;
        self.0.cv.notify_all();
    }
}

impl WatchGate {
    /// Ask the watcher to let go of NVML and wait up to `wait` for it (past that, the reset
    /// goes on and the driver decides).
    pub fn hold(self: &Arc<Self>, wait: Duration) -> GateHold {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.holds += 1;
        let (s, timeout) = self
            .cv
            .wait_timeout_while(s, wait, |s| s.open)
            .unwrap_or_else(|e| e.into_inner());
        if timeout.timed_out() && s.open {
            warn!(
                gpuctl_action = "health",
                "the health watcher did not let go of NVML within {} ms",
                wait.as_millis()
            );
        }
        GateHold(self.clone())
    }

    /// In the watcher, before it uses NVML: while a hold is asked for, let go of `watch` and
    /// wait; then mark NVML as in use (opened now if `watch` is empty).
    fn checkpoint(&self, watch: &mut Option<HealthWatch>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.holds > 0 {
            *watch = None;
            s.open = false;
            self.cv.notify_all();
            while s.holds > 0 {
                s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        }
        s.open = true;
    }

    /// The watcher holds no NVML (an open failed).
    fn closed(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.open = false;
        self.cv.notify_all();
    }
}

/// gpuctld's other NVML clients, quieted for a reset ([`crate::real::OtherClients`]): the
/// watcher first (it may take an interval), then the usage collector (its readers wait).
#[derive(Debug)]
pub struct Quiet {
    /// The watcher's gate.
    pub gate: Arc<WatchGate>,
    /// How long a reset waits for the watcher.
    pub wait: Duration,
}

impl crate::real::OtherClients for Quiet {
    fn quiet(&self) -> Box<dyn std::any::Any> {
        let watcher = self.gate.hold(self.wait);
        let collector = crate::dbus_api::collector::quiet();
        Box::new((watcher, collector))
    }
}

/// Start the watcher thread; it runs for the life of the process.
pub fn spawn_watcher(
    shared: Arc<Mutex<Shared>>,
    tx: mpsc::UnboundedSender<Batch>,
    interval: Duration,
    gate: Arc<WatchGate>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("health".into())
        // Loading and initialising NVML (and the fake's JSON state in a debug build) needs more
        // than a small stack: 256 KiB overflowed in vm-tests 67. Untouched pages cost no RSS.
        .stack_size(2 * 1024 * 1024)
        .spawn(move || {
            let ms = interval.as_millis().min(u32::MAX as u128) as u32;
            let mut watch: Option<HealthWatch> = None;
            loop {
                gate.checkpoint(&mut watch);
                let w = match &watch {
                    Some(w) => w,
                    None => match HealthWatch::open(library_of(&shared)) {
                        Ok(w) => watch.insert(w),
                        Err(e) => {
                            gate.closed();
                            if tx.send((Instant::now(), Err(e.to_string()))).is_err() {
                                return;
                            }
                            std::thread::sleep(interval);
                            continue;
                        }
                    },
                };
                let mut batch = Vec::new();
                let mut lost = false;
                let mut next = w.wait(ms);
                loop {
                    match next {
                        Waited::Event(o) => batch.push(o),
                        Waited::Timeout => break,
                        Waited::Lost => {
                            lost = true;
                            break;
                        }
                        Waited::Failed(why) => {
                            warn!(
                                gpuctl_action = "health",
                                "NVML event wait: {why}; reopening"
                            );
                            watch = None;
                            gate.closed();
                            std::thread::sleep(interval);
                            break;
                        }
                    }
                    if batch.len() >= MAX_BATCH {
                        break;
                    }
                    next = w.wait(0);
                }
                let Some(w) = &watch else { continue };
                batch.extend(w.counters());
                if tx.send((Instant::now(), Ok(batch))).is_err() {
                    return;
                }
                if lost {
                    // A lost GPU answers every wait at once: the interval paces the reads.
                    std::thread::sleep(interval);
                }
            }
        })
        .map(|_| ())
}

/// What the health task works with.
pub struct RunCx {
    /// Files.
    pub root: Root,
    /// The daemon.
    pub backend: Arc<dyn Backend>,
    /// systemd (leases, stops).
    pub sd: crate::systemd::Systemd,
    /// The daemon's state.
    pub shared: Arc<Mutex<Shared>>,
    /// The registry.
    pub side: SharedHealth,
    /// The placement lock, held from an idle reset's look until the reset is over.
    pub placing: Arc<tokio::sync::Mutex<()>>,
}

/// Consume the watcher's batches until the runtime ends.
pub async fn run(cx: RunCx, mut rx: mpsc::UnboundedReceiver<Batch>) {
    let (root, backend, sd) = (cx.root.clone(), cx.backend.clone(), cx.sd.clone());
    let (shared, side) = (cx.shared.clone(), cx.side.clone());
    let mut resets = Resets::default();
    let mut said: Option<String> = None;
    loop {
        // With `on-fault = "stop"` a quarantine's grace ends between batches: sleep until the
        // first one due instead of polling (a policy change is seen at the next batch).
        let next = super::lock(&side).registry.next_stop(&settings_of(&shared));
        let batch = match next {
            Some(at) => {
                let wait = Duration::from_secs((at + 1).saturating_sub(super::unix_now()));
                tokio::select! {
                    b = rx.recv() => b,
                    _ = tokio::time::sleep(wait) => {
                        stop_due(&root, &*backend, &sd, &shared, &side).await;
                        continue;
                    }
                }
            }
            None => rx.recv().await,
        };
        let Some((read_at, batch)) = batch else { break };
        let obs = match batch {
            Ok(mut o) => {
                // Read before a reset that has since cleared them: the next read tells.
                o.retain(|o| resets.done.get(o.gpu()).is_none_or(|at| read_at > *at));
                o
            }
            Err(why) => {
                if said.as_deref() != Some(why.as_str()) {
                    warn!(gpuctl_action = "health", "health watcher: {why}");
                }
                let mut s = super::lock(&side);
                s.watching = false;
                s.watcher_error = Some(why.clone());
                said = Some(why);
                continue;
            }
        };
        said = None;
        let topo = topology_of(&shared);
        let settings = settings_of(&shared);
        let now = super::unix_now();
        let effects = {
            let mut s = super::lock(&side);
            s.watching = true;
            s.watcher_error = None;
            let before = s.registry.clone();
            let mut effects = Vec::new();
            for o in &obs {
                effects.extend(s.registry.observe(o, &topo, &settings, now));
            }
            if !topo.gpus.is_empty() {
                s.registry.prune(&topo);
            }
            if s.registry != before {
                s.save();
            }
            let changed = s.publish(&topo);
            (effects, changed)
        };
        let (effects, changed) = effects;
        if changed {
            backend.send(env_reconcile());
        }
        for e in effects {
            act(&root, &*backend, &sd, &topo, &settings, e).await;
        }
        stop_due(&root, &*backend, &sd, &shared, &side).await;
        reset_idle(&cx, &mut resets).await;
    }
}

/// How long after an idle reset gpuctld resets that GPU again: a failed one is retried, and
/// one that did not clear the fault (quarantined again at the next read) is not repeated at
/// every read.
const RESET_RETRY: Duration = Duration::from_secs(300);

/// What the idle reset remembers between batches.
#[derive(Debug, Default)]
struct Resets {
    /// When each GPU was last reset, or tried.
    tried: std::collections::BTreeMap<String, Instant>,
    /// What each GPU waits for, as last logged (logged again only when it changes).
    waiting: std::collections::BTreeMap<String, String>,
    /// When each GPU's last reset was over: what the watcher read before then is stale.
    done: std::collections::BTreeMap<String, Instant>,
}

/// `reset-when-idle`: reset each GPU the registry says a reset may bring back, once nothing
/// holds it or any of its MIG devices (no lease, no process), under the placement lock so that
/// no job is placed there meanwhile. The reset's own look at the processes and the driver
/// refuse a busy GPU too.
async fn reset_idle(cx: &RunCx, resets: &mut Resets) {
    let settings = settings_of(&cx.shared);
    let topo = topology_of(&cx.shared);
    let candidates = super::lock(&cx.side)
        .registry
        .reset_candidates(&topo, &settings);
    resets.waiting.retain(|g, _| candidates.contains(g));
    for gpu in candidates {
        if resets
            .tried
            .get(&gpu)
            .is_some_and(|t| t.elapsed() < RESET_RETRY)
        {
            continue;
        }
        let index = topo
            .gpus
            .iter()
            .find(|g| g.uuid == gpu)
            .map_or(String::from("?"), |g| g.index.to_string());
        let _guard = cx.placing.lock().await;
        let held = match held(&cx.root, &*cx.backend, &cx.sd).await {
            Ok(h) => h,
            Err(why) => {
                wait_note(resets, &gpu, &index, why);
                continue;
            }
        };
        let holders = crate::health::Registry::reset_holders(&topo, &gpu, &held);
        if !holders.is_empty() {
            wait_note(
                resets,
                &gpu,
                &index,
                format!("held by {}", holders.join(", ")),
            );
            continue;
        }
        resets.waiting.remove(&gpu);
        info!(
            gpuctl_action = "health-reset",
            gpuctl_gpu = %gpu,
            "GPU {index} ({gpu}) is idle: resetting it (reset-when-idle)"
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        let req = crate::dbus_api::Request::ResetGpu {
            gpu: gpu.clone(),
            reply: tx,
        };
        if !cx.backend.send(req) {
            return;
        }
        let Ok(r) = rx.await else { return };
        resets.tried.insert(gpu.clone(), Instant::now());
        match r {
            Ok(at) => {
                resets.done.insert(gpu.clone(), at);
                info!(
                    gpuctl_action = "health-reset",
                    gpuctl_gpu = %gpu,
                    "GPU {index} ({gpu}) reset"
                );
                // The topology after the reconcile that rebuilt its instances.
                let now_topo = topology_of(&cx.shared);
                let effects = {
                    let mut s = super::lock(&cx.side);
                    let e = s.registry.reset_done(&topo, &gpu);
                    s.save();
                    let _ = s.publish(&now_topo);
                    e
                };
                cx.backend.send(env_reconcile());
                for e in effects {
                    act(&cx.root, &*cx.backend, &cx.sd, &topo, &settings, e).await;
                }
            }
            Err(crate::dbus_api::ResetError::Busy(who)) => {
                // A process the collection had not seen yet: wait for it like any holder.
                resets.tried.remove(&gpu);
                wait_note(resets, &gpu, &index, format!("held by {who}"));
            }
            Err(why) => {
                warn!(
                    gpuctl_action = "health-reset",
                    gpuctl_gpu = %gpu,
                    "GPU {index} ({gpu}): the idle reset failed: {why}; tried again in {} s",
                    RESET_RETRY.as_secs()
                );
            }
        }
    }
}

/// Log what an idle reset waits for, once per change.
fn wait_note(resets: &mut Resets, gpu: &str, index: &str, why: String) {
    if resets.waiting.get(gpu) != Some(&why) {
        info!(
            gpuctl_action = "health-reset",
            gpuctl_gpu = %gpu,
            "GPU {index} ({gpu}) needs a reset; waiting until it is idle: {why}"
        );
        resets.waiting.insert(gpu.to_string(), why);
    }
}

/// Every device's holders: its placement leases and the processes of a usage collection.
/// Either one unreadable: nothing can be called idle.
async fn held(
    root: &Root,
    backend: &dyn Backend,
    sd: &crate::systemd::Systemd,
) -> Result<std::collections::BTreeMap<String, Vec<String>>, String> {
    let mut held: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let leases = crate::dbus_api::place::leases(sd, root)
        .await
        .map_err(|e| format!("cannot read the leases: {e}"))?;
    for l in leases {
        for d in &l.devices {
            held.entry(d.clone())
                .or_default()
                .push(format!("the job of {} ({})", l.user, l.unit));
        }
    }
    let u = crate::dbus_api::usage::usage(backend, root)
        .await
        .map_err(|e| format!("no usage collection: {e}"))?;
    if let Some(why) = &u.nvml_unavailable {
        return Err(why.clone());
    }
    for g in &u.gpus {
        let procs = g.processes.iter().map(|p| (&g.uuid, p));
        let mig = g
            .mig_devices
            .iter()
            .flat_map(|m| m.processes.iter().map(move |p| (&m.uuid, p)));
        for (dev, p) in procs.chain(mig) {
            held.entry(dev.clone())
                .or_default()
                .push(format!("pid {}", p.pid));
        }
    }
    Ok(held)
}

/// `on-fault = "stop"`: stop the jobs (member scopes) on every device whose grace is over, tell
/// their holders, and record it so that no restart stops them twice. Processes outside every
/// lease (a service started in the slice) are not gpuctl's jobs: the journal names the device
/// and they keep running.
async fn stop_due(
    root: &Root,
    backend: &dyn Backend,
    sd: &crate::systemd::Systemd,
    shared: &Mutex<Shared>,
    side: &SharedHealth,
) {
    let settings = settings_of(shared);
    // Whole seconds: a quarantine at 10.9 s is `since` 10, so the grace is counted from 11 and
    // a stop is at most a second late, never early.
    let due = super::lock(side)
        .registry
        .stops_due(&settings, super::unix_now().saturating_sub(1));
    if due.is_empty() {
        return;
    }
    let topo = topology_of(shared);
    let leases = crate::dbus_api::place::leases(sd, root)
        .await
        .unwrap_or_default();
    for device in due {
        let ids = device_and_mig(&topo, &device);
        let on: Vec<&crate::placement::Lease> = leases
            .iter()
            .filter(|l| l.devices.iter().any(|d| ids.contains(d)))
            .collect();
        let uids = holders(root, backend, sd, &topo, &device).await;
        let text = format!(
            "GPU device {device} is out of service and its grace of {} s is over \
             (on-fault = \"stop\"): gpuctl stops the jobs on it now.",
            settings.grace.as_secs()
        );
        tell_all(root, &uids, &text).await;
        post(Kind::DeviceStop, &device, text);
        let mut stopped = Vec::new();
        for l in &on {
            match sd.stop_unit(&l.unit).await {
                Ok(()) => stopped.push(l.unit.as_str()),
                Err(e) => warn!(
                    gpuctl_action = "health-stop",
                    gpuctl_gpu = %device,
                    gpuctl_unit = %l.unit,
                    "cannot stop {} on out-of-service device {device}: {e}",
                    l.unit
                ),
            }
        }
        warn!(
            gpuctl_action = "health-stop",
            gpuctl_gpu = %device,
            "device {device}: grace over (on-fault = stop): stopped {} job(s){}",
            stopped.len(),
            if stopped.is_empty() {
                String::new()
            } else {
                format!(": {}", stopped.join(", "))
            }
        );
        let mut s = super::lock(side);
        s.registry.mark_stopped(&device);
        s.save();
    }
}

/// `device` and, for a GPU, its MIG devices: a GPU's fault is every MIG device's.
fn device_and_mig(topo: &Topology, device: &str) -> Vec<String> {
    let mut ids = vec![device.to_string()];
    if let Some(g) = topo.gpus.iter().find(|g| g.uuid == device) {
        ids.extend(g.mig.iter().map(|m| m.uuid.clone()));
    }
    ids
}

/// The uids holding `device` (its processes and placement leases; a GPU's MIG devices'
/// too), from a fresh usage collection and the member scopes' leases.
async fn holders(
    root: &Root,
    backend: &dyn Backend,
    sd: &crate::systemd::Systemd,
    topo: &Topology,
    device: &str,
) -> Vec<u32> {
    let ids = device_and_mig(topo, device);
    let mut uids = Vec::new();
    if let Ok(u) = crate::dbus_api::usage::usage(backend, root).await {
        for g in &u.gpus {
            if ids.contains(&g.uuid) {
                uids.extend(g.processes.iter().filter_map(|p| p.uid));
            }
            for m in g.mig_devices.iter().filter(|m| ids.contains(&m.uuid)) {
                uids.extend(m.processes.iter().filter_map(|p| p.uid));
            }
        }
    }
    for l in crate::dbus_api::place::leases(sd, root)
        .await
        .unwrap_or_default()
    {
        if l.devices.iter().any(|d| ids.contains(d)) {
            uids.push(l.uid);
        }
    }
    uids.sort_unstable();
    uids.dedup();
    uids
}

async fn tell_all(root: &Root, uids: &[u32], text: &str) -> usize {
    let (root, uids, text) = (root.clone(), uids.to_vec(), text.to_string());
    tokio::task::spawn_blocking(move || {
        uids.iter()
            .map(|u| crate::real::tty::tell(&root, *u, &text).len())
            .sum()
    })
    .await
    .unwrap_or(0)
}

async fn act(
    root: &Root,
    backend: &dyn Backend,
    sd: &crate::systemd::Systemd,
    topo: &Topology,
    settings: &crate::health::HealthSettings,
    e: Effect,
) {
    match e {
        Effect::Quarantined {
            device,
            reason,
            reset_when_idle,
        } => {
            let uids = holders(root, backend, sd, topo, &device).await;
            let then = if reset_when_idle {
                " It needs a GPU reset, done when nothing runs on it."
            } else {
                ""
            };
            let jobs = if settings.on_fault == crate::health::OnFault::Stop {
                format!(
                    "Jobs on it are stopped in {} s (on-fault = \"stop\")",
                    settings.grace.as_secs()
                )
            } else {
                "Running jobs on it may fail".to_string()
            };
            let text = format!(
                "GPU device {device} is out of service: {reason}. {jobs}; no new job is placed \
                 there.{then}"
            );
            let n = tell_all(root, &uids, &text).await;
            post(Kind::DeviceOut, &device, text);
            warn!(
                gpuctl_action = "health-quarantine",
                gpuctl_gpu = %device,
                gpuctl_reason = %reason,
                "device {device} out of service: {reason}; told {} holder(s) on {n} terminal(s)",
                uids.len()
            );
        }
        Effect::ApplicationXid { device, code } => {
            let uids = holders(root, backend, sd, topo, &device).await;
            let text = format!(
                "GPU device {device} reported XID {code}, an application error (a job on it \
                 faulted); the device stays in service."
            );
            tell_all(root, &uids, &text).await;
            info!(
                gpuctl_action = "health-xid",
                gpuctl_gpu = %device,
                gpuctl_xid = code,
                "application XID {code} on {device} (counted; the device stays in service)"
            );
        }
        Effect::Warning { device, reason } => warn!(
            gpuctl_action = "health-warn",
            gpuctl_gpu = %device,
            gpuctl_reason = %reason,
            "device {device}: {reason}"
        ),
        e @ (Effect::Drained { .. } | Effect::Resumed { .. }) => journal_change(&e),
    }
}

/// A device's own event (`gpuctl events`): the host's, every caller's.
fn post(kind: Kind, device: &str, text: String) {
    crate::events::post(crate::events::Event {
        device: Some(device.to_string()),
        ..crate::events::Event::new(kind, None, text)
    });
}

/// The journal entry and the event of a drain or a resume, with who and why.
fn journal_change(e: &Effect) {
    match e {
        Effect::Drained { device, reason, by } => {
            warn!(
                gpuctl_action = "health-drain",
                gpuctl_gpu = %device,
                gpuctl_reason = %reason,
                gpuctl_user = %by,
                "device {device} drained by {by}: {reason}"
            );
            let text = format!("GPU device {device} is out of service, drained by {by}: {reason}");
            post(Kind::DeviceOut, device, text);
        }
        Effect::Resumed { device, reason, by } => {
            info!(
                gpuctl_action = "health-resume",
                gpuctl_gpu = %device,
                gpuctl_reason = %reason,
                gpuctl_user = %by,
                "device {device} back in service ({by}): {reason}"
            );
            let text = format!("GPU device {device} is back in service ({by}): {reason}");
            post(Kind::DeviceBack, device, text);
        }
        _ => {}
    }
}

/// A reconcile, so that the team env files leave out (or take back) the devices out of
/// service.
pub fn env_reconcile() -> crate::dbus_api::Request {
    crate::dbus_api::Request::trigger(
        crate::dbus_api::Trigger::Health,
        crate::dbus_api::Observe::Units,
    )
}

/// Publish the out-of-service set again over the latest topology (after a reconcile: a GPU
/// that is out takes its new MIG devices with it); whether its devices changed.
pub fn republish(side: &SharedHealth, shared: &Mutex<Shared>) -> bool {
    let topo = topology_of(shared);
    super::lock(side).publish(&topo)
}

/// `Health` for the bus.
pub fn reply(side: &SharedHealth, shared: &Mutex<Shared>) -> HealthReply {
    let topo = topology_of(shared);
    let s = super::lock(side);
    let mut r = HealthReply::from_registry(&s.registry, &topo);
    r.watching = s.watching;
    r.watcher_error = s.watcher_error.clone();
    r
}

/// An admin's drain or resume, journalled, kept and published at once.
pub fn change(
    side: &SharedHealth,
    shared: &Mutex<Shared>,
    device: &str,
    resume: bool,
    reason: &str,
    by: &str,
) -> Result<DeviceChangeReply, HealthError> {
    let topo = topology_of(shared);
    let mut s = super::lock(side);
    let e = if resume {
        s.registry.resume(&topo, device, reason, by)?
    } else {
        s.registry
            .drain(&topo, device, reason, by, super::unix_now())?
    };
    s.save();
    let _ = s.publish(&topo);
    let r = match &e {
        Effect::Drained { device, reason, by } | Effect::Resumed { device, reason, by } => {
            DeviceChangeReply {
                device: device.clone(),
                in_service: resume,
                reason: reason.clone(),
                by: by.clone(),
            }
        }
        _ => DeviceChangeReply::default(),
    };
    drop(s);
    // Journal only: an admin's change tells nobody's terminal (running jobs keep running).
    journal_change(&e);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn a_hold_waits_for_the_watcher_to_let_go_and_keeps_it_off_until_dropped() {
        let gate = Arc::new(WatchGate::default());
        // The watcher uses NVML, then sits in a wait before it looks again.
        gate.checkpoint(&mut None);
        let (tx, rx) = channel();
        let g = gate.clone();
        let watcher = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            tx.send("looks").unwrap();
            g.checkpoint(&mut None);
            tx.send("back on NVML").unwrap();
        });
        let hold = gate.hold(Duration::from_secs(30));
        assert_eq!(
            rx.try_recv(),
            Ok("looks"),
            "the hold did not wait for the watcher"
        );
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the watcher went back to NVML while held"
        );
        drop(hold);
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok("back on NVML"));
        watcher.join().unwrap();

        // A watcher whose open failed holds nothing: no wait.
        gate.closed();
        let t = Instant::now();
        drop(gate.hold(Duration::from_secs(30)));
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }
}
