//! Property: planning against the state an apply produced yields no actions. Blocked entries may
//! remain, but only on hosts where processes still run, or under `reconfigure = never` where
//! instances existed before (which must all survive the apply).

mod common;
use common::*;
use gpuctl::apply::{execute, GpuEffector, OwnerLabels};
use gpuctl::plan::plan;
use gpuctl::policy::{GpuUse, LendRule, LendTo, MigSpec, Reconfigure, Selector, Team};
use gpuctl::profiles::Catalog;
use gpuctl::sim::SimHost;
use proptest::prelude::*;
use std::time::Duration;

const TEAMS: [&str; 3] = ["alpha", "beta", "gamma"];

#[derive(Debug, Clone)]
enum Use {
    Skip,
    Owned(usize),
    Shared,
    /// (profile pick, owner, compute pick) triples.
    Mig(Vec<(usize, usize, usize)>),
    /// `mig = []`: MIG on, no instances.
    MigEmpty,
}

fn use_strategy() -> impl Strategy<Value = Use> {
    prop_oneof![
        1 => Just(Use::Skip),
        2 => (0..3usize).prop_map(Use::Owned),
        1 => Just(Use::Shared),
        5 => prop::collection::vec((0..16usize, 0..3usize, 0..4usize), 1..6).prop_map(Use::Mig),
        1 => Just(Use::MigEmpty),
    ]
}

/// Pre-existing state: (GI profile pick, placement pick, owner pick (3 = none), split?, busy
/// (0 = idle, 1 = unit, 2 = bare pid)).
type Existing = Vec<(usize, usize, usize, bool, u8)>;

fn host_strategy() -> impl Strategy<Value = Vec<(usize, bool, Existing, Use)>> {
    prop::collection::vec(
        (
            0..Catalog::get().models().len(),
            any::<bool>(),
            prop::collection::vec(
                (0..16usize, 0..8usize, 0..4usize, any::<bool>(), 0..3u8),
                0..5,
            ),
            use_strategy(),
        ),
        1..4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn apply_then_plan_is_empty(gpus in host_strategy(), reconf in 0..3u8, mps in any::<[bool; 3]>(), lends in any::<[bool; 3]>()) {
        let spec: Vec<&str> = gpus
            .iter()
            .map(|g| Catalog::get().models()[g.0].sim_name())
            .collect();
        let mut h = SimHost::from_spec(&spec.join(",")).unwrap();
        let mut assignments = Vec::new();
        let mut pid = 100;
        for (i, (_, mig_on, existing, usage)) in gpus.iter().enumerate() {
            let model = Catalog::get().by_sim_name(spec[i]).unwrap();
            let uuid = h.state.gpus[i].uuid.clone();
            if *mig_on && model.mig_capable() {
                h.set_mig_mode(&uuid, true).unwrap();
                h.reset_gpu(&uuid).unwrap();
                for (pp, pl, owner, split, busy) in existing {
                    let gp = &model.gi_profiles[pp % model.gi_profiles.len()];
                    let place = gp.placements[pl % gp.placements.len()];
                    let Ok(gi) = h.create_gi(&uuid, gp.id, place) else { continue };
                    if *owner < 3 {
                        h.set_owner(&uuid, gi, TEAMS[*owner]).unwrap();
                    }
                    let cis = model.ci_profiles(&gp.name);
                    let full = model.full_ci_profile(&gp.name).unwrap();
                    let ci = if *split && cis.len() > 1 { &cis[0] } else { full };
                    let Ok(cid) = h.create_ci(&uuid, gi, ci.id, ci.placements[0]) else { continue };
                    if *busy > 0 {
                        pid += 1;
                        let inst = h.state.gpus[i].mig.as_mut().unwrap().instances.iter_mut().find(|x| x.id == gi).unwrap();
                        let c = inst.compute.iter_mut().find(|c| c.id == cid).unwrap();
                        let unit = format!("job{pid}.service");
                        c.processes.push(proc(pid, (*busy == 1).then_some(unit.as_str())));
                    }
                }
            } else if !existing.is_empty() && existing[0].4 > 0 {
                pid += 1;
                let unit = format!("job{pid}.service");
                h.state.gpus[i].processes.push(proc(pid, (existing[0].4 == 1).then_some(unit.as_str())));
            }
            let usage = match usage {
                Use::Skip => continue,
                Use::Owned(t) => GpuUse::Owned(TEAMS[*t].parse().unwrap()),
                Use::Shared => GpuUse::Shared(vec![TEAMS[0].parse().unwrap(), TEAMS[2].parse().unwrap()]),
                Use::MigEmpty if model.mig_capable() => GpuUse::Mig(vec![]),
                Use::MigEmpty => continue,
                Use::Mig(specs) => {
                    if !model.mig_capable() { continue; }
                    let mut out: Vec<MigSpec> = Vec::new();
                    for (pp, owner, cp) in specs {
                        let gp = &model.gi_profiles[pp % model.gi_profiles.len()];
                        let cis = model.ci_profiles(&gp.name);
                        let compute = match cp {
                            1 if cis.len() > 1 => vec![cis[0].short_name().to_string(); (gp.slice_count / cis[0].slice_count).min(cis[0].instance_count) as usize],
                            2 if cis.len() > 2 => vec![cis[0].short_name().to_string(), cis[1].short_name().to_string()],
                            _ => vec![],
                        };
                        out.push(MigSpec { profile: gp.name.clone(), owner: TEAMS[*owner].parse().unwrap(), count: 1, compute });
                        // Keep geometries that fit an empty GPU (the validator rejects the rest).
                        let wanted: Vec<_> = out.iter().map(|s| model.gi_profile(&s.profile).unwrap()).collect();
                        if gpuctl::geometry::fit(model, &wanted, &[]).is_err() { out.pop(); }
                    }
                    GpuUse::Mig(out)
                }
            };
            assignments.push(assign(Selector::Index(vec![i as u32]), usage));
        }
        let reconfigure = [Reconfigure::WhenIdle, Reconfigure::Drain, Reconfigure::Never][reconf as usize];
        let teams = TEAMS.iter().zip(mps).zip(lends).map(|((t, m), l)| {
            let t = if m { mps_team(t) } else { team(t) };
            Team { lend: l.then(|| LendRule { to: LendTo::All, after: Duration::from_secs(1), grace: Duration::from_secs(5), when: vec![] }), ..t }
        }).collect();
        let p = policy(teams, assignments, reconfigure);

        // What exists before gpuctl runs: under `never` all of it must survive.
        let before: Vec<(String, gpuctl::profiles::Placement, u32)> = h.state.gpus.iter()
            .flat_map(|g| g.mig.iter().flat_map(|m| &m.instances).map(|gi| (g.uuid.clone(), gi.placement, gi.profile_id)))
            .collect();
        let first = plan(&p, &h.state);
        let report = execute(&p, &first, &mut h).unwrap();
        prop_assert!(report.failed.is_empty(), "failures: {:#?}\nplan: {:#?}", report.failed, first);
        let again = plan(&p, &h.state);
        prop_assert!(again.actions.is_empty(), "re-plan not empty: {:#?}\nfirst: {:#?}", again.actions, first);
        // The loans slice allows exactly the devices of the teams that lend (and run no MPS).
        let lent: std::collections::BTreeSet<String> = TEAMS.iter().zip(mps).zip(lends)
            .filter(|((_, m), l)| *l && !*m)
            .filter_map(|((t, _), _)| h.state.slices.get(*t))
            .flat_map(|s| s.device_allow.iter().cloned())
            .collect();
        let loans = h.state.slices.get("loans").map(|s| s.device_allow.clone());
        let lender = TEAMS.iter().zip(mps).zip(lends).any(|((_, m), l)| l && !m);
        prop_assert_eq!(loans, lender.then_some(lent));
        let procs_left = h.state.gpus.iter().any(|g| !g.processes.is_empty()
            || g.mig.iter().flat_map(|m| &m.instances).any(|gi| gi.compute.iter().any(|c| !c.processes.is_empty())));
        let never = reconfigure == Reconfigure::Never;
        prop_assert!(again.blocked.is_empty() || procs_left || (never && !before.is_empty()),
            "blocked without processes: {:#?}", again.blocked);
        if never {
            for (uuid, place, profile) in &before {
                let kept = h.state.gpus.iter().filter(|g| &g.uuid == uuid)
                    .flat_map(|g| g.mig.iter().flat_map(|m| &m.instances))
                    .any(|gi| gi.placement == *place && gi.profile_id == *profile);
                prop_assert!(kept, "reconfigure = never destroyed {uuid} {place:?}\nfirst: {:#?}", first);
            }
        }
    }
}
