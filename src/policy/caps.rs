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
/// Most calendar windows in one `[teams.NAME.lend] when` list.
pub const MAX_WINDOWS: usize = 32;
/// Most `[[gpu.layout]]` tables in one `[[gpu]]` entry.
pub const MAX_LAYOUTS: usize = 16;
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
        if let Some(l) = &t.lend {
            check_lend(p, name, l)?;
        }
    }
    let h = p.host.fair_share_half_life;
    if h.is_zero() || h > super::lend::MAX_HALF_LIFE {
        return Err(format!(
            "fair-share-half-life {} s is out of bounds (MAX_HALF_LIFE)",
            h.as_secs()
        ));
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
        let uses: Vec<&GpuUse> = match &g.layouts {
            None => vec![&g.usage],
            Some(ls) => {
                within!("layouts", ls.other.len(), MAX_LAYOUTS)?;
                let bad = |d: std::time::Duration| d.is_zero() || d > MAX_IDLE_WINDOW;
                if bad(ls.after) || bad(ls.hold) {
                    return Err(format!(
                        "{}.reslice is out of bounds (MAX_IDLE_WINDOW)",
                        g.key
                    ));
                }
                for l in &ls.other {
                    within!("windows", l.when.len(), MAX_WINDOWS)?;
                }
                std::iter::once(&g.usage)
                    .chain(ls.other.iter().map(|l| &l.usage))
                    .collect()
            }
        };
        for usage in uses {
            let teams: Vec<&TeamName> = match usage {
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
    }
    Ok(())
}

/// The longest idle window (`after`, `grace`, a lend rule's `after`): a month. Longer is a typo
/// (`"15d"` for `"15m"`) more often than a rule, and it bounds the idle tracker's arithmetic.
pub const MAX_IDLE_WINDOW: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// A read-back lend rule: durations within their bounds, borrowers that exist and are not the
/// owner (windows re-parse as they are read).
fn check_lend(p: &super::Policy, name: &TeamName, l: &super::LendRule) -> Result<(), String> {
    use super::lend::MAX_LEND_GRACE;
    if l.after.is_zero() || l.after > MAX_IDLE_WINDOW {
        return Err(format!(
            "teams.{name}.lend.after is out of bounds (MAX_IDLE_WINDOW)"
        ));
    }
    if l.grace.is_zero() || l.grace > MAX_LEND_GRACE {
        return Err(format!(
            "teams.{name}.lend.grace is out of bounds (MAX_LEND_GRACE)"
        ));
    }
    within!("windows", l.when.len(), MAX_WINDOWS)?;
    if let super::LendTo::Teams(ts) = &l.to {
        within!("teams", ts.len(), MAX_TEAMS)?;
        if let Some(t) = ts
            .iter()
            .find(|t| *t == name || !p.teams.contains_key(t.as_ref()))
        {
            return Err(format!(
                "teams.{name}.lend.to: {t:?} is the owner or unknown"
            ));
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
            layouts_in_force: Default::default(),
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
                lend: None,
                borrow: false,
                loc: None,
            },
        );
        assert!(check_policy(&p).unwrap_err().contains("below the floor"));
        let a: TeamName = "a".parse().unwrap();
        let t = p.teams.get_mut(&a).unwrap();
        t.limits.memory_max = None;
        t.lend = Some(crate::policy::LendRule {
            to: crate::policy::LendTo::Teams(vec![a.clone()]),
            after: std::time::Duration::from_secs(60),
            grace: std::time::Duration::from_secs(60),
            when: vec![],
        });
        assert!(
            check_policy(&p).unwrap_err().contains("lend.to"),
            "lends to itself"
        );
        fn lend<'p>(
            p: &'p mut crate::policy::Policy,
            a: &TeamName,
        ) -> &'p mut crate::policy::LendRule {
            p.teams.get_mut(a).unwrap().lend.as_mut().unwrap()
        }
        lend(&mut p, &a).to = crate::policy::LendTo::All;
        assert_eq!(check_policy(&p), Ok(()));
        lend(&mut p, &a).grace = std::time::Duration::ZERO;
        assert!(check_policy(&p).unwrap_err().contains("MAX_LEND_GRACE"));
        p.teams.get_mut(&a).unwrap().lend = None;
        p.host.fair_share_half_life = std::time::Duration::ZERO;
        assert!(check_policy(&p).unwrap_err().contains("MAX_HALF_LIFE"));
        p.host.fair_share_half_life = crate::policy::lend::DEFAULT_HALF_LIFE;
        p.teams.get_mut(&a).unwrap().limits.memory_max = Some(crate::policy::Size::Bytes(0));

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
