//! Persistent daemon state under `/var/lib/gpuctl`: the last applied slices (read by the
//! generator at boot) and the last good policy.

use crate::observe::SliceSpec;
use crate::policy::Policy;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

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
}

fn write_atomic(path: &Path, content: &str) -> Result<(), String> {
    crate::systemd::client::write_if_changed(path, content)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

impl AppliedState {
    /// Read a state file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let s: AppliedState =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if s.version != 1 {
            return Err(format!("{}: unknown version {}", path.display(), s.version));
        }
        Ok(s)
    }

    /// Write it atomically, so a crash never leaves the generator a torn file.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        write_atomic(path, &(text + "\n"))
    }
}

/// Save the last good policy.
pub fn save_last_good(path: &Path, policy: &Policy) -> Result<(), String> {
    let text = serde_json::to_string_pretty(policy).map_err(|e| e.to_string())?;
    write_atomic(path, &(text + "\n"))
}

/// Load the last good policy, if one was saved.
pub fn load_last_good(path: &Path) -> Option<Policy> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}
