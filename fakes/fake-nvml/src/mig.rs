//! MIG geometry rules: GI ids, automatic placement choice, capacity.
//!
//! GI ids follow a binary tree over the memory slices (15 nodes on 8-slice GPUs: ids 0..=14):
//! level by level from the whole GPU down to single slices, and inside a level the upper half
//! of the GPU is numbered before the lower half. On 8 slices this gives
//! `[0,8)→0; [4,8)→1, [0,4)→2; 2-slice blocks at 4,6,0,2 → 3..6; single slices 4,5,6,7,0,1,2,3
//! → 7..14`, which matches the reference observations (7×1g ids 9,7,8,11,12,13,14 at
//! placements 6,4,5,0,1,2,3; 3g ids 1/2 at 4:4/0:4).
//! The RTX PRO 6000 Blackwell reports 12 units (4 positions of 3) and numbers its tree in order
//! (its public `-lgi`: GI 1 at 0:6, GI 5 at 6:3, GI 6 at 9:3).
//!
//! Automatic placement (create without placement) picks the free placement that removes the
//! fewest still-creatable (profile, placement) options of the GPU, lowest start on ties —
//! which reproduces the observed 7×1g order. Both rules are the fake's model, not NVIDIA's
//! documented algorithm.

use crate::model::{CiProfile, GiProfile, MigModel, Span};
use crate::state::{GpuInstance, State};

/// GI id of a placement in the tree numbering; `None` for unaligned or non-power-of-two spans.
pub fn gi_id_for(memory_slices: u32, p: Span) -> Option<u32> {
    // Units of a non-power-of-two count (12 = 4 positions of 3) are grouped into positions.
    let unit = memory_slices.checked_shr(memory_slices.trailing_zeros())?;
    let in_order = unit > 1;
    let (slices, start, size) = (memory_slices / unit, p.start / unit, p.size / unit);
    if p.size == 0
        || p.start % unit != 0
        || p.size % unit != 0
        || !size.is_power_of_two()
        || start % size != 0
        || start + size > slices
    {
        return None;
    }
    let nodes = slices / size;
    let pos = start / size;
    let ord = if nodes == 1 || in_order {
        pos
    } else if pos >= nodes / 2 {
        pos - nodes / 2
    } else {
        pos + nodes / 2
    };
    Some(nodes - 1 + ord)
}

fn gi_span(gi: &GpuInstance) -> Span {
    Span {
        start: gi.start,
        size: gi.size,
    }
}

/// Whether `p` is free on a GPU holding `gis`.
pub fn gi_free(gis: &[GpuInstance], p: Span) -> bool {
    gis.iter().all(|g| !gi_span(g).overlaps(&p))
}

/// Why a GI cannot be created.
#[derive(Debug, PartialEq, Eq)]
pub enum CreateError {
    /// Placement is not one of the profile's placements.
    BadPlacement,
    /// Overlap, profile instance limit, or no id left.
    NoResources,
}

/// Checks an explicit GI placement and returns the GI id it gets.
pub fn check_gi(
    mig: &MigModel,
    gis: &[GpuInstance],
    prof: &GiProfile,
    p: Span,
) -> Result<u32, CreateError> {
    if !prof.placements.contains(&p) {
        return Err(CreateError::BadPlacement);
    }
    let same = gis
        .iter()
        .filter(|g| g.profile_id == prof.profile_id)
        .count() as u32;
    if same >= prof.instance_count || !gi_free(gis, p) {
        return Err(CreateError::NoResources);
    }
    let id = gi_id_for(mig.memory_slices, p)
        .or_else(|| (0..15).find(|id| gis.iter().all(|g| g.id != *id)))
        .ok_or(CreateError::NoResources)?;
    if gis.iter().any(|g| g.id == id) {
        return Err(CreateError::NoResources);
    }
    Ok(id)
}

/// Placement the fake driver picks for a create without placement.
pub fn auto_gi_placement(mig: &MigModel, gis: &[GpuInstance], prof: &GiProfile) -> Option<Span> {
    let options: Vec<(u32, Span)> = mig
        .gi_profiles
        .iter()
        .flat_map(|gp| gp.placements.iter().map(move |p| (gp.profile_id, *p)))
        .filter(|(_, p)| gi_free(gis, *p))
        .collect();
    prof.placements
        .iter()
        .copied()
        .filter(|p| check_gi(mig, gis, prof, *p).is_ok())
        .min_by_key(|cand| {
            let blocked = options
                .iter()
                .filter(|(pid, p)| !(*pid == prof.profile_id && p == cand) && p.overlaps(cand))
                .count();
            (blocked, cand.start)
        })
}

/// `nvmlDeviceGetGpuInstanceRemainingCapacity`: how many more GIs of `prof` fit.
pub fn gi_remaining(mig: &MigModel, gis: &[GpuInstance], prof: &GiProfile) -> u32 {
    let mut sim: Vec<GpuInstance> = gis.to_vec();
    let mut n = 0;
    while let Some(p) = auto_gi_placement(mig, &sim, prof) {
        sim.push(GpuInstance {
            id: 1000 + n,
            profile_id: prof.profile_id,
            start: p.start,
            size: p.size,
            serial: 0,
            compute_instances: Vec::new(),
        });
        n += 1;
    }
    n
}

/// Checks an explicit CI placement inside `gi`; returns the CI id it gets
/// (lowest free id in 0..=7, an assumption).
pub fn check_ci(gi: &GpuInstance, prof: &CiProfile, p: Span) -> Result<u32, CreateError> {
    if !prof.placements.contains(&p) {
        return Err(CreateError::BadPlacement);
    }
    let cis = &gi.compute_instances;
    let same = cis
        .iter()
        .filter(|c| c.profile_id == prof.profile_id)
        .count() as u32;
    let free = cis.iter().all(|c| {
        !Span {
            start: c.start,
            size: c.size,
        }
        .overlaps(&p)
    });
    if same >= prof.instance_count || !free {
        return Err(CreateError::NoResources);
    }
    (0..8)
        .find(|id| cis.iter().all(|c| c.id != *id))
        .ok_or(CreateError::NoResources)
}

/// Placement for a CI create without placement: lowest free start.
pub fn auto_ci_placement(gi: &GpuInstance, prof: &CiProfile) -> Option<Span> {
    prof.placements
        .iter()
        .copied()
        .filter(|p| check_ci(gi, prof, *p).is_ok())
        .min_by_key(|p| p.start)
}

/// How many more CIs of `prof` fit in `gi`.
pub fn ci_remaining(gi: &GpuInstance, prof: &CiProfile) -> u32 {
    let mut sim = gi.clone();
    let mut n = 0;
    while let Some(p) = auto_ci_placement(&sim, prof) {
        let id = check_ci(&sim, prof, p).expect("auto placement is valid");
        sim.compute_instances.push(crate::state::ComputeInstance {
            id,
            profile_id: prof.profile_id,
            start: p.start,
            size: p.size,
            serial: 0,
            uuid: String::new(),
        });
        n += 1;
    }
    n
}

/// Whether any process runs on GPU `gpu` (optionally restricted to a GI / CI).
pub fn busy(st: &State, gpu: u32, gi: Option<u32>, ci: Option<u32>) -> bool {
    st.processes
        .iter()
        .any(|p| p.gpu == gpu && (gi.is_none() || p.gi == gi) && (ci.is_none() || p.ci == ci))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::find_model;

    #[test]
    fn tree_ids() {
        let s = |start, size| Span { start, size };
        assert_eq!(gi_id_for(8, s(0, 8)), Some(0));
        assert_eq!(gi_id_for(8, s(4, 4)), Some(1));
        assert_eq!(gi_id_for(8, s(0, 4)), Some(2));
        assert_eq!(gi_id_for(8, s(4, 2)), Some(3));
        assert_eq!(gi_id_for(8, s(2, 2)), Some(6));
        assert_eq!(gi_id_for(8, s(4, 1)), Some(7));
        assert_eq!(gi_id_for(8, s(6, 1)), Some(9));
        assert_eq!(gi_id_for(8, s(7, 1)), Some(10));
        assert_eq!(gi_id_for(8, s(0, 1)), Some(11));
        assert_eq!(gi_id_for(8, s(3, 1)), Some(14));
        assert_eq!(gi_id_for(4, s(0, 4)), Some(0));
        assert_eq!(gi_id_for(4, s(1, 1)), Some(6));
        assert_eq!(gi_id_for(8, s(1, 2)), None);
        // GB202's 12 units, as its public -lgi numbers them.
        assert_eq!(gi_id_for(12, s(0, 6)), Some(1));
        assert_eq!(gi_id_for(12, s(6, 3)), Some(5));
        assert_eq!(gi_id_for(12, s(9, 3)), Some(6));
        assert_eq!(gi_id_for(12, s(0, 12)), Some(0));
        assert_eq!(gi_id_for(12, s(1, 3)), None);
    }

    /// Every reference placement gets a tree id, so ids never collide between live GIs.
    #[test]
    fn every_reference_placement_has_an_id() {
        for m in crate::model::models() {
            let Some(mig) = &m.mig else { continue };
            for p in &mig.gi_profiles {
                for pl in &p.placements {
                    let id = gi_id_for(mig.memory_slices, *pl);
                    assert!(id.is_some_and(|i| i <= 14), "{} {} {pl:?}", m.key, p.name);
                }
            }
        }
    }

    #[test]
    fn seven_1g_auto_order_matches_reference() {
        for key in [
            "A100-SXM4-40GB",
            "A100-SXM4-80GB",
            "H100-SXM5-80GB",
            "H200-141GB",
        ] {
            let mig = find_model(key).unwrap().mig.as_ref().unwrap();
            let prof = mig.gi_by_index(0).unwrap();
            let mut gis: Vec<GpuInstance> = Vec::new();
            let mut ids = Vec::new();
            while let Some(p) = auto_gi_placement(mig, &gis, prof) {
                let id = check_gi(mig, &gis, prof, p).unwrap();
                ids.push(id);
                gis.push(GpuInstance {
                    id,
                    profile_id: prof.profile_id,
                    start: p.start,
                    size: p.size,
                    serial: 0,
                    compute_instances: vec![],
                });
            }
            assert_eq!(ids, [9, 7, 8, 11, 12, 13, 14], "{key}");
        }
    }
}
