//! Per-team CDI specs: one Container Device Interface file per team under `/var/run/cdi/`, kind
//! `gpuctl.io/team`, one device named after the team, so that a container engine that reads CDI
//! (podman, containerd, CRI-O, Docker with CDI enabled) gives a container the team's share with
//! `--device gpuctl.io/team=<team>`, and one device per device of the share named
//! `<team>.<UUID>` ([`device_of`]), so that a container asks for one device of the share:
//! `--device gpuctl.io/team=interns.MIG-…` (what a placed `gpuctl run` exports as
//! `GPUCTL_CDI_DEVICE`). Team names are `[a-z0-9_]` and UUIDs `[A-Za-z0-9-]`, so the `.` is
//! unambiguous and the name is within CDI's `[A-Za-z0-9][A-Za-z0-9_.:-]*`.
//!
//! Each entry is a pure function of the team's desired view ([`spec`]), computed by the planner
//! next to the team's env file: the device nodes are exactly the slice's `DeviceAllow=` list (the
//! parent `/dev/nvidiaN`, the MIG capability nodes, `/dev/nvidiactl` and the UVM nodes), the
//! environment is exactly the env file's (`CUDA_VISIBLE_DEVICES`, `NVIDIA_VISIBLE_DEVICES`,
//! the MPS pipe directory), and each MPS share's pipe directory is bind-mounted at the same path.
//! A device's entry is what a placed job on it gets: its own nodes (the parent `/dev/nvidiaN`,
//! for a MIG device its GI and CI capability nodes) and the common ones, its UUID in the
//! environment, and its MPS daemon's pipe, the same fence and environment as `gpuctl run`'s
//! placement (docs/shell.md, "Placement").
//! A spec on the host that differs from the desired one is an action of the plan's devices phase,
//! like an env file, so planning after an apply stays empty.
//!
//! A team without devices keeps a device entry that grants nothing (no nodes, no mounts,
//! `CUDA_VISIBLE_DEVICES=` empty, `NVIDIA_VISIBLE_DEVICES=void`): a container or unit that asks for
//! `gpuctl.io/team=<team>` then starts without GPUs, as a member's `gpuctl shell` does, rather
//! than failing to start on an unresolvable device or, worse, keeping a stale spec that names
//! devices the team no longer has.
//!
//! Version: the spec follows CDI 1.1.0 (the current `SPEC.md`) and declares the *lowest* version
//! that has every field it uses, as the reference library's `MinimumRequiredVersion` does: 0.4.0
//! when it bind-mounts an MPS pipe directory (`type` of a mount), else 0.3.0. Engines reject a
//! spec whose `cdiVersion` is newer than the library they carry (Debian 12's podman 4.3 vendors
//! a CDI library of the 0.5 line), so declaring "1.1.0" would make the spec unreadable to them for
//! no gain.
//!
//! No I/O here: the real host reads and writes the files in `real::cdifiles`.

use serde::Serialize;
use std::collections::BTreeSet;

/// Where the specs go: CDI's directory for run-time generated specs (on Debian and most
/// distributions `/var/run` is a link to `/run`).
pub const CDI_DIR: &str = "/var/run/cdi";
/// The CDI kind (`vendor/class`) of every gpuctl team device.
pub const KIND: &str = "gpuctl.io/team";
/// File name prefix of a team's spec: `gpuctl.io-team-<team>.json`.
pub const FILE_PREFIX: &str = "gpuctl.io-team-";
/// The latest CDI spec version this module was written against (SPEC.md); the spec itself
/// declares [`min_version`].
pub const SPEC_VERSION_FOLLOWED: &str = "1.1.0";

/// The fully qualified CDI device name of a team: `gpuctl.io/team=<team>`.
pub fn device_name(team: &str) -> String {
    format!("{KIND}={team}")
}

/// The CDI device name of one device of a team's share: `<team>.<UUID>`.
pub fn device_of(team: &str, uuid: &str) -> String {
    format!("{team}.{uuid}")
}

/// Host path of a team's spec file.
pub fn spec_path(team: &str) -> String {
    format!("{CDI_DIR}/{FILE_PREFIX}{team}.json")
}

#[derive(Serialize)]
struct Spec<'a> {
    #[serde(rename = "cdiVersion")]
    cdi_version: &'static str,
    kind: &'static str,
    devices: Vec<Device<'a>>,
}

#[derive(Serialize)]
struct Device<'a> {
    name: String,
    #[serde(rename = "containerEdits")]
    container_edits: Edits<'a>,
}

#[derive(Serialize)]
struct Edits<'a> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    env: Vec<&'a str>,
    #[serde(rename = "deviceNodes", skip_serializing_if = "Vec::is_empty")]
    device_nodes: Vec<DeviceNode<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    mounts: Vec<Mount>,
}

/// Only the path: the engine reads type, major and minor from the host node when it creates the
/// container (the CDI library's `fillMissingInfo`), so the spec holds no number that a driver
/// reload could make stale, and stays a function of the plan (no `stat` while planning).
#[derive(Serialize)]
struct DeviceNode<'a> {
    path: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Mount {
    host_path: String,
    container_path: String,
    options: Vec<&'static str>,
    #[serde(rename = "type")]
    kind: &'static str,
}

/// The lowest CDI version with every field a spec uses (see the module header).
fn min_version(uses_mount_type: bool) -> &'static str {
    if uses_mount_type {
        "0.4.0"
    } else {
        "0.3.0"
    }
}

/// What a container of the team gets, whatever the engine: the device nodes, the environment
/// (`KEY=value`) and the host directories bind-mounted at the same path. The CDI spec is this
/// as JSON ([`spec`]), once for the whole share and once per device; engines without CDI get
/// it as flags or a compose fragment ([`crate::docker`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerEdits {
    /// Device node paths, sorted.
    pub nodes: Vec<String>,
    /// `KEY=value` lines.
    pub env: Vec<String>,
    /// Host directories mounted at the same path inside (MPS pipe directories).
    pub mounts: Vec<String>,
}

impl ContainerEdits {
    /// `device_nodes` is the team's `DeviceAllow=` list (or a placed job's), `env` an env file
    /// (comment and blank lines are left out), `mps_instances` the names of the MPS daemons
    /// whose pipe directories are mounted.
    pub fn new(device_nodes: &BTreeSet<String>, env: &str, mps_instances: &[&str]) -> Self {
        ContainerEdits {
            nodes: device_nodes.iter().cloned().collect(),
            env: env
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#') && l.contains('='))
                .map(str::to_string)
                .collect(),
            mounts: mps_instances
                .iter()
                .map(|i| crate::paths::mps_pipe_dir(i))
                .collect(),
        }
    }

    fn cdi(&self) -> Edits<'_> {
        Edits {
            env: self.env.iter().map(String::as_str).collect(),
            device_nodes: self.nodes.iter().map(|p| DeviceNode { path: p }).collect(),
            mounts: self
                .mounts
                .iter()
                .map(|dir| Mount {
                    host_path: dir.clone(),
                    container_path: dir.clone(),
                    options: vec!["bind", "nosuid", "nodev", "noexec"],
                    kind: "bind",
                })
                .collect(),
        }
    }
}

/// The team's CDI spec, as JSON with a final newline: `share` as the device named after the
/// team, then each `(UUID, edits)` of `devices` as `<team>.<UUID>` ([`device_of`]).
pub fn spec(team: &str, share: &ContainerEdits, devices: &[(String, ContainerEdits)]) -> String {
    let mut out = vec![Device {
        name: team.to_string(),
        container_edits: share.cdi(),
    }];
    out.extend(devices.iter().map(|(uuid, e)| Device {
        name: device_of(team, uuid),
        container_edits: e.cdi(),
    }));
    let mounts = out.iter().any(|d| !d.container_edits.mounts.is_empty());
    let spec = Spec {
        cdi_version: min_version(mounts),
        kind: KIND,
        devices: out,
    };
    // Serializing these plain structs cannot fail.
    serde_json::to_string_pretty(&spec).unwrap_or_default() + "\n"
}

/// The spec of the whole share alone (no per-device entries): what `gpuctl env` renders for
/// engines without CDI is this entry.
pub fn spec_of(team: &str, edits: &ContainerEdits) -> String {
    spec(team, edits, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_the_lowest_with_the_fields_used() {
        let nodes: BTreeSet<String> = ["/dev/nvidia0".to_string()].into();
        let e = |mps: &[&str]| ContainerEdits::new(&nodes, "X=1\n", mps);
        let v =
            |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap()["cdiVersion"].clone();
        assert_eq!(v(&spec("a", &e(&[]), &[])), "0.3.0");
        assert_eq!(v(&spec("a", &e(&["a-gpus"]), &[])), "0.4.0");
        assert_eq!(
            v(&spec("a", &e(&[]), &[("GPU-1".into(), e(&["a-gpus"]))])),
            "0.4.0"
        );
    }

    #[test]
    fn device_names_are_within_cdi_names() {
        // CDI's ValidateDeviceName: a letter or digit, then letters, digits, `_.:-`.
        let ok = |n: &str| {
            n.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c))
        };
        let n = device_of("team_2", "MIG-531ffaa3-fca3-df48-ff03-bae49b704874");
        assert_eq!(n, "team_2.MIG-531ffaa3-fca3-df48-ff03-bae49b704874");
        assert!(ok(&n));
        assert_eq!(
            device_name(&n),
            "gpuctl.io/team=team_2.MIG-531ffaa3-fca3-df48-ff03-bae49b704874"
        );
    }
}
