//! One writer: whoever applies a plan to the real host holds an exclusive `flock(2)` on
//! `/run/gpuctl/apply.lock` (issue 17 item 5).
//!
//! gpuctld takes it for every reconcile, `gpuctl apply --local` for its run; both change MIG
//! state, owner labels and `journal.json`, so two at once could destroy what the other just
//! created. `flock` rather than a PID file: the kernel drops the lock when the holder dies (a
//! crash never leaves a stale lock), and a PID file could be reused. The holder writes one line
//! (`pid 123 (gpuctld)`) into the file so that a waiting writer can name it; the line is
//! informative only — the lock is the `flock`.

use crate::paths::{Root, RUN_DIR};
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Host path of the lock file.
pub fn lock_path() -> String {
    format!("{RUN_DIR}/apply.lock")
}

/// A held apply lock; dropping it releases the lock.
#[derive(Debug)]
pub struct ApplyLock {
    _lock: Flock<File>,
}

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another writer held it for the whole wait.
    #[error("{path}: another apply is running ({holder}); gave up after {waited:?}")]
    Busy {
        /// The lock file.
        path: PathBuf,
        /// `pid N (who)` as the holder wrote it.
        holder: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The file could not be opened or locked.
    #[error("{path}: {why}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// What failed.
        why: String,
    },
}

impl ApplyLock {
    /// Take the lock as `who` (`gpuctld`, `gpuctl apply --local`), waiting at most `wait`.
    /// `on_wait` is called once, with the holder, when the lock is busy at the first try (so a
    /// CLI can say what it waits for).
    pub fn acquire(
        root: &Root,
        who: &str,
        wait: Duration,
        mut on_wait: impl FnMut(&str),
    ) -> Result<ApplyLock, LockError> {
        let path = root.join(lock_path());
        let io = |why: String| LockError::Io {
            path: path.clone(),
            why,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io(e.to_string()))?;
        }
        let start = Instant::now();
        let mut told = false;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io(e.to_string()))?;
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(mut l) => {
                    // Informative only: who holds it, for a writer that waits.
                    let _ = l.set_len(0);
                    let _ = l.rewind();
                    let _ = writeln!(l, "pid {} ({who})", std::process::id());
                    let _ = l.flush();
                    return Ok(ApplyLock { _lock: l });
                }
                Err((f, nix::errno::Errno::EWOULDBLOCK)) => {
                    file = f;
                    let holder = read_holder(&mut file);
                    if !told {
                        on_wait(&holder);
                        told = true;
                    }
                    if start.elapsed() >= wait {
                        return Err(LockError::Busy {
                            path,
                            holder,
                            waited: start.elapsed(),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err((_, e)) => return Err(io(format!("flock: {e}"))),
            }
        }
    }
}

fn read_holder(f: &mut File) -> String {
    let mut s = String::new();
    let _ = f.rewind();
    let _ = f.read_to_string(&mut s);
    match s.lines().next().map(str::trim) {
        Some(l) if !l.is_empty() => l.chars().take(120).collect(),
        _ => "holder unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_writer_waits_then_names_the_holder() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let held = ApplyLock::acquire(&root, "gpuctld", Duration::ZERO, |_| {}).unwrap();
        let mut seen = String::new();
        let e = ApplyLock::acquire(
            &root,
            "gpuctl apply --local",
            Duration::from_millis(120),
            |h| seen = h.to_string(),
        )
        .unwrap_err();
        let me = format!("pid {} (gpuctld)", std::process::id());
        assert_eq!(seen, me);
        let msg = e.to_string();
        assert!(msg.contains(&me) && msg.contains("apply.lock"), "{msg}");
        drop(held);
        // Released on drop: the next writer gets it at once.
        ApplyLock::acquire(&root, "gpuctl apply --local", Duration::ZERO, |_| {
            panic!("must not wait")
        })
        .unwrap();
    }

    #[test]
    fn waiter_gets_the_lock_when_the_holder_lets_go() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let held = ApplyLock::acquire(&root, "gpuctld", Duration::ZERO, |_| {}).unwrap();
        let r2 = root.clone();
        let t = std::thread::spawn(move || {
            ApplyLock::acquire(&r2, "cli", Duration::from_secs(5), |_| {}).map(|_| ())
        });
        std::thread::sleep(Duration::from_millis(200));
        drop(held);
        t.join().unwrap().unwrap();
    }
}
