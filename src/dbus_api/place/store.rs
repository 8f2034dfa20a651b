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
