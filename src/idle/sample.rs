//! A usage collection → the holders the idle rules look at (pure).
//!
//! A holder is a (team, unit) with processes on a device the team owns, the unit being the one
//! directly in `gpu-<team>.slice` (`ProcessUsage::team_unit`: what this host's systemd can stop).
//! Processes outside team slices, on devices their team does not own (strays), or of teams with
//! no idle rule are not holders: the idle rules never reach outside a team's own share.
//!
//! Activity is the device's: GPM SM activity where the collection has it, else NVML's GPU
//! utilisation for a whole GPU not in MIG mode; a MIG device without GPM has none (`Unknown`).

use super::{Activity, HolderSample, Sample};
use crate::policy::IdleRule;
use crate::usage::{ProcessUsage, Usage};
use std::collections::{BTreeMap, BTreeSet};

/// The holders in `usage` of the teams that have a rule in `rules`.
pub fn from_usage(usage: &Usage, rules: &BTreeMap<String, IdleRule>) -> Sample {
    let mut holders = Vec::new();
    for g in &usage.gpus {
        // No activity for a whole GPU in MIG mode; GPM, else utilisation, otherwise.
        let whole = g.activity.or(g.utilization_gpu.map(f64::from));
        let gpu = (
            g.index.to_string(),
            &g.teams,
            &g.processes,
            g.memory_total,
            whole.filter(|_| !g.mig),
        );
        let mig = g.mig_devices.iter().map(|m| {
            (
                m.uuid.clone(),
                &m.teams,
                &m.processes,
                m.memory_total,
                m.activity,
            )
        });
        for (id, owners, procs, capacity, a) in std::iter::once(gpu).chain(mig) {
            let a = a.map_or(Activity::Unknown, Activity::Percent);
            device(&mut holders, rules, &id, owners, procs, capacity, a);
        }
    }
    Sample {
        at_ms: usage.collected_at_ms,
        holders,
    }
}

/// How an idle Slurm job is named as a holder.
pub(crate) fn slurm_unit(job: u64) -> String {
    format!("slurm job {job}")
}

fn device(
    out: &mut Vec<HolderSample>,
    rules: &BTreeMap<String, IdleRule>,
    device: &str,
    owners: &[String],
    procs: &[ProcessUsage],
    capacity: Option<u64>,
    activity: Activity,
) {
    // Everything on the device shares its activity, holders or not (a stray, another team).
    let sharing: BTreeSet<String> = procs
        .iter()
        .map(|p| {
            p.team_unit
                .clone()
                .or_else(|| p.unit.clone())
                .unwrap_or_else(|| format!("pid {}", p.pid))
        })
        .collect();
    let mut groups: BTreeMap<(String, String), Vec<&ProcessUsage>> = BTreeMap::new();
    for p in procs {
        let (team, unit) = match (&p.team, &p.team_unit, p.slurm_job) {
            (Some(team), Some(unit), _) => (team.clone(), unit.clone()),
            // A Slurm job runs in Slurm's cgroups, on a device its team owns (Slurm's GRES
            // fence): it is that team's holder, reported but never stopped (`not_stoppable`).
            (None, _, Some(job)) if owners.len() == 1 => (owners[0].clone(), slurm_unit(job)),
            _ => continue,
        };
        if p.stray || !owners.contains(&team) || !rules.contains_key(&team) {
            continue;
        }
        groups.entry((team, unit)).or_default().push(p);
    }
    for ((team, unit), ps) in groups {
        let known: Vec<u64> = ps.iter().filter_map(|p| p.used_memory).collect();
        let mut pids: Vec<u32> = ps.iter().map(|p| p.pid).collect();
        pids.sort_unstable();
        out.push(HolderSample {
            team,
            unit,
            user: ps[0].user.clone(),
            uid: ps[0].uid,
            device: device.to_string(),
            pids,
            memory: (!known.is_empty()).then(|| known.iter().sum()),
            capacity,
            activity,
            sharing: sharing.len(),
        });
    }
}
