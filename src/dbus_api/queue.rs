//! The queue of `gpuctl run --wait` requests that found no free device: per team, round-robin
//! across users (one user's ten requests do not starve another's one), bounded per user and in
//! all like the other bus limits ([`crate::ratelimit`]). Pure bookkeeping: which waiters a free
//! device serves is [`crate::placement::serve`]'s choice over [`Queues::entries`], and the
//! waiting itself is in `join`.
//!
//! The queue outlives a gpuctld restart as far as it can: [`Queues::saved`] is written to
//! `/run/gpuctl/queue.json` at every change, and a restarted gpuctld [`Queues::restore`]s it as
//! *returning* entries that keep their places until their clients ask again ([`Queues::attach`])
//! or a grace runs out ([`Queues::drop_returning`]). A returning entry is served nothing and
//! holds nobody back.

use crate::placement::{Gpus, Request};
use std::collections::{BTreeSet, HashMap, VecDeque};

/// Most requests one uid may have waiting, all teams together.
pub const MAX_WAITING_PER_USER: usize = 16;
/// Most requests waiting, all users together: each holds a bus call and a pinned pidfd.
pub const MAX_WAITING: usize = 256;

/// A place in the queue.
pub type Ticket = u64;

/// Why a request cannot join the queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// The user's own cap.
    #[error(
        "uid {uid} already has {MAX_WAITING_PER_USER} requests waiting (MAX_WAITING_PER_USER)"
    )]
    UserFull {
        /// Whose.
        uid: u32,
    },
    /// The cap of all users together.
    #[error("{MAX_WAITING} requests are waiting already (MAX_WAITING)")]
    Full,
}

/// One waiting request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its place.
    pub ticket: Ticket,
    /// Whose.
    pub uid: u32,
    /// The waiting process (how a client that asks again after a restart is recognised).
    pub pid: u32,
    /// What it asks for.
    pub request: Request,
    /// How many later requests were placed while it waited ([`crate::placement::serve`]
    /// reserves for it past [`crate::placement::MAX_PASSES`]).
    pub passed: u32,
    /// Restored after a restart, its client not back yet.
    pub returning: bool,
    /// May borrow another team's lent device (`--borrow`, or its team's `borrow`).
    pub borrow: bool,
    /// Why it waits when that is not a busy device (a `--profile` no device has yet), as the
    /// last look at the team's queue found ([`Queues::set_reasons`]); for `Status`.
    pub reason: Option<String>,
}

/// A waiting request as `/run/gpuctl/queue.json` keeps it, in serving order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Saved {
    /// The team.
    pub team: String,
    /// Whose.
    pub uid: u32,
    /// The waiting process.
    pub pid: u32,
    /// `--gpus`.
    #[serde(default)]
    pub gpus: Option<Gpus>,
    /// `--device`.
    #[serde(default)]
    pub device: Option<String>,
    /// `--profile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Times passed over.
    #[serde(default)]
    pub passed: u32,
    /// May borrow.
    #[serde(default)]
    pub borrow: bool,
}

#[derive(Debug, Default)]
struct TeamQueue {
    /// Users in turn order: the front one's first ticket goes next.
    turn: VecDeque<u32>,
    /// Each user's requests, oldest first.
    tickets: HashMap<u32, VecDeque<Entry>>,
    /// Tickets a free device serves now, as the last look at the team's queue found.
    granted: BTreeSet<Ticket>,
}

/// Every team's queue.
#[derive(Debug, Default)]
pub struct Queues {
    teams: HashMap<String, TeamQueue>,
    per_user: HashMap<u32, usize>,
    total: usize,
    next: Ticket,
    /// When the entries restored after a restart stop waiting for their clients.
    returning_until: Option<std::time::Instant>,
    /// Recent usage (decayed device-seconds from the ledger): in each round the user with the
    /// least goes first; each team's borrowed time orders the loans.
    usage: crate::lending::RecentUsage,
}

impl Queues {
    /// Queue a request of `uid` (process `pid`) for `team`; refused over the caps.
    pub fn join(
        &mut self,
        team: &str,
        uid: u32,
        pid: u32,
        request: Request,
        borrow: bool,
    ) -> Result<Ticket, QueueError> {
        self.push(team, uid, pid, (request, borrow), 0, false)
    }

    fn push(
        &mut self,
        team: &str,
        uid: u32,
        pid: u32,
        (request, borrow): (Request, bool),
        passed: u32,
        returning: bool,
    ) -> Result<Ticket, QueueError> {
        let mine = self.per_user.get(&uid).copied().unwrap_or(0);
        if mine >= MAX_WAITING_PER_USER {
            return Err(QueueError::UserFull { uid });
        }
        if self.total >= MAX_WAITING {
            return Err(QueueError::Full);
        }
        self.next += 1;
        let ticket = self.next;
        let q = self.teams.entry(team.to_string()).or_default();
        let own = q.tickets.entry(uid).or_default();
        if own.is_empty() {
            q.turn.push_back(uid);
        }
        own.push_back(Entry {
            ticket,
            uid,
            pid,
            request,
            passed,
            returning,
            borrow,
            reason: None,
        });
        *self.per_user.entry(uid).or_default() += 1;
        self.total += 1;
        Ok(ticket)
    }

    /// A client asking again after a restart takes back its returning entry (same team, uid
    /// and process); `None` when it has none.
    pub fn attach(&mut self, team: &str, uid: u32, pid: u32) -> Option<Ticket> {
        let e = self
            .teams
            .get_mut(team)?
            .tickets
            .get_mut(&uid)?
            .iter_mut()
            .find(|e| e.returning && e.pid == pid)?;
        e.returning = false;
        Some(e.ticket)
    }

    /// The ticket first in `team`'s serving order: the one that looks at the team's devices
    /// for everyone and [`Queues::grant`]s.
    pub fn head(&self, team: &str) -> Option<Ticket> {
        self.entries(team)
            .into_iter()
            .find(|e| !e.returning)
            .map(|e| e.ticket)
    }

    /// `team`'s requests in the order they will be served (round-robin across users).
    pub fn entries(&self, team: &str) -> Vec<Entry> {
        let Some(q) = self.teams.get(team) else {
            return Vec::new();
        };
        let depth = q.tickets.values().map(VecDeque::len).max().unwrap_or(0);
        // Least recent usage first; equal usage (no ledger: everyone) keeps the turn order.
        let mut turn: Vec<u32> = q.turn.iter().copied().collect();
        let used = |u: &u32| self.usage.users.get(u).copied().unwrap_or(0.0);
        turn.sort_by(|a, b| used(a).total_cmp(&used(b)));
        let mut out = Vec::new();
        for round in 0..depth {
            for u in &turn {
                if let Some(e) = q.tickets.get(u).and_then(|v| v.get(round)) {
                    out.push(e.clone());
                }
            }
        }
        out
    }

    /// Record which of `team`'s tickets a free device serves now.
    pub fn grant(&mut self, team: &str, tickets: BTreeSet<Ticket>) {
        if let Some(q) = self.teams.get_mut(team) {
            q.granted = tickets;
        }
    }

    /// The lending decision found `ticket` a lent device: it looks at once, like a ticket
    /// its own team's look served.
    pub fn grant_one(&mut self, team: &str, ticket: Ticket) {
        if let Some(q) = self.teams.get_mut(team) {
            q.granted.insert(ticket);
        }
    }

    /// Tickets from now on follow `n`: a restarted gpuctld numbers after the last one's, so
    /// a reclaim recorded for an old ticket never names a new request.
    pub fn tickets_after(&mut self, n: Ticket) {
        self.next = self.next.max(n);
    }

    /// Every team's requests (teams in name order, each in serving order).
    pub fn all_entries(&self) -> Vec<(String, Entry)> {
        let mut teams: Vec<&String> = self.teams.keys().collect();
        teams.sort();
        teams
            .into_iter()
            .flat_map(|t| self.entries(t).into_iter().map(move |e| (t.clone(), e)))
            .collect()
    }

    /// Record why each of `team`'s `tickets` waits, beyond a busy device (`None`: it does not).
    pub fn set_reasons(&mut self, team: &str, reasons: &[(Ticket, Option<String>)]) {
        if let Some(q) = self.teams.get_mut(team) {
            for e in q.tickets.values_mut().flatten() {
                if let Some((_, r)) = reasons.iter().find(|(t, _)| *t == e.ticket) {
                    e.reason.clone_from(r);
                }
            }
        }
    }

    /// `ticket` looked and found nothing after all (someone placed first).
    pub fn ungrant(&mut self, team: &str, ticket: Ticket) {
        if let Some(q) = self.teams.get_mut(team) {
            q.granted.remove(&ticket);
        }
    }

    /// Whether the last look at `team`'s queue found a device for `ticket`.
    pub fn granted(&self, team: &str, ticket: Ticket) -> bool {
        self.teams
            .get(team)
            .is_some_and(|q| q.granted.contains(&ticket))
    }

    /// A request was placed while `tickets` of `team` waited ahead of it: each was passed over
    /// once more.
    pub fn passed_over(&mut self, team: &str, tickets: &BTreeSet<Ticket>) {
        if let Some(q) = self.teams.get_mut(team) {
            for e in q.tickets.values_mut().flatten() {
                if tickets.contains(&e.ticket) {
                    e.passed = e.passed.saturating_add(1);
                }
            }
        }
    }

    /// 1-based position of `ticket` in `team`'s order, `None` when not queued.
    pub fn position(&self, team: &str, ticket: Ticket) -> Option<usize> {
        self.entries(team)
            .iter()
            .position(|e| e.ticket == ticket)
            .map(|i| i + 1)
    }

    /// Every waiting request as (team, uid, 1-based position), teams in name order.
    pub fn waiting(&self) -> Vec<(String, u32, usize)> {
        let mut teams: Vec<&String> = self.teams.keys().collect();
        teams.sort();
        teams
            .into_iter()
            .flat_map(|t| {
                self.entries(t)
                    .into_iter()
                    .enumerate()
                    .map(move |(i, e)| (t.clone(), e.uid, i + 1))
            })
            .collect()
    }

    /// The requests of the teams `viewer` may read, for `Status`, each with its user's name.
    pub fn seen_by(
        &self,
        viewer: &crate::join::Viewer,
        name_of: impl Fn(u32) -> Option<String>,
    ) -> Vec<super::reply::v1::QueuedRequest> {
        let mut teams: Vec<&String> = self.teams.keys().collect();
        teams.sort();
        let mut out = Vec::new();
        for team in teams.into_iter().filter(|t| viewer.sees(Some(t))) {
            for (i, e) in self.entries(team).into_iter().enumerate() {
                out.push(super::reply::v1::QueuedRequest {
                    position: i + 1,
                    team: team.clone(),
                    uid: e.uid,
                    user: name_of(e.uid),
                    profile: e.request.profile,
                    reason: e.reason,
                });
            }
        }
        out
    }

    /// Take `ticket` out (placed, timed out, or its process left). When it was its user's
    /// turn, the turn passes on: the user goes to the back if more of theirs wait.
    pub fn leave(&mut self, team: &str, ticket: Ticket) {
        let Some(q) = self.teams.get_mut(team) else {
            return;
        };
        let Some((&uid, own)) = q
            .tickets
            .iter_mut()
            .find(|(_, v)| v.iter().any(|e| e.ticket == ticket))
        else {
            return;
        };
        let was_turn =
            q.turn.front() == Some(&uid) && own.front().map(|e| e.ticket) == Some(ticket);
        own.retain(|e| e.ticket != ticket);
        q.granted.remove(&ticket);
        if own.is_empty() {
            q.tickets.remove(&uid);
            q.turn.retain(|u| *u != uid);
        } else if was_turn {
            q.turn.rotate_left(1);
        }
        if q.turn.is_empty() {
            self.teams.remove(team);
        }
        if let Some(n) = self.per_user.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                self.per_user.remove(&uid);
            }
        }
        self.total -= 1;
    }

    /// Every request in serving order per team (teams in name order), for the state file.
    pub fn saved(&self) -> Vec<Saved> {
        let mut teams: Vec<&String> = self.teams.keys().collect();
        teams.sort();
        teams
            .into_iter()
            .flat_map(|t| {
                self.entries(t).into_iter().map(move |e| Saved {
                    team: t.clone(),
                    uid: e.uid,
                    pid: e.pid,
                    gpus: e.request.gpus,
                    device: e.request.device,
                    profile: e.request.profile,
                    passed: e.passed,
                    borrow: e.borrow,
                })
            })
            .collect()
    }

    /// Put back what a previous gpuctld saved, as returning entries in the same order, kept
    /// until `until` ([`Queues::expire`]); the caps still hold: what does not fit is dropped.
    pub fn restore(&mut self, saved: Vec<Saved>, until: std::time::Instant) {
        self.returning_until = Some(until);
        for s in saved {
            let request = Request {
                gpus: s.gpus,
                device: s.device,
                profile: s.profile,
            };
            let _ = self.push(&s.team, s.uid, s.pid, (request, s.borrow), s.passed, true);
        }
    }

    /// Past the restore's deadline, forget the returning entries whose clients did not come
    /// back; whether any went.
    pub fn expire(&mut self, now: std::time::Instant) -> bool {
        match self.returning_until {
            Some(t) if now >= t => {
                self.returning_until = None;
                self.drop_returning()
            }
            _ => false,
        }
    }

    fn drop_returning(&mut self) -> bool {
        let gone: Vec<(String, Ticket)> = self
            .teams
            .iter()
            .flat_map(|(t, q)| {
                q.tickets
                    .values()
                    .flatten()
                    .filter(|e| e.returning)
                    .map(|e| (t.clone(), e.ticket))
            })
            .collect();
        for (t, ticket) in &gone {
            self.leave(t, *ticket);
        }
        !gone.is_empty()
    }

    /// Set the recent usage (each user's orders the queue, each team's borrowed time the
    /// loans); users and teams not named have none.
    pub fn set_usage(&mut self, usage: crate::lending::RecentUsage) {
        self.usage = usage;
    }

    /// The recent usage the order follows.
    pub fn usage(&self) -> &crate::lending::RecentUsage {
        &self.usage
    }

    /// The uids with a request waiting.
    pub fn uids(&self) -> Vec<u32> {
        self.per_user.keys().copied().collect()
    }

    /// Requests waiting now, all teams.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Nothing waits.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any() -> Request {
        Request::default()
    }

    fn tickets(q: &Queues, team: &str) -> Vec<Ticket> {
        q.entries(team).iter().map(|e| e.ticket).collect()
    }

    #[test]
    fn one_users_ten_requests_do_not_starve_anothers_one() {
        let mut q = Queues::default();
        let alice: Vec<Ticket> = (0..10)
            .map(|_| q.join("t", 1000, 1, any(), false).unwrap())
            .collect();
        let bob = q.join("t", 1001, 2, any(), false).unwrap();
        assert_eq!(q.head("t"), Some(alice[0]));
        assert_eq!(q.position("t", bob), Some(2), "second, not eleventh");
        assert_eq!(q.position("t", alice[1]), Some(3));
        q.join("a", 7, 3, any(), false).unwrap();
        let w = q.waiting();
        assert_eq!(w[0], ("a".to_string(), 7, 1), "teams in name order");
        assert_eq!(
            w[1..4],
            [
                ("t".to_string(), 1000, 1),
                ("t".to_string(), 1001, 2),
                ("t".to_string(), 1000, 3)
            ]
        );
        assert_eq!(w.len(), 12);
        let a = q.head("a").unwrap();
        q.leave("a", a);
        // Served in turns: alice, bob, then alice's others.
        let mut order = Vec::new();
        while let Some(h) = q.head("t") {
            order.push(h);
            q.leave("t", h);
        }
        assert_eq!(order[0], alice[0]);
        assert_eq!(order[1], bob);
        assert_eq!(&order[2..], &alice[1..]);
        assert!(q.is_empty());
        assert!(q.teams.is_empty() && q.per_user.is_empty(), "nothing kept");
    }

    #[test]
    fn a_viewer_reads_the_queues_of_its_own_teams_only() {
        use crate::join::Viewer;
        let mut q = Queues::default();
        q.join("interns", 1000, 1, any(), false).unwrap();
        q.join("train", 1001, 2, any(), false).unwrap();
        let name = |uid: u32| (uid == 1000).then(|| "alice".to_string());
        let member = Viewer::Teams(["interns".to_string()].into());
        let seen = q.seen_by(&member, name);
        assert_eq!(seen.len(), 1);
        assert_eq!(
            (
                seen[0].team.as_str(),
                seen[0].uid,
                seen[0].user.as_deref(),
                seen[0].position
            ),
            ("interns", 1000, Some("alice"), 1)
        );
        assert!(q
            .seen_by(&Viewer::Teams(Default::default()), name)
            .is_empty());
        assert_eq!(q.seen_by(&Viewer::All, name).len(), 2);
    }

    fn users<const N: usize>(u: [(u32, f64); N]) -> crate::lending::RecentUsage {
        crate::lending::RecentUsage {
            users: u.into(),
            ..Default::default()
        }
    }

    #[test]
    fn in_each_round_the_user_with_the_least_recent_usage_goes_first() {
        let mut q = Queues::default();
        let a1 = q.join("t", 1, 1, any(), false).unwrap();
        let a2 = q.join("t", 1, 2, any(), false).unwrap();
        let b1 = q.join("t", 2, 3, any(), false).unwrap();
        let c1 = q.join("t", 3, 4, any(), false).unwrap();
        // No usage known: round-robin in arrival order.
        assert_eq!(tickets(&q, "t"), [a1, b1, c1, a2]);
        // User 1 used the most, user 3 the least: 3, 2, 1 in the first round; 1's second
        // request still waits for the second round.
        q.set_usage(users([(1, 900.0), (2, 50.0), (3, 10.0)]));
        assert_eq!(tickets(&q, "t"), [c1, b1, a1, a2]);
        assert_eq!(q.head("t"), Some(c1));
        assert_eq!(q.position("t", a1), Some(3));
        // Ties keep the turn order.
        q.set_usage(users([(1, 9.0), (2, 5.0), (3, 5.0)]));
        assert_eq!(tickets(&q, "t"), [b1, c1, a1, a2]);
    }

    #[test]
    fn caps_per_user_and_in_all_and_leaving_out_of_turn() {
        let mut q = Queues::default();
        for _ in 0..MAX_WAITING_PER_USER {
            q.join("t", 1, 1, any(), false).unwrap();
        }
        assert_eq!(
            q.join("u", 1, 1, any(), false),
            Err(QueueError::UserFull { uid: 1 })
        );
        let mut uid = 2;
        while q.len() < MAX_WAITING {
            q.join("t", 1000 + uid / 8, uid, any(), false)
                .unwrap_or_else(|e| panic!("{e}"));
            uid += 1;
        }
        assert_eq!(q.join("t", 99_999, 1, any(), false), Err(QueueError::Full));
        // A waiter that gives up out of turn leaves the turn where it was.
        let mut q = Queues::default();
        let a1 = q.join("t", 1, 1, any(), false).unwrap();
        let b1 = q.join("t", 2, 2, any(), false).unwrap();
        let b2 = q.join("t", 2, 3, any(), false).unwrap();
        q.leave("t", b2);
        assert_eq!(q.head("t"), Some(a1));
        q.leave("t", a1);
        assert_eq!(q.head("t"), Some(b1));
        assert_eq!(q.position("t", a1), None);
        q.leave("t", 12345);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn passes_count_for_those_ahead_only() {
        let mut q = Queues::default();
        let a = q.join("t", 1, 1, any(), false).unwrap();
        let b = q.join("t", 2, 2, any(), false).unwrap();
        let c = q.join("t", 3, 3, any(), false).unwrap();
        q.passed_over("t", &[a, b].into());
        q.leave("t", c);
        q.passed_over("t", &[a].into());
        q.passed_over("u", &[a].into());
        let passed: Vec<(Ticket, u32)> = q
            .entries("t")
            .iter()
            .map(|e| (e.ticket, e.passed))
            .collect();
        assert_eq!(passed, vec![(a, 2), (b, 1)]);
    }

    #[test]
    fn a_restart_keeps_the_order_for_clients_that_come_back() {
        let mut q = Queues::default();
        let dev = Request {
            gpus: None,
            device: Some("MIG-a".into()),
            profile: None,
        };
        let big = Request {
            profile: Some("3g.40gb".into()),
            ..any()
        };
        q.join("t", 1, 11, any(), false).unwrap();
        q.join("t", 1, 12, dev.clone(), false).unwrap();
        q.join("u", 5, 51, big.clone(), false).unwrap();
        q.join("t", 2, 21, any(), false).unwrap();
        q.join("u", 3, 31, any(), false).unwrap();
        q.passed_over("t", &tickets(&q, "t").into_iter().collect());
        let saved = q.saved();
        let text = serde_json::to_string(&saved).unwrap();
        assert!(text.contains(r#""profile":"3g.40gb""#), "{text}");
        assert_eq!(
            text.matches("profile").count(),
            1,
            "only where asked: {text}"
        );
        let mut r = Queues::default();
        let t0 = std::time::Instant::now();
        let until = t0 + std::time::Duration::from_secs(60);
        r.restore(serde_json::from_str(&text).unwrap(), until);
        assert_eq!(r.saved(), saved, "same order, requests and passes");
        assert_eq!(
            r.entries("u")[0].request,
            big,
            "the profile survives a restart"
        );
        // A file of a gpuctld before --profile reads as asking for none.
        let old: Saved = serde_json::from_str(r#"{"team":"t","uid":1,"pid":2}"#).unwrap();
        assert_eq!(old.profile, None);
        assert_eq!(r.head("t"), None, "returning entries are not served");
        // A new user's request takes its round-robin place among the returning ones (after
        // each user's first); a returning client takes back its own.
        let new = r.join("t", 4, 41, any(), false).unwrap();
        assert_eq!(r.position("t", new), Some(3));
        assert_eq!(r.attach("t", 2, 21), Some(tickets(&r, "t")[1]));
        assert_eq!(r.attach("t", 2, 21), None, "once");
        assert_eq!(r.attach("t", 1, 99), None, "another process is not it");
        assert_eq!(r.head("t"), Some(tickets(&r, "t")[1]));
        assert!(!r.expire(t0), "kept until the deadline");
        assert_eq!(r.len(), 6);
        assert!(r.expire(until));
        assert_eq!(r.len(), 2, "the one that came back and the new one");
        assert_eq!(r.position("t", new), Some(2));
        assert!(!r.expire(until));
        assert_eq!(r.per_user.get(&1), None);
    }

    #[test]
    fn status_shows_a_waiters_profile_and_why_it_waits() {
        use crate::join::Viewer;
        let mut q = Queues::default();
        let big = Request {
            profile: Some("3g.40gb".into()),
            ..any()
        };
        let a = q.join("train", 1000, 1, big, false).unwrap();
        let b = q.join("train", 1001, 2, any(), false).unwrap();
        let why = "no 3g.40gb device in team train's share now".to_string();
        q.set_reasons("train", &[(a, Some(why.clone())), (b, None)]);
        let seen = q.seen_by(&Viewer::All, |_| None);
        assert_eq!(
            (seen[0].profile.as_deref(), seen[0].reason.as_deref()),
            (Some("3g.40gb"), Some(why.as_str()))
        );
        assert_eq!(
            (seen[1].profile.as_deref(), seen[1].reason.as_deref()),
            (None, None)
        );
        // The next look finds a device of it (busy): the reason goes.
        q.set_reasons("train", &[(a, None)]);
        assert_eq!(q.seen_by(&Viewer::All, |_| None)[0].reason, None);
        // Not part of the state file: the next gpuctld looks again.
        assert!(!serde_json::to_string(&q.saved())
            .unwrap()
            .contains("share now"));
    }

    #[test]
    fn grants_belong_to_the_team_and_end_with_the_ticket() {
        let mut q = Queues::default();
        let a = q.join("t", 1, 1, any(), false).unwrap();
        let b = q.join("t", 2, 2, any(), false).unwrap();
        q.grant("t", [b].into());
        assert!(q.granted("t", b) && !q.granted("t", a) && !q.granted("u", b));
        q.leave("t", b);
        assert!(!q.granted("t", b));
    }
}
