//! `gpuctld`: the agent daemon. All logic lives in the library's `daemon` module.
use anyhow::Context;
use clap::Parser;
use std::path::PathBuf;

/// Keep this host's GPUs, MPS daemons and team slices matching the gpuctl policy.
#[derive(Debug, Parser)]
#[command(name = "gpuctld", version)]
struct Args {
    /// Log filter (`info`, `debug`, `gpuctl=trace`); overrides GPUCTL_LOG.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Resolve every host path under DIR (tests).
    #[arg(long, value_name = "DIR", default_value = "/")]
    root: PathBuf,
    /// Seconds between drift checks.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    drift_secs: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    gpuctl::daemon::logging::init(args.log_level.as_deref())?;
    let opts = gpuctl::daemon::Options {
        root: gpuctl::paths::Root::new(args.root),
        drift: std::time::Duration::from_secs(args.drift_secs.max(1)),
        ..Default::default()
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?
        .block_on(gpuctl::daemon::run(opts))?;
    Ok(())
}
