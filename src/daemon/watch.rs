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
        let Ok(wd) = self.fd.get_ref().0.add_watch(dir, flags | MASK_ADD) else {
            return false;
        };
        self.watches
            .entry(wd)
            .or_insert_with(|| (dir.to_path_buf(), kind));
        true
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
pub(crate) const ANCESTOR: AddWatchFlags = AddWatchFlags::IN_CREATE
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

    /// Wait until the policy files changed and the change has landed: at once when a file
    /// arrived whole (closed after writing, or renamed into place: what config management and
    /// most editors end with), else once the directories have been quiet for `quiet`.
    ///
    /// Why not a plain trailing debounce: it put a fixed `quiet` (300 ms) on the path of every
    /// change, 60% of the time from a drop-in to `memory.max` (issue 14). Why not react to
    /// every event: editors move or delete the old file before they write the new one (vim's
    /// `backupcopy=auto` renames `x.toml` to `x.toml~`, then creates and writes `x.toml`), and
    /// a file just created is still empty — loading then would apply a policy without it.
    pub async fn next_settled(&mut self, quiet: std::time::Duration) -> std::io::Result<()> {
        let mut change = self.changed().await?;
        while change == Change::UnderWay {
            match tokio::time::timeout(quiet, self.changed()).await {
                Ok(next) => change = next?,
                Err(_quiet) => break,
            }
        }
        Ok(())
    }

    /// Wait for the next relevant batch of events: at least one that touched a policy
    /// directory or created a missing one. Says whether its last relevant event left the
    /// files whole.
    pub async fn changed(&mut self) -> std::io::Result<Change> {
        loop {
            let mut last = None;
            let mut rearm = false;
            for ev in self.w.next().await? {
                if ev.dir_gone() {
                    rearm = true;
                    if ev.kind {
                        last = Some(Change::UnderWay);
                    }
                    continue;
                }
                if ev.kind {
                    // Editors' swap and backup files (`.x.swp`, `x~`) are not policy; a
                    // created subdirectory (`policy.d` under `/etc/gpuctl`) needs a watch.
                    if ev.mask.contains(AddWatchFlags::IN_ISDIR) {
                        rearm = true;
                    }
                    let policy_file = ev.name.as_deref().is_none_or(|n| {
                        !n.starts_with('.') && !n.ends_with('~') && !n.ends_with(".swp")
                    });
                    if policy_file {
                        last = Some(Change::of(ev.mask));
                    }
                } else if let Some(n) = ev.name {
                    // An ancestor: only the creation of the next path component matters.
                    let created = ev.dir.join(&n);
                    if POLICY_DIRS
                        .iter()
                        .any(|d| self.root.join(d).starts_with(&created))
                    {
                        rearm = true;
                        last = Some(Change::UnderWay);
                    }
                }
            }
            if rearm {
                self.rearm();
            }
            if let Some(c) = last {
                return Ok(c);
            }
        }
    }
}

/// What a policy-directory event says about the files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A file arrived whole: closed after writing, renamed into place, or only its mode or
    /// owner changed. Load now.
    Settled,
    /// Something is under way: a file created but not yet written, or one moved away or
    /// deleted (editors do that right before writing the new copy), or a directory appeared.
    UnderWay,
}

impl Change {
    fn of(mask: AddWatchFlags) -> Change {
        let whole = AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO;
        if mask.intersects(whole) || mask == AddWatchFlags::IN_ATTRIB {
            Change::Settled
        } else {
            Change::UnderWay
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn expect_change(w: &mut PolicyWatch, what: &str) -> Change {
        tokio::time::timeout(Duration::from_secs(5), w.changed())
            .await
            .unwrap_or_else(|_| panic!("no change seen after {what}"))
            .unwrap()
    }

    /// No quiet window on the path of a change that has landed; a change under way waits for
    /// the file to arrive (or for quiet). The quiet window here is a minute, so a settled
    /// change seen within the test's 20 s guard was not waited out.
    #[tokio::test(flavor = "current_thread")]
    async fn a_rename_into_place_settles_at_once_an_editors_dance_waits_for_the_new_file() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let dir = root.join("/etc/gpuctl/policy.d");
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = PolicyWatch::new(root.clone()).unwrap();
        let quiet = Duration::from_secs(60);
        let guard = Duration::from_secs(20);

        // Config management: write a dot-file, rename it into place.
        std::fs::write(dir.join(".10-a.toml.tmp"), "version = 1\n").unwrap();
        std::fs::rename(dir.join(".10-a.toml.tmp"), dir.join("10-a.toml")).unwrap();
        tokio::time::timeout(guard, w.next_settled(quiet))
            .await
            .expect("a rename into place waited for the quiet window")
            .unwrap();

        // vim: move the old file aside, then create and write the new one. Between the two,
        // the policy has no 10-a.toml: nothing may be loaded then.
        std::fs::rename(dir.join("10-a.toml"), dir.join("10-a.toml~")).unwrap();
        {
            let settled = w.next_settled(quiet);
            tokio::pin!(settled);
            assert!(
                tokio::time::timeout(Duration::from_millis(300), &mut settled)
                    .await
                    .is_err(),
                "settled while the file was moved away"
            );
            std::fs::write(dir.join("10-a.toml"), "version = 1\n# new\n").unwrap();
            tokio::time::timeout(guard, &mut settled)
                .await
                .expect("the new file's close did not settle the change")
                .unwrap();
        }

        // A plain delete settles once the directory is quiet.
        std::fs::remove_file(dir.join("10-a.toml")).unwrap();
        tokio::time::timeout(guard, w.next_settled(Duration::from_millis(50)))
            .await
            .expect("a delete never settled")
            .unwrap();
    }

    #[test]
    fn what_an_event_says_about_the_file() {
        use AddWatchFlags as F;
        assert_eq!(Change::of(F::IN_CLOSE_WRITE), Change::Settled);
        assert_eq!(Change::of(F::IN_MOVED_TO), Change::Settled);
        assert_eq!(Change::of(F::IN_ATTRIB), Change::Settled);
        assert_eq!(Change::of(F::IN_CREATE), Change::UnderWay);
        assert_eq!(Change::of(F::IN_MOVED_FROM), Change::UnderWay);
        assert_eq!(Change::of(F::IN_DELETE), Change::UnderWay);
        assert_eq!(Change::of(F::IN_CREATE | F::IN_ISDIR), Change::UnderWay);
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
