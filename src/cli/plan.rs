//! `gpuctl plan`, `gpuctl apply` and `gpuctl check`.
use super::Cli;
use clap::Args;
use std::path::PathBuf;

/// Where the host state comes from.
#[derive(Debug, Args)]
pub struct HostArgs {
    /// Plan against a simulated host, e.g. `h100-80gb*8` or `a100-40gb*4,h200*2`.
    #[arg(long, value_name = "SPEC")]
    pub simulate: Option<String>,
    /// State file of the simulated host; created from SPEC when missing, updated by apply.
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
}

/// Arguments of `gpuctl plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Host.
    #[command(flatten)]
    pub host: HostArgs,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `gpuctl apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Host.
    #[command(flatten)]
    pub host: HostArgs,
}

/// Arguments of `gpuctl check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Host.
    #[command(flatten)]
    pub host: HostArgs,
}

/// Run `gpuctl plan`.
pub fn run_plan(_cli: &Cli, _a: &PlanArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}

/// Run `gpuctl apply`.
pub fn run_apply(_cli: &Cli, _a: &ApplyArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}

/// Run `gpuctl check`.
pub fn run_check(_cli: &Cli, _a: &CheckArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
