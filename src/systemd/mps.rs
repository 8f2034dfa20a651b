//! MPS daemon instances: names and the two files gpuctld writes per instance.
//!
//! `gpuctl-mps@<inst>.service` reads `/run/gpuctl/mps/<inst>.env` (`EnvironmentFile=`) and, in
//! `ExecStartPost=`, pipes `/run/gpuctl/mps/<inst>.ctl` into `nvidia-cuda-mps-control`. The
//! limits live in the unit's own start sequence rather than in gpuctld so that a daemon systemd
//! restarts after a crash (`Restart=on-failure`) gets them again without gpuctld's help.

use crate::observe::MpsSpec;
pub use crate::paths::{
    mps_log_dir as log_dir, mps_pipe_dir as pipe_dir, MPS_LOG_DIR, MPS_RUN_DIR,
};
use std::fmt::Write as _;

/// `gpuctl-mps@<instance>.service`.
pub fn unit(instance: &str) -> String {
    format!("gpuctl-mps@{instance}.service")
}

/// The instance of a `gpuctl-mps@<instance>.service` name.
pub fn instance_of(unit: &str) -> Option<&str> {
    unit.strip_prefix("gpuctl-mps@")?.strip_suffix(".service")
}

/// Instance names are `<team>-<share>` as the planner makes them (`infer-gpus` for a team's
/// whole GPUs, `infer-mig0-4-0` per MIG device): the team is everything before the first dash
/// (team names have no dashes), which is also what makes `Slice=gpu-%i.slice` nest under the
/// team slice and so inherit its device list and limits.
pub fn valid_instance(instance: &str) -> bool {
    instance.split_once('-').is_some_and(|(team, share)| {
        crate::policy::valid_team_name(team)
            && !share.is_empty()
            && share.len() <= 32
            && !share.starts_with('-')
            && !share.ends_with('-')
            && share
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    })
}

/// The team of an instance name, `None` when it is not one.
pub fn team_of_instance(instance: &str) -> Option<&str> {
    valid_instance(instance).then(|| instance.split_once('-').map_or(instance, |x| x.0))
}

/// Host path of the instance's environment file.
pub fn env_path(instance: &str) -> String {
    format!("{MPS_RUN_DIR}/{instance}.env")
}

/// Host path of the instance's control-command file.
pub fn ctl_path(instance: &str) -> String {
    format!("{MPS_RUN_DIR}/{instance}.ctl")
}

/// Content of `/run/gpuctl/mps/<instance>.env`.
///
/// The `GPUCTL_MPS_*` lines are not read by MPS; they record the settings so that gpuctld can
/// read the live configuration back ([`parse_env`]) after a restart.
pub fn env_file(instance: &str, spec: &MpsSpec) -> String {
    let mut s = format!(
        "# Written by gpuctld for {}; do not edit.\n",
        unit(instance)
    );
    let _ = writeln!(s, "GPUCTL_TEAM={}", spec.team);
    let _ = writeln!(s, "CUDA_VISIBLE_DEVICES={}", spec.devices.join(","));
    let _ = writeln!(s, "CUDA_MPS_PIPE_DIRECTORY={}", pipe_dir(instance));
    let _ = writeln!(s, "CUDA_MPS_LOG_DIRECTORY={}", log_dir(instance));
    if let Some(p) = spec.active_thread_percentage {
        let _ = writeln!(s, "GPUCTL_MPS_ACTIVE_THREAD_PERCENTAGE={p}");
    }
    if let Some(b) = spec.pinned_memory_limit {
        let _ = writeln!(s, "GPUCTL_MPS_PINNED_MEM_LIMIT={b}");
    }
    if let Some(u) = &spec.user {
        let _ = writeln!(s, "GPUCTL_MPS_USER={u}");
    }
    if let Some(g) = &spec.group {
        let _ = writeln!(s, "GPUCTL_MPS_GROUP={g}");
    }
    s
}

/// The default user of MPS control daemons (created by the package, `sysusers.d`).
pub const DEFAULT_USER: &str = "gpuctl-mps";

/// The instance's drop-in (`50-gpuctl-user.conf`): the policy's `mps.user` in place of the
/// template's `gpuctl-mps`, and the team's group for the daemon and its 0750 pipe directory;
/// without a team group the pipe directory stays 0755 (members connect through it).
pub fn dropin(spec: &MpsSpec) -> String {
    let mut s = String::from("# Written by gpuctld; do not edit.\n[Service]\n");
    if let Some(u) = &spec.user {
        let _ = writeln!(s, "User={u}");
    }
    match &spec.group {
        Some(g) => _ = writeln!(s, "Group={g}"),
        None => s.push_str(
            "# No single group holds every member of the team: the pipe directory stays \
             searchable by all.\nRuntimeDirectoryMode=0755\n",
        ),
    }
    s
}

/// Read an env file written by [`env_file`] back into a spec.
pub fn parse_env(text: &str) -> MpsSpec {
    let mut spec = MpsSpec::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        match k.trim() {
            "GPUCTL_TEAM" => spec.team = v.to_string(),
            "CUDA_VISIBLE_DEVICES" => {
                spec.devices = v
                    .split(',')
                    .filter(|d| !d.is_empty())
                    .map(str::to_string)
                    .collect()
            }
            "GPUCTL_MPS_ACTIVE_THREAD_PERCENTAGE" => spec.active_thread_percentage = v.parse().ok(),
            "GPUCTL_MPS_PINNED_MEM_LIMIT" => spec.pinned_memory_limit = v.parse().ok(),
            "GPUCTL_MPS_USER" => spec.user = Some(v.to_string()),
            "GPUCTL_MPS_GROUP" => spec.group = Some(v.to_string()),
            _ => {}
        }
    }
    spec
}

/// Commands piped into `nvidia-cuda-mps-control` after the daemon starts.
///
/// The pinned limit is set per device ordinal *as the daemon sees them* (0..n-1 over its
/// `CUDA_VISIBLE_DEVICES`), in MiB with the `M` suffix MPS accepts.
pub fn control_commands(spec: &MpsSpec) -> String {
    let mut s = String::new();
    if let Some(p) = spec.active_thread_percentage {
        let _ = writeln!(s, "set_default_active_thread_percentage {p}");
    }
    if let Some(b) = spec.pinned_memory_limit {
        let mib = (b >> 20).max(1);
        for dev in 0..spec.devices.len().max(1) {
            let _ = writeln!(s, "set_default_device_pinned_mem_limit {dev} {mib}M");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> MpsSpec {
        MpsSpec {
            team: "infer".into(),
            devices: vec!["GPU-a".into(), "GPU-b".into()],
            active_thread_percentage: Some(40),
            pinned_memory_limit: Some(3 << 30),
            user: Some("mps".into()),
            group: Some("ml-infer".into()),
        }
    }

    #[test]
    fn env_round_trips() {
        let text = env_file("infer-0", &spec());
        assert!(text.contains("CUDA_VISIBLE_DEVICES=GPU-a,GPU-b\n"));
        assert!(text.contains("CUDA_MPS_PIPE_DIRECTORY=/run/gpuctl/mps/infer-0\n"));
        assert!(text.contains("CUDA_MPS_LOG_DIRECTORY=/var/log/gpuctl/mps/infer-0\n"));
        assert_eq!(parse_env(&text), spec());
        let bare = MpsSpec {
            team: "t".into(),
            devices: vec!["0".into()],
            ..Default::default()
        };
        assert_eq!(parse_env(&env_file("t-0", &bare)), bare);
    }

    #[test]
    fn dropins_name_the_team_group_or_open_the_pipe_dir() {
        let d = dropin(&spec());
        assert!(d.contains("\nUser=mps\nGroup=ml-infer\n"), "{d}");
        assert!(!d.contains("RuntimeDirectoryMode"), "{d}");
        let d = dropin(&MpsSpec::default());
        assert!(!d.contains("User="), "{d}");
        assert!(d.contains("\nRuntimeDirectoryMode=0755\n"), "{d}");
    }

    #[test]
    fn commands_per_device() {
        assert_eq!(
            control_commands(&spec()),
            "set_default_active_thread_percentage 40\n\
             set_default_device_pinned_mem_limit 0 3072M\n\
             set_default_device_pinned_mem_limit 1 3072M\n"
        );
        assert_eq!(control_commands(&MpsSpec::default()), "");
    }

    #[test]
    fn instance_names() {
        for good in ["infer-0", "ml_2-13", "infer-gpus", "infer-mig0-4-0"] {
            assert!(valid_instance(good), "{good}");
        }
        assert_eq!(team_of_instance("infer-mig0-4-0"), Some("infer"));
        for bad in [
            "infer", "infer-", "-0", "In-0", "a--0", "a-0-", "a-0X", "a/b-0", "a-b/0",
        ] {
            assert!(!valid_instance(bad), "{bad}");
            assert_eq!(team_of_instance(bad), None);
        }
        assert_eq!(instance_of(&unit("infer-0")), Some("infer-0"));
    }
}
