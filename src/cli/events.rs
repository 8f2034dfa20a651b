//! `gpuctl events [--follow] [--json] [-n N]`: the caller's events (bus `Events`): idle
//! warnings and stops, queued jobs placed, loans taken back, devices out of and back in service,
//! of the caller's teams and the host's (root: all). docs/events.md.

use super::shell::with_agent;
use crate::dbus_api::reply::{EventRecord, EventsReply};
use clap::Args;
use std::io::Write;

/// Arguments of `gpuctl events`.
#[derive(Debug, Args)]
#[command(
    after_long_help = "Events kinds: idle-warn, idle-stop, queue-placed, loan-reclaim, \
loan-stop, device-out, device-back, device-stop. A caller sees the events of the teams it may \
use and the host's own (a device's service state); root and the admin group see all. gpuctld \
keeps the last 1,024 events of its current run; the journal keeps them all \
(journalctl -u gpuctld GPUCTL_ACTION=idle-warn). With --follow, gpuctl waits for new events \
and keeps waiting across a restart of gpuctld. --json prints one JSON object per line.

Exit status: 0; 6 gpuctld not running; 2 other failure."
)]
pub struct EventsArgs {
    /// Keep printing events as they happen (until interrupted).
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// One JSON object per event and line (fields of the bus reply's events).
    #[arg(long)]
    pub json: bool,
    /// Print at most the last N events kept before new ones (default: all; 10 with --follow;
    /// 0: only new ones).
    #[arg(long, short = 'n', value_name = "N")]
    pub lines: Option<usize>,
}

/// How long one call waits for a first new event.
const WAIT_MS: u32 = 30_000;
/// The shortest round of a follower that got nothing.
const MIN_ROUND: std::time::Duration = std::time::Duration::from_secs(1);

/// One event in words: its UTC time, kind, team (or `host`), user, and the message.
pub fn render(e: &EventRecord) -> String {
    let who = match (&e.user, e.uid) {
        (Some(u), _) => format!(" {u}"),
        (None, Some(uid)) => format!(" uid {uid}"),
        (None, None) => String::new(),
    };
    format!(
        "{} {} {}{who}: {}",
        crate::placement::utc(e.at_ms / 1000),
        e.kind,
        e.team.as_deref().unwrap_or("host"),
        e.message
    )
}

fn line(e: &EventRecord, json: bool) -> String {
    if json {
        serde_json::to_string(e).unwrap_or_default()
    } else {
        render(e)
    }
}

/// Where a reader is: the gpuctld start its position belongs to, and the position.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Position {
    started_ms: u64,
    next: u64,
}

impl Position {
    /// The position to ask from, and the lines to print of `r`; `backlog` keeps only the last
    /// N of a first read.
    fn take(&mut self, r: &EventsReply, backlog: Option<usize>) -> Vec<EventRecord> {
        let mut events = r.events.clone();
        if let Some(n) = backlog {
            events.drain(..events.len().saturating_sub(n));
        }
        self.started_ms = r.started_ms;
        self.next = r.next;
        events
    }
}

/// Whether a failed call is worth trying again when following: gpuctld gone or restarting,
/// or the caller over its rate.
fn transient(e: &zbus::Error) -> bool {
    match e {
        zbus::Error::MethodError(name, _, _) => matches!(
            name.as_str(),
            "org.freedesktop.DBus.Error.NoReply"
                | "org.freedesktop.DBus.Error.ServiceUnknown"
                | "org.freedesktop.DBus.Error.NameHasNoOwner"
                | "org.freedesktop.DBus.Error.LimitsExceeded"
                | "org.freedesktop.DBus.Error.Disconnected"
        ),
        zbus::Error::InputOutput(_) => true,
        _ => false,
    }
}

/// Run `gpuctl events`.
pub fn run(args: &EventsArgs) -> i32 {
    let mut pos = Position::default();
    // The backlog limit applies to the first read only.
    let mut backlog = args.lines.or(args.follow.then_some(10));
    let mut told = false;
    loop {
        let r = with_agent("Events", async |p| {
            loop {
                // A restarted gpuctld is read from its start; the first call reads what is kept.
                let wait = if args.follow && backlog.is_none() {
                    WAIT_MS
                } else {
                    0
                };
                let asked = std::time::Instant::now();
                let text = match p.events(pos.next, wait).await {
                    Ok(t) => t,
                    Err(e) if args.follow && transient(&e) => return Ok(Some(e.to_string())),
                    Err(e) => return Err(e),
                };
                let r: EventsReply = serde_json::from_str(&text)
                    .map_err(|e| zbus::Error::Failure(format!("unexpected reply: {e}")))?;
                if pos.started_ms != 0 && r.started_ms != pos.started_ms {
                    // Another gpuctld: ask again from its first event.
                    pos = Position {
                        started_ms: r.started_ms,
                        next: 0,
                    };
                    continue;
                }
                if r.lost {
                    eprintln!("gpuctl: some events were forgotten before they were read");
                }
                let mut out = std::io::stdout().lock();
                for e in pos.take(&r, backlog.take()) {
                    if writeln!(out, "{}", line(&e, args.json)).is_err() {
                        // The reader went away (a closed pipe): done.
                        return Ok(None);
                    }
                }
                let _ = out.flush();
                if !args.follow {
                    return Ok(None);
                }
                told = false;
                if wait > 0 && r.events.is_empty() && asked.elapsed() < MIN_ROUND {
                    // gpuctld answered at once (this uid has its most waiting calls already):
                    // ask again later, not in a loop.
                    tokio::time::sleep(MIN_ROUND).await;
                }
            }
        });
        let why = match r {
            Ok(None) => return super::exit::OK,
            Ok(Some(why)) => why,
            Err(f) if args.follow && f.code == super::exit::NO_DAEMON => f.message,
            Err(f) => return f.report(),
        };
        if !told {
            eprintln!("gpuctl: {why}; trying again");
            told = true;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, kind: &str, team: Option<&str>) -> EventRecord {
        EventRecord {
            seq,
            at_ms: 1_764_756_000_000 + seq * 1000,
            kind: kind.into(),
            team: team.map(str::to_string),
            user: Some("alice".into()),
            uid: Some(1001),
            unit: Some("nb.scope".into()),
            device: Some("0".into()),
            message: format!("m{seq}"),
        }
    }

    #[test]
    fn an_event_reads_as_one_line_with_time_kind_team_and_user() {
        assert_eq!(
            render(&rec(1, "idle-warn", Some("research"))),
            "2025-12-03T10:00:01Z idle-warn research alice: m1"
        );
        let mut host = rec(2, "device-out", None);
        host.user = None;
        host.uid = None;
        assert_eq!(render(&host), "2025-12-03T10:00:02Z device-out host: m2");
        let json = line(&rec(3, "idle-stop", Some("r")), true);
        let back: EventRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, rec(3, "idle-stop", Some("r")));
        assert!(!json.contains('\n'));
    }

    #[test]
    fn the_backlog_keeps_the_last_n_of_the_first_read() {
        let r = EventsReply {
            started_ms: 7,
            next: 3,
            lost: false,
            events: vec![rec(1, "a", None), rec(2, "b", None), rec(3, "c", None)],
        };
        let mut p = Position::default();
        let shown: Vec<u64> = p.take(&r, Some(2)).iter().map(|e| e.seq).collect();
        assert_eq!(shown, [2, 3]);
        assert_eq!(
            p,
            Position {
                started_ms: 7,
                next: 3
            }
        );
        let mut p = Position::default();
        assert!(p.take(&r, Some(0)).is_empty(), "-n 0: only new ones");
        assert_eq!(p.next, 3, "and from after the kept ones");
        let mut p = Position::default();
        assert_eq!(p.take(&r, None).len(), 3);
    }
}
