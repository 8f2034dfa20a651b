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

/// One inotify instance on the tokio reactor, over directories each tagged with what it is to
/// the caller (`K`). Shared by [`PolicyWatch`] and `drift::DropinWatch`, which differ only in
/// which directories they watch and what an event means.
pub(crate) struct DirWatch<K> {
    fd: AsyncFd<Fd>,
    watches: HashMap<WatchDescriptor, (PathBuf, K)>,
}

/// One event on a watched directory.
pub(crate) struct DirEvent<K> {
    /// The watched directory.
    pub dir: PathBuf,
    /// What the caller said it is.
    pub kind: K,
    /// The entry in it the event is about (none for events on the directory itself).
    pub name: Option<String>,
    /// inotify's event mask.
    pub mask: AddWatchFlags,
}

impl<K> DirEvent<K> {
    /// The directory itself went away (removed, moved, or its watch dropped): re-arm.
    pub fn dir_gone(&self) -> bool {
        self.mask.intersects(
            AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF | AddWatchFlags::IN_IGNORED,
        )
    }
}

/// `IN_MASK_ADD`, which nix's flag set does not name.
const MASK_ADD: AddWatchFlags = AddWatchFlags::from_bits_retain(nix::libc::IN_MASK_ADD);

impl<K: Clone> DirWatch<K> {
    pub(crate) fn new() -> std::io::Result<Self> {
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        // SAFETY: `Fd` owns the inotify descriptor (nix's `Inotify` holds an `OwnedFd`) and never
        // replaces it, so the raw fd stays open and the same for the AsyncFd's whole life.
        let fd = unsafe { AsyncFd::register_with_interest(Fd(ino), Interest::READABLE) }?;
        Ok(DirWatch {
            fd,
            watches: HashMap::new(),
        })
    }

    /// Watch `dir` for `flags`. A directory watched already keeps its first kind and gains the
    /// flags (`IN_MASK_ADD`): a plain second `add_watch` on the same inode would *replace* its
    /// mask, so a policy directory that is also the ancestor of a missing one (`/etc/gpuctl`
    /// while `policy.d` does not exist) would stop reporting in-place writes. Callers add the
    /// directories whose events mean more first. Returns whether the watch is in place.
    pub(crate) fn add(&mut self, dir: &Path, flags: AddWatchFlags, kind: K) -> bool {
        match self
            .fd
            .get_ref()
            .0
            .add_watch(dir, flags | MASK_ADD)
        {
            Ok(wd) => {
                self.watches
                    .entry(wd)
                    .or_insert_with(|| (dir.to_path_buf(), kind));
                true
            }
            Err(_) => false,
        }
    }

    /// Drop every watch.
    pub(crate) fn clear(&mut self) {
        for wd in std::mem::take(&mut self.watches).into_keys() {
            let _ = self.fd.get_ref().0.rm_watch(wd);
        }
    }

    /// The watched directories and their kinds, sorted by path.
    pub(crate) fn dirs(&self) -> Vec<(PathBuf, K)> {
        let mut v: Vec<_> = self.watches.values().cloned().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The next batch of events on watched directories (waits for at least one read).
    pub(crate) async fn next(&mut self) -> std::io::Result<Vec<DirEvent<K>>> {
        loop {
            let mut guard = self.fd.readable().await?;
            let events = match guard.try_io(|fd| {
                fd.get_ref()
                    .0
                    .read_events()
                    .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
            }) {
                Ok(Ok(ev)) => ev,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            };
            drop(guard);
            return Ok(events
                .into_iter()
                .filter_map(|ev| {
                    let (dir, kind) = self.watches.get(&ev.wd)?.clone();
                    Some(DirEvent {
                        dir,
                        kind,
                        name: ev.name.map(|n| n.to_string_lossy().into_owned()),
                        mask: ev.mask,
                    })
                })
                .collect());
        }
    }
}

/// A watch over the policy directories.
pub struct PolicyWatch {
    w: DirWatch<bool>,
    root: Root,
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
        let mut w = PolicyWatch {
            w: DirWatch::new()?,
            root,
        };
        w.rearm();
        Ok(w)
    }

    /// Directories currently watched, and whether each is a policy dir itself or only the
    /// ancestor of a missing one (for logs and tests).
    pub fn watched(&self) -> Vec<(PathBuf, bool)> {
        self.w.dirs()
    }

    fn rearm(&mut self) {
        self.w.clear();
        // Policy directories first: one that is also the ancestor of a missing one keeps its
        // kind and full mask (see `DirWatch::add`).
        let missing: Vec<PathBuf> = POLICY_DIRS
            .iter()
            .map(|d| self.root.join(d))
            .filter(|real| !self.w.add(real, CONTENT, true))
            .collect();
        for real in missing {
            // Not there yet: watch the closest existing ancestor for its creation.
            if let Some(anc) = real.ancestors().skip(1).find(|a| a.is_dir()) {
                self.w.add(anc, ANCESTOR, false);
            }
        }
    }

    /// Wait for the next relevant change. Returns after at least one event that touched a
    /// policy directory or created a missing one.
    pub async fn changed(&mut self) -> std::io::Result<()> {
        loop {
            let mut relevant = false;
            let mut rearm = false;
            for ev in self.w.next().await? {
                if ev.dir_gone() {
                    rearm = true;
                    relevant |= ev.kind;
                    continue;
                }
                if ev.kind {
                    // Editors' swap and backup files (`.x.swp`, `x~`) are not policy; a
                    // created subdirectory (`policy.d` under `/etc/gpuctl`) needs a watch.
                    if ev.mask.contains(AddWatchFlags::IN_ISDIR) {
                        rearm = true;
                    }
                    relevant |= ev.name.as_deref().is_none_or(|n| {
                        !n.starts_with('.') && !n.ends_with('~') && !n.ends_with(".swp")
                    });
                } else if let Some(n) = ev.name {
                    // An ancestor: only the creation of the next path component matters.
                    let created = ev.dir.join(&n);
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

    /// `/etc/gpuctl` is a policy directory and, while `policy.d` is missing, also the ancestor
    /// watched for its creation. Watching it twice once replaced its mask with the ancestor's
    /// (creations only), so writing the main file in place or deleting it went unseen.
    #[tokio::test(flavor = "current_thread")]
    async fn in_place_writes_are_seen_while_policy_d_is_missing() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        std::fs::create_dir_all(root.join("/etc/gpuctl")).unwrap();
        let main = root.join("/etc/gpuctl/gpuctl.toml");
        std::fs::write(&main, "version = 1\n").unwrap();
        let mut w = PolicyWatch::new(root.clone()).unwrap();
        assert!(w.watched().contains(&(root.join("/etc/gpuctl"), true)));

        // Truncate and write the same inode: IN_CLOSE_WRITE only, no create or rename.
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&main)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"version = 1\n# x\n"))
            .unwrap();
        expect_change(&mut w, "an in-place write of /etc/gpuctl/gpuctl.toml").await;
        std::fs::remove_file(&main).unwrap();
        expect_change(&mut w, "rm /etc/gpuctl/gpuctl.toml").await;
    }
}
