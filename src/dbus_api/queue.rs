//! The queue of `gpuctl run --wait` requests that found no free device: per team, round-robin
//! across users (one user's ten requests do not starve another's one), bounded per user and in
//! all like the other bus limits ([`crate::ratelimit`]). Only the request whose turn it is tries
//! to place itself; the others wait. Pure bookkeeping: the waiting itself is in `join`.

use std::collections::{HashMap, VecDeque};

/// Most requests one uid may have waiting, all teams together.
pub const MAX_WAITING_PER_USER: usize = 16;
/// Most requests waiting, all users together: each holds a bus call and a pinned pidfd.
pub const MAX_WAITING: usize = 256;

/// A place in the queue.
pub type Ticket = u64;

#[derive(Debug, Default)]
struct TeamQueue {
    /// Users in turn order: the front one's first ticket goes next.
    turn: VecDeque<u32>,
    /// Each user's tickets, oldest first.
    tickets: HashMap<u32, VecDeque<Ticket>>,
}

/// Every team's queue.
#[derive(Debug, Default)]
pub struct Queues {
    teams: HashMap<String, TeamQueue>,
    per_user: HashMap<u32, usize>,
    total: usize,
    next: Ticket,
}

impl Queues {
    /// Queue a request of `uid` for `team`; refused over the caps, in words.
    pub fn join(&mut self, team: &str, uid: u32) -> Result<Ticket, String> {
        let mine = self.per_user.get(&uid).copied().unwrap_or(0);
        if mine >= MAX_WAITING_PER_USER {
            return Err(format!(
                "uid {uid} already has {MAX_WAITING_PER_USER} requests waiting \
                 (MAX_WAITING_PER_USER)"
            ));
        }
        if self.total >= MAX_WAITING {
            return Err(format!(
                "{MAX_WAITING} requests are waiting already (MAX_WAITING)"
            ));
        }
        self.next += 1;
        let t = self.next;
        let q = self.teams.entry(team.to_string()).or_default();
        let own = q.tickets.entry(uid).or_default();
        if own.is_empty() {
            q.turn.push_back(uid);
        }
        own.push_back(t);
        *self.per_user.entry(uid).or_default() += 1;
        self.total += 1;
        Ok(t)
    }

    /// The ticket whose turn it is in `team`.
    pub fn head(&self, team: &str) -> Option<Ticket> {
        let q = self.teams.get(team)?;
        q.tickets.get(q.turn.front()?)?.front().copied()
    }

    /// `team`'s tickets in the order they will be served (round-robin across users), with
    /// their uids.
    fn order(&self, team: &str) -> Vec<(Ticket, u32)> {
        let Some(q) = self.teams.get(team) else {
            return Vec::new();
        };
        let depth = q.tickets.values().map(VecDeque::len).max().unwrap_or(0);
        let mut out = Vec::new();
        for round in 0..depth {
            for u in &q.turn {
                if let Some(t) = q.tickets.get(u).and_then(|v| v.get(round)) {
                    out.push((*t, *u));
                }
            }
        }
        out
    }

    /// 1-based position of `ticket` in `team`'s round-robin order, `None` when not queued.
    pub fn position(&self, team: &str, ticket: Ticket) -> Option<usize> {
        self.order(team)
            .iter()
            .position(|(t, _)| *t == ticket)
            .map(|i| i + 1)
    }

    /// Every waiting request as (team, uid, 1-based position), teams in name order.
    pub fn waiting(&self) -> Vec<(String, u32, usize)> {
        let mut teams: Vec<&String> = self.teams.keys().collect();
        teams.sort();
        teams
            .into_iter()
            .flat_map(|t| {
                self.order(t)
                    .into_iter()
                    .enumerate()
                    .map(move |(i, (_, uid))| (t.clone(), uid, i + 1))
            })
            .collect()
    }

    /// The requests of the teams `viewer` may read, for `Status`, each with its user's name.
    pub fn seen_by(
        &self,
        viewer: &crate::join::Viewer,
        name_of: impl Fn(u32) -> Option<String>,
    ) -> Vec<super::reply::v1::QueuedRequest> {
        self.waiting()
            .into_iter()
            .filter(|(team, _, _)| viewer.sees(Some(team)))
            .map(|(team, uid, position)| super::reply::v1::QueuedRequest {
                position,
                team,
                uid,
                user: name_of(uid),
            })
            .collect()
    }

    /// Take `ticket` out (placed, timed out, or its process left). When it was its user's
    /// turn, the turn passes on: the user goes to the back if more of theirs wait.
    pub fn leave(&mut self, team: &str, ticket: Ticket) {
        let Some(q) = self.teams.get_mut(team) else {
            return;
        };
        let Some((&uid, own)) = q.tickets.iter_mut().find(|(_, v)| v.contains(&ticket)) else {
            return;
        };
        let was_turn = q.turn.front() == Some(&uid) && own.front() == Some(&ticket);
        own.retain(|t| *t != ticket);
        let empty = own.is_empty();
        if empty {
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

    #[test]
    fn one_users_ten_requests_do_not_starve_anothers_one() {
        let mut q = Queues::default();
        let alice: Vec<Ticket> = (0..10).map(|_| q.join("t", 1000).unwrap()).collect();
        let bob = q.join("t", 1001).unwrap();
        assert_eq!(q.head("t"), Some(alice[0]));
        assert_eq!(q.position("t", bob), Some(2), "second, not eleventh");
        assert_eq!(q.position("t", alice[1]), Some(3));
        q.join("a", 7).unwrap();
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
        q.join("interns", 1000).unwrap();
        q.join("train", 1001).unwrap();
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

    #[test]
    fn caps_per_user_and_in_all_and_leaving_out_of_turn() {
        let mut q = Queues::default();
        for _ in 0..MAX_WAITING_PER_USER {
            q.join("t", 1).unwrap();
        }
        let e = q.join("u", 1).unwrap_err();
        assert!(e.contains("MAX_WAITING_PER_USER"), "{e}");
        let mut uid = 2;
        while q.len() < MAX_WAITING {
            q.join("t", 1000 + uid / 8)
                .unwrap_or_else(|e| panic!("{e}"));
            uid += 1;
        }
        assert!(q.join("t", 99_999).unwrap_err().contains("MAX_WAITING"));
        // A waiter that gives up out of turn leaves the turn where it was.
        let mut q = Queues::default();
        let a1 = q.join("t", 1).unwrap();
        let b1 = q.join("t", 2).unwrap();
        let b2 = q.join("t", 2).unwrap();
        q.leave("t", b2);
        assert_eq!(q.head("t"), Some(a1));
        q.leave("t", a1);
        assert_eq!(q.head("t"), Some(b1));
        assert_eq!(q.position("t", a1), None);
        q.leave("t", 12345);
        assert_eq!(q.len(), 1);
    }
}
