//! The `gpuctl` command line. Each subcommand lives in its own module; `main.rs` only calls
//! [`run`].

use clap::{Parser, Subcommand};
use std::path::PathBuf;

pub mod device;
pub mod doctor;
pub mod env;
pub mod events;
pub mod export;
pub mod idle;
pub mod import;
pub mod metrics;
pub mod plan;
pub mod report;
pub mod requeue;
pub mod run;
pub mod shell;
pub mod status;
pub mod teams;
pub mod top;
pub mod validate;

/// Exit codes shared by subcommands.
pub mod exit {
    /// Success / valid / converged.
    pub const OK: i32 = 0;
    /// Invalid policy, or changes pending (`check`).
    pub const INVALID: i32 = 1;
    /// A file could not be read, or another operational failure.
    pub const UNREADABLE: i32 = 2;
    /// `shell`/`run`/`env`: the caller is not a member of the team.
    pub const NOT_MEMBER: i32 = 3;
    /// `shell`/`run`/`env`: no such team, or not a valid team name.
    pub const UNKNOWN_TEAM: i32 = 4;
    /// `shell`/`run`/`env`: the team has no devices on this host now.
    pub const NO_DEVICES: i32 = 5;
    /// gpuctld is not running (or has no valid policy yet).
    pub const NO_DAEMON: i32 = 6;

    /// The exit code of a policy load: 0 valid, 1 invalid, 2 unreadable.
    pub fn of_load(o: &crate::policy::LoadOutcome) -> i32 {
        match o.verdict() {
            Ok(_) => OK,
            Err(crate::policy::Rejected::Invalid) => INVALID,
            Err(crate::policy::Rejected::Unreadable) => UNREADABLE,
        }
    }
    /// gpuctld authorized the request but could not place the process in the team's slice.
    pub const PLACEMENT: i32 = 7;
    /// `shell`/`run`: every device the job could have is held to capacity now.
    pub const NO_FREE_DEVICE: i32 = 8;
}

/// Make a shared NVIDIA GPU host match a declarative team policy
///
/// gpuctl makes a shared NVIDIA GPU host match a declarative team policy: MIG layout, MPS
/// daemons, per-team systemd slices with device, memory and CPU limits, and each team's device
/// view.
#[derive(Debug, Parser)]
#[command(name = "gpuctl", version, propagate_version = true)]
pub struct Cli {
    /// Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR.
    #[arg(long, global = true, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check policy files; exit 0 when valid, 1 when invalid, 2 when unreadable.
    Validate(validate::ValidateArgs),
    /// Show what would change to make the host match the policy.
    Plan(plan::PlanArgs),
    /// Make the host (or a simulated host) match the policy.
    Apply(plan::ApplyArgs),
    /// Exit 0 when the host matches the policy, 1 when changes are pending.
    Check(plan::CheckArgs),
    /// Start your login shell in a team's share (its GPUs, limits and environment).
    Shell(shell::ShellArgs),
    /// Run one command in a team's share; its exit status is passed through.
    Run(run::RunArgs),
    /// Print a team's environment (shell, systemd EnvironmentFile, JSON) or its container share
    /// (cdi flags; docker flags or a compose service for Docker without CDI).
    Env(env::EnvArgs),
    /// List the teams you may join and what each gives.
    Teams(teams::TeamsArgs),
    /// What gpuctld reports: teams, GPUs, last reconcile, last policy error.
    Status(status::StatusArgs),
    /// Turn another tool's GPU layout (NVIDIA mig-parted) into a policy drop-in.
    Import(import::ImportArgs),
    /// Is this host ready for gpuctl? Read-only checks of driver, cgroups, systemd, devices, MIG.
    Doctor(doctor::DoctorArgs),
    /// Who uses which GPU and MIG device: teams, users, units, memory, strays.
    Top(top::TopArgs),
    /// gpuctld's Prometheus metrics, on stdout or as a node_exporter textfile.
    Metrics(metrics::MetricsArgs),
    /// Holders of GPU shares that their team's idle rule flags: idle, warned, being stopped.
    Idle(idle::IdleArgs),
    /// Device health: list, drain a device for maintenance, bring one back.
    Device(device::DeviceArgs),
    /// GPU-hours held and used per team, user or device, from gpuctld's ledger.
    Report(report::ReportArgs),
    /// Your events: idle warnings and stops, queued jobs started, loans taken back, devices out
    /// of service.
    Events(events::EventsArgs),
    /// This host's GPUs in another tool's terms: Slurm's gres.conf lines and Gres=.
    Export(export::ExportArgs),
}

/// Parse the command line and run; returns the process exit code.
pub fn run() -> i32 {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match run::parse_fast(&argv) {
        Some(run::Fast::Run(a)) => return run::run(&a),
        Some(run::Fast::Shell(a)) => return shell::run(&a),
        None => {}
    }
    let cli = Cli::parse_from(argv);
    let result = match &cli.command {
        Command::Validate(a) => validate::run(&cli, a),
        Command::Plan(a) => plan::run_plan(&cli, a),
        Command::Apply(a) => plan::run_apply(&cli, a),
        Command::Check(a) => plan::run_check(&cli, a),
        Command::Import(a) => import::run(a),
        Command::Doctor(a) => doctor::run(&cli, a),
        Command::Export(a) => export::run(&cli, a),
        // These talk to gpuctld and print their own one-line refusals with their own codes.
        Command::Shell(a) => return shell::run(a),
        Command::Run(a) => return run::run(a),
        Command::Env(a) => return env::run(a),
        Command::Teams(a) => return teams::run(a),
        Command::Status(a) => return status::run(a),
        Command::Top(a) => return top::run(a),
        Command::Metrics(a) => return metrics::run(a),
        Command::Idle(a) => return idle::run(a),
        Command::Device(a) => return device::run(a),
        Command::Report(a) => return report::run(a),
        Command::Events(a) => return events::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpuctl: {e:#}");
            exit::UNREADABLE
        }
    }
}

/// The clap command, for man pages and shell completions.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}
