//! `gpuctl run --team T -- CMD ARGS…`: one command in the team's share.
//!
//! Same placement as `gpuctl shell` ([`super::shell`]); the command replaces gpuctl in place,
//! so its exit status, signals, terminal and stdin are its own.

use super::shell::{exec_with, exit_table, join_team, Failure};
use clap::Args;
use std::ffi::OsString;

/// Arguments of `gpuctl run`.
#[derive(Debug, Args)]
#[command(after_long_help = RUN_HELP)]
pub struct RunArgs {
    /// The team whose share the command runs in.
    #[arg(long, short = 't', value_name = "TEAM")]
    pub team: String,
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

const RUN_HELP: &str = concat!(
    "Runs CMD inside a new scope in gpu-<TEAM>.slice with the team's environment from gpuctld \
(CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, MPS directories, GPUCTL_TEAM; inherited CUDA_*, \
NVIDIA_* and GPUCTL_* are dropped). gpuctl replaces itself with CMD, so CMD keeps the terminal, \
stdin and signals, and its exit status is gpuctl's.\n\n",
    exit_table!("CMD")
);

/// Run `gpuctl run`.
pub fn run(args: &RunArgs) -> i32 {
    let Some((program, rest)) = args.command.split_first() else {
        return Failure {
            code: super::exit::UNREADABLE,
            message: "no command given".into(),
        }
        .report();
    };
    match join_team(&args.team) {
        Ok(env) => exec_with(program, rest, &env),
        Err(f) => f.report(),
    }
}
