//! `gpuctl validate`.
use super::Cli;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `gpuctl validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Files to check, merged in the order given; default: the host's policy directories.
    pub paths: Vec<PathBuf>,
    /// Print diagnostics as JSON for config management.
    #[arg(long)]
    pub json: bool,
}

/// Run `gpuctl validate`.
pub fn run(_cli: &Cli, _args: &ValidateArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
