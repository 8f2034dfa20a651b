//! `gpuctl env --team T [--format shell|systemd|json|cdi]`: the team's environment, as gpuctld
//! keeps it in `/run/gpuctl/teams/<team>.env`; with `cdi`, the container engine flags that give a
//! container the same share (docs/containers.md).

use super::shell::{checked_team, with_agent};
use crate::policy::TeamName;
use clap::{Args, ValueEnum};
use std::collections::BTreeMap;

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// `export KEY='value'` lines for `eval`.
    Shell,
    /// `KEY=value` lines for `EnvironmentFile=` or `docker --env-file`.
    Systemd,
    /// One JSON object.
    Json,
    /// The container engine flags for the team's CDI device and slice, one line to paste after
    /// `podman run` (`--device gpuctl.io/team=T --cgroup-parent=gpu-T.slice`).
    Cdi,
}

/// Arguments of `gpuctl env`.
#[derive(Debug, Args)]
#[command(after_long_help = "Only members of the team (and root) may read it. \
Example: eval \"$(gpuctl env --team infer)\"; or, in a unit, \
EnvironmentFile=/run/gpuctl/teams/infer.env together with Slice=gpu-infer.slice. \
For containers (as root): podman run $(gpuctl env --team infer --format cdi) IMAGE ... \
(see docs/containers.md).

Exit status: 0, or 3 not a member, 4 no such team, 5 no devices, 6 gpuctld not running, \
2 other failure (see gpuctl shell --help).")]
pub struct EnvArgs {
    /// The team.
    #[arg(long, short = 't', value_name = "TEAM")]
    pub team: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "shell")]
    pub format: Format,
}

/// Quote for POSIX sh: single quotes, with `'` written as `'\''`.
pub fn sh_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', r"'\''"))
}

/// The flags that put a container into `team`'s share: its CDI device (device nodes, env, MPS
/// pipe mounts) and its slice as cgroup parent (limits and the device filter). A [`TeamName`]
/// is `[a-z][a-z0-9_]*`, so nothing here needs quoting.
pub fn cdi_flags(team: &TeamName) -> String {
    format!(
        "--device {} --cgroup-parent={}\n",
        crate::cdi::device_name(team),
        crate::systemd::props::slice_unit(team)
    )
}

/// Render `team`'s `env` in `format`.
pub fn render(team: &TeamName, env: &BTreeMap<String, String>, format: Format) -> String {
    match format {
        Format::Cdi => cdi_flags(team),
        Format::Json => serde_json::to_string_pretty(env).unwrap_or_default() + "\n",
        Format::Shell => env
            .iter()
            .map(|(k, v)| format!("export {k}={}\n", sh_quote(v)))
            .collect(),
        Format::Systemd => env
            .iter()
            .map(|(k, v)| {
                // EnvironmentFile= takes bare values; quote only what it would otherwise split
                // or interpret.
                if v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || ",-_./:@+=".contains(c))
                {
                    format!("{k}={v}\n")
                } else {
                    format!("{k}=\"{}\"\n", v.replace('\\', "\\\\").replace('"', "\\\""))
                }
            })
            .collect(),
    }
}

/// Run `gpuctl env`.
pub fn run(args: &EnvArgs) -> i32 {
    let got = checked_team(&args.team).and_then(|team| {
        let env = with_agent("Env", async |p| p.env(&team).await)?;
        Ok((team, env))
    });
    match got {
        Ok((team, env)) => {
            print!("{}", render(&team, &env.into_iter().collect(), args.format));
            super::exit::OK
        }
        Err(f) => f.report(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> BTreeMap<String, String> {
        [
            ("CUDA_VISIBLE_DEVICES", "GPU-1,GPU-2"),
            ("GPUCTL_TEAM", "infer"),
            ("X", "it's $HOME"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into_iter()
        .collect()
    }

    #[test]
    fn shell_format_survives_eval() {
        let text = render(&"infer".parse().unwrap(), &env(), Format::Shell);
        assert!(text.contains("export CUDA_VISIBLE_DEVICES='GPU-1,GPU-2'\n"));
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{text}printf %s \"$X\""))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "it's $HOME");
    }

    #[test]
    fn cdi_format_is_one_line_of_flags_naming_the_team_device_and_slice() {
        assert_eq!(
            render(&"infer".parse().unwrap(), &env(), Format::Cdi),
            "--device gpuctl.io/team=infer --cgroup-parent=gpu-infer.slice\n"
        );
    }

    #[test]
    fn systemd_format_quotes_only_when_needed_and_json_round_trips() {
        let text = render(&"infer".parse().unwrap(), &env(), Format::Systemd);
        assert!(text.contains("CUDA_VISIBLE_DEVICES=GPU-1,GPU-2\n"));
        assert!(text.contains("X=\"it's $HOME\"\n"));
        let back: BTreeMap<String, String> =
            serde_json::from_str(&render(&"infer".parse().unwrap(), &env(), Format::Json)).unwrap();
        assert_eq!(back, env());
    }
}
