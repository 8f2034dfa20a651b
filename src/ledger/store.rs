//! The ledger on disk: one file per UTC day, `/var/lib/gpuctl/ledger/YYYY-MM-DD.json`.
//!
//! Why one file per day, each replaced whole through [`files::write_atomic`] after every
//! sample: only the current day's file is ever rewritten, so a write costs one day's lines
//! (bounded by holders × devices), never the history; the rename is atomic, so a crash or power
//! loss mid-write leaves the previous version (the state one interval earlier) and at worst a
//! stray temp file, which readers skip and [`Store::clean`] removes. An append log with a
//! checksum per record would write less per interval but needs compaction and a torn-tail rule;
//! a day file is read back with one parser and nothing to repair.
//!
//! Bounded: the files together stay under a byte cap ([`DEFAULT_CAP_BYTES`]); the oldest days
//! are deleted first, never the day being written. A file that does not parse (a disk fault) is
//! reported and skipped: that day is lost, not the ledger.

use super::{day_name, parse_day, Day, Figures, Key};
use crate::files::{self, FileError};
use crate::paths::{Root, STATE_DIR};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Directory of the day files, under [`STATE_DIR`].
pub const LEDGER_SUBDIR: &str = "ledger";
/// Cap on all day files together: about 90 days of 50 users each on every one of 56 devices
/// fit (docs/performance.md, "Ledger").
pub const DEFAULT_CAP_BYTES: u64 = 64 << 20;
/// Format version written in each file.
const VERSION: u32 = 1;

/// A day file.
#[derive(Debug, Serialize, Deserialize)]
struct DayFile {
    version: u32,
    day: String,
    /// Unix ms of the last sample credited (resumes the ledger after a restart).
    #[serde(default)]
    last_at_ms: Option<u64>,
    /// team, user, device, kind, held ms, active ms, unknown ms, memory byte-s, reclaimed ms,
    /// stops[, borrowed ms, lent ms]: a positional line keeps the file small
    /// (docs/performance.md).
    rows: Vec<Row>,
}

/// A line: the loan figures only where one is counted, so a day without loans reads as it did
/// before lending (and an older gpuctl still reads it).
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Row {
    Plain(String, String, String, String, u64, u64, u64, f64, u64, u64),
    Loans(
        String,
        String,
        String,
        String,
        u64,
        u64,
        u64,
        f64,
        u64,
        u64,
        u64,
        u64,
    ),
}

/// Why the ledger could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Writing failed.
    #[error(transparent)]
    Write(#[from] FileError),
    /// Reading failed.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a ledger day (damaged, too large, another version).
    #[error("{path}: not a ledger day file: {why}")]
    Bad {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

/// The day files of one host.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    cap_bytes: u64,
}

impl Store {
    /// The store under `root`'s `/var/lib/gpuctl/ledger`, capped at [`DEFAULT_CAP_BYTES`].
    pub fn new(root: &Root) -> Store {
        Store::at(root.join(STATE_DIR).join(LEDGER_SUBDIR), DEFAULT_CAP_BYTES)
    }

    /// A store in `dir` capped at `cap_bytes`.
    pub fn at(dir: PathBuf, cap_bytes: u64) -> Store {
        Store { dir, cap_bytes }
    }

    fn path(&self, day: u64) -> PathBuf {
        self.dir.join(format!("{}.json", day_name(day)))
    }

    /// Replace the file of `day` (with the last sample's time), then delete the oldest days
    /// while the files exceed the cap. The directory is made root-only (0700): per-user figures
    /// reach other users only through `Report`, which applies the bus API's rules.
    pub fn save(&self, day: &Day, last_at_ms: Option<u64>) -> Result<(), StoreError> {
        use std::os::unix::fs::DirBuilderExt;
        if !self.dir.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)
                .map_err(|e| FileError::new(&self.dir, e))?;
        }
        files::write_atomic(&self.path(day.day), &encode(day, last_at_ms))?;
        self.trim(day.day);
        Ok(())
    }

    /// The stored day numbers, oldest first, with their file sizes.
    pub fn days(&self) -> Vec<(u64, u64)> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<(u64, u64)> = rd
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let day = parse_day(name.strip_suffix(".json")?)?;
                let meta = e.metadata().ok().filter(|m| m.is_file())?;
                Some((day, meta.len()))
            })
            .collect();
        out.sort_unstable();
        out
    }

    fn trim(&self, keep: u64) {
        let days = self.days();
        let mut total: u64 = days.iter().map(|d| d.1).sum();
        for (day, size) in days {
            if total <= self.cap_bytes {
                break;
            }
            if day == keep {
                continue;
            }
            if files::remove_if_exists(&self.path(day)).is_ok() {
                tracing::info!(
                    gpuctl_action = "ledger",
                    "ledger: removed day {} to stay under {} bytes",
                    day_name(day),
                    self.cap_bytes
                );
                total -= size;
            }
        }
    }

    /// Remove temp files a write interrupted by a crash left behind (`.NAME.PID.SEQ.tmp`).
    pub fn clean(&self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.ends_with(".tmp") {
                let _ = files::remove_if_exists(&e.path());
            }
        }
    }

    /// The stored `day`, with its last sample time; `None` when there is no file.
    pub fn load(&self, day: u64) -> Result<Option<(Day, Option<u64>)>, StoreError> {
        let path = self.path(day);
        match read_bounded(&path, self.cap_bytes) {
            Ok(bytes) => decode(&path, &bytes).map(Some),
            Err(StoreError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The newest readable day and its last sample time, to resume from after a restart;
    /// unreadable files are reported and passed over.
    pub fn latest(&self) -> (Option<Day>, Option<u64>) {
        for (day, _) in self.days().into_iter().rev() {
            match self.load(day) {
                Ok(Some((d, at))) => return (Some(d), at),
                Ok(None) => {}
                Err(e) => tracing::warn!(gpuctl_action = "ledger", "ledger: {e}"),
            }
        }
        (None, None)
    }

    /// The days from `from` to `to` (inclusive) that are stored, and what could not be read.
    pub fn range(&self, from: u64, to: u64) -> (Vec<Day>, Vec<String>) {
        let mut days = Vec::new();
        let mut problems = Vec::new();
        for (day, _) in self.days() {
            if day < from || day > to {
                continue;
            }
            match self.load(day) {
                Ok(Some((d, _))) => days.push(d),
                Ok(None) => {}
                Err(e) => problems.push(e.to_string()),
            }
        }
        (days, problems)
    }
}

fn read_bounded(path: &Path, cap: u64) -> Result<Vec<u8>, StoreError> {
    use std::io::Read;
    let read = |source| StoreError::Read {
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(path).map_err(read)?;
    let mut bytes = Vec::new();
    f.take(cap + 1).read_to_end(&mut bytes).map_err(read)?;
    if bytes.len() as u64 > cap {
        return Err(StoreError::Bad {
            path: path.to_path_buf(),
            why: format!("larger than the cap of {cap} bytes"),
        });
    }
    Ok(bytes)
}

/// The file's bytes for `day`.
pub fn encode(day: &Day, last_at_ms: Option<u64>) -> Vec<u8> {
    let rows = day
        .figures
        .iter()
        .map(|(k, f)| {
            let (t, u, d, kind) = (
                k.team.clone(),
                k.user.clone(),
                k.device.clone(),
                k.kind.clone(),
            );
            let (h, a, un, m, r, st) = (
                f.held_ms,
                f.active_ms,
                f.unknown_ms,
                f.memory_byte_s,
                f.reclaimed_ms,
                f.stops,
            );
            if f.borrowed_ms == 0 && f.lent_ms == 0 {
                Row::Plain(t, u, d, kind, h, a, un, m, r, st)
            } else {
                Row::Loans(t, u, d, kind, h, a, un, m, r, st, f.borrowed_ms, f.lent_ms)
            }
        })
        .collect();
    let file = DayFile {
        version: VERSION,
        day: day_name(day.day),
        last_at_ms,
        rows,
    };
    let mut out = serde_json::to_vec(&file).unwrap_or_default();
    out.push(b'\n');
    out
}

fn decode(path: &Path, bytes: &[u8]) -> Result<(Day, Option<u64>), StoreError> {
    let bad = |why: String| StoreError::Bad {
        path: path.to_path_buf(),
        why,
    };
    let f: DayFile = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    if f.version != VERSION {
        return Err(bad(format!(
            "version {} (this gpuctl reads {VERSION})",
            f.version
        )));
    }
    let day = parse_day(&f.day).ok_or_else(|| bad(format!("bad day {:?}", f.day)))?;
    let figures = f
        .rows
        .into_iter()
        .map(|row| {
            let (team, user, device, kind, h, a, u, m, r, s, borrowed_ms, lent_ms) = match row {
                Row::Plain(t, us, d, k, h, a, u, m, r, s) => (t, us, d, k, h, a, u, m, r, s, 0, 0),
                Row::Loans(t, us, d, k, h, a, u, m, r, s, b, l) => {
                    (t, us, d, k, h, a, u, m, r, s, b, l)
                }
            };
            let key = Key {
                team,
                user,
                device,
                kind,
            };
            let f = Figures {
                held_ms: h,
                active_ms: a,
                unknown_ms: u,
                memory_byte_s: m,
                reclaimed_ms: r,
                stops: s,
                borrowed_ms,
                lent_ms,
            };
            (key, f)
        })
        .collect();
    Ok((Day { day, figures }, f.last_at_ms))
}
