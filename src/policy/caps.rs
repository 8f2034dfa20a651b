//! Input caps: how long a list in a policy may be, each cap a named constant so a cap error
//! names it; and the re-check of a policy that did not come through the parser.
//!
//! Why caps: validation must stay linear in the size of the input and bounded in memory, so a
//! hostile or careless file (100,000 members, a 200,000-entry index list) is refused with an
//! error naming the limit instead of keeping gpuctld busy. Every cap is far above what a real
//! host needs (an 8-GPU box with five teams uses a few dozen entries in all).
//!
//! The bounds of single values (memory floor and ceiling, `memory-high` ≤ `memory-max`,
//! `drain-timeout`, GPU UUIDs, CPU-list length) are not here: they live with the value's parser
//! in [`crate::settings`] (`kinds.rs`, `value.rs`), and [`check_policy`] calls them from there.

use super::TeamName;
use crate::settings::value::{check_len, valid_gpu_uuid, MAX_DRAIN_TIMEOUT};

/// Most `[teams.*]` tables in one file.
pub const MAX_TEAMS: usize = 1024;
/// Most entries of one team's `members`.
pub const MAX_MEMBERS: usize = 4096;
/// Most `[[gpu]]` entries in one file.
pub const MAX_GPU_ENTRIES: usize = 256;
/// Most GPUs named by one `index` or `uuid` list.
pub const MAX_SELECTED_GPUS: usize = 1024;
/// Most teams in one `shared` list.
pub const MAX_SHARED_TEAMS: usize = 1024;
/// Most elements of one `mig` list (a GPU holds at most 7 GPU instances).
pub const MAX_MIG_ENTRIES: usize = 16;
/// Most compute instances in one `compute` split (a GI has at most 7 compute slices).
pub const MAX_COMPUTE: usize = 8;
/// Most diagnostics reported for one load; the rest are counted in one line.
pub const MAX_DIAGNOSTICS: usize = 500;

/// `within!("teams", n, MAX_TEAMS)`: [`check_len`] of `n` against a cap of this module, naming
/// the cap by its constant, so the name in the error cannot drift from the constant checked.
macro_rules! within {
    ($what:expr, $n:expr, $cap:ident) => {
        $crate::settings::value::check_len($what, $n, $crate::policy::caps::$cap, stringify!($cap))
    };
}
pub(crate) use within;

/// Re-check a policy that did not come through the parser (the last good policy read back from
/// `/var/lib/gpuctl/last-good/` after a restart): the value rules and caps that a hand-edited or
/// corrupted copy could break. The first violation, in words.
pub fn check_policy(p: &super::Policy) -> Result<(), String> {
    use super::{GpuUse, Selector};
    if p.host.drain_timeout > MAX_DRAIN_TIMEOUT {
        return Err(format!(
            "drain-timeout {} s is over the maximum (MAX_DRAIN_TIMEOUT)",
            p.host.drain_timeout.as_secs()
        ));
    }
    if let Some(x) = p
        .host
        .health
        .application_xids
        .iter()
        .find(|x| crate::health::fatal_name(**x).is_some())
    {
        return Err(format!(
            "host.health.application-xids: XID {x} is fatal, never an application XID"
        ));
    }
    within!("teams", p.teams.len(), MAX_TEAMS)?;
    for (name, t) in &p.teams {
        if *name != t.name {
            return Err(format!("invalid team name {name:?}"));
        }
        within!("members", t.members.len(), MAX_MEMBERS)?;
        // The host is not known here: the bounds that need its RAM wait for the host check.
        if let Some((key, m)) = t.limits.check(0).into_iter().next() {
            return Err(format!("teams.{name}.{key}: {m}"));
        }
        t.limits
            .memory_order(0)
            .map_err(|m| format!("teams.{name}.memory-high: {m}"))?;
    }
    check_len(
        "[[gpu]] entries",
        p.gpus.len(),
        MAX_GPU_ENTRIES * 16,
        "MAX_GPU_ENTRIES",
    )?;
    for g in &p.gpus {
        match &g.selector {
            Selector::Index(v) => within!("GPUs", v.len(), MAX_SELECTED_GPUS)?,
            Selector::Uuid(v) => {
                within!("GPUs", v.len(), MAX_SELECTED_GPUS)?;
                if let Some(u) = v.iter().find(|u| !valid_gpu_uuid(u)) {
                    return Err(format!("{u:?} is not a GPU UUID"));
                }
            }
            Selector::Model(_) | Selector::All => {}
        }
        let teams: Vec<&TeamName> = match &g.usage {
            GpuUse::Owned(t) => vec![t],
            GpuUse::Shared(ts) => {
                within!("teams", ts.len(), MAX_SHARED_TEAMS)?;
                ts.iter().collect()
            }
            GpuUse::Mig(ms) => {
                within!("MIG entries", ms.len(), MAX_MIG_ENTRIES)?;
                if ms
                    .iter()
                    .any(|m| m.count == 0 || m.count > 7 || m.compute.len() > MAX_COMPUTE)
                {
                    return Err("a MIG entry is out of bounds".into());
                }
                ms.iter().map(|m| &m.owner).collect()
            }
        };
        if let Some(t) = teams.iter().find(|t| !p.teams.contains_key(t.as_ref())) {
            return Err(format!("unknown team {t:?}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_back_policy_is_checked_again() {
        let mut p = crate::policy::Policy {
            host: crate::policy::HostSettings::default(),
            teams: Default::default(),
            gpus: vec![],
            sources: vec![],
            slurm: Default::default(),
        };
        assert_eq!(check_policy(&p), Ok(()));
        p.host.drain_timeout = std::time::Duration::from_secs(u64::MAX);
        assert!(check_policy(&p).is_err());
        p.host.drain_timeout = std::time::Duration::from_secs(1);
        p.teams.insert(
            "a".parse().unwrap(),
            crate::policy::Team {
                name: "a".parse().unwrap(),
                members: vec![],
                limits: crate::policy::Limits {
                    memory_max: Some(crate::policy::Size::Bytes(0)),
                    ..Default::default()
                },
                mps: None,
                idle: None,
                placement: Default::default(),
                loc: None,
            },
        );
        assert!(check_policy(&p).unwrap_err().contains("below the floor"));

        // A name is a `TeamName` inside a policy: a copy edited to hold a slice-nesting name
        // does not even deserialise, so nothing downstream sees it.
        let mut v = serde_json::to_value(&p).unwrap();
        let team = v["teams"]["a"].take();
        v["teams"] = serde_json::json!({ "a-b": team });
        v["teams"]["a-b"]["name"] = "a-b".into();
        let e = serde_json::from_value::<crate::policy::Policy>(v).unwrap_err();
        assert!(e.to_string().contains("invalid team name \"a-b\""), "{e}");
    }
}
