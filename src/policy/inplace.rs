//! Validate a drop-in *in place*: `gpuctl validate --as /etc/gpuctl/policy.d/50-gpus.toml FILE`.
//!
//! Config management (Ansible's `template: … validate:`, Puppet's `validate_cmd`, Salt's
//! `check_cmd`) renders a file to a temporary path and asks a command whether it may be
//! installed. A drop-in alone is rarely a valid policy (its `owner = "infer"` names a team that
//! another file defines), so it must be checked *as if it were installed* at its destination,
//! merged with the host's other policy files. This module builds that list of sources from
//! [`discover`]'s and leaves loading to [`load_sources`], so the merge and precedence rules stay
//! in one place ([`super::load`]).
//!
//! Diagnostics for FILE name FILE exactly as given (Ansible shows its temp path), and the
//! others their host paths, as plain `gpuctl validate` does.

use super::load::{discover, load_sources, LoadOutcome, Source};
use super::{Diagnostic, Loc};
use crate::paths::{Root, POLICY_DIR_ETC, POLICY_DIR_RUN, POLICY_DIR_VENDOR, POLICY_MAIN};
use std::path::{Path, PathBuf};

/// The policy directories, lowest precedence first (as [`discover`] ranks them).
const DIRS: [&str; 3] = [POLICY_DIR_VENDOR, POLICY_DIR_RUN, POLICY_DIR_ETC];

/// Where a validated file would be installed: the main policy file, or a fragment name in one of
/// the drop-in directories (index into [`DIRS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `/etc/gpuctl/policy.toml`.
    Main,
    /// `DIR/NAME.toml`, DIR one of the three drop-in directories.
    Fragment {
        /// Index into the precedence order (0 = `/usr/lib`, 2 = `/etc`).
        dir: usize,
        /// The file name, e.g. `50-gpus.toml`.
        name: String,
    },
}

/// Parse `--as PATH` into a [`Target`]; the error says which paths are accepted.
pub fn parse_target(path: &Path) -> Result<Target, String> {
    if path == Path::new(POLICY_MAIN) {
        return Ok(Target::Main);
    }
    let accepted = || {
        format!(
            "--as {}: not a path gpuctld loads policy from; expected {POLICY_MAIN} or \
             NAME.toml in {POLICY_DIR_ETC}, {POLICY_DIR_RUN} or {POLICY_DIR_VENDOR}",
            path.display()
        )
    };
    let (Some(parent), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str()))
    else {
        return Err(accepted());
    };
    // Same filter as discovery: a hidden or non-.toml file would never be loaded, so validating
    // it "in place" would prove nothing.
    if !name.ends_with(".toml") || name.starts_with('.') {
        return Err(accepted());
    }
    let dir = DIRS
        .iter()
        .position(|d| Path::new(d) == parent)
        .ok_or_else(accepted)?;
    Ok(Target::Fragment {
        dir,
        name: name.to_string(),
    })
}

/// The sources to merge when `file` is installed at `target` under `root`, the directories that
/// cannot be listed, and an error when the target is shadowed or masked by a same-name file in a
/// higher-precedence directory (installed there, FILE would never be loaded).
pub fn sources_as(
    root: &Root,
    target: &Target,
    file: &Path,
) -> (Vec<Source>, Vec<(PathBuf, String)>, Vec<Diagnostic>) {
    let (mut sources, unreadable) = discover(root);
    let mut shadowed = Vec::new();
    let me = Source {
        read: file.to_path_buf(),
        host: file.to_path_buf(),
    };
    match target {
        Target::Main => {
            sources.retain(|s| s.host != Path::new(POLICY_MAIN));
            sources.insert(0, me);
        }
        Target::Fragment { dir, name } => {
            // A same-name file (or /dev/null mask) in a higher directory wins over the target:
            // installing there would change nothing, which the admin must hear about.
            for higher in &DIRS[dir + 1..] {
                let host = Path::new(higher).join(name);
                if root.join(&host).symlink_metadata().is_ok() {
                    shadowed.push(Diagnostic::error(
                        Some(Loc::start(file)),
                        "",
                        format!(
                            "installed as {}/{name} it would never be loaded: {} has the same \
                             name and higher precedence",
                            DIRS[*dir],
                            host.display()
                        ),
                        Some(format!("install it as {} instead", host.display())),
                    ));
                }
            }
            let is_fragment_named = |s: &Source, n: &str| {
                s.host.file_name().and_then(|f| f.to_str()) == Some(n)
                    && s.host
                        .parent()
                        .is_some_and(|p| DIRS.iter().any(|d| Path::new(d) == p))
            };
            // Replaces the installed copy and any lower same-name fragment, as installing would.
            sources.retain(|s| !is_fragment_named(s, name));
            // Fragments merge in lexical order of file name, after the main file.
            let at = sources
                .iter()
                .position(|s| {
                    s.host != Path::new(POLICY_MAIN)
                        && s.host.file_name().and_then(|f| f.to_str()) > Some(name.as_str())
                })
                .unwrap_or(sources.len());
            sources.insert(at, me);
        }
    }
    (sources, unreadable, shadowed)
}

/// Load the host's policy with `file` in place of (or added as) `target`.
pub fn load_as(root: &Root, target: &Target, file: &Path) -> LoadOutcome {
    let (sources, unreadable, shadowed) = sources_as(root, target, file);
    let mut outcome = load_sources(&sources);
    outcome.prepend(unreadable, shadowed);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Severity;

    const TEAMS: &str = "version = 1\n[teams.infer]\nmembers = [\"alice\"]\n";
    const GPUS: &str = "version = 1\n[[gpu]]\nindex = [0]\nowner = \"infer\"\n";

    fn put(root: &Path, host: &str, text: &str) {
        let p = root.join(host.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn target(s: &str) -> Target {
        parse_target(Path::new(s)).unwrap()
    }

    /// [`load_as`] with the host under `root` and `file` installed `at` a host path.
    fn load_at(root: &Path, at: &str, file: &Path) -> LoadOutcome {
        load_as(&Root::new(root), &target(at), file)
    }

    #[test]
    fn targets_accepted_and_refused() {
        assert_eq!(target(POLICY_MAIN), Target::Main);
        for (path, dir, name) in [
            ("/etc/gpuctl/policy.d/50-gpus.toml", 2, "50-gpus.toml"),
            ("/usr/lib/gpuctl/policy.d/x.toml", 0, "x.toml"),
        ] {
            let name = name.to_string();
            assert_eq!(target(path), Target::Fragment { dir, name });
        }
        for bad in [
            "/etc/gpuctl/policy.d/50-gpus.yaml",
            "/etc/gpuctl/policy.d/.50.toml",
            "/etc/gpuctl/50.toml",
            "etc/gpuctl/policy.d/50.toml",
            "/etc/gpuctl/policy.d/sub/50.toml",
        ] {
            let e = parse_target(Path::new(bad)).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    /// The case: a drop-in using a team defined in another file is valid in place, and
    /// invalid alone.
    #[test]
    fn drop_in_checked_against_the_hosts_other_files() {
        let root = tempfile::tempdir().unwrap();
        put(root.path(), "/etc/gpuctl/policy.d/10-teams.toml", TEAMS);
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("source");
        std::fs::write(&file, GPUS).unwrap();

        let alone = crate::policy::load_files(std::slice::from_ref(&file));
        assert_eq!(
            alone.verdict().err(),
            Some(crate::policy::Rejected::Invalid)
        );

        let o = load_at(root.path(), "/etc/gpuctl/policy.d/50-gpus.toml", &file);
        assert!(o.verdict().is_ok(), "{:?}", o.diagnostics);
        assert_eq!(
            o.files,
            vec![PathBuf::from("/etc/gpuctl/policy.d/10-teams.toml"), file]
        );
    }

    /// The installed copy being replaced is not merged (its old content would collide or hide
    /// the new one's errors), and errors name FILE as given.
    #[test]
    fn replaces_installed_copy_and_names_file_as_given() {
        let root = tempfile::tempdir().unwrap();
        put(root.path(), "/etc/gpuctl/policy.d/10-teams.toml", TEAMS);
        put(root.path(), "/etc/gpuctl/policy.d/50-gpus.toml", GPUS);
        put(root.path(), "/usr/lib/gpuctl/policy.d/50-gpus.toml", GPUS);
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("ansible-tmp-1/source");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(
            &file,
            "version = 1\n[[gpu]]\nindex = [0]\nowner = \"infre\"\n",
        )
        .unwrap();
        let o = load_at(root.path(), "/etc/gpuctl/policy.d/50-gpus.toml", &file);
        assert_eq!(o.verdict().err(), Some(crate::policy::Rejected::Invalid));
        let errs: Vec<_> = o
            .diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .collect();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].to_string().starts_with(&format!(
            "{}:4:9: error: gpu[0].owner: unknown team 'infre'",
            file.display()
        )));
        assert_eq!(o.files.len(), 2, "{:?}", o.files);
    }

    /// Merge position follows the file name: a fragment that sorts first is merged first, so a
    /// later file's duplicate is the one reported.
    #[test]
    fn merged_in_name_order() {
        let root = tempfile::tempdir().unwrap();
        put(root.path(), POLICY_MAIN, "version = 1\n");
        put(root.path(), "/run/gpuctl/policy.d/20-b.toml", TEAMS);
        put(root.path(), "/etc/gpuctl/policy.d/40-d.toml", GPUS);
        let file = root.path().join("new");
        std::fs::write(&file, "version = 1\n").unwrap();
        let (s, p, d) = sources_as(
            &Root::new(root.path()),
            &target("/etc/gpuctl/policy.d/30-c.toml"),
            &file,
        );
        assert!(p.is_empty() && d.is_empty());
        let hosts: Vec<_> = s.iter().map(|s| s.host.clone()).collect();
        assert_eq!(
            hosts,
            vec![
                PathBuf::from(POLICY_MAIN),
                PathBuf::from("/run/gpuctl/policy.d/20-b.toml"),
                file.clone(),
                PathBuf::from("/etc/gpuctl/policy.d/40-d.toml"),
            ]
        );
        let (s, _, _) = sources_as(&Root::new(root.path()), &Target::Main, &file);
        assert_eq!(s[0].host, file);
        assert_eq!(s.len(), 3);
    }

    /// Installing under a lower directory than an existing same-name file (or mask) would not
    /// take effect: an error (exit 1) naming the file that wins, not "valid".
    #[test]
    fn shadowed_target_is_reported() {
        let root = tempfile::tempdir().unwrap();
        put(root.path(), "/etc/gpuctl/policy.d/50-gpus.toml", TEAMS);
        let file = root.path().join("new");
        std::fs::write(&file, TEAMS).unwrap();
        let o = load_at(root.path(), "/usr/lib/gpuctl/policy.d/50-gpus.toml", &file);
        assert_eq!(o.verdict().err(), Some(crate::policy::Rejected::Invalid));
        let d = o.diagnostics[0].to_string();
        assert!(
            d.starts_with(&format!("{}:1:1: error: ", file.display())),
            "{d}"
        );
        assert!(
            d.contains("/etc/gpuctl/policy.d/50-gpus.toml has the same name"),
            "{d}"
        );
        assert!(o.policy.is_none());
    }
}
