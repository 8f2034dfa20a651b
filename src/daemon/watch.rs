//! inotify on the policy directories, tolerant of editors' and config tools' rename dances.
//!
//! Directories are watched, never files: `mv tmp policy.toml` replaces the inode a file watch
//! would hold. A directory that does not exist yet is covered by a watch on its nearest existing
//! ancestor, for creations only; when it appears the watch set is rebuilt. Events are only a
//! nudge — the caller debounces and reloads everything.

use crate::paths::{self, Root};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The host directories whose contents make up the policy.
pub const POLICY_DIRS: [&str; 4] = [
    "/etc/gpuctl",
    paths::POLICY_DIR_ETC,
    paths::POLICY_DIR_RUN,
    paths::POLICY_DIR_VENDOR,
];

struct Fd(Inotify);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// A watch over the policy directories.
pub struct PolicyWatch {
    fd: AsyncFd<Fd>,
    root: Root,
    /// Watch → (watched dir, whether it is a policy dir itself or only an ancestor).
    watches: HashMap<WatchDescriptor, (PathBuf, bool)>,
}

const CONTENT: AddWatchFlags = AddWatchFlags::IN_CLOSE_WRITE
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_CREATE)
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_ONLYDIR);
const ANCESTOR: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_ONLYDIR);

impl PolicyWatch {
    /// Start watching the policy directories under `root`.
    pub fn new(root: Root) -> std::io::Result<Self> {
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        // SAFETY: `Fd` owns the inotify descriptor (nix's `Inotify` holds an `OwnedFd`) and never
        // replaces it, so the raw fd stays open and the same for the AsyncFd's whole life.
        let fd = unsafe { AsyncFd::register_with_interest(Fd(ino), Interest::READABLE) }?;
        let mut w = PolicyWatch {
            fd,
            root,
            watches: HashMap::new(),
        };
        w.rearm();
        Ok(w)
    }

    /// Directories currently watched (for logs and tests).
    pub fn watched(&self) -> Vec<(PathBuf, bool)> {
        let mut v: Vec<_> = self.watches.values().cloned().collect();
        v.sort();
        v
    }

    fn rearm(&mut self) {
        let ino = &self.fd.get_ref().0;
        for (wd, _) in self.watches.drain() {
            let _ = ino.rm_watch(wd);
        }
        let mut seen = std::collections::HashSet::new();
        for dir in POLICY_DIRS {
            let real = self.root.join(dir);
            if let Ok(wd) = ino.add_watch(&real, CONTENT) {
                self.watches.insert(wd, (real, true));
                continue;
            }
            // Not there yet: watch the closest existing ancestor for its creation.
            let mut anc: &Path = &real;
            while let Some(parent) = anc.parent() {
                anc = parent;
                if anc.is_dir() {
                    if seen.insert(anc.to_path_buf()) {
                        if let Ok(wd) = ino.add_watch(anc, ANCESTOR) {
                            self.watches.entry(wd).or_insert((anc.to_path_buf(), false));
                        }
                    }
                    break;
                }
            }
        }
    }

    /// Wait for the next relevant change. Returns after at least one event that touched a
    /// policy directory or created a missing one.
    pub async fn changed(&mut self) -> std::io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            let events = match guard.get_inner().0.read_events() {
                Ok(ev) => ev,
                Err(nix::errno::Errno::EAGAIN) => {
                    guard.clear_ready();
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            drop(guard);
            let mut relevant = false;
            let mut rearm = false;
            for ev in events {
                let Some((dir, is_policy)) = self.watches.get(&ev.wd).cloned() else {
                    continue;
                };
                if ev.mask.intersects(
                    AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF
                        | AddWatchFlags::IN_IGNORED,
                ) {
                    rearm = true;
                    relevant |= is_policy;
                    continue;
                }
                let name = ev.name.map(|n| n.to_string_lossy().into_owned());
                if is_policy {
                    // Editors' swap and backup files (`.x.swp`, `x~`) are not policy; a
                    // created subdirectory (`policy.d` under `/etc/gpuctl`) needs a watch.
                    if ev.mask.contains(AddWatchFlags::IN_ISDIR) {
                        rearm = true;
                    }
                    relevant |= name.as_deref().is_none_or(|n| {
                        !n.starts_with('.') && !n.ends_with('~') && !n.ends_with(".swp")
                    });
                } else if let Some(n) = name {
                    // An ancestor: only the creation of the next path component matters.
                    let created = dir.join(&n);
                    if POLICY_DIRS
                        .iter()
                        .any(|d| self.root.join(d).starts_with(&created))
                    {
                        rearm = true;
                        relevant = true;
                    }
                }
            }
            if rearm {
                self.rearm();
            }
            if relevant {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn expect_change(w: &mut PolicyWatch, what: &str) {
        tokio::time::timeout(Duration::from_secs(5), w.changed())
            .await
            .unwrap_or_else(|_| panic!("no change seen after {what}"))
            .unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sees_renames_and_directories_created_later() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        std::fs::create_dir_all(root.join("/etc")).unwrap();
        let mut w = PolicyWatch::new(root.clone()).unwrap();
        assert!(
            w.watched().iter().all(|(_, policy)| !policy),
            "nothing exists yet"
        );

        std::fs::create_dir_all(root.join("/etc/gpuctl/policy.d")).unwrap();
        expect_change(&mut w, "mkdir /etc/gpuctl").await;
        // The creation of policy.d may race with the re-arm; settle, then test a rename dance.
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.rearm();
        assert!(w
            .watched()
            .contains(&(root.join("/etc/gpuctl/policy.d"), true)));

        let tmp = root.join("/etc/gpuctl/policy.d/.10-a.toml.tmp");
        std::fs::write(&tmp, "version = 1\n").unwrap();
        std::fs::rename(&tmp, root.join("/etc/gpuctl/policy.d/10-a.toml")).unwrap();
        expect_change(&mut w, "rename into policy.d").await;
    }
}
