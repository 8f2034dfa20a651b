//! The fence outside the team shares and the withdrawals (issue 31), on the simulated host:
//! no order of policy changes leaves a device open to two teams unless the policy shares it,
//! at any point of a plan's execution; the fence of `user.slice`/`machine.slice` converges and
//! names who holds a GPU there when it closes.

mod common;

use common::{apply, assign, policy, team};
use gpuctl::observe::{GpuProcess, Major, SliceSpec};
use gpuctl::plan::{plan, ActionKind, Phase};
use gpuctl::policy::{GpuUse, LendRule, LendTo, Outside, Policy, Reconfigure, Selector, TeamName};
use gpuctl::sim::SimHost;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const TEAMS: [&str; 3] = ["a", "b", "c"];

/// One GPU's use: 0 none, 1-3 owned by a/b/c, 4-7 shared by {a,b}, {b,c}, {a,c}, {a,b,c}; 8
/// `mig = []` (MIG on, no instances: no team).
fn use_of(k: u8) -> Option<Vec<&'static str>> {
    match k {
        0 | 8 => None,
        1..=3 => Some(vec![TEAMS[k as usize - 1]]),
        4 => Some(vec!["a", "b"]),
        5 => Some(vec!["b", "c"]),
        6 => Some(vec!["a", "c"]),
        7 => Some(vec!["a", "b", "c"]),
        _ => unreachable!("no use {k}"),
    }
}

/// A policy from GPU uses and which unnamed teams stay in it.
fn make(uses: &[u8], keep: &[bool]) -> Policy {
    let mut names: BTreeSet<&str> = BTreeSet::new();
    let mut gpus = Vec::new();
    for (i, k) in uses.iter().enumerate() {
        if *k == 8 {
            let u = GpuUse::Mig(vec![]);
            gpus.push(assign(Selector::Index(vec![i as u32]), u));
        } else if let Some(ts) = use_of(*k) {
            names.extend(&ts);
            let u = if ts.len() == 1 {
                GpuUse::Owned(ts[0].parse().unwrap())
            } else {
                GpuUse::Shared(ts.iter().map(|t| t.parse().unwrap()).collect())
            };
            gpus.push(assign(Selector::Index(vec![i as u32]), u));
        }
    }
    for (t, k) in TEAMS.iter().zip(keep) {
        if *k {
            names.insert(t);
        }
    }
    policy(
        names.into_iter().map(team).collect(),
        gpus,
        Reconfigure::WhenIdle,
    )
}

/// Who may open `/dev/nvidiaN` by the policy.
fn sharers(p: &Policy, uses: &[u8]) -> BTreeMap<String, BTreeSet<String>> {
    let _ = p;
    uses.iter()
        .enumerate()
        .map(|(i, k)| {
            let ts = use_of(*k).unwrap_or_default();
            (
                format!("/dev/nvidia{i}"),
                ts.iter().map(|t| t.to_string()).collect(),
            )
        })
        .collect()
}

/// Walk the plan's slice actions in order from the observed slices, checking after each that a
/// GPU node allowed to several teams is shared by them in the old or the new policy.
fn check_every_step(
    slices: &BTreeMap<TeamName, SliceSpec>,
    p: &gpuctl::plan::Plan,
    old: &BTreeMap<String, BTreeSet<String>>,
    new: &BTreeMap<String, BTreeSet<String>>,
) -> Result<(), TestCaseError> {
    let mut live: BTreeMap<String, BTreeSet<String>> = slices
        .iter()
        .map(|(t, s)| (t.to_string(), s.device_allow.clone()))
        .collect();
    let check = |live: &BTreeMap<String, BTreeSet<String>>, step: &str| {
        for (node, ok_old) in old {
            let holders: BTreeSet<String> = live
                .iter()
                .filter(|(_, d)| d.contains(node))
                .map(|(t, _)| t.clone())
                .collect();
            if holders.len() > 1 {
                let ok_new = &new[node];
                prop_assert!(
                    holders.is_subset(ok_old) || holders.is_subset(ok_new),
                    "after {step}: {node} open to {holders:?} (old policy: {ok_old:?}, new: {ok_new:?})"
                );
            }
        }
        Ok(())
    };
    check(&live, "the start")?;
    for a in &p.actions {
        match &a.kind {
            ActionKind::SetSlice { team, spec } => {
                live.insert(team.to_string(), spec.device_allow.clone());
            }
            ActionKind::RemoveSlice { team } => {
                live.remove(&team.to_string());
            }
            _ => continue,
        }
        check(&live, &format!("[{}] {}", a.phase, a.kind))?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn no_sequence_of_policy_changes_opens_a_gpu_to_two_teams(
        steps in prop::collection::vec(
            (prop::collection::vec(0u8..9, 4), prop::collection::vec(any::<bool>(), 3)),
            1..6,
        )
    ) {
        let mut host = SimHost::from_spec("h100-80gb*4").unwrap();
        let mut old = sharers(&make(&[0; 4], &[false; 3]), &[0; 4]);
        for (uses, keep) in &steps {
            let p = make(uses, keep);
            let new = sharers(&p, uses);
            let first = plan(&p, &host.state);
            check_every_step(&host.state.slices, &first, &old, &new)?;
            // Withdrawals run before any grant.
            let first_grant = first.actions.iter().position(|a| a.phase == Phase::Slices);
            let last_withdraw = first.actions.iter().rposition(|a| a.phase == Phase::Fence);
            if let (Some(g), Some(w)) = (first_grant, last_withdraw) {
                prop_assert!(w < g);
            }
            let (_, remaining) = apply(&p, &mut host);
            prop_assert!(remaining.is_converged(), "{remaining:#?}");
            // Converged: each node is open exactly to the teams the policy gives it.
            for (node, ts) in &new {
                let got: BTreeSet<String> = host.state.slices.iter()
                    .filter(|(_, s)| s.device_allow.contains(node))
                    .map(|(t, _)| t.to_string())
                    .collect();
                prop_assert_eq!(&got, ts, "{}", node);
            }
            old = new;
        }
    }
}

fn majors() -> Vec<Major> {
    [
        (false, 1, "mem"),
        (false, 10, "misc"),
        (false, 136, "pts"),
        (false, 195, "nvidia-frontend"),
        (false, 226, "drm"),
        (false, 510, "nvidia-uvm"),
        (true, 8, "sd"),
    ]
    .map(|(block, number, name)| Major {
        block,
        number,
        name: name.into(),
    })
    .into()
}

#[test]
fn the_fence_converges_follows_new_majors_and_opens_again() {
    let mut host = SimHost::from_spec("h100-80gb*2").unwrap();
    host.state.majors = Some(majors());
    let p = make(&[1, 2], &[true; 3]);
    assert_eq!(p.host.outside, Outside::Closed);
    let (first, remaining) = apply(&p, &mut host);
    assert!(remaining.is_converged(), "{remaining:#?}");
    let fences: Vec<_> = first
        .actions
        .iter()
        .filter(|a| matches!(a.kind, ActionKind::SetFence { .. }))
        .collect();
    assert_eq!(fences.len(), 2);
    assert!(fences.iter().all(|a| a.phase == Phase::Fence));
    let user = &host.state.fences["user.slice"];
    assert_eq!(user.policy, "closed");
    let want: BTreeSet<String> = ["char-mem", "char-misc", "char-pts", "char-drm", "block-sd"]
        .map(String::from)
        .into();
    assert_eq!(user.allow, want);

    // A module registers a major: the next plan sets both fences again, and only them.
    host.state.majors.as_mut().unwrap().push(Major {
        block: false,
        number: 241,
        name: "ppp".into(),
    });
    let again = plan(&p, &host.state);
    assert_eq!(again.actions.len(), 2, "{again:#?}");
    assert!(
        again.actions[0].reason.contains("+char-ppp"),
        "{}",
        again.actions[0].reason
    );
    apply(&p, &mut host);

    // The NVIDIA driver reloaded under other dynamic majors: nothing to do.
    for m in host.state.majors.as_mut().unwrap() {
        if m.name == "nvidia-uvm" {
            m.number = 509;
        }
    }
    assert!(plan(&p, &host.state).is_converged());

    // outside = "open": both slices back to systemd's default; closing again names the holder.
    let mut open = p.clone();
    open.host.outside = Outside::Open;
    let (_, remaining) = apply(&open, &mut host);
    assert!(remaining.is_converged());
    assert!(host.state.fences.values().all(|f| f.is_open()));
    host.state.gpus[1].processes.push(GpuProcess {
        pid: 4242,
        used_memory: 1 << 20,
        unit: Some("session-3.scope".into()),
        cgroup: Some("/user.slice/user-1000.slice/session-3.scope".into()),
    });
    let close = plan(&p, &host.state);
    let user = close
        .actions
        .iter()
        .find(|a| matches!(&a.kind, ActionKind::SetFence { slice, .. } if slice == "user.slice"))
        .unwrap();
    assert!(
        user.reason.contains("pid 4242 (session-3.scope)"),
        "{}",
        user.reason
    );
    let machine = close
        .actions
        .iter()
        .find(|a| matches!(&a.kind, ActionKind::SetFence { slice, .. } if slice == "machine.slice"))
        .unwrap();
    assert!(!machine.reason.contains("4242"), "{}", machine.reason);
}

#[test]
fn without_majors_no_fence_is_planned_but_open_is() {
    let mut host = SimHost::from_spec("h100-80gb*1").unwrap();
    let p = make(&[1], &[true; 3]);
    assert!(plan(&p, &host.state)
        .actions
        .iter()
        .all(|a| !matches!(a.kind, ActionKind::SetFence { .. })));
    apply(&p, &mut host);
    assert!(host.state.fences.is_empty());
}

#[test]
fn a_removed_teams_slice_loses_its_devices_before_another_gets_them() {
    let mut host = SimHost::from_spec("h100-80gb*1").unwrap();
    apply(&make(&[1], &[false; 3]), &mut host);
    // Team a leaves; b gets the GPU. A task still runs in a's slice on the real host: the
    // withdrawal is its own action, not the removal.
    let p = make(&[2], &[false; 3]);
    let pl = plan(&p, &host.state);
    let kinds = action_kinds(&pl);
    let w = at(&kinds, "[fence] set gpu-a.slice");
    let g = at(&kinds, "[slices] set gpu-b.slice");
    let r = at(&kinds, "[slices] remove gpu-a.slice");
    assert!(w < g && w < r, "{kinds:#?}");
    match &pl.actions[w].kind {
        ActionKind::SetSlice { spec, .. } => assert!(spec.device_allow.is_empty()),
        k => panic!("{k:?}"),
    }
    assert!(pl.actions[w].reason.contains("no longer in the policy"));
}

/// A plan's actions as `[phase] kind`, in order.
fn action_kinds(pl: &gpuctl::plan::Plan) -> Vec<String> {
    pl.actions
        .iter()
        .map(|a| format!("[{}] {}", a.phase, a.kind))
        .collect()
}

/// Where action `k` stands in `kinds`.
fn at(kinds: &[String], k: &str) -> usize {
    kinds
        .iter()
        .position(|x| x == k)
        .unwrap_or_else(|| panic!("no {k}: {kinds:#?}"))
}

/// Train owns GPU 1 and (with `lends`) lends it to interns, who own GPU 0.
fn lending(lends: bool) -> Policy {
    let mut train = team("train");
    train.lend = lends.then(|| LendRule {
        to: LendTo::Teams(vec!["interns".parse().unwrap()]),
        after: Duration::from_secs(1),
        grace: Duration::from_secs(5),
        when: vec![],
    });
    policy(
        vec![train, team("interns")],
        vec![owned(1, "train"), owned(0, "interns")],
        Reconfigure::WhenIdle,
    )
}

fn owned(gpu: u32, t: &str) -> gpuctl::policy::GpuAssignment {
    assign(
        Selector::Index(vec![gpu]),
        GpuUse::Owned(t.parse().unwrap()),
    )
}

#[test]
fn the_loans_slice_allows_the_lent_devices_and_loses_them_before_anyone_gains_them() {
    let loans: TeamName = "loans".parse().unwrap();
    let mut host = SimHost::from_spec("h100-80gb*2").unwrap();
    let p = lending(true);
    let (_, rest) = apply(&p, &mut host);
    assert!(rest.actions.is_empty(), "{:#?}", rest.actions);
    let allow = &host.state.slices[&loans].device_allow;
    assert!(allow.contains("/dev/nvidia1"), "{allow:?}");
    assert!(
        !allow.contains("/dev/nvidia0"),
        "the borrower's own device: {allow:?}"
    );
    // The fence does not take the lent devices back at the next reconcile: nothing to do.
    let again = plan(&p, &host.state);
    assert!(again.actions.is_empty(), "{:#?}", again.actions);

    // Train gives GPU 1 up to interns (and keeps GPU 0): the loans slice follows, withdrawn
    // in the fence phase, before interns' slice is granted it.
    let p = Policy {
        gpus: vec![owned(0, "train"), owned(1, "interns")],
        ..p
    };
    let pl = plan(&p, &host.state);
    let kinds = action_kinds(&pl);
    let w = at(&kinds, "[fence] set gpu-loans.slice");
    let g = at(&kinds, "[slices] set gpu-interns.slice");
    assert!(w < g, "{kinds:#?}");
    let (_, rest) = apply(&p, &mut host);
    assert!(rest.actions.is_empty(), "{:#?}", rest.actions);
    let allow = &host.state.slices[&loans].device_allow;
    assert!(
        allow.contains("/dev/nvidia0") && !allow.contains("/dev/nvidia1"),
        "{allow:?}"
    );

    // Nobody lends any more: the slice loses its devices first, then goes.
    let p = Policy {
        teams: lending(false).teams,
        ..p
    };
    let (first, rest) = apply(&p, &mut host);
    assert!(rest.actions.is_empty(), "{:#?}", rest.actions);
    let kinds = action_kinds(&first);
    assert!(
        kinds.contains(&"[fence] set gpu-loans.slice".to_string()),
        "{kinds:#?}"
    );
    assert!(!host.state.slices.contains_key(&loans), "{kinds:#?}");
}

#[test]
fn a_lender_that_stops_lending_does_not_fence_off_a_running_borrower() {
    let loans: TeamName = "loans".parse().unwrap();
    let mut host = SimHost::from_spec("h100-80gb*2").unwrap();
    let (_, rest) = apply(&lending(true), &mut host);
    assert!(rest.actions.is_empty(), "{:#?}", rest.actions);
    // An interns job borrows train's GPU 1 and runs on it.
    host.state.gpus[1].processes.push(GpuProcess {
        pid: 4242,
        used_memory: 1 << 30,
        unit: Some("gpuctl-run-0123456789abcdef.scope".into()),
        cgroup: Some("/gpu.slice/gpu-loans.slice/gpuctl-run-0123456789abcdef.scope".into()),
    });
    // Train stops lending: the borrower gets its notice and grace from gpuctld; the fence
    // keeps the device open in the loans slice meanwhile, and a second plan has nothing to do.
    let (_, rest) = apply(&lending(false), &mut host);
    assert!(rest.actions.is_empty(), "{:#?}", rest.actions);
    let allow = &host.state.slices[&loans].device_allow;
    assert!(allow.contains("/dev/nvidia1"), "{allow:?}");
    assert!(!allow.contains("/dev/nvidia0"), "{allow:?}");
    // The borrower is gone: so is the slice.
    host.state.gpus[1].processes.clear();
    let (_, rest) = apply(&lending(false), &mut host);
    assert!(rest.actions.is_empty(), "{:#?}", rest.actions);
    assert!(!host.state.slices.contains_key(&loans));
}
