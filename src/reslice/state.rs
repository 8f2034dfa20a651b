//! The layouts gpuctld switched GPUs to (`/run/gpuctl/layouts.json`): read at every reconcile
//! to turn the policy into the one in force, written once per switch. A GPU not listed has its
//! entry's own (default) layout and has not switched since boot.

use crate::paths::{Root, LAYOUTS};
use crate::policy::{Policy, DEFAULT_LAYOUT};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One GPU's switch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chosen {
    /// The layout's name (`default` after a switch back).
    pub layout: String,
    /// When gpuctld switched to it (ms since the epoch): the hold counts from here.
    pub since_ms: u64,
    /// Why, in words ([`super::Switch::reason`]).
    pub reason: String,
}

/// Every GPU's switch, by NVML index.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InForce {
    /// By NVML index.
    pub gpus: BTreeMap<u32, Chosen>,
}

impl InForce {
    /// The file's switches; none when it is missing or unreadable (a warning says which): the
    /// GPUs then go back to their default layouts under the usual rules, never past a busy
    /// instance.
    pub fn read(root: &Root) -> InForce {
        let path = root.join(LAYOUTS);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(
                    "{}: {e}; every GPU back to its default layout",
                    path.display()
                );
                InForce::default()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => InForce::default(),
            Err(e) => {
                tracing::warn!("{}: {e}", path.display());
                InForce::default()
            }
        }
    }

    /// Write the file (one atomic replace).
    pub fn write(&self, root: &Root) -> Result<(), crate::files::FileError> {
        let text = serde_json::to_vec_pretty(self).unwrap_or_default();
        crate::files::write_atomic(&root.join(LAYOUTS), &text)
    }

    /// `p` with these switches in force: each GPU's layout name, where its entry still allows
    /// that layout (a policy edit that drops it sends the GPU back to the default).
    pub fn apply(&self, p: &Policy) -> Policy {
        let mut out = p.clone();
        out.layouts_in_force = self
            .gpus
            .iter()
            .filter(|(_, c)| c.layout != DEFAULT_LAYOUT)
            .map(|(i, c)| (*i, c.layout.clone()))
            .collect();
        out
    }
}
