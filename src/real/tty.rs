//! A message on a user's terminals, as `write(1)` and `wall(1)` do: every `/dev/pts/N` and
//! `/dev/ttyN` (under the root) owned by the uid whose owner allowed messages (`mesg y`: the
//! group-write bit), opened without following links, without becoming a controlling terminal
//! and without blocking on a stuck terminal.
//!
//! Terminal ownership rather than utmp: a terminal's owner is what `login`, sshd and terminal
//! emulators set (and utmp is not written by every terminal emulator or by `gpuctl shell`
//! inside tmux), and it needs no binary-format parsing. The text is stripped of control
//! characters, so a unit name cannot carry terminal escapes.

use crate::paths::Root;
use nix::fcntl::OFlag;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::PathBuf;

/// The terminals (host paths) of `uid` that accept messages.
pub fn terminals(root: &Root, uid: u32) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (dir, prefix) in [("/dev/pts", ""), ("/dev", "tty")] {
        let Ok(rd) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(num) = name.strip_prefix(prefix) else {
                continue;
            };
            if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let Ok(md) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            let ft = md.file_type();
            // Character devices on a host; plain files only in a test root.
            let kind_ok =
                ft.is_char_device() || (ft.is_file() && root.dir() != std::path::Path::new("/"));
            if kind_ok && md.uid() == uid && md.mode() & 0o020 != 0 {
                out.push(PathBuf::from(format!("{dir}/{name}")));
            }
        }
    }
    out.sort();
    out
}

/// Write `text` to every terminal of `uid`; returns those written (host paths).
pub fn tell(root: &Root, uid: u32, text: &str) -> Vec<PathBuf> {
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() && c != '\n' { ' ' } else { c })
        .collect();
    let msg = format!(
        "\r\n\x07Message from gpuctld:\r\n{}\r\n",
        clean.replace('\n', "\r\n")
    );
    terminals(root, uid)
        .into_iter()
        .filter(|t| {
            let r = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags((OFlag::O_NOCTTY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW).bits())
                .open(root.join(t))
                .and_then(|mut f| f.write_all(msg.as_bytes()));
            r.inspect_err(|e| tracing::debug!("message to {}: {e}", t.display()))
                .is_ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn writes_to_the_users_terminals_that_accept_messages() {
        let t = tempfile::tempdir().unwrap();
        let root = Root::new(t.path());
        let me = nix::unistd::getuid().as_raw();
        std::fs::create_dir_all(root.join("/dev/pts")).unwrap();
        let mk = |p: &str, mode: u32| {
            let f = root.join(p);
            std::fs::write(&f, "").unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        mk("/dev/pts/3", 0o620);
        mk("/dev/pts/4", 0o600); // mesg n
        mk("/dev/tty2", 0o620);
        mk("/dev/pts/ptmx", 0o666); // not a terminal number
        std::os::unix::fs::symlink(root.join("/dev/pts/3"), root.join("/dev/pts/9")).unwrap();
        let written = tell(&root, me, "idle for 2h\x1b[2J: unit a.scope");
        assert_eq!(
            written,
            vec![PathBuf::from("/dev/pts/3"), PathBuf::from("/dev/tty2")]
        );
        let got = std::fs::read_to_string(root.join("/dev/pts/3")).unwrap();
        assert!(got.contains("Message from gpuctld"), "{got:?}");
        assert!(
            got.contains("idle for 2h [2J: unit a.scope"),
            "escape stripped: {got:?}"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("/dev/pts/4")).unwrap(),
            ""
        );
        // Someone else's terminals: none.
        assert!(tell(&root, me + 1, "x").is_empty());
    }
}
