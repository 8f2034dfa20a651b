//! Where a lease's detail lives: one record per member scope, `<LEASE_DIR>/<unit>.json`, in a
//! directory only root can open (mode 0700, files 0600, through [`crate::files::write_private`]).
//! A member scope's properties are readable by every local user, so they carry only an opaque
//! id (`crate::join::scope_name`, `crate::join::scope_description`).
//!
//! A record counts only while its scope is live ([`read`] is handed systemd's list), so it
//! cannot go stale: a record whose scope has ended is ignored and removed, and a live scope
//! without a record holds no lease. The record is written before the scope is started, so a
//! crash between the two leaves a record without a scope (ignored), never a running job whose
//! devices look free.

use crate::paths::{Root, LEASE_DIR};
use crate::placement::Lease;
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// How long a record without a live scope is kept: its scope may still be starting (the start
/// job's limit is 30 s, twice where systemd refuses `OOMPolicy=` on scopes).
pub const GRACE: Duration = Duration::from_secs(120);

/// The record of `unit`.
pub fn path(root: &Root, unit: &str) -> PathBuf {
    root.join(format!("{LEASE_DIR}/{unit}.json"))
}

/// Record `lease` (before its scope is started).
pub fn write(root: &Root, lease: &Lease) -> Result<(), crate::files::FileError> {
    crate::files::write_private(&path(root, &lease.unit), lease.record().as_bytes())
}

/// Remove the record of `unit` (its scope did not start, or lost its process at once).
pub fn remove(root: &Root, unit: &str) {
    if let Err(e) = crate::files::remove_if_exists(&path(root, unit)) {
        tracing::warn!(gpuctl_unit = unit, "lease record: {e}");
    }
}

/// The leases of the live member scopes `live` (name, description), as systemd lists them:
/// each scope's record, or, without one, a lease its description carries from an earlier
/// gpuctld. Records of no live scope older than [`GRACE`] at `now` (and temp files left by a
/// crash) are removed.
pub fn read(root: &Root, live: &[(String, String)], now: SystemTime) -> Vec<Lease> {
    let mut out = Vec::new();
    for (unit, description) in live {
        match std::fs::read_to_string(path(root, unit)) {
            Ok(text) => match Lease::from_record(unit, &text) {
                Some(l) => out.push(l),
                None => tracing::warn!(
                    gpuctl_unit = %unit,
                    "lease record {} is not {unit}'s lease: ignored",
                    path(root, unit).display()
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                out.extend(Lease::from_legacy_description(unit, description));
            }
            Err(e) => tracing::warn!(
                gpuctl_unit = %unit,
                "lease record {}: {e}",
                path(root, unit).display()
            ),
        }
    }
    let keep: HashSet<String> = live.iter().map(|(u, _)| format!("{u}.json")).collect();
    let Ok(dir) = std::fs::read_dir(root.join(LEASE_DIR)) else {
        return out;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let old = e
            .metadata()
            .ok()
            .filter(|m| m.is_file())
            .and_then(|m| m.modified().ok())
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age > GRACE);
        if old && !keep.contains(&name) {
            let _ = crate::files::remove_if_exists(&e.path());
        }
    }
    out
}

/// A borrowed job's processes, which run in the loans slice, are its team's: each takes the
/// borrower's team and the lender from its scope's lease, so usage, the ledger and `top` count
/// them to the team that ran them.
pub fn attribute_loans(root: &Root, usage: &mut crate::usage::Usage) {
    let fix = |p: &mut crate::usage::ProcessUsage| {
        if p.team.as_deref() != Some(crate::names::LOANS) {
            return;
        }
        let Some(unit) = p.unit.clone() else { return };
        let lease = std::fs::read_to_string(path(root, &unit))
            .ok()
            .and_then(|t| Lease::from_record(&unit, &t));
        if let Some(l) = lease.filter(|l| l.borrowed_from.is_some()) {
            p.team = Some(l.team);
            p.borrowed_from = l.borrowed_from;
        }
    };
    for g in &mut usage.gpus {
        g.processes.iter_mut().for_each(fix);
        for m in &mut g.mig_devices {
            m.processes.iter_mut().for_each(fix);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(unit: &str) -> Lease {
        Lease {
            unit: unit.into(),
            team: "interns".into(),
            user: "alice".into(),
            uid: 1000,
            pid: 812,
            devices: vec!["MIG-a".into()],
            since: 1,
            gpu_memory: None,
            borrowed_from: None,
        }
    }

    fn live(units: &[&str]) -> Vec<(String, String)> {
        units
            .iter()
            .map(|u| (u.to_string(), "gpuctl job x".to_string()))
            .collect()
    }

    #[test]
    fn a_lease_is_its_live_scope_and_its_record() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let (a, b) = ("gpuctl-run-0a.scope", "gpuctl-run-0b.scope");
        write(&root, &lease(a)).unwrap();
        write(&root, &lease(b)).unwrap();
        let now = SystemTime::now();
        // Read back as a restarted gpuctld would: only what systemd still lists.
        assert_eq!(read(&root, &live(&[a, b]), now), [lease(a), lease(b)]);
        assert_eq!(read(&root, &live(&[b]), now), [lease(b)]);
        // A live scope without a record is no lease.
        assert_eq!(read(&root, &live(&["gpuctl-run-0c.scope"]), now), []);
        // A record of no live scope is kept while its scope may be starting, then removed.
        assert!(path(&root, a).exists());
        assert_eq!(read(&root, &live(&[b]), now + GRACE * 2), [lease(b)]);
        assert!(!path(&root, a).exists() && path(&root, b).exists());
        // A record moved under another scope's name is not that scope's lease.
        std::fs::copy(path(&root, b), path(&root, a)).unwrap();
        assert_eq!(read(&root, &live(&[a]), now), []);
        remove(&root, b);
        assert!(!path(&root, b).exists());
    }

    #[test]
    fn a_borrowed_jobs_processes_count_to_its_team_with_the_lender_named() {
        use crate::usage::{GpuUsage, ProcessUsage, Usage};
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let (b, own) = ("gpuctl-run-0b.scope", "gpuctl-run-0c.scope");
        write(
            &root,
            &Lease {
                borrowed_from: Some("train".into()),
                ..lease(b)
            },
        )
        .unwrap();
        write(&root, &lease(own)).unwrap();
        let p = |unit: &str, team: &str| ProcessUsage {
            unit: Some(unit.into()),
            team: Some(team.into()),
            ..ProcessUsage::default()
        };
        let mut u = Usage {
            gpus: vec![GpuUsage {
                processes: vec![
                    p(b, "loans"),
                    p(own, "interns"),
                    p("gpuctl-run-0d.scope", "loans"),
                ],
                ..GpuUsage::default()
            }],
            ..Usage::default()
        };
        attribute_loans(&root, &mut u);
        let got: Vec<(Option<&str>, Option<&str>)> = u.gpus[0]
            .processes
            .iter()
            .map(|p| (p.team.as_deref(), p.borrowed_from.as_deref()))
            .collect();
        // Without a lease record a process stays where its cgroup puts it.
        assert_eq!(
            got,
            [
                (Some("interns"), Some("train")),
                (Some("interns"), None),
                (Some("loans"), None)
            ]
        );
    }

    #[test]
    fn a_scope_from_an_earlier_gpuctld_reads_its_description() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let u = "gpuctl-run-interns-812.scope";
        let d = "gpuctl: alice (uid 1000, pid 812) in team interns on MIG-a since @1";
        assert_eq!(
            read(&root, &[(u.to_string(), d.to_string())], SystemTime::now()),
            [lease(u)]
        );
    }
}
