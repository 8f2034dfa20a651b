//! Event-driven drift repair (issue 17 item 1): gpuctl owns `gpu.slice`, `gpu-*.slice` and
//! `gpuctl-mps@*`, and a hand change to them is undone within a second, not at the next drift
//! timer tick.
//!
//! What is watched, and why these sources:
//! - **Control drop-ins** (inotify): `systemctl set-property` writes every change as a drop-in,
//!   `/run/systemd/system.control/<unit>.d/50-<Property>.conf` with `--runtime`, the same under
//!   `/etc/systemd/system.control/` without. The file is written before the D-Bus call returns,
//!   whatever the property, so a watch on those directories sees every hand change of a slice
//!   (a memory limit, an added `DeviceAllow=`) with no polling. systemd's `PropertiesChanged`
//!   is no substitute: cgroup properties such as `MemoryMax` are not "emits change" properties,
//!   so no signal carries them.
//! - **MPS unit state** (`PropertiesChanged` of `ActiveState` on `gpuctl-mps@*` objects, which
//!   systemd does emit to subscribed clients) and **unit removal** (`UnitRemoved`, in
//!   `daemon::watch_units`): a stopped MPS daemon is started again.
//! - **MIG**: NVML has no event for instance changes; the slow drift timer stays for that.
//!
//! Nothing here polls: with no change, gpuctld does not wake up.
//!
//! **Persistent overrides.** A control drop-in under `/etc/systemd/system.control/` outranks
//! gpuctld's runtime drop-ins under `/run/`, so it would win again after every daemon-reload.
//! gpuctl owns these units, so such a file is **removed**, and the removal is logged with the
//! file name and its content ([`remove_persistent_overrides`]). An admin who wants another
//! limit changes the policy, which is the one place that decides. (Keeping them and reporting
//! "overridden by FILE" was the alternative; it would leave a team with a device list gpuctl
//! did not decide, which is the leak this issue is about.)

use super::watch::DirWatch;
use crate::paths::Root;
use nix::sys::inotify::AddWatchFlags;
use std::path::{Path, PathBuf};

/// Where `systemctl set-property` writes: runtime, then persistent.
pub const CONTROL_DIRS: [&str; 2] = ["/run/systemd/system.control", "/etc/systemd/system.control"];

/// The persistent control directory, whose drop-ins for owned units are removed.
pub const PERSISTENT_CONTROL_DIR: &str = "/etc/systemd/system.control";

/// Whether gpuctl owns the unit: `gpu.slice`, `gpu-<team>.slice`, `gpuctl-mps@<instance>`.
pub fn owned_unit(unit: &str) -> bool {
    unit == "gpu.slice"
        || (unit.starts_with("gpu-") && unit.ends_with(".slice"))
        || unit.starts_with("gpuctl-mps@")
}

/// The unit of a drop-in directory name (`gpu-infer.slice.d` → `gpu-infer.slice`) when gpuctl
/// owns it.
pub fn owned_dropin_dir(name: &str) -> Option<&str> {
    let unit = name.strip_suffix(".d")?;
    owned_unit(unit).then_some(unit)
}

/// A persistent override that was removed: the file and what it said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedOverride {
    /// The unit it applied to.
    pub unit: String,
    /// Host path of the removed file.
    pub file: String,
    /// Its settings, one line (`MemoryMax=1073741824`).
    pub content: String,
}

/// Remove every drop-in under `/etc/systemd/system.control/<owned unit>.d/` (see the module
/// header for why), and the directory when it is left empty. Errors name the path.
pub fn remove_persistent_overrides(root: &Root) -> (Vec<RemovedOverride>, Vec<String>) {
    let mut removed = Vec::new();
    let mut errors = Vec::new();
    let base = root.join(PERSISTENT_CONTROL_DIR);
    for d in sorted_entries(&base).unwrap_or_default() {
        let name = d.file_name().to_string_lossy().into_owned();
        let Some(unit) = owned_dropin_dir(&name) else {
            continue;
        };
        let Ok(files) = sorted_entries(&d.path()) else {
            continue;
        };
        for f in files {
            let host = format!(
                "{PERSISTENT_CONTROL_DIR}/{name}/{}",
                f.file_name().to_string_lossy()
            );
            let content = std::fs::read_to_string(f.path())
                .map(|t| {
                    t.lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            match std::fs::remove_file(f.path()) {
                Ok(()) => removed.push(RemovedOverride {
                    unit: unit.to_string(),
                    file: host,
                    content,
                }),
                Err(e) => errors.push(format!("{host}: cannot remove: {e}")),
            }
        }
        let _ = std::fs::remove_dir(d.path());
    }
    (removed, errors)
}

/// The entries of `dir` that can be read, sorted by name.
fn sorted_entries(dir: &Path) -> std::io::Result<Vec<std::fs::DirEntry>> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    Ok(entries)
}

/// inotify over the control drop-in directories of owned units.
pub struct DropinWatch {
    w: DirWatch<Kind>,
    root: Root,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `/run/systemd` or `/etc/systemd` while the control dir does not exist.
    Ancestor,
    /// A control dir: new `<unit>.d` directories appear here.
    Control,
    /// `<owned unit>.d`: its files are the drop-ins.
    Unit,
}

const UNIT: AddWatchFlags = AddWatchFlags::IN_CLOSE_WRITE
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_CREATE)
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_ONLYDIR);
/// What a control directory or an ancestor is watched for: new entries.
const DIRS: AddWatchFlags = super::watch::ANCESTOR;

impl DropinWatch {
    /// Start watching under `root`.
    pub fn new(root: Root) -> std::io::Result<Self> {
        let mut w = DropinWatch {
            w: DirWatch::new()?,
            root,
        };
        w.rearm();
        Ok(w)
    }

    /// Directories watched (for tests and logs).
    pub fn watched(&self) -> Vec<PathBuf> {
        self.w.dirs().into_iter().map(|(p, _)| p).collect()
    }

    fn add(&mut self, dir: &Path, kind: Kind) {
        let flags = if kind == Kind::Unit { UNIT } else { DIRS };
        self.w.add(dir, flags, kind);
    }

    /// Rebuild the watch set from what exists now.
    pub fn rearm(&mut self) {
        self.w.clear();
        for c in CONTROL_DIRS {
            let dir = self.root.join(c);
            if dir.is_dir() {
                self.add(&dir, Kind::Control);
                for e in sorted_entries(&dir).unwrap_or_default() {
                    if owned_dropin_dir(&e.file_name().to_string_lossy()).is_some() {
                        self.add(&e.path(), Kind::Unit);
                    }
                }
            } else if let Some(parent) = dir.parent() {
                self.add(parent, Kind::Ancestor);
            }
        }
    }

    /// Wait for a change of an owned unit's drop-ins; returns the host-relative files (or
    /// directories) that changed, e.g. `gpu-infer.slice.d/50-MemoryMax.conf`.
    pub async fn changed(&mut self) -> std::io::Result<Vec<String>> {
        loop {
            let mut rearm = false;
            let mut appeared = false;
            let mut out = Vec::new();
            for ev in self.w.next().await? {
                if ev.dir_gone() {
                    rearm = true;
                    continue;
                }
                let name = ev.name.unwrap_or_default();
                match ev.kind {
                    Kind::Ancestor => {
                        if CONTROL_DIRS
                            .iter()
                            .any(|c| self.root.join(c) == ev.dir.join(&name))
                        {
                            rearm = true;
                            appeared = true;
                        }
                    }
                    Kind::Control => {
                        if owned_dropin_dir(&name).is_some() {
                            rearm = true;
                            out.push(name);
                        }
                    }
                    Kind::Unit => {
                        // systemd writes `.#50-X.confXXXX` and renames it into place.
                        if !name.starts_with('.') {
                            out.push(format!("{}/{name}", file_name(&ev.dir)));
                        }
                    }
                }
            }
            if rearm {
                self.rearm();
            }
            if appeared {
                // A control dir that appeared may hold unit dirs created before their watch.
                out.extend(
                    self.w
                        .dirs()
                        .into_iter()
                        .filter(|(_, k)| *k == Kind::Unit)
                        .map(|(p, _)| file_name(&p)),
                );
            }
            if !out.is_empty() {
                out.sort();
                out.dedup();
                return Ok(out);
            }
        }
    }
}

/// The last component of `p`, lossily as text (empty for none).
fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn owned_units_are_gpuctls_slices_and_mps_daemons() {
        for u in [
            "gpu.slice",
            "gpu-infer.slice",
            "gpuctl-mps@infer-gpus.service",
        ] {
            assert!(owned_unit(u), "{u}");
        }
        for u in [
            "system.slice",
            "gpuctld.service",
            "user-1000.slice",
            "gpu-x.service",
        ] {
            assert!(!owned_unit(u), "{u}");
        }
        assert_eq!(
            owned_dropin_dir("gpu-infer.slice.d"),
            Some("gpu-infer.slice")
        );
        assert_eq!(owned_dropin_dir("sshd.service.d"), None);
    }

    #[test]
    fn persistent_overrides_of_owned_units_only_are_removed_and_named() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let base = root.join(PERSISTENT_CONTROL_DIR);
        std::fs::create_dir_all(base.join("gpu-infer.slice.d")).unwrap();
        std::fs::create_dir_all(base.join("sshd.service.d")).unwrap();
        std::fs::write(
            base.join("gpu-infer.slice.d/50-MemoryMax.conf"),
            "# This is a drop-in unit file extension, created via \"systemctl set-property\"\n\
             # or an equivalent operation. Do not edit.\n[Slice]\nMemoryMax=1073741824\n",
        )
        .unwrap();
        std::fs::write(base.join("sshd.service.d/50-CPUWeight.conf"), "x").unwrap();
        let (removed, errors) = remove_persistent_overrides(&root);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            removed,
            vec![RemovedOverride {
                unit: "gpu-infer.slice".into(),
                file: "/etc/systemd/system.control/gpu-infer.slice.d/50-MemoryMax.conf".into(),
                content: "MemoryMax=1073741824".into(),
            }]
        );
        assert!(!base.join("gpu-infer.slice.d").exists());
        assert!(base.join("sshd.service.d/50-CPUWeight.conf").exists());
        // Nothing left: a second pass removes nothing.
        assert!(remove_persistent_overrides(&root).0.is_empty());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sees_set_property_writes_including_a_control_dir_created_later() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        std::fs::create_dir_all(root.join("/run/systemd")).unwrap();
        let mut w = DropinWatch::new(root.clone()).unwrap();
        async fn wait(w: &mut DropinWatch) -> Vec<String> {
            tokio::time::timeout(Duration::from_secs(5), w.changed())
                .await
                .expect("no event")
                .unwrap()
        }
        // systemd creates the control dir and the unit's .d on the first set-property.
        std::fs::create_dir_all(root.join("/run/systemd/system.control")).unwrap();
        // The creation of the control dir re-arms; give it a moment, then the unit dir.
        tokio::time::sleep(Duration::from_millis(50)).await;
        std::fs::create_dir_all(root.join("/run/systemd/system.control/gpu-infer.slice.d"))
            .unwrap();
        let got = wait(&mut w).await;
        assert!(
            got.iter().any(|f| f.starts_with("gpu-infer.slice.d")),
            "{got:?}"
        );
        // Unrelated units are not reported.
        std::fs::create_dir_all(root.join("/run/systemd/system.control/sshd.service.d")).unwrap();
        let tmp = root.join("/run/systemd/system.control/gpu-infer.slice.d/.#50-MemoryMax.confab");
        std::fs::write(&tmp, "[Slice]\nMemoryMax=1\n").unwrap();
        std::fs::rename(
            &tmp,
            root.join("/run/systemd/system.control/gpu-infer.slice.d/50-MemoryMax.conf"),
        )
        .unwrap();
        let got = wait(&mut w).await;
        assert_eq!(got, vec!["gpu-infer.slice.d/50-MemoryMax.conf".to_string()]);
    }
}
