//! `gpuctl import mig-parted FILE -c CONFIG [--owner TEAM] [-o OUT]`.
use super::exit;
use crate::import::mig_parted;
use crate::policy::valid_team_name;
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// Arguments of `gpuctl import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The tool whose file to import.
    #[command(subcommand)]
    pub from: ImportFrom,
}

/// Tools gpuctl imports from.
#[derive(Debug, Subcommand)]
pub enum ImportFrom {
    /// Turn one config of an NVIDIA mig-parted file into a policy drop-in.
    #[command(after_long_help = "\
Maps devices (all / [indices]; device-filter PCI IDs become one model selector per model gpuctl \
knows, so on a host only the entries of its models select GPUs; an ID of a model gpuctl does not \
know is named on stderr and in the drop-in, and its GPUs are left as they are), mig-enabled and \
mig-devices (\"1g.10gb\": 7; \"1c.3g.40gb\": 2 is two 3g.40gb instances with one 1c compute \
instance each; MIG enabled without devices, as in all-enabled, is mig = []: MIG on, no \
instances, no team). mig-parted has no owners: every share gets --owner, or a placeholder the \
drop-in does not validate with until it is replaced.

A field gpuctl cannot express is named on stderr (YAML path and reason) and nothing is written, \
exit 1; with --skip-unsupported the drop-in is written without them and lists them in its header.

Exit status: 0 written, 1 invalid or unsupported input, 2 a file could not be read or written.")]
    MigParted(MigPartedArgs),
}

/// Arguments of `gpuctl import mig-parted`.
#[derive(Debug, Args)]
pub struct MigPartedArgs {
    /// mig-parted config file (YAML, `version: v1`, `mig-configs:`).
    pub file: PathBuf,
    /// The config of `mig-configs` to import.
    #[arg(short = 'c', long = "config", value_name = "CONFIG")]
    pub config: String,
    /// The team that owns every imported share (default: a placeholder to replace).
    #[arg(long, value_name = "TEAM")]
    pub owner: Option<String>,
    /// Write the drop-in here instead of stdout.
    #[arg(short = 'o', long, value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Write the drop-in even when some fields cannot be imported (they are listed in it).
    #[arg(long)]
    pub skip_unsupported: bool,
}

/// Run `gpuctl import`.
pub fn run(args: &ImportArgs) -> anyhow::Result<i32> {
    let ImportFrom::MigParted(a) = &args.from;
    if let Some(o) = &a.owner {
        if !valid_team_name(o) {
            eprintln!(
                "gpuctl: --owner '{o}': not a valid team name (a-z first, then a-z, 0-9, _; \
                 at most 31)"
            );
            return Ok(exit::INVALID);
        }
    }
    let text = std::fs::read_to_string(&a.file);
    let Ok(text) = text.inspect_err(|e| eprintln!("{}: error: cannot read: {e}", a.file.display()))
    else {
        return Ok(exit::UNREADABLE);
    };
    let source = a.file.display().to_string();
    let imported = mig_parted::import(&text, &a.config, a.owner.as_deref(), &source);
    let Ok(imported) = imported.inspect_err(|e| eprintln!("{source}: error: {e}")) else {
        return Ok(exit::INVALID);
    };
    for n in &imported.notes {
        eprintln!("{source}: {}: note: {}", n.path, n.why);
    }
    for u in &imported.unsupported {
        eprintln!("{source}: {u}");
    }
    if !imported.unsupported.is_empty() && !a.skip_unsupported {
        eprintln!(
            "gpuctl: {} field(s) cannot be imported; nothing written (--skip-unsupported writes \
             the rest and lists them in the drop-in)",
            imported.unsupported.len()
        );
        return Ok(exit::INVALID);
    }
    match &a.output {
        Some(out) => {
            if let Err(e) = std::fs::write(out, &imported.toml) {
                eprintln!("{}: error: cannot write: {e}", out.display());
                return Ok(exit::UNREADABLE);
            }
        }
        None => print!("{}", imported.toml),
    }
    Ok(exit::OK)
}
