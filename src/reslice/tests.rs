use super::*;
use crate::policy::{MigSpec, Window};
use crate::profiles::Catalog;
use proptest::prelude::*;

const MIN: u64 = 60_000;
const NOW: u64 = 1_000_000 * MIN;

fn h100() -> &'static GpuModel {
    Catalog::get().by_sim_name("h100-80gb").unwrap()
}

fn team(t: &str) -> TeamName {
    t.parse().unwrap()
}

fn mig(name: &str, specs: &[(&str, &str, u32)], when: &[&str]) -> Layout {
    Layout {
        name: name.into(),
        usage: GpuUse::Mig(
            specs
                .iter()
                .map(|(p, o, n)| MigSpec {
                    profile: p.to_string(),
                    owner: team(o),
                    count: *n,
                    compute: vec![],
                })
                .collect(),
        ),
        when: when.iter().map(|w| Window::parse(w).unwrap()).collect(),
    }
}

fn day() -> Layout {
    mig("default", &[("1g.10gb", "interns", 7)], &[])
}

fn night(when: &[&str]) -> Layout {
    mig("night", &[("3g.40gb", "train", 2)], when)
}

fn whole(name: &str, t: &str) -> Layout {
    Layout {
        name: name.into(),
        usage: GpuUse::Owned(team(t)),
        when: vec![],
    }
}

/// The devices of `l` at the placements the search gives, each idle since `idle_since`.
fn carved(l: &Layout, idle_since: Option<u64>) -> Vec<Held> {
    let g = Gpu {
        index: 0,
        model: h100(),
        allowed: vec![],
        now: vec![],
        last_switch_ms: None,
        after: Duration::ZERO,
        hold: Duration::ZERO,
    };
    fewest(&g, l, |_| false)
        .unwrap()
        .create
        .into_iter()
        .map(|unit| Held {
            unit,
            idle_since_ms: idle_since,
        })
        .collect()
}

fn gpu(index: u32, allowed: Vec<Layout>, now: Vec<Held>) -> Gpu {
    Gpu {
        index,
        model: h100(),
        allowed,
        now,
        last_switch_ms: None,
        after: Duration::from_secs(600),
        hold: Duration::from_secs(1800),
    }
}

fn waiter(ticket: u64, t: &str, profile: Option<&str>) -> Waiter {
    Waiter {
        ticket,
        team: team(t),
        profile: profile.map(str::to_string),
    }
}

fn snap(gpus: Vec<Gpu>, waiting: Vec<Waiter>) -> Snapshot {
    Snapshot {
        gpus,
        waiting,
        now_ms: NOW,
        // A Wednesday noon.
        local: LocalTime {
            weekday: 2,
            minute_of_day: 720,
        },
    }
}

/// GPU 1 of the issue: seven interns slices, three of them busy (at slices 0, 1, 2).
fn issue_gpu(busy: usize) -> Gpu {
    let mut now = carved(&day(), Some(NOW - 60 * MIN));
    now.sort_by_key(|h| match &h.unit {
        Unit::Mig { placement, .. } => placement.start,
        Unit::Whole { .. } => 0,
    });
    for h in now.iter_mut().take(busy) {
        h.idle_since_ms = None;
    }
    gpu(1, vec![day(), night(&[])], now)
}

#[test]
fn train_waits_while_the_interns_slices_in_the_way_are_busy_then_gpu_1_re_slices() {
    let train = waiter(1, "train", Some("3g.40gb"));
    let busy = snap(vec![issue_gpu(3)], vec![train.clone()]);
    assert_eq!(choose(&busy), vec![], "busy 1g slices are in the way");

    let done = snap(vec![issue_gpu(0)], vec![train.clone()]);
    let sw = choose(&done);
    assert_eq!(sw.len(), 1, "{sw:?}");
    let sw = &sw[0];
    assert_eq!((sw.gpu, sw.to.as_str()), (1, "night"));
    assert_eq!(sw.from.as_deref(), Some("default"));
    assert_eq!((sw.destroy.len(), sw.create.len()), (7, 2));
    assert_eq!(sw.cause, Cause::Waiting(train));
    assert!(
        sw.reason.starts_with(
            "GPU 1 re-sliced to night (3g.40gb x2) for train's waiting 3g.40gb request"
        ),
        "{}",
        sw.reason
    );
}

#[test]
fn slices_idle_for_less_than_after_are_still_in_the_way() {
    let mut g = issue_gpu(0);
    g.now[0].idle_since_ms = Some(NOW - 5 * MIN);
    let s = snap(vec![g], vec![waiter(1, "train", Some("3g.40gb"))]);
    assert_eq!(choose(&s), vec![]);
}

#[test]
fn an_interns_job_goes_to_gpu_0s_free_slice_and_nothing_re_slices() {
    let gpu0 = gpu(0, vec![day()], carved(&day(), Some(NOW - 60 * MIN)));
    let s = snap(
        vec![gpu0, issue_gpu(0)],
        vec![waiter(1, "interns", Some("1g.10gb"))],
    );
    assert_eq!(choose(&s), vec![]);
}

#[test]
fn the_fewest_changes_win_and_busy_instances_stay_where_they_are() {
    // Allowed: 7 x 1g for interns, or one 3g for train beside four 1g for interns.
    let mixed = mig(
        "mixed",
        &[("3g.40gb", "train", 1), ("1g.10gb", "interns", 4)],
        &[],
    );
    let s = snap(
        vec![gpu(1, vec![day(), night(&[]), mixed], issue_gpu(3).now)],
        vec![waiter(1, "train", Some("3g.40gb"))],
    );
    let sw = choose(&s);
    assert_eq!(sw.len(), 1, "{sw:?}");
    assert_eq!(sw[0].to, "mixed");
    assert_eq!((sw[0].destroy.len(), sw[0].create.len()), (3, 1));
    assert!(sw[0].destroy.iter().all(|u| matches!(u,
        Unit::Mig { placement, .. } if placement.start >= 3)));
}

#[test]
fn the_calendar_switches_only_when_nothing_waits_for_the_current_layout() {
    let idle = carved(&day(), Some(NOW - 60 * MIN));
    let g = || {
        gpu(
            1,
            vec![day(), night(&["Mon..Fri 20:00..08:00"])],
            idle.clone(),
        )
    };
    let mut at_night = snap(vec![g()], vec![]);
    at_night.local.minute_of_day = 22 * 60;
    let sw = choose(&at_night);
    assert_eq!(sw.len(), 1);
    assert_eq!(
        (sw[0].to.as_str(), &sw[0].cause),
        ("night", &Cause::Calendar)
    );

    // An interns request waits: the slices it may use stay, though they are idle.
    let mut waiting = at_night.clone();
    waiting.waiting = vec![waiter(1, "interns", Some("1g.10gb"))];
    assert_eq!(choose(&waiting), vec![]);

    let noon = snap(vec![g()], vec![]);
    assert_eq!(choose(&noon), vec![], "the default is the noon preference");
}

#[test]
fn a_whole_gpu_layout_serves_a_team_whose_share_is_all_busy() {
    let s = snap(
        vec![gpu(
            1,
            vec![day(), whole("train-whole", "train")],
            carved(&day(), Some(NOW - 60 * MIN)),
        )],
        vec![waiter(1, "train", None)],
    );
    let sw = choose(&s);
    assert_eq!(sw.len(), 1);
    assert_eq!(sw[0].to, "train-whole");
}

#[test]
fn no_switch_within_the_hold_time() {
    let mut g = issue_gpu(0);
    g.last_switch_ms = Some(NOW - 29 * MIN);
    let s = snap(vec![g], vec![waiter(1, "train", Some("3g.40gb"))]);
    assert_eq!(choose(&s), vec![]);
}

// Properties over random hosts.

fn pool() -> Vec<Layout> {
    vec![
        day(),
        night(&["Mon..Fri 20:00..08:00"]),
        whole("whole", "train"),
        mig(
            "mixed",
            &[("3g.40gb", "train", 1), ("1g.10gb", "interns", 4)],
            &["Sat,Sun"],
        ),
        mig("empty", &[], &[]),
        Layout {
            name: "shared".into(),
            usage: GpuUse::Shared(vec![team("interns"), team("train")]),
            when: vec![],
        },
    ]
}

prop_compose! {
    fn arb_gpu(index: u32)(
        allowed in proptest::sample::subsequence((0..6).collect::<Vec<usize>>(), 1..=4),
        current in 0..6usize,
        keep in proptest::collection::vec(any::<bool>(), 8),
        idle in proptest::collection::vec(proptest::option::of(0..60u64), 8),
        last in proptest::option::of(0..90u64),
    ) -> Gpu {
        let pool = pool();
        let mut now: Vec<Held> = carved(&pool[current], None);
        let mut i = 0;
        now.retain(|_| { i += 1; keep[i - 1] || i == 1 });
        for (h, idle) in now.iter_mut().zip(&idle) {
            h.idle_since_ms = idle.map(|m| NOW - m * MIN);
        }
        let mut g = gpu(index, allowed.iter().map(|&i| pool[i].clone()).collect(), now);
        g.last_switch_ms = last.map(|m| NOW - m * MIN);
        g
    }
}

prop_compose! {
    fn arb_snapshot()(
        g0 in arb_gpu(0),
        g1 in arb_gpu(1),
        waiting in proptest::collection::vec(
            (0..3usize, proptest::option::of(0..3usize)), 0..4),
        weekday in 0..7u8,
        minute in 0..1440u16,
    ) -> Snapshot {
        let teams = ["interns", "train", "research"];
        let profiles = ["1g.10gb", "3g.40gb", "7g.80gb"];
        let waiting = waiting
            .iter()
            .enumerate()
            .map(|(i, (t, p))| waiter(i as u64, teams[*t], p.map(|p| profiles[p])))
            .collect();
        Snapshot {
            gpus: vec![g0, g1],
            waiting,
            now_ms: NOW,
            local: LocalTime { weekday, minute_of_day: minute },
        }
    }
}

/// The devices of a layout without their placements, sorted.
fn shape(units: &[Unit]) -> Vec<String> {
    let mut v: Vec<String> = units
        .iter()
        .map(|u| match u {
            Unit::Whole { teams } => format!("whole {teams:?}"),
            Unit::Mig {
                profile,
                owner,
                compute,
                ..
            } => format!("{profile} {owner} {compute:?}"),
        })
        .collect();
    v.sort();
    v
}

fn layout_units(l: &Layout) -> Vec<Unit> {
    carved(l, None).into_iter().map(|h| h.unit).collect()
}

/// The GPU after `sw`: its target's devices, all idle from now, switched now.
fn after_switch(g: &Gpu, sw: &Switch, now_ms: u64) -> Gpu {
    let mut g = g.clone();
    g.now = sw
        .keep
        .iter()
        .chain(&sw.create)
        .map(|u| Held {
            unit: u.clone(),
            idle_since_ms: Some(now_ms),
        })
        .collect();
    g.last_switch_ms = Some(now_ms);
    g
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn a_switch_never_touches_a_busy_or_recently_used_device(s in arb_snapshot()) {
        for sw in choose(&s) {
            let g = s.gpus.iter().find(|g| g.index == sw.gpu).unwrap();
            // Every device is either kept or destroyed, none twice.
            let all: Vec<Unit> = sw.keep.iter().chain(&sw.destroy).cloned().collect();
            let now: Vec<Unit> = g.now.iter().map(|h| h.unit.clone()).collect();
            prop_assert_eq!(shape(&all), shape(&now));
            // Busy, or idle for less than `after`: written out here, not `pinned`.
            let in_use = |h: &&Held| {
                h.idle_since_ms
                    .is_none_or(|t| s.now_ms - t < g.after.as_millis() as u64)
            };
            for h in g.now.iter().filter(in_use) {
                prop_assert!(sw.keep.contains(&h.unit), "{} destroys pinned {:?}", sw, h);
            }
        }
    }

    #[test]
    fn the_target_is_always_an_allowed_layout_placed_legally(s in arb_snapshot()) {
        for sw in choose(&s) {
            let g = s.gpus.iter().find(|g| g.index == sw.gpu).unwrap();
            let l = g.allowed.iter().find(|l| l.name == sw.to);
            prop_assert!(l.is_some(), "{} is not allowed", sw.to);
            let after: Vec<Unit> = sw.keep.iter().chain(&sw.create).cloned().collect();
            prop_assert_eq!(shape(&after), shape(&layout_units(l.unwrap())));
            let mut used = 0u32;
            for u in &after {
                if let Unit::Mig { profile, placement, .. } = u {
                    let legal = &g.model.gi_profile(profile).unwrap().placements;
                    prop_assert!(legal.contains(placement));
                    prop_assert_eq!(used & placement.mask(), 0, "overlap in {}", sw);
                    used |= placement.mask();
                }
            }
        }
    }

    #[test]
    fn a_switch_serves_a_waiting_request_or_the_calendar(s in arb_snapshot()) {
        for sw in choose(&s) {
            let g = s.gpus.iter().find(|g| g.index == sw.gpu).unwrap();
            prop_assert!(sw.changes() > 0);
            match &sw.cause {
                Cause::Waiting(w) => {
                    prop_assert!(s.waiting.contains(w));
                    prop_assert!(sw.create.iter().any(|u| u.serves(w)), "{}", sw);
                    let free_anywhere = s.gpus.iter().any(|g| g.now.iter()
                        .any(|h| h.idle_since_ms.is_some() && h.unit.serves(w)));
                    prop_assert!(!free_anywhere || s.waiting.len() > 1, "{}", sw);
                }
                Cause::Calendar => {
                    prop_assert_eq!(Some(sw.to.as_str()),
                        preferred(g, s.local).map(|l| l.name.as_str()));
                    prop_assert!(!s.waiting.iter()
                        .any(|w| g.now.iter().any(|h| h.unit.serves(w))));
                }
            }
        }
    }

    #[test]
    fn no_gpu_switches_again_within_its_hold_time(
        s in arb_snapshot(),
        later in 0..30u64,
        weekday in 0..7u8,
        minute in 0..1440u16,
    ) {
        for g in &s.gpus {
            if g.last_switch_ms.is_some_and(|t| s.now_ms - t < g.hold.as_millis() as u64) {
                prop_assert!(choose(&s).iter().all(|sw| sw.gpu != g.index));
            }
        }
        // Switch, then look again before the hold runs out, with any demand and calendar.
        let first = choose(&s);
        let mut next = s.clone();
        next.now_ms = s.now_ms + later * MIN;
        next.local = LocalTime { weekday, minute_of_day: minute };
        for sw in &first {
            let i = next.gpus.iter().position(|g| g.index == sw.gpu).unwrap();
            next.gpus[i] = after_switch(&s.gpus[i], sw, s.now_ms);
        }
        for sw in choose(&next) {
            prop_assert!(first.iter().all(|f| f.gpu != sw.gpu), "{} flapped", sw);
        }
    }
}
