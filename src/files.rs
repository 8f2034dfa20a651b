//! The one atomic-file helper of the crate: every state file gpuctl writes (the MIG journal,
//! owner labels, `slices.json`, the last good policy, team env files, MPS env/ctl files and
//! drop-ins, generated units, the simulator's state, the root-only lease records) goes through
//! [`write_atomic`], [`write_private`] or [`write_if_changed`], so a crash or power cut leaves either the old or the new file, never a
//! torn one, and a symlink planted where the temp file goes is never followed.
//!
//! Hand-written (about 40 lines) rather than `tempfile::NamedTempFile::persist`: that crate
//! would be a new runtime dependency for one function, and it does not fsync the directory.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use thiserror::Error;

/// A state file could not be written or read.
#[derive(Debug, Error)]
#[error("{}: {source}", path.display())]
pub struct FileError {
    /// The file (or its directory) concerned.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

impl FileError {
    /// `source` concerning `path`.
    pub fn new(path: &Path, source: std::io::Error) -> Self {
        FileError {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Distinguishes temp files of concurrent writers in one process.
static SEQ: AtomicU64 = AtomicU64::new(0);

/// Replace `path` with `content` atomically and durably: a new temp file in the same directory
/// (`O_CREAT|O_EXCL|O_NOFOLLOW`, so an existing file or symlink there is never reused), write,
/// fsync, rename over `path`, fsync of the directory. Missing parent directories are created.
pub fn write_atomic(path: &Path, content: &[u8]) -> Result<(), FileError> {
    let dir = parent(path);
    std::fs::create_dir_all(dir).map_err(|e| FileError::new(dir, e))?;
    write_in(dir, path, content, 0o666)
}

/// [`write_atomic`] for a file only root reads: its directory is made (or set back to) mode
/// 0700 and the file is created 0600, so no other user can open it or even list its name.
pub fn write_private(path: &Path, content: &[u8]) -> Result<(), FileError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = parent(path);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| FileError::new(dir, e))?;
    write_in(dir, path, content, 0o600)
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// The temp file (created with `mode`, less the umask), fsync, rename, directory fsync.
fn write_in(dir: &Path, path: &Path, content: &[u8], mode: u32) -> Result<(), FileError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (tmp, mut f) = loop {
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.{}.{seq}.tmp", std::process::id()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            // Left behind by an earlier process with our pid: try the next name.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(FileError::new(&tmp, e)),
        }
    };
    let written = f
        .write_all(content)
        .and_then(|()| f.sync_all())
        .map_err(|e| FileError::new(&tmp, e))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| FileError::new(path, e)));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Ok(d) = std::fs::File::open(dir) {
        // Some filesystems refuse fsync on directories; the rename is done either way.
        let _ = d.sync_all();
    }
    Ok(())
}

/// [`write_atomic`] unless `path` already holds `content`; returns whether it changed.
pub fn write_if_changed(path: &Path, content: &str) -> Result<bool, FileError> {
    if std::fs::read(path).ok().as_deref() == Some(content.as_bytes()) {
        return Ok(false);
    }
    write_atomic(path, content.as_bytes())?;
    Ok(true)
}

/// Remove `path`; returns whether it existed.
pub fn remove_if_exists(path: &Path) -> Result<bool, FileError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(FileError::new(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replace_and_report_changes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a/b.env");
        assert!(write_if_changed(&p, "x=1\n").unwrap());
        assert!(!write_if_changed(&p, "x=1\n").unwrap());
        assert!(write_if_changed(&p, "x=2\n").unwrap());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "x=2\n");
        // No temp file is left behind.
        let left: Vec<_> = std::fs::read_dir(dir.path().join("a"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("b.env")]);
        assert!(remove_if_exists(&p).unwrap());
        assert!(!remove_if_exists(&p).unwrap());
    }

    #[test]
    fn a_planted_symlink_is_neither_followed_nor_reused() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let p = dir.path().join("state.json");
        // Every temp name this process will try next starts with the seq counter's value; a
        // symlink on the next one must make the writer skip it, not write through it.
        let next = SEQ.load(Ordering::Relaxed);
        for seq in next..next + 4 {
            let tmp = dir
                .path()
                .join(format!(".state.json.{}.{seq}.tmp", std::process::id()));
            std::os::unix::fs::symlink(&victim, tmp).unwrap();
        }
        write_atomic(&p, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
    }

    #[test]
    fn private_files_are_root_only_in_a_root_only_directory() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("leases");
        // An existing directory that others may read is closed again.
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let p = d.join("gpuctl-run-0a.scope.json");
        write_private(&p, b"{}").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&d), mode(&p)), (0o700, 0o600));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{}");
        write_private(&d.join("new/x"), b"1").unwrap();
        assert_eq!(mode(&d.join("new")), 0o700);
    }

    #[test]
    fn a_symlink_at_the_target_is_replaced_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let p = dir.path().join("owners.json");
        std::os::unix::fs::symlink(&victim, &p).unwrap();
        write_atomic(&p, b"{}").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert!(!std::fs::symlink_metadata(&p).unwrap().is_symlink());
    }
}
