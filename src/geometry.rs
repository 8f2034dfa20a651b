//! MIG geometry: does a set of GPU-instance (or compute-instance) profiles fit on a GPU, and where?
//!
//! The driver only accepts an instance at one of its profile's legal placements (a start slice and
//! a size), and instances must not share slices. Whether a list of profiles fits is therefore a
//! small exact-cover-like search, not a sum: on an A100-40GB, `4g.20gb` can only start at memory
//! slice 0, so placing a `1g.5gb` there first (greedy first-fit) wrongly reports a misfit.
//!
//! [`fit`] and [`fit_compute`] answer the question exactly and explain a misfit in words. They are
//! pure functions over the reference data and the only placement search in gpuctl: policy
//! validation calls them with no host known, and the planner (`plan::mig`) passes the instances it
//! keeps as `fixed` and places new ones around them, so a geometry the validator accepts is one
//! the planner can lay out on an empty GPU.

use crate::profiles::{CiProfile, GiProfile, GpuModel, Placement};
use std::collections::HashSet;

/// Why a geometry does not fit. [`std::fmt::Display`] gives one line for humans, e.g.
/// `3g.40gb x3 needs 12 of 8 memory slices`; callers prefix the GPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Misfit {
    /// More memory slices wanted (kept instances included) than the GPU has.
    #[error("{wanted} needs {needed} of {available} memory slices")]
    MemorySlices {
        /// What was asked, e.g. `3g.40gb x3`.
        wanted: String,
        /// Slices needed, kept instances included.
        needed: u32,
        /// Slices the GPU (or GI) has.
        available: u32,
    },
    /// More compute slices wanted than the GPU (or GI) has.
    #[error("{wanted} needs {needed} of {available} compute slices")]
    ComputeSlices {
        /// What was asked.
        wanted: String,
        /// Slices needed.
        needed: u32,
        /// Slices available.
        available: u32,
    },
    /// More instances of one profile than the hardware allows.
    #[error("{profile} x{wanted} exceeds the {max} instance(s) of {profile} the GPU can hold")]
    ProfileCount {
        /// Profile name.
        profile: String,
        /// Instances wanted, kept ones included.
        wanted: u32,
        /// `instance_count` of the profile.
        max: u32,
    },
    /// More instances in total than the GPU's `max_mig_device_count`.
    #[error("{wanted} instances exceed the GPU's limit of {max}")]
    DeviceCount {
        /// Instances wanted, kept ones included.
        wanted: u32,
        /// The model's limit.
        max: u32,
    },
    /// The counts add up, but no assignment of legal placements avoids overlaps.
    #[error(
        "{wanted} has enough slices in total, but no arrangement of the profiles' legal \
         placements avoids overlaps{}",
        around(.fixed)
    )]
    NoPlacement {
        /// What was asked.
        wanted: String,
        /// What was already there (kept instances), empty when nothing.
        fixed: String,
    },
    /// Two kept instances overlap, so the input itself is inconsistent.
    #[error("kept instances overlap: slices {} and {}", slices(.a), slices(.b))]
    FixedOverlap {
        /// The first placement.
        a: Placement,
        /// The second placement.
        b: Placement,
    },
}

/// ` around the kept …` after a misfit among kept instances; nothing when none were kept.
fn around(fixed: &str) -> String {
    if fixed.is_empty() {
        String::new()
    } else {
        format!(" around the kept {fixed}")
    }
}

fn slices(p: &Placement) -> String {
    if p.size == 1 {
        format!("{}", p.start)
    } else {
        format!("{}-{}", p.start, p.start + p.size - 1)
    }
}

/// `3g.40gb x2 + 1g.10gb`: names in first-appearance order with their counts.
pub fn summarize<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let mut counts: Vec<(&str, u32)> = Vec::new();
    for n in names {
        match counts.iter_mut().find(|(m, _)| *m == n) {
            Some((_, c)) => *c += 1,
            None => counts.push((n, 1)),
        }
    }
    counts
        .iter()
        .map(|(n, c)| {
            if *c == 1 {
                n.to_string()
            } else {
                format!("{n} x{c}")
            }
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

/// Place GPU instances of the `wanted` profiles on a GPU of `model` that already holds the
/// `fixed` instances (GI profile ID, placement), e.g. the instances a planner keeps.
///
/// Returns one placement per wanted profile, in the order of `wanted`. The search is exact: when
/// any assignment of legal placements exists, one is returned. Counts are checked first so that
/// the error names the binding limit, in this order: memory slices, compute slices, per-profile
/// `instance_count`, the model's `max_mig_device_count`; only then placements.
///
/// Among fits, the one returned is deterministic (most constrained profiles first, each at its
/// lowest legal start), so repeated plans agree.
pub fn fit(
    model: &GpuModel,
    wanted: &[&GiProfile],
    fixed: &[(u32, Placement)],
) -> Result<Vec<Placement>, Misfit> {
    let fixed_names: Vec<String> = fixed
        .iter()
        .map(|(id, p)| match model.gi_profile_by_id(*id) {
            Some(gp) => gp.name.clone(),
            None => format!("profile {id} at {}", slices(p)),
        })
        .collect();
    let summary = summarize(
        wanted
            .iter()
            .map(|p| p.name.as_str())
            .chain(fixed_names.iter().map(String::as_str)),
    );

    let mem_needed: u32 = wanted.iter().map(|p| p.memory_slices()).sum::<u32>()
        + fixed.iter().map(|(_, p)| p.size).sum::<u32>();
    if mem_needed > model.memory_slices {
        return Err(Misfit::MemorySlices {
            wanted: summary,
            needed: mem_needed,
            available: model.memory_slices,
        });
    }
    let compute_needed: u32 = wanted.iter().map(|p| p.slice_count).sum::<u32>()
        + fixed
            .iter()
            .filter_map(|(id, _)| model.gi_profile_by_id(*id))
            .map(|p| p.slice_count)
            .sum::<u32>();
    if compute_needed > model.compute_slices {
        return Err(Misfit::ComputeSlices {
            wanted: summary,
            needed: compute_needed,
            available: model.compute_slices,
        });
    }
    // Per-profile limits count kept instances too: the driver counts what exists.
    let mut seen = HashSet::new();
    for p in wanted {
        if !seen.insert(p.id) {
            continue;
        }
        let n = wanted.iter().filter(|q| q.id == p.id).count() as u32
            + fixed.iter().filter(|(id, _)| *id == p.id).count() as u32;
        if n > p.instance_count {
            return Err(Misfit::ProfileCount {
                profile: p.name.clone(),
                wanted: n,
                max: p.instance_count,
            });
        }
    }
    let total = (wanted.len() + fixed.len()) as u32;
    if model.max_mig_device_count > 0 && total > model.max_mig_device_count {
        return Err(Misfit::DeviceCount {
            wanted: total,
            max: model.max_mig_device_count,
        });
    }

    let occupied = occupied_mask(fixed.iter().map(|(_, p)| *p))?;
    let options: Vec<&[Placement]> = wanted.iter().map(|p| p.placements.as_slice()).collect();
    place(&options, occupied).ok_or_else(|| Misfit::NoPlacement {
        wanted: summarize(wanted.iter().map(|p| p.name.as_str())),
        fixed: summarize(fixed_names.iter().map(String::as_str)),
    })
}

/// Place compute instances of the `wanted` CI profiles inside one GPU instance of profile `gi`.
/// Same contract as [`fit`], with compute slices of the GI instead of memory slices of the GPU;
/// CIs have no memory slices of their own.
pub fn fit_compute(gi: &GiProfile, wanted: &[&CiProfile]) -> Result<Vec<Placement>, Misfit> {
    let summary = summarize(wanted.iter().map(|c| c.name.as_str()));
    let needed: u32 = wanted.iter().map(|c| c.slice_count).sum();
    if needed > gi.slice_count {
        return Err(Misfit::ComputeSlices {
            wanted: summary,
            needed,
            available: gi.slice_count,
        });
    }
    let mut seen = HashSet::new();
    for c in wanted {
        if !seen.insert(c.id) {
            continue;
        }
        let n = wanted.iter().filter(|d| d.id == c.id).count() as u32;
        if n > c.instance_count {
            return Err(Misfit::ProfileCount {
                profile: c.name.clone(),
                wanted: n,
                max: c.instance_count,
            });
        }
    }
    let options: Vec<&[Placement]> = wanted.iter().map(|c| c.placements.as_slice()).collect();
    place(&options, 0).ok_or(Misfit::NoPlacement {
        wanted: summary,
        fixed: String::new(),
    })
}

fn occupied_mask(fixed: impl Iterator<Item = Placement>) -> Result<u32, Misfit> {
    let mut mask = 0u32;
    let mut placed: Vec<Placement> = Vec::new();
    for p in fixed {
        if let Some(q) = placed.iter().find(|q| q.overlaps(&p)) {
            return Err(Misfit::FixedOverlap { a: *q, b: p });
        }
        placed.push(p);
        mask |= p.mask();
    }
    Ok(mask)
}

/// The exact search: choose one placement from each item's options so that no two chosen
/// placements (nor any chosen one and `occupied`) share a slot. Returns the choices in item order,
/// or `None` when no choice exists.
///
/// Items are tried most constrained first (fewest options, then largest), and failed states
/// `(occupied mask, depth)` are memoised: with at most 8 slots there are at most 256 masks, so the
/// search is tiny even when the answer is "no".
pub fn place(options: &[&[Placement]], occupied: u32) -> Option<Vec<Placement>> {
    let mut order: Vec<usize> = (0..options.len()).collect();
    order.sort_by_key(|&i| {
        let size = options[i].first().map(|p| p.size).unwrap_or(0);
        (options[i].len(), std::cmp::Reverse(size), i)
    });
    let mut chosen: Vec<Option<Placement>> = vec![None; options.len()];
    let mut failed: HashSet<(u32, usize)> = HashSet::new();
    if search(options, &order, 0, occupied, &mut chosen, &mut failed) {
        Some(chosen.into_iter().map(|p| p.expect("all placed")).collect())
    } else {
        None
    }
}

fn search(
    options: &[&[Placement]],
    order: &[usize],
    depth: usize,
    mask: u32,
    chosen: &mut [Option<Placement>],
    failed: &mut HashSet<(u32, usize)>,
) -> bool {
    if depth == order.len() {
        return true;
    }
    if failed.contains(&(mask, depth)) {
        return false;
    }
    let item = order[depth];
    for p in options[item] {
        if p.mask() & mask != 0 {
            continue;
        }
        chosen[item] = Some(*p);
        if search(options, order, depth + 1, mask | p.mask(), chosen, failed) {
            return true;
        }
    }
    chosen[item] = None;
    failed.insert((mask, depth));
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::Catalog;

    fn model(key: &str) -> &'static GpuModel {
        Catalog::get().by_key(key).unwrap()
    }

    fn profiles<'a>(m: &'a GpuModel, names: &[&str]) -> Vec<&'a GiProfile> {
        names.iter().map(|n| m.gi_profile(n).unwrap()).collect()
    }

    /// What a naive implementation does: each profile, in the order given, at its first free
    /// legal placement.
    fn greedy(wanted: &[&GiProfile]) -> Option<Vec<Placement>> {
        let mut mask = 0;
        let mut out = Vec::new();
        for p in wanted {
            let pl = p.placements.iter().find(|pl| pl.mask() & mask == 0)?;
            mask |= pl.mask();
            out.push(*pl);
        }
        Some(out)
    }

    fn assert_valid(wanted: &[&GiProfile], fixed: &[Placement], got: &[Placement]) {
        assert_eq!(wanted.len(), got.len());
        let mut mask = fixed.iter().fold(0, |m, p| m | p.mask());
        for (p, pl) in wanted.iter().zip(got) {
            assert!(
                p.placements.contains(pl),
                "{pl:?} is not legal for {}",
                p.name
            );
            assert_eq!(pl.mask() & mask, 0, "{pl:?} overlaps");
            mask |= pl.mask();
        }
    }

    #[test]
    fn exact_search_finds_fits_greedy_misses() {
        let a100 = model("A100-SXM4-40GB");
        // 1g.5gb first at slice 0 blocks 4g.20gb, whose only placement starts at 0.
        let w = profiles(a100, &["1g.5gb", "4g.20gb"]);
        assert!(greedy(&w).is_none());
        assert_valid(&w, &[], &fit(a100, &w, &[]).unwrap());

        // The REV2 1g.10gb takes two memory slices at even starts; greedy puts two of them at
        // 0 and 2, which leaves 4g.20gb (only placement: slices 0-3) nowhere. Putting them at 4
        // and 6 fits all three.
        let w = profiles(a100, &["1g.10gb", "1g.10gb", "4g.20gb"]);
        assert!(greedy(&w).is_none(), "greedy should fail here");
        let got = fit(a100, &w, &[]).unwrap();
        assert_valid(&w, &[], &got);
        assert_eq!(got[2], Placement::new(0, 4));
    }

    #[test]
    fn exact_search_agrees_with_brute_force_on_all_small_mixes() {
        // Every multiset of up to 4 A100-40GB profiles: the search finds a fit exactly when
        // a brute force over all placement combinations does.
        let a100 = model("A100-SXM4-40GB");
        let all: Vec<&GiProfile> = a100.gi_profiles.iter().collect();
        fn brute(w: &[&GiProfile], mask: u32) -> bool {
            match w.split_first() {
                None => true,
                Some((p, rest)) => p
                    .placements
                    .iter()
                    .any(|pl| pl.mask() & mask == 0 && brute(rest, mask | pl.mask())),
            }
        }
        let n = all.len();
        let mut checked = 0;
        for a in 0..n {
            for b in a..n {
                for c in b..n {
                    for d in c..n {
                        let w = vec![all[a], all[b], all[c], all[d]];
                        let got = place(
                            &w.iter()
                                .map(|p| p.placements.as_slice())
                                .collect::<Vec<_>>(),
                            0,
                        );
                        assert_eq!(
                            got.is_some(),
                            brute(&w, 0),
                            "{:?}",
                            summarize(w.iter().map(|p| p.name.as_str()))
                        );
                        if let Some(g) = got {
                            assert_valid(&w, &[], &g);
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 100);
    }

    #[test]
    fn misfits_are_explained() {
        let h100 = model("H100-SXM5-80GB");
        let e = fit(h100, &profiles(h100, &["3g.40gb"; 3]), &[]).unwrap_err();
        assert_eq!(e.to_string(), "3g.40gb x3 needs 12 of 8 memory slices");

        let e = fit(h100, &profiles(h100, &["1g.10gb"; 8]), &[]).unwrap_err();
        assert_eq!(e.to_string(), "1g.10gb x8 needs 8 of 7 compute slices");

        let e = fit(h100, &profiles(h100, &["1g.20gb"; 5]), &[]).unwrap_err();
        assert!(matches!(e, Misfit::MemorySlices { needed: 10, .. }), "{e}");

        let e = fit(h100, &profiles(h100, &["1g.10gb+me", "1g.10gb+me"]), &[]).unwrap_err();
        assert!(matches!(e, Misfit::ProfileCount { max: 1, .. }), "{e}");

        // 4g.40gb only starts at 0; a kept 1g.10gb there leaves no room even though 4 + 1 ≤ 8.
        let kept = h100.gi_profile("1g.10gb").unwrap();
        let e = fit(
            h100,
            &profiles(h100, &["4g.40gb"]),
            &[(kept.id, Placement::new(0, 1))],
        )
        .unwrap_err();
        assert!(matches!(e, Misfit::NoPlacement { .. }), "{e}");
        assert!(e.to_string().contains("around the kept 1g.10gb"), "{e}");
    }

    #[test]
    fn places_around_kept_instances() {
        let h100 = model("H100-SXM5-80GB");
        let kept_3g = h100.gi_profile("3g.40gb").unwrap();
        let fixed = [(kept_3g.id, Placement::new(0, 4))];
        let w = profiles(h100, &["1g.10gb", "2g.20gb"]);
        let got = fit(h100, &w, &fixed).unwrap();
        assert_valid(&w, &[fixed[0].1], &got);
        // A second 3g.40gb can only go at 4..8 now.
        let got = fit(h100, &profiles(h100, &["3g.40gb"]), &fixed).unwrap();
        assert_eq!(got, vec![Placement::new(4, 4)]);
        // Overlapping kept instances are an input error, not a silent success.
        let e = fit(
            h100,
            &[],
            &[
                (kept_3g.id, Placement::new(0, 4)),
                (kept_3g.id, Placement::new(2, 4)),
            ],
        )
        .unwrap_err();
        assert!(matches!(e, Misfit::FixedOverlap { .. }));
    }

    #[test]
    fn seven_instances_fill_an_h100() {
        let h100 = model("H100-SXM5-80GB");
        let w = profiles(h100, &["1g.10gb"; 7]);
        let got = fit(h100, &w, &[]).unwrap();
        assert_valid(&w, &[], &got);
        let w = profiles(h100, &["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]);
        assert_valid(&w, &[], &fit(h100, &w, &[]).unwrap());
    }

    #[test]
    fn compute_splits() {
        let h100 = model("H100-SXM5-80GB");
        let gi = h100.gi_profile("3g.40gb").unwrap();
        let c1 = h100.ci_profile("3g.40gb", "1c").unwrap();
        let c2 = h100.ci_profile("3g.40gb", "2c").unwrap();
        assert!(fit_compute(gi, &[c1, c1, c1]).is_ok());
        let e = fit_compute(gi, &[c2, c2]).unwrap_err();
        assert!(e.to_string().contains("needs 4 of 3 compute slices"), "{e}");
        // 2c has a single placement (slices 0-1): the 1c listed first must take slice 2, and the
        // result keeps the order of `wanted`.
        assert_eq!(c2.placements, vec![Placement::new(0, 2)]);
        assert_eq!(
            fit_compute(gi, &[c1, c2]).unwrap(),
            vec![Placement::new(2, 1), Placement::new(0, 2)]
        );
    }

    #[test]
    fn order_of_wanted_does_not_matter() {
        // 3g.40gb may start at 0 or 4, 4g.40gb only at 0: first-fit in the given order would put
        // the 3g at 0 and strand the 4g. Results come back in the order asked.
        let h100 = model("H100-SXM5-80GB");
        let w = profiles(h100, &["3g.40gb", "4g.40gb"]);
        assert!(greedy(&w).is_none());
        assert_eq!(
            fit(h100, &w, &[]).unwrap(),
            vec![Placement::new(4, 4), Placement::new(0, 4)]
        );
        // Seven 1g fill the 7 compute slices; an eighth has a free memory slice but no compute.
        assert!(fit(h100, &profiles(h100, &["1g.10gb"; 7]), &[]).is_ok());
        assert!(fit(h100, &profiles(h100, &["1g.10gb"; 8]), &[]).is_err());
    }

    #[test]
    fn kept_instances_over_a_limit_only_block_adding_to_it() {
        // A host may hold more of a profile than the policy would create (made by hand, or the
        // limit counts differently on another driver): that alone must not make every new
        // instance of another profile misfit.
        let h100 = model("H100-SXM5-80GB");
        let me = h100.gi_profile("1g.10gb+me").unwrap();
        assert_eq!(me.instance_count, 1);
        let fixed = [(me.id, Placement::new(5, 1)), (me.id, Placement::new(6, 1))];
        assert_eq!(
            fit(h100, &profiles(h100, &["3g.40gb"]), &fixed).unwrap(),
            vec![Placement::new(0, 4)]
        );
        let e = fit(h100, &[me], &fixed).unwrap_err();
        assert!(
            matches!(
                e,
                Misfit::ProfileCount {
                    wanted: 3,
                    max: 1,
                    ..
                }
            ),
            "{e}"
        );
    }
}
