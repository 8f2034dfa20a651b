//! Owner labels: which team owns which MIG GPU instance, kept in
//! `/var/lib/gpuctl/owners.json` because the driver keeps no such thing. An instance is named by
//! placement and profile (driver ids change across reboots and resets; the placement of a
//! re-created instance does not).

use crate::files::{write_atomic, FileError};
use crate::observe::{GpuInstance, GpuState};
use crate::paths::{Root, STATE_DIR};
use crate::profiles::Placement;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Owner labels file, under [`STATE_DIR`].
pub const OWNERS_FILE: &str = "owners.json";

/// One owner label: a GI named by placement and profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerLabel {
    /// Placement start.
    pub start: u32,
    /// Placement size.
    pub size: u32,
    /// GI profile id: a label never carries over to a different instance at the same place.
    pub profile_id: u32,
    /// Team.
    pub owner: String,
}

/// `/var/lib/gpuctl/owners.json`: labels by GPU UUID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnersFile {
    /// Format version (1).
    pub version: u32,
    /// Labels by GPU UUID.
    pub gpus: BTreeMap<String, Vec<OwnerLabel>>,
}

fn path(root: &Root) -> PathBuf {
    root.join(STATE_DIR).join(OWNERS_FILE)
}

fn invalid(p: &std::path::Path, e: serde_json::Error) -> FileError {
    FileError::new(p, std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The labels under `root`; an empty version-1 file when there is none yet.
pub fn load(root: &Root) -> Result<OwnersFile, FileError> {
    let p = path(root);
    match std::fs::read_to_string(&p) {
        Ok(t) => serde_json::from_str(&t).map_err(|e| invalid(&p, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(OwnersFile {
            version: 1,
            ..Default::default()
        }),
        Err(e) => Err(FileError::new(&p, e)),
    }
}

/// Write the labels under `root` (atomically).
pub fn save(root: &Root, o: &OwnersFile) -> Result<(), FileError> {
    let p = path(root);
    let text = serde_json::to_string_pretty(o).map_err(|e| invalid(&p, e))?;
    write_atomic(&p, (text + "\n").as_bytes())
}

/// Label the instances of `gpus` from the file under `root`, then drop labels of instances
/// that are gone (a label must not stick to a future instance someone else creates at that
/// place).
pub fn apply(root: &Root, gpus: &mut [GpuState]) -> Result<(), FileError> {
    let mut file = load(root)?;
    let before = file.clone();
    let seen: BTreeSet<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
    for g in gpus.iter_mut() {
        let Some(labels) = file.gpus.get_mut(&g.uuid) else {
            continue;
        };
        let insts: &mut [GpuInstance] = g.mig.as_mut().map_or(&mut [], |m| &mut m.instances);
        let names = |l: &OwnerLabel, i: &GpuInstance| {
            l.profile_id == i.profile_id
                && (l.start, l.size) == (i.placement.start, i.placement.size)
        };
        labels.retain(|l| insts.iter().any(|i| names(l, i)));
        for i in insts.iter_mut() {
            i.owner = labels.iter().find(|l| names(l, i)).map(|l| l.owner.clone());
        }
    }
    // GPUs that vanished (unplugged, or a different host booted from this disk) lose their
    // labels too; GPUs that fell off the bus come back with new instances anyway.
    file.gpus.retain(|u, l| seen.contains(u) && !l.is_empty());
    if file != before {
        save(root, &file)?;
    }
    Ok(())
}

/// Label the GI of profile `profile_id` at placement `p` on `gpu` as `owner`'s.
pub fn set(
    root: &Root,
    gpu: &str,
    profile_id: u32,
    p: Placement,
    owner: &str,
) -> Result<(), FileError> {
    let mut file = load(root)?;
    file.version = 1;
    let labels = file.gpus.entry(gpu.to_string()).or_default();
    labels.retain(|l| !(l.start == p.start && l.size == p.size));
    labels.push(OwnerLabel {
        start: p.start,
        size: p.size,
        profile_id,
        owner: owner.to_string(),
    });
    labels.sort_by_key(|l| (l.start, l.size));
    save(root, &file)
}
