//! A person's own events: what gpuctld did that concerns a user (an idle warning or stop, a
//! queued job placed, a loan taken back, a device out of or back in service), kept in a bounded
//! ring in gpuctld's memory so that `gpuctl events` (bus `Events`) can show each caller those of
//! their teams. Each is also a structured journal entry, written where it happens; this ring is
//! only what a caller may read back and follow.
//!
//! The ring forgets: it holds the last [`CAPACITY`] events of this gpuctld; the journal keeps the
//! history. A reader that fell behind is told so (`lost`), never shown a gap silently.

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

/// Events kept for readers.
pub const CAPACITY: usize = 1024;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An idle rule warned a holder.
    IdleWarn,
    /// An idle rule stopped a holder.
    IdleStop,
    /// A `--wait` request left the queue with its devices.
    QueuePlaced,
    /// A lent device is being taken back from its borrower (SIGTERM, grace).
    LoanReclaim,
    /// A borrower's grace ended: its job is stopped.
    LoanStop,
    /// A device was taken out of service (a fault or an admin's drain).
    DeviceOut,
    /// A device is back in service.
    DeviceBack,
    /// The jobs on an out-of-service device are stopped (`on-fault = "stop"`).
    DeviceStop,
}

impl Kind {
    /// The name readers see (and `GPUCTL_ACTION` of the matching journal entry where it differs
    /// only in wording).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::IdleWarn => "idle-warn",
            Kind::IdleStop => "idle-stop",
            Kind::QueuePlaced => "queue-placed",
            Kind::LoanReclaim => "loan-reclaim",
            Kind::LoanStop => "loan-stop",
            Kind::DeviceOut => "device-out",
            Kind::DeviceBack => "device-back",
            Kind::DeviceStop => "device-stop",
        }
    }
}

/// One event as posted.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Position in this gpuctld's sequence, from 1.
    pub seq: u64,
    /// Unix ms.
    pub at_ms: u64,
    /// What.
    pub kind: Kind,
    /// The team it concerns; `None`: the whole host (a device's service state), every caller's.
    pub team: Option<String>,
    /// The user it concerns, by name where known.
    pub user: Option<String>,
    /// The user's uid where known.
    pub uid: Option<u32>,
    /// The job's unit.
    pub unit: Option<String>,
    /// The device(s), as the journal names them.
    pub device: Option<String>,
    /// What the user is told.
    pub message: String,
}

impl Event {
    /// A new event of `kind` saying `message`; the rest is filled in with the setters' fields.
    pub fn new(kind: Kind, team: Option<&str>, message: impl Into<String>) -> Event {
        Event {
            seq: 0,
            at_ms: 0,
            kind,
            team: team.map(str::to_string),
            user: None,
            uid: None,
            unit: None,
            device: None,
            message: message.into(),
        }
    }
}

/// What a reader gets: the events after its position that it may see.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// The events, oldest first.
    pub events: Vec<Event>,
    /// The position to ask from next: the last event looked at, seen or not.
    pub next: u64,
    /// Events after the asked position were forgotten before this read.
    pub lost: bool,
}

/// The ring and its readers' wake-up.
pub struct Hub {
    ring: Mutex<VecDeque<Event>>,
    last: watch::Sender<u64>,
    started_ms: u64,
    capacity: usize,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Hub {
    /// An empty hub keeping `capacity` events.
    pub fn new(capacity: usize) -> Hub {
        Hub {
            ring: Mutex::new(VecDeque::with_capacity(capacity.min(CAPACITY))),
            last: watch::Sender::new(0),
            started_ms: now_ms(),
            capacity: capacity.max(1),
        }
    }

    /// When this hub (this gpuctld) started, Unix ms: a reader whose position came from
    /// another start begins again from 0.
    pub fn started_ms(&self) -> u64 {
        self.started_ms
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Event>> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keep `e` (numbered and stamped here) and wake the readers; returns its number.
    pub fn post(&self, mut e: Event) -> u64 {
        let seq = {
            let mut ring = self.lock();
            e.seq = ring.back().map_or(*self.last.borrow(), |l| l.seq) + 1;
            e.at_ms = now_ms();
            if ring.len() >= self.capacity {
                ring.pop_front();
            }
            let seq = e.seq;
            ring.push_back(e);
            seq
        };
        self.last.send_replace(seq);
        seq
    }

    /// The number of the newest event (0: none yet).
    pub fn last(&self) -> u64 {
        *self.last.borrow()
    }

    /// The events after `after` that `sees` lets through, at most `max`.
    pub fn after(&self, after: u64, max: usize, sees: impl Fn(&Event) -> bool) -> Page {
        let ring = self.lock();
        // A position past the newest (a reader of an earlier gpuctld) reads from now on.
        let after = after.min(ring.back().map_or(0, |e| e.seq));
        let first = ring.front().map_or(u64::MAX, |e| e.seq);
        let lost = after > 0 && first != u64::MAX && first > after + 1;
        let mut page = Page {
            events: Vec::new(),
            next: after,
            lost,
        };
        for e in ring.iter().filter(|e| e.seq > after) {
            if page.events.len() == max {
                return page;
            }
            page.next = e.seq;
            if sees(e) {
                page.events.push(e.clone());
            }
        }
        page
    }

    /// [`Hub::after`], waiting up to `wait` for a first event `sees` lets through.
    pub async fn wait(
        &self,
        after: u64,
        max: usize,
        wait: Duration,
        sees: impl Fn(&Event) -> bool,
    ) -> Page {
        let mut rx = self.last.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        let mut page = self.after(after, max, &sees);
        let lost = page.lost;
        while page.events.is_empty() {
            let from = page.next;
            let newer = rx.wait_for(|last| *last > from);
            if tokio::time::timeout_at(deadline, newer).await.is_err() {
                break;
            }
            page = self.after(from, max, &sees);
        }
        page.lost |= lost;
        page
    }
}

/// gpuctld's hub.
pub fn hub() -> &'static Hub {
    static HUB: OnceLock<Hub> = OnceLock::new();
    HUB.get_or_init(|| Hub::new(CAPACITY))
}

/// Post `e` to gpuctld's hub.
pub fn post(e: Event) -> u64 {
    hub().post(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(team: Option<&str>, text: &str) -> Event {
        Event::new(Kind::IdleWarn, team, text)
    }

    fn infer(e: &Event) -> bool {
        e.team.as_deref().is_none_or(|t| t == "infer")
    }

    #[test]
    fn a_reader_sees_its_teams_and_the_hosts_events_in_order() {
        let h = Hub::new(8);
        h.post(ev(Some("infer"), "a"));
        h.post(ev(Some("train"), "b"));
        h.post(ev(None, "c"));
        let p = h.after(0, 100, infer);
        let texts: Vec<&str> = p.events.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(texts, ["a", "c"]);
        assert_eq!(p.next, 3, "past train's event too");
        assert!(!p.lost);
        assert_eq!(p.events[1].seq, 3);
        assert!(p.events[0].at_ms > 0);
        assert!(h.after(3, 100, infer).events.is_empty());
        assert_eq!(h.after(3, 100, infer).next, 3);
    }

    #[test]
    fn a_reader_that_fell_behind_is_told() {
        let h = Hub::new(2);
        for t in ["a", "b", "c"] {
            h.post(ev(Some("infer"), t));
        }
        let p = h.after(1, 100, infer);
        assert!(!p.lost, "event 2 is still there");
        let p = h.after(0, 100, infer);
        assert!(!p.lost, "a new reader lost nothing of its own");
        assert_eq!(p.events.len(), 2);
        h.post(ev(Some("infer"), "d"));
        let p = h.after(1, 100, infer);
        assert!(p.lost, "event 2 is gone");
        assert_eq!(p.events[0].message, "c");
    }

    #[test]
    fn a_page_stops_at_max_and_goes_on_from_next() {
        let h = Hub::new(8);
        for t in ["a", "b", "c"] {
            h.post(ev(Some("infer"), t));
        }
        let p = h.after(0, 2, infer);
        assert_eq!(p.events.len(), 2);
        let q = h.after(p.next, 2, infer);
        assert_eq!(q.events[0].message, "c");
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_waiting_reader_wakes_for_its_own_event_only() {
        let h = std::sync::Arc::new(Hub::new(8));
        let h2 = h.clone();
        let reader =
            tokio::spawn(async move { h2.wait(0, 10, Duration::from_secs(20), infer).await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        h.post(ev(Some("train"), "not mine"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !reader.is_finished(),
            "another team's event wakes nobody up for good"
        );
        h.post(ev(Some("infer"), "mine"));
        let p = reader.await.unwrap();
        assert_eq!(p.events.len(), 1);
        assert_eq!(p.events[0].message, "mine");
        assert_eq!(p.next, 2);
        let empty = h.wait(2, 10, Duration::from_secs(5), infer).await;
        assert!(empty.events.is_empty(), "nothing new: the wait ends empty");
        assert_eq!(empty.next, 2);
    }
}
