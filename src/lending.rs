//! Elastic shares: who gets which device now, from one snapshot (docs/policy.md, "Lending idle
//! devices").
//!
//! [`decide`] is pure, like `plan`: the bus handler gathers a [`Snapshot`] (every share device
//! with its owners and idle time, the live leases, the reclaims in flight, the waiting requests,
//! recent usage, the lend rules and the local time) and carries out the [`Decision`]s: place a
//! request (on its own team's devices, or on one team's lent devices), take a loan back (notice
//! and SIGTERM now), stop a borrower whose grace has run out, or tell a request why it waits.
//!
//! The rules:
//! - a request is served from its own team's share first ([`crate::placement::choose`] over the
//!   devices free for it); it borrows only when that share has no free device that fits, only
//!   with `--borrow` (or its team's `borrow = true`), and only devices idle (no lease, no
//!   process) for the lender's `after`, inside its `when` windows, never MPS-shared or shared
//!   between teams, one borrowing job per device: never two teams on one device;
//! - a request for a MIG profile (`--profile`) is served by its own team's devices of that
//!   profile alone: it never borrows, and takes back only loans of such devices;
//! - the owner first: while a request of a team waits, none of its devices is lent, and an owner
//!   request that finds none of its own devices free takes back loans, the most recently started
//!   first, as many as it needs; of a reclaim's devices, as many as the request it was made for
//!   can use are kept for it, and that request is served before the fair order. A borrower is
//!   stopped ([`Decision::Stop`]) only once its notice is `grace` old;
//! - waiting requests are served in fair order ([`fair_order`]: least recent usage first, ties
//!   by arrival); a request that cannot be served now does not hold back a later one that a
//!   free device can serve, but a request passed over [`MAX_PASSED_OVER`] times goes first and
//!   keeps the free devices it can use for itself, so none waits forever.
//!
//! Times are milliseconds since the epoch, so a stop is never a rounding early.

use crate::placement::{self, Candidate, Gpus, Request};
use crate::policy::{LendRule, Team, Window};
use crate::settings::value::human_duration;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;
use std::time::Duration;

/// A waiting request's place in the queue (arrival order).
pub type Ticket = u64;

/// How many times a request may be passed over (a later request placed on a device it could
/// use) before it goes first and keeps the devices it can use free for itself.
pub const MAX_PASSED_OVER: u32 = 8;

/// A local time of the week, for the lend windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalTime {
    /// 0 = Monday … 6 = Sunday.
    pub weekday: u8,
    /// Minutes since local midnight, 0..1440.
    pub minute_of_day: u16,
}

impl LocalTime {
    /// The local time at `epoch_secs` for a zone `utc_offset_secs` east of UTC.
    pub fn at(epoch_secs: i64, utc_offset_secs: i64) -> LocalTime {
        let t = epoch_secs + utc_offset_secs;
        let days = t.div_euclid(86_400);
        // 1970-01-01 was a Thursday.
        LocalTime {
            weekday: (days + 3).rem_euclid(7) as u8,
            minute_of_day: (t.rem_euclid(86_400) / 60) as u16,
        }
    }
}

/// Whether lending is allowed at `t` under `when` (no windows: always).
pub fn window_open(when: &[Window], t: LocalTime) -> bool {
    when.is_empty() || when.iter().any(|w| w.contains(t.weekday, t.minute_of_day))
}

/// What decide needs of a team's policy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TeamRules {
    /// `placement.jobs-per-device`.
    pub jobs_per_device: Option<u32>,
    /// `placement.gpus`: a request's devices unless it says.
    pub gpus: Option<Gpus>,
    /// `[teams.NAME.lend]`.
    pub lend: Option<LendRule>,
}

impl TeamRules {
    /// The rules of `team`.
    pub fn of(team: &Team) -> TeamRules {
        TeamRules {
            jobs_per_device: team.placement.jobs_per_device,
            gpus: team.placement.gpus,
            lend: team.lend.clone(),
        }
    }
}

/// A device of some team's share.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    /// UUID.
    pub id: String,
    /// The teams whose share holds it: one, or several for a `shared` GPU (never lent).
    pub owners: Vec<String>,
    /// A MIG device.
    pub mig: bool,
    /// Shared through MPS: never lent.
    pub mps: bool,
    /// Since when it has had no lease and no process; `None`: it has one now.
    pub idle_since_ms: Option<u64>,
    /// A process outside every lease holding memory on it, in words (`pid 4242 (python)
    /// holds 3.0 GiB`): the device is busy for everyone. Ignored on an MPS device, whose server
    /// is outside every lease.
    pub foreign: Option<String>,
    /// The GPU-instance profile of a MIG device (`3g.40gb`); `None` for a whole GPU.
    pub profile: Option<String>,
}

/// A live lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// The job's scope.
    pub unit: String,
    /// The job's team.
    pub team: String,
    /// The holder.
    pub uid: u32,
    /// Device UUIDs.
    pub devices: Vec<String>,
    /// When it was placed.
    pub since_ms: u64,
    /// The owner of the devices, when they are borrowed.
    pub borrowed_from: Option<String>,
}

/// Why a loan is taken back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// An owner's waiting request needs the device.
    Owner(Ticket),
    /// The lender's `when` window closed.
    WindowClosed,
    /// The lender no longer lends to the borrower (policy changed).
    NotLent,
}

/// A loan being taken back: its borrower has had its notice (and SIGTERM).
#[derive(Debug, Clone, PartialEq)]
pub struct Reclaiming {
    /// The borrower's scope.
    pub unit: String,
    /// The devices (kept for `why`'s request after the borrower is gone).
    pub devices: Vec<String>,
    /// Why.
    pub why: Why,
    /// When the borrower was told.
    pub noticed_ms: u64,
    /// Its grace from then.
    pub grace: Duration,
}

/// A waiting request.
#[derive(Debug, Clone, PartialEq)]
pub struct Waiter {
    /// Its ticket (arrival order).
    pub ticket: Ticket,
    /// Its team.
    pub team: String,
    /// Its user.
    pub uid: u32,
    /// `--gpus` (`None`: the team's default, else 1).
    pub gpus: Option<Gpus>,
    /// `--device`: a UUID or position in the team's share (never borrowed).
    pub device: Option<String>,
    /// May borrow (`--borrow`, or the team's `borrow = true`).
    pub borrow: bool,
    /// `--profile`: one of its own team's MIG devices of this profile (never borrowed).
    pub profile: Option<String>,
    /// How often it was passed over so far (the last [`Decision::Wait`]'s count).
    pub passed_over: u32,
}

/// Recent usage, decayed ([`decayed`]): device-seconds per user, and per team of borrowed
/// devices (the order of loans).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecentUsage {
    /// Per uid.
    pub users: HashMap<u32, f64>,
    /// Per team, borrowed device time.
    pub teams: HashMap<String, f64>,
}

/// Everything one decision looks at.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Now.
    pub now_ms: u64,
    /// The local time now (for the windows).
    pub local: Option<LocalTime>,
    /// Every team's rules.
    pub teams: BTreeMap<String, TeamRules>,
    /// Every share device; each team's devices in its share's order.
    pub devices: Vec<Device>,
    /// Live leases.
    pub leases: Vec<Held>,
    /// Loans being taken back (drop one once its lease is gone and its request is placed or
    /// gone).
    pub reclaims: Vec<Reclaiming>,
    /// Waiting requests, any order.
    pub waiting: Vec<Waiter>,
    /// Recent usage.
    pub usage: RecentUsage,
}

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Place the request on these devices (in the share's order).
    Place {
        /// The request.
        ticket: Ticket,
        /// Device UUIDs.
        devices: Vec<String>,
        /// The lender, for a borrowed placement (the lease is preemptible).
        borrowed_from: Option<String>,
    },
    /// Take a loan back: tell the borrower now (terminals, journal, signal, metric), send it
    /// SIGTERM, and record a [`Reclaiming`] noticed now with this grace.
    Reclaim {
        /// The borrower's scope.
        unit: String,
        /// The borrowing team.
        borrower: String,
        /// The owner.
        owner: String,
        /// The devices.
        devices: Vec<String>,
        /// Why.
        why: Why,
        /// Its grace.
        grace: Duration,
    },
    /// The borrower's grace is over: stop its scope (repeated until its lease is gone).
    Stop {
        /// The borrower's scope.
        unit: String,
    },
    /// The request waits.
    Wait {
        /// The request.
        ticket: Ticket,
        /// 1-based, among its team's waiting requests.
        position: usize,
        /// Its new passed-over count (to carry into the next snapshot).
        passed_over: u32,
        /// Why, in words.
        reason: String,
    },
}

/// One usage figure: device-seconds ending at `at_ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UsageSample {
    /// When (the end of the span; a ledger day's end).
    pub at_ms: u64,
    /// Device-seconds.
    pub device_seconds: f64,
}

/// Usage per key with each sample weighing half per `half_life` of age (a sample from the
/// future weighs in full).
pub fn decayed<K: Eq + Hash>(
    samples: impl IntoIterator<Item = (K, UsageSample)>,
    now_ms: u64,
    half_life: Duration,
) -> HashMap<K, f64> {
    let h = half_life.as_millis().max(1) as f64;
    let mut out: HashMap<K, f64> = HashMap::new();
    for (k, s) in samples {
        let age = now_ms.saturating_sub(s.at_ms) as f64;
        *out.entry(k).or_default() += s.device_seconds * (-age / h).exp2();
    }
    out
}

/// Recent usage from ledger days, each day weighing half per `half_life` of age at its end: per
/// user, the held device-time of every row whose user is one of `users` (a ledger row names its
/// user as NSS did, else by uid); per team, the device-time it borrowed (every row, whoever held
/// it), which orders the loans.
pub fn from_ledger(
    days: &[crate::ledger::Day],
    users: &HashMap<String, u32>,
    now_ms: u64,
    half_life: Duration,
) -> RecentUsage {
    let sample = |d: &crate::ledger::Day, ms: u64| UsageSample {
        at_ms: (d.day + 1).saturating_mul(86_400_000),
        device_seconds: ms as f64 / 1000.0,
    };
    let rows = || {
        days.iter()
            .flat_map(|d| d.figures.iter().map(move |r| (d, r)))
    };
    let user_samples =
        rows().filter_map(|(d, (k, f))| Some((*users.get(&k.user)?, sample(d, f.held_ms))));
    let team_samples = rows()
        .filter(|(_, (_, f))| f.borrowed_ms > 0)
        .map(|(d, (k, f))| (k.team.clone(), sample(d, f.borrowed_ms)));
    RecentUsage {
        users: decayed(user_samples, now_ms, half_life),
        teams: decayed(team_samples, now_ms, half_life),
    }
}

/// Whether `w` has been passed over enough to go first.
fn starving(w: &Waiter) -> bool {
    w.passed_over >= MAX_PASSED_OVER
}

/// The order requests are served in, as indices into `waiting`: the starving ones first, by
/// arrival; then by their user's recent usage, least first; ties by arrival.
pub fn fair_order(waiting: &[Waiter], usage: &RecentUsage) -> Vec<usize> {
    // The usage looked up once per request, not once per comparison.
    let mut keyed: Vec<(usize, f64)> = waiting
        .iter()
        .enumerate()
        .map(|(i, w)| (i, usage.users.get(&w.uid).copied().unwrap_or(0.0)))
        .collect();
    keyed.sort_by(|a, b| {
        let (x, y) = (&waiting[a.0], &waiting[b.0]);
        starving(y)
            .cmp(&starving(x))
            .then_with(|| {
                if starving(x) {
                    std::cmp::Ordering::Equal
                } else {
                    a.1.total_cmp(&b.1)
                }
            })
            .then(x.ticket.cmp(&y.ticket))
    });
    keyed.into_iter().map(|k| k.0).collect()
}

/// The order borrowers are served in: the starving first, by arrival; then by their team's
/// recent borrowed time, their user's usage, arrival.
fn loan_order(waiting: &[Waiter], cands: &[usize], usage: &RecentUsage) -> Vec<usize> {
    // (index, team's borrowed time, user's usage), looked up once per request.
    let mut keyed: Vec<(usize, f64, f64)> = cands
        .iter()
        .map(|&i| {
            let w = &waiting[i];
            let team = usage.teams.get(&w.team).copied().unwrap_or(0.0);
            (i, team, usage.users.get(&w.uid).copied().unwrap_or(0.0))
        })
        .collect();
    keyed.sort_by(|a, b| {
        let (x, y) = (&waiting[a.0], &waiting[b.0]);
        starving(y)
            .cmp(&starving(x))
            .then_with(|| {
                if starving(x) {
                    std::cmp::Ordering::Equal
                } else {
                    a.1.total_cmp(&b.1).then(a.2.total_cmp(&b.2))
                }
            })
            .then(x.ticket.cmp(&y.ticket))
    });
    keyed.into_iter().map(|k| k.0).collect()
}

/// `interns'`, `train's`.
fn possessive(team: &str) -> String {
    if team.ends_with('s') {
        format!("{team}'")
    } else {
        format!("{team}'s")
    }
}

/// `n` as `1st`, `2nd`, `3rd`, `11th`.
pub fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// Working state of one decision.
struct Cx<'a> {
    s: &'a Snapshot,
    /// Device index by id.
    index: HashMap<&'a str, usize>,
    /// Lease indices per device.
    on: Vec<Vec<usize>>,
    /// Jobs placed in this decision per device, with their team.
    added: Vec<Vec<&'a str>>,
    /// Lent in this decision.
    lent_now: Vec<bool>,
    /// Kept for a request: by a reclaim, or by a starving request.
    reserved: Vec<Option<Ticket>>,
    /// Lease units being taken back (in flight or decided now).
    reclaiming: HashSet<&'a str>,
    /// Each team's share, device indices in order.
    shares: HashMap<&'a str, Vec<usize>>,
    /// [`Cx::own_ever`] per team and size.
    own_ever_memo: std::cell::RefCell<HashMap<(&'a str, Option<Gpus>), bool>>,
}

impl<'a> Cx<'a> {
    fn new(s: &'a Snapshot) -> Self {
        let index: HashMap<&str, usize> = s
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.id.as_str(), i))
            .collect();
        let mut on = vec![Vec::new(); s.devices.len()];
        for (li, l) in s.leases.iter().enumerate() {
            for d in &l.devices {
                if let Some(&i) = index.get(d.as_str()) {
                    on[i].push(li);
                }
            }
        }
        let mut shares: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, d) in s.devices.iter().enumerate() {
            for o in &d.owners {
                shares.entry(o.as_str()).or_default().push(i);
            }
        }
        Cx {
            s,
            index,
            on,
            added: vec![Vec::new(); s.devices.len()],
            lent_now: vec![false; s.devices.len()],
            reserved: vec![None; s.devices.len()],
            reclaiming: HashSet::new(),
            shares,
            own_ever_memo: Default::default(),
        }
    }

    fn share(&self, team: &str) -> &[usize] {
        self.shares.get(team).map_or(&[], Vec::as_slice)
    }

    /// The lease lent out on device `d`, if any.
    fn loan_on(&self, d: usize) -> Option<&'a Held> {
        self.on[d]
            .iter()
            .map(|&l| &self.s.leases[l])
            .find(|l| l.borrowed_from.is_some())
    }

    fn foreign(&self, d: usize) -> Option<&'a str> {
        let dev = &self.s.devices[d];
        dev.foreign.as_deref().filter(|_| !dev.mps)
    }

    /// Jobs of `team` on `d`, placed before or in this decision.
    fn held_by(&self, d: usize, team: &str) -> u32 {
        let before = self.on[d]
            .iter()
            .filter(|&&l| self.s.leases[l].team == team && self.s.leases[l].borrowed_from.is_none())
            .count();
        (before + self.added[d].iter().filter(|t| **t == team).count()) as u32
    }

    /// Whether `d` may take a job of its owner `w.team` now (capacity aside).
    fn open_to_owner(&self, d: usize, w: &Waiter) -> bool {
        self.foreign(d).is_none()
            && self.loan_on(d).is_none()
            && !self.lent_now[d]
            && self.reserved[d].is_none_or(|t| t == w.ticket)
    }

    fn rules(&self, team: &str) -> Option<&'a TeamRules> {
        self.s.teams.get(team)
    }

    fn jpd(&self, team: &str) -> Option<u32> {
        self.rules(team)
            .and_then(|r| r.jobs_per_device)
            .filter(|n| *n > 0)
    }

    /// How many devices `w` needs, and whether a device can be one of them.
    fn want(&self, w: &Waiter) -> Gpus {
        if w.profile.is_some() {
            // The team's default count does not apply: a profile is one MIG device.
            return Gpus::Count(1);
        }
        w.gpus
            .or(self.rules(&w.team).and_then(|r| r.gpus))
            .unwrap_or(Gpus::Count(1))
    }

    fn named(&self, w: &Waiter) -> Option<usize> {
        let asked = w.device.as_deref()?;
        let share = self.share(&w.team);
        let cands: Vec<Candidate> = share.iter().map(|&i| self.cand(i, 0)).collect();
        placement::find_device(&cands, asked).map(|i| share[i])
    }

    fn need(&self, w: &Waiter) -> usize {
        if w.device.is_some() {
            return 1;
        }
        match self.want(w) {
            Gpus::Count(n) => n as usize,
            Gpus::All => self
                .share(&w.team)
                .iter()
                .filter(|&&d| !self.s.devices[d].mig)
                .count()
                .max(1),
        }
    }

    /// Whether `w` is a request whose reason depends on its team, size and `--borrow` alone:
    /// no `--device`, nothing kept or taken back for its ticket (what else the reason reads
    /// is the team's).
    fn plain(&self, w: &Waiter) -> bool {
        w.device.is_none()
            && w.profile.is_none()
            && !self.reserved.contains(&Some(w.ticket))
            && !self
                .s
                .reclaims
                .iter()
                .any(|r| r.why == Why::Owner(w.ticket))
    }

    /// Whether `d` could be one of `w`'s devices (shape only).
    fn usable(&self, w: &Waiter, d: usize, named: Option<usize>) -> bool {
        self.usable_for(w, d, named, self.need(w))
    }

    /// `usable` with `w`'s need worked out already (loops over devices work it out once).
    fn usable_for(&self, w: &Waiter, d: usize, named: Option<usize>, need: usize) -> bool {
        if w.device.is_some() {
            return named == Some(d);
        }
        if let Some(p) = &w.profile {
            return self.s.devices[d].profile.as_ref() == Some(p);
        }
        need <= 1 || !self.s.devices[d].mig
    }

    fn cand(&self, d: usize, held: u32) -> Candidate {
        Candidate {
            id: self.s.devices[d].id.clone(),
            ..self.shape(d, held)
        }
    }

    /// `cand` without the id, for what looks at the kind alone (no allocation: the hot
    /// loops run once per waiting request and device).
    fn shape(&self, d: usize, held: u32) -> Candidate {
        let dev = &self.s.devices[d];
        Candidate {
            id: String::new(),
            mig: dev.mig,
            mps: dev.mps,
            held,
            memory_used: None,
            activity: None,
            outside: None,
            profile: None,
        }
    }

    /// Device `d` as the choice for `w` sees it: with its id where `w` names a device, with
    /// its profile where `w` asks for one, else its kind alone.
    fn for_request(&self, w: &Waiter, d: usize, held: u32) -> Candidate {
        match (&w.device, &w.profile) {
            (Some(_), _) => self.cand(d, held),
            (None, Some(_)) => Candidate {
                profile: self.s.devices[d].profile.clone(),
                ..self.shape(d, held)
            },
            (None, None) => self.shape(d, held),
        }
    }

    /// `w`'s devices among its own share's open ones, by the placement rules.
    fn fit_own(&self, w: &Waiter) -> Option<Vec<usize>> {
        // Most waiters find nothing: say so before building candidates.
        if self.free_own(w).len() < self.need(w) {
            return None;
        }
        let open: Vec<usize> = self
            .share(&w.team)
            .iter()
            .copied()
            .filter(|&d| self.open_to_owner(d, w))
            .collect();
        let named = self.named(w);
        if w.device.is_some() && !named.is_some_and(|n| open.contains(&n)) {
            return None;
        }
        let cands: Vec<Candidate> = open
            .iter()
            .map(|&d| self.for_request(w, d, self.held_by(d, &w.team)))
            .collect();
        let req = Request {
            gpus: w.gpus,
            device: named.map(|n| self.s.devices[n].id.clone()),
            profile: w.profile.clone(),
        };
        let rules = self.rules(&w.team);
        let picked =
            placement::choose(&cands, &req, rules.and_then(|r| r.gpus), self.jpd(&w.team)).ok()?;
        Some(picked.into_iter().map(|i| open[i]).collect())
    }

    /// Whether `w`'s own share could serve it with nothing else placed. The same for every
    /// request of a team and size without `--device`: worked out once per decision.
    fn own_ever(&self, w: &'a Waiter) -> bool {
        let key = (w.team.as_str(), w.gpus);
        let memo = w.device.is_none() && w.profile.is_none();
        if memo {
            if let Some(&ok) = self.own_ever_memo.borrow().get(&key) {
                return ok;
            }
        }
        let share = self.share(&w.team);
        let cands: Vec<Candidate> = share.iter().map(|&d| self.for_request(w, d, 0)).collect();
        let req = Request {
            gpus: w.gpus,
            device: w.device.clone(),
            profile: w.profile.clone(),
        };
        let gpus = self.rules(&w.team).and_then(|r| r.gpus);
        let ok = placement::choose(&cands, &req, gpus, None).is_ok();
        if memo {
            self.own_ever_memo.borrow_mut().insert(key, ok);
        }
        ok
    }

    /// `w`'s own devices that are open and have room, usable by it.
    fn free_own(&self, w: &Waiter) -> Vec<usize> {
        let named = self.named(w);
        let jpd = self.jpd(&w.team);
        let need = self.need(w);
        self.share(&w.team)
            .iter()
            .copied()
            .filter(|&d| self.usable_for(w, d, named, need) && self.open_to_owner(d, w))
            .filter(|&d| {
                let c = self.shape(d, self.held_by(d, &w.team));
                placement::capacity(jpd, &c).is_none_or(|cap| c.held < cap)
            })
            .collect()
    }

    /// Teams that may lend to `team` now, with their rules, by name.
    fn lenders(&self, team: &str) -> Vec<(&'a str, &'a LendRule)> {
        self.s
            .teams
            .iter()
            .filter_map(|(o, r)| Some((o.as_str(), r.lend.as_ref()?)))
            .filter(|(o, r)| r.lends_to(o, team))
            .collect()
    }

    fn window_open(&self, rule: &LendRule) -> bool {
        self.s.local.is_none_or(|t| window_open(&rule.when, t))
    }

    /// Whether `d` of `owner` could ever be lent (single owner, no MPS).
    fn lendable_kind(&self, d: usize, owner: &str) -> bool {
        let dev = &self.s.devices[d];
        !dev.mps && dev.owners.len() == 1 && dev.owners[0] == owner
    }

    /// How long `d` of `owner` has been idle, if it could be lent to request `t` but for the
    /// lender's `after` and window: no lease, no job placed this round, no foreign memory, not
    /// kept for another request.
    fn idle_for(&self, d: usize, owner: &str, t: Ticket) -> Option<u64> {
        let free = self.lendable_kind(d, owner)
            && self.on[d].is_empty()
            && self.added[d].is_empty()
            && self.foreign(d).is_none()
            && self.reserved[d].is_none_or(|r| r == t);
        let since = self.s.devices[d].idle_since_ms.filter(|_| free)?;
        Some(self.s.now_ms.saturating_sub(since))
    }

    /// Whether `d` of `owner` may be lent now under `rule`, for request `t`.
    fn lendable(&self, d: usize, owner: &str, rule: &LendRule, t: Ticket) -> bool {
        self.idle_for(d, owner, t)
            .is_some_and(|ms| ms >= rule.after.as_millis() as u64)
    }
}

/// Decide, for everything waiting and every loan, what happens now.
pub fn decide(s: &Snapshot) -> Vec<Decision> {
    let mut cx = Cx::new(s);
    let mut out = Vec::new();
    let waiting_tickets: HashMap<Ticket, &Waiter> =
        s.waiting.iter().map(|w| (w.ticket, w)).collect();
    let lease_of: HashMap<&str, &Held> = s.leases.iter().map(|l| (l.unit.as_str(), l)).collect();

    // Reclaims in flight: stop the borrowers whose grace is over; keep their devices for the
    // request they were taken back for. Those of no waiting request go to the owner's first
    // request that can use them.
    let mut unclaimed: Vec<(&str, Vec<usize>)> = Vec::new();
    for r in &s.reclaims {
        let lease = lease_of
            .get(r.unit.as_str())
            .filter(|l| l.borrowed_from.is_some());
        if let Some(l) = lease {
            cx.reclaiming.insert(&l.unit);
            let due = r.noticed_ms.saturating_add(r.grace.as_millis() as u64);
            if s.now_ms >= due {
                out.push(Decision::Stop {
                    unit: r.unit.clone(),
                });
            }
        }
        let devs: Vec<usize> = r
            .devices
            .iter()
            .filter_map(|d| cx.index.get(d.as_str()).copied())
            .collect();
        match r.why {
            Why::Owner(t) if waiting_tickets.contains_key(&t) => {
                // Only as many as the request can use: the rest of a larger loan is free for
                // the others.
                let w = waiting_tickets[&t];
                let named = cx.named(w);
                let usable: Vec<usize> = devs
                    .iter()
                    .copied()
                    .filter(|&d| cx.usable(w, d, named))
                    .take(cx.need(w))
                    .collect();
                for d in usable {
                    cx.reserved[d] = Some(t);
                }
            }
            _ if lease.is_some() => {
                let owner = lease.and_then(|l| l.borrowed_from.as_deref()).unwrap_or("");
                unclaimed.push((owner, devs));
            }
            _ => {}
        }
    }

    // Loans the policy no longer allows: taken back like an owner's.
    for l in &s.leases {
        let Some(owner) = l.borrowed_from.as_deref() else {
            continue;
        };
        if cx.reclaiming.contains(l.unit.as_str()) {
            continue;
        }
        let rule = cx.rules(owner).and_then(|r| r.lend.as_ref());
        let why = match rule {
            Some(r) if !r.lends_to(owner, &l.team) => Why::NotLent,
            None => Why::NotLent,
            Some(r) if !cx.window_open(r) => Why::WindowClosed,
            Some(_) => continue,
        };
        let grace = rule.map_or(LendRule::DEFAULT_GRACE, |r| r.grace);
        cx.reclaiming.insert(&l.unit);
        let devs = l
            .devices
            .iter()
            .filter_map(|d| cx.index.get(d.as_str()).copied())
            .collect();
        unclaimed.push((owner, devs));
        out.push(reclaim(l, owner, why, grace));
    }

    // Pass 1: every request on its own team's share, in fair order.
    // A request a reclaim is in flight for had its turn already: it goes first, so that the
    // devices kept for it that it does not take are free before the others are served.
    let mut order = fair_order(&s.waiting, &s.usage);
    order.sort_by_key(|&wi| {
        let t = s.waiting[wi].ticket;
        !s.reclaims.iter().any(|r| r.why == Why::Owner(t))
    });
    let mut placed = vec![false; s.waiting.len()];
    // The devices of each placement, for the passed-over counts.
    let mut placements: Vec<Vec<usize>> = Vec::new();
    for &wi in &order {
        let w = &s.waiting[wi];
        if let Some(devs) = cx.fit_own(w) {
            for &d in &devs {
                cx.added[d].push(&w.team);
            }
            out.push(place(&cx, w.ticket, &devs, None));
            placements.push(devs);
            // Placed: what was kept for it (a reclaim's device it did not need) is free again.
            for r in cx.reserved.iter_mut().filter(|r| **r == Some(w.ticket)) {
                *r = None;
            }
            placed[wi] = true;
            continue;
        }
        // A request its own share can never serve (it wants more than the share has) neither
        // keeps nor takes back own devices: it could only borrow.
        if !cx.own_ever(w) {
            continue;
        }
        let free = cx.free_own(w);
        let need = cx.need(w);
        if starving(w) {
            for &d in free.iter().take(need) {
                cx.reserved[d] = Some(w.ticket);
            }
        }
        // Take back loans of the team: first what is already coming back unclaimed, then the
        // most recently started loans, until the request's need is covered.
        let named = cx.named(w);
        let mut covered = free.len().min(need)
            + s.reclaims
                .iter()
                .filter(|r| r.why == Why::Owner(w.ticket))
                .map(|r| r.devices.len())
                .sum::<usize>();
        for (owner, devs) in unclaimed.iter_mut() {
            if covered >= need || *owner != w.team {
                continue;
            }
            if !devs.is_empty() && devs.iter().all(|&d| cx.usable(w, d, named)) {
                covered += devs.len();
                for &d in devs.iter() {
                    cx.reserved[d] = Some(w.ticket);
                }
                devs.clear();
            }
        }
        if covered < need {
            let mut loans: Vec<&Held> = s
                .leases
                .iter()
                .filter(|l| l.borrowed_from.as_deref() == Some(w.team.as_str()))
                .filter(|l| !cx.reclaiming.contains(l.unit.as_str()))
                .filter(|l| {
                    l.devices.iter().all(|d| {
                        cx.index
                            .get(d.as_str())
                            .is_some_and(|&i| cx.usable(w, i, named))
                    })
                })
                .collect();
            loans.sort_by(|a, b| b.since_ms.cmp(&a.since_ms).then(b.unit.cmp(&a.unit)));
            let grace = cx
                .rules(&w.team)
                .and_then(|r| r.lend.as_ref())
                .map_or(LendRule::DEFAULT_GRACE, |r| r.grace);
            for l in loans {
                if covered >= need {
                    break;
                }
                covered += l.devices.len();
                cx.reclaiming.insert(&l.unit);
                for d in &l.devices {
                    if let Some(&i) = cx.index.get(d.as_str()) {
                        cx.reserved[i] = Some(w.ticket);
                    }
                }
                out.push(reclaim(l, &w.team, Why::Owner(w.ticket), grace));
            }
        }
    }

    // Pass 2: the rest may borrow, in loan order, from teams none of whose requests wait.
    // Again while a round placed a team's last waiting request: its devices may now be lent.
    let mut still = still_waiting(s, &placed);
    loop {
        // A request a loan is being taken back for waits for it: borrowing elsewhere now
        // would have stopped that borrower for nothing.
        let borrowers: Vec<usize> = (0..s.waiting.len())
            .filter(|&i| !placed[i] && may_borrow(&cx, &s.waiting[i]))
            .filter(|&i| !cx.reserved.contains(&Some(s.waiting[i].ticket)))
            .filter(|&i| {
                let t = s.waiting[i].ticket;
                !s.reclaims.iter().any(|r| r.why == Why::Owner(t))
            })
            .collect();
        for wi in loan_order(&s.waiting, &borrowers, &s.usage) {
            let w = &s.waiting[wi];
            if let Some((owner, devs)) = borrow(&mut cx, w, &still) {
                out.push(place(&cx, w.ticket, &devs, Some(owner)));
                placements.push(devs);
                placed[wi] = true;
            }
        }
        let now = still_waiting(s, &placed);
        if now == still {
            break;
        }
        still = now;
    }

    // Waits, in pass-1 order, with their positions, passed-over counts and reasons.
    let mut position: HashMap<&str, usize> = HashMap::new();
    let mut lent_to: HashMap<&str, HashSet<usize>> = HashMap::new();
    // Most waiting requests share their reason with every other of their team and size (see
    // `reason_parts`): worked out once each.
    let mut reasons: HashMap<(&str, Option<Gpus>, bool), String> = HashMap::new();
    for &wi in &order {
        if placed[wi] {
            continue;
        }
        let w = &s.waiting[wi];
        let pos = position.entry(w.team.as_str()).or_insert(0);
        *pos += 1;
        let named = cx.named(w);
        let lent_to_me = lent_to.entry(w.team.as_str()).or_insert_with(|| {
            cx.lenders(&w.team)
                .iter()
                .flat_map(|(o, _)| {
                    cx.share(o)
                        .iter()
                        .copied()
                        .filter(|&d| cx.lendable_kind(d, o))
                })
                .collect::<HashSet<usize>>()
        });
        // Passed over: a device it could use went to another request, before or after it in
        // order (so the fair order alone cannot starve a heavy user either).
        let borrows = may_borrow(&cx, w);
        let need = cx.need(w);
        let passed = placements.iter().any(|devs| {
            devs.iter().any(|&d| {
                (cx.s.devices[d].owners.contains(&w.team) && cx.usable_for(w, d, named, need))
                    || (borrows && lent_to_me.contains(&d) && cx.usable_for(w, d, None, need))
            })
        });
        let parts = if cx.plain(w) {
            reasons
                .entry((w.team.as_str(), w.gpus, w.borrow))
                .or_insert_with(|| reason_parts(&cx, w, &still))
                .clone()
        } else {
            reason_parts(&cx, w, &still)
        };
        out.push(Decision::Wait {
            ticket: w.ticket,
            position: *pos,
            passed_over: w.passed_over + u32::from(passed),
            reason: reason(parts, w, *pos),
        });
    }
    out
}

/// The teams with a request still waiting.
fn still_waiting<'a>(s: &'a Snapshot, placed: &[bool]) -> HashSet<&'a str> {
    s.waiting
        .iter()
        .zip(placed)
        .filter(|(_, p)| !**p)
        .map(|(w, _)| w.team.as_str())
        .collect()
}

/// Lent devices for `w` from the first lender (by name) that has enough, marked taken; for a
/// starving request that finds none, the most it can use of one lender is kept for it.
fn borrow<'a>(
    cx: &mut Cx<'a>,
    w: &'a Waiter,
    still: &HashSet<&str>,
) -> Option<(&'a str, Vec<usize>)> {
    let Gpus::Count(n) = cx.want(w) else {
        return None;
    };
    let mut keep: Vec<usize> = Vec::new();
    for (owner, rule) in cx.lenders(&w.team) {
        if still.contains(owner) || !cx.window_open(rule) {
            continue;
        }
        let open: Vec<usize> = cx
            .share(owner)
            .iter()
            .copied()
            .filter(|&d| cx.lendable(d, owner, rule, w.ticket))
            .collect();
        if open.len() < n as usize {
            if starving(w) {
                let usable: Vec<usize> = open
                    .into_iter()
                    .filter(|&d| n <= 1 || !cx.s.devices[d].mig)
                    .take(n as usize)
                    .collect();
                if usable.len() > keep.len() {
                    keep = usable;
                }
            }
            continue;
        }
        let cands: Vec<Candidate> = open.iter().map(|&d| cx.shape(d, 0)).collect();
        let req = Request {
            gpus: Some(Gpus::Count(n)),
            device: None,
            profile: None,
        };
        let Ok(picked) = placement::choose(&cands, &req, None, Some(1)) else {
            continue;
        };
        let devs: Vec<usize> = picked.into_iter().map(|i| open[i]).collect();
        for &d in &devs {
            cx.added[d].push(&w.team);
            cx.lent_now[d] = true;
        }
        return Some((owner, devs));
    }
    for d in keep {
        cx.reserved[d] = Some(w.ticket);
    }
    None
}

/// A request naming a device or a profile waits for its own team's: lenders' devices are
/// chosen by count alone.
fn may_borrow(cx: &Cx<'_>, w: &Waiter) -> bool {
    w.borrow && w.device.is_none() && w.profile.is_none() && matches!(cx.want(w), Gpus::Count(_))
}

fn place(cx: &Cx<'_>, ticket: Ticket, devs: &[usize], from: Option<&str>) -> Decision {
    Decision::Place {
        ticket,
        devices: devs.iter().map(|&d| cx.s.devices[d].id.clone()).collect(),
        borrowed_from: from.map(str::to_string),
    }
}

fn reclaim(l: &Held, owner: &str, why: Why, grace: Duration) -> Decision {
    Decision::Reclaim {
        unit: l.unit.clone(),
        borrower: l.team.clone(),
        owner: owner.to_string(),
        devices: l.devices.clone(),
        why,
        grace,
    }
}

/// Why `w` waits: `reason_parts`, then whether it goes first and its place.
fn reason(mut parts: String, w: &Waiter, position: usize) -> String {
    if starving(w) {
        parts.push_str("; first in line (passed over often)");
    }
    format!("{parts}; you are {}", ordinal(position))
}

/// Why `w` waits, but for its place: its own share, what comes back to it, what it could
/// borrow. The same for every [`Cx::plain`] request of one team, size and `--borrow`.
fn reason_parts(cx: &Cx<'_>, w: &Waiter, still: &HashSet<&str>) -> String {
    let team = &w.team;
    let mut parts = Vec::new();
    let share = cx.share(team);
    match cx.named(w) {
        Some(d) => {
            let id = &cx.s.devices[d].id;
            parts.push(match (cx.foreign(d), cx.loan_on(d)) {
                (Some(f), _) => format!("{id} is busy: {f}, outside every lease"),
                (_, Some(l)) => format!("{id} is lent to {}", l.team),
                _ if cx.reserved[d].is_some_and(|t| t != w.ticket) => {
                    format!("{id} is kept for a request before yours")
                }
                _ => format!("{id} is held"),
            });
        }
        None if w.device.is_some() => parts.push(format!(
            "{}: not a device of {} share",
            w.device.as_deref().unwrap_or_default(),
            possessive(team)
        )),
        None if share.is_empty() => parts.push(format!("{team} has no devices of its own")),
        None => {
            let free = cx.free_own(w).len();
            let need = cx.need(w);
            parts.push(if free == 0 {
                format!("no free device in {} share", possessive(team))
            } else {
                format!(
                    "{free} of the {need} devices wanted free in {} share",
                    possessive(team)
                )
            });
            let foreign: Vec<&str> = share.iter().filter_map(|&d| cx.foreign(d)).collect();
            if let Some(f) = foreign.first() {
                parts.push(format!(
                    "{} busy with memory of a process outside every lease ({f})",
                    foreign.len()
                ));
            }
        }
    }
    let coming: Vec<String> =
        cx.s.reclaims
            .iter()
            .filter(|r| r.why == Why::Owner(w.ticket))
            .map(|r| {
                let due = r.noticed_ms.saturating_add(r.grace.as_millis() as u64);
                let left = due.saturating_sub(cx.s.now_ms).div_ceil(1000);
                format!("{} comes back in {left} s at most", r.devices.join(","))
            })
            .collect();
    if !coming.is_empty() {
        parts.push(coming.join(", "));
    } else if share.iter().any(|&d| cx.reserved[d] == Some(w.ticket)) {
        parts.push("a lent device is being taken back for it".into());
    }
    if w.device.is_none() {
        for (owner, rule) in cx.lenders(team).into_iter().take(3) {
            let kinds: Vec<usize> = cx
                .share(owner)
                .iter()
                .copied()
                .filter(|&d| cx.lendable_kind(d, owner))
                .collect();
            if kinds.is_empty() {
                continue;
            }
            let after = rule.after.as_millis() as u64;
            let idle_for: Vec<Option<u64>> = kinds
                .iter()
                .map(|&d| cx.idle_for(d, owner, w.ticket))
                .collect();
            let idle = idle_for
                .iter()
                .filter(|i| i.is_some_and(|ms| ms >= after))
                .count();
            // Idle, not yet for `after` (a restarted gpuctld counts from its first look): not busy.
            let settling = idle_for
                .iter()
                .filter(|i| i.is_some_and(|ms| ms < after))
                .count();
            parts.push(if !cx.window_open(rule) {
                let when: Vec<String> = rule.when.iter().map(ToString::to_string).collect();
                format!("{owner} lends only {}", when.join(", "))
            } else if still.contains(owner) {
                format!("{} own requests wait", possessive(owner))
            } else if !may_borrow(cx, w) && idle > 0 {
                format!("{owner} has {idle} idle device(s) to lend: wait with --borrow")
            } else {
                let busy = kinds.len() - idle - settling;
                let mut p = format!("{busy} of {} lent devices busy", possessive(owner));
                if settling > 0 {
                    p += &format!(
                        ", {settling} idle, lent once idle for {}",
                        human_duration(rule.after)
                    );
                    if !may_borrow(cx, w) {
                        p += ": wait with --borrow";
                    }
                }
                p
            });
        }
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests;
