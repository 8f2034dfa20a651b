//! gpuctld carrying out elastic shares (docs/policy.md, "Lending idle devices"): gather one
//! [`lending::Snapshot`] (every share device with how long it has been idle, the live leases,
//! the reclaims in flight, every team's waiting requests), ask [`lending::decide`], and do what
//! it says: take a loan back (record, journal, terminals, bus signal, SIGTERM), stop a borrower
//! whose grace is over, wake a waiter it found a lent device for, and give the caller its own
//! answer. The choice is the pure function's; nothing here picks a device.
//!
//! Two callers: a `Join` that found its own share full ([`consult`]), and gpuctld's loan tick
//! ([`run`]), which keeps taking loans back and stopping borrowers when nobody asks (a window
//! that closes, a grace that runs out, a restart mid-grace).

use super::lend::{self, Reclaim};
use super::place::{self, ShareDevice};
use crate::events::{Event, Kind};
use crate::lending::{self, Decision, Held, Reclaiming, Ticket, Why};
use crate::placement::Lease;
use crate::policy::Policy;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;
use tracing::{info, warn};

/// What carrying out a decision needs of gpuctld: its state, systemd, the host root, the
/// placement lock and the `--wait` queue.
pub struct Cx<'a> {
    /// The daemon's state and policy.
    pub backend: &'a dyn super::Backend,
    /// systemd.
    pub sd: &'a crate::systemd::Systemd,
    /// The host root.
    pub root: &'a crate::paths::Root,
    /// Held while placing (`Join`'s placement lock).
    pub placing: &'a tokio::sync::Mutex<()>,
    /// The `--wait` queue.
    pub queue: &'a Mutex<super::queue::Queues>,
    /// Wakes the waiters.
    pub queue_changed: &'a tokio::sync::Notify,
}

/// The ticket of a request that is not queued (a `Join` without `--wait` asking once).
pub const UNQUEUED: Ticket = Ticket::MAX;

/// How long an owner's job waits past its reclaim's grace for the borrower's scope to go and
/// its own to start.
pub const START_ALLOWANCE: Duration = Duration::from_secs(5);

/// Borrowers whose grace is over and whose stop went out.
static STOPPING: Mutex<std::collections::BTreeSet<String>> =
    Mutex::new(std::collections::BTreeSet::new());

/// Since when each share device has had no lease and no process, as far as this gpuctld has
/// seen: a device is first seen idle when gpuctld first looks at it, never earlier.
static IDLE_SINCE: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// One device as seen now: busy (a lease or a process on it), idle, or unknown (no usage
/// collection says whether a process runs on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// A lease or a process.
    Busy,
    /// Neither.
    Idle,
    /// No lease; processes unknown.
    Unknown,
}

/// Track idle-since: a busy device leaves the map, an idle one keeps the time it was first
/// seen idle, an unknown one keeps what it had (it is not idle from now on, nor busy).
/// Devices no longer seen are forgotten.
pub fn track_idle(
    map: &mut BTreeMap<String, u64>,
    seen: &[(String, Seen)],
    now_ms: u64,
) -> HashMap<String, u64> {
    map.retain(|id, _| seen.iter().any(|(d, _)| d == id));
    for (id, s) in seen {
        match s {
            Seen::Busy => {
                map.remove(id);
            }
            Seen::Idle => {
                map.entry(id.clone()).or_insert(now_ms);
            }
            Seen::Unknown => {}
        }
    }
    map.iter().map(|(k, v)| (k.clone(), *v)).collect()
}

/// Milliseconds since the epoch (loans, reclaims and queue tickets count in them).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Whether elastic shares are in play at all: a team lends, a loan runs, or a reclaim is
/// recorded. Otherwise nothing here reads anything.
pub fn in_play(policy: &Policy, leases: &[Lease], records: &[Reclaim]) -> bool {
    policy.teams.values().any(|t| t.lend.is_some())
        || leases.iter().any(|l| l.borrowed_from.is_some())
        || !records.is_empty()
}

/// What [`gather`] read, besides the snapshot: each team's share (to place on a lender's
/// device) and the records (to tell borrowers and clean up).
pub struct Gathered {
    /// The decision's input.
    pub snapshot: lending::Snapshot,
    /// Each team's share, by team.
    pub shares: BTreeMap<String, Vec<ShareDevice>>,
    /// The reclaims recorded.
    pub records: Vec<Reclaim>,
    /// The live leases.
    pub leases: Vec<Lease>,
}

/// Gather the snapshot; `None` while nothing is in play or before the first reconcile.
/// `me` is the calling request when it is not in the queue ([`UNQUEUED`]).
pub fn gather(
    cx: &Cx<'_>,
    policy: &Policy,
    leases: Vec<Lease>,
    usage: Option<&crate::usage::Usage>,
    me: Option<lending::Waiter>,
) -> Option<Gathered> {
    let records = lend::read(cx.root);
    if !in_play(policy, &leases, &records) {
        return None;
    }
    let shares: BTreeMap<String, Vec<ShareDevice>> = {
        let state = cx.backend.state();
        let view = state.last_report.as_ref()?.view.as_ref()?;
        view.teams
            .keys()
            .map(|t| (t.to_string(), place::share(view, t)))
            .collect()
    };
    let now = now_ms();
    let out = super::health::out_of_service();
    let procs = usage
        .filter(|u| u.nvml_unavailable.is_none())
        .map(place::processes);
    let mut devices: Vec<lending::Device> = Vec::new();
    let mut seen: Vec<(String, Seen)> = Vec::new();
    for (team, share) in &shares {
        for d in share {
            if let Some(dev) = devices.iter_mut().find(|x| x.id == d.id) {
                dev.owners.push(team.clone());
                continue;
            }
            let leased = leases.iter().any(|l| l.devices.contains(&d.id));
            let p = procs
                .as_ref()
                .map(|m| m.get(&d.id).cloned().unwrap_or((0, None)));
            seen.push((
                d.id.clone(),
                match (&p, leased) {
                    (_, true) | (Some((1.., _)), _) => Seen::Busy,
                    (Some(_), false) => Seen::Idle,
                    (None, false) => Seen::Unknown,
                },
            ));
            let foreign = match out.get(&d.id) {
                Some(o) => Some(format!("out of service ({})", o.reason)),
                None => p.and_then(|(_, f)| f),
            };
            devices.push(lending::Device {
                id: d.id.clone(),
                owners: vec![team.clone()],
                mig: d.mig,
                mps: d.mps.is_some(),
                idle_since_ms: None,
                foreign,
                profile: d.profile.clone(),
            });
        }
    }
    let idle = track_idle(
        &mut IDLE_SINCE.lock().unwrap_or_else(|e| e.into_inner()),
        &seen,
        now,
    );
    for d in &mut devices {
        d.idle_since_ms = idle.get(&d.id).copied();
    }
    let queue = cx.queue.lock().unwrap_or_else(|e| e.into_inner());
    let usage = queue.usage().clone();
    let entries = queue.all_entries();
    drop(queue);
    let mut waiting: Vec<lending::Waiter> = entries
        .into_iter()
        .filter(|(_, e)| !e.returning)
        .map(|(team, e)| lending::Waiter {
            ticket: e.ticket,
            team,
            uid: e.uid,
            gpus: e.request.gpus,
            device: e.request.device,
            profile: e.request.profile,
            borrow: e.borrow,
            passed_over: e.passed,
        })
        .collect();
    if let Some(me) = me.filter(|m| !waiting.iter().any(|w| w.ticket == m.ticket)) {
        waiting.push(me);
    }
    let snapshot = lending::Snapshot {
        now_ms: now,
        local: Some(lend::local_time((now / 1000) as i64)),
        teams: policy
            .teams
            .iter()
            .map(|(n, t)| (n.to_string(), lending::TeamRules::of(t)))
            .collect(),
        devices,
        leases: leases
            .iter()
            .map(|l| Held {
                unit: l.unit.clone(),
                team: l.team.clone(),
                uid: l.uid,
                devices: l.devices.clone(),
                since_ms: l.since.saturating_mul(1000),
                borrowed_from: l.borrowed_from.clone(),
            })
            .collect(),
        reclaims: records.iter().map(|r| r.reclaiming.clone()).collect(),
        waiting,
        usage,
    };
    Some(Gathered {
        snapshot,
        shares,
        records,
        leases,
    })
}

/// What the decision means for the caller.
#[derive(Debug, Default)]
pub struct Answer {
    /// Lent devices for it: the lender and the devices (the lender's share entries).
    pub borrowed: Option<(String, Vec<ShareDevice>)>,
    /// Why it waits, in words.
    pub reason: Option<String>,
    /// A loan is coming back for it: it waits at most this long from now.
    pub coming_back: Option<Duration>,
}

/// Decide on `g` and carry it out; the answer for `mine`.
pub async fn decide_and_act(
    cx: &Cx<'_>,
    conn: Option<&zbus::Connection>,
    g: Gathered,
    mine: Option<Ticket>,
) -> Answer {
    let decisions = lending::decide(&g.snapshot);
    let mut answer = Answer::default();
    let mut woken = false;
    let mut records = g.records;
    for d in decisions {
        match d {
            Decision::Place {
                ticket,
                devices,
                borrowed_from: Some(owner),
            } => {
                if Some(ticket) == mine {
                    let share = g.shares.get(&owner).map_or(&[][..], Vec::as_slice);
                    let devs: Vec<ShareDevice> = devices
                        .iter()
                        .filter_map(|id| share.iter().find(|s| s.id == *id).cloned())
                        .collect();
                    if devs.len() == devices.len() {
                        answer.borrowed = Some((owner, devs));
                    }
                } else if let Some(w) = g.snapshot.waiting.iter().find(|w| w.ticket == ticket) {
                    cx.queue
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .grant_one(&w.team, ticket);
                    woken = true;
                }
            }
            Decision::Place { .. } => {}
            Decision::Reclaim {
                unit,
                borrower,
                owner,
                devices,
                why,
                grace,
            } => {
                let uid = g.leases.iter().find(|l| l.unit == unit).map(|l| l.uid);
                let r = Reclaim {
                    reclaiming: Reclaiming {
                        unit,
                        devices,
                        why,
                        noticed_ms: now_ms(),
                        grace,
                    },
                    borrower,
                    owner,
                };
                take_back(cx, conn, &r, uid).await;
                records.push(r);
            }
            Decision::Stop { unit } => stop(cx, &unit, &records).await,
            Decision::Wait { ticket, reason, .. } if Some(ticket) == mine => {
                answer.reason = Some(reason)
            }
            Decision::Wait { .. } => {}
        }
    }
    if woken {
        cx.queue_changed.notify_waiters();
    }
    let now = now_ms();
    answer.coming_back = records
        .iter()
        .filter(|r| mine.is_some_and(|t| r.reclaiming.why == Why::Owner(t)))
        .map(|r| {
            let due = r.reclaiming.noticed_ms + r.reclaiming.grace.as_millis() as u64;
            Duration::from_millis(due.saturating_sub(now)) + START_ALLOWANCE
        })
        .max();
    clean_up(cx, &g.snapshot, &g.leases, &records);
    answer
}

/// Take a loan back: the record first (a restart mid-grace stops the borrower on time), then
/// the journal, the borrower's terminals, the bus signal and SIGTERM.
async fn take_back(cx: &Cx<'_>, conn: Option<&zbus::Connection>, r: &Reclaim, uid: Option<u32>) {
    let rc = &r.reclaiming;
    if let Err(e) = lend::write(cx.root, r) {
        // Without the record a restart would not know the notice went out: no notice yet.
        warn!(gpuctl_unit = %rc.unit, "cannot record the reclaim of {}: {e}", rc.unit);
        return;
    }
    let grace = rc.grace.as_secs();
    let why = match rc.why {
        Why::Owner(_) => format!("team {} needs it", r.owner),
        Why::WindowClosed => format!("team {}'s lending window closed", r.owner),
        Why::NotLent => format!("team {} no longer lends it to {}", r.owner, r.borrower),
    };
    let devices = rc.devices.join(",");
    warn!(
        gpuctl_action = "loan-reclaim",
        gpuctl_team = %r.borrower,
        gpuctl_owner = %r.owner,
        gpuctl_unit = %rc.unit,
        gpuctl_uid = %uid.map(|u| u.to_string()).unwrap_or_default(),
        gpuctl_gpu = %devices,
        gpuctl_grace_seconds = grace,
        "taking back {devices} from {} (team {}): {why}; SIGTERM now, stopped in {grace} s",
        rc.unit,
        r.borrower
    );
    let text = format!(
        "Your borrowed GPU job {} (team {}) on {devices}: {why}. It gets SIGTERM now and is \
         stopped in {grace} s; save your work.",
        rc.unit, r.borrower
    );
    crate::events::post(Event {
        uid,
        unit: Some(rc.unit.clone()),
        device: Some(devices.clone()),
        ..Event::new(Kind::LoanReclaim, Some(&r.borrower), text.clone())
    });
    if let Some(uid) = uid {
        let root = cx.root.clone();
        let _ =
            tokio::task::spawn_blocking(move || crate::real::tty::tell(&root, uid, &text)).await;
    }
    if let Some(conn) = conn {
        let body = (
            rc.unit.as_str(),
            r.borrower.as_str(),
            r.owner.as_str(),
            grace,
        );
        if let Err(e) = conn
            .emit_signal(
                None::<&str>,
                super::OBJECT_PATH,
                super::BUS_NAME,
                "LoanReclaimed",
                &body,
            )
            .await
        {
            warn!("cannot send LoanReclaimed for {}: {e}", rc.unit);
        }
    }
    crate::metrics::counters().reclaim(&r.borrower, &r.owner, why_label(rc.why));
    if let Err(e) = cx
        .sd
        .kill_unit(&rc.unit, nix::sys::signal::Signal::SIGTERM as i32)
        .await
    {
        warn!(gpuctl_unit = %rc.unit, "SIGTERM to {}: {e}", rc.unit);
    }
}

fn why_label(w: Why) -> &'static str {
    match w {
        Why::Owner(_) => "owner",
        Why::WindowClosed => "window",
        Why::NotLent => "not-lent",
    }
}

/// The grace is over: SIGKILL (SIGTERM went out with the notice) and stop the scope, in the
/// background so that no placement waits on the stop job.
async fn stop(cx: &Cx<'_>, unit: &str, records: &[Reclaim]) {
    // Decided again at every look until the scope is gone: carried out (and counted) once.
    if !STOPPING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(unit.to_string())
    {
        return;
    }
    let r = records.iter().find(|r| r.reclaiming.unit == unit);
    warn!(
        gpuctl_action = "loan-stop",
        gpuctl_unit = %unit,
        gpuctl_team = %r.map(|r| r.borrower.as_str()).unwrap_or(""),
        gpuctl_owner = %r.map(|r| r.owner.as_str()).unwrap_or(""),
        "the grace of borrowed job {unit} is over: stopping it"
    );
    if let Some(r) = r {
        crate::metrics::counters().overran(&r.borrower, &r.owner);
        let text = format!(
            "The grace of your borrowed GPU job {unit} (team {}) is over: it is stopped now; \
             team {} has its device back.",
            r.borrower, r.owner
        );
        crate::events::post(Event {
            unit: Some(unit.to_string()),
            device: Some(r.reclaiming.devices.join(",")),
            ..Event::new(Kind::LoanStop, Some(&r.borrower), text)
        });
    }
    if let Err(e) = cx
        .sd
        .kill_unit(unit, nix::sys::signal::Signal::SIGKILL as i32)
        .await
    {
        warn!(gpuctl_unit = %unit, "SIGKILL to {unit}: {e}");
    }
    let (sd, unit) = (cx.sd.clone(), unit.to_string());
    tokio::spawn(async move {
        if let Err(e) = sd.stop_unit_within(&unit, Duration::from_secs(10)).await {
            warn!(gpuctl_unit = %unit, "stopping {unit}: {e}");
        }
    });
}

/// Forget the reclaims that are over: the borrower's lease is gone, and the request it was
/// taken back for (if any) is placed or gone.
fn clean_up(cx: &Cx<'_>, s: &lending::Snapshot, leases: &[Lease], records: &[Reclaim]) {
    for r in records {
        let rc = &r.reclaiming;
        if leases.iter().any(|l| l.unit == rc.unit) {
            continue;
        }
        let waits = match rc.why {
            Why::Owner(t) => s.waiting.iter().any(|w| w.ticket == t && t != UNQUEUED),
            _ => false,
        };
        if !waits {
            let held_ms = now_ms().saturating_sub(rc.noticed_ms);
            info!(
                gpuctl_action = "loan-returned",
                gpuctl_unit = %rc.unit,
                gpuctl_team = %r.borrower,
                gpuctl_owner = %r.owner,
                "loan of {} to {} is back with {} ({held_ms} ms after the notice)",
                rc.devices.join(","),
                r.borrower,
                r.owner
            );
            lend::remove(cx.root, &rc.unit);
            STOPPING
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&rc.unit);
        }
    }
}

/// How often the loan tick looks while something is in play.
pub const TICK: Duration = Duration::from_millis(500);

/// The policy when the loan tick has work: a team lends, or a reclaim or a borrowed lease is
/// recorded (a gpuctld restarted after its policy stopped lending still ends those).
pub fn wanted(cx: &Cx<'_>) -> Option<Policy> {
    let policy = cx.backend.policy().ok()?;
    let lends = policy.teams.values().any(|t| t.lend.is_some());
    (lends || !lend::read(cx.root).is_empty() || loans_recorded(cx.root)).then_some(policy)
}

/// The loan tick: decide with nobody asking, so that windows close, graces end and idle
/// devices start counting while no request comes. `usage` is a collection taken before, outside
/// the placement lock (NVML may be slow).
pub async fn tick(
    cx: &Cx<'_>,
    conn: &zbus::Connection,
    policy: &Policy,
    usage: Option<&crate::usage::Usage>,
) {
    let _guard = cx.placing.lock().await;
    let leases = match place::leases(cx.sd, cx.root).await {
        Ok(l) => l,
        Err(e) => {
            warn!("loan tick: cannot read the leases: {e}");
            return;
        }
    };
    if let Some(g) = gather(cx, policy, leases, usage, None) {
        decide_and_act(cx, Some(conn), g, None).await;
    }
}

/// Whether any lease record is a borrowed job's (without asking systemd which scopes live).
fn loans_recorded(root: &crate::paths::Root) -> bool {
    let Ok(dir) = std::fs::read_dir(root.join(crate::paths::LEASE_DIR)) else {
        return false;
    };
    dir.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(unit) = name.strip_suffix(".json") else {
            return false;
        };
        std::fs::read_to_string(e.path())
            .ok()
            .and_then(|t| Lease::from_record(unit, &t))
            .is_some_and(|l| l.borrowed_from.is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_idle_from_when_it_was_first_seen_idle_and_busy_forgets_it() {
        let mut m = BTreeMap::new();
        let s = |v: &[(&str, Seen)]| -> Vec<(String, Seen)> {
            v.iter().map(|(a, b)| (a.to_string(), *b)).collect()
        };
        let got = track_idle(&mut m, &s(&[("a", Seen::Idle), ("b", Seen::Busy)]), 1000);
        assert_eq!(got.get("a"), Some(&1000));
        assert_eq!(got.get("b"), None);
        // Still idle later: the first time stays.
        let got = track_idle(&mut m, &s(&[("a", Seen::Idle), ("b", Seen::Idle)]), 5000);
        assert_eq!(got.get("a"), Some(&1000));
        assert_eq!(got.get("b"), Some(&5000));
        // Unknown keeps what was known and never starts a count.
        let got = track_idle(
            &mut m,
            &s(&[
                ("a", Seen::Unknown),
                ("b", Seen::Busy),
                ("c", Seen::Unknown),
            ]),
            9000,
        );
        assert_eq!(got.get("a"), Some(&1000));
        assert_eq!(got.get("b"), None);
        assert_eq!(got.get("c"), None);
        // Busy again, then idle: counted from the new idle start.
        track_idle(&mut m, &s(&[("a", Seen::Busy)]), 10_000);
        let got = track_idle(&mut m, &s(&[("a", Seen::Idle)]), 12_000);
        assert_eq!(got.get("a"), Some(&12_000));
        // A device no longer seen is forgotten.
        assert_eq!(got.len(), 1);
    }
}
