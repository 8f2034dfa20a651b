//! When to reconcile again after a run that did not converge, as kube-rs's controller requeues
//! after an error: transient failures are retried with exponential backoff (reset by a run
//! without them), a change that waits only for holders to go is checked again shortly, and a
//! failure only a change of policy or host can fix waits at the cap. The drift timer and the
//! watches run besides, as before.

use crate::dbus_api::reply::ReconcileReport;
use std::time::Duration;

/// The first retry after a transient failure.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between retries: a permanent failure is tried again this often.
pub const RETRY_CAP: Duration = Duration::from_secs(60);
/// How soon a change blocked by busy holders is checked again (process exits send no event).
pub const RECHECK: Duration = Duration::from_secs(15);

/// What the loop does after a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requeue {
    /// Converged: only the watches and the drift timer.
    Idle,
    /// Run again after the delay, as retry `attempt`.
    Retry {
        /// Wait this long.
        after: Duration,
        /// 1 for the first retry since the last run without errors.
        attempt: u32,
    },
    /// Check again after the delay.
    Recheck(Duration),
}

/// The backoff state across runs.
#[derive(Debug, Default)]
pub struct Backoff {
    /// Consecutive runs with errors.
    failures: u32,
    /// The errors last reported, so that a failure that repeats is logged once.
    last_errors: Vec<String>,
}

impl Backoff {
    /// The requeue after `r`, and whether its errors are new (to be reported) rather than the
    /// same as the run before.
    pub fn after(&mut self, r: &ReconcileReport) -> (Requeue, bool) {
        let new = r.errors != self.last_errors;
        self.last_errors.clone_from(&r.errors);
        if r.errors.is_empty() {
            self.failures = 0;
            let q = if r.heal.holders {
                Requeue::Recheck(RECHECK)
            } else {
                Requeue::Idle
            };
            return (q, new);
        }
        self.failures = self.failures.saturating_add(1);
        let after = if r.heal.transient {
            // 1 s, 2 s, 4 s … up to the cap.
            FIRST_RETRY
                .saturating_mul(1u32 << (self.failures - 1).min(16))
                .min(RETRY_CAP)
        } else {
            RETRY_CAP
        };
        (
            Requeue::Retry {
                after,
                attempt: self.failures,
            },
            new,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dbus_api::reply::Heal;

    fn failed(transient: bool, what: &str) -> ReconcileReport {
        let mut r = ReconcileReport::default();
        r.error(what.into(), transient);
        r
    }

    fn delay(q: &Requeue) -> Duration {
        match q {
            Requeue::Retry { after, .. } => *after,
            Requeue::Recheck(d) => *d,
            Requeue::Idle => Duration::MAX,
        }
    }

    #[test]
    fn transient_failures_back_off_exponentially_to_the_cap_and_reset_on_success() {
        let mut b = Backoff::default();
        let delays: Vec<u64> = (0..9)
            .map(|_| delay(&b.after(&failed(true, "x: bus")).0).as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(b.after(&ReconcileReport::default()).0, Requeue::Idle);
        assert_eq!(
            b.after(&failed(true, "x: bus")).0,
            Requeue::Retry {
                after: FIRST_RETRY,
                attempt: 1
            }
        );
    }

    #[test]
    fn a_permanent_failure_waits_at_the_cap_and_is_new_only_when_it_changes() {
        let mut b = Backoff::default();
        let (q, new) = b.after(&failed(false, "gpu 7 does not exist"));
        assert_eq!(delay(&q), RETRY_CAP);
        assert!(new);
        let (_, new) = b.after(&failed(false, "gpu 7 does not exist"));
        assert!(!new, "the same failure again is not reported again");
        let (_, new) = b.after(&failed(false, "gpu 8 does not exist"));
        assert!(new);
        // One transient error among permanent ones: retried soon.
        let mut r = failed(false, "gpu 8 does not exist");
        r.error("gpu-a.slice: job timeout".into(), true);
        assert!(delay(&b.after(&r).0) < RETRY_CAP);
    }

    #[test]
    fn a_change_waiting_for_holders_is_rechecked_and_a_converged_run_is_idle() {
        let mut b = Backoff::default();
        let waiting = ReconcileReport {
            differs: vec!["blocked: gpu 0: in use (held by pid 7)".into()],
            heal: Heal {
                holders: true,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(b.after(&waiting).0, Requeue::Recheck(RECHECK));
        // A pending mode change needs a reset, not time: no recheck.
        let pending = ReconcileReport {
            differs: vec!["gpu 0: MIG mode change pending a reset".into()],
            ..Default::default()
        };
        assert_eq!(b.after(&pending).0, Requeue::Idle);
        assert_eq!(b.after(&ReconcileReport::default()).0, Requeue::Idle);
    }
}
