//! Find the policy files under a root and load them.
//!
//! Order and precedence follow systemd's drop-in rules, so admins and packagers already know
//! them:
//! - `/etc/gpuctl/policy.toml` is merged first;
//! - then the fragments `*.toml` of `/usr/lib/gpuctl/policy.d` (vendor), `/run/gpuctl/policy.d`
//!   and `/etc/gpuctl/policy.d`, in lexical order of file name across all three;
//! - a fragment in a higher directory (`/etc` > `/run` > `/usr/lib`) replaces the one of the same
//!   name in a lower directory;
//! - a fragment that is a symlink to `/dev/null` masks (removes) the fragment of that name.
//!
//! Diagnostics name host paths (`/etc/gpuctl/policy.d/10-x.toml`), never the root under which
//! they were read, because that is the path the admin edits.
//!
//! Reading cannot hurt the daemon ([`read_policy_file`]): a file is opened `O_NONBLOCK` (a FIFO
//! named `*.toml` cannot block the open), its type is checked on the open descriptor (only a
//! regular file is read: a FIFO, a socket or a link to `/dev/zero` is refused with its type), and
//! at most [`MAX_FILE_BYTES`] are read, so a growing or huge file is refused instead of filling
//! memory. Such a file is "unreadable" (exit 2), reported with its path alone.

use super::parse::{parse_fragment, Fragment};
use super::validate::build;
use super::{Diagnostic, Loc, Policy, Severity};
use crate::paths::{Root, POLICY_DIR_ETC, POLICY_DIR_RUN, POLICY_DIR_VENDOR, POLICY_MAIN};
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Largest policy file read: the largest example policy is 3 KiB, and an 8-GPU host with every
/// setting of every team spelt out stays under 64 KiB; anything near 1 MiB is not a policy.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Open and read one policy file without blocking and without reading more than
/// [`MAX_FILE_BYTES`]. The error says what the path is when it is not a regular file.
pub fn read_policy_file(path: &Path) -> Result<Vec<u8>, String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        // A FIFO's open would wait for a writer; a tty's would become our controlling one.
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let what = [
            (ft.is_fifo(), "a FIFO"),
            (ft.is_char_device(), "a character device"),
            (ft.is_block_device(), "a block device"),
            (ft.is_socket(), "a socket"),
            (ft.is_dir(), "a directory"),
        ]
        .into_iter()
        .find_map(|(is, what)| is.then_some(what))
        .unwrap_or("not a regular file");
        return Err(format!(
            "{what}, not a regular file: policy files must be regular files"
        ));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The size can change between fstat and read (a file being appended to): read one byte more
    // than the cap to tell "at the cap" from "over it".
    f.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

fn too_big(len: u64) -> String {
    format!(
        "{len} bytes is over the {} KiB limit of a policy file (MAX_FILE_BYTES)",
        MAX_FILE_BYTES >> 10
    )
}

/// Result of loading: the policy when there were no errors, and every diagnostic.
#[derive(Debug)]
pub struct LoadOutcome {
    /// The policy, `None` when any error was found or any file could not be read.
    pub policy: Option<Policy>,
    /// Errors and warnings, all of them, in file order.
    pub diagnostics: Vec<Diagnostic>,
    /// Files (host paths) that exist but could not be read, with the reason. Non-empty means
    /// [`Rejected::Unreadable`], which is distinct from [`Rejected::Invalid`].
    pub unreadable: Vec<(PathBuf, String)>,
    /// The files merged, in merge order (host paths).
    pub files: Vec<PathBuf>,
}

impl LoadOutcome {
    /// Whether any diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        self.diagnostics
            .iter()
            .any(|d| d.severity == Severity::Error)
    }

    /// The policy, or why there is none: a file could not be read (which wins), or an error
    /// was found. Callers map this to their own reports (the CLI to exit codes).
    pub fn verdict(&self) -> Result<&Policy, Rejected> {
        if !self.unreadable.is_empty() {
            return Err(Rejected::Unreadable);
        }
        match &self.policy {
            Some(p) if !self.has_errors() => Ok(p),
            _ => Err(Rejected::Invalid),
        }
    }

    /// Put what was found before loading (directories that cannot be listed, problems with the
    /// set of files) first, and drop the policy when that rejects it.
    pub(crate) fn prepend(
        &mut self,
        unreadable: Vec<(PathBuf, String)>,
        diagnostics: Vec<Diagnostic>,
    ) {
        self.unreadable.splice(0..0, unreadable);
        self.diagnostics.splice(0..0, diagnostics);
        if !self.unreadable.is_empty() || self.has_errors() {
            self.policy = None;
        }
    }
}

/// Why a load gave no policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// An error in the policy (diagnostics say which).
    Invalid,
    /// A file or directory exists but could not be read.
    Unreadable,
}

/// A file to merge: the path to read, and the host path to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// Where to read it (under the root).
    pub read: PathBuf,
    /// What to call it (the host path).
    pub host: PathBuf,
}

/// Whether `path` is a symlink whose target is literally `/dev/null`. The target string is
/// compared rather than the file opened, because under a test root `/dev/null` is the host's and
/// because an admin's mask must work even when the link cannot be followed.
fn is_mask(path: &Path) -> bool {
    std::fs::read_link(path).is_ok_and(|t| t == Path::new("/dev/null"))
}

/// The files to merge under `root`, in merge order, after precedence and masking; plus the
/// directories that exist but cannot be listed.
pub fn discover(root: &Root) -> (Vec<Source>, Vec<(PathBuf, String)>) {
    let (sources, unreadable, _) = discover_all(root);
    (sources, unreadable)
}

/// [`discover`], plus a warning for each directory entry skipped because its name is not UTF-8
/// (it cannot be shown or ordered as admins expect, so it is never merged; but it is named).
pub fn discover_all(root: &Root) -> (Vec<Source>, Vec<(PathBuf, String)>, Vec<Diagnostic>) {
    let mut skipped = Vec::new();
    let mut unreadable = Vec::new();
    let mut out = Vec::new();

    let main = root.join(POLICY_MAIN);
    if main.symlink_metadata().is_ok() && !is_mask(&main) {
        out.push(Source {
            read: main,
            host: PathBuf::from(POLICY_MAIN),
        });
    }

    // Lowest precedence first, so that a later insert of the same name replaces.
    let mut by_name: BTreeMap<String, Option<Source>> = BTreeMap::new();
    for dir in [POLICY_DIR_VENDOR, POLICY_DIR_RUN, POLICY_DIR_ETC] {
        let real = root.join(dir);
        let entries = match std::fs::read_dir(&real) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                unreadable.push((PathBuf::from(dir), e.to_string()));
                continue;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    unreadable.push((PathBuf::from(dir), e.to_string()));
                    continue;
                }
            };
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                let raw = entry.file_name();
                skipped.push(Diagnostic::warning(
                    None,
                    "",
                    format!(
                        "{dir}/{}: skipped: the file name is not UTF-8",
                        raw.to_string_lossy()
                    ),
                    Some("rename it to a UTF-8 name ending in .toml".into()),
                ));
                continue;
            };
            // Hidden files are editor backups and package-manager temporaries, never policy.
            if !name.ends_with(".toml") || name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            let src = (!is_mask(&path)).then(|| Source {
                read: path,
                host: Path::new(dir).join(&name),
            });
            by_name.insert(name, src);
        }
    }
    out.extend(by_name.into_values().flatten());
    (out, unreadable, skipped)
}

/// Load the host policy from the standard directories under `root`.
pub fn load(root: &Root) -> LoadOutcome {
    let (sources, unreadable, skipped) = discover_all(root);
    let mut outcome = load_sources(&sources);
    outcome.prepend(unreadable, skipped);
    if sources.is_empty() && outcome.unreadable.is_empty() {
        outcome.diagnostics.push(Diagnostic::warning(
            None,
            "",
            format!(
                "no policy files found ({POLICY_MAIN}, {POLICY_DIR_ETC}/*.toml, \
                 {POLICY_DIR_RUN}/*.toml, {POLICY_DIR_VENDOR}/*.toml)"
            ),
            Some("with an empty policy gpuctl leaves every GPU untouched".into()),
        ));
    }
    outcome
}

/// Load an explicit list of files, merged in the order given (`gpuctl validate FILE...`).
/// Paths are reported as given.
pub fn load_files(files: &[PathBuf]) -> LoadOutcome {
    let sources: Vec<Source> = files
        .iter()
        .map(|f| Source {
            read: f.clone(),
            host: f.clone(),
        })
        .collect();
    load_sources(&sources)
}

/// Read, parse, merge and validate `sources` in order. A file that cannot be read or parsed does
/// not stop the others from being checked.
pub fn load_sources(sources: &[Source]) -> LoadOutcome {
    let mut diagnostics = Vec::new();
    let mut unreadable = Vec::new();
    let mut fragments: Vec<Fragment> = Vec::new();
    for s in sources {
        let text = match read_policy_file(&s.read) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(t) => t,
                Err(e) => {
                    diagnostics.push(Diagnostic::error(
                        Some(Loc::start(&s.host)),
                        "",
                        format!("not UTF-8 text: {e}"),
                        Some("policy files are UTF-8 TOML".into()),
                    ));
                    continue;
                }
            },
            Err(e) => {
                unreadable.push((s.host.clone(), e));
                continue;
            }
        };
        if let Some(f) = parse_fragment(&s.host, &text, &mut diagnostics) {
            fragments.push(f);
        }
    }
    let policy = build(&fragments, &mut diagnostics);
    // Read file by file, top to bottom: order by merge position, then line and column. The sort
    // is stable, so diagnostics without a place keep their relative order, first.
    diagnostics.sort_by_key(|d| {
        d.loc.as_ref().map(|l| {
            let file = sources.iter().position(|s| s.host == l.file);
            (file, l.line, l.col)
        })
    });
    if diagnostics.len() > super::caps::MAX_DIAGNOSTICS {
        let more = diagnostics.len() - super::caps::MAX_DIAGNOSTICS;
        let errors_dropped = diagnostics[super::caps::MAX_DIAGNOSTICS..]
            .iter()
            .any(|d| d.severity == Severity::Error);
        diagnostics.truncate(super::caps::MAX_DIAGNOSTICS);
        let report = if errors_dropped {
            Diagnostic::error
        } else {
            Diagnostic::warning
        };
        diagnostics.push(report(
            None,
            "",
            format!(
                "{more} more diagnostic(s) not shown (MAX_DIAGNOSTICS = {})",
                super::caps::MAX_DIAGNOSTICS
            ),
            None,
        ));
    }
    let files = sources.iter().map(|s| s.host.clone()).collect();
    let ok = unreadable.is_empty() && !diagnostics.iter().any(|d| d.severity == Severity::Error);
    LoadOutcome {
        policy: ok.then_some(policy),
        diagnostics,
        unreadable,
        files,
    }
}
