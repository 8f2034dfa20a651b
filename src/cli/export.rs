//! `gpuctl export slurm`: the Slurm GRES of this host's live GPU layout (docs/slurm.md), for
//! config management: the gres.conf lines gpuctld keeps in `[slurm] gres-file`, and the
//! node's `Gres=` for its slurm.conf line.
use super::plan::{prepare, HostArgs};
use super::Cli;
use clap::{Args, Subcommand};

/// Arguments of `gpuctl export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// What to export.
    #[command(subcommand)]
    pub to: ExportTo,
}

/// Tools gpuctl exports to.
#[derive(Debug, Subcommand)]
pub enum ExportTo {
    /// The gres.conf lines of the live layout (whole GPUs: File=, MIG devices: MultipleFiles=
    /// with their cap nodes), headed by the node's slurm.conf Gres=.
    #[command(after_long_help = "\
The lines are what gpuctld writes to [slurm] gres-file when [slurm] enabled = true; this \
command prints them whether or not Slurm is enabled, from the host as it is now (or a \
simulated one). --gres prints only the value of Gres= for the node's slurm.conf line; \
--job-submit a job_submit.lua for slurmctld that allows a team's GPU types (team-types) \
only in the partition named after the team.

Exit status: 0 printed, 1 invalid policy, 2 a policy file could not be read.")]
    Slurm(SlurmArgs),
}

/// Arguments of `gpuctl export slurm`.
#[derive(Debug, Args)]
pub struct SlurmArgs {
    /// Host.
    #[command(flatten)]
    pub host: HostArgs,
    /// The node's NodeName (default: [slurm] node-name, else the short host name).
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// Print only the node's Gres= value (`gpu:1g.10gb:4,gpu:3g.40gb:1`).
    #[arg(long, conflicts_with = "node_file")]
    pub gres: bool,
    /// Print the slurm.conf fragment `[slurm] node-file` holds: `NodeName=DEFAULT Gres=…`.
    #[arg(long)]
    pub node_file: bool,
    /// Print a job_submit.lua that allows a team's GPU types (`team-types`) only in the
    /// partition named after the team (docs/slurm.md).
    #[arg(long, conflicts_with_all = ["gres", "node_file"])]
    pub job_submit: bool,
}

/// Run `gpuctl export`.
pub fn run(cli: &Cli, args: &ExportArgs) -> anyhow::Result<i32> {
    let ExportTo::Slurm(a) = &args.to;
    let (p, _h, obs) = match prepare(cli, &a.host, false, false)? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let g = crate::slurm::gres(&p, &obs);
    for s in &g.skipped {
        eprintln!("gpuctl: left out: {s}");
    }
    if a.gres {
        println!("{}", g.node_gres());
        return Ok(super::exit::OK);
    }
    if a.job_submit {
        print!(
            "{}",
            crate::slurm::job_submit_lua(p.teams.keys().map(|t| &**t))
        );
        return Ok(super::exit::OK);
    }
    if a.node_file {
        print!("{}", g.render_node());
        return Ok(super::exit::OK);
    }
    let node = a
        .node
        .clone()
        .or_else(|| p.slurm.node_name.clone())
        .or_else(crate::real::slurm::short_hostname)
        .unwrap_or_else(|| "localhost".into());
    print!("{}", g.render(&node));
    Ok(super::exit::OK)
}
