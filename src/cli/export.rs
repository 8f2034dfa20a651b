//! `gpuctl export slurm`: the Slurm GRES of this host's live GPU layout (docs/slurm.md), for
//! config management: the gres.conf lines gpuctld keeps in `[slurm] gres-file`, and the
//! node's `Gres=` for its slurm.conf line. `gpuctl export alertmanager`: the routing of
//! gpuctl's alerts to each team's receiver (docs/monitoring.md).
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
    /// An alertmanager.yml routing gpuctl's alerts by their team label to one receiver per
    /// team of the policy (and every alert to the admins' receiver).
    #[command(after_long_help = "\
Each of --webhook, --slack-channel, --slack-api-url-file and --email is a template: {team} \
becomes the team's name, and \"admins\" in the admins' receiver (which gets every alert). A \
device out of service inhibits the alerts about the same device it explains. Regenerate when \
the teams change; check with `amtool check-config` (docs/monitoring.md, \"Alerts by team\").

Exit status: 0 printed, 1 invalid policy or no receiver given, 2 a policy file could not be \
read.")]
    Alertmanager(AlertmanagerArgs),
}

/// Arguments of `gpuctl export alertmanager`.
#[derive(Debug, Args)]
pub struct AlertmanagerArgs {
    /// Policy files to use instead of the host's policy directories, merged in the order given.
    #[arg(value_name = "POLICY")]
    pub policy: Vec<std::path::PathBuf>,
    /// A webhook URL per team (`http://hooks.example.org/gpu/{team}`).
    #[arg(long, value_name = "URL")]
    pub webhook: Option<String>,
    /// A Slack channel per team (`#gpu-{team}`).
    #[arg(long, value_name = "CHANNEL", requires = "slack_api_url_file")]
    pub slack_channel: Option<String>,
    /// The file holding each team's Slack webhook URL (`/etc/alertmanager/slack-{team}.url`).
    #[arg(long, value_name = "FILE", requires = "slack_channel")]
    pub slack_api_url_file: Option<String>,
    /// An e-mail address per team (`{team}-leads@example.org`).
    #[arg(long, value_name = "ADDRESS", requires_all = ["smtp_smarthost", "smtp_from"])]
    pub email: Option<String>,
    /// The SMTP relay for --email (`smtp.example.org:25`).
    #[arg(long, value_name = "HOST:PORT", requires = "email")]
    pub smtp_smarthost: Option<String>,
    /// The sender for --email.
    #[arg(long, value_name = "ADDRESS", requires = "email")]
    pub smtp_from: Option<String>,
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
    let a = match &args.to {
        ExportTo::Slurm(a) => a,
        ExportTo::Alertmanager(a) => return alertmanager(cli, a),
    };
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

fn alertmanager(cli: &Cli, a: &AlertmanagerArgs) -> anyhow::Result<i32> {
    use crate::alerts::{Email, Slack, Templates};
    let p = match super::plan::load_policy(cli, &a.policy, false) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let t = Templates {
        webhook: a.webhook.clone(),
        slack: a
            .slack_channel
            .clone()
            .zip(a.slack_api_url_file.clone())
            .map(|(channel, api_url_file)| Slack {
                channel,
                api_url_file,
            }),
        email: a.email.clone().map(|to| Email {
            to,
            smarthost: a.smtp_smarthost.clone().unwrap_or_default(),
            from: a.smtp_from.clone().unwrap_or_default(),
        }),
    };
    let teams: Vec<&str> = p.teams.keys().map(|t| &**t).collect();
    match crate::alerts::render(&teams, &t) {
        Ok(y) => {
            print!("{y}");
            Ok(super::exit::OK)
        }
        Err(e) => {
            eprintln!("gpuctl export alertmanager: {e}");
            Ok(super::exit::INVALID)
        }
    }
}
