//! gpuctld carrying out geometry that follows demand (docs/policy.md, "Layouts a GPU may
//! take"): gather one [`reslice::Snapshot`] (the GPUs as the last reconcile left them, which
//! devices have a lease or a process, the `--wait` queue), ask [`reslice::choose`], record each
//! switch (`/run/gpuctl/layouts.json`), say it, and reconcile towards it. The choice is the
//! pure function's; the reconcile is an ordinary one under the planner's rules, so a device
//! that turned busy meanwhile is still never destroyed.

use super::loans::{now_ms, track_idle, Seen};
use super::{place, Observe, Request, Trigger};
use crate::observe::GpuState;
use crate::placement::Lease;
use crate::policy::{GpuUse, Policy, TeamName};
use crate::reslice::state::{Chosen, InForce};
use crate::reslice::{self, Cause, Held, Unit, Waiter};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;
use tracing::{info, warn};

/// How often the tick looks while some entry allows layouts.
pub const TICK: Duration = Duration::from_secs(1);

/// How long a switch may take to show in the reconciled GPUs before the tick stops waiting
/// for it and decides without that GPU.
const SETTLE: Duration = Duration::from_secs(120);

/// Since when each MIG device or whole GPU of a GPU with layouts has had no lease and no
/// process, as this gpuctld has seen it.
static IDLE_SINCE: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// Whether any `[[gpu]]` entry allows other layouts; otherwise the tick sleeps.
pub fn wanted(policy: &Policy) -> bool {
    policy.gpus.iter().any(|a| a.layouts.is_some())
}

/// Whether `g` has what `want` asks for: MIG off for a whole-GPU use; MIG on with exactly the
/// profiles and owners of `want` otherwise.
fn settled(g: &GpuState, want: &GpuUse) -> bool {
    let mig = g.mig.as_ref();
    match want {
        GpuUse::Owned(_) | GpuUse::Shared(_) => mig.is_none_or(|m| !m.current && !m.pending),
        GpuUse::Mig(specs) => {
            let Some(m) = mig.filter(|m| m.current && m.pending) else {
                return false;
            };
            let mut want: Vec<(&str, &str)> = specs
                .iter()
                .flat_map(|s| std::iter::repeat_n((&*s.profile, &*s.owner), s.count as usize))
                .collect();
            let mut have: Vec<(&str, &str)> = m
                .instances
                .iter()
                .map(|i| (&*i.profile, i.owner.as_deref().unwrap_or("")))
                .collect();
            want.sort_unstable();
            have.sort_unstable();
            want == have
        }
    }
}

/// One GPU's devices as [`reslice::choose`] sees them, each with the ids of what a job opens
/// on it (its MIG devices, or the GPU); `None` when it holds an instance gpuctl did not make.
fn units_of(g: &GpuState, now: &GpuUse) -> Option<Vec<(Unit, Vec<String>)>> {
    let teams = match now {
        GpuUse::Owned(t) => vec![t.clone()],
        GpuUse::Shared(ts) => ts.clone(),
        GpuUse::Mig(specs) => {
            let m = g.mig.as_ref()?;
            return m
                .instances
                .iter()
                .map(|i| {
                    let owner: TeamName = i.owner.as_deref()?.parse().ok()?;
                    let full = i.compute.len() == 1 && i.compute[0].profile == i.profile;
                    // The split as the policy writes it, where the layout in force has this
                    // instance's; another one only matches nothing (destroyed, not kept).
                    let compute = if full {
                        Vec::new()
                    } else {
                        specs
                            .iter()
                            .find(|s| {
                                s.profile == i.profile
                                    && s.owner == owner
                                    && s.compute.len() == i.compute.len()
                            })
                            .map_or_else(|| vec!["?".to_string()], |s| s.compute.clone())
                    };
                    Some((
                        Unit::Mig {
                            profile: i.profile.clone(),
                            owner,
                            compute,
                            placement: i.placement,
                        },
                        i.compute.iter().map(|c| c.uuid.clone()).collect(),
                    ))
                })
                .collect();
        }
    };
    Some(vec![(Unit::Whole { teams }, vec![g.uuid.clone()])])
}

/// Whether the devices are busy, idle or unknown together: busy when one is, idle when all
/// are.
fn seen_all(ids: &[String], seen: &impl Fn(&str) -> Seen) -> Seen {
    let each: Vec<Seen> = ids.iter().map(|i| seen(i)).collect();
    if each.contains(&Seen::Busy) {
        Seen::Busy
    } else if each.iter().all(|s| *s == Seen::Idle) {
        Seen::Idle
    } else {
        Seen::Unknown
    }
}

/// The GPUs whose entries allow layouts, settled in the layout in force; `Err(gpu)` while a
/// switch gpuctld made less than [`SETTLE`] ago has not shown yet (nothing is decided then,
/// so that one waiting request does not re-slice two GPUs).
pub fn gpus(
    policy: &Policy,
    gpus: &[GpuState],
    in_force: &InForce,
    seen: &impl Fn(&str) -> Seen,
    idle: &mut BTreeMap<String, u64>,
    now_ms: u64,
) -> Result<Vec<reslice::Gpu>, u32> {
    let mut out = Vec::new();
    let mut ids: Vec<(String, Seen)> = Vec::new();
    let mut pending: Vec<(usize, Vec<Vec<String>>)> = Vec::new();
    for g in gpus {
        let Some(entry) = policy.gpus.iter().find(|a| a.selector.matches(g)) else {
            continue;
        };
        let (Some(ls), Some(model)) = (&entry.layouts, crate::policy::validate::model_of(g)) else {
            continue;
        };
        let Some(now) = policy.usage_for(g) else {
            continue;
        };
        let last = in_force.gpus.get(&g.index);
        if !settled(g, &now) {
            if last.is_some_and(|c| now_ms.saturating_sub(c.since_ms) < SETTLE.as_millis() as u64) {
                return Err(g.index);
            }
            continue;
        }
        let Some(units) = units_of(g, &now) else {
            continue;
        };
        let mut held = Vec::new();
        let mut dev_ids = Vec::new();
        for (unit, devs) in units {
            let s = seen_all(&devs, seen);
            ids.extend(devs.iter().map(|d| (d.clone(), s)));
            dev_ids.push(devs);
            held.push(Held {
                unit,
                idle_since_ms: None,
            });
        }
        pending.push((out.len(), dev_ids));
        out.push(reslice::Gpu {
            index: g.index,
            model,
            allowed: ls.all(&entry.usage),
            now: held,
            last_switch_ms: last.map(|c| c.since_ms),
            after: ls.after,
            hold: ls.hold,
        });
    }
    let since = track_idle(idle, &ids, now_ms);
    for (at, devs) in pending {
        for (h, ds) in out[at].now.iter_mut().zip(devs) {
            // Idle since the last of its devices went idle; busy or unknown while one is.
            h.idle_since_ms = ds
                .iter()
                .map(|d| since.get(d).copied())
                .collect::<Option<Vec<u64>>>()
                .and_then(|v| v.into_iter().max());
        }
    }
    Ok(out)
}

/// Busy, idle or unknown, for each device id: a lease, or a process in the usage collection
/// (`None`: no collection, so a device without a lease is unknown, never idle).
pub fn seer<'a>(
    leases: &'a [Lease],
    procs: Option<&'a HashMap<String, (usize, Option<String>)>>,
) -> impl Fn(&str) -> Seen + 'a {
    move |id: &str| {
        if leases.iter().any(|l| l.devices.iter().any(|d| d == id)) {
            return Seen::Busy;
        }
        match procs.map(|m| m.get(id).map_or(0, |p| p.0)) {
            Some(0) => Seen::Idle,
            Some(_) => Seen::Busy,
            None => Seen::Unknown,
        }
    }
}

/// One look: gather, choose, and carry out the switches. Holds the placement lock from the
/// look until the reconcile towards the new layouts is over, so that no job is placed on a
/// device the switch destroys.
pub async fn tick(cx: &super::loans::Cx<'_>, policy: &Policy, usage: Option<&crate::usage::Usage>) {
    let _guard = cx.placing.lock().await;
    let Some(view_gpus) = ({
        let state = cx.backend.state();
        state
            .last_report
            .as_ref()
            .and_then(|r| r.view.as_ref())
            .map(|v| v.gpus.clone())
    }) else {
        return;
    };
    let leases = match place::leases(cx.sd, cx.root).await {
        Ok(l) => l,
        Err(e) => {
            warn!("re-slice tick: cannot read the leases: {e}");
            return;
        }
    };
    let procs = usage
        .filter(|u| u.nvml_unavailable.is_none())
        .map(place::processes);
    let now = now_ms();
    let mut in_force = InForce::read(cx.root);
    let gpus = {
        let mut idle = IDLE_SINCE.lock().unwrap_or_else(|e| e.into_inner());
        match gpus(
            policy,
            &view_gpus,
            &in_force,
            &seer(&leases, procs.as_ref()),
            &mut idle,
            now,
        ) {
            Ok(g) => g,
            Err(_) => return,
        }
    };
    let waiting: Vec<Waiter> = {
        let queue = cx.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue
            .all_entries()
            .into_iter()
            .filter(|(_, e)| !e.returning)
            .filter_map(|(team, e)| {
                Some(Waiter {
                    ticket: e.ticket,
                    team: team.parse().ok()?,
                    profile: e.request.profile.clone(),
                })
            })
            .collect()
    };
    let snapshot = reslice::Snapshot {
        gpus,
        waiting,
        now_ms: now,
        local: super::lend::local_time((now / 1000) as i64),
    };
    let switches = reslice::choose(&snapshot);
    if switches.is_empty() {
        return;
    }
    let before: Vec<(u32, Option<Chosen>)> = switches
        .iter()
        .map(|s| (s.gpu, in_force.gpus.get(&s.gpu).cloned()))
        .collect();
    for s in &switches {
        in_force.gpus.insert(
            s.gpu,
            Chosen {
                layout: s.to.clone(),
                since_ms: now,
                reason: s.reason.clone(),
            },
        );
    }
    // Without the record the reconcile would not know the layout: no switch at all.
    if let Err(e) = in_force.write(cx.root) {
        warn!("cannot record the re-slice: {e}; layouts left as they are");
        return;
    }
    for s in &switches {
        let cause = match &s.cause {
            Cause::Waiting(w) => {
                // Its waiting reason until its next look places it (after the reconcile).
                let why = format!("GPU {} is being re-sliced for it: {}", s.gpu, s.reason);
                cx.queue
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .set_reasons(&w.team, &[(w.ticket, Some(why))]);
                "waiting"
            }
            Cause::Calendar => "calendar",
        };
        info!(
            gpuctl_action = "reslice",
            gpuctl_gpu = s.gpu,
            gpuctl_layout = %s.to,
            gpuctl_cause = cause,
            "{s}"
        );
        crate::metrics::counters().resliced(s.gpu, &s.to, cause);
    }
    let gpus: Vec<u32> = switches.iter().map(|s| s.gpu).collect();
    if let Some(r) = reconcile(cx, gpus).await {
        let now_in_force = in_force.apply(policy);
        let failed = failed(&switches, &now_in_force, &r);
        if !failed.is_empty() {
            roll_back(cx, &mut in_force, &switches, &before, &failed, &r).await;
        }
    }
    cx.queue_changed.notify_waiters();
}

/// Reconcile towards the layouts in force for a switch of `gpus`, and wait for its report
/// (`None` when gpuctld is stopping or it took longer than [`SETTLE`]).
async fn reconcile(cx: &super::loans::Cx<'_>, gpus: Vec<u32>) -> Option<super::ReconcileReport> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let sent = cx.backend.send(Request::Reconcile {
        reason: Trigger::Reslice(gpus),
        reply: Some(tx),
        observe: Observe::All,
    });
    if !sent {
        return None;
    }
    match tokio::time::timeout(SETTLE, rx).await {
        Ok(Ok(r)) => {
            if !r.errors.is_empty() {
                warn!("the reconcile after the re-slice: {}", r.errors.join("; "));
            }
            Some(r)
        }
        Ok(Err(_)) => None,
        Err(_) => {
            warn!(
                "the reconcile after the re-slice did not finish within {} s",
                SETTLE.as_secs()
            );
            None
        }
    }
}

/// The switched GPUs that a driver error left part-way: the run failed, none of its errors
/// may heal by retrying (a transient one is retried, and the switch then resumes), and the
/// GPU does not have its new layout (`policy`: the one with it in force).
fn failed(switches: &[reslice::Switch], policy: &Policy, r: &super::ReconcileReport) -> Vec<u32> {
    if r.errors.is_empty() || r.heal.transient {
        return Vec::new();
    }
    let view = r
        .view
        .as_ref()
        .map(|v| v.gpus.as_slice())
        .unwrap_or_default();
    switches
        .iter()
        .map(|s| s.gpu)
        .filter(|i| {
            let g = view.iter().find(|g| g.index == *i);
            !g.is_some_and(|g| policy.usage_for(g).is_some_and(|u| settled(g, &u)))
        })
        .collect()
}

/// Put back the layout each of `failed` had before its switch (counted from now, so its hold
/// keeps it from trying again at once), say so, and reconcile: the GPU is rebuilt in the last
/// layout that worked instead of staying part-way.
async fn roll_back(
    cx: &super::loans::Cx<'_>,
    in_force: &mut InForce,
    switches: &[reslice::Switch],
    before: &[(u32, Option<Chosen>)],
    failed: &[u32],
    r: &super::ReconcileReport,
) {
    let now = now_ms();
    let error = r.errors.first().map_or("", String::as_str);
    for s in switches.iter().filter(|s| failed.contains(&s.gpu)) {
        let last = before
            .iter()
            .find(|(g, _)| *g == s.gpu)
            .and_then(|(_, c)| c.as_ref());
        let back = last.map_or(crate::policy::DEFAULT_LAYOUT, |c| c.layout.as_str());
        let reason = format!(
            "GPU {} back to {back}: the switch to {} failed ({error})",
            s.gpu, s.to
        );
        in_force.gpus.insert(
            s.gpu,
            Chosen {
                layout: back.to_string(),
                since_ms: now,
                reason: reason.clone(),
            },
        );
        warn!(
            gpuctl_action = "reslice",
            gpuctl_gpu = s.gpu,
            gpuctl_layout = %back,
            gpuctl_cause = "rollback",
            "{reason}"
        );
        crate::metrics::counters().resliced(s.gpu, back, "rollback");
    }
    if let Err(e) = in_force.write(cx.root) {
        warn!("cannot record the roll-back of the re-slice: {e}");
        return;
    }
    reconcile(cx, failed.to_vec()).await;
}

#[cfg(test)]
mod tests {
    use super::super::tests::policy;
    use super::*;

    /// GPU 1 with three 1g.10gb slices of interns (default) or one 3g.40gb of train.
    const POLICY: &str = r#"version = 1
[teams.interns]
[teams.train]
[[gpu]]
index = [1]
mig = [{ profile = "1g.10gb", owner = "interns", count = 3 }]
reslice = { after = "10s", hold = "1m" }
[[gpu.layout]]
name = "train-3g"
mig = [{ profile = "3g.40gb", owner = "train", count = 1 }]
"#;

    /// An H100 with MIG on and `gis`: (profile, owner, MIG device UUID) at slices 0, 1, ...
    fn gpu(gis: &[(&str, &str, &str)]) -> GpuState {
        let id = |p: &str| if p == "3g.40gb" { 9 } else { 19 };
        let size = |p: &str| if p == "3g.40gb" { 4 } else { 1 };
        let mut at = 0;
        let instances: Vec<serde_json::Value> = gis
            .iter()
            .enumerate()
            .map(|(n, (p, o, u))| {
                let start = at;
                at += size(p);
                serde_json::json!({"id": n + 1, "profile_id": id(p), "profile": p,
                    "placement": {"start": start, "size": size(p)}, "owner": o,
                    "compute": [{"id": 0, "profile_id": 0, "profile": p,
                        "placement": {"start": 0, "size": size(p)}, "uuid": u}]})
            })
            .collect();
        serde_json::from_value(serde_json::json!({"index": 1, "uuid": "GPU-1",
            "name": "NVIDIA H100 80GB HBM3", "model": "H100-SXM5-80GB", "minor": 1,
            "memory_mib": 81559, "mig": {"current": true, "pending": true, "instances": instances}}))
        .unwrap()
    }

    fn three() -> GpuState {
        gpu(&[
            ("1g.10gb", "interns", "MIG-a"),
            ("1g.10gb", "interns", "MIG-b"),
            ("1g.10gb", "interns", "MIG-c"),
        ])
    }

    fn lease(dev: &str) -> Lease {
        Lease {
            unit: "gpuctl-run-1.scope".into(),
            team: "interns".into(),
            user: "bob".into(),
            uid: 1000,
            pid: 42,
            devices: vec![dev.into()],
            since: 0,
            gpu_memory: None,
            borrowed_from: None,
        }
    }

    #[test]
    fn a_leased_slice_is_busy_and_idle_ones_count_from_when_first_seen_idle() {
        let p = policy(POLICY);
        let procs: HashMap<String, (usize, Option<String>)> = HashMap::new();
        let leases = [lease("MIG-b")];
        let mut idle = BTreeMap::new();
        let see = seer(&leases, Some(&procs));
        let got = gpus(&p, &[three()], &InForce::default(), &see, &mut idle, 1_000).unwrap();
        assert_eq!(got.len(), 1);
        let g = &got[0];
        assert_eq!(
            (g.index, g.after, g.hold.as_secs()),
            (1, Duration::from_secs(10), 60)
        );
        let names: Vec<&str> = g.allowed.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["default", "train-3g"]);
        let since: Vec<Option<u64>> = g.now.iter().map(|h| h.idle_since_ms).collect();
        assert_eq!(since, [Some(1_000), None, Some(1_000)]);
        assert!(
            matches!(&g.now[0].unit, Unit::Mig { profile, owner, compute, .. }
            if profile == "1g.10gb" && &**owner == "interns" && compute.is_empty())
        );
        // Later, still idle: the first time stays; the leased one freed counts from now.
        let got = gpus(
            &p,
            &[three()],
            &InForce::default(),
            &seer(&[], Some(&procs)),
            &mut idle,
            9_000,
        )
        .unwrap();
        let since: Vec<Option<u64>> = got[0].now.iter().map(|h| h.idle_since_ms).collect();
        assert_eq!(since, [Some(1_000), Some(9_000), Some(1_000)]);
    }

    #[test]
    fn without_a_usage_collection_nothing_is_idle() {
        let p = policy(POLICY);
        let mut idle = BTreeMap::new();
        let got = gpus(
            &p,
            &[three()],
            &InForce::default(),
            &seer(&[], None),
            &mut idle,
            1_000,
        )
        .unwrap();
        assert!(got[0].now.iter().all(|h| h.idle_since_ms.is_none()));
        // A process on a slice is busy like a lease.
        let procs: HashMap<String, (usize, Option<String>)> =
            [("MIG-c".to_string(), (1, None))].into_iter().collect();
        let see = seer(&[], Some(&procs));
        assert_eq!((see("MIG-a"), see("MIG-c")), (Seen::Idle, Seen::Busy));
    }

    #[test]
    fn a_switch_not_yet_seen_holds_every_choice_until_it_settles_or_is_too_old() {
        let p = policy(POLICY);
        let chosen = |since_ms| InForce {
            gpus: [(
                1,
                Chosen {
                    layout: "train-3g".into(),
                    since_ms,
                    reason: String::new(),
                },
            )]
            .into_iter()
            .collect(),
        };
        let procs = HashMap::new();
        let see = seer(&[], Some(&procs));
        let mut idle = BTreeMap::new();
        let now = 1_000_000;
        // The GPU still has the default's three slices, the policy in force wants one 3g.
        let recent = chosen(now - 5_000);
        let p_in = recent.apply(&p);
        assert_eq!(
            gpus(&p_in, &[three()], &recent, &see, &mut idle, now).map(|g| g.len()),
            Err(1)
        );
        // Long past: decided without that GPU.
        let old = chosen(now - SETTLE.as_millis() as u64 - 1);
        let got = gpus(&old.apply(&p), &[three()], &old, &see, &mut idle, now).unwrap();
        assert!(got.is_empty());
        // Settled: the one 3g of train, with the switch's time as the last switch.
        let one = gpu(&[("3g.40gb", "train", "MIG-t")]);
        let got = gpus(&p_in, &[one], &recent, &see, &mut idle, now).unwrap();
        assert_eq!(got[0].last_switch_ms, Some(now - 5_000));
        assert!(
            matches!(&got[0].now[..], [Held { unit: Unit::Mig { owner, .. }, .. }] if &**owner == "train")
        );
    }

    #[test]
    fn a_waiting_3g_request_reslices_the_gpu_only_once_its_slices_are_idle_for_after() {
        let p = policy(POLICY);
        let procs = HashMap::new();
        let mut idle = BTreeMap::new();
        let waiter = Waiter {
            ticket: 7,
            team: "train".parse().unwrap(),
            profile: Some("3g.40gb".into()),
        };
        let mut choose_at = |leases: &[Lease], now: u64| {
            let g = gpus(
                &p,
                &[three()],
                &InForce::default(),
                &seer(leases, Some(&procs)),
                &mut idle,
                now,
            )
            .unwrap();
            reslice::choose(&reslice::Snapshot {
                gpus: g,
                waiting: vec![waiter.clone()],
                now_ms: now,
                local: super::super::lend::local_time((now / 1000) as i64),
            })
        };
        // A busy slice is in the way of the 3g (slices 0-3).
        assert!(choose_at(&[lease("MIG-a")], 1_000).is_empty());
        // Free since 2 s: not yet `after`.
        assert!(choose_at(&[], 2_000).is_empty());
        assert!(choose_at(&[], 11_999).is_empty());
        let s = choose_at(&[], 12_000);
        assert_eq!(s.len(), 1);
        assert_eq!(
            (
                s[0].gpu,
                s[0].to.as_str(),
                s[0].destroy.len(),
                s[0].create.len()
            ),
            (1, "train-3g", 3, 1)
        );
        assert_eq!(s[0].cause, Cause::Waiting(waiter.clone()));
    }

    /// The switch of GPU 1 to train-3g that a waiting plain request of train (a team with no
    /// device now) brings about, once the three slices have been idle for `after`.
    fn switch_for_plain_request() -> reslice::Switch {
        let p = policy(POLICY);
        let procs = HashMap::new();
        let mut idle = BTreeMap::new();
        let see = seer(&[], Some(&procs));
        gpus(&p, &[three()], &InForce::default(), &see, &mut idle, 1_000).unwrap();
        let g = gpus(&p, &[three()], &InForce::default(), &see, &mut idle, 11_000).unwrap();
        let waiter = Waiter {
            ticket: 3,
            team: "train".parse().unwrap(),
            profile: None,
        };
        let mut s = reslice::choose(&reslice::Snapshot {
            gpus: g,
            waiting: vec![waiter.clone()],
            now_ms: 11_000,
            local: super::super::lend::local_time(11),
        });
        assert_eq!(
            s.len(),
            1,
            "a plain request of a team with no device re-slices"
        );
        assert_eq!(s[0].cause, Cause::Waiting(waiter));
        s.remove(0)
    }

    #[test]
    fn a_switch_a_driver_error_left_part_way_is_rolled_back_and_no_other() {
        let s = switch_for_plain_request();
        let in_force = InForce {
            gpus: [(
                1,
                Chosen {
                    layout: "train-3g".into(),
                    since_ms: 11_000,
                    reason: s.reason.clone(),
                },
            )]
            .into_iter()
            .collect(),
        };
        let p = in_force.apply(&policy(POLICY));
        let report = |gpu: GpuState, error: Option<bool>| {
            let mut r = super::super::ReconcileReport {
                view: Some(super::super::reply::HostView {
                    teams: BTreeMap::new(),
                    gpus: vec![gpu],
                }),
                ..Default::default()
            };
            if let Some(transient) = error {
                r.error(
                    "gpu 1: create GI 3g.40gb: Insufficient Resources".into(),
                    transient,
                );
            }
            r
        };
        // Part-way: the three 1g destroyed, the 3g not created.
        let none = gpu(&[]);
        let train = gpu(&[("3g.40gb", "train", "MIG-t")]);
        let sw = std::slice::from_ref(&s);
        assert_eq!(failed(sw, &p, &report(none.clone(), Some(false))), [1]);
        // A transient error is retried (the switch resumes); no error: blocked, not failed.
        assert!(failed(sw, &p, &report(none.clone(), Some(true))).is_empty());
        assert!(failed(sw, &p, &report(none, None)).is_empty());
        // The switch done, whatever else failed.
        assert!(failed(sw, &p, &report(train, Some(false))).is_empty());
        // No view of the GPU after the run: not known to have its layout.
        let mut r = report(three(), Some(false));
        r.view = None;
        assert_eq!(failed(sw, &p, &r), [1]);
    }
}
