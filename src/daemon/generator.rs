//! `gpuctl-generator`: a systemd generator that puts team slices in place at boot.
//!
//! systemd runs generators before it loads any unit, so a service with `Slice=gpu-infer.slice`
//! that starts early in boot already finds `gpu-infer.slice` with its limits and device list —
//! even when gpuctld has not run yet or fails. The input is the state of the last fully
//! successful reconcile (`/var/lib/gpuctl/slices.json`); the output is `gpu.slice` and one
//! `gpu-<team>.slice` per team in the generator's normal directory, which ranks below
//! `/etc/systemd/system` (an admin's own unit wins) and above `/usr/lib`.
//!
//! The fences of `user.slice` and `machine.slice` (`[host] outside = "closed"`) are written as
//! drop-ins too, so no login session or container opens a GPU in the seconds before gpuctld's
//! first reconcile. They name majors (`char-drm`); systemd skips a name not registered yet, so a
//! module loaded after boot is closed there until gpuctld, which watches `/proc/devices`, sets
//! the fence again: the boot window fails closed, never open.
//!
//! A generator must never break boot: a missing or unreadable state file produces no units and
//! a message on stderr (the kernel log at that point), never a failure exit.

use super::state::{AppliedState, StateError, STATE_FILE};
use crate::files::FileError;
use crate::paths::Root;
use crate::systemd::props;
use std::path::Path;

/// The fence drop-in's name: before systemd's `50-Device*.conf` of gpuctld's runtime
/// properties, which reset the list and so win once gpuctld has run.
const FENCE_DROP_IN: &str = "10-gpuctl-fence.conf";

/// Write the units for the state found under `root` into `out`; returns the files written.
/// An error means the state file was unreadable; nothing was written then.
pub fn generate(root: &Root, out: &Path) -> Result<Vec<String>, StateError> {
    let path = root.join(STATE_FILE);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let state = AppliedState::load(&path)?;
    let mut written = Vec::new();
    let mut put = |name: String, text: String| -> Result<(), StateError> {
        let p = out.join(&name);
        std::fs::write(&p, text).map_err(|e| FileError::new(&p, e))?;
        written.push(name);
        Ok(())
    };
    for (slice, fence) in &state.fences {
        // Only the slices gpuctl fences: a hand-edited state names no other unit.
        let text = props::fence_drop_in(fence, STATE_FILE)
            .filter(|_| crate::plan::fence::FENCED_SLICES.contains(&slice.as_str()));
        let Some(text) = text else {
            eprintln!("gpuctl-generator: {STATE_FILE}: skipping fence of {slice:?}");
            continue;
        };
        let dir = out.join(format!("{slice}.d"));
        std::fs::create_dir_all(&dir).map_err(|e| FileError::new(&dir, e))?;
        put(format!("{slice}.d/{FENCE_DROP_IN}"), text)?;
    }
    if state.slices.is_empty() {
        return Ok(written);
    }
    put(
        "gpu.slice".into(),
        props::parent_slice_unit_file(STATE_FILE),
    )?;
    for (team, spec) in &state.slices {
        // The state file is ours, but a hand-edited one must not make us write units outside
        // the gpu-*.slice namespace.
        if !crate::policy::valid_team_name(team) {
            eprintln!("gpuctl-generator: {STATE_FILE}: skipping invalid team name {team:?}");
            continue;
        }
        put(
            props::slice_unit(team),
            props::slice_unit_file(team, spec, STATE_FILE),
        )?;
    }
    Ok(written)
}

/// Entry point of the binary: `gpuctl-generator NORMAL [EARLY LATE]`. Returns the exit code.
pub fn main_with(args: &[String], root: &Root) -> i32 {
    let Some(normal) = args.first() else {
        eprintln!("usage: gpuctl-generator NORMAL_DIR [EARLY_DIR LATE_DIR]");
        return 2;
    };
    if let Err(e) = generate(root, Path::new(normal)) {
        eprintln!("gpuctl-generator: {e}; no team slices generated");
    }
    0
}
