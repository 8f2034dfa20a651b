//! The fence outside the team shares (`[host] outside`), and the withdrawals that keep a device
//! from being open to two teams while a plan runs.
//!
//! **Outside.** The NVIDIA driver makes `/dev/nvidia*` 0666, so without a fence anyone can open
//! any GPU from a login session or a container. systemd's device controller has no deny-list:
//! `DevicePolicy=closed` allows the pseudo devices systemd always allows (`/dev/null`, `/dev/tty`,
//! `/dev/ptmx`, the pts major, …) plus the `DeviceAllow=` entries. So the fence of `user.slice`
//! and `machine.slice` is an allow-list of every registered major **but** NVIDIA's, by name
//! (`char-drm`, `block-sd`), built from `/proc/devices`: terminals, FUSE, DRM, sound, input and
//! KVM keep working there, and no `nvidia*` major is in it. By name rather than by path, so a
//! device node created later under an allowed major opens. systemd resolves the names to majors
//! when it builds the BPF program; a major registered later (a module loaded after the fence was
//! set) is in no program yet: its name changes this list, so the next reconcile sets the fence
//! again (gpuctld re-reads `/proc/devices` at every reconcile and watches it, docs/policy.md).
//! `system.slice` is not fenced: it is the admin's (gpuctld, nvidia-persistenced, the fabric
//! manager, dcgm-exporter).
//!
//! **Withdrawals.** When a team loses a device (or leaves the policy), its slice stops allowing
//! it in the [`Phase::Fence`] phase, before any slice is granted anything (the slices phase), so
//! no order of actions leaves a device open to a team that lost it and one that gained it.

use super::{push, Action, ActionKind, Desired, Phase};
use crate::observe::{Fence, GpuProcess, Major, Observed, SliceSpec};
use crate::policy::{Outside, TeamName};
use std::collections::{BTreeMap, BTreeSet};

/// The slices fenced outside the team shares: people's sessions, user managers and rootless
/// containers (`user.slice`); root containers and VMs (`machine.slice`).
pub const FENCED_SLICES: [&str; 2] = ["user.slice", "machine.slice"];

/// A major of NVIDIA's driver (`nvidia`, `nvidia-frontend`, `nvidia-uvm`, `nvidia-caps`,
/// `nvidia-caps-imex-channels`, `nvidia-nvlink`, `nvidia-nvswitch`): `/dev/nvidiaN`,
/// `nvidiactl` and `nvidia-modeset` are minors of the first.
pub fn is_nvidia(name: &str) -> bool {
    name.starts_with("nvidia")
}

/// Whether systemd can take `name` as `char-<name>`: it matches the name against
/// `/proc/devices` with fnmatch(3), so a glob character could match NVIDIA's majors, and
/// whitespace ends a unit-file value.
fn usable(name: &str) -> bool {
    !name.is_empty()
        && !name.contains(|c: char| c.is_whitespace() || c.is_control() || "*?[]\\".contains(c))
}

/// `DeviceAllow=` entries of a closed fence: every registered major but NVIDIA's, by name.
pub fn allow_list(majors: &[Major]) -> BTreeSet<String> {
    majors
        .iter()
        .filter(|m| !is_nvidia(&m.name) && usable(&m.name))
        .map(|m| format!("{}-{}", if m.block { "block" } else { "char" }, m.name))
        .collect()
}

/// The fences the policy wants, by slice; `None` when a closed fence cannot be built because the
/// majors are unknown (then nothing about the fences is planned).
pub fn desired(outside: Outside, majors: Option<&[Major]>) -> Option<BTreeMap<String, Fence>> {
    let fence = match outside {
        Outside::Open => Fence::open(),
        Outside::Closed => Fence {
            policy: "closed".into(),
            allow: allow_list(majors?),
        },
    };
    Some(
        FENCED_SLICES
            .iter()
            .map(|s| (s.to_string(), fence.clone()))
            .collect(),
    )
}

/// Every process NVML lists, whole GPUs and MIG devices.
fn processes(observed: &Observed) -> impl Iterator<Item = &GpuProcess> {
    observed.gpus.iter().flat_map(|g| {
        g.processes.iter().chain(
            g.mig
                .iter()
                .flat_map(|m| &m.instances)
                .flat_map(|i| &i.compute)
                .flat_map(|c| &c.processes),
        )
    })
}

/// The processes in `slice` that hold a GPU (NVML lists them): closing the fence leaves their
/// open descriptors alone, and the plan and the journal name them.
pub fn holders_in(observed: &Observed, slice: &str) -> Vec<String> {
    let prefix = format!("/{slice}/");
    let mut out: Vec<String> = processes(observed)
        .filter(|p| p.cgroup.as_deref().is_some_and(|c| c.starts_with(&prefix)))
        .map(super::mig::holder)
        .collect();
    out.sort();
    out.dedup();
    out
}

fn fence_reason(slice: &str, have: &Fence, want: &Fence, observed: &Observed) -> String {
    if want.is_open() {
        return format!("outside = \"open\": NVIDIA devices open in {slice} again");
    }
    if have.policy != want.policy || have.is_open() {
        let holders = holders_in(observed, slice);
        let still = if holders.is_empty() {
            String::new()
        } else {
            format!(
                "; still holding a GPU there, left running with what they opened: {}",
                holders.join(", ")
            )
        };
        return format!(
            "outside = \"closed\": no NVIDIA device opens in {slice} (new opens only){still}"
        );
    }
    let added: Vec<&str> = want.allow.difference(&have.allow).map(|s| &**s).collect();
    let gone: Vec<&str> = have.allow.difference(&want.allow).map(|s| &**s).collect();
    let mut what = Vec::new();
    if !added.is_empty() {
        what.push(format!("+{}", added.join(" +")));
    }
    if !gone.is_empty() {
        what.push(format!("-{}", gone.join(" -")));
    }
    format!("the registered device majors changed: {}", what.join(" "))
}

/// The fence-phase actions: the fences that differ, then each slice that loses a device, cut
/// down to what it keeps. Returns the withdrawn specs by team, so the slices phase does not set
/// again a slice the withdrawal already brought to its target.
pub(super) fn diff(
    actions: &mut Vec<Action>,
    d: &Desired,
    observed: &Observed,
) -> BTreeMap<TeamName, SliceSpec> {
    for (slice, want) in d.fences.iter().flatten() {
        let open = Fence::open();
        let have = observed.fences.get(slice).unwrap_or(&open);
        if have != want {
            let reason = fence_reason(slice, have, want, observed);
            let kind = ActionKind::SetFence {
                slice: slice.clone(),
                fence: want.clone(),
            };
            push(actions, Phase::Fence, kind, reason);
        }
    }
    let mut withdrawn = BTreeMap::new();
    for (team, have) in &observed.slices {
        let none = BTreeSet::new();
        let want = d.slice(team).map_or(&none, |s| &s.device_allow);
        let lost: Vec<&str> = have.device_allow.difference(want).map(|s| &**s).collect();
        if lost.is_empty() {
            continue;
        }
        // The policy's limits with the devices it keeps: a slice that only loses devices is at its
        // target after this one call (the slices phase then leaves it alone).
        let limits = d.slice(team).unwrap_or(have);
        let spec = SliceSpec {
            device_allow: have.device_allow.intersection(want).cloned().collect(),
            ..limits.clone()
        };
        // An in-policy team's line is the drift line of the slices phase (`DeviceAllow +…`), so
        // a hand-added device reads the same whichever phase takes it away.
        let reason = if d.slice(team).is_some() {
            format!(
                "gpu-{team}.slice (team {team}) differs from the policy: {}; withdrawn before \
                 any slice is granted a device",
                super::slice_drift(have, &spec)
            )
        } else {
            format!(
                "team {team} is no longer in the policy and loses {}: withdrawn before any \
                 slice is granted a device",
                lost.join(" ")
            )
        };
        let kind = ActionKind::SetSlice {
            team: team.clone(),
            spec: spec.clone(),
        };
        push(actions, Phase::Fence, kind, reason);
        withdrawn.insert(team.clone(), spec);
    }
    withdrawn
}

#[cfg(test)]
mod tests {
    use super::*;

    fn majors(lines: &[(u32, &str)]) -> Vec<Major> {
        lines
            .iter()
            .map(|(number, name)| Major {
                block: false,
                number: *number,
                name: name.to_string(),
            })
            .collect()
    }

    #[test]
    fn names_that_systemd_would_read_as_globs_or_split_are_left_out() {
        let m = majors(&[(240, "nv*"), (241, "a b"), (242, "[x]"), (243, "ok")]);
        assert_eq!(allow_list(&m), ["char-ok".to_string()].into());
    }

    #[test]
    fn open_needs_no_majors_closed_does() {
        let open = desired(Outside::Open, None).unwrap();
        assert!(open.values().all(Fence::is_open));
        assert_eq!(
            open.keys().collect::<Vec<_>>(),
            ["machine.slice", "user.slice"]
        );
        assert!(desired(Outside::Closed, None).is_none());
        let m = majors(&[(1, "mem"), (226, "drm")]);
        let closed = desired(Outside::Closed, Some(&m)).unwrap();
        assert!(closed
            .values()
            .all(|f| f.policy == "closed" && !f.allow.is_empty()));
    }
}
