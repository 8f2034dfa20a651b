//! What the daemon calls to make the host match a policy: the shared core, run against the real
//! host.
//!
//! [`CoreReconciler`] observes through [`RealHost`] (NVML, files under the root, live slices and
//! MPS daemons read from systemd), plans with [`plan::plan`] and applies with
//! [`apply::execute_with`] and the file journal, exactly as `gpuctl apply --local` does. The
//! daemon adds only what a long-running agent needs: the report for `STATUS=` and `Status`,
//! journald fields per action, and the boot state for the generator.

use super::state::{AppliedState, STATE_FILE};
use super::Observe;
use crate::apply::journal::FileJournal;
use crate::apply::{self, EffectError, Observer, Report};
pub use crate::dbus_api::reply::{HostView, ReconcileReport};
use crate::dbus_api::ResetError;
use crate::observe::Observed;
use crate::plan::{self, Action, ActionKind, Plan, TeamView};
use crate::policy::{Policy, TeamName};
use crate::real::RealHost;
use crate::systemd::{mps, props};
use std::collections::BTreeMap;
use tracing::{debug, error, info, warn};

/// How long a reconcile waits for another writer (`gpuctl apply --local`) before it reports an
/// error and leaves the host to the next trigger.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Makes the host match a policy. Must be idempotent: a second call with the same policy and an
/// unchanged host changes nothing, and a call after a crash mid-way finishes the job.
pub trait Reconciler: Send {
    /// Apply `policy`, reading the host again as far as `observe` says the triggers need.
    fn reconcile_with(&mut self, policy: &Policy, observe: Observe) -> ReconcileReport;
    /// Apply `policy`.
    fn reconcile(&mut self, policy: &Policy) -> ReconcileReport {
        self.reconcile_with(policy, Observe::All)
    }
    /// Apply `policy` after a hand change of a unit gpuctl owns: GPUs may be taken from the
    /// last converged run, since no unit change alters MIG (issue 17: repair within a second).
    fn reconcile_units(&mut self, policy: &Policy) -> ReconcileReport {
        self.reconcile_with(policy, Observe::Units)
    }
    /// Apply `policy` when the only trigger was a policy file ([`Observe::Policy`]): the host
    /// may be taken whole from the last converged run.
    fn reconcile_policy(&mut self, policy: &Policy) -> ReconcileReport {
        self.reconcile_with(policy, Observe::Policy)
    }
    /// Report what [`Reconciler::reconcile`] would change, changing nothing.
    fn plan(&mut self, policy: &Policy) -> ReconcileReport;
    /// Reset GPU `gpu` (UUID) when no process holds it.
    fn reset_gpu(&mut self, policy: &Policy, gpu: &str) -> Result<(), ResetError>;
}

/// The reconciler: `observe → plan → execute` on a [`RealHost`] with systemd attached.
#[derive(Debug)]
pub struct CoreReconciler {
    host: RealHost,
    /// NVML's absence was logged; it is said once, not on every drift tick.
    nvml_said: bool,
    /// The last run that converged: its policy and the host it left.
    last: Option<(Policy, Observed)>,
}

/// The part of a policy that decides GPUs, MIG and MPS: everything but team limits, members
/// and where each line came from. Two policies with the same GPU side plan the same GPU
/// actions on the same GPUs.
fn gpu_side(p: &Policy) -> Policy {
    let mut p = p.clone();
    for t in p.teams.values_mut() {
        t.limits = Default::default();
        t.members.clear();
        t.loc = None;
    }
    p.sources.clear();
    p
}

impl CoreReconciler {
    /// Reconcile `host` (NVML is reopened when the policy names another library).
    pub fn new(host: RealHost) -> Self {
        CoreReconciler {
            host,
            nvml_said: false,
            last: None,
        }
    }

    /// The host as the last converged run left it, when `policy` is a new policy that changes
    /// only what reaches systemd (limits, members): its GPUs need no fresh NVML read (issue 14:
    /// a limit change is as cheap as a hand `set-property`). A run with the same policy again
    /// (start, drift, reload, the drift timer) observes everything: that is how hand changes
    /// are found.
    ///
    /// With [`Observe::Units`] (the trigger was a hand change of a unit, see
    /// [`Reconciler::reconcile_units`]) the same policy also takes them: units are read again in
    /// any case, and a unit change cannot alter MIG; the drift timer still reads NVML.
    fn cached_gpus(&self, policy: &Policy, observe: Observe) -> Option<&Observed> {
        let (prev, obs) = self.last.as_ref()?;
        ((observe == Observe::Units || prev != policy) && gpu_side(prev) == gpu_side(policy))
            .then_some(obs)
    }

    /// Observe, after pointing NVML at the library the policy names. NVML missing is logged
    /// once and recorded as a warning: the GPU part of the plan is then empty, and slices, env
    /// files and MPS still converge for what the policy asks without GPUs.
    fn observe(
        &mut self,
        policy: &Policy,
        cached: Option<&Observed>,
        r: &mut ReconcileReport,
    ) -> Option<Observed> {
        self.host.set_nvml_library(crate::nvml::library_path(
            policy.host.nvml_library.as_deref(),
        ));
        self.host.set_slurm(&policy.slurm);
        self.host
            .set_out_of_service(crate::dbus_api::health::out_of_service_ids());
        let fresh = match cached {
            Some(prev) => self.host.refresh(prev, &Default::default()),
            None => self.host.observe(),
        };
        let obs = match fresh {
            Ok(o) => o,
            Err(e) => {
                error!(gpuctl_action = "observe", "observing the host: {e}");
                r.error(format!("observing the host: {e}"), e.is_transient());
                return None;
            }
        };
        match &obs.nvml_unavailable {
            Some(why) => {
                if !self.nvml_said {
                    warn!(
                        gpuctl_action = "observe",
                        "{why}; no GPU is observed, so teams get no devices until NVML works"
                    );
                    self.nvml_said = true;
                }
                r.warnings.push(nvml_warning(why));
            }
            None => self.nvml_said = false,
        }
        Some(obs)
    }

    fn run_timed(
        &mut self,
        policy: &Policy,
        observe: Observe,
        laps: &mut Laps,
        r: &mut ReconcileReport,
    ) {
        // One writer (issue 17): `gpuctl apply --local` and gpuctld never apply at once. Taken
        // before observing, so the plan starts from what the other writer left.
        let _lock = match crate::apply::lock::ApplyLock::acquire(
            self.host.root(),
            "gpuctld",
            LOCK_WAIT,
            |holder| {
                info!(
                    gpuctl_action = "lock",
                    "waiting for the apply lock held by {holder}"
                )
            },
        ) {
            Ok(l) => l,
            Err(e) => {
                error!(gpuctl_action = "lock", "{e}");
                // The other writer (`gpuctl apply --local`) finishes: a retry soon gets it.
                r.error(e.to_string(), true);
                return;
            }
        };
        // gpuctl owns its units: persistent `set-property` overrides go (issue 17; see
        // `daemon::drift` for why removal rather than reporting).
        laps.lap("lock");
        let (removed, errors) = super::drift::remove_persistent_overrides(self.host.root());
        for o in removed {
            warn!(
                gpuctl_action = "drift",
                gpuctl_unit = %o.unit,
                "removed persistent override {} ({}) of {}: gpuctl owns this unit; change the \
                 policy instead",
                o.file,
                o.content,
                o.unit
            );
            r.changes.push(format!(
                "removed persistent override {} ({})",
                o.file, o.content
            ));
        }
        r.errors.extend(errors);
        // Taken, not kept: only a run that converges leaves a cache behind.
        let prev = self.cached_gpus(policy, observe).cloned();
        self.last = None;
        let cached = prev.is_some();
        laps.lap("overrides");
        // When only a policy file triggered this run, the whole host is taken from the last
        // converged run, read again in no part: what systemd and the files hold changed since
        // only through gpuctld, or a drift watch has queued a run of its own that reads them.
        // What the watches cannot see (a hand edit of an env file) is found by the after-apply
        // read and the drift timer, as without the cache.
        let whole = prev.as_ref().filter(|_| observe == Observe::Policy);
        let obs = match whole {
            Some(o) => {
                if let Some(why) = &o.nvml_unavailable {
                    r.warnings.push(nvml_warning(why));
                }
                laps.lap("observe (none)");
                let mut o = o.clone();
                o.out_of_service = crate::dbus_api::health::out_of_service_ids();
                o
            }
            None => {
                let Some(o) = self.observe(policy, prev.as_ref(), r) else {
                    return;
                };
                laps.lap(if cached {
                    "observe (units)"
                } else {
                    "observe (all)"
                });
                o
            }
        };
        host_check(policy, &obs, r);
        let pl = plan::plan(policy, &obs);
        laps.lap("plan");
        let mut journal = FileJournal::new(self.host.root());
        // An unfinished MIG transaction of an earlier run (a crash) is rolled forward or back by
        // the executor even when the plan looks empty.
        let end = if pl.actions.is_empty() && !journal.path().exists() {
            warn_blocked(&pl, r);
            obs
        } else {
            let phases = self.host.phases();
            let ran = apply::execute_observed(
                policy,
                &pl,
                obs,
                &mut self.host,
                &mut journal,
                phases.as_ref(),
            );
            laps.lap("apply");
            // The executor's own last read is the host as the run left it. After a failed
            // observation the host is read again here (GPUs too, unless they came from the
            // cache: a plan from cached GPUs touches no GPU).
            let after = match ran {
                Ok(mut rep) => {
                    absorb(&rep, r);
                    Ok(std::mem::take(&mut rep.end))
                }
                Err(e) => {
                    r.error(format!("apply: {e}"), e.is_transient());
                    match &prev {
                        Some(prev) => self.host.refresh(prev, &Default::default()),
                        None => self.host.observe(),
                    }
                }
            };
            match after {
                Ok(o) => o,
                Err(e) => {
                    r.error(
                        format!("observing the host after apply: {e}"),
                        e.is_transient(),
                    );
                    return;
                }
            }
        };
        laps.lap("observe after");
        let d = plan::desired(policy, &end);
        r.gpus = d.gpus.len();
        r.units = units_of(&d.teams);
        let provisional = d.teams.values().any(|t| t.provisional);
        if r.errors.is_empty() && !provisional {
            // The generator builds boot-time slices from this file, so it is written only
            // after a run that fully succeeded: a half-applied state never becomes boot truth.
            let state = AppliedState {
                version: 1,
                slices: d
                    .teams
                    .iter()
                    .map(|(t, v)| (t.to_string(), v.slice.clone()))
                    .chain(
                        d.loans
                            .iter()
                            .map(|l| (crate::names::LOANS.into(), l.clone())),
                    )
                    .collect(),
                fences: d
                    .fences
                    .iter()
                    .flatten()
                    .filter(|(_, f)| !f.is_open())
                    .map(|(s, f)| (s.clone(), f.clone()))
                    .collect(),
            };
            if let Err(e) = state.save(&self.host.root().join(STATE_FILE)) {
                r.error(e.to_string(), false);
            }
        }
        laps.lap("state");
        self.last = (r.converged() && !provisional).then(|| (policy.clone(), end.clone()));
        r.view = Some(HostView {
            teams: d.teams,
            gpus: end.gpus,
        });
    }
}

/// The host checks `gpuctl plan` and `check` make ([`crate::policy::validate::check_against_host`]:
/// GPUs, CPUs and RAM the policy names that this host lacks): each error is an error of the run,
/// so `status` says why the host is not converged, and the rest of the policy is applied all
/// the same. Without NVML the GPU checks wait (the run already warns that no GPU is seen).
fn host_check(policy: &Policy, obs: &Observed, r: &mut ReconcileReport) {
    let unseen;
    let p = if obs.nvml_unavailable.is_some() {
        unseen = Policy {
            gpus: vec![],
            ..policy.clone()
        };
        &unseen
    } else {
        policy
    };
    for d in crate::policy::validate::check_against_host(p, obs) {
        if d.severity == crate::policy::Severity::Error {
            warn!(
                gpuctl_action = "host-check",
                "the policy does not fit this host: {d}"
            );
            r.error(format!("the policy does not fit this host: {d}"), false);
        } else {
            r.warnings.push(d.to_string());
        }
    }
}

/// Where a reconcile's time went, for the debug log (issue 17: a drift repair within 1 s needs
/// to know which step costs what on a real host).
struct Laps {
    last: std::time::Instant,
    laps: Vec<(&'static str, u128)>,
}

impl Laps {
    fn start() -> Laps {
        Laps {
            last: std::time::Instant::now(),
            laps: Vec::new(),
        }
    }

    fn lap(&mut self, what: &'static str) {
        let now = std::time::Instant::now();
        self.laps.push((what, (now - self.last).as_micros()));
        self.last = now;
    }

    fn show(&self) -> String {
        let total: u128 = self.laps.iter().map(|l| l.1).sum();
        let parts: Vec<String> = self
            .laps
            .iter()
            .map(|(w, us)| format!("{w} {:.1}", *us as f64 / 1000.0))
            .collect();
        format!("{:.1} ms: {}", total as f64 / 1000.0, parts.join(", "))
    }
}

/// The report's line for a host observed without NVML.
fn nvml_warning(why: &str) -> String {
    format!("{why}: GPUs not observed, no devices assigned")
}

/// Units the policy wants, for the `UnitRemoved` filter.
fn units_of(teams: &BTreeMap<TeamName, TeamView>) -> Vec<String> {
    teams
        .values()
        .flat_map(|t| {
            std::iter::once(props::slice_unit(&t.name)).chain(t.mps.keys().map(|i| mps::unit(i)))
        })
        .collect()
}

fn warn_blocked(pl: &Plan, r: &mut ReconcileReport) {
    for b in &pl.blocked {
        let what = b.gi.as_ref().map_or(String::new(), |gi| format!(" {gi}"));
        let line = format!(
            "blocked: gpu {}{what}: {}{}",
            b.index,
            b.reason,
            if b.holders.is_empty() {
                String::new()
            } else {
                format!(" (held by {})", b.holders.join(", "))
            }
        );
        r.differs.push(line.clone());
        r.warnings.push(line);
        r.heal.holders = true;
    }
}

/// The `GPUCTL_GPU` journal field of an action: its GPU's index, or empty.
fn gpu_field(a: &Action) -> String {
    a.kind
        .gpu_index()
        .map(|i| i.to_string())
        .unwrap_or_default()
}

/// Log one action with the journald fields admins filter on.
fn log_action(a: &Action, verb: &str) {
    info!(
        gpuctl_team = a.kind.team().unwrap_or(""),
        gpuctl_gpu = gpu_field(a),
        gpuctl_action = %a.phase,
        "{verb}{} — {}",
        a.kind,
        a.reason
    );
}

/// Fold the executor's report into the daemon's.
fn absorb(rep: &Report, r: &mut ReconcileReport) {
    for line in &rep.recovered {
        warn!(gpuctl_action = "recover", "journal: {line}");
        r.warnings.push(format!("journal: {line}"));
    }
    for a in &rep.done {
        log_action(a, "");
        r.changes.push(a.kind.to_string());
    }
    for a in &rep.restored {
        log_action(a, "restored: ");
        r.changes.push(format!("restored: {}", a.kind));
    }
    for (a, e) in &rep.failed {
        // A removed team's slice with jobs in it stays until they end: never kill a job
        // because a team left the policy. That is the policy working, not a failure.
        if matches!(
            (&a.kind, e),
            (ActionKind::RemoveSlice { .. }, EffectError::InUse { .. })
        ) {
            warn!(
                gpuctl_team = a.kind.team().unwrap_or(""),
                gpuctl_action = "slices",
                "{e}"
            );
            r.warnings.push(e.to_string());
            r.differs.push(e.to_string());
            r.heal.holders = true;
            continue;
        }
        error!(
            gpuctl_team = a.kind.team().unwrap_or(""),
            gpuctl_gpu = gpu_field(a),
            gpuctl_action = %a.phase,
            "{}: {e}",
            a.kind
        );
        r.error(format!("{}: {e}", a.kind), e.is_transient());
    }
    for a in &rep.skipped {
        r.warnings.push(format!(
            "skipped {} (an earlier step on its GPU failed)",
            a.kind
        ));
    }
    for a in &rep.not_run {
        r.warnings
            .push(format!("skipped {} (needs systemd)", a.kind));
    }
    for p in &rep.pending {
        let line = format!("gpu {}: MIG mode change {}", p.index, p.reason);
        r.differs.push(line.clone());
        r.warnings.push(line);
    }
    warn_blocked(&rep.remaining, r);
    if rep.failed.is_empty() && rep.not_run.is_empty() {
        // Nothing failed, yet the host does not plan empty: something reads back differently
        // from what was written, and every reconcile would repeat the change.
        for a in &rep.remaining.actions {
            r.errors.push(format!(
                "still differs after apply: {} — {}",
                a.kind, a.reason
            ));
        }
    }
}

impl CoreReconciler {
    /// The reset itself, after the processes are read again: the driver would refuse a busy
    /// GPU too, but gpuctl never even tries to take one from a job.
    fn reset_idle(&mut self, gpu: &str) -> Result<(), ResetError> {
        let failed = |e: EffectError| ResetError::Failed(e.to_string());
        let obs = crate::apply::Observer::observe(&mut self.host).map_err(failed)?;
        if let Some(why) = obs.nvml_unavailable {
            return Err(ResetError::Failed(why));
        }
        let g = obs
            .gpus
            .iter()
            .find(|g| g.uuid == gpu)
            .ok_or_else(|| ResetError::Failed(format!("no GPU {gpu} on this host")))?;
        let holders: Vec<String> = g
            .processes
            .iter()
            .chain(
                g.mig
                    .iter()
                    .flat_map(|m| m.instances.iter())
                    .flat_map(|i| i.compute.iter())
                    .flat_map(|c| c.processes.iter()),
            )
            .map(crate::plan::mig::holder)
            .collect();
        if !holders.is_empty() {
            return Err(ResetError::Busy(holders.join(", ")));
        }
        crate::apply::GpuEffector::reset_gpu(&mut self.host, gpu).map_err(failed)
    }
}

impl Reconciler for CoreReconciler {
    fn reconcile_with(&mut self, policy: &Policy, observe: Observe) -> ReconcileReport {
        let mut laps = Laps::start();
        let mut r = ReconcileReport {
            teams: policy.teams.len(),
            ..Default::default()
        };
        self.run_timed(policy, observe, &mut laps, &mut r);
        r.at = super::unix_now();
        // Nothing is held open between reconciles (RealHost::release_nvml says why).
        self.host.release_nvml();
        debug!(
            gpuctl_action = "reconcile-timing",
            "reconcile took {}",
            laps.show()
        );
        r
    }

    fn reset_gpu(&mut self, policy: &Policy, gpu: &str) -> Result<(), ResetError> {
        let _lock =
            crate::apply::lock::ApplyLock::acquire(self.host.root(), "gpuctld", LOCK_WAIT, |_| {})
                .map_err(|e| ResetError::Failed(e.to_string()))?;
        self.host.set_nvml_library(crate::nvml::library_path(
            policy.host.nvml_library.as_deref(),
        ));
        let r = self.reset_idle(gpu);
        self.host.release_nvml();
        // Its instances are gone: the next run reads the host again.
        self.last = None;
        r
    }

    fn plan(&mut self, policy: &Policy) -> ReconcileReport {
        let mut r = ReconcileReport {
            teams: policy.teams.len(),
            ..Default::default()
        };
        if let Some(obs) = self.observe(policy, None, &mut r) {
            let d = plan::desired(policy, &obs);
            let pl = plan::slurm::around(policy, &obs, plan::diff(&d, &obs));
            r.gpus = d.gpus.len();
            r.units = units_of(&d.teams);
            r.changes = pl
                .actions
                .iter()
                .map(|a| format!("would {} — {}", a.kind, a.reason))
                .collect();
            warn_blocked(&pl, &mut r);
        }
        self.host.release_nvml();
        r.at = super::unix_now();
        r
    }
}
