//! The man pages (`gpuctl(1)`, one `gpuctl-<subcommand>(1)` each) and the bash, zsh and fish
//! completions the packages carry are rendered from the clap command and checked in under
//! packaging/assets/: packaging copies them, so building a package needs no generator build, and
//! this test fails when they drift from `--help` (`GPUCTL_UPDATE_GOLDEN=1` rewrites them).

#[path = "common/golden.rs"]
mod golden;

use clap_complete::Shell;
use std::collections::BTreeMap;

fn rendered() -> BTreeMap<String, String> {
    let dir = tempfile::tempdir().unwrap();
    clap_mangen::generate_to(gpuctl::cli::command(), dir.path()).unwrap();
    let mut out: BTreeMap<String, String> = golden::read_dir(dir.path())
        .into_iter()
        .map(|(name, text)| (format!("man/{name}"), text))
        .collect();
    for (shell, file) in [
        (Shell::Bash, "gpuctl"),
        (Shell::Zsh, "_gpuctl"),
        (Shell::Fish, "gpuctl.fish"),
    ] {
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut gpuctl::cli::command(), "gpuctl", &mut buf);
        out.insert(
            format!("completions/{file}"),
            String::from_utf8(buf).unwrap(),
        );
    }
    out
}

#[test]
fn checked_in_man_pages_and_completions_match_the_cli() {
    let got = rendered();
    // What packaging/build.sh installs by name, and one page per subcommand.
    for name in [
        "man/gpuctl.1",
        "man/gpuctl-shell.1",
        "completions/gpuctl",
        "completions/_gpuctl",
        "completions/gpuctl.fish",
    ] {
        assert!(
            got.contains_key(name),
            "{name} is not rendered: {:?}",
            got.keys()
        );
    }
    golden::check_dir(&golden::repo_path("packaging/assets"), &got);
}
