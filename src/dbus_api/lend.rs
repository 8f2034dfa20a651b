//! gpuctld's side of elastic shares ([`crate::lending`], docs/policy.md "Lending idle
//! devices"): what the bus handler needs to carry out [`crate::lending::decide`]'s reclaims
//! across a restart, and the local time its lend windows are read in.
//!
//! A reclaim in flight is one root-only record per borrower's scope under
//! [`RECLAIM_DIR`] (mode 0700, files 0600, through [`crate::files::write_private`]), written
//! before the borrower is told: a gpuctld that restarts mid-grace reads back when the notice
//! went out and stops the borrower on time, neither early nor never.

use crate::lending::{LocalTime, Reclaiming, Ticket, Why};
use crate::paths::{Root, RECLAIM_DIR};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// A loan being taken back, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Reclaim {
    /// What [`crate::lending::decide`] reads back.
    pub reclaiming: Reclaiming,
    /// The borrowing team (its members are told).
    pub borrower: String,
    /// The lender.
    pub owner: String,
}

/// The record's JSON form.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    unit: String,
    borrower: String,
    owner: String,
    devices: Vec<String>,
    why: WhyRecord,
    noticed_ms: u64,
    grace_ms: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum WhyRecord {
    Owner(Ticket),
    WindowClosed,
    NotLent,
}

impl Reclaim {
    /// The record (one line of JSON).
    pub fn record(&self) -> String {
        let r = &self.reclaiming;
        let rec = Record {
            unit: r.unit.clone(),
            borrower: self.borrower.clone(),
            owner: self.owner.clone(),
            devices: r.devices.clone(),
            why: match r.why {
                Why::Owner(t) => WhyRecord::Owner(t),
                Why::WindowClosed => WhyRecord::WindowClosed,
                Why::NotLent => WhyRecord::NotLent,
            },
            noticed_ms: r.noticed_ms,
            grace_ms: u64::try_from(r.grace.as_millis()).unwrap_or(u64::MAX),
        };
        let mut s = serde_json::to_string(&rec).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The reclaim of `unit` from its record; `None` for anything else (another scope's
    /// record, no devices, not a record).
    pub fn from_record(unit: &str, text: &str) -> Option<Reclaim> {
        let r: Record = serde_json::from_str(text).ok()?;
        (r.unit == unit && !r.devices.is_empty()).then(|| Reclaim {
            reclaiming: Reclaiming {
                unit: r.unit,
                devices: r.devices,
                why: match r.why {
                    WhyRecord::Owner(t) => Why::Owner(t),
                    WhyRecord::WindowClosed => Why::WindowClosed,
                    WhyRecord::NotLent => Why::NotLent,
                },
                noticed_ms: r.noticed_ms,
                grace: Duration::from_millis(r.grace_ms),
            },
            borrower: r.borrower,
            owner: r.owner,
        })
    }
}

/// The record of the borrower's scope `unit`.
pub fn path(root: &Root, unit: &str) -> PathBuf {
    root.join(format!("{RECLAIM_DIR}/{unit}.json"))
}

/// Record `r` (before the borrower is told).
pub fn write(root: &Root, r: &Reclaim) -> Result<(), crate::files::FileError> {
    crate::files::write_private(&path(root, &r.reclaiming.unit), r.record().as_bytes())
}

/// Remove the record of `unit` (its loan is over and its request placed or gone).
pub fn remove(root: &Root, unit: &str) {
    if let Err(e) = crate::files::remove_if_exists(&path(root, unit)) {
        tracing::warn!(gpuctl_unit = unit, "reclaim record: {e}");
    }
}

/// Every reclaim recorded; a file that is no record is skipped with a warning (and left for
/// root to look at).
pub fn read(root: &Root) -> Vec<Reclaim> {
    let Ok(dir) = std::fs::read_dir(root.join(RECLAIM_DIR)) else {
        return Vec::new();
    };
    let mut out: Vec<Reclaim> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let unit = name.strip_suffix(".json").filter(|u| !u.starts_with('.'))?;
            let text = std::fs::read_to_string(e.path()).ok()?;
            let r = Reclaim::from_record(unit, &text);
            if r.is_none() {
                tracing::warn!(
                    "reclaim record {} is not {unit}'s: ignored",
                    e.path().display()
                );
            }
            r
        })
        .collect();
    out.sort_by(|a, b| a.reclaiming.unit.cmp(&b.reclaiming.unit));
    out
}

extern "C" {
    // POSIX; the libc crate declares it for Windows only.
    fn tzset();
}

/// The local time at `epoch_secs` in the host's zone, read again each time (`tzset`), so a
/// zone changed with `timedatectl` counts from the next decision. A time the C library cannot
/// convert counts as UTC: never "no local time", which would leave every `when` window open.
pub fn local_time(epoch_secs: i64) -> LocalTime {
    LocalTime::at(epoch_secs, utc_offset(epoch_secs).unwrap_or(0))
}

/// The host zone's offset east of UTC at `epoch_secs` (`tm_gmtoff`, daylight saving time
/// included).
fn utc_offset(epoch_secs: i64) -> Option<i64> {
    let t: nix::libc::time_t = epoch_secs;
    // SAFETY: `tm` is plain data that localtime_r fills; both pointers are valid for the call.
    let mut tm: nix::libc::tm = unsafe { std::mem::zeroed() };
    let ok = unsafe {
        tzset();
        !nix::libc::localtime_r(&t, &mut tm).is_null()
    };
    ok.then_some(tm.tm_gmtoff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reclaim(unit: &str, why: Why) -> Reclaim {
        Reclaim {
            reclaiming: Reclaiming {
                unit: unit.into(),
                devices: vec!["GPU-1".into()],
                why,
                noticed_ms: 1_764_783_110_123,
                grace: Duration::from_millis(5_500),
            },
            borrower: "interns".into(),
            owner: "train".into(),
        }
    }

    #[test]
    fn a_reclaim_survives_its_record_and_a_restart() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let rs = [
            reclaim("gpuctl-run-a.scope", Why::Owner(7)),
            reclaim("gpuctl-run-b.scope", Why::WindowClosed),
            reclaim("gpuctl-run-c.scope", Why::NotLent),
        ];
        for r in &rs {
            write(&root, r).unwrap();
        }
        assert_eq!(read(&root), rs);
        // Root only: another user cannot even list which scopes are being stopped.
        use std::os::unix::fs::PermissionsExt;
        let dir = std::fs::metadata(root.join(RECLAIM_DIR)).unwrap();
        assert_eq!(dir.permissions().mode() & 0o777, 0o700);
        remove(&root, "gpuctl-run-b.scope");
        assert_eq!(read(&root), [rs[0].clone(), rs[2].clone()]);
        // Another scope's record and anything else are none.
        let text = rs[0].record();
        assert_eq!(Reclaim::from_record("gpuctl-run-x.scope", &text), None);
        for t in ["", "{}", &text[..text.len() / 2]] {
            assert_eq!(Reclaim::from_record("gpuctl-run-a.scope", t), None, "{t}");
        }
        std::fs::write(path(&root, "gpuctl-run-z.scope"), "{}").unwrap();
        assert_eq!(read(&root).len(), 2);
    }

    #[test]
    fn local_time_is_the_c_librarys() {
        for t in [0i64, 951_782_400, 1_764_783_110, 1_780_000_000] {
            let tt: nix::libc::time_t = t;
            let mut tm: nix::libc::tm = unsafe { std::mem::zeroed() };
            assert!(!unsafe { nix::libc::localtime_r(&tt, &mut tm) }.is_null());
            let want = LocalTime {
                weekday: ((tm.tm_wday + 6) % 7) as u8,
                minute_of_day: (tm.tm_hour * 60 + tm.tm_min) as u16,
            };
            assert_eq!(local_time(t), want, "{t}");
        }
    }
}
