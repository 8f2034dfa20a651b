//! gpuctld's D-Bus API: `org.gpuctl.Agent1` at `/org/gpuctl/Agent1` on the system bus.
//!
//! | member | kind | who |
//! |---|---|---|
//! | `Status() -> s` | method, JSON | anyone |
//! | `Plan() -> s` | method, JSON dry run | anyone |
//! | `Apply() -> s` | method, JSON report | root |
//! | `Reload() -> s` | method, JSON report | root |
//! | `Join(s team) -> (a{ss} env, s scope)` | method: move the caller's own process into a new scope in `gpu-<team>.slice`, placed on the team's devices by its policy | members, root |
//! | `JoinWith(s team, a{ss} options) -> (a{ss} env, s scope)` | `Join` with placement options (`gpus`, `device`, `gpu-memory`) | members, root |
//! | `Env(s team) -> a{ss}` | method: the team's environment | members, root |
//! | `Teams() -> s` | method, JSON: the teams the caller may use and what each gives | anyone (sees own teams) |
//! | `Usage() -> s` | method, JSON of [`crate::usage::Usage`]: who uses which GPU ([`usage`]) | anyone (per-process detail: see below) |
//! | `Idle() -> s` | method, JSON of [`reply::IdleReply`]: holders tracked by the idle rules | anyone (same) |
//! | `Report(s from, s to, s by) -> s` | method, JSON of [`reply::LedgerReply`]: GPU-hours held and used ([`ledger`]) | anyone (sees the teams it may use; root all) |
//! | `Health() -> s` | method, JSON of [`reply::HealthReply`]: every device in or out of service, XID counts, standing conditions | anyone |
//! | `DeviceDrain(s device, s reason) -> s`, `DeviceResume(s device, s reason) -> s` | methods, JSON of [`reply::DeviceChangeReply`]: take a GPU or MIG device (UUID or GPU index) out of service or bring it back, journalled with who and why | root |
//! | `Metrics(s format) -> s` | method: Prometheus metrics, `openmetrics` or `prometheus-text` | anyone (same) |
//! | `Events(t after, u wait_ms) -> s` | method, JSON of [`reply::EventsReply`]: the caller's events after a position, waiting up to `wait_ms` (at most [`events::MAX_WAIT`]) for a first one ([`crate::events`]) | anyone (its teams' events and the host's; root all) |
//! | `Event(t position, s kind, s team)` | signal: an event was posted (`team` empty: the host's); what happened to whom is read through `Events` | anyone |
//! | `LoanReclaimed(s scope, s borrower, s owner, t grace)` | signal: a lent device is taken back | anyone |
//! | `StatusText` | property `s`, emits `PropertiesChanged` | anyone |
//! | `LastReconcileStartUsec`, `Reconciling` | properties `t`, `b` | anyone |
//! | `InterfaceVersion` | property `u`, constant: the version of the JSON documents ([`reply::v1`]) | anyone |
//!
//! `Usage`, `Idle` and `Metrics` show a process's or idle holder's user, pid, command and unit
//! only to root, the policy's `[host] admin-group` and the members of its team
//! ([`crate::join::Viewer`]); to everyone else as counts per team and device.
//!
//! Root-only methods ask the bus daemon for the caller's uid (`GetConnectionUnixUser` on the
//! message's sender), never trusting anything the client sends. The join methods ([`join`])
//! take uid, groups and pid from `GetConnectionCredentials` the same way. The bus policy file
//! (`packaging/files/org.gpuctl.Agent1.conf`) lets only root own the name and lets other users
//! send only the read and join methods.
//!
//! Every method but `Apply`/`Reload` (root only) first takes a token from the caller's uid
//! bucket ([`crate::ratelimit`]: `Plan` from a small heavy one, the rest from a light one); a
//! caller over its rate gets `org.freedesktop.DBus.Error.LimitsExceeded` with the wait, and
//! nothing else is done for it. `Plan` requests queued at once are bounded
//! ([`MAX_QUEUED_PLANS`]) and answered by one dry run.

use crate::paths::Root;
use crate::policy::Policy;
use crate::ratelimit::{Limits, RateLimiter};
use crate::systemd::scope::JobWaiter;
use crate::systemd::{mps, Systemd};
use reply::{
    GpuRef, GpuStatus, LastReconcile, MpsUnitStatus, ReconcileReport, ReportReply, SliceStatus,
    StatusReply, TeamStatus,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::oneshot;
use zbus::{fdo, interface, message::Header, Connection};

pub mod client;
pub(crate) mod collector;
pub mod events;
pub mod health;
pub mod join;
pub mod ledger;
pub mod lend;
pub mod loans;
pub mod place;
pub mod queue;
pub mod reply;
pub mod reslice;
mod trigger;
pub mod usage;
pub mod wire;

pub use trigger::Trigger;

/// What the daemon shows on the bus (and in `STATUS=`), as of the call.
#[derive(Debug, Clone, Default)]
pub struct AgentState {
    /// The one-line truth (also `STATUS=` and the `StatusText` property).
    pub status_text: String,
    /// Last reconcile.
    pub last_report: Option<ReconcileReport>,
    /// Last policy load error, cleared by a good load.
    pub policy_error: Option<String>,
    /// The policy in force.
    pub policy: Option<Policy>,
    /// `current` or `last-good`.
    pub policy_origin: Option<&'static str>,
    /// Wall-clock µs when the latest reconcile started; with `busy`, lets a caller wait for
    /// "a reconcile that started after my change has finished".
    pub cycle_started_us: u64,
    /// A reconcile is running.
    pub busy: bool,
    /// The idle rules' holders, as of the last sample.
    pub idle: reply::IdleReply,
}

/// Requests to the daemon's reconcile loop.
#[derive(Debug)]
pub enum Request {
    /// Reload the policy and reconcile; the report goes to `reply`.
    Reconcile {
        /// Why (for the journal, and the loop's retry).
        reason: Trigger,
        /// Who waits for the result.
        reply: Option<oneshot::Sender<ReconcileReport>>,
        /// What may have changed: a hand change of a unit gpuctl owns needs only units read
        /// again (see [`Observe`]).
        observe: Observe,
    },
    /// Dry run against the policy on disk (or the last good one).
    Plan {
        /// Where the report goes.
        reply: oneshot::Sender<ReconcileReport>,
    },
    /// Reset GPU `gpu` (UUID) if no process holds it, then reconcile (its MIG instances are
    /// gone): gpuctld's idle reset of a quarantined GPU.
    ResetGpu {
        /// The GPU's UUID.
        gpu: String,
        /// Where the outcome goes: when the reset was over, or why there was none.
        reply: oneshot::Sender<Result<Instant, ResetError>>,
    },
}

/// Why gpuctld did not reset a GPU ([`Request::ResetGpu`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetError {
    /// Processes hold it, read again just before the reset: nothing was tried.
    #[error("held by {0}")]
    Busy(String),
    /// The reset failed, or the host could not be read or locked for it.
    #[error("{0}")]
    Failed(String),
}

/// How much of the host a reconcile reads again. Ordered: a run serving several triggers reads
/// what the most demanding one needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Observe {
    /// Nothing, when the only trigger was a policy file: the host is taken as the last
    /// converged run left it, if the change reaches systemd alone (limits, members). A hand
    /// change on the host arrives as a trigger of its own (a drift watch), which reads again
    /// (issue 14: a limit change costs no read before its `SetUnitProperties`).
    Policy,
    /// Only what systemd and files hold, when the trigger was a unit (a control drop-in, an MPS
    /// daemon's state, a removed unit): GPUs are taken from the last converged run, if any.
    Units,
    /// Everything, NVML included: start, reload, the drift timer, an explicit `Apply`.
    All,
}

impl Request {
    /// A reconcile for `reason` that nobody waits for (a watch's trigger, the drift timer).
    pub fn trigger(reason: Trigger, observe: Observe) -> Request {
        Request::Reconcile {
            reason,
            reply: None,
            observe,
        }
    }
}

/// What the bus API needs from the daemon that serves it. The daemon (the composition root)
/// implements it and hands it to [`serve`]; this module never imports the daemon.
pub trait Backend: Send + Sync + 'static {
    /// Everything `Status` and the properties show.
    fn state(&self) -> AgentState;
    /// The policy in force, or [`Refusal::NoPolicy`] with the load error. Cheaper than
    /// [`Backend::state`]: it is on the path of every `Join`.
    fn policy(&self) -> Result<Policy, crate::join::Refusal>;
    /// Queue a request; `false` when the loop has ended (shutdown).
    fn send(&self, req: Request) -> bool;
    /// The idle rules' holders as of the last sample (`Idle`, `Usage` marks, `Plan`).
    fn idle(&self) -> reply::IdleReply;
    /// Every device's health (`Health`).
    fn health(&self) -> reply::HealthReply;
    /// An admin's drain (`resume: false`) or resume of `device`, by user `by`.
    fn device_change(
        &self,
        device: &str,
        resume: bool,
        reason: &str,
        by: &str,
    ) -> Result<reply::DeviceChangeReply, crate::health::HealthError>;
}

/// Well-known bus name.
pub const BUS_NAME: &str = "org.gpuctl.Agent1";
/// Object path.
pub const OBJECT_PATH: &str = "/org/gpuctl/Agent1";

/// Most `Plan` calls waiting at once, all callers together; more are refused until the queued
/// ones are answered (they are answered together, by one dry run).
pub const MAX_QUEUED_PLANS: usize = 16;

/// The exported object.
pub struct Agent {
    backend: Arc<dyn Backend>,
    sd: Systemd,
    root: Root,
    jobs: Arc<JobWaiter>,
    /// Serializes placements ([`join::JoinCtx::placing`]).
    placing: Arc<tokio::sync::Mutex<()>>,
    /// `--wait` requests ([`queue`]).
    queue: Arc<Mutex<queue::Queues>>,
    queue_changed: Arc<tokio::sync::Notify>,
    /// The per-uid budgets bus calls draw from ([`crate::ratelimit`] says why each).
    light: Mutex<RateLimiter>,
    heavy: Mutex<RateLimiter>,
    reads: Mutex<RateLimiter>,
    queued_plans: Arc<AtomicUsize>,
    /// The last `Metrics` document per format and when it was made: every caller within the
    /// usage interval gets it as it is (one scrape's systemd and cgroup reads serve them all).
    metrics_cache: Mutex<Vec<MetricsDoc>>,
    /// How long a usage collection (and so a metrics document) serves every reader.
    cache_for: std::time::Duration,
}

/// A cached `Metrics` document: format, for whom, when made, text.
type MetricsDoc = (String, crate::join::Viewer, Instant, String);

/// Decrements the queued-plan count however the call ends (answered, dropped, cancelled).
struct Queued(Arc<AtomicUsize>);

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Agent {
    /// Take a token from the caller's bucket in `limiter`, or refuse with the wait.
    async fn admit(
        &self,
        conn: &Connection,
        hdr: &Header<'_>,
        limiter: &Mutex<RateLimiter>,
        what: &str,
    ) -> fdo::Result<()> {
        let uid = caller_uid(conn, hdr).await?;
        let r = limiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .check(uid, Instant::now());
        r.map_err(|wait| {
            if let Some(held_back) = crate::ratelimit::refusal_log() {
                tracing::info!(
                    gpuctl_action = "rate-limited",
                    uid,
                    held_back,
                    "{what} from uid {uid} refused: over its rate"
                );
            }
            fdo::Error::LimitsExceeded(format!(
                "{what}: too many calls from uid {uid}; retry in {} ms",
                wait.as_millis().max(1)
            ))
        })
    }
}

impl Agent {
    /// The waiting `--wait` requests of the teams `viewer` may read (a request names a uid).
    fn queued(&self, viewer: &crate::join::Viewer) -> Vec<reply::v1::QueuedRequest> {
        use crate::join::Directory;
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.expire(std::time::Instant::now());
        q.seen_by(viewer, |uid| {
            crate::join::nss::Nss.user_by_uid(uid).map(|a| a.name)
        })
    }
}

async fn caller_uid(conn: &Connection, hdr: &Header<'_>) -> fdo::Result<u32> {
    let sender = hdr
        .sender()
        .ok_or_else(|| fdo::Error::AccessDenied("message has no sender".into()))?;
    let dbus = fdo::DBusProxy::new(conn).await?;
    dbus.get_connection_unix_user(sender.clone().into()).await
}

async fn require_root(conn: &Connection, hdr: &Header<'_>, what: &str) -> fdo::Result<()> {
    match caller_uid(conn, hdr).await? {
        0 => Ok(()),
        uid => Err(fdo::Error::AccessDenied(format!(
            "{what} is for root only (caller uid {uid})"
        ))),
    }
}

impl Agent {
    async fn device_change(
        &self,
        device: String,
        resume: bool,
        reason: String,
        hdr: Header<'_>,
        conn: &Connection,
    ) -> fdo::Result<String> {
        let what = if resume {
            "DeviceResume"
        } else {
            "DeviceDrain"
        };
        require_root(conn, &hdr, what).await?;
        // The person behind sudo: the audit login uid of the caller, which the kernel keeps
        // across su/sudo; root's own name when it is unset.
        let by = caller_login(conn, &hdr).await;
        let r = self
            .backend
            .device_change(&device, resume, &reason, &by)
            .map_err(|e| fdo::Error::Failed(e.to_string()))?;
        serde_json::to_string(&r).map_err(|e| fdo::Error::Failed(e.to_string()))
    }
}

/// The login name behind the caller (`/proc/<pid>/loginuid`, as NSS names it), else `root`.
async fn caller_login(conn: &Connection, hdr: &Header<'_>) -> String {
    let Some(sender) = hdr.sender() else {
        return "root".into();
    };
    let Ok(dbus) = fdo::DBusProxy::new(conn).await else {
        return "root".into();
    };
    let Ok(pid) = dbus
        .get_connection_unix_process_id(sender.clone().into())
        .await
    else {
        return "root".into();
    };
    let uid = std::fs::read_to_string(format!("/proc/{pid}/loginuid"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|u| *u != u32::MAX);
    match uid {
        Some(u) => {
            use crate::join::Directory;
            crate::join::nss::Nss
                .user_by_uid(u)
                .map_or_else(|| format!("uid {u}"), |a| a.name)
        }
        None => "root".into(),
    }
}

fn report_json(r: ReconcileReport) -> String {
    serde_json::to_string(&ReportReply::from(r)).unwrap_or_default()
}

impl Agent {
    async fn request(&self, method: &'static str) -> fdo::Result<ReconcileReport> {
        let (reply, rx) = oneshot::channel();
        let sent = self.backend.send(Request::Reconcile {
            reason: Trigger::Bus(method),
            reply: Some(reply),
            observe: Observe::All,
        });
        if !sent {
            return Err(fdo::Error::Failed("daemon is shutting down".into()));
        }
        rx.await
            .map_err(|_| fdo::Error::Failed("reconcile was abandoned".into()))
    }
}

#[interface(name = "org.gpuctl.Agent1")]
impl Agent {
    /// Everything `gpuctl status` shows, as JSON.
    async fn status(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<String> {
        self.admit(conn, &hdr, &self.light, "Status").await?;
        let viewer = usage::viewer(&*self.backend, conn, &hdr).await?;
        let state = self.backend.state();
        let live = live_status(&state, &self.sd, &self.root).await;
        let mut reply = status_reply(state, &live);
        usage::redact_leases(&mut reply.leases, &viewer);
        reply.queue = self.queued(&viewer);
        serde_json::to_string(&reply).map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// What a reconcile would change now, as JSON.
    async fn plan(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<String> {
        self.admit(conn, &hdr, &self.heavy, "Plan").await?;
        if self.queued_plans.fetch_add(1, Ordering::SeqCst) >= MAX_QUEUED_PLANS {
            self.queued_plans.fetch_sub(1, Ordering::SeqCst);
            return Err(fdo::Error::LimitsExceeded(format!(
                "Plan: {MAX_QUEUED_PLANS} plans already queued; retry when they are answered"
            )));
        }
        let _queued = Queued(self.queued_plans.clone());
        let (reply, rx) = oneshot::channel();
        if !self.backend.send(Request::Plan { reply }) {
            return Err(fdo::Error::Failed("daemon is shutting down".into()));
        }
        let r = rx
            .await
            .map_err(|_| fdo::Error::Failed("plan was abandoned".into()))?;
        Ok(report_json(r))
    }

    /// Reconcile now (root only); returns the report as JSON.
    async fn apply(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<String> {
        require_root(conn, &hdr, "Apply").await?;
        Ok(report_json(self.request("Apply").await?))
    }

    /// Reload the policy and reconcile (root only); returns the report as JSON.
    async fn reload(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<String> {
        require_root(conn, &hdr, "Reload").await?;
        Ok(report_json(self.request("Reload").await?))
    }

    /// Move the caller's own process (the bus's `ProcessID` of the connection) into a new
    /// scope `gpuctl-run-<opaque id>.scope` in `gpu-<team>.slice`, if the policy lets the
    /// caller use `team`; returns the team's environment and the scope's name.
    async fn join(
        &self,
        team: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(HashMap<String, String>, String), join::JoinError> {
        self.join_with(team, HashMap::new(), hdr, conn).await
    }

    /// `Join` with placement options (`gpus`, `device`, `gpu-memory` in bytes): the job gets
    /// exactly the devices placed, in its environment and its scope's device fence.
    async fn join_with(
        &self,
        team: String,
        options: HashMap<String, String>,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(HashMap<String, String>, String), join::JoinError> {
        self.admit(conn, &hdr, &self.light, "Join").await?;
        let cx = join::JoinCtx {
            backend: &*self.backend,
            sd: &self.sd,
            jobs: &self.jobs,
            placing: &self.placing,
            root: &self.root,
            queue: &self.queue,
            queue_changed: &self.queue_changed,
        };
        let r = join::join(&cx, conn, &hdr, &team, &options).await;
        crate::metrics::counters().joined(&team, join::outcome(&r));
        r
    }

    /// Who uses which GPU and MIG device now, as JSON of [`crate::usage::Usage`].
    async fn usage(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<String> {
        self.admit(conn, &hdr, &self.reads, "Usage").await?;
        let v = usage::viewer(&*self.backend, conn, &hdr).await?;
        let u = usage::usage_for(&*self.backend, &self.sd, &self.root, &v).await?;
        serde_json::to_string(&u).map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// The holders the idle rules track (idle ones and those on their way), as JSON of
    /// [`reply::IdleReply`].
    async fn idle(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<String> {
        self.admit(conn, &hdr, &self.reads, "Idle").await?;
        let v = usage::viewer(&*self.backend, conn, &hdr).await?;
        let mut r = self.backend.idle();
        usage::redact_idle(&mut r.holders, &v);
        serde_json::to_string(&r).map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// Every device's health as JSON ([`reply::HealthReply`]).
    async fn health(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<String> {
        self.admit(conn, &hdr, &self.reads, "Health").await?;
        serde_json::to_string(&self.backend.health()).map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// Take `device` (GPU index, `GPU-…` or `MIG-…` UUID) out of service (root only).
    async fn device_drain(
        &self,
        device: String,
        reason: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<String> {
        self.device_change(device, false, reason, hdr, conn).await
    }

    /// Bring `device` back into service (root only); refused while its GPU still shows a
    /// condition only a reset clears.
    async fn device_resume(
        &self,
        device: String,
        reason: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<String> {
        self.device_change(device, true, reason, hdr, conn).await
    }

    /// Prometheus metrics in `format` (`openmetrics` or `prometheus-text`).
    async fn metrics(
        &self,
        format: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<String> {
        // A document still fresh is served without drawing from the caller's budget: it costs a
        // string copy, and the budget bounds work (vm-tests 89's 1,000 back-to-back scrapes were
        // refused when every cached answer was charged).
        // Cached per format and per viewer: documents differ in their per-process labels.
        let v = usage::viewer(&*self.backend, conn, &hdr).await?;
        let now = Instant::now();
        let fresh = |c: &MetricsDoc| c.0 == format && c.1 == v && now - c.2 < self.cache_for;
        let cached = self
            .metrics_cache
            .lock()
            .ok()
            .and_then(|m| m.iter().find(|c| fresh(c)).cloned());
        if let Some(c) = cached {
            return Ok(c.3);
        }
        self.admit(conn, &hdr, &self.reads, "Metrics").await?;
        let text = usage::metrics(&*self.backend, &self.sd, &self.root, &format, &v).await?;
        if let Ok(mut m) = self.metrics_cache.lock() {
            m.retain(|c| !(c.0 == format && c.1 == v) && now - c.2 < self.cache_for);
            m.push((format, v, now, text.clone()));
        }
        Ok(text)
    }

    /// The environment of a team the caller may use (what `/run/gpuctl/teams/<team>.env`
    /// holds).
    async fn env(
        &self,
        team: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<HashMap<String, String>, join::JoinError> {
        self.admit(conn, &hdr, &self.light, "Env").await?;
        join::env(&*self.backend, &self.root, conn, &hdr, &team).await
    }

    /// The teams the caller may use and what each gives, as a JSON array.
    async fn teams(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, join::JoinError> {
        self.admit(conn, &hdr, &self.light, "Teams").await?;
        join::teams(&*self.backend, &self.sd, &self.root, conn, &hdr).await
    }

    /// GPU-hours held and used from day `from` to day `to` (`YYYY-MM-DD`, UTC) grouped `by`
    /// team, user or device, as JSON of [`reply::LedgerReply`].
    async fn report(
        &self,
        from: String,
        to: String,
        by: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, join::JoinError> {
        self.admit(conn, &hdr, &self.reads, "Report").await?;
        ledger::report(&*self.backend, &self.root, conn, &hdr, (&from, &to, &by)).await
    }

    /// The caller's events after position `after` (0: all gpuctld keeps), as JSON of
    /// [`reply::EventsReply`]; with `wait_ms` > 0 the reply waits up to that long (at most
    /// [`events::MAX_WAIT`]) for a first one, so a follower asks again as soon as it has read.
    async fn events(
        &self,
        after: u64,
        wait_ms: u32,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<String> {
        self.admit(conn, &hdr, &self.reads, "Events").await?;
        let uid = caller_uid(conn, &hdr).await?;
        let v = usage::viewer(&*self.backend, conn, &hdr).await?;
        let r = events::read(uid, &v, after, wait_ms).await;
        serde_json::to_string(&r).map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// Wall-clock µs at which the latest reconcile started.
    #[zbus(property)]
    async fn last_reconcile_start_usec(&self) -> u64 {
        self.backend.state().cycle_started_us
    }

    /// Whether a reconcile is running now.
    #[zbus(property)]
    async fn reconciling(&self) -> bool {
        self.backend.state().busy
    }

    /// The one-line truth, as in `STATUS=`.
    #[zbus(property)]
    async fn status_text(&self) -> String {
        self.backend.state().status_text
    }

    /// The version of the documents the methods return; `gpuctl` checks it before a call.
    #[zbus(property(emits_changed_signal = "const"))]
    async fn interface_version(&self) -> u32 {
        reply::v1::VERSION
    }
}

/// Export the object and take the bus name. `placing` is the placement lock, which gpuctld's
/// idle reset of a quarantined GPU holds too.
pub async fn serve(
    conn: &Connection,
    backend: Arc<dyn Backend>,
    sd: Systemd,
    root: Root,
    placing: Arc<tokio::sync::Mutex<()>>,
    policy_seen: Arc<tokio::sync::Notify>,
    reslice_seen: Arc<tokio::sync::Notify>,
) -> zbus::Result<()> {
    // Subscribed before the name is taken, so no placement can miss its job's signal.
    let jobs = JobWaiter::spawn(&sd).await?;
    let saved = join::load_queue(&root);
    let queue = Arc::new(Mutex::new({
        // The requests a previous gpuctld left waiting keep their places while their clients
        // ask again; new tickets follow the clock, so none repeats one of the last gpuctld's
        // (a reclaim records the ticket it was made for).
        let mut q = queue::Queues::default();
        q.tickets_after(loans::now_ms());
        let until = std::time::Instant::now() + join::RETURN_GRACE;
        q.restore(saved, until);
        q
    }));
    let queue_changed = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(loans_loop(
        conn.clone(),
        backend.clone(),
        sd.clone(),
        root.clone(),
        (placing.clone(), queue.clone(), queue_changed.clone()),
        policy_seen,
    ));
    tokio::spawn(reslice_loop(
        backend.clone(),
        sd.clone(),
        root.clone(),
        (placing.clone(), queue.clone(), queue_changed.clone()),
        reslice_seen,
    ));
    tokio::spawn(events::signals(conn.clone()));
    let reads = Limits::reads_from_env().unwrap_or_else(|e| {
        tracing::warn!("{e}: the default read budget applies");
        Limits::reads()
    });
    conn.object_server()
        .at(
            OBJECT_PATH,
            Agent {
                backend,
                sd,
                root,
                jobs,
                placing,
                queue,
                queue_changed,
                light: Mutex::new(RateLimiter::new(Limits::light())),
                heavy: Mutex::new(RateLimiter::new(Limits::heavy())),
                reads: Mutex::new(RateLimiter::new(reads)),
                queued_plans: Arc::new(AtomicUsize::new(0)),
                metrics_cache: Mutex::new(Vec::new()),
                cache_for: crate::usage::collect::Collector::interval_from_env(),
            },
        )
        .await?;
    conn.request_name(BUS_NAME).await?;
    Ok(())
}

/// The placement lock, the queue and its wake-up, shared by the bus object and the loan tick.
type PlaceState = (
    Arc<tokio::sync::Mutex<()>>,
    Arc<Mutex<queue::Queues>>,
    Arc<tokio::sync::Notify>,
);

/// What the loan and re-slice ticks carry out their decisions with.
fn place_cx<'a>(
    backend: &'a dyn Backend,
    sd: &'a Systemd,
    root: &'a Root,
    (placing, queue, queue_changed): &'a PlaceState,
) -> loans::Cx<'a> {
    loans::Cx {
        backend,
        sd,
        root,
        placing,
        queue,
        queue_changed,
    }
}

/// gpuctld's loan tick ([`loans::tick`]) until the runtime ends; asleep while nothing is lent
/// and no team lends.
async fn loans_loop(
    conn: Connection,
    backend: Arc<dyn Backend>,
    sd: Systemd,
    root: Root,
    state: PlaceState,
    policy_seen: Arc<tokio::sync::Notify>,
) {
    loop {
        let cx = place_cx(&*backend, &sd, &root, &state);
        match loans::wanted(&cx) {
            Some(policy) => {
                let u = usage::usage(&*backend, &root).await.ok();
                loans::tick(&cx, &conn, &policy, u.as_ref()).await;
                tokio::time::sleep(loans::TICK).await;
            }
            // Nothing lent and no team lends: no wakeups until a reconcile may have changed
            // that (notify_one keeps a permit, so one that ended meanwhile still wakes it).
            None => policy_seen.notified().await,
        }
    }
}

/// gpuctld's re-slice tick ([`reslice::tick`]) until the runtime ends; asleep while no entry
/// allows other layouts.
async fn reslice_loop(
    backend: Arc<dyn Backend>,
    sd: Systemd,
    root: Root,
    state: PlaceState,
    policy_seen: Arc<tokio::sync::Notify>,
) {
    loop {
        let cx = place_cx(&*backend, &sd, &root, &state);
        match backend.policy().ok().filter(reslice::wanted) {
            Some(policy) => {
                let u = usage::usage(&*backend, &root).await.ok();
                reslice::tick(&cx, &policy, u.as_ref()).await;
                tokio::time::sleep(reslice::TICK).await;
            }
            None => policy_seen.notified().await,
        }
    }
}

/// A GPU's MIG state in `Status` words (`on, 3 instance(s)`), `None` without MIG. A GPU the
/// policy holds in MIG mode for no team (`mig = []`) says so: its empty team list is meant.
fn mig_words(g: &crate::observe::GpuState, policy: Option<&Policy>) -> Option<String> {
    let m = g.mig.as_ref()?;
    let mode = |on: bool| if on { "on" } else { "off" };
    let pending = if m.is_pending() {
        format!(" (pending {}: needs GPU reset)", mode(m.pending))
    } else {
        String::new()
    };
    let held = match policy.and_then(|p| p.usage_for(g)) {
        Some(crate::policy::GpuUse::Mig(specs)) if specs.is_empty() => {
            ", held for no team (mig = [])"
        }
        _ => "",
    };
    Some(format!(
        "{}{pending}, {} instance(s){held}",
        mode(m.current),
        m.instances.len()
    ))
}

/// Emit `PropertiesChanged` for `StatusText` (best effort: status is also in `STATUS=`).
pub async fn status_text_changed(conn: &Connection) {
    if let Ok(iface) = conn
        .object_server()
        .interface::<_, Agent>(OBJECT_PATH)
        .await
    {
        let _ = iface
            .get()
            .await
            .status_text_changed(iface.signal_emitter())
            .await;
    }
}

/// The GPUs of `Status`: each with the teams it serves and its MIG state in words.
pub fn gpu_statuses(
    view: &reply::HostView,
    policy: Option<&Policy>,
    out: &std::collections::BTreeMap<String, crate::health::OutOfService>,
    layouts: &crate::reslice::state::InForce,
) -> Vec<GpuStatus> {
    view.gpus
        .iter()
        .map(|g| GpuStatus {
            layout: policy.and_then(|p| layout_status(p, g, layouts)),
            out_of_service: std::iter::once(g.uuid.as_str())
                .chain(
                    g.mig
                        .iter()
                        .flat_map(|m| &m.instances)
                        .flat_map(|gi| &gi.compute)
                        .map(|ci| ci.uuid.as_str()),
                )
                .filter_map(|d| {
                    out.get(d).map(|o| reply::v1::DeviceOutStatus {
                        device: d.to_string(),
                        reason: o.reason.clone(),
                        since: o.since,
                        by: o.by.clone(),
                    })
                })
                .collect(),
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            node: format!("/dev/nvidia{}", g.minor),
            teams: view
                .teams
                .iter()
                .filter(|(_, t)| {
                    t.whole_gpus.contains(&g.index)
                        || t.mig_devices.iter().any(|m| m.gpu_index == g.index)
                })
                .map(|(n, _)| n.to_string())
                .collect(),
            mig: mig_words(g, policy),
            instances: g.mig.as_ref().map(|m| m.instances.clone()),
        })
        .collect()
}

/// The layout `g` has among those its entry allows; `None` when the entry allows one.
pub(crate) fn layout_status(
    p: &Policy,
    g: &crate::observe::GpuState,
    layouts: &crate::reslice::state::InForce,
) -> Option<reply::v1::LayoutStatus> {
    let entry = p.gpus.iter().find(|a| a.selector.matches(g))?;
    entry.layouts.as_ref()?;
    let name = p
        .layout_in_force(entry, g.index)
        .map_or(crate::policy::DEFAULT_LAYOUT, |l| &l.name);
    let chosen = layouts.gpus.get(&g.index).filter(|c| c.layout == name);
    Some(reply::v1::LayoutStatus {
        name: name.to_string(),
        since: chosen.map(|c| c.since_ms / 1000),
        reason: chosen.map(|c| c.reason.clone()),
    })
}

/// What `Status` reads live from systemd, apart from the reply built from it
/// ([`status_reply`]), so that building it is a function of values.
#[derive(Debug, Clone, Default)]
pub struct LiveStatus {
    /// The running MPS daemons' instances and settings.
    pub mps: Vec<(String, crate::observe::MpsSpec)>,
    /// Per team: its slice as systemd has it now, and the slice's usage (`None`: unreadable).
    pub slices: std::collections::BTreeMap<
        String,
        (
            Option<crate::observe::SliceSpec>,
            Option<crate::systemd::SliceUsage>,
        ),
    >,
    /// The state of each MPS unit of the view that systemd knows.
    pub units: std::collections::BTreeMap<String, crate::systemd::client::UnitState>,
    /// The live placement leases.
    pub leases: Vec<crate::placement::Lease>,
    /// The devices out of service, by UUID.
    pub out_of_service: std::collections::BTreeMap<String, crate::health::OutOfService>,
    /// The layouts gpuctld switched GPUs to.
    pub layouts: crate::reslice::state::InForce,
}

/// Read what `Status` shows live: the slices and MPS units of the policy's teams in the last
/// reconcile's view, and the leases. NVML is not touched on the bus thread.
pub async fn live_status(sh: &AgentState, sd: &Systemd, root: &Root) -> LiveStatus {
    let mut live = LiveStatus::default();
    let view = sh.last_report.as_ref().and_then(|r| r.view.as_ref());
    if let (Some(p), Some(v)) = (&sh.policy, view) {
        live.mps = sd.list_mps().await.unwrap_or_default();
        for name in p.teams.keys() {
            let slice = sd.read_slice(name).await.ok().flatten();
            let usage = sd.slice_usage(name).await.ok();
            live.slices.insert(name.to_string(), (slice, usage));
            for inst in v.teams.get(name).iter().flat_map(|t| t.mps.keys()) {
                let unit = mps::unit(inst);
                if let Some(state) = sd.unit_state(&unit).await.ok().flatten() {
                    live.units.insert(unit, state);
                }
            }
        }
    }
    live.leases = place::leases(sd, root).await.unwrap_or_default();
    live.out_of_service = health::out_of_service();
    live.layouts = crate::reslice::state::InForce::read(root);
    live
}

/// The `Status` reply: per team its GPUs and MIG devices (with UUIDs), live slice limits and
/// usage, MPS units; per GPU its MIG mode and instances; the last reconcile and the last policy
/// error. Devices come from the last reconcile's view of the host, the rest from `live`. The
/// queue is the caller's to fill (it depends on who asks).
pub fn status_reply(sh: AgentState, live: &LiveStatus) -> StatusReply {
    let view = sh.last_report.as_ref().and_then(|r| r.view.as_ref());
    let mut teams = std::collections::BTreeMap::new();
    if let (Some(p), Some(v)) = (&sh.policy, view) {
        for name in p.teams.keys() {
            let tv = v.teams.get(name);
            let (slice_live, usage) = live.slices.get(&**name).cloned().unwrap_or_default();
            let mps_units = tv
                .iter()
                .flat_map(|t| t.mps.keys())
                .map(|inst| {
                    let unit = mps::unit(inst);
                    let state = live.units.get(&unit);
                    MpsUnitStatus {
                        active_state: state.map(|s| s.active.clone()),
                        sub_state: state.map(|s| s.sub.clone()),
                        settings: live
                            .mps
                            .iter()
                            .find(|(i, _)| i == inst)
                            .map(|(_, s)| s.clone()),
                        unit,
                    }
                })
                .collect();
            let gpus = tv
                .iter()
                .flat_map(|t| &t.whole_gpus)
                .map(|i| GpuRef {
                    index: *i,
                    uuid: v
                        .gpus
                        .iter()
                        .find(|g| g.index == *i)
                        .map(|g| g.uuid.clone()),
                })
                .collect();
            let slice = SliceStatus {
                unit: crate::systemd::props::slice_unit(name),
                wanted: tv.map(|t| t.slice.clone()),
                live: slice_live,
                active_state: usage.as_ref().map(|u| u.active_state.clone()),
                memory_current: usage.as_ref().and_then(|u| u.memory_current),
                tasks_current: usage.as_ref().and_then(|u| u.tasks_current),
            };
            let team = TeamStatus {
                gpus,
                mig_instances: tv
                    .iter()
                    .flat_map(|t| &t.mig_devices)
                    .map(Into::into)
                    .collect(),
                slice,
                mps: mps_units,
            };
            teams.insert(name.to_string(), team);
        }
    }
    let gpus = view
        .map(|v| gpu_statuses(v, sh.policy.as_ref(), &live.out_of_service, &live.layouts))
        .unwrap_or_default();
    StatusReply {
        leases: live
            .leases
            .iter()
            .map(reply::v1::LeaseStatus::from)
            .collect(),
        queue: Vec::new(),
        status: sh.status_text,
        policy_error: sh.policy_error,
        policy_in_force: sh.policy_origin.map(str::to_string),
        policy_sources: sh.policy.as_ref().map(|p| p.sources.clone()),
        last_reconcile: sh.last_report.as_ref().map(LastReconcile::from),
        teams,
        gpus,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::{GpuState, MigState};

    /// The policy of one file's `text` (the re-slice tests share it).
    pub(super) fn policy(text: &str) -> Policy {
        let mut d = Vec::new();
        let f = crate::policy::parse::parse_fragment(std::path::Path::new("p.toml"), text, &mut d);
        crate::policy::validate::build(&[f.unwrap()], &mut d)
    }

    #[test]
    fn status_says_when_the_policy_holds_a_mig_gpu_for_no_team() {
        let g = |index: u32| GpuState {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            model: Some("H100-SXM5-80GB".into()),
            minor: index,
            memory_mib: 81559,
            mig: Some(MigState {
                current: true,
                pending: true,
                instances: vec![],
            }),
            processes: vec![],
        };
        let p = policy(
            "version = 1\n[teams.a]\nmembers = [\"x\"]\n[[gpu]]\nindex = [0]\nmig = []\n\
             [[gpu]]\nindex = [1]\nmig = [{ profile = \"7g.80gb\", owner = \"a\" }]\n",
        );
        assert_eq!(
            mig_words(&g(0), Some(&p)).unwrap(),
            "on, 0 instance(s), held for no team (mig = [])"
        );
        assert_eq!(mig_words(&g(1), Some(&p)).unwrap(), "on, 0 instance(s)");
        assert_eq!(mig_words(&g(0), None).unwrap(), "on, 0 instance(s)");
        let whole = GpuState { mig: None, ..g(2) };
        assert_eq!(mig_words(&whole, Some(&p)), None);
    }

    #[test]
    fn status_marks_a_gpu_or_its_mig_device_out_of_service() {
        let gpus: Vec<GpuState> = serde_json::from_value(serde_json::json!([
            {"index": 0, "uuid": "GPU-0", "name": "H100", "model": null, "minor": 0,
             "memory_mib": 1, "mig": null, "processes": []},
            {"index": 1, "uuid": "GPU-1", "name": "H100", "model": null, "minor": 1,
             "memory_mib": 1, "processes": [],
             "mig": {"current": true, "pending": true, "instances": [
                {"id": 1, "profile_id": 9, "profile": "3g.40gb",
                 "placement": {"start": 0, "size": 4}, "owner": null, "compute": [
                    {"id": 0, "profile_id": 2, "profile": "3g.40gb",
                     "placement": {"start": 0, "size": 3}, "uuid": "MIG-a", "processes": []}]}]}},
            {"index": 2, "uuid": "GPU-2", "name": "H100", "model": null, "minor": 2,
             "memory_mib": 1, "mig": null, "processes": []}
        ]))
        .unwrap();
        let view = reply::HostView {
            teams: Default::default(),
            gpus,
        };
        let why = |r: &str| crate::health::OutOfService {
            reason: r.into(),
            since: 7,
            by: "gpuctld".into(),
        };
        let out = [
            ("GPU-0".to_string(), why("XID 79")),
            ("MIG-a".to_string(), why("XID 94")),
            ("MIG-gone".to_string(), why("XID 94")),
        ]
        .into_iter()
        .collect();
        let st = gpu_statuses(&view, None, &out, &Default::default());
        let marks: Vec<Vec<(&str, &str)>> = st
            .iter()
            .map(|g| {
                g.out_of_service
                    .iter()
                    .map(|d| (d.device.as_str(), d.reason.as_str()))
                    .collect()
            })
            .collect();
        assert_eq!(
            marks,
            [vec![("GPU-0", "XID 79")], vec![("MIG-a", "XID 94")], vec![]]
        );
        // Nothing out: the reply's JSON is as before (no empty list).
        let json = serde_json::to_value(&st[2]).unwrap();
        assert!(json.get("out_of_service").is_none(), "{json}");
    }
}
