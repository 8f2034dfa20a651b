//! The ledger: GPU device-time held and used, per team, user and device, in UTC-day buckets
//! (docs/ledger.md).
//!
//! Pure: [`Ledger::observe`] takes a [`LedgerSample`] (built from a usage collection by
//! [`from_usage`]) with its time and credits the span that ends at it; [`store`] keeps the
//! buckets under `/var/lib/gpuctl/ledger/`. No clock and no I/O here.
//!
//! - **held**: a holder (team, user, unit) has a process on the device;
//! - **active**: held while the device's activity is at or above the team's idle threshold
//!   (`[teams.NAME.idle] below`, else [`DEFAULT_ACTIVE_PERCENT`]);
//! - **unknown**: held while the device reports no activity (a MIG device before Hopper): kept
//!   apart, never idle nor active; idle = held − active − unknown;
//! - **memory**: GPU-memory byte-seconds its processes held;
//! - **reclaimed**: the held time of a stretch that an idle stop ended (with the count of stops);
//! - **borrowed**: held on a device another team lent (in the loans slice);
//! - **lent**: a team's device-time held by borrowers, on a line of the owning team with no
//!   user (the borrower's own line counts it as held and borrowed).
//!
//! Crediting: a sample credits the span since the previous one, at most one nominal interval.
//! A span longer than [`GAP_FACTOR`] intervals (gpuctld stopped, NVML hung, the clock jumped
//! forward) or not forward in time (the same collection served again, the clock went back) is
//! not observed: nothing is credited, neither held nor idle, and the next span starts there.
//! The span is credited to the UTC day of its end and to the holders present at its end (GPM
//! activity is measured over the span that ends at the collection).

use crate::policy::IdleRule;
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub mod store;

/// ms in a UTC day.
pub const DAY_MS: u64 = 86_400_000;
/// Activity threshold (percent) of teams with no idle rule: the idle rule's own default.
pub const DEFAULT_ACTIVE_PERCENT: f64 = IdleRule::DEFAULT_BELOW;
/// A span longer than this many nominal intervals is a gap.
pub const GAP_FACTOR: u64 = 2;
/// `kind` of a whole GPU (a MIG device's kind is its profile, e.g. `3g.40gb`).
pub const WHOLE_GPU: &str = "gpu";

/// What a bucket line is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Key {
    /// Team of the process's slice; empty outside every team slice.
    pub team: String,
    /// User name (NSS), else the uid as text, else `?`.
    pub user: String,
    /// GPU index as text, or the MIG UUID.
    pub device: String,
    /// [`WHOLE_GPU`] or the MIG profile.
    pub kind: String,
}

/// Accumulated figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Device-ms held.
    pub held_ms: u64,
    /// Of which active.
    pub active_ms: u64,
    /// Of which with activity unknown.
    pub unknown_ms: u64,
    /// GPU-memory byte-seconds.
    pub memory_byte_s: f64,
    /// Held ms of stretches ended by an idle stop.
    pub reclaimed_ms: u64,
    /// Idle stops.
    pub stops: u64,
    /// Of held, on a device borrowed from another team.
    #[serde(default)]
    pub borrowed_ms: u64,
    /// This team's device-time held by borrowers.
    #[serde(default)]
    pub lent_ms: u64,
}

impl Figures {
    /// Add `o` to these.
    pub fn add(&mut self, o: &Figures) {
        self.held_ms += o.held_ms;
        self.active_ms += o.active_ms;
        self.unknown_ms += o.unknown_ms;
        self.memory_byte_s += o.memory_byte_s;
        self.reclaimed_ms += o.reclaimed_ms;
        self.stops += o.stops;
        self.borrowed_ms += o.borrowed_ms;
        self.lent_ms += o.lent_ms;
    }

    /// Held with activity known but below the threshold.
    pub fn idle_ms(&self) -> u64 {
        self.held_ms
            .saturating_sub(self.active_ms + self.unknown_ms)
    }

    /// active / (held − unknown); `None` where no held time has known activity.
    pub fn utilisation(&self) -> Option<f64> {
        let known = self.held_ms.saturating_sub(self.unknown_ms);
        (known > 0).then(|| self.active_ms as f64 / known as f64)
    }
}

/// One holder of one device in one sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    /// Team, user, device, kind.
    pub key: Key,
    /// The unit directly in the team's slice (or the process's unit): what an idle stop ends.
    pub unit: String,
    /// GPU memory held, bytes (`None`: the driver does not say).
    pub memory: Option<u64>,
    /// The device's activity, percent; `None`: not reported.
    pub activity: Option<f64>,
    /// The team that lent the device, for a borrower.
    pub borrowed_from: Option<String>,
}

/// What one usage collection says about every holder.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LedgerSample {
    /// Unix ms of the collection.
    pub at_ms: u64,
    /// Holders, one per (key, unit).
    pub holders: Vec<Holder>,
}

/// The holders of every device in `usage`; `None` when NVML could not be read (a gap, not an
/// empty host).
pub fn from_usage(usage: &Usage) -> Option<LedgerSample> {
    if usage.nvml_unavailable.is_some() {
        return None;
    }
    let mut by: BTreeMap<(Key, String), Holder> = BTreeMap::new();
    for (g, m, p) in usage.processes() {
        // The same activity rule as the idle sampler: GPM, else utilisation; none for MIG
        // without GPM and none for a whole GPU in MIG mode.
        let (device, kind, activity) = match m {
            Some(m) => (m.uuid.clone(), m.profile.clone(), m.activity),
            None => (
                g.index.to_string(),
                WHOLE_GPU.to_string(),
                g.activity
                    .or(g.utilization_gpu.map(f64::from))
                    .filter(|_| !g.mig),
            ),
        };
        let key = Key {
            team: p.team.clone().unwrap_or_default(),
            user: p
                .user
                .clone()
                .or_else(|| p.uid.map(|u| u.to_string()))
                .unwrap_or_else(|| "?".into()),
            device,
            kind,
        };
        let unit = p
            .team_unit
            .clone()
            .or_else(|| p.unit.clone())
            .unwrap_or_else(|| format!("pid {}", p.pid));
        let h = by.entry((key.clone(), unit.clone())).or_insert(Holder {
            key,
            unit,
            memory: None,
            activity,
            borrowed_from: p.borrowed_from.clone(),
        });
        if let Some(b) = p.used_memory {
            h.memory = Some(h.memory.unwrap_or(0) + b);
        }
    }
    Some(LedgerSample {
        at_ms: usage.collected_at_ms,
        holders: by.into_values().collect(),
    })
}

/// The UTC day (days since 1970-01-01) of unix ms `at_ms`.
pub fn day_of(at_ms: u64) -> u64 {
    at_ms / DAY_MS
}

/// `YYYY-MM-DD` of a day number (proleptic Gregorian, H. Hinnant's `civil_from_days`).
pub fn day_name(day: u64) -> String {
    let z = day as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The day number of `YYYY-MM-DD` (1970 or later); `None` for anything else.
pub fn parse_day(s: &str) -> Option<u64> {
    let mut it = s.splitn(3, '-');
    let y: i64 = it.next()?.parse().ok()?;
    let m: i64 = it.next()?.parse().ok()?;
    let d: i64 = it.next()?.parse().ok()?;
    if s.len() != 10 || !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || d < 1 {
        return None;
    }
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let len = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if d > len[(m - 1) as usize] {
        return None;
    }
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    u64::try_from(era * 146_097 + doe - 719_468).ok()
}

/// One UTC day's buckets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Day {
    /// Days since 1970-01-01.
    pub day: u64,
    /// Figures per key.
    pub figures: BTreeMap<Key, Figures>,
}

/// The accumulating ledger: the current day's buckets, the time of the last sample, and the
/// open holding stretches (for reclaimed time).
#[derive(Debug, Clone)]
pub struct Ledger {
    nominal_ms: u64,
    last_at_ms: Option<u64>,
    today: Day,
    /// (team, unit, device) → the stretch's key and held ms so far.
    open: BTreeMap<(String, String, String), (Key, u64)>,
}

/// What one sample credited, per key (what the Prometheus counters add).
pub type Credit = Vec<(Key, Figures)>;

impl Ledger {
    /// A ledger whose samples are `nominal_ms` apart, resuming from `today` (the latest day
    /// stored) and the last sample time stored with it, so that a restart mid-interval credits
    /// the span since that sample once.
    pub fn new(nominal_ms: u64, today: Option<Day>, last_at_ms: Option<u64>) -> Ledger {
        Ledger {
            nominal_ms: nominal_ms.max(1),
            last_at_ms,
            today: today.unwrap_or_default(),
            open: BTreeMap::new(),
        }
    }

    /// Unix ms of the last sample taken in.
    pub fn last_at_ms(&self) -> Option<u64> {
        self.last_at_ms
    }

    /// The current day's buckets.
    pub fn today(&self) -> &Day {
        &self.today
    }

    /// ms credited for a span ending at `at_ms` (0 for a gap or a span not forward in time).
    fn credit_ms(&self, at_ms: u64) -> u64 {
        match self.last_at_ms {
            Some(l) if at_ms > l && at_ms - l <= GAP_FACTOR * self.nominal_ms => {
                (at_ms - l).min(self.nominal_ms)
            }
            _ => 0,
        }
    }

    /// Move to the day of `at_ms`; returns the day left behind when it changed (to be stored
    /// for good by the caller).
    fn roll(&mut self, at_ms: u64) -> Option<Day> {
        let d = day_of(at_ms);
        if d == self.today.day {
            return None;
        }
        let old = std::mem::replace(
            &mut self.today,
            Day {
                day: d,
                figures: BTreeMap::new(),
            },
        );
        (!old.figures.is_empty()).then_some(old)
    }

    /// Take in one sample; `below` holds the activity threshold (percent) of each team with
    /// an idle rule. Returns what was credited and the finished day when the sample crossed
    /// midnight (UTC); the same collection seen again changes nothing.
    pub fn observe(
        &mut self,
        s: &LedgerSample,
        below: &BTreeMap<String, f64>,
    ) -> (Credit, Option<Day>) {
        if self.last_at_ms == Some(s.at_ms) {
            return (Vec::new(), None);
        }
        let dt = self.credit_ms(s.at_ms);
        self.last_at_ms = Some(s.at_ms);
        let finished = self.roll(s.at_ms);
        let mut open = BTreeMap::new();
        let mut credit: BTreeMap<Key, Figures> = BTreeMap::new();
        for h in &s.holders {
            let id = (h.key.team.clone(), h.unit.clone(), h.key.device.clone());
            let held = self.open.get(&id).map_or(0, |(_, ms)| *ms) + dt;
            open.insert(id, (h.key.clone(), held));
            if dt == 0 {
                continue;
            }
            let threshold = below
                .get(&h.key.team)
                .copied()
                .unwrap_or(DEFAULT_ACTIVE_PERCENT);
            let c = credit.entry(h.key.clone()).or_default();
            // One device held by several units of one user counts once per span: device time.
            let first = c.held_ms == 0;
            if first {
                c.held_ms = dt;
                match h.activity {
                    None => c.unknown_ms = dt,
                    Some(a) if a >= threshold => c.active_ms = dt,
                    Some(_) => {}
                }
                if h.borrowed_from.is_some() {
                    c.borrowed_ms = dt;
                }
            }
            c.memory_byte_s += h.memory.unwrap_or(0) as f64 * dt as f64 / 1000.0;
            if let Some(owner) = &h.borrowed_from {
                let lent = Key {
                    team: owner.clone(),
                    user: String::new(),
                    ..h.key.clone()
                };
                // Once per device and span, however many borrowers hold it.
                credit.entry(lent).or_default().lent_ms = dt;
            }
        }
        self.open = open;
        for (k, c) in &credit {
            self.today.figures.entry(k.clone()).or_default().add(c);
        }
        (credit.into_iter().collect(), finished)
    }

    /// An idle stop of `unit` (team `team`) was sent at `at_ms`: its open stretches count as
    /// reclaimed (their held time so far, one stop each) in the day of `at_ms`.
    pub fn reclaimed(&mut self, team: &str, unit: &str, at_ms: u64) -> (Credit, Option<Day>) {
        let finished = self.roll(at_ms);
        let ids: Vec<_> = self
            .open
            .keys()
            .filter(|(t, u, _)| t == team && u == unit)
            .cloned()
            .collect();
        let mut credit = Vec::new();
        for id in ids {
            if let Some((key, held)) = self.open.remove(&id) {
                let c = Figures {
                    reclaimed_ms: held,
                    stops: 1,
                    ..Figures::default()
                };
                self.today.figures.entry(key.clone()).or_default().add(&c);
                credit.push((key, c));
            }
        }
        (credit, finished)
    }
}

/// How a report groups its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum By {
    /// Per team.
    Team,
    /// Per (team, user).
    User,
    /// Per (device, kind).
    Device,
}

impl std::str::FromStr for By {
    type Err = String;
    fn from_str(s: &str) -> Result<By, String> {
        match s {
            "team" => Ok(By::Team),
            "user" => Ok(By::User),
            "device" => Ok(By::Device),
            _ => Err(format!(
                "unknown grouping {:?} (one of team, user, device)",
                s.chars().take(32).collect::<String>()
            )),
        }
    }
}

/// The group a key falls in: (team, user, device, kind) with the parts `by` drops emptied.
pub fn group(k: &Key, by: By) -> Key {
    let mut g = k.clone();
    match by {
        By::Team => {
            g.user.clear();
            g.device.clear();
            g.kind.clear();
        }
        By::User => {
            g.device.clear();
            g.kind.clear();
        }
        By::Device => {
            g.team.clear();
            g.user.clear();
        }
    }
    g
}

/// Sum `days` (only keys `visible` admits) into groups.
pub fn summarise<'a>(
    days: impl IntoIterator<Item = &'a Day>,
    by: By,
    visible: impl Fn(&Key) -> bool,
) -> BTreeMap<Key, Figures> {
    let mut out: BTreeMap<Key, Figures> = BTreeMap::new();
    for d in days {
        for (k, f) in d.figures.iter().filter(|(k, _)| visible(k)) {
            out.entry(group(k, by)).or_default().add(f);
        }
    }
    out
}

#[cfg(test)]
mod tests;
