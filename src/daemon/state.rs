//! Persistent daemon state under `/var/lib/gpuctl`: the last applied slices and outside fences
//! (read by the generator at boot) and the last good policy.

use crate::files::{write_if_changed, FileError};
use crate::observe::{Fence, SliceSpec};
use crate::policy::Policy;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Slices of the last fully successful reconcile (host path).
pub const STATE_FILE: &str = "/var/lib/gpuctl/slices.json";
/// The last policy that loaded without errors (host path).
pub const LAST_GOOD: &str = "/var/lib/gpuctl/last-good/policy.json";

/// What `slices.json` holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AppliedState {
    /// Format version, 1.
    pub version: u32,
    /// Team slices by team.
    pub slices: BTreeMap<String, SliceSpec>,
    /// The fences outside the team shares (`user.slice`, `machine.slice`), so that they hold
    /// from boot on, before gpuctld's first reconcile; empty when none is closed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fences: BTreeMap<String, Fence>,
}

/// A state file that cannot be read, parsed or written.
#[derive(Debug, Error)]
pub enum StateError {
    /// Reading or writing the file failed.
    #[error(transparent)]
    File(#[from] FileError),
    /// The file is not valid JSON of the expected shape.
    #[error("{}: {source}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// serde's words, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A format version this gpuctl does not read.
    #[error("{}: unknown version {version}", path.display())]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        version: u32,
    },
}

fn format_err(path: &Path) -> impl FnOnce(serde_json::Error) -> StateError + '_ {
    move |source| StateError::Format {
        path: path.to_path_buf(),
        source,
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), StateError> {
    let text = serde_json::to_string_pretty(value).map_err(format_err(path))?;
    write_if_changed(path, &(text + "\n"))?;
    Ok(())
}

impl AppliedState {
    /// Read a state file.
    pub fn load(path: &Path) -> Result<Self, StateError> {
        let text = std::fs::read_to_string(path).map_err(|e| FileError::new(path, e))?;
        let s: AppliedState = serde_json::from_str(&text).map_err(format_err(path))?;
        if s.version != 1 {
            return Err(StateError::Version {
                path: path.to_path_buf(),
                version: s.version,
            });
        }
        Ok(s)
    }

    /// Write it atomically, so a crash never leaves the generator a torn file.
    pub fn save(&self, path: &Path) -> Result<(), StateError> {
        write_json(path, self)
    }
}

/// Save the last good policy.
pub fn save_last_good(path: &Path, policy: &Policy) -> Result<(), StateError> {
    write_json(path, policy)
}

/// Load the last good policy, if one was saved and still passes the value rules (it is read back
/// without the parser, so a corrupted or hand-edited copy is checked again; a bad one is
/// ignored, with a warning, rather than applied). Read like a policy file: regular files only,
/// without blocking, size capped.
pub fn load_last_good(path: &Path) -> Option<Policy> {
    let bytes = crate::policy::load::read_policy_file(path).ok()?;
    let p: Policy = serde_json::from_slice(&bytes).ok()?;
    match crate::policy::caps::check_policy(&p) {
        Ok(()) => Some(p),
        Err(e) => {
            tracing::warn!("{}: ignored: {e}", path.display());
            None
        }
    }
}
