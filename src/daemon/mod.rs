//! `gpuctld`: the agent that keeps the host matching the policy.
//!
//! One tokio current-thread runtime, no busy polling. Reconciles run on a blocking thread (the
//! effectors are synchronous) while the runtime thread keeps serving D-Bus and the watchdog.
//! Triggers: start, `SIGHUP` (`systemctl reload`), inotify on the policy directories (a file
//! that has landed is loaded at once: `watch::PolicyWatch::next_settled`), the D-Bus
//! `Reload`/`Apply` methods, systemd removing a `gpu-*.slice` or `gpuctl-mps@*` unit, a hand
//! change of an owned unit's control drop-ins or an MPS unit going inactive ([`drift`]:
//! repaired within a second), and a slow drift timer for MIG, which has no event. Queued triggers coalesce into one run.
//!
//! Loading runs on a blocking thread too, under a panic guard and a time limit ([`LOAD_LIMIT`]):
//! a file that made the loader panic or hang would otherwise take the runtime thread, and with it
//! every `gpuctl shell`, down. The watchdog ([`watchdog`]) pings systemd only while the reconcile
//! loop itself makes progress, inside a step that is within its time limit; a wedged load or
//! reconcile stops the pings and systemd restarts gpuctld. While the loop waits for work the
//! watchdog is disarmed and its thread sleeps.
//!
//! A policy that fails to load never replaces the last good one: that stays in force (in memory
//! and in `/var/lib/gpuctl/last-good/`), and the error goes to `STATUS=`, the journal and
//! `Status`.

use crate::join::Refusal;
use crate::paths::Root;
use crate::policy::Policy;
use crate::systemd::client::BlockingSystemd;
use crate::systemd::{mps, props, Systemd};
use futures_lite::StreamExt;
use reconcile::{CoreReconciler, ReconcileReport, Reconciler};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};
pub use watchdog::Progress;

pub mod drift;
pub mod generator;
pub mod health;
pub mod idle;
mod ledger;
pub mod logging;
pub mod reconcile;
pub mod requeue;
pub mod state;
pub mod watch;
pub mod watchdog;

/// The value behind `m`, even when a thread panicked holding it: the state stays usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Seconds since the epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Load the policy from the standard places under `root` with [`crate::policy::load`]. Warnings
/// go to the journal; the error is one line, `file:line:col: key: message` of the first error
/// (and how many more there are), for `STATUS=`, the journal and `Status`.
pub fn load_policy(root: &Root) -> Result<Policy, PolicyLoadError> {
    let out = crate::policy::load(root);
    for d in out
        .diagnostics
        .iter()
        .filter(|d| d.severity == crate::policy::Severity::Warning)
    {
        warn!(gpuctl_action = "load-policy", "{d}");
    }
    if let Some((path, why)) = out.unreadable.first() {
        return Err(PolicyLoadError::Unreadable {
            path: path.clone(),
            why: why.clone(),
        });
    }
    let errors: Vec<&crate::policy::Diagnostic> = out
        .diagnostics
        .iter()
        .filter(|d| d.severity == crate::policy::Severity::Error)
        .collect();
    match (out.policy, errors.first()) {
        (Some(p), None) => Ok(p),
        (_, Some(first)) => {
            for d in &errors[1..] {
                error!(gpuctl_action = "load-policy", "{d}");
            }
            Err(PolicyLoadError::Invalid {
                first: error_line(first),
                more: errors.len() - 1,
            })
        }
        (None, None) => Err(PolicyLoadError::NoDiagnostic),
    }
}

/// Why the policy on disk is not in force: one line for `STATUS=`, the journal and `Status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyLoadError {
    /// A policy file exists but cannot be read.
    #[error("{}: cannot read: {why}", path.display())]
    Unreadable {
        /// Host path of the file.
        path: std::path::PathBuf,
        /// The reader's words.
        why: String,
    },
    /// Validation failed: the first error (`file:line:col: key: message`) and how many more.
    #[error("{first}{}", if *more == 0 { String::new() } else { format!(" (and {more} more error(s))") })]
    Invalid {
        /// The first error, without its severity word.
        first: String,
        /// Errors after the first.
        more: usize,
    },
    /// The loader gave no policy and no error (a bug, said rather than hidden).
    #[error("policy rejected without a diagnostic")]
    NoDiagnostic,
}

/// `file:line:col: key: message (help)`: the diagnostic without its severity word, which the
/// status line's "policy error in" already says.
fn error_line(d: &crate::policy::Diagnostic) -> String {
    let esc = crate::policy::escape_controls;
    let loc = d.loc.as_ref().map(|l| format!("{l}: ")).unwrap_or_default();
    let key = (!d.key.is_empty()).then(|| format!("{}: ", esc(&d.key)));
    let help = d.help.as_ref().map(|h| format!(" ({})", esc(h)));
    format!(
        "{loc}{}{}{}",
        key.unwrap_or_default(),
        esc(&d.message),
        help.unwrap_or_default()
    )
}

/// Load the policy under `root`; on failure keep `last_good` (in memory, else the copy on disk
/// from before a restart) in force. Updates `shared` (the policy in force, its origin, the
/// error naming file, line and key) and returns the policy to act on, `None` when there has
/// never been a good one. The disk copy is written by [`persist_last_good`], after the
/// reconcile: its fsyncs are not on the path from a policy file to the host (issue 14).
pub fn load_keeping_last_good(
    root: &Root,
    last_good: &mut Option<Policy>,
    shared: &Mutex<Shared>,
) -> Option<Policy> {
    match load_policy(root) {
        Ok(p) => {
            *last_good = Some(p.clone());
            let mut sh = lock(shared);
            sh.policy_error = None;
            sh.policy = Some(p.clone());
            sh.policy_origin = Some("current");
            Some(p)
        }
        Err(e) => {
            error!(gpuctl_action = "load-policy", "policy error: {e}");
            if last_good.is_none() {
                // After a restart the in-memory copy is gone; the disk copy is the memory.
                *last_good = state::load_last_good(&root.join(state::LAST_GOOD));
            }
            let mut sh = lock(shared);
            sh.policy_error = Some(e.to_string());
            sh.policy = last_good.clone();
            sh.policy_origin = last_good.as_ref().map(|_| "last-good");
            last_good.clone()
        }
    }
}

/// Write `last_good` to its disk copy under `root` unless `saved` (what was last written) is
/// the same policy; `saved` follows. A failure is logged: the copy only matters after a
/// restart into a bad policy.
pub fn persist_last_good(root: &Root, last_good: &Option<Policy>, saved: &mut Option<Policy>) {
    let Some(p) = last_good.as_ref().filter(|p| saved.as_ref() != Some(*p)) else {
        return;
    };
    match state::save_last_good(&root.join(state::LAST_GOOD), p) {
        Ok(()) => *saved = Some(p.clone()),
        Err(e) => warn!("cannot save last good policy: {e}"),
    }
}

/// Why gpuctld could not start (or run on).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Not started by systemd: gpuctld drives slices, scopes and units through systemd's
    /// manager, so a host without it as PID 1 (a container, a chroot) cannot run it.
    #[error(
        "gpuctld needs systemd as PID 1 (no /run/systemd/system, and PID 1 is {pid1}): run it on \
         a host booted with systemd ({cause})"
    )]
    NoSystemd {
        /// PID 1's name (`/proc/1/comm`), or "unknown".
        pid1: String,
        /// What failed first (the bus or systemd's manager).
        cause: String,
    },
    /// No system bus.
    #[error("system bus: {0}")]
    Bus(#[source] zbus::Error),
    /// systemd's manager is not reachable on it.
    #[error(transparent)]
    Systemd(#[from] crate::systemd::SystemdError),
    /// The bus API could not be exported or its name taken.
    #[error("D-Bus API {name}: {source}", name = crate::dbus_api::BUS_NAME)]
    Serve {
        /// zbus' words.
        #[source]
        source: zbus::Error,
    },
    /// A signal handler could not be installed.
    #[error("{0}")]
    Signal(#[source] std::io::Error),
    /// Logging could not be set up.
    #[error(transparent)]
    Logging(#[from] logging::LoggingError),
}

/// [`DaemonError::NoSystemd`] when this host was not booted with systemd (sd_booted(3)'s test,
/// `/run/systemd/system`, or PID 1's name), so the error says what is missing instead of the
/// bus's `ServiceUnknown`; `None` on a systemd host, where `cause` is the error to show.
fn without_systemd(root: &Root, cause: String) -> Option<DaemonError> {
    let pid1 = std::fs::read_to_string(root.join("/proc/1/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let booted = root.join("/run/systemd/system").is_dir() || pid1 == "systemd";
    (!booted).then_some(DaemonError::NoSystemd { pid1, cause })
}

/// Daemon settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Root for every host path.
    pub root: Root,
    /// Drift timer period.
    pub drift: Duration,
    /// How long the policy directories must be quiet before a change still under way (a file
    /// moved away or created but not yet written) is loaded anyway.
    pub debounce: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            root: Root::default(),
            drift: Duration::from_secs(300),
            debounce: Duration::from_millis(300),
        }
    }
}

/// What the D-Bus API and `STATUS=` show: the bus API's own state type, which the daemon
/// keeps behind a mutex and hands out through [`crate::dbus_api::Backend`].
pub use crate::dbus_api::AgentState as Shared;

/// Units whose removal by systemd should trigger a reconcile.
type ExpectedUnits = Arc<Mutex<std::collections::BTreeSet<String>>>;

/// Wall-clock microseconds since the epoch.
pub fn unix_now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

pub use crate::dbus_api::Request;
pub use crate::dbus_api::{Observe, Trigger};

/// The daemon as the bus API sees it ([`crate::dbus_api::Backend`]): the shared state and the
/// reconcile loop's queue.
struct BusBackend {
    shared: Arc<Mutex<Shared>>,
    tx: mpsc::UnboundedSender<Request>,
    health: health::SharedHealth,
}

impl crate::dbus_api::Backend for BusBackend {
    fn state(&self) -> Shared {
        lock(&self.shared).clone()
    }

    fn policy(&self) -> Result<Policy, Refusal> {
        let sh = lock(&self.shared);
        sh.policy.clone().ok_or_else(|| {
            let why = sh.policy_error.as_deref().unwrap_or("not loaded");
            Refusal::NoPolicy(why.into())
        })
    }

    fn send(&self, req: Request) -> bool {
        self.tx.send(req).is_ok()
    }

    fn idle(&self) -> crate::dbus_api::reply::IdleReply {
        lock(&self.shared).idle.clone()
    }

    fn health(&self) -> crate::dbus_api::reply::HealthReply {
        health::reply(&self.health, &self.shared)
    }

    fn device_change(
        &self,
        device: &str,
        resume: bool,
        reason: &str,
        by: &str,
    ) -> Result<crate::dbus_api::reply::DeviceChangeReply, crate::health::HealthError> {
        let r = health::change(&self.health, &self.shared, device, resume, reason, by)?;
        self.send(health::env_reconcile());
        Ok(r)
    }
}

type SharedReconciler = Arc<Mutex<Box<dyn Reconciler>>>;

fn notify(states: &[sd_notify::NotifyState<'_>]) {
    // Not under systemd (tests, a terminal) NOTIFY_SOCKET is unset and this is a no-op.
    if let Err(e) = sd_notify::notify(false, states) {
        debug!("sd_notify: {e}");
    }
}

/// How often, and by how much, the start is extended while the first reconcile progresses
/// ([`extend_start_while_progressing`]).
pub const START_EXTEND_EVERY: Duration = Duration::from_secs(30);
/// See [`START_EXTEND_EVERY`].
pub const START_EXTEND_BY: Duration = Duration::from_secs(90);

/// Keep systemd's start timeout (`TimeoutStartSec=`) from ending a first reconcile that is still
/// making progress: READY=1 comes after it, and on a full host MIG creation and dozens of MPS
/// daemons can take longer than the unit's 5 minutes. Every `every`, while `progress` is
/// within its step's deadline (the watchdog's own test), `EXTEND_TIMEOUT_USEC=` asks for `by`
/// more; a wedged start still fails within `by`. Found in vm-tests 65 (8 GPUs x 7 MIG
/// instances, 56 MPS units, TCG): systemd killed gpuctld at 5 minutes, before READY=1.
/// Abort the task once READY=1 is sent.
pub fn extend_start_while_progressing(
    progress: Progress,
    every: Duration,
    by: Duration,
) -> tokio::task::JoinHandle<()> {
    let usec = u32::try_from(by.as_micros()).unwrap_or(u32::MAX);
    tokio::spawn(async move {
        let mut t = tokio::time::interval(every);
        loop {
            t.tick().await;
            if progress.healthy(std::time::Instant::now()) {
                notify(&[sd_notify::NotifyState::ExtendTimeoutUsec(usec)]);
            }
        }
    })
}

/// Longest a policy load may take: reading at most a few MiB and validating them linearly takes
/// milliseconds; a load still running after this is wedged.
pub const LOAD_LIMIT: Duration = Duration::from_secs(60);

/// Longest a reconcile (or dry run) may take before the watchdog stops attesting progress: the
/// policy's drain timeout (a drain may wait that long) plus 15 minutes for MIG changes and GPU
/// resets on a full host.
pub fn reconcile_limit(p: &Policy) -> Duration {
    p.host.drain_timeout + Duration::from_secs(15 * 60)
}

struct Looper {
    progress: Progress,
    root: Root,
    shared: Arc<Mutex<Shared>>,
    expected: ExpectedUnits,
    reconciler: SharedReconciler,
    last_good: Option<Policy>,
    /// What [`persist_last_good`] last wrote.
    last_saved: Option<Policy>,
    conn: zbus::Connection,
    /// Signalled after each reconcile, for loops that sleep until the policy asks them to run
    /// (the idle loop, the loan tick).
    policy_seen: Vec<Arc<tokio::sync::Notify>>,
    /// Device health: published again over each reconcile's devices.
    health: health::SharedHealth,
    /// Requests to the loop itself: a reconcile again when that publication changed what is
    /// out of service (the env files follow it).
    tx: mpsc::UnboundedSender<Request>,
}

impl Looper {
    /// [`Looper::load`] on a blocking thread, under a panic guard and [`LOAD_LIMIT`]. On a panic
    /// or a timeout the last good policy stays in force and the error is shown like a policy
    /// error.
    async fn load_guarded(&mut self) -> Option<Policy> {
        self.progress.enter(LOAD_LIMIT);
        let root = self.root.clone();
        let shared = self.shared.clone();
        let mut lg = self.last_good.clone();
        let task = tokio::task::spawn_blocking(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                load_keeping_last_good(&root, &mut lg, &shared)
            }));
            r.map(|p| (p, lg))
        });
        let failure = match tokio::time::timeout(LOAD_LIMIT, task).await {
            Ok(Ok(Ok((policy, lg)))) => {
                self.last_good = lg;
                self.progress.leave();
                return policy;
            }
            Ok(Ok(Err(panic))) => format!(
                "loading the policy panicked: {}",
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)")
            ),
            Ok(Err(e)) => format!("the policy loader failed: {e}"),
            Err(_) => format!(
                "loading the policy did not finish within {} s",
                LOAD_LIMIT.as_secs()
            ),
        };
        self.progress.leave();
        error!(
            gpuctl_action = "load-policy",
            "{failure}; last good policy kept"
        );
        let mut sh = lock(&self.shared);
        sh.policy_error = Some(failure);
        sh.policy = self.last_good.clone();
        sh.policy_origin = self.last_good.as_ref().map(|_| "last-good");
        self.last_good.clone()
    }

    async fn cycle(&mut self, reason: &str, observe: Observe) -> ReconcileReport {
        info!(gpuctl_action = "reconcile", "reconcile ({reason})");
        {
            let mut sh = lock(&self.shared);
            sh.busy = true;
            sh.cycle_started_us = unix_now_us();
        }
        let started = std::time::Instant::now();
        let policy = self.load_guarded().await.map(|p| self.in_force(&p));
        debug!(
            gpuctl_action = "reconcile-timing",
            "policy loaded in {:.1} ms",
            started.elapsed().as_secs_f64() * 1000.0
        );
        let report = match policy {
            Some(p) => {
                let rec = self.reconciler.clone();
                self.progress.enter(reconcile_limit(&p));
                let r = tokio::task::spawn_blocking(move || lock(&rec).reconcile_with(&p, observe))
                    .await;
                self.progress.leave();
                r.unwrap_or_else(|e| ReconcileReport {
                    errors: vec![format!("reconciler panicked: {e}")],
                    at: unix_now(),
                    ..Default::default()
                })
            }
            None => ReconcileReport {
                errors: vec!["no valid policy yet; nothing applied".into()],
                at: unix_now(),
                ..Default::default()
            },
        };
        let text = {
            let mut sh = lock(&self.shared);
            sh.status_text = match (&sh.policy_error, &sh.policy_origin) {
                (Some(e), Some(_)) => format!("policy error in {e} — last good policy in force"),
                (Some(e), None) => {
                    format!("policy error in {e} — no good policy yet, nothing applied")
                }
                (None, _) => report.summary(),
            };
            sh.last_report = Some(report.clone());
            if !report.units.is_empty() || report.converged() {
                let mut ex = lock(&self.expected);
                *ex = report.units.iter().cloned().collect();
            }
            sh.busy = false;
            sh.status_text.clone()
        };
        crate::metrics::counters().reconciled(started.elapsed().as_secs_f64(), report.converged());
        if self.last_good != self.last_saved {
            let (root, lg, mut saved) = (
                self.root.clone(),
                self.last_good.clone(),
                self.last_saved.take(),
            );
            self.last_saved = tokio::task::spawn_blocking(move || {
                persist_last_good(&root, &lg, &mut saved);
                saved
            })
            .await
            .unwrap_or_default();
        }
        crate::dbus_api::usage::sync_hpc_job_map(&self.shared, &self.root);
        if health::republish(&self.health, &self.shared) {
            let _ = self.tx.send(health::env_reconcile());
        }
        for n in &self.policy_seen {
            n.notify_one();
        }
        notify(&[sd_notify::NotifyState::Status(&text)]);
        crate::dbus_api::status_text_changed(&self.conn).await;
        info!(gpuctl_action = "reconciled", "{text}");
        report
    }

    /// `p` with the layouts gpuctld switched GPUs to ([`crate::reslice::state`]): the policy
    /// every reconcile, placement and status works from.
    fn in_force(&self, p: &Policy) -> Policy {
        let p = crate::reslice::state::InForce::read(&self.root).apply(p);
        lock(&self.shared).policy = Some(p.clone());
        p
    }

    async fn plan(&mut self) -> ReconcileReport {
        let Some(p) = self.load_guarded().await.map(|p| self.in_force(&p)) else {
            return ReconcileReport {
                errors: vec!["no valid policy".into()],
                ..Default::default()
            };
        };
        let rec = self.reconciler.clone();
        self.progress.enter(reconcile_limit(&p));
        let r = tokio::task::spawn_blocking(move || lock(&rec).plan(&p))
            .await
            .unwrap_or_default();
        self.progress.leave();
        r
    }

    /// Reset GPU `gpu` if nothing holds it, then reconcile when it was reset (its MIG
    /// instances are gone).
    async fn reset_gpu(
        &mut self,
        gpu: String,
    ) -> Result<std::time::Instant, crate::dbus_api::ResetError> {
        use crate::dbus_api::ResetError;
        let Some(p) = self.load_guarded().await.map(|p| self.in_force(&p)) else {
            return Err(ResetError::Failed("no valid policy".into()));
        };
        let rec = self.reconciler.clone();
        self.progress.enter(reconcile_limit(&p));
        let g = gpu.clone();
        let r = tokio::task::spawn_blocking(move || lock(&rec).reset_gpu(&p, &g))
            .await
            .unwrap_or_else(|e| Err(ResetError::Failed(format!("the reset panicked: {e}"))));
        self.progress.leave();
        let over = std::time::Instant::now();
        if r.is_ok() {
            self.cycle(&format!("GPU {gpu} reset"), Observe::All).await;
        }
        r.map(|()| over)
    }
}

/// Forward systemd's removal of our units (someone stopped a team slice or MPS daemon and it
/// was garbage-collected) as reconcile triggers.
async fn watch_units(sd: Systemd, expected: ExpectedUnits, tx: mpsc::UnboundedSender<Request>) {
    let Ok(mut removed) = sd.manager().receive_unit_removed().await else {
        warn!("cannot subscribe to UnitRemoved; relying on the drift timer");
        return;
    };
    while let Some(sig) = removed.next().await {
        let Ok(args) = sig.args() else { continue };
        let id = args.id();
        // systemd also emits UnitRemoved when it garbage-collects a unit that was merely
        // looked at (`systemctl status gpuctl-mps@x-0` loads a not-found unit), so only units
        // the policy wants count.
        let ours = props::team_of_slice(id).is_some() || mps::instance_of(id).is_some();
        let wanted = expected
            .lock()
            .map(|s| s.contains(id.as_str()))
            .unwrap_or(false);
        if ours && wanted {
            let _ = tx.send(Request::trigger(
                Trigger::UnitRemoved(id.to_string()),
                Observe::Units,
            ));
        }
    }
}

/// Forward hand changes of owned units' control drop-ins (`systemctl set-property`, runtime or
/// persistent) as reconcile triggers: [`drift`] says why this source.
async fn watch_dropins(root: Root, shared: Arc<Mutex<Shared>>, tx: mpsc::UnboundedSender<Request>) {
    let Ok(mut w) = drift::DropinWatch::new(root).inspect_err(|e| {
        warn!("inotify on the control drop-ins unavailable ({e}); relying on the drift timer")
    }) else {
        return;
    };
    while let Ok(mut files) = w.changed().await {
        // set-property writes one file per property in quick succession: one repair for all.
        while let Ok(Ok(more)) = tokio::time::timeout(DRIFT_DEBOUNCE, w.changed()).await {
            files.extend(more);
        }
        files.sort();
        files.dedup();
        // gpuctld's own set-property writes the same files; those arrive while it reconciles
        // and lead to one more, empty, check rather than being ignored, so that a hand change
        // made during a reconcile is not lost.
        let during_reconcile = shared.lock().map(|s| s.busy).unwrap_or(false);
        let reason = Trigger::Dropins {
            files,
            during_reconcile,
        };
        let _ = tx.send(Request::trigger(reason, Observe::Units));
    }
}

/// Forward an MPS daemon going inactive or failed (`systemctl stop gpuctl-mps@…`, a crash) as a
/// reconcile trigger, from systemd's `PropertiesChanged` of the unit's `ActiveState`.
async fn watch_mps_state(
    conn: zbus::Connection,
    shared: Arc<Mutex<Shared>>,
    expected: ExpectedUnits,
    tx: mpsc::UnboundedSender<Request>,
) {
    let stream = async {
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender("org.freedesktop.systemd1")?
            .interface("org.freedesktop.DBus.Properties")?
            .member("PropertiesChanged")?
            .path_namespace("/org/freedesktop/systemd1/unit")?
            .arg(0, "org.freedesktop.systemd1.Unit")?
            .build();
        zbus::MessageStream::for_match_rule(rule, &conn, Some(64)).await
    };
    let Ok(mut stream) = stream.await.inspect_err(|e| {
        warn!("cannot watch MPS unit states ({e}); relying on UnitRemoved and the timer")
    }) else {
        return;
    };
    const PREFIX: &str = "/org/freedesktop/systemd1/unit/gpuctl_2dmps_40";
    while let Some(Ok(msg)) = stream.next().await {
        let hdr = msg.header();
        let Some(path) = hdr.path() else { continue };
        if !path.as_str().starts_with(PREFIX) {
            continue;
        }
        type Changed = (
            String,
            std::collections::HashMap<String, zbus::zvariant::OwnedValue>,
            Vec<String>,
        );
        let Ok((_, changed, _)) = msg.body().deserialize::<Changed>() else {
            continue;
        };
        let state = changed
            .get("ActiveState")
            .and_then(|v| String::try_from(v.clone()).ok());
        let Some(state) = state.filter(|s| s == "inactive" || s == "failed") else {
            continue;
        };
        let busy = shared.lock().map(|s| s.busy).unwrap_or(false);
        let unit = lock(&expected)
            .iter()
            .find(|u| crate::systemd::props::unit_object_path(u) == path.as_str())
            .cloned();
        // Our own restarts pass through inactive while we reconcile; a unit the policy does
        // not want is none of our business.
        let Some(unit) = unit.filter(|_| !busy) else {
            continue;
        };
        let _ = tx.send(Request::trigger(
            Trigger::MpsState { unit, state },
            Observe::Units,
        ));
    }
}

/// Forward a change of the registered device majors as a reconcile trigger, so the fence outside
/// the team shares follows a module loaded (or a driver reloaded) after it was set
/// ([`crate::plan::fence`]). `/proc/devices` sends no inotify events; a driver that registers
/// a major creates its nodes in `/dev` (devtmpfs, or `nvidia-modprobe`), which does: each batch
/// of creations and removals there is a nudge to read `/proc/devices` again, and only a
/// changed list triggers. The drift timer reads it too, for a major registered without a node.
async fn watch_majors(root: Root, tx: mpsc::UnboundedSender<Request>) {
    use nix::sys::inotify::AddWatchFlags as F;
    let dev = root.join("/dev");
    let w = watch::DirWatch::new().map(|mut w| {
        let flags = F::IN_CREATE | F::IN_DELETE | F::IN_MOVED_TO | F::IN_ONLYDIR;
        (w.add(&dev, flags, ()), w)
    });
    let Ok((true, mut w)) = w.inspect_err(|e| warn!("inotify unavailable ({e})")) else {
        warn!(
            "cannot watch {} for new devices; relying on the drift timer",
            dev.display()
        );
        return;
    };
    let mut last = crate::real::procfs::majors(&root);
    while w.next().await.is_ok() {
        // udev creates a driver's nodes one by one: one read for the batch.
        while let Ok(Ok(_)) = tokio::time::timeout(MAJORS_DEBOUNCE, w.next()).await {}
        let now = crate::real::procfs::majors(&root);
        if now != last {
            last = now;
            let _ = tx.send(Request::trigger(Trigger::Majors, Observe::Units));
        }
    }
}

/// When and why to run again after `report` ([`requeue`]), logging a retry once per new set of
/// errors rather than at every attempt.
fn requeued(
    backoff: &mut requeue::Backoff,
    report: &ReconcileReport,
) -> Option<(tokio::time::Instant, Trigger)> {
    let (q, new) = backoff.after(report);
    let now = tokio::time::Instant::now();
    match q {
        requeue::Requeue::Idle => None,
        requeue::Requeue::Retry { after, attempt } => {
            let transient = report.heal.transient;
            if new {
                warn!(
                    gpuctl_action = "retry",
                    "{} error(s); retrying in {} s{}",
                    report.errors.len(),
                    after.as_secs(),
                    if transient {
                        ", then backing off"
                    } else {
                        " (none looks transient: fix the policy or the host)"
                    }
                );
            } else {
                debug!(
                    gpuctl_action = "retry",
                    "the same error(s) again; retry {attempt} in {} s",
                    after.as_secs()
                );
            }
            Some((now + after, Trigger::Retry { attempt }))
        }
        requeue::Requeue::Recheck(after) => Some((now + after, Trigger::Recheck)),
    }
}

/// How long device-node events are gathered before `/proc/devices` is read.
const MAJORS_DEBOUNCE: Duration = Duration::from_millis(200);

/// How long drift events are gathered into one repair.
const DRIFT_DEBOUNCE: Duration = Duration::from_millis(30);

async fn watch_policy(root: Root, debounce: Duration, tx: mpsc::UnboundedSender<Request>) {
    let Ok(mut w) = watch::PolicyWatch::new(root)
        .inspect_err(|e| warn!("inotify unavailable ({e}); relying on SIGHUP and the drift timer"))
    else {
        return;
    };
    // A change that has landed is sent at once; changes arriving while a reconcile runs are
    // coalesced into exactly one more by the main loop. `debounce` is only the quiet window
    // for changes under way (`PolicyWatch::next_settled` says why).
    while w.next_settled(debounce).await.is_ok() {
        let _ = tx.send(Request::trigger(Trigger::PolicyFiles, Observe::Policy));
    }
}

/// Hand the allocator's free pages back to the kernel before going idle. A reconcile's peak
/// (a full observation, the plan, zbus buffers; on blocking threads, each with its own malloc
/// arena) is otherwise kept as resident memory for as long as gpuctld then sleeps: issue 14 asks
/// for an idle RSS of at most 8 MiB, and VM 59 prints what the idle RSS is made of.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no pointers.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

/// Run the daemon until SIGTERM/SIGINT.
pub async fn run(opts: Options) -> Result<(), DaemonError> {
    use tokio::signal::unix::{signal, SignalKind};
    let conn = zbus::Connection::system()
        .await
        .map_err(|e| without_systemd(&opts.root, e.to_string()).unwrap_or(DaemonError::Bus(e)))?;
    let sd = Systemd::with_connection(conn.clone(), opts.root.clone())
        .await
        .map_err(|e| {
            without_systemd(&opts.root, e.to_string()).unwrap_or(DaemonError::Systemd(e))
        })?;
    let shared = Arc::new(Mutex::new(Shared::default()));
    let expected = ExpectedUnits::default();
    let (tx, mut rx) = mpsc::unbounded_channel();

    let effector = BlockingSystemd::new(tokio::runtime::Handle::current(), Arc::new(sd.clone()));
    // The default NVML library is tried now; every reconcile points the host at the library
    // the policy names (CoreReconciler::observe), so a policy change can fix a wrong path.
    // A reset waits for the health watcher to let go of NVML: up to two of its waits (a lost
    // GPU's read is paced by one more).
    let health_every = health::interval_from_env();
    let gate = Arc::new(health::WatchGate::default());
    let quiet = health::Quiet {
        gate: gate.clone(),
        wait: 2 * health_every + Duration::from_secs(1),
    };
    let host = crate::real::RealHost::open(opts.root.clone(), None)
        .with_systemd(Box::new(effector))
        .with_other_clients(Box::new(quiet));
    let reconciler: SharedReconciler = Arc::new(Mutex::new(Box::new(CoreReconciler::new(host))));

    let health_side = Arc::new(Mutex::new(health::HealthSide::load(&opts.root)));
    let _ = health::republish(&health_side, &shared);
    let backend = Arc::new(BusBackend {
        shared: shared.clone(),
        tx: tx.clone(),
        health: health_side.clone(),
    });
    let policy_seen = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(idle::run(
        opts.root.clone(),
        backend.clone(),
        sd.clone(),
        shared.clone(),
        idle::interval_from_env(),
        policy_seen.clone(),
    ));
    let (health_tx, health_rx) = mpsc::unbounded_channel();
    if let Err(e) = health::spawn_watcher(shared.clone(), health_tx, health_every, gate) {
        error!("cannot start the health watcher thread: {e}");
    }
    let placing = Arc::new(tokio::sync::Mutex::new(()));
    tokio::spawn(health::run(
        health::RunCx {
            root: opts.root.clone(),
            backend: backend.clone(),
            sd: sd.clone(),
            shared: shared.clone(),
            side: health_side.clone(),
            placing: placing.clone(),
        },
        health_rx,
    ));
    let loans_seen = Arc::new(tokio::sync::Notify::new());
    let reslice_seen = Arc::new(tokio::sync::Notify::new());
    crate::dbus_api::serve(
        &conn,
        backend,
        sd.clone(),
        opts.root.clone(),
        placing,
        loans_seen.clone(),
        reslice_seen.clone(),
    )
    .await
    .map_err(|source| DaemonError::Serve { source })?;

    let mut hup = signal(SignalKind::hangup()).map_err(DaemonError::Signal)?;
    let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?;
    tokio::spawn(watch_units(sd.clone(), expected.clone(), tx.clone()));
    tokio::spawn(watch_policy(opts.root.clone(), opts.debounce, tx.clone()));
    tokio::spawn(watch_dropins(opts.root.clone(), shared.clone(), tx.clone()));
    tokio::spawn(watch_majors(opts.root.clone(), tx.clone()));
    tokio::spawn(watch_mps_state(
        conn.clone(),
        shared.clone(),
        expected.clone(),
        tx.clone(),
    ));

    let progress = Progress::default();
    let mut wd_usec = 0u64;
    if sd_notify::watchdog_enabled(false, &mut wd_usec) && wd_usec > 0 {
        let progress = progress.clone();
        let arm = format!("WATCHDOG_USEC={wd_usec}");
        // A thread of its own, asleep on a condition variable while the loop is idle: a timer on
        // tokio's hierarchical wheel wakes the runtime several times before it fires.
        let spawned = std::thread::Builder::new()
            .name("watchdog".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                let mut said = false;
                watchdog::run(&progress, Duration::from_micros(wd_usec), |b| {
                    match b {
                        watchdog::Beat::Arm => notify(&[
                            sd_notify::NotifyState::Custom(&arm),
                            sd_notify::NotifyState::Watchdog,
                        ]),
                        watchdog::Beat::Ping => notify(&[sd_notify::NotifyState::Watchdog]),
                        watchdog::Beat::Disarm => notify(&[sd_notify::NotifyState::Custom(
                            "WATCHDOG_USEC=18446744073709551615",
                        )]),
                        watchdog::Beat::Withhold if !said => {
                            error!("the reconcile loop is past its step's deadline; withholding the watchdog ping");
                        }
                        watchdog::Beat::Withhold | watchdog::Beat::Rest => {}
                    }
                    said = b == watchdog::Beat::Withhold;
                })
            });
        if let Err(e) = spawned {
            // Without pings systemd restarts gpuctld after WatchdogSec=: say why first.
            error!("cannot start the watchdog thread: {e}");
        }
    }

    let mut looper = Looper {
        progress,
        root: opts.root.clone(),
        shared,
        expected,
        reconciler,
        last_good: None,
        last_saved: None,
        conn,
        policy_seen: vec![policy_seen, loans_seen, reslice_seen],
        health: health_side,
        tx: tx.clone(),
    };
    let extend = extend_start_while_progressing(
        looper.progress.clone(),
        START_EXTEND_EVERY,
        START_EXTEND_BY,
    );
    let mut backoff = requeue::Backoff::default();
    let report = looper
        .cycle(&Trigger::Start.to_string(), Observe::All)
        .await;
    let mut next = requeued(&mut backoff, &report);
    extend.abort();
    notify(&[sd_notify::NotifyState::Ready]);

    let mut drift = tokio::time::interval_at(tokio::time::Instant::now() + opts.drift, opts.drift);
    loop {
        // A retry or recheck due: `pending()` never fires, so without one the branch sleeps.
        let due = async {
            match &next {
                Some((at, _)) => tokio::time::sleep_until(*at).await,
                None => std::future::pending().await,
            }
        };
        let first = tokio::select! {
            r = rx.recv() => match r { Some(r) => r, None => break },
            _ = hup.recv() => {
                notify(&[sd_notify::NotifyState::Reloading]);
                let mono = sd_notify::NotifyState::monotonic_usec_now().ok();
                if let Some(m) = mono { notify(&[m]); }
                let report = looper.cycle(&Trigger::Sighup.to_string(), Observe::All).await;
                next = requeued(&mut backoff, &report);
                notify(&[sd_notify::NotifyState::Ready]);
                continue;
            }
            _ = drift.tick() => Request::trigger(Trigger::DriftTimer, Observe::All),
            _ = due => {
                let (_, t) = next.take().expect("only armed with a trigger");
                Request::trigger(t, Observe::All)
            }
            _ = term.recv() => {
                crate::dbus_api::join::keep_queue();
                break;
            }
            _ = int.recv() => {
                crate::dbus_api::join::keep_queue();
                break;
            }
        };
        // Coalesce everything already queued into one run.
        let mut waiters = Vec::new();
        let mut reasons = Vec::new();
        let mut plans = Vec::new();
        let mut observe = None::<Observe>;
        let mut resets = Vec::new();
        for r in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match r {
                Request::Reconcile {
                    reason,
                    reply,
                    observe: o,
                } => {
                    // `None` orders first: the run reads what the most demanding trigger needs.
                    observe = observe.max(Some(o));
                    reasons.push(reason);
                    waiters.extend(reply);
                }
                Request::Plan { reply } => plans.push(reply),
                Request::ResetGpu { gpu, reply } => resets.push((gpu, reply)),
            }
        }
        if !reasons.is_empty() {
            reasons.dedup();
            let reasons: Vec<String> = reasons.iter().map(Trigger::to_string).collect();
            let report = looper
                .cycle(&reasons.join(", "), observe.unwrap_or(Observe::All))
                .await;
            next = requeued(&mut backoff, &report);
            for w in waiters {
                let _ = w.send(report.clone());
            }
        }
        for (gpu, reply) in resets {
            let r = looper.reset_gpu(gpu).await;
            let _ = reply.send(r);
        }
        // Every Plan queued by now gets the same dry run: N callers cost one observation.
        if !plans.is_empty() {
            let report = looper.plan().await;
            for p in plans {
                let _ = p.send(report.clone());
            }
        }
        if rx.is_empty() {
            release_free_memory();
        }
    }
    notify(&[sd_notify::NotifyState::Stopping]);
    info!("stopping");
    Ok(())
}
