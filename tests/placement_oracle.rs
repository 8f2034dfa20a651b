//! `placement::choose` against a reference written from the rules in its module header and
//! docs/shell.md ("Placement"), not from its code: every subset of the share that the rules
//! allow is enumerated and the least loaded one taken by the documented order, so a request the
//! reference can place must be placed, on exactly those devices, and a refusal must be the one
//! the rules give.

use gpuctl::placement::{choose, Candidate, Gpus, PlaceError, Request};
use proptest::prelude::*;

/// Jobs a device takes: `jobs-per-device` where set, else none for an MPS device (no cap), else
/// one.
fn cap(jobs_per_device: Option<u32>, c: &Candidate) -> Option<u32> {
    jobs_per_device.or(if c.mps { None } else { Some(1) })
}

/// Jobs on a device: its leases, plus one for a process outside every lease unless MPS
/// serves it (docs/shell.md, "Placement": such a process takes a job's place).
fn jobs(c: &Candidate) -> u32 {
    c.held + u32::from(c.outside.is_some() && !c.mps)
}

fn room(jobs_per_device: Option<u32>, c: &Candidate) -> bool {
    cap(jobs_per_device, c).is_none_or(|n| jobs(c) < n)
}

/// A device's place in the documented order: jobs on it, memory held, activity in millionths,
/// position in the share.
type Load = (u32, u64, u64, usize);

/// The documented order among free devices: fewest leases, least memory held, least activity
/// (unknown counts as none), then the share's order.
fn load(share: &[Candidate], i: usize) -> Load {
    let c = &share[i];
    let activity = (c.activity.unwrap_or(0.0) * 1e6) as u64;
    (jobs(c), c.memory_used.unwrap_or(0), activity, i)
}

/// `--device`: a device's UUID, or its position in the share written in decimal digits.
fn named(share: &[Candidate], asked: &str) -> Option<usize> {
    if let Some(i) = share.iter().position(|c| c.id == asked) {
        return Some(i);
    }
    if !asked.is_empty() && asked.bytes().all(|b| b.is_ascii_digit()) {
        return asked.parse::<usize>().ok().filter(|i| *i < share.len());
    }
    None
}

/// What the rules say `choose` answers.
fn reference(
    share: &[Candidate],
    req: &Request,
    default: Option<Gpus>,
    jpd: Option<u32>,
) -> Result<Vec<usize>, PlaceError> {
    let want = req.gpus.or(default).unwrap_or(Gpus::Count(1));
    if let Some(asked) = &req.device {
        // A named device is one device; an explicit count of more contradicts it.
        if let Some(g) = req.gpus.filter(|g| *g != Gpus::Count(1)) {
            return Err(PlaceError::DeviceAndCount(g));
        }
        let Some(i) = named(share, asked) else {
            return Err(PlaceError::NotInShare {
                asked: asked.clone(),
                share: share.iter().map(|c| c.id.clone()).collect(),
            });
        };
        return if room(jpd, &share[i]) {
            Ok(vec![i])
        } else {
            Err(PlaceError::Busy {
                want: 1,
                full: vec![i],
            })
        };
    }
    if share.is_empty() {
        return Err(PlaceError::Empty);
    }
    let whole: Vec<usize> = (0..share.len()).filter(|&i| !share[i].mig).collect();
    // How many, and from which devices: one MIG device per process, so more than one device
    // is whole GPUs only; "all" is every device of the share (a share of one: that one).
    let (n, pool): (usize, Vec<usize>) = match want {
        Gpus::Count(1) => (1, (0..share.len()).collect()),
        Gpus::All if share.len() == 1 => (1, vec![0]),
        Gpus::All if whole.len() < share.len() => {
            return Err(PlaceError::OneMigDevice {
                want,
                whole: whole.len(),
            })
        }
        Gpus::All => (share.len(), whole),
        Gpus::Count(_) if whole.is_empty() => {
            return Err(PlaceError::OneMigDevice { want, whole: 0 })
        }
        Gpus::Count(k) if k as usize > whole.len() => {
            return Err(PlaceError::TooMany {
                want: k,
                have: whole.len(),
            })
        }
        Gpus::Count(k) => (k as usize, whole),
    };
    // Every subset of n devices of the pool with room, the least loaded by the documented
    // order (its members' loads, smallest first, compared in turn).
    let mut best: Option<(Vec<Load>, Vec<usize>)> = None;
    for mask in 0u32..(1 << pool.len()) {
        let set: Vec<usize> = (0..pool.len())
            .filter(|b| mask & (1 << b) != 0)
            .map(|b| pool[b])
            .collect();
        if set.len() != n || !set.iter().all(|&i| room(jpd, &share[i])) {
            continue;
        }
        let mut loads: Vec<_> = set.iter().map(|&i| load(share, i)).collect();
        loads.sort();
        if best.as_ref().is_none_or(|(b, _)| loads < *b) {
            best = Some((loads, set));
        }
    }
    match best {
        // In the share's order: the job's CUDA index 0 is the first of its devices.
        Some((_, set)) => Ok(set),
        None => Err(PlaceError::Busy {
            want: n,
            full: pool
                .into_iter()
                .filter(|&i| !room(jpd, &share[i]))
                .collect(),
        }),
    }
}

fn arb_share() -> impl Strategy<Value = Vec<Candidate>> {
    prop::collection::vec(
        (
            prop::bool::weighted(0.4),
            prop::bool::weighted(0.3),
            0u32..3,
            prop::option::of(0u64..4),
            prop::option::of(0u32..4),
            prop::bool::weighted(0.2),
        ),
        0..8,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (mig, mps, held, mem, act, outside))| Candidate {
                id: format!("{}-{i}", if mig { "MIG" } else { "GPU" }),
                mig,
                mps,
                held,
                memory_used: mem,
                activity: act.map(|a| f64::from(a) / 4.0),
                outside: outside.then(|| format!("pid {i} (python)")),
                profile: None,
            })
            .collect()
    })
}

fn arb_gpus() -> impl Strategy<Value = Option<Gpus>> {
    prop_oneof![
        3 => Just(None),
        3 => (1u32..5).prop_map(|n| Some(Gpus::Count(n))),
        1 => Just(Some(Gpus::All)),
    ]
}

/// `--device`: a position, a UUID of the share (by position), or something that names none.
fn arb_device() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => Just(None),
        1 => (0usize..9).prop_map(|i| Some(i.to_string())),
        1 => (0usize..8).prop_map(|i| Some(format!("uuid:{i}"))),
        1 => prop::sample::select(vec!["+0", "-1", "GPU-x", "", "01"])
            .prop_map(|s| Some(s.to_string())),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]
    #[test]
    fn choose_answers_what_the_rules_say(
        share in arb_share(),
        gpus in arb_gpus(),
        default in arb_gpus(),
        device in arb_device(),
        jpd in prop::option::of(1u32..3),
    ) {
        // `uuid:K` stands for the UUID of the share's K-th device (where there is one).
        let device = device.map(|d| match d.strip_prefix("uuid:") {
            Some(k) => share
                .get(k.parse::<usize>().unwrap())
                .map_or_else(|| "MIG-none".to_string(), |c| c.id.clone()),
            None => d,
        });
        let req = Request { gpus, device, profile: None };
        let want = reference(&share, &req, default, jpd);
        let got = choose(&share, &req, default, jpd);
        prop_assert_eq!(&got, &want, "share {:?}", share);
        // Stable: the same input gives the same answer.
        prop_assert_eq!(choose(&share, &req, default, jpd), got);
    }
}

fn gpu(i: usize, held: u32, memory: u64, activity: f64) -> Candidate {
    Candidate {
        id: format!("GPU-{i}"),
        mig: false,
        mps: false,
        held,
        memory_used: Some(memory),
        activity: Some(activity),
        outside: None,
        profile: None,
    }
}

/// The reference itself, on cases worked out by hand from the rules, so that a wrong reference
/// cannot agree with a wrong `choose`.
#[test]
fn the_reference_gives_the_hand_worked_answers() {
    // Free first (GPU-1 is held to capacity), then memory (GPU-3 < GPU-0 = GPU-2), then
    // activity (GPU-2 < GPU-0).
    let share = vec![
        gpu(0, 0, 5, 0.5),
        gpu(1, 1, 0, 0.0),
        gpu(2, 0, 5, 0.25),
        gpu(3, 0, 1, 0.75),
    ];
    let two = Request {
        gpus: Some(Gpus::Count(2)),
        device: None,
        profile: None,
    };
    assert_eq!(reference(&share, &two, None, None), Ok(vec![2, 3]));
    assert_eq!(
        reference(&share, &Request::default(), None, None),
        Ok(vec![3])
    );
    // Two jobs per device: GPU-1 has room again but holds a lease, so it comes last.
    assert_eq!(
        reference(&share, &Request::default(), Some(Gpus::Count(3)), Some(2)),
        Ok(vec![0, 2, 3])
    );
    assert_eq!(
        reference(&share, &Request::default(), Some(Gpus::All), None),
        Err(PlaceError::Busy {
            want: 4,
            full: vec![1]
        })
    );
    let mut mixed = share.clone();
    mixed[0].mig = true;
    assert_eq!(
        reference(&mixed, &two, None, None),
        Ok(vec![2, 3]),
        "whole GPUs only"
    );
    assert_eq!(
        reference(&mixed, &Request::default(), Some(Gpus::All), None),
        Err(PlaceError::OneMigDevice {
            want: Gpus::All,
            whole: 3
        })
    );
    let at = |d: &str| Request {
        gpus: None,
        device: Some(d.into()),
        profile: None,
    };
    assert_eq!(reference(&share, &at("GPU-2"), None, None), Ok(vec![2]));
    assert_eq!(reference(&share, &at("0"), None, None), Ok(vec![0]));
    assert!(matches!(
        reference(&share, &at("+0"), None, None),
        Err(PlaceError::NotInShare { .. })
    ));
    assert_eq!(
        reference(&share, &at("1"), None, None),
        Err(PlaceError::Busy {
            want: 1,
            full: vec![1]
        })
    );
    // An MPS device has no cap unless jobs-per-device sets one.
    let mut mps = share.clone();
    mps[1].mps = true;
    assert_eq!(reference(&mps, &at("1"), None, None), Ok(vec![1]));
    assert!(reference(&mps, &at("1"), None, Some(1)).is_err());
}
