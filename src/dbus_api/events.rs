//! `Events` on the bus: a caller's events ([`crate::events`]) after a position, waiting for a
//! first one when asked (`gpuctl events --follow`), and the `Event` signal that says one was
//! posted. The signal carries only the position, the kind and the team: what happened to whom
//! is read through `Events`, which shows each caller only its teams' events.

use super::reply::{EventRecord, EventsReply};
use crate::events::{hub, Event};
use crate::join::Viewer;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;
use tracing::warn;

/// The longest a call waits for a first event.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// Most events in one reply.
const PAGE: usize = 256;
/// Calls waiting at once per uid, and for all callers together; a call past either is answered
/// at once (what there is), so followers never pile up in gpuctld.
const WAITING_PER_UID: usize = 4;
const WAITING: usize = 64;

static WAITERS: Mutex<BTreeMap<u32, usize>> = Mutex::new(BTreeMap::new());

/// A place among the waiting calls, given back on drop (the call answered or dropped).
struct Waiting(u32);

impl Waiting {
    fn enter(uid: u32) -> Option<Waiting> {
        let mut w = WAITERS.lock().unwrap_or_else(|e| e.into_inner());
        let total: usize = w.values().sum();
        let mine = w.entry(uid).or_default();
        if *mine >= WAITING_PER_UID || total >= WAITING {
            return None;
        }
        *mine += 1;
        Some(Waiting(uid))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut w = WAITERS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = w.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                w.remove(&self.0);
            }
        }
    }
}

/// Whether `viewer` may read `e`: its team's, or the host's own.
pub fn visible(viewer: &Viewer, e: &Event) -> bool {
    e.team.as_deref().is_none_or(|t| viewer.sees(Some(t)))
}

/// The reply to `Events(after, wait_ms)` from `uid` seen as `viewer`.
pub async fn read(uid: u32, viewer: &Viewer, after: u64, wait_ms: u32) -> EventsReply {
    let hub = hub();
    let wait = Duration::from_millis(wait_ms.into()).min(MAX_WAIT);
    let sees = |e: &Event| visible(viewer, e);
    let place = (!wait.is_zero()).then(|| Waiting::enter(uid)).flatten();
    let page = match place {
        Some(_place) => hub.wait(after, PAGE, wait, sees).await,
        None => hub.after(after, PAGE, sees),
    };
    EventsReply {
        started_ms: hub.started_ms(),
        next: page.next,
        lost: page.lost,
        events: page.events.iter().map(EventRecord::from).collect(),
    }
}

/// Send the `Event(position, kind, team)` signal for each event posted, until the runtime ends.
pub async fn signals(conn: zbus::Connection) {
    let hub = hub();
    let mut after = hub.last();
    loop {
        let page = hub
            .wait(after, PAGE, Duration::from_secs(3600), |_| true)
            .await;
        for e in &page.events {
            let body = (e.seq, e.kind.as_str(), e.team.as_deref().unwrap_or(""));
            if let Err(err) = conn
                .emit_signal(
                    None::<&str>,
                    super::OBJECT_PATH,
                    super::BUS_NAME,
                    "Event",
                    &body,
                )
                .await
            {
                warn!("cannot send the Event signal for event {}: {err}", e.seq);
            }
        }
        after = page.next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_places_are_bounded_per_uid_and_given_back() {
        let uid = 4_000_123;
        let held: Vec<Waiting> = (0..WAITING_PER_UID)
            .map(|_| Waiting::enter(uid).expect("a place"))
            .collect();
        assert!(
            Waiting::enter(uid).is_none(),
            "a fifth waiting call of one uid"
        );
        assert!(Waiting::enter(uid + 1).is_some(), "another uid still waits");
        drop(held);
        assert!(Waiting::enter(uid).is_some(), "places come back on drop");
    }

    #[test]
    fn a_caller_reads_its_teams_and_the_hosts_events_only() {
        let teams = Viewer::Teams(["infer".to_string()].into());
        let e = |team: Option<&str>| Event::new(crate::events::Kind::DeviceOut, team, "x");
        assert!(visible(&teams, &e(Some("infer"))));
        assert!(!visible(&teams, &e(Some("train"))));
        assert!(
            visible(&teams, &e(None)),
            "a device's service state is everyone's"
        );
        assert!(!visible(
            &Viewer::Teams(Default::default()),
            &e(Some("infer"))
        ));
        assert!(visible(&Viewer::All, &e(Some("train"))));
    }
}
