//! The systemd watchdog, armed only while the reconcile loop has work.
//!
//! systemd's watchdog (`WatchdogSec=` in gpuctld.service) attests the *reconcile loop's*
//! progress (#18): gpuctld pings only while the loop is inside a step (a load, a reconcile, a dry
//! run) that is within its time limit, so a wedged step stops the pings and systemd restarts
//! gpuctld. While the loop waits for work there is no progress to attest, and a ping every
//! `WatchdogSec/2` was the one wakeup left in an idle gpuctld (VM 59: 1 in 30 s, #14 asks for
//! none). So the watchdog is disarmed while idle (`WATCHDOG_USEC=infinity`, which systemd ≥ 236
//! takes as "no watchdog" until told otherwise) and armed again with the unit's own timeout
//! (`WATCHDOG_USEC=` that value, which also resets the timer) when a step starts. The thread that
//! does this sleeps on a condition variable while idle: no timer, no wakeup.
//!
//! What is given up: while idle, a gpuctld frozen as a whole (SIGSTOP, a deadlocked runtime
//! thread) is not restarted by the watchdog until work arrives. The ping of a separate thread did
//! not detect a deadlocked runtime thread either, only a stopped process.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the reconcile loop is doing, for the watchdog: idle (waiting for work), or in a step that
/// must end by a deadline. Shared between the loop and the watchdog thread.
#[derive(Debug, Clone, Default)]
pub struct Progress(Arc<(Mutex<Option<Instant>>, Condvar)>);

impl Progress {
    fn set(&self, step: Option<Instant>) {
        let (m, cv) = &*self.0;
        *m.lock().unwrap_or_else(|e| e.into_inner()) = step;
        cv.notify_all();
    }

    /// The loop starts a step that may take up to `limit`.
    pub fn enter(&self, limit: Duration) {
        self.set(Some(Instant::now() + limit));
    }

    /// The step ended; the loop is back to waiting for work.
    pub fn leave(&self) {
        self.set(None);
    }

    /// Whether the loop is progressing at `now`: idle, or within its step's deadline.
    pub fn healthy(&self, now: Instant) -> bool {
        self.step().is_none_or(|deadline| now < deadline)
    }

    /// The deadline of the step the loop is in, or `None` while it is idle.
    pub fn step(&self) -> Option<Instant> {
        *self.0 .0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The step the loop is in once something changed: with `at_most`, after the next
    /// [`enter`](Self::enter) or [`leave`](Self::leave) or when that much time has passed; without
    /// it, once the loop is in a step (while idle this sleeps without a timer).
    pub fn wait(&self, at_most: Option<Duration>) -> Option<Instant> {
        let (m, cv) = &*self.0;
        let g = m.lock().unwrap_or_else(|e| e.into_inner());
        let g = match at_most {
            Some(t) => cv.wait_timeout(g, t).unwrap_or_else(|e| e.into_inner()).0,
            None => cv
                .wait_while(g, |s| s.is_none())
                .unwrap_or_else(|e| e.into_inner()),
        };
        *g
    }
}

/// What the watchdog thread tells systemd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// A step started while disarmed: `WATCHDOG_USEC=` the unit's timeout, which restarts the
    /// timer.
    Arm,
    /// Armed, in a step within its deadline: `WATCHDOG=1`.
    Ping,
    /// Armed, in a step past its deadline: nothing, so that systemd restarts gpuctld.
    Withhold,
    /// The loop went idle: `WATCHDOG_USEC=infinity`.
    Disarm,
    /// Idle and already disarmed: nothing.
    Rest,
}

/// The watchdog's decision, from whether systemd's watchdog is armed and the loop's step
/// (`None`: idle) at `now`.
pub fn beat(armed: bool, step: Option<Instant>, now: Instant) -> Beat {
    match (armed, step) {
        (true, None) => Beat::Disarm,
        (false, None) => Beat::Rest,
        (_, Some(deadline)) if now >= deadline => Beat::Withhold,
        (false, Some(_)) => Beat::Arm,
        (true, Some(_)) => Beat::Ping,
    }
}

/// The watchdog thread's loop, for a unit whose watchdog timeout is `timeout`: armed (systemd
/// arms it when gpuctld starts), it pings every `timeout / 2` and on every change of step; idle
/// and disarmed, it sleeps until a step starts. `tell` carries each [`Beat`] out (to sd_notify,
/// or to a test). Never returns.
pub fn run(progress: &Progress, timeout: Duration, mut tell: impl FnMut(Beat)) -> ! {
    let period = timeout / 2;
    let mut armed = true;
    let mut step = progress.step();
    loop {
        let b = beat(armed, step, Instant::now());
        tell(b);
        match b {
            Beat::Arm => armed = true,
            Beat::Disarm => armed = false,
            Beat::Ping | Beat::Withhold | Beat::Rest => {}
        }
        step = progress.wait(armed.then_some(period));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn the_watchdog_attests_progress_not_a_ticking_task() {
        let p = Progress::default();
        let now = Instant::now();
        assert!(p.healthy(now), "idle is healthy");
        p.enter(Duration::from_secs(60));
        assert!(p.healthy(now + Duration::from_secs(59)));
        assert!(!p.healthy(now + Duration::from_secs(61)), "a wedged step");
        p.leave();
        assert!(p.healthy(now + Duration::from_secs(3600)));
    }

    #[test]
    fn armed_only_while_a_step_runs_and_withheld_past_its_deadline() {
        let now = Instant::now();
        let later = Some(now + Duration::from_secs(5));
        let past = Some(now - Duration::from_secs(1));
        assert_eq!(beat(true, None, now), Beat::Disarm);
        assert_eq!(beat(false, None, now), Beat::Rest);
        assert_eq!(beat(false, later, now), Beat::Arm);
        assert_eq!(beat(true, later, now), Beat::Ping);
        assert_eq!(beat(true, past, now), Beat::Withhold);
        // A wedged step never re-arms (arming restarts systemd's timer).
        assert_eq!(beat(false, past, now), Beat::Withhold);
    }

    #[test]
    fn the_thread_is_silent_while_idle_and_pings_while_a_step_runs() {
        let p = Progress::default();
        let (tx, rx) = mpsc::channel();
        let q = p.clone();
        std::thread::spawn(move || {
            run(&q, Duration::from_millis(40), |b| {
                let _ = tx.send(b);
            })
        });
        // systemd armed the watchdog at start; the idle loop disarms it, then nothing for many
        // periods (a periodic ping would send Ping or Rest here).
        assert_eq!(rx.recv().unwrap(), Beat::Disarm);
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
        p.enter(Duration::from_secs(60));
        assert_eq!(rx.recv().unwrap(), Beat::Arm);
        for _ in 0..3 {
            assert_eq!(rx.recv().unwrap(), Beat::Ping, "pings while the step runs");
        }
        p.leave();
        // A ping already on its way may come first.
        let next = std::iter::from_fn(|| rx.recv().ok()).find(|b| *b != Beat::Ping);
        assert_eq!(next, Some(Beat::Disarm));
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    }
}
