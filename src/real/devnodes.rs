//! MIG capability device nodes, `/dev/nvidia-caps/nvidia-cap<minor>`, and the minors the driver
//! lists for them.

use crate::files::FileError;
use crate::paths::Root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Where capability device nodes live.
pub const CAPS_DIR: &str = "/dev/nvidia-caps";

/// Parse `/proc/driver/nvidia-caps/mig-minors` (`gpu0/gi1/access 12` per line).
pub fn parse_mig_minors(text: &str) -> BTreeMap<String, u32> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (k, v) = (it.next()?, it.next()?);
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The minors that have a node under `root`.
pub fn existing(root: &Root) -> BTreeSet<u32> {
    let Ok(rd) = std::fs::read_dir(root.join(CAPS_DIR)) else {
        return BTreeSet::new();
    };
    rd.flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("nvidia-cap"))
                .and_then(|n| n.parse().ok())
        })
        .collect()
}

fn invalid(p: &Path, why: &str) -> FileError {
    FileError::new(p, std::io::Error::new(std::io::ErrorKind::NotFound, why))
}

/// Create the nodes of `minors` that do not exist yet. On the real root, character devices
/// with the `nvidia-caps` major from `/proc/devices` (what `nvidia-modprobe -f` does). Under
/// another root (tests, image builds) there is no driver to own the major and mknod needs
/// privileges, so the nodes are plain files there.
pub fn create(root: &Root, minors: &[u32]) -> Result<(), FileError> {
    let dir = root.join(CAPS_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| FileError::new(&dir, e))?;
    let major = if root.dir() == Path::new("/") {
        let pd = root.join("/proc/devices");
        let t = std::fs::read_to_string(&pd).map_err(|e| FileError::new(&pd, e))?;
        Some(
            t.lines()
                .find_map(|l| {
                    let (n, name) = l.trim().split_once(' ')?;
                    (name.trim() == "nvidia-caps").then(|| n.parse::<u64>().ok())?
                })
                .ok_or_else(|| invalid(&pd, "no nvidia-caps major (is the driver loaded?)"))?,
        )
    } else {
        None
    };
    for m in minors {
        let p = dir.join(format!("nvidia-cap{m}"));
        if p.exists() {
            continue;
        }
        match major {
            Some(maj) => {
                use nix::sys::stat::{makedev, mknod, Mode, SFlag};
                // Read-only for everyone, as nvidia-modprobe makes them; access is gated by
                // the slices' DeviceAllow=, not by file modes.
                mknod(
                    &p,
                    SFlag::S_IFCHR,
                    Mode::from_bits_truncate(0o444),
                    makedev(maj, u64::from(*m)),
                )
                .map_err(|e| FileError::new(&p, e.into()))?;
            }
            None => std::fs::write(&p, b"").map_err(|e| FileError::new(&p, e))?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_minors_parse_and_nodes_are_listed() {
        let m = parse_mig_minors("config 1\nmonitor 2\ngpu0/gi1/access 12\nbroken\n");
        assert_eq!(m.len(), 3);
        assert_eq!(m["gpu0/gi1/access"], 12);
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        create(&root, &[12, 13]).unwrap();
        assert_eq!(existing(&root), [12, 13].into_iter().collect());
    }
}
