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

use super::parse::{parse_fragment, Fragment};
use super::validate::build;
use super::{Diagnostic, Loc, Policy, Severity};
use crate::paths::{Root, POLICY_DIR_ETC, POLICY_DIR_RUN, POLICY_DIR_VENDOR, POLICY_MAIN};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
                continue; // not UTF-8: cannot end in .toml in any name an admin would write
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
    (out, unreadable)
}

/// Load the host policy from the standard directories under `root`.
pub fn load(root: &Root) -> LoadOutcome {
    let (sources, unreadable) = discover(root);
    let mut outcome = load_sources(&sources);
    outcome.unreadable.splice(0..0, unreadable);
    if sources.is_empty() && outcome.unreadable.is_empty() {
        outcome.diagnostics.push(Diagnostic {
            severity: Severity::Warning,
            loc: None,
            key: String::new(),
            message: format!(
                "no policy files found ({POLICY_MAIN}, {POLICY_DIR_ETC}/*.toml, \
                 {POLICY_DIR_RUN}/*.toml, {POLICY_DIR_VENDOR}/*.toml)"
            ),
            help: Some("with an empty policy gpuctl leaves every GPU untouched".into()),
        });
    }
    if !outcome.unreadable.is_empty() {
        outcome.policy = None;
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
        let text = match std::fs::read(&s.read) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(t) => t,
                Err(e) => {
                    diagnostics.push(Diagnostic {
                        severity: Severity::Error,
                        loc: Some(Loc {
                            file: s.host.clone(),
                            line: 1,
                            col: 1,
                        }),
                        key: String::new(),
                        message: format!("not UTF-8 text: {e}"),
                        help: Some("policy files are UTF-8 TOML".into()),
                    });
                    continue;
                }
            },
            Err(e) => {
                unreadable.push((s.host.clone(), e.to_string()));
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
    let files = sources.iter().map(|s| s.host.clone()).collect();
    let ok = unreadable.is_empty() && !diagnostics.iter().any(|d| d.severity == Severity::Error);
    LoadOutcome {
        policy: ok.then_some(policy),
        diagnostics,
        unreadable,
        files,
    }
}
