//! `gpuctl run --team T -- CMD ARGS…`: one command in the team's share.
//!
//! Same placement as `gpuctl shell` ([`super::shell`]); the command replaces gpuctl in place,
//! so its exit status, signals, terminal and stdin are its own.

use super::shell::{checked_team, exec_with, exit_table, join_team, Failure, PlaceArgs, ShellArgs};
use clap::Args;
use std::ffi::OsString;

/// Arguments of `gpuctl run`.
#[derive(Debug, Args)]
#[command(after_long_help = RUN_HELP)]
pub struct RunArgs {
    /// The team whose share the command runs in.
    #[arg(long, short = 't', value_name = "TEAM")]
    pub team: String,
    /// Which of the share's devices.
    #[command(flatten)]
    pub place: PlaceArgs,
    /// On a borrowed device: when its owner takes it back, run CMD again once a device is
    /// free (queued like --wait, for its DURATION, else without limit). gpuctl then stays as
    /// CMD's parent instead of replacing itself.
    #[arg(long)]
    pub requeue: bool,
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

const RUN_HELP: &str = concat!(
    "Runs CMD inside a new scope in gpu-<TEAM>.slice with the team's environment from gpuctld \
(CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, MPS directories, GPUCTL_TEAM, GPUCTL_CDI_DEVICE: \
the CDI name of the placed device for `podman run --device`; inherited CUDA_*, \
NVIDIA_* and GPUCTL_* are dropped). gpuctl replaces itself with CMD, so CMD keeps the terminal, \
stdin and signals, and its exit status is gpuctl's (with --requeue gpuctl stays as CMD's parent, \
with the same exit status).\n\n",
    exit_table!("CMD")
);

/// `gpuctl run --team T -- CMD…` and `gpuctl shell --team T` in their plain spellings
/// (`--team T`, `--team=T`, `-t T`), recognized without building clap's command tree: in the
/// VM benchmark clap's parse alone was a tenth of a `gpuctl run`. Anything else (other options,
/// `--help`, no `--`, a team value that looks like an option) returns `None` and goes to clap,
/// which parses these spellings to the same result (tested).
pub fn parse_fast(argv: &[OsString]) -> Option<Fast> {
    let sub = argv.get(1)?.to_str()?;
    if sub != "run" && sub != "shell" {
        return None;
    }
    // Lossy: a team name that is not UTF-8 is an invalid team name (exit 4, one line), not a
    // usage error of clap's (exit 2).
    let a2 = argv.get(2)?.to_string_lossy();
    let (team, used) = match a2.as_ref() {
        "--team" | "-t" => (argv.get(3)?.to_string_lossy().into_owned(), 2),
        a => (a.strip_prefix("--team=")?.to_string(), 1),
    };
    let team = team.as_str();
    if team.is_empty() || team.starts_with('-') {
        return None;
    }
    let rest = &argv[2 + used..];
    match sub {
        "shell" if rest.is_empty() => Some(Fast::Shell(ShellArgs {
            team: team.into(),
            place: PlaceArgs::default(),
        })),
        "run" if rest.len() >= 2 && rest[0] == "--" => Some(Fast::Run(RunArgs {
            team: team.into(),
            place: PlaceArgs::default(),
            requeue: false,
            command: rest[1..].to_vec(),
        })),
        _ => None,
    }
}

/// A command line [`parse_fast`] recognized.
#[derive(Debug)]
pub enum Fast {
    /// `gpuctl run`.
    Run(RunArgs),
    /// `gpuctl shell`.
    Shell(ShellArgs),
}

/// Run `gpuctl run`.
pub fn run(args: &RunArgs) -> i32 {
    let Some((program, rest)) = args.command.split_first() else {
        return Failure::new(super::exit::UNREADABLE, "no command given").report();
    };
    if args.requeue {
        return super::requeue::supervise(&super::requeue::Job {
            team: &args.team,
            place: &args.place,
            command: &args.command,
        });
    }
    match checked_team(&args.team).and_then(|team| join_team(&team, &args.place)) {
        Ok(env) => {
            if let Some(scope) = env.get("GPUCTL_SCOPE") {
                super::requeue::report_scope(scope);
            }
            exec_with(program, rest, &env)
        }
        Err(f) => f.report(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn argv(s: &[&str]) -> Vec<OsString> {
        std::iter::once("gpuctl")
            .chain(s.iter().copied())
            .map(OsString::from)
            .collect()
    }

    #[test]
    fn fast_path_agrees_with_clap_wherever_it_answers() {
        let cases: &[&[&str]] = &[
            &["run", "--team", "infer", "--", "true"],
            &["run", "--team=infer", "--", "cat", "/proc/self/cgroup"],
            &["run", "-t", "infer", "--", "sh", "-c", "exit 3", "--", "-x"],
            &["run", "--team", "infer", "--", "--", "x"],
            &["shell", "--team", "infer"],
            &["shell", "-t", "a_b-c"],
            &["shell", "--team=infer"],
        ];
        for c in cases {
            let a = argv(c);
            let fast = parse_fast(&a).unwrap_or_else(|| panic!("{c:?} takes the fast path"));
            let slow = Cli::try_parse_from(&a).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            match (fast, slow.command) {
                (Fast::Run(f), Command::Run(s)) => {
                    assert_eq!(
                        (f.team, f.place, f.command),
                        (s.team, s.place, s.command),
                        "{c:?}"
                    )
                }
                (Fast::Shell(f), Command::Shell(s)) => {
                    assert_eq!((f.team, f.place), (s.team, s.place), "{c:?}")
                }
                (f, s) => panic!("{c:?}: fast {f:?}, clap {s:?}"),
            }
        }
    }

    #[test]
    fn a_team_name_that_is_not_utf8_is_an_invalid_team_not_a_usage_error() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(b"\xff\xfe".to_vec());
        let mut a = argv(&["run", "--team"]);
        a.push(bad);
        a.extend(["--", "true"].map(OsString::from));
        let Some(Fast::Run(r)) = parse_fast(&a) else {
            panic!("not taken by the fast path");
        };
        // run() would print this refusal and exit 4 (UNKNOWN_TEAM), before any bus call.
        assert!(crate::join::check_team_name(&r.team).is_err());
        assert_eq!(
            super::super::shell::checked_team(&r.team)
                .err()
                .map(|f| f.code),
            Some(crate::cli::exit::UNKNOWN_TEAM)
        );
    }

    #[test]
    fn placement_options_parse_through_clap() {
        let a = argv(&[
            "run",
            "--team",
            "t",
            "--gpus",
            "all",
            "--device",
            "1",
            "--gpu-memory",
            "2G",
            "--",
            "true",
        ]);
        let Command::Run(r) = Cli::try_parse_from(&a).unwrap().command else {
            panic!("not run");
        };
        assert_eq!(r.place.gpus, Some(crate::placement::Gpus::All));
        assert_eq!(r.place.gpu_memory, Some(2 << 30));
        assert_eq!(
            r.place.options().get("gpu-memory").map(String::as_str),
            Some("2147483648")
        );
        for bad in [
            &["run", "--team", "t", "--gpus", "0", "--", "true"][..],
            &["run", "--team", "t", "--gpu-memory", "50%", "--", "true"],
        ] {
            assert!(Cli::try_parse_from(argv(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn anything_unusual_is_left_to_clap() {
        let cases: &[&[&str]] = &[
            &["run", "--help"],
            &["run", "--team", "infer", "true"],
            &["run", "--team", "infer", "--gpus", "2", "--", "true"],
            &["shell", "--team", "infer", "--device", "MIG-1"],
            &["run", "--team", "infer", "--"],
            &["run", "--team", "-x", "--", "true"],
            &["run", "--team="],
            &["run", "--team"],
            &["--root", "/x", "run", "--team", "infer", "--", "true"],
            &["shell", "--team", "infer", "extra"],
            &["shell", "--team", "infer", "--root", "/"],
            &["shell"],
            &["status"],
            &[],
        ];
        for c in cases {
            assert!(parse_fast(&argv(c)).is_none(), "{c:?} must go to clap");
        }
    }
}
