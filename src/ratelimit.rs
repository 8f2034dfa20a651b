//! Bounded work per caller: a token bucket per uid for gpuctld's bus methods, and a limiter for
//! log lines that callers can provoke (refusals).
//!
//! Hand-written rather than a crate (`governor`): two small structs with an injectable clock,
//! which the tests drive without sleeping, and no extra dependency tree in a root daemon.
//!
//! Defaults ([`Limits::light`], [`Limits::heavy`]) and why:
//! - light calls (`Status`, `Join`, `Env`, `Teams`): a burst of 20, then 5 per second per uid. A
//!   person's `gpuctl shell`/`run` makes one call; a job script that starts 20 `gpuctl run`s at
//!   once passes in one burst, and 300 a minute is more than any launcher needs. Each call costs
//!   NSS lookups and systemd calls, so a flood is cut to a steady 5/s.
//! - heavy calls (`Plan`): a burst of 3, then one per 20 s per uid. A plan observes the whole
//!   host (NVML, systemd, files) and waits in the reconcile queue; `gpuctl plan` run by hand is
//!   far below that.
//! - reads served from caches (`Usage`, `Idle`, `Metrics`): a burst of 50, then 25 per second per
//!   uid. One usage collection serves every reader for the collection interval, and a `Metrics`
//!   document is kept for that interval too, so a call costs a copy of a string; the limit only
//!   caps a single uid's flood. It must not be the light calls' 5/s: the exporter is one uid for
//!   every Prometheus server scraping the host, and vm-tests 89 (1,000 scrapes back to back,
//!   ~20/s under TCG) got `503` from the 21st scrape on with it.
//! - root (uid 0) is never limited: it owns the daemon and can stop it anyway.
//! - at most [`MAX_TRACKED`] uids are tracked; when full, buckets that are full again (idle
//!   callers) are dropped first, then the least recently seen.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Most uids with a bucket at once.
pub const MAX_TRACKED: usize = 4096;

/// A bucket's size and refill rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Calls allowed at once.
    pub burst: f64,
    /// Tokens added per second.
    pub per_sec: f64,
}

impl Limits {
    const fn of(burst: f64, per_sec: f64) -> Self {
        Limits { burst, per_sec }
    }

    /// `Status`, `Join`, `Env`, `Teams`: 20 at once, 5/s.
    pub const fn light() -> Self {
        Limits::of(20.0, 5.0)
    }

    /// `Usage`, `Idle`, `Metrics`: 50 at once, 25/s (answered from caches).
    pub const fn reads() -> Self {
        Limits::of(50.0, 25.0)
    }

    /// `Plan`: 3 at once, one per 20 s.
    pub const fn heavy() -> Self {
        Limits::of(3.0, 0.05)
    }

    /// `BURST/PER_SEC`, as [`ENV_READ_LIMIT`] takes it: a burst of at least one call and a
    /// positive rate.
    pub fn parse(s: &str) -> Result<Self, BadLimits> {
        let bad = || BadLimits(s.to_string());
        let (b, r) = s.split_once('/').ok_or_else(bad)?;
        let burst: f64 = b.trim().parse().map_err(|_| bad())?;
        let per_sec: f64 = r.trim().parse().map_err(|_| bad())?;
        let fine = burst.is_finite() && per_sec.is_finite() && burst >= 1.0 && per_sec > 0.0;
        fine.then_some(Limits::of(burst, per_sec)).ok_or_else(bad)
    }

    /// The read budget: `$GPUCTL_READ_LIMIT` when set, else [`Limits::reads`].
    pub fn reads_from_env() -> Result<Self, BadLimits> {
        match std::env::var(ENV_READ_LIMIT) {
            Ok(v) => Limits::parse(&v),
            Err(_) => Ok(Limits::reads()),
        }
    }
}

/// Environment variable: the read calls' budget per uid, `BURST/PER_SEC` (default `50/25`,
/// [`Limits::reads`]). A host scraped by more Prometheus servers than one exporter's share of it
/// serves may raise it; the VM test of the limit lowers it, so that a slow guest's flood still
/// goes past it.
pub const ENV_READ_LIMIT: &str = "GPUCTL_READ_LIMIT";

/// A read budget that is not `BURST/PER_SEC` with a burst of at least 1 and a positive rate.
#[derive(Debug, thiserror::Error)]
#[error("{ENV_READ_LIMIT}={0:?}: not BURST/PER_SEC (a burst of at least 1, a positive rate, e.g. 50/25)")]
pub struct BadLimits(String);

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Per-uid token buckets of one class of calls.
#[derive(Debug)]
pub struct RateLimiter {
    limits: Limits,
    buckets: HashMap<u32, Bucket>,
}

impl RateLimiter {
    /// A limiter with `limits` for every uid but 0.
    pub fn new(limits: Limits) -> Self {
        RateLimiter {
            limits,
            buckets: HashMap::new(),
        }
    }

    /// Take one token for `uid` at `now`; `Err(wait)` says how long until one is available.
    pub fn check(&mut self, uid: u32, now: Instant) -> Result<(), Duration> {
        if uid == 0 {
            return Ok(());
        }
        let l = self.limits;
        if !self.buckets.contains_key(&uid) && self.buckets.len() >= MAX_TRACKED {
            self.evict(now);
        }
        let b = self.buckets.entry(uid).or_insert(Bucket {
            tokens: l.burst,
            at: now,
        });
        let dt = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + dt * l.per_sec).min(l.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / l.per_sec))
        }
    }

    /// Uids tracked now.
    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }

    fn evict(&mut self, now: Instant) {
        let l = self.limits;
        self.buckets.retain(|_, b| {
            let dt = now.saturating_duration_since(b.at).as_secs_f64();
            b.tokens + dt * l.per_sec < l.burst
        });
        if self.buckets.len() >= MAX_TRACKED {
            if let Some(oldest) = self
                .buckets
                .iter()
                .min_by_key(|(_, b)| b.at)
                .map(|(u, _)| *u)
            {
                self.buckets.remove(&oldest);
            }
        }
    }
}

/// At most `per_window` log lines per `window`; the lines held back are counted and reported
/// with the next line let through, so a flood of refusals costs the journal a few lines a minute.
#[derive(Debug)]
pub struct LogLimiter {
    per_window: u32,
    window: Duration,
    start: Option<Instant>,
    used: u32,
    suppressed: u64,
}

impl LogLimiter {
    /// 10 lines a minute: enough to see who is refused and why.
    pub fn new() -> Self {
        Self::with(10, Duration::from_secs(60))
    }

    /// `per_window` lines per `window`.
    pub fn with(per_window: u32, window: Duration) -> Self {
        LogLimiter {
            per_window,
            window,
            start: None,
            used: 0,
            suppressed: 0,
        }
    }

    /// `Some(n)` when a line may be written now, `n` being how many were held back before it;
    /// `None` when this one is held back.
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        match self.start {
            Some(s) if now.saturating_duration_since(s) < self.window => {}
            _ => {
                self.start = Some(now);
                self.used = 0;
            }
        }
        if self.used < self.per_window {
            self.used += 1;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

impl Default for LogLimiter {
    fn default() -> Self {
        Self::new()
    }
}

/// The daemon's one limiter for refusal lines (refused joins, rate-limited callers): a static so
/// every bus method shares it without threading it through their signatures.
static REFUSALS: std::sync::LazyLock<std::sync::Mutex<LogLimiter>> =
    std::sync::LazyLock::new(|| std::sync::Mutex::new(LogLimiter::new()));

/// Whether a refusal may be logged now: `Some(n)` with the lines held back before it.
pub fn refusal_log() -> Option<u64> {
    REFUSALS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .admit(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_burst_and_rate() {
        assert_eq!(Limits::parse("50/25").unwrap(), Limits::reads());
        assert_eq!(Limits::parse(" 5 / 0.5 ").unwrap(), Limits::of(5.0, 0.5));
        for bad in [
            "", "50", "50/", "/25", "0/25", "50/0", "50/-1", "a/b", "inf/1", "50/25/1",
        ] {
            let e = Limits::parse(bad).unwrap_err().to_string();
            assert!(
                e.starts_with("GPUCTL_READ_LIMIT=") && e.contains("BURST/PER_SEC"),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn a_burst_then_the_refill_rate() {
        let mut r = RateLimiter::new(Limits::light());
        let t0 = Instant::now();
        assert!((0..20).all(|_| r.check(1000, t0).is_ok()));
        let wait = r.check(1000, t0).unwrap_err();
        assert!(
            wait > Duration::from_millis(150) && wait <= Duration::from_millis(200),
            "{wait:?}"
        );
        // Another uid has its own bucket; root has none.
        assert!(r.check(1001, t0).is_ok());
        assert!((0..1000).all(|_| r.check(0, t0).is_ok()));
        // One second later: five more.
        let t1 = t0 + Duration::from_secs(1);
        assert!((0..5).all(|_| r.check(1000, t1).is_ok()));
        assert!(r.check(1000, t1).is_err());
        // A minute of quiet refills to the burst, not beyond.
        let t2 = t1 + Duration::from_secs(60);
        assert!((0..20).all(|_| r.check(1000, t2).is_ok()));
        assert!(r.check(1000, t2).is_err());
    }

    /// A scraper at 20 calls a second (the exporter under vm-tests 89's benchmark) is served
    /// from the reads budget for as long as it keeps that pace, and the light budget would
    /// refuse it within two seconds; a flood well above 25/s is still cut.
    #[test]
    fn reads_serve_a_steady_scraper_and_cut_a_flood() {
        let pace = |limits: Limits, per_sec: u32, secs: u32| {
            let mut r = RateLimiter::new(limits);
            let t0 = Instant::now();
            (0..per_sec * secs)
                .filter(|i| {
                    let t = t0 + Duration::from_secs_f64(f64::from(*i) / f64::from(per_sec));
                    r.check(1000, t).is_err()
                })
                .count()
        };
        assert_eq!(pace(Limits::reads(), 20, 60), 0);
        assert!(pace(Limits::light(), 20, 2) > 0);
        assert!(pace(Limits::reads(), 200, 2) > 300);
    }

    #[test]
    fn heavy_calls_refill_slowly() {
        let mut r = RateLimiter::new(Limits::heavy());
        let t0 = Instant::now();
        assert!((0..3).all(|_| r.check(7, t0).is_ok()));
        assert!(r.check(7, t0 + Duration::from_secs(19)).is_err());
        assert!(r.check(7, t0 + Duration::from_secs(41)).is_ok());
    }

    #[test]
    fn tracked_uids_are_bounded() {
        let mut r = RateLimiter::new(Limits::light());
        let t0 = Instant::now();
        for uid in 1..=(MAX_TRACKED as u32 * 3) {
            let _ = r.check(uid, t0);
            let _ = r.check(uid, t0);
        }
        assert!(r.tracked() <= MAX_TRACKED, "{}", r.tracked());
    }

    #[test]
    fn log_lines_are_limited_and_the_rest_counted() {
        let mut l = LogLimiter::with(3, Duration::from_secs(60));
        let t0 = Instant::now();
        assert!((0..3).all(|_| l.admit(t0) == Some(0)));
        assert!((0..100).all(|_| l.admit(t0 + Duration::from_secs(1)).is_none()));
        assert_eq!(l.admit(t0 + Duration::from_secs(61)), Some(100));
        assert_eq!(l.admit(t0 + Duration::from_secs(62)), Some(0));
    }
}
