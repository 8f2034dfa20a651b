//! `gpuctl env --team T [--format shell|systemd|json|cdi|docker|compose]`: the team's
//! environment, as gpuctld keeps it in `/run/gpuctl/teams/<team>.env`; with `cdi`, the container
//! engine flags that give a container the same share; with `docker` and `compose`, that share
//! spelled out for Docker without CDI (docs/containers.md).

use super::exit;
use super::shell::{checked_team, with_agent, Failure};
use crate::cdi::ContainerEdits;
use crate::docker::sh_quote;
use crate::paths::Root;
use crate::policy::TeamName;
use crate::systemd::Systemd;
use clap::{Args, ValueEnum};
use std::collections::{BTreeMap, BTreeSet};

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
    /// The `docker run` flags for the team's share, one line: `--cgroup-parent`, a `--device`
    /// per node, `-e` per variable, a `--mount` per MPS pipe directory. Inside a placed
    /// `gpuctl run --team T`, only the job's devices.
    Docker,
    /// The same as a docker-compose service (`cgroup_parent`, `devices`, `environment`,
    /// `volumes`), to use as an override file.
    Compose,
}

/// Arguments of `gpuctl env`.
#[derive(Debug, Args)]
#[command(after_long_help = "Only members of the team (and root) may read it. \
Example: eval \"$(gpuctl env --team infer)\"; or, in a unit, \
EnvironmentFile=/run/gpuctl/teams/infer.env together with Slice=gpu-infer.slice. \
For containers (as root): podman run $(gpuctl env --team infer --format cdi) IMAGE ...; \
docker run $(gpuctl env --team infer --format docker) IMAGE ...; \
gpuctl env --team infer --format compose --service web > gpu.yml, then \
docker-compose -f docker-compose.yml -f gpu.yml up (see docs/containers.md).

Exit status: 0, or 3 not a member, 4 no such team, 5 no devices, 6 gpuctld not running, \
2 other failure (see gpuctl shell --help).")]
pub struct EnvArgs {
    /// The team.
    #[arg(long, short = 't', value_name = "TEAM")]
    pub team: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "shell")]
    pub format: Format,
    /// With `--format compose`: the compose service the fragment is for (default: the team).
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,
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

/// Render `team`'s share in `format`: its `env`, and for Docker and compose the device nodes of
/// the unit it lives in (`allow`, [`share_of`]) and the compose `service` (default: the team).
pub fn render(
    team: &TeamName,
    env: &BTreeMap<String, String>,
    allow: &BTreeSet<String>,
    format: Format,
    service: Option<&str>,
) -> String {
    match format {
        Format::Cdi => cdi_flags(team),
        Format::Docker => crate::docker::run_flags(team, &container_edits(allow, env)),
        Format::Compose => {
            crate::docker::compose(team, service.unwrap_or(team), &container_edits(allow, env))
        }
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

/// A placed `gpuctl run`/`shell` of `team` that this process runs in: its scope and the
/// environment gpuctld gave it (the keys gpuctld owns, [`crate::join::OWNED_PREFIXES`], as
/// inherited, without `GPUCTL_SCOPE`, which names a host unit). `None` outside one, or when
/// `GPUCTL_SCOPE` is stale: this process's cgroup (`cgroup`) must be in that scope.
fn placed_job(
    team: &str,
    vars: impl IntoIterator<Item = (String, String)>,
    cgroup: Option<&str>,
) -> Option<(String, BTreeMap<String, String>)> {
    let mut env: BTreeMap<String, String> = vars
        .into_iter()
        .filter(|(k, _)| crate::join::OWNED_PREFIXES.iter().any(|p| k.starts_with(p)))
        .collect();
    let scope = env.remove("GPUCTL_SCOPE")?;
    let inside = cgroup?.split('/').any(|c| c == scope);
    (env.get("GPUCTL_TEAM").map(String::as_str) == Some(team) && inside).then_some((scope, env))
}

/// A container's share from a unit's `DeviceAllow=` entries (paths; a grant other than
/// `rwm` reads back as `<path> <access>`) and an environment (its MPS pipe directories from
/// `GPUCTL_MPS_INSTANCES`), through the CDI spec's own gathering ([`ContainerEdits::new`]).
fn container_edits(allow: &BTreeSet<String>, env: &BTreeMap<String, String>) -> ContainerEdits {
    let nodes: BTreeSet<String> = allow
        .iter()
        .filter_map(|e| e.split_whitespace().next())
        .filter(|p| p.starts_with("/dev/"))
        .map(str::to_string)
        .collect();
    let text: String = env.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    let instances: Vec<&str> = env
        .get("GPUCTL_MPS_INSTANCES")
        .map(|i| i.split(',').filter(|i| !i.is_empty()).collect())
        .unwrap_or_default();
    ContainerEdits::new(&nodes, &text, &instances)
}

/// A share's environment and the `DeviceAllow=` entries of the unit it lives in.
type Share = (BTreeMap<String, String>, BTreeSet<String>);

/// gpuctld's `Env` (the membership check and the team's environment), then the `DeviceAllow=`
/// of the unit the share lives in: the team slice, or inside a placed job its scope (with the
/// job's environment).
fn share_of(team: &TeamName) -> Result<Share, Failure> {
    let root = Root::new("/");
    let cgroup = crate::join::cgroup::read_proc_cgroup(&root, std::process::id());
    let placed = placed_job(team, std::env::vars(), cgroup.as_deref());
    with_agent("Env", async |p| {
        let env: BTreeMap<String, String> = p.env(team).await?.into_iter().collect();
        let failed = |e: crate::systemd::SystemdError| zbus::Error::Failure(e.to_string());
        let sd = Systemd::with_connection(p.inner().connection().clone(), root)
            .await
            .map_err(failed)?;
        if let Some((scope, job_env)) = placed {
            // A scope without its own fence is an unplaced join: the team's share.
            if let Some(f) = sd.unit_fence(&scope).await.map_err(failed)? {
                if f.policy == "closed" {
                    return Ok((job_env, f.allow));
                }
            }
        }
        let slice = crate::systemd::props::slice_unit(team);
        let allow = sd
            .unit_fence(&slice)
            .await
            .map_err(failed)?
            .map(|f| f.allow)
            .unwrap_or_default();
        Ok((env, allow))
    })
}

/// Run `gpuctl env`.
pub fn run(args: &EnvArgs) -> i32 {
    let container = matches!(args.format, Format::Docker | Format::Compose);
    match (&args.service, args.format) {
        (Some(_), f) if f != Format::Compose => {
            return Failure::new(exit::UNREADABLE, "--service goes with --format compose").report()
        }
        (Some(s), _) if !crate::docker::valid_service_name(s) => {
            return Failure::new(
                exit::UNREADABLE,
                format!(
                    "--service {s:?}: a compose service name is letters, digits, '.', '_', '-'"
                ),
            )
            .report()
        }
        _ => {}
    }
    let got = checked_team(&args.team).and_then(|team| {
        let (env, allow) = if container {
            share_of(&team)?
        } else {
            let env = with_agent("Env", async |p| p.env(&team).await)?;
            (env.into_iter().collect(), BTreeSet::new())
        };
        Ok(render(
            &team,
            &env,
            &allow,
            args.format,
            args.service.as_deref(),
        ))
    });
    match got {
        Ok(text) => {
            print!("{text}");
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
        let text = render(
            &"infer".parse().unwrap(),
            &env(),
            &BTreeSet::new(),
            Format::Shell,
            None,
        );
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
            render(
                &"infer".parse().unwrap(),
                &env(),
                &BTreeSet::new(),
                Format::Cdi,
                None
            ),
            "--device gpuctl.io/team=infer --cgroup-parent=gpu-infer.slice\n"
        );
    }

    #[test]
    fn systemd_format_quotes_only_when_needed_and_json_round_trips() {
        let text = render(
            &"infer".parse().unwrap(),
            &env(),
            &BTreeSet::new(),
            Format::Systemd,
            None,
        );
        assert!(text.contains("CUDA_VISIBLE_DEVICES=GPU-1,GPU-2\n"));
        assert!(text.contains("X=\"it's $HOME\"\n"));
        let back: BTreeMap<String, String> = serde_json::from_str(&render(
            &"infer".parse().unwrap(),
            &env(),
            &BTreeSet::new(),
            Format::Json,
            None,
        ))
        .unwrap();
        assert_eq!(back, env());
    }

    fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_placed_job_is_its_scope_and_the_env_gpuctld_gave_it() {
        let scope = "gpuctl-run-infer-42.scope";
        let inside = format!("/gpu.slice/gpu-infer.slice/{scope}");
        let job = vars(&[
            ("GPUCTL_TEAM", "infer"),
            ("GPUCTL_SCOPE", scope),
            ("CUDA_VISIBLE_DEVICES", "MIG-2"),
            ("NVIDIA_VISIBLE_DEVICES", "MIG-2"),
            ("HOME", "/home/alice"),
        ]);
        let (s, env) = placed_job("infer", job.clone(), Some(&inside)).unwrap();
        assert_eq!(s, scope);
        assert_eq!(
            env.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "CUDA_VISIBLE_DEVICES",
                "GPUCTL_TEAM",
                "NVIDIA_VISIBLE_DEVICES"
            ],
            "only gpuctld's keys, not the scope's name"
        );
        // Another team's job, a stale GPUCTL_SCOPE (the process is elsewhere), no scope at all.
        assert!(placed_job("train", job.clone(), Some(&inside)).is_none());
        assert!(placed_job("infer", job.clone(), Some("/user.slice/session-1.scope")).is_none());
        assert!(placed_job("infer", job.clone(), None).is_none());
        assert!(placed_job("infer", vars(&[("GPUCTL_TEAM", "infer")]), Some(&inside)).is_none());
    }

    #[test]
    fn container_edits_take_the_fences_paths_and_the_envs_mps_pipes() {
        let allow: BTreeSet<String> = ["/dev/nvidia0", "/dev/nvidiactl rw", "char-drm"]
            .map(String::from)
            .into();
        let env: BTreeMap<String, String> = [
            ("GPUCTL_TEAM", "b"),
            ("GPUCTL_MPS_INSTANCES", "b-mig0-1-0,b-mig0-1-1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        let e = container_edits(&allow, &env);
        assert_eq!(e.nodes, ["/dev/nvidia0", "/dev/nvidiactl"]);
        assert_eq!(
            e.mounts,
            ["/run/gpuctl/mps/b-mig0-1-0", "/run/gpuctl/mps/b-mig0-1-1"]
        );
        assert_eq!(
            e.env,
            [
                "GPUCTL_MPS_INSTANCES=b-mig0-1-0,b-mig0-1-1",
                "GPUCTL_TEAM=b"
            ]
        );
    }

    #[test]
    fn docker_and_compose_render_the_units_nodes_and_the_env() {
        let allow: BTreeSet<String> = ["/dev/nvidia0", "/dev/nvidiactl"].map(String::from).into();
        let t = "infer".parse().unwrap();
        let flags = render(&t, &env(), &allow, Format::Docker, None);
        assert!(flags.starts_with("--cgroup-parent=gpu-infer.slice --device=/dev/nvidia0 "));
        assert!(
            flags.contains(" -e CUDA_VISIBLE_DEVICES=GPU-1,GPU-2 "),
            "{flags}"
        );
        let y = render(&t, &env(), &allow, Format::Compose, None);
        assert!(
            y.contains("\n  infer:\n"),
            "the service defaults to the team: {y}"
        );
        let y = render(&t, &env(), &allow, Format::Compose, Some("api"));
        assert!(
            y.contains("\n  api:\n    cgroup_parent: \"gpu-infer.slice\"\n"),
            "{y}"
        );
    }
}
