//! The `Usage` and `Metrics` methods of `org.gpuctl.Agent1`, and the dcgm-exporter job map
//! gpuctld keeps after each reconcile.
//!
//! Both methods (and `Idle`) are open to every user (the bus policy lets them through), but
//! per-process detail (user, uid, pid, command, unit) only of the teams the caller may read
//! ([`Viewer`]: root and the `[host] admin-group` all, a member its own teams); the rest is
//! counted per team and device. Each serves the one [`Collector`] of the process, so a flood of calls
//! costs one NVML collection per interval; collections run on a blocking thread, never on the
//! runtime thread that serves the bus.

pub use super::collector::usage;
use super::{AgentState, Backend};
use crate::join::nss::Nss;
use crate::join::Viewer;
use crate::metrics::{self, cgroup, Snapshot};
use crate::paths::Root;
use crate::systemd::{mps, Systemd};
use crate::usage::collect::Collector;
use crate::usage::{Owners, Usage};
use std::sync::Mutex;
use zbus::fdo;

/// Output formats of `Metrics(s format)`.
pub const FORMATS: &[&str] = &["openmetrics", "prometheus-text"];

/// [`usage`] with each process the idle rules flag marked (`ProcessUsage::idle`), as the
/// `Usage` call serves it to `gpuctl top`.
pub async fn usage_marked(backend: &dyn Backend, root: &Root) -> fdo::Result<Usage> {
    let mut u = usage(backend, root).await?;
    crate::idle::mark(&mut u, &backend.idle().holders);
    Ok(u)
}

/// Whose per-process detail the sender of `hdr` may read. Decided once per (uid, groups) per
/// usage interval: the rule may ask NSS (LDAP) once per team, and a scraper calls every few
/// seconds.
pub async fn viewer(
    backend: &dyn Backend,
    conn: &zbus::Connection,
    hdr: &zbus::message::Header<'_>,
) -> fdo::Result<Viewer> {
    type Seen = Vec<((u32, Option<Vec<u32>>), std::time::Instant, Viewer)>;
    static SEEN: Mutex<Seen> = Mutex::new(Vec::new());
    const MAX_SEEN: usize = 256;
    let caller = super::join::bus_caller(conn, hdr)
        .await
        .map_err(|e| fdo::Error::AccessDenied(format!("who is calling: {e}")))?
        .caller;
    let key = (caller.uid, caller.gids.clone());
    let ttl = Collector::interval_from_env();
    let lock = || SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(v) = lock()
        .iter()
        .find(|(k, at, _)| *k == key && at.elapsed() < ttl)
    {
        return Ok(v.2.clone());
    }
    let policy = backend.policy().ok();
    let v =
        tokio::task::spawn_blocking(move || crate::join::viewer(&caller, policy.as_ref(), &Nss))
            .await
            .map_err(|e| fdo::Error::Failed(format!("authorization task failed: {e}")))?;
    let mut seen = lock();
    seen.retain(|(k, at, _)| *k != key && at.elapsed() < ttl);
    if seen.len() < MAX_SEEN {
        seen.push((key, std::time::Instant::now(), v.clone()));
    }
    Ok(v)
}

/// [`usage_marked`] with the live placement leases on their devices, as `viewer` may read it
/// ([`Usage::redact`]). Leases systemd cannot list now are left out (the devices show none).
pub async fn usage_for(
    backend: &dyn Backend,
    sd: &Systemd,
    root: &Root,
    viewer: &Viewer,
) -> fdo::Result<Usage> {
    let mut u = usage_marked(backend, root).await?;
    for l in super::place::leases(sd, root).await.unwrap_or_default() {
        add_lease(&mut u, l);
    }
    for (id, o) in super::health::out_of_service() {
        let out = crate::usage::DeviceOut {
            reason: o.reason,
            since: o.since,
            by: o.by,
        };
        u.mark_out(&id, out);
    }
    u.redact(|t| viewer.sees(t));
    Ok(u)
}

/// Put a lease on each of its devices in `u`.
pub fn add_lease(u: &mut Usage, l: crate::placement::Lease) {
    for d in &l.devices {
        u.add_lease(
            d,
            crate::usage::DeviceLease {
                team: l.team.clone(),
                user: Some(l.user.clone()),
                uid: Some(l.uid),
                unit: Some(l.unit.clone()),
                since: l.since,
                gpu_memory: l.gpu_memory,
            },
        );
    }
}

/// Hide the unit, user and pids of every holder `viewer` may not read.
pub fn redact_idle(holders: &mut [crate::idle::IdleHolder], viewer: &Viewer) {
    for h in holders.iter_mut().filter(|h| !viewer.sees(Some(&h.team))) {
        h.redact();
    }
}

/// Keep only the leases whose holder `viewer` may know: a lease names a user, uid and scope, so
/// another team's are not for a non-member's `gpuctl status` (`gpuctl top` shows their devices
/// as held, without the holder).
pub fn redact_leases(leases: &mut Vec<super::reply::v1::LeaseStatus>, viewer: &Viewer) {
    leases.retain(|l| viewer.sees(Some(&l.team)));
}

/// How long one usage collection is served (the idle sampler adds it to its own interval).
pub fn collector_interval() -> std::time::Duration {
    Collector::interval_from_env()
}

/// Everything a scrape shows, encoded in `format` (one of [`FORMATS`]), with per-process labels
/// (`user`, `unit` of the idle series) only where `viewer` may read them.
pub async fn metrics(
    backend: &dyn Backend,
    sd: &Systemd,
    root: &Root,
    format: &str,
    viewer: &Viewer,
) -> fdo::Result<String> {
    if !FORMATS.contains(&format) {
        return Err(fdo::Error::InvalidArgs(format!(
            "unknown metrics format {format:?} (one of {})",
            FORMATS.join(", ")
        )));
    }
    let usage = usage(backend, root).await?;
    let sh = backend.state();
    let teams: Vec<String> = sh
        .policy
        .as_ref()
        .map(|p| p.teams.keys().map(|t| t.to_string()).collect())
        .unwrap_or_default();
    let mps_list: Vec<(String, String)> = sh
        .last_report
        .as_ref()
        .and_then(|r| r.view.as_ref())
        .map(|v| {
            v.teams
                .iter()
                .flat_map(|(t, tv)| tv.mps.keys().map(move |i| (i.clone(), t.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let mut mps = Vec::new();
    for (inst, team) in mps_list {
        let up = sd
            .unit_state(&mps::unit(&inst))
            .await
            .ok()
            .flatten()
            .is_some_and(|s| s.active == "active");
        mps.push((inst, team, up));
    }
    let root2 = root.clone();
    let cgroups = tokio::task::spawn_blocking(move || {
        teams
            .into_iter()
            .map(|t| {
                let c = cgroup::read(&root2, &t);
                (t, c)
            })
            .collect()
    })
    .await
    .map_err(|e| fdo::Error::Failed(format!("cgroup read failed: {e}")))?;
    let mut idle = backend.idle().holders;
    redact_idle(&mut idle, viewer);
    let snap = Snapshot {
        usage,
        teams: cgroups,
        mps,
        policy_valid: sh.policy_error.is_none() && sh.policy.is_some(),
        last_good_in_force: sh.policy_error.is_some() && sh.policy_origin == Some("last-good"),
        last_converged: sh.last_report.as_ref().map(|r| r.converged()),
        idle,
        leases: super::place::leases(sd, root).await.ok(),
        ledger_users: match viewer {
            Viewer::All => None,
            Viewer::Teams(t) => Some(t.clone()),
        },
        health: health_metrics(&backend.health()),
        layouts: layouts(&sh, root),
    };
    Ok(match format {
        "prometheus-text" => metrics::encode_prometheus_text(&snap, metrics::counters()),
        _ => metrics::encode_openmetrics(&snap, metrics::counters()),
    })
}

/// Each GPU's layout, where its entry allows several, for the metrics.
fn layouts(sh: &super::AgentState, root: &crate::paths::Root) -> Vec<(u32, String, Option<u64>)> {
    let (Some(p), Some(v)) = (
        &sh.policy,
        sh.last_report.as_ref().and_then(|r| r.view.as_ref()),
    ) else {
        return Vec::new();
    };
    let in_force = crate::reslice::state::InForce::read(root);
    let now = super::loans::now_ms() / 1000;
    v.gpus
        .iter()
        .filter_map(|g| {
            let l = super::layout_status(p, g, &in_force)?;
            Some((g.index, l.name, l.since.map(|t| now.saturating_sub(t))))
        })
        .collect()
}

/// The `Health` reply as the metrics carry it.
pub fn health_metrics(h: &super::reply::HealthReply) -> Vec<metrics::DeviceHealth> {
    h.devices
        .iter()
        .map(|d| {
            let mut conditions: Vec<String> = d
                .conditions
                .iter()
                .filter_map(|c| serde_json::to_value(c).ok())
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            if d.slowdown {
                conditions.push("slowdown".into());
            }
            metrics::DeviceHealth {
                device: d.uuid.clone(),
                gpu: d.gpu_index,
                in_service: d.in_service,
                xids: d.xids.clone(),
                quarantines: d.quarantines,
                resets: d.resets,
                conditions,
            }
        })
        .collect()
}

/// After a reconcile: bring `$GPUCTL_HPC_JOB_MAPPING_DIR` (when set) in line with the owners.
pub fn sync_hpc_job_map(shared: &Mutex<AgentState>, root: &Root) {
    let Some(dir) = std::env::var_os(metrics::hpc::ENV_DIR).filter(|d| !d.is_empty()) else {
        return;
    };
    let (owners, gpu_of) = {
        let sh = shared.lock().unwrap_or_else(|e| e.into_inner());
        let Some(v) = sh.last_report.as_ref().and_then(|r| r.view.as_ref()) else {
            return;
        };
        let gpu_of = v
            .teams
            .values()
            .flat_map(|t| &t.mig_devices)
            .map(|m| (m.uuid.clone(), m.gpu_index))
            .collect();
        (Owners::from(v), gpu_of)
    };
    let dir = root.join(std::path::PathBuf::from(dir));
    if let Err(e) = metrics::hpc::sync(&dir, &metrics::hpc::files(&owners, &gpu_of)) {
        tracing::warn!("dcgm job map {}: {e}", dir.display());
    }
}
