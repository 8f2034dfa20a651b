//! The MIG apply journal: what a transaction is doing to which GPU, written before every
//! mutating MIG step so that the next apply, after a crash or a failed step, knows the geometry
//! to fall back to.
//!
//! On a real host it lives in `/var/lib/gpuctl/journal.json` (under the root; see
//! [`FileJournal`]); written atomically (temp file, fsync, rename, fsync of the directory). A
//! simulated host keeps it in memory ([`MemoryJournal`]). The format is documented in
//! `docs/nvml.md`.

use super::EffectError;
use crate::observe::GpuState;
use crate::paths::{Root, STATE_DIR};
use crate::plan::ActionKind;
use crate::profiles::Placement;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Journal file name under [`STATE_DIR`].
pub const JOURNAL_FILE: &str = "journal.json";
/// Current format version.
pub const JOURNAL_VERSION: u32 = 1;

/// A compute instance as recorded in the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CiRecord {
    /// CI profile id.
    pub profile_id: u32,
    /// CI profile name.
    pub profile: String,
    /// Placement in the GI's compute slices.
    pub placement: Placement,
}

/// A GPU instance as recorded in the journal: enough to create it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GiRecord {
    /// GI profile id.
    pub profile_id: u32,
    /// GI profile name.
    pub profile: String,
    /// Placement in memory slices.
    pub placement: Placement,
    /// Owner label.
    pub owner: Option<String>,
    /// Compute instances.
    pub cis: Vec<CiRecord>,
}

/// The mutating step in progress (or the last one started).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Step number within the journal's life, from 1.
    pub seq: u64,
    /// The action.
    pub action: ActionKind,
}

/// One GPU's open transaction.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuTxn {
    /// NVML index when the transaction began (for people; the key is the UUID).
    pub index: u32,
    /// The instances before the transaction: what a roll-back restores.
    pub last_good: Vec<GiRecord>,
    /// The instances the transaction aims at.
    pub target: Vec<GiRecord>,
    /// The step started last; `None` before the first.
    pub step: Option<Step>,
    /// Why the transaction stopped, when a step failed.
    pub failed: Option<String>,
}

/// The journal: open transactions by GPU UUID.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Journal {
    /// Format version.
    pub version: u32,
    /// Steps started so far.
    pub seq: u64,
    /// Open transactions by GPU UUID.
    pub gpus: BTreeMap<String, GpuTxn>,
}

/// The GIs of an observed GPU as journal records.
pub fn records_of(g: &GpuState) -> Vec<GiRecord> {
    g.mig
        .iter()
        .flat_map(|m| &m.instances)
        .map(|gi| GiRecord {
            profile_id: gi.profile_id,
            profile: gi.profile.clone(),
            placement: gi.placement,
            owner: gi.owner.clone(),
            cis: gi
                .compute
                .iter()
                .map(|c| CiRecord {
                    profile_id: c.profile_id,
                    profile: c.profile.clone(),
                    placement: c.placement,
                })
                .collect(),
        })
        .collect()
}

/// Where the journal is kept.
pub trait JournalStore {
    /// The journal left by an earlier apply, if any.
    fn load(&mut self) -> Result<Option<Journal>, EffectError>;
    /// Persist the journal (durably, before the step it announces runs).
    fn save(&mut self, j: &Journal) -> Result<(), EffectError>;
    /// No transaction is open any more.
    fn clear(&mut self) -> Result<(), EffectError>;
}

/// A journal in memory (simulated hosts, tests).
#[derive(Debug, Default, Clone)]
pub struct MemoryJournal {
    /// The saved journal.
    pub journal: Option<Journal>,
    /// How many times it was saved.
    pub saves: usize,
}

impl JournalStore for MemoryJournal {
    fn load(&mut self) -> Result<Option<Journal>, EffectError> {
        Ok(self.journal.clone())
    }
    fn save(&mut self, j: &Journal) -> Result<(), EffectError> {
        self.journal = Some(j.clone());
        self.saves += 1;
        Ok(())
    }
    fn clear(&mut self) -> Result<(), EffectError> {
        self.journal = None;
        Ok(())
    }
}

/// `/var/lib/gpuctl/journal.json` under a root.
#[derive(Debug, Clone)]
pub struct FileJournal {
    path: PathBuf,
}

impl FileJournal {
    /// The journal of the host at `root`.
    pub fn new(root: &Root) -> Self {
        FileJournal {
            path: root.join(STATE_DIR).join(JOURNAL_FILE),
        }
    }

    /// The file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

/// The error of a state file: the path, and what went wrong with it.
pub(super) fn file_err(path: &std::path::Path, e: impl std::fmt::Display) -> EffectError {
    EffectError::Other {
        what: path.display().to_string(),
        message: e.to_string(),
    }
}

impl JournalStore for FileJournal {
    fn load(&mut self) -> Result<Option<Journal>, EffectError> {
        match std::fs::read_to_string(&self.path) {
            Ok(t) => {
                let j: Journal = serde_json::from_str(&t).map_err(|e| file_err(&self.path, e))?;
                if j.version != JOURNAL_VERSION {
                    return Err(file_err(
                        &self.path,
                        format!(
                            "journal version {} (this gpuctl reads {JOURNAL_VERSION})",
                            j.version
                        ),
                    ));
                }
                Ok(Some(j))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(file_err(&self.path, e)),
        }
    }

    fn save(&mut self, j: &Journal) -> Result<(), EffectError> {
        let text = serde_json::to_string_pretty(j).map_err(|e| file_err(&self.path, e))?;
        Ok(crate::files::write_atomic(
            &self.path,
            (text + "\n").as_bytes(),
        )?)
    }

    fn clear(&mut self) -> Result<(), EffectError> {
        crate::files::remove_if_exists(&self.path)?;
        Ok(())
    }
}
