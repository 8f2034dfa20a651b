//! `gpuctl validate`.
use super::Cli;
use crate::paths::Root;
use crate::policy::{inplace, load, load_files, Diagnostic, LoadOutcome, Severity};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `gpuctl validate`.
#[derive(Debug, Args)]
#[command(after_long_help = "\
Without PATH, validates the policy the agent would load: /etc/gpuctl/policy.toml, then the \
*.toml fragments of /usr/lib/gpuctl/policy.d, /run/gpuctl/policy.d and /etc/gpuctl/policy.d \
(same name: /etc beats /run beats /usr/lib; a symlink to /dev/null masks), all under --root.

With --as DEST and one FILE, validates FILE as if it were installed at DEST (/etc/gpuctl/policy.toml \
or NAME.toml in one of the policy.d directories), merged with the host's other policy files under \
--root; it replaces the file installed at DEST. Errors in FILE name FILE as given. For config \
management: Ansible `validate: \"gpuctl validate --as /etc/gpuctl/policy.d/50-gpus.toml %s\"`.

Each problem is printed on one line as FILE:LINE:COL: error|warning: KEY: MESSAGE (HELP). \
Every problem is reported, not only the first.

Exit status: 0 valid (warnings allowed), 1 invalid, 2 a file or directory could not be read.

See gpuctl.policy(5) for the policy format.")]
pub struct ValidateArgs {
    /// Files to check, merged in the order given; default: the host's policy directories.
    pub paths: Vec<PathBuf>,
    /// Validate the one FILE as if installed at DEST, merged with the host's other policy files.
    #[arg(long = "as", value_name = "DEST")]
    pub as_path: Option<PathBuf>,
    /// Print one JSON object for config management: {"valid", "files", "unreadable",
    /// "diagnostics": [{"severity", "file", "line", "column", "key", "message", "help"}]}.
    #[arg(long)]
    pub json: bool,
}

/// Run `gpuctl validate`.
pub fn run(cli: &Cli, args: &ValidateArgs) -> anyhow::Result<i32> {
    let outcome = if let Some(dest) = &args.as_path {
        let [file] = args.paths.as_slice() else {
            anyhow::bail!("--as {} takes exactly one FILE", dest.display());
        };
        let target = inplace::parse_target(dest).map_err(anyhow::Error::msg)?;
        inplace::load_as(&Root::new(&cli.root), &target, file)
    } else if args.paths.is_empty() {
        load(&Root::new(&cli.root))
    } else {
        load_files(&args.paths)
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&outcome))?);
    } else {
        print_human(&outcome);
    }
    Ok(super::exit::of_load(&outcome))
}

fn diag_json(d: &Diagnostic) -> serde_json::Value {
    serde_json::json!({
        "severity": match d.severity { Severity::Error => "error", Severity::Warning => "warning" },
        "file": d.loc.as_ref().map(|l| l.file.display().to_string()),
        "line": d.loc.as_ref().map(|l| l.line),
        "column": d.loc.as_ref().map(|l| l.col),
        "key": d.key,
        "message": d.message,
        "help": d.help,
    })
}

/// The `--json` document.
pub fn to_json(o: &LoadOutcome) -> serde_json::Value {
    serde_json::json!({
        "valid": o.verdict().is_ok(),
        "files": o.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
        "unreadable": o.unreadable.iter().map(|(p, e)| serde_json::json!({
            "file": p.display().to_string(),
            "error": e,
        })).collect::<Vec<_>>(),
        "diagnostics": o.diagnostics.iter().map(diag_json).collect::<Vec<_>>(),
    })
}

/// The same document for a policy that loaded but does not fit the host (`plan --json`):
/// `valid` is false when any diagnostic is an error.
pub fn host_json(files: &[PathBuf], diags: &[Diagnostic]) -> serde_json::Value {
    serde_json::json!({
        "valid": !diags.iter().any(|d| d.severity == Severity::Error),
        "files": files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
        "unreadable": [],
        "diagnostics": diags.iter().map(diag_json).collect::<Vec<_>>(),
    })
}

fn print_human(o: &LoadOutcome) {
    for (p, e) in &o.unreadable {
        eprintln!("{}: error: cannot read: {e}", p.display());
    }
    for d in &o.diagnostics {
        eprintln!("{d}");
    }
    let errors = o
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    let warnings = o.diagnostics.len() - errors;
    match (&o.policy, o.unreadable.is_empty()) {
        (Some(p), _) => println!(
            "policy valid: {} file(s), {} team(s), {} gpu entr{}{}",
            o.files.len(),
            p.teams.len(),
            p.gpus.len(),
            if p.gpus.len() == 1 { "y" } else { "ies" },
            if warnings > 0 {
                format!(", {warnings} warning(s)")
            } else {
                String::new()
            }
        ),
        (None, false) => eprintln!(
            "policy unreadable: {} file(s) could not be read, {errors} error(s)",
            o.unreadable.len()
        ),
        (None, true) => eprintln!("policy invalid: {errors} error(s), {warnings} warning(s)"),
    }
}
