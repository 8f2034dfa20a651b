//! Slurm on a gpuctl host (docs/slurm.md): the GRES description of the live GPU layout, the
//! node state gpuctl reads from `scontrol`, and which cgroups are Slurm jobs'. Pure: the
//! effector that runs `scontrol` and writes the file is `real::slurm`.
//!
//! What a line says follows gres.conf(5) of Slurm 22.05 (Debian bookworm): a whole GPU is
//! `File=/dev/nvidiaN`; a MIG device is `MultipleFiles=` with the parent GPU's node and the
//! two capability nodes of its GPU and compute instance, which Slurm's task/cgroup plugin
//! allows in the job's cgroup (File and MultipleFiles are mutually exclusive).
//!
//! MPS shares are not mapped to Slurm's `Name=mps`: Slurm's gres/mps hands a job a percentage
//! of a GPU and expects one MPS server per GPU for every job, while gpuctl runs one daemon per
//! team share behind a pipe directory only the team may open. A device of an MPS team is listed
//! as a plain `Name=gpu`, so Slurm gives it to one job at a time.

use crate::observe::{GpuState, Observed};
pub use crate::observe::{SlurmNode, SlurmObserved};
use crate::policy::{GpuUse, Policy};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One `Name=gpu` device of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GresDevice {
    /// `Type=`: the MIG profile, or the GPU model for a whole GPU, prefixed by the owning
    /// team with `team-types`.
    pub kind: String,
    /// Device files: one for a whole GPU (`File=`), the GPU and its two cap nodes for MIG.
    pub files: Vec<String>,
}

/// The node's GPUs as Slurm GRES.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gres {
    /// Devices in GPU index order, MIG devices by placement.
    pub devices: Vec<GresDevice>,
    /// MIG devices left out, and why (a cap node missing from `mig-minors`).
    pub skipped: Vec<String>,
}

/// A GRES `Type=` is one token in `--gres=gpu:TYPE:N`: anything but letters, digits, `.`,
/// `_` and `-` becomes `_` (`1g.10gb+me` → `1g.10gb_me`).
fn slurm_token(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `Type=` of a whole GPU: the reference key (`h100-sxm5-80gb`), else the NVML name.
fn whole_type(g: &GpuState) -> String {
    slurm_token(&g.model.as_deref().unwrap_or(&g.name).to_ascii_lowercase())
}

fn typed(team: Option<&str>, kind: String, team_types: bool) -> String {
    match team {
        Some(t) if team_types => format!("{t}_{kind}"),
        _ => kind,
    }
}

/// The GRES of the live layout: every whole GPU (MIG off) and every MIG device (compute
/// instance) whose two capability minors are known. `policy` gives whole GPUs their owner for
/// `team-types`; a MIG device's team is its GI's owner label.
pub fn gres(policy: &Policy, observed: &Observed) -> Gres {
    let team_types = policy.slurm.team_types;
    let mut out = Gres::default();
    for g in &observed.gpus {
        let parent = format!("/dev/nvidia{}", g.minor);
        let Some(mig) = g.mig.as_ref().filter(|m| m.current) else {
            let owner = match policy.usage_for(g) {
                Some(GpuUse::Owned(t)) => Some(t.to_string()),
                _ => None,
            };
            out.devices.push(GresDevice {
                kind: typed(owner.as_deref(), whole_type(g), team_types),
                files: vec![parent],
            });
            continue;
        };
        let mut gis: Vec<_> = mig.instances.iter().collect();
        gis.sort_by_key(|gi| gi.placement.start);
        for gi in gis {
            let mut cis: Vec<_> = gi.compute.iter().collect();
            cis.sort_by_key(|ci| ci.placement.start);
            for ci in cis {
                let keys = [
                    format!("gpu{}/gi{}/access", g.minor, gi.id),
                    format!("gpu{}/gi{}/ci{}/access", g.minor, gi.id, ci.id),
                ];
                let caps: Vec<u32> = keys
                    .iter()
                    .filter_map(|k| observed.mig_minors.get(k).copied())
                    .collect();
                if caps.len() != 2 {
                    out.skipped.push(format!(
                        "gpu {} {}: {} not in mig-minors",
                        g.index,
                        ci.uuid,
                        keys.join(" or ")
                    ));
                    continue;
                }
                let mut files = vec![parent.clone()];
                files.extend(
                    caps.iter()
                        .map(|m| format!("/dev/nvidia-caps/nvidia-cap{m}")),
                );
                out.devices.push(GresDevice {
                    kind: typed(gi.owner.as_deref(), slurm_token(&ci.profile), team_types),
                    files,
                });
            }
        }
    }
    out
}

impl Gres {
    /// The node's `Gres=` for its slurm.conf line: `gpu:TYPE:COUNT`, comma-separated, by type
    /// name; empty without devices.
    pub fn node_gres(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for d in &self.devices {
            *counts.entry(&d.kind).or_default() += 1;
        }
        counts
            .iter()
            .map(|(k, n)| format!("gpu:{k}:{n}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The slurm.conf fragment of `node-file`: the node's `Gres=` as a `NodeName=DEFAULT`
    /// line, which the node's own line (right after the `Include`) inherits.
    pub fn render_node(&self) -> String {
        format!(
            "# Written by gpuctld from the live GPU layout; included before this node's line.\n\
             NodeName=DEFAULT Gres={}\n",
            self.node_gres()
        )
    }

    /// The gres.conf lines for `node`, with a header saying who writes them.
    pub fn render(&self, node: &str) -> String {
        let mut s = String::from(
            "# Written by gpuctld from the live GPU layout; rewritten on every change, do not \
             edit.\n",
        );
        let _ = writeln!(s, "# slurm.conf: NodeName={node} Gres={}", self.node_gres());
        for d in &self.devices {
            let key = if d.files.len() == 1 {
                "File"
            } else {
                "MultipleFiles"
            };
            let _ = writeln!(
                s,
                "NodeName={node} Name=gpu Type={} {key}={}",
                d.kind,
                d.files.join(",")
            );
        }
        s
    }
}

/// A job_submit.lua (Slurm's `JobSubmitPlugins=lua`) that closes what partitions leave open
/// with `team-types`: a GPU type of a team (`<team>_<kind>`) may be asked for only in the
/// partition named after that team, whose `AllowGroups=` slurmctld enforces. The request is
/// read from the `tres_per_*` fields (Slurm 21.08 and later) and `gres` (before); a GPU item
/// without a type is refused too, as Slurm could give it any team's device. A type's team is
/// the longest team name it starts with, as team names may hold `_`. Jobs asking for no GPU,
/// and root's, pass untouched.
pub fn job_submit_lua<'a>(teams: impl IntoIterator<Item = &'a str>) -> String {
    let mut s = String::from(
        "-- Written by `gpuctl export slurm --job-submit` (docs/slurm.md, \"Teams and Slurm\").\n\
         -- A team's GPU type (<team>_<kind>) is for the team's partition only.\n\
         local teams = {\n",
    );
    for t in teams {
        // Team names are [a-z][a-z0-9_]*: nothing to escape in a Lua string.
        let _ = writeln!(s, "  [\"{t}\"] = true,");
    }
    s.push_str(JOB_SUBMIT_BODY);
    s
}

const JOB_SUBMIT_BODY: &str = r#"}

local function team_of(gpu_type)
  local best = nil
  for t in pairs(teams) do
    if string.sub(gpu_type, 1, #t + 1) == t .. "_" and (best == nil or #t > #best) then
      best = t
    end
  end
  return best
end

-- Why a request (one TRES/GRES string: "gres/gpu:infer_3g.40gb:1,gres/gpu:2", ...) may not
-- run in `partition`, or nil: each GPU item must name a type of the partition's team.
local function check(request, partition)
  if request == nil then
    return nil
  end
  for item in string.gmatch(request, "[^,]+") do
    local rest = string.match(item, "gpu(.*)$")
    if rest ~= nil then
      local gpu_type = string.match(rest, "^:([%w%._%-]+)")
      if gpu_type == nil or string.match(gpu_type, "^%d+$") then
        return "gpuctl: name your team's GPU type (--gres=gpu:<team>_<kind>:N, see " ..
          "`scontrol show node`): an untyped GPU request may get another team's device"
      end
      local team = team_of(gpu_type)
      if team ~= nil and partition ~= team then
        return "gpuctl: GPU type " .. gpu_type .. " is team " .. team ..
          "'s: submit it to partition " .. team .. " (-p " .. team .. ")"
      end
    end
  end
  return nil
end

local fields = { "tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task", "gres" }

local function refusal(job_desc, partition)
  for _, f in ipairs(fields) do
    local why = check(job_desc[f], partition)
    if why ~= nil then
      return why
    end
  end
  return nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  if submit_uid == 0 then
    return slurm.SUCCESS
  end
  local why = refusal(job_desc, job_desc.partition)
  if why ~= nil then
    slurm.log_user(why)
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  if modify_uid == 0 then
    return slurm.SUCCESS
  end
  local why = refusal(job_desc, job_desc.partition or job_rec.partition)
  if why ~= nil then
    slurm.log_user(why)
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

return slurm.SUCCESS
"#;

/// The prefix of every drain reason gpuctl sets; a node drained with another reason is the
/// admin's, and gpuctl never resumes it.
pub const REASON_PREFIX: &str = "gpuctl:";

impl SlurmNode {
    /// Drained by gpuctl (its reason), so gpuctl may resume it.
    pub fn drained_by_gpuctl(&self) -> bool {
        self.drain
            && self
                .reason
                .as_deref()
                .is_some_and(|r| r.starts_with(REASON_PREFIX))
    }
}

/// Parse one line of `scontrol show node -o NAME`: `NodeName=n1 … State=MIXED+DRAIN …
/// Reason=gpuctl: MIG change [root@2026-12-03T17:00:00]`. `Reason=` runs to the end of the
/// line (it may hold spaces), less Slurm's `[user@time]` suffix.
pub fn parse_node(line: &str) -> Option<SlurmNode> {
    let line = line.trim();
    let (fields, reason) = match line.find(" Reason=") {
        Some(i) => (&line[..i], Some(&line[i + " Reason=".len()..])),
        None => (line, None),
    };
    let get = |key: &str| {
        fields
            .split_whitespace()
            .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
    };
    let name = get("NodeName")?.to_string();
    let state = get("State")?;
    let mut parts = state.split('+');
    let base = parts.next().unwrap_or_default();
    let flags: Vec<&str> = parts.collect();
    let reason = reason.map(|r| match r.rfind(" [") {
        Some(i) if r.ends_with(']') => r[..i].to_string(),
        _ => r.to_string(),
    });
    Some(SlurmNode {
        name,
        drain: flags.iter().any(|f| f.starts_with("DRAIN")) || base.starts_with("DRAIN"),
        busy: matches!(base, "ALLOCATED" | "MIXED" | "COMPLETING") || flags.contains(&"COMPLETING"),
        reason: reason.filter(|r| !r.is_empty() && r != "(null)"),
    })
}

/// The Slurm job a cgroup v2 path belongs to ([`crate::names::slurm_job_of_cgroup`]); `None`
/// for any other path.
pub fn job_of_cgroup(cgroup: &str) -> Option<u64> {
    crate::names::slurm_job_of_cgroup(cgroup)
}

#[cfg(test)]
mod tests;
