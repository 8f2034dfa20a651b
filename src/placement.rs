//! Which devices of a team's share a job gets (`gpuctl run --gpus N --device ID --profile P`),
//! and the lease that records it. Pure: gpuctld's `Join` hands in the share, the live leases and
//! the usage collector's last figures, and gets back indices into the share or a refusal in
//! words.
//!
//! The choice, in order:
//! - never a device outside the share; `--device ID` (a UUID, MIG UUID or the device's
//!   position in the share as `gpuctl teams` numbers it) must name one of the share's devices;
//! - one MIG device per process: a CUDA process enumerates a single MIG device (NVIDIA's MIG
//!   user guide, "Device Enumeration"), so a second MIG UUID would only be ignored; more than
//!   one device can only be whole GPUs;
//! - `--profile P` (a MIG GPU-instance profile, `3g.40gb`) asks for one MIG device of that
//!   profile: a whole GPU never serves it, and a share without one is told so
//!   ([`PlaceError::NoProfile`]);
//! - a device is free while it holds fewer leases than its capacity ([`capacity`]);
//! - among the free ones: fewest leases first (nobody's first), then least memory held, then
//!   least activity (where known), then the share's own order, so placement is predictable.
//!
//! A lease is kept where only gpuctld and root read it (a 0600 record per member scope,
//! [`Lease::record`], [`Lease::from_record`]), keyed to its scope's name: it counts only while
//! that scope is live, so it ends with the scope however the scope ends, and a restarted
//! gpuctld reads it back for the scopes systemd still lists. The scope's own properties, which
//! every local user can read, carry only an opaque id.

use std::cmp::Ordering;
use std::fmt;

/// How many devices a job asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Gpus {
    /// This many (at least 1).
    Count(u32),
    /// Every device of the share (whole GPUs; a share of one MIG device).
    All,
}

/// A `--gpus` value that is not a device count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a device count (a whole number from 1, or \"all\")")]
pub struct BadGpus(pub String);

impl std::str::FromStr for Gpus {
    type Err = BadGpus;
    fn from_str(s: &str) -> Result<Self, BadGpus> {
        match s.trim() {
            "all" => Ok(Gpus::All),
            n => match n.parse::<u32>() {
                Ok(0) | Err(_) => Err(BadGpus(n.to_string())),
                Ok(n) => Ok(Gpus::Count(n)),
            },
        }
    }
}

impl fmt::Display for Gpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gpus::Count(n) => write!(f, "{n}"),
            Gpus::All => f.write_str("all"),
        }
    }
}

/// One device of a team's share, as the choice sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// `GPU-…` or `MIG-…` UUID.
    pub id: String,
    /// A MIG device (one per process).
    pub mig: bool,
    /// Served by an MPS control daemon (jobs share it by design).
    pub mps: bool,
    /// Leases on it now.
    pub held: u32,
    /// Device memory in use, from the usage collector (`None`: not known).
    pub memory_used: Option<u64>,
    /// Activity 0..=1 where NVML reports it (never for MIG handles).
    pub activity: Option<f64>,
    /// A process on it outside every gpuctl job, in words (`pid 4242 (python) holds 2048
    /// MiB`): a service started in the slice without `gpuctl run`, a container. It takes a
    /// job's place on a device without MPS.
    pub outside: Option<String>,
    /// The GPU-instance profile of a MIG device (`3g.40gb`); `None` for a whole GPU.
    pub profile: Option<String>,
}

impl Candidate {
    /// Jobs on it now: its leases, and one for a process outside every lease (an MPS device
    /// serves its clients side by side, so nothing outside fills it).
    pub fn taken(&self) -> u32 {
        self.held + u32::from(self.outside.is_some() && !self.mps)
    }
}

/// How many jobs a device takes: `jobs-per-device` when the policy sets it (0 never reaches
/// here: it turns placement off), else 1 for MIG devices and whole GPUs without MPS, and no cap
/// for MPS devices, which are placed fewest-leases-first all the same. `None` is no cap.
pub fn capacity(jobs_per_device: Option<u32>, c: &Candidate) -> Option<u32> {
    match jobs_per_device {
        Some(n) => Some(n),
        None if c.mps => None,
        None => Some(1),
    }
}

/// Why a job cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlaceError {
    /// More than one device asked for where only MIG devices would do.
    OneMigDevice {
        /// How many were asked for.
        want: Gpus,
        /// Whole GPUs in the share.
        whole: usize,
    },
    /// More whole GPUs asked for than the share has.
    TooMany {
        /// How many were asked for.
        want: u32,
        /// How many the share has.
        have: usize,
    },
    /// `--device` names nothing in the share.
    NotInShare {
        /// What was asked for.
        asked: String,
        /// The share's devices, in order.
        share: Vec<String>,
    },
    /// `--device` with more than one device.
    DeviceAndCount(Gpus),
    /// `--profile` with more than one device (a job gets one MIG device).
    ProfileAndCount(Gpus),
    /// `--profile` and `--device` together.
    ProfileAndDevice,
    /// `--profile` names a profile no device of the share has.
    NoProfile {
        /// What was asked for.
        profile: String,
        /// The profiles of the share's MIG devices, sorted, each once.
        have: Vec<String>,
    },
    /// The share has no devices at all.
    Empty,
    /// Not enough free devices now: the indices of those that would do, all full.
    Busy {
        /// How many were asked for.
        want: usize,
        /// Indices (into the share) of the devices that are full.
        full: Vec<usize>,
    },
}

impl fmt::Display for PlaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlaceError::OneMigDevice { want, whole } => write!(
                f,
                "--gpus {want}: a CUDA process uses only one MIG device (it enumerates the first \
                 and ignores the rest), so a job gets one MIG device{}",
                if *whole > 0 {
                    format!("; this share has {whole} whole GPU(s) for more")
                } else {
                    String::new()
                }
            ),
            PlaceError::TooMany { want, have } => {
                write!(f, "--gpus {want}: the share has {have} whole GPU(s)")
            }
            PlaceError::NotInShare { asked, share } => write!(
                f,
                "--device {asked}: not a device of the share (its devices: {})",
                share
                    .iter()
                    .enumerate()
                    .map(|(i, d)| format!("{i}={d}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            PlaceError::DeviceAndCount(g) => {
                write!(f, "--device names one device; --gpus {g} asks for more")
            }
            PlaceError::ProfileAndCount(g) => write!(
                f,
                "--profile asks for one MIG device (a CUDA process uses only one); --gpus {g} \
                 asks for more"
            ),
            PlaceError::ProfileAndDevice => f.write_str(
                "--device names one device and --profile asks for any device of a profile: give \
                 one of them",
            ),
            PlaceError::NoProfile { profile, have } => write!(
                f,
                "--profile {profile}: the share has no {profile} device ({})",
                if have.is_empty() {
                    "it has no MIG devices".to_string()
                } else {
                    format!("its MIG profiles: {}", have.join(", "))
                }
            ),
            PlaceError::Empty => f.write_str("the share has no devices to place a job on"),
            PlaceError::Busy { want, full } => write!(
                f,
                "no free device: {want} wanted, {} of the share's devices are held to capacity",
                full.len()
            ),
        }
    }
}

/// What the job asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// `--gpus` (`None`: the team's default, else 1).
    pub gpus: Option<Gpus>,
    /// `--device`.
    pub device: Option<String>,
    /// `--profile`: one MIG device of this GPU-instance profile.
    pub profile: Option<String>,
}

/// The distinct profiles of `share`'s MIG devices, sorted.
pub fn profiles_of(share: &[Candidate]) -> Vec<String> {
    let mut have: Vec<String> = share.iter().filter_map(|c| c.profile.clone()).collect();
    have.sort();
    have.dedup();
    have
}

/// The order among free devices: fewest leases, least memory, least activity (unknown counts
/// as none), then the share's order.
fn by_load(share: &[Candidate], a: usize, b: usize) -> Ordering {
    let (x, y) = (&share[a], &share[b]);
    x.taken()
        .cmp(&y.taken())
        .then(x.memory_used.unwrap_or(0).cmp(&y.memory_used.unwrap_or(0)))
        .then(
            x.activity
                .unwrap_or(0.0)
                .total_cmp(&y.activity.unwrap_or(0.0)),
        )
        .then(a.cmp(&b))
}

/// Pick devices of `share` for `req`: indices into `share`, in the order the job sees them.
pub fn choose(
    share: &[Candidate],
    req: &Request,
    default_gpus: Option<Gpus>,
    jobs_per_device: Option<u32>,
) -> Result<Vec<usize>, PlaceError> {
    let want = req.gpus.or(default_gpus).unwrap_or(Gpus::Count(1));
    let free =
        |i: &usize| capacity(jobs_per_device, &share[*i]).is_none_or(|c| share[*i].taken() < c);
    if req.profile.is_some() && req.device.is_some() {
        return Err(PlaceError::ProfileAndDevice);
    }
    if let Some(asked) = &req.device {
        if want != Gpus::Count(1) && req.gpus.is_some() {
            return Err(PlaceError::DeviceAndCount(want));
        }
        let i = find_device(share, asked).ok_or_else(|| PlaceError::NotInShare {
            asked: asked.clone(),
            share: share.iter().map(|c| c.id.clone()).collect(),
        })?;
        return if free(&i) {
            Ok(vec![i])
        } else {
            Err(PlaceError::Busy {
                want: 1,
                full: vec![i],
            })
        };
    }
    if let Some(p) = &req.profile {
        // One device, whatever the team's default count: a profile names MIG devices.
        if want != Gpus::Count(1) && req.gpus.is_some() {
            return Err(PlaceError::ProfileAndCount(want));
        }
        let pool: Vec<usize> = (0..share.len())
            .filter(|i| share[*i].profile.as_ref() == Some(p))
            .collect();
        if pool.is_empty() {
            return Err(PlaceError::NoProfile {
                profile: p.clone(),
                have: profiles_of(share),
            });
        }
        let (mut ok, full): (Vec<usize>, Vec<usize>) = pool.into_iter().partition(free);
        ok.sort_by(|a, b| by_load(share, *a, *b));
        return match ok.first() {
            Some(i) => Ok(vec![*i]),
            None => Err(PlaceError::Busy { want: 1, full }),
        };
    }
    if share.is_empty() {
        return Err(PlaceError::Empty);
    }
    let whole: Vec<usize> = (0..share.len()).filter(|i| !share[*i].mig).collect();
    let (n, pool): (usize, Vec<usize>) = match want {
        Gpus::Count(1) => (1, (0..share.len()).collect()),
        Gpus::All if share.len() == 1 => (1, vec![0]),
        Gpus::All if whole.len() == share.len() => (whole.len(), whole),
        Gpus::All => {
            return Err(PlaceError::OneMigDevice {
                want,
                whole: whole.len(),
            })
        }
        Gpus::Count(_) if whole.is_empty() => {
            return Err(PlaceError::OneMigDevice { want, whole: 0 })
        }
        Gpus::Count(n) if (n as usize) > whole.len() => {
            return Err(PlaceError::TooMany {
                want: n,
                have: whole.len(),
            })
        }
        Gpus::Count(n) => (n as usize, whole),
    };
    let (mut ok, full): (Vec<usize>, Vec<usize>) = pool.into_iter().partition(free);
    if ok.len() < n {
        return Err(PlaceError::Busy { want: n, full });
    }
    ok.sort_by(|a, b| by_load(share, *a, *b));
    ok.truncate(n);
    // The job sees its devices in the share's order, so CUDA index 0 is the first of them.
    ok.sort_unstable();
    Ok(ok)
}

/// How often a waiting request may be passed over by later ones before it reserves the free
/// devices it would take ([`serve`]), so that a request for two whole GPUs is not starved by a
/// stream of one-GPU jobs.
pub const MAX_PASSES: u32 = 8;

/// A request in a team's queue as [`serve`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    /// What it asks for.
    pub request: Request,
    /// How many later requests were placed while it waited.
    pub passed: u32,
    /// Its client has not come back since a restart: served nothing, holds nobody back.
    pub returning: bool,
}

/// Which of a queue's requests `share` serves now, walking them in serving order: each gets
/// what [`choose`] gives it with the devices taken or kept by those ahead counted as held. A
/// request that cannot be served now holds back nobody that a free device can serve, but keeps
/// its place: a device it names is kept for it (it gets it first when it frees), and once
/// passed over [`MAX_PASSES`] times it keeps the free devices it would take.
pub fn serve(
    share: &[Candidate],
    waiting: &[Waiter],
    default_gpus: Option<Gpus>,
    jobs_per_device: Option<u32>,
) -> Vec<Result<Vec<usize>, PlaceError>> {
    let mut cands = share.to_vec();
    let keep = |c: &mut Candidate| {
        if let Some(cap) = capacity(jobs_per_device, c) {
            c.held = c.held.max(cap);
        }
    };
    let mut out = Vec::with_capacity(waiting.len());
    for w in waiting {
        if w.returning {
            out.push(Err(PlaceError::Busy {
                want: 0,
                full: Vec::new(),
            }));
            continue;
        }
        let r = choose(&cands, &w.request, default_gpus, jobs_per_device);
        match &r {
            Ok(picked) => {
                for &i in picked {
                    cands[i].held += 1;
                }
            }
            Err(PlaceError::Busy { want, .. }) => {
                if let Some(i) = w
                    .request
                    .device
                    .as_deref()
                    .and_then(|d| find_device(&cands, d))
                {
                    keep(&mut cands[i]);
                } else if w.passed >= MAX_PASSES {
                    let pool = pool_of(&cands, &w.request, default_gpus);
                    let mut free: Vec<usize> = pool
                        .into_iter()
                        .filter(|i| {
                            capacity(jobs_per_device, &cands[*i])
                                .is_none_or(|c| cands[*i].taken() < c)
                        })
                        .collect();
                    free.sort_by(|a, b| by_load(&cands, *a, *b));
                    for i in free.into_iter().take(*want) {
                        keep(&mut cands[i]);
                    }
                }
            }
            Err(_) => {}
        }
        out.push(r);
    }
    out
}

/// The devices a request without `--device` may be given: those of its profile, any one for a
/// single device, whole GPUs for more.
fn pool_of(share: &[Candidate], req: &Request, default_gpus: Option<Gpus>) -> Vec<usize> {
    if let Some(p) = &req.profile {
        return (0..share.len())
            .filter(|i| share[*i].profile.as_ref() == Some(p))
            .collect();
    }
    match req.gpus.or(default_gpus).unwrap_or(Gpus::Count(1)) {
        Gpus::Count(1) => (0..share.len()).collect(),
        Gpus::All if share.len() == 1 => vec![0],
        _ => (0..share.len()).filter(|i| !share[*i].mig).collect(),
    }
}

/// The share's device that `asked` names: its UUID, or its position in the share.
pub fn find_device(share: &[Candidate], asked: &str) -> Option<usize> {
    share.iter().position(|c| c.id == asked).or_else(|| {
        asked
            .parse::<usize>()
            .ok()
            .filter(|i| *i < share.len() && !asked.starts_with('+'))
    })
}

/// A job's hold on devices.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lease {
    /// The scope (`gpuctl-run-<opaque id>.scope`).
    pub unit: String,
    /// The team.
    pub team: String,
    /// The holder's name (`uid N` when NSS does not know it).
    pub user: String,
    /// The holder's uid.
    pub uid: u32,
    /// The pid that was placed.
    pub pid: u32,
    /// Device UUIDs.
    pub devices: Vec<String>,
    /// When it was placed, seconds since the epoch.
    pub since: u64,
    /// The job's MPS pinned device memory limit in bytes, where one was set.
    #[serde(default)]
    pub gpu_memory: Option<u64>,
    /// The team whose lent device a borrowed job holds (it runs in the loans slice and is
    /// taken back when that team needs the device); `None` for a job on its own share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowed_from: Option<String>,
}

impl Lease {
    /// The lease as its record (one line of JSON).
    pub fn record(&self) -> String {
        let mut s = serde_json::to_string(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The lease of `unit` from its record; `None` for a record that is not one, or is
    /// another scope's.
    pub fn from_record(unit: &str, text: &str) -> Option<Lease> {
        let l: Lease = serde_json::from_str(text).ok()?;
        (l.unit == unit && !l.devices.is_empty() && !l.devices.iter().any(String::is_empty))
            .then_some(l)
    }

    /// The lease of `unit` from its description, where a gpuctld before lease records kept it
    /// (`gpuctl: alice (uid 1000, pid 812) in team interns on MIG-a since @1764783110`, with
    /// ` gpu-memory N` before ` since`): such scopes outlive a package upgrade, and their jobs
    /// still hold their devices. `None` for anything else.
    pub fn from_legacy_description(unit: &str, description: &str) -> Option<Lease> {
        let rest = description.strip_prefix("gpuctl: ")?;
        let (rest, since) = rest.rsplit_once(" since @")?;
        let since = since.parse().ok()?;
        let (rest, gpu_memory) = match rest.rsplit_once(" gpu-memory ") {
            Some((r, m)) => (r, Some(m.parse().ok()?)),
            None => (rest, None),
        };
        let (rest, devices) = rest.rsplit_once(" on ")?;
        let (rest, team) = rest.rsplit_once(" in team ")?;
        let (user, ids) = rest.rsplit_once(" (uid ")?;
        let (uid, pid) = ids.strip_suffix(')')?.split_once(", pid ")?;
        let devices: Vec<String> = devices.split(',').map(str::to_string).collect();
        if devices.iter().any(String::is_empty) {
            return None;
        }
        Some(Lease {
            unit: unit.to_string(),
            team: team.to_string(),
            user: user.to_string(),
            uid: uid.parse().ok()?,
            pid: pid.parse().ok()?,
            devices,
            since,
            gpu_memory,
            borrowed_from: None,
        })
    }
}

/// `secs` since the epoch as `2026-12-03T17:50:02Z` (for messages: who holds what since when).
pub fn utc(secs: u64) -> String {
    // Days to a civil date (Howard Hinnant's algorithm), so no time crate is needed for one
    // line of text.
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The holders of `devices`, for a refusal to a member of `team`: `MIG-a: alice
/// (gpuctl-run-5f3a….scope) since 2026-12-03T17:50:02Z`, one entry per lease; another team's
/// lease (a GPU the teams share) names the team alone, as `Status` would show it to the caller.
pub fn holders(leases: &[Lease], devices: &[&str], team: &str) -> String {
    let mut out = Vec::new();
    for d in devices {
        for l in leases.iter().filter(|l| l.devices.iter().any(|x| x == d)) {
            out.push(if l.team == team {
                format!("{d}: {} ({}) since {}", l.user, l.unit, utc(l.since))
            } else {
                format!("{d}: a job of team {} since {}", l.team, utc(l.since))
            });
        }
    }
    if out.is_empty() {
        "none recorded".into()
    } else {
        out.join("; ")
    }
}

/// Leases per device id.
pub fn held_counts<'a>(leases: impl IntoIterator<Item = &'a Lease>, id: &str) -> u32 {
    leases
        .into_iter()
        .filter(|l| l.devices.iter().any(|d| d == id))
        .count() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mig(id: &str, held: u32) -> Candidate {
        Candidate {
            id: id.into(),
            mig: true,
            mps: false,
            held,
            memory_used: None,
            activity: None,
            outside: None,
            profile: None,
        }
    }

    fn gpu(id: &str, held: u32, mem: Option<u64>) -> Candidate {
        Candidate {
            id: id.into(),
            mig: false,
            mps: false,
            held,
            memory_used: mem,
            activity: None,
            outside: None,
            profile: None,
        }
    }

    fn req(gpus: Option<Gpus>, device: Option<&str>) -> Request {
        Request {
            gpus,
            device: device.map(str::to_string),
            profile: None,
        }
    }

    #[test]
    fn four_jobs_on_four_mig_devices_get_four_distinct_ones_and_a_fifth_is_busy() {
        let mut share: Vec<Candidate> = (0..4).map(|i| mig(&format!("MIG-{i}"), 0)).collect();
        let mut got = Vec::new();
        for _ in 0..4 {
            let i = choose(&share, &Request::default(), None, None).unwrap();
            assert_eq!(i.len(), 1);
            share[i[0]].held += 1;
            got.push(i[0]);
        }
        assert_eq!(
            got,
            vec![0, 1, 2, 3],
            "free first, ties in the share's order"
        );
        assert_eq!(
            choose(&share, &Request::default(), None, None),
            Err(PlaceError::Busy {
                want: 1,
                full: vec![0, 1, 2, 3]
            })
        );
        // Two jobs per device: the least held goes first again.
        assert_eq!(
            choose(&share, &Request::default(), None, Some(2)),
            Ok(vec![0])
        );
    }

    #[test]
    fn a_process_outside_every_lease_takes_a_jobs_place() {
        let mut share: Vec<Candidate> = (0..2).map(|i| gpu(&format!("GPU-{i}"), 0, None)).collect();
        share[0].outside = Some("pid 42 (python) holds 2048 MiB".into());
        assert_eq!(choose(&share, &Request::default(), None, None), Ok(vec![1]));
        assert_eq!(
            choose(&share, &req(None, Some("GPU-0")), None, None),
            Err(PlaceError::Busy {
                want: 1,
                full: vec![0]
            })
        );
        assert_eq!(
            choose(&share, &req(Some(Gpus::Count(2)), None), None, None),
            Err(PlaceError::Busy {
                want: 2,
                full: vec![0]
            })
        );
        // Two jobs per device: it counts as one of them, so the other device goes first.
        share[1].held = 1;
        assert_eq!(
            choose(&share, &Request::default(), None, Some(2)),
            Ok(vec![0])
        );
        share[0].held = 1;
        assert_eq!(
            choose(&share, &Request::default(), None, Some(2)),
            Ok(vec![1])
        );
        // An MPS device serves its clients side by side: nothing outside fills it.
        share[0].mps = true;
        share[1].held = 2;
        assert_eq!(
            choose(&share, &Request::default(), None, Some(2)),
            Ok(vec![0])
        );
    }

    #[test]
    fn more_than_one_mig_device_is_refused_with_the_reason() {
        let share: Vec<Candidate> = (0..4).map(|i| mig(&format!("MIG-{i}"), 0)).collect();
        let e = choose(&share, &req(Some(Gpus::Count(2)), None), None, None).unwrap_err();
        assert_eq!(
            e,
            PlaceError::OneMigDevice {
                want: Gpus::Count(2),
                whole: 0
            }
        );
        assert!(e.to_string().contains("uses only one MIG device"), "{e}");
        assert!(choose(&share, &req(Some(Gpus::All), None), None, None).is_err());
        // A share of one MIG device: "all" is that one.
        assert_eq!(
            choose(&share[..1], &req(Some(Gpus::All), None), None, None),
            Ok(vec![0])
        );
    }

    #[test]
    fn least_loaded_whole_gpus_by_memory_then_activity() {
        let mut share = vec![
            gpu("GPU-a", 0, Some(9 << 30)),
            gpu("GPU-b", 0, Some(1 << 30)),
            gpu("GPU-c", 0, Some(1 << 30)),
        ];
        share[1].activity = Some(0.9);
        share[2].activity = Some(0.1);
        assert_eq!(choose(&share, &Request::default(), None, None), Ok(vec![2]));
        assert_eq!(
            choose(&share, &req(Some(Gpus::Count(2)), None), None, None),
            Ok(vec![1, 2]),
            "in the share's order"
        );
        // Held beats memory: nobody's device first.
        share[2].held = 1;
        assert_eq!(
            choose(&share, &Request::default(), None, Some(3)),
            Ok(vec![1])
        );
        assert_eq!(
            choose(&share, &req(Some(Gpus::Count(4)), None), None, None),
            Err(PlaceError::TooMany { want: 4, have: 3 })
        );
        assert_eq!(
            choose(&share, &Request::default(), Some(Gpus::All), Some(3)),
            Ok(vec![0, 1, 2]),
            "the team's default applies without --gpus"
        );
    }

    #[test]
    fn device_by_uuid_or_position_and_never_outside_the_share() {
        let share = vec![mig("MIG-a", 0), mig("MIG-b", 1)];
        assert_eq!(
            choose(&share, &req(None, Some("MIG-a")), None, None),
            Ok(vec![0])
        );
        assert_eq!(
            choose(&share, &req(None, Some("0")), None, None),
            Ok(vec![0])
        );
        assert_eq!(
            choose(&share, &req(None, Some("1")), None, None),
            Err(PlaceError::Busy {
                want: 1,
                full: vec![1]
            })
        );
        for bad in ["2", "MIG-z", "-1", "+0", "GPU-a"] {
            let e = choose(&share, &req(None, Some(bad)), None, None).unwrap_err();
            assert!(matches!(e, PlaceError::NotInShare { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("0=MIG-a, 1=MIG-b"), "{e}");
        }
        assert_eq!(
            choose(
                &share,
                &req(Some(Gpus::Count(2)), Some("MIG-a")),
                None,
                None
            ),
            Err(PlaceError::DeviceAndCount(Gpus::Count(2)))
        );
    }

    fn of(profile: &str, id: &str, held: u32) -> Candidate {
        Candidate {
            profile: Some(profile.into()),
            ..mig(id, held)
        }
    }

    fn prof(p: &str) -> Request {
        Request {
            profile: Some(p.into()),
            ..Request::default()
        }
    }

    #[test]
    fn a_profile_is_served_by_a_free_device_of_that_profile_only() {
        let mut share = vec![
            gpu("GPU-w", 0, None),
            of("1g.10gb", "MIG-s", 0),
            of("3g.40gb", "MIG-a", 1),
            of("3g.40gb", "MIG-b", 0),
        ];
        assert_eq!(choose(&share, &prof("3g.40gb"), None, None), Ok(vec![3]));
        assert_eq!(choose(&share, &prof("1g.10gb"), None, None), Ok(vec![1]));
        // The team's default count does not apply: a profile is one MIG device.
        assert_eq!(
            choose(&share, &prof("3g.40gb"), Some(Gpus::All), None),
            Ok(vec![3])
        );
        // Both of the profile held: busy (a --wait queues), though others are free.
        share[3].held = 1;
        assert_eq!(
            choose(&share, &prof("3g.40gb"), None, None),
            Err(PlaceError::Busy {
                want: 1,
                full: vec![2, 3]
            })
        );
        // Least held first among those of the profile.
        assert_eq!(choose(&share, &prof("3g.40gb"), None, Some(2)), Ok(vec![2]));
        // A profile the share does not have, and a whole GPU never serves one.
        let e = choose(&share, &prof("7g.80gb"), None, None).unwrap_err();
        assert_eq!(
            e,
            PlaceError::NoProfile {
                profile: "7g.80gb".into(),
                have: vec!["1g.10gb".into(), "3g.40gb".into()]
            }
        );
        assert!(
            e.to_string().contains("its MIG profiles: 1g.10gb, 3g.40gb"),
            "{e}"
        );
        let e = choose(&share[..1], &prof("3g.40gb"), None, None).unwrap_err();
        assert!(e.to_string().contains("no MIG devices"), "{e}");
        assert!(matches!(
            choose(&[], &prof("3g.40gb"), None, None),
            Err(PlaceError::NoProfile { .. })
        ));
    }

    #[test]
    fn a_profile_with_more_devices_or_a_device_is_refused() {
        let share = vec![of("3g.40gb", "MIG-a", 0), of("3g.40gb", "MIG-b", 0)];
        let two = Request {
            gpus: Some(Gpus::Count(2)),
            ..prof("3g.40gb")
        };
        let e = choose(&share, &two, None, None).unwrap_err();
        assert_eq!(e, PlaceError::ProfileAndCount(Gpus::Count(2)));
        assert!(e.to_string().contains("--gpus 2"), "{e}");
        let one = Request {
            gpus: Some(Gpus::Count(1)),
            ..prof("3g.40gb")
        };
        assert_eq!(choose(&share, &one, None, None), Ok(vec![0]));
        let named = Request {
            device: Some("MIG-b".into()),
            ..prof("3g.40gb")
        };
        let e = choose(&share, &named, None, None).unwrap_err();
        assert_eq!(e, PlaceError::ProfileAndDevice);
        assert!(e.to_string().contains("--device"), "{e}");
    }

    #[test]
    fn mps_devices_take_more_by_default() {
        let mut share = vec![gpu("GPU-a", 3, None)];
        share[0].mps = true;
        assert_eq!(choose(&share, &Request::default(), None, None), Ok(vec![0]));
        assert!(choose(&share, &Request::default(), None, Some(3)).is_err());
    }

    #[test]
    fn times_and_holders_read_as_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_764_783_110), "2025-12-03T17:31:50Z");
        let l = Lease {
            unit: "gpuctl-run-t-9.scope".into(),
            team: "t".into(),
            user: "bob".into(),
            uid: 1001,
            pid: 9,
            devices: vec!["MIG-a".into()],
            since: 0,
            gpu_memory: None,
            borrowed_from: None,
        };
        assert_eq!(
            holders(std::slice::from_ref(&l), &["MIG-a", "MIG-b"], "t"),
            "MIG-a: bob (gpuctl-run-t-9.scope) since 1970-01-01T00:00:00Z"
        );
        assert_eq!(
            holders(&[l], &["MIG-a"], "u"),
            "MIG-a: a job of team t since 1970-01-01T00:00:00Z",
            "no name or unit of another team's member"
        );
        assert_eq!(holders(&[], &["MIG-a"], "t"), "none recorded");
    }

    #[test]
    fn gpus_parse() {
        assert_eq!("2".parse(), Ok(Gpus::Count(2)));
        assert_eq!("all".parse(), Ok(Gpus::All));
        assert!("0".parse::<Gpus>().is_err());
        assert!("-1".parse::<Gpus>().is_err());
        assert!("two".parse::<Gpus>().is_err());
    }

    #[test]
    fn a_lease_survives_its_record() {
        let l = Lease {
            unit: "gpuctl-run-5f3a9c0d1e2b4a68.scope".into(),
            team: "interns".into(),
            user: "uid 4711".into(),
            uid: 4711,
            pid: 812,
            devices: vec!["MIG-a".into()],
            since: 1_764_783_110,
            gpu_memory: Some(2 << 30),
            borrowed_from: None,
        };
        let r = l.record();
        assert!(r.ends_with("}\n") && r.lines().count() == 1, "{r}");
        assert_eq!(Lease::from_record(&l.unit, &r), Some(l.clone()));
        let two = Lease {
            devices: vec!["GPU-1".into(), "GPU-2".into()],
            gpu_memory: None,
            ..l.clone()
        };
        assert_eq!(Lease::from_record(&two.unit, &two.record()), Some(two));
        // A borrowed job's lender survives its record; an own-share record does not name the
        // key at all, so it reads the same as before lending existed.
        assert!(!r.contains("borrowed_from"), "{r}");
        let borrowed = Lease {
            borrowed_from: Some("train".into()),
            ..l.clone()
        };
        let br = borrowed.record();
        assert!(br.contains(r#""borrowed_from":"train""#), "{br}");
        assert_eq!(Lease::from_record(&l.unit, &br), Some(borrowed));
        // Another scope's record, a record without devices, and anything else are none.
        assert_eq!(Lease::from_record("gpuctl-run-0.scope", &r), None);
        let none = Lease {
            devices: vec![],
            ..l.clone()
        };
        assert_eq!(Lease::from_record(&l.unit, &none.record()), None);
        for t in ["", "{}", "gpuctl: x", &r[..r.len() / 2]] {
            assert_eq!(Lease::from_record(&l.unit, t), None, "{t}");
        }
    }

    #[test]
    fn a_scope_of_an_earlier_gpuctld_keeps_its_lease() {
        let unit = "gpuctl-run-interns-812.scope";
        let d = "gpuctl: uid 4711 (uid 4711, pid 812) in team interns on MIG-a gpu-memory \
                 2147483648 since @1764783110";
        assert_eq!(
            Lease::from_legacy_description(unit, d),
            Some(Lease {
                unit: unit.into(),
                team: "interns".into(),
                user: "uid 4711".into(),
                uid: 4711,
                pid: 812,
                devices: vec!["MIG-a".into()],
                since: 1_764_783_110,
                gpu_memory: Some(2 << 30),
                borrowed_from: None,
            })
        );
        let two = "gpuctl: bob (uid 1, pid 2) in team t on GPU-1,GPU-2 since @3";
        let l = Lease::from_legacy_description("u.scope", two).unwrap();
        assert_eq!((l.devices.len(), l.gpu_memory), (2, None));
        // Scopes placed without a lease, today's neutral descriptions, and anything else.
        for d in [
            "gpuctl: alice (pid 5) in team infer",
            "gpuctl: alice (uid 1, pid 5) in team infer on  since @1",
            "gpuctl job 5f3a9c0d1e2b4a68",
            "session 3 of user alice",
            "",
        ] {
            assert_eq!(Lease::from_legacy_description("x.scope", d), None, "{d}");
        }
    }
    // The property test against a reference written from the rules: tests/placement_oracle.rs.
}

#[cfg(test)]
mod serve_tests {
    use super::*;
    use proptest::prelude::*;

    fn dev(id: &str, mig: bool, held: u32) -> Candidate {
        Candidate {
            id: id.into(),
            mig,
            mps: false,
            held,
            memory_used: None,
            activity: None,
            outside: None,
            profile: None,
        }
    }

    fn w(gpus: Option<u32>, device: Option<&str>, passed: u32) -> Waiter {
        Waiter {
            request: Request {
                gpus: gpus.map(Gpus::Count),
                device: device.map(str::to_string),
                profile: None,
            },
            passed,
            returning: false,
        }
    }

    #[test]
    fn a_head_that_names_a_busy_device_holds_back_nobody_and_gets_it_when_it_frees() {
        // alice names MIG-a, held by someone; carol asks for any device; MIG-b is free.
        let mut share = vec![dev("MIG-a", true, 1), dev("MIG-b", true, 0)];
        let q = [w(None, Some("MIG-a"), 0), w(None, None, 0)];
        let r = serve(&share, &q, None, None);
        assert!(matches!(r[0], Err(PlaceError::Busy { .. })));
        assert_eq!(r[1], Ok(vec![1]), "carol is not held back");
        // MIG-a frees while both wait: alice gets it, carol still gets MIG-b.
        share[0].held = 0;
        assert_eq!(
            serve(&share, &q, None, None),
            vec![Ok(vec![0]), Ok(vec![1])]
        );
        // Only MIG-a is free: it is kept for alice, not given to carol behind her.
        share[1].held = 1;
        let r = serve(&share, &q, None, None);
        assert_eq!(r[0], Ok(vec![0]));
        assert!(matches!(r[1], Err(PlaceError::Busy { .. })));
        // Alice's device is busy again and carol's is free: carol does not wait on her.
        share[0].held = 1;
        share[1].held = 0;
        assert_eq!(serve(&share, &q, None, None)[1], Ok(vec![1]));
    }

    #[test]
    fn a_big_request_passed_over_too_often_keeps_what_frees() {
        // Two whole GPUs, one busy; a two-GPU request ahead of a stream of one-GPU jobs.
        let share = vec![dev("GPU-0", false, 0), dev("GPU-1", false, 1)];
        let young = [w(Some(2), None, MAX_PASSES - 1), w(None, None, 0)];
        assert_eq!(serve(&share, &young, None, None)[1], Ok(vec![0]));
        let old = [w(Some(2), None, MAX_PASSES), w(None, None, 0)];
        let r = serve(&share, &old, None, None);
        assert!(matches!(r[0], Err(PlaceError::Busy { want: 2, .. })));
        assert!(
            matches!(r[1], Err(PlaceError::Busy { .. })),
            "GPU-0 is kept for the request passed over {MAX_PASSES} times"
        );
    }

    #[test]
    fn a_profile_request_waits_for_its_profile_and_keeps_only_devices_of_it() {
        let mut share = vec![dev("MIG-small", true, 0), dev("MIG-big", true, 1)];
        share[0].profile = Some("1g.10gb".into());
        share[1].profile = Some("3g.40gb".into());
        let mut big = w(None, None, 0);
        big.request.profile = Some("3g.40gb".into());
        // The big one is held: the profile request waits and the one behind gets the small
        // device, which it could never take.
        let r = serve(&share, &[big.clone(), w(None, None, 0)], None, None);
        assert!(matches!(r[0], Err(PlaceError::Busy { want: 1, .. })));
        assert_eq!(r[1], Ok(vec![0]));
        // Passed over too often it keeps a device of its profile, never another.
        big.passed = MAX_PASSES;
        let r = serve(&share, &[big.clone(), w(None, None, 0)], None, None);
        assert_eq!(r[1], Ok(vec![0]), "the small device is not kept for it");
        // A profile the share lacks holds nobody back.
        let mut none = w(None, None, 0);
        none.request.profile = Some("7g.80gb".into());
        let r = serve(&share, &[none, w(None, None, 0)], None, None);
        assert!(matches!(r[0], Err(PlaceError::NoProfile { .. })));
        assert_eq!(r[1], Ok(vec![0]));
        // The big one frees: it goes to the profile request, the small one to the next.
        share[1].held = 0;
        assert_eq!(
            serve(&share, &[big, w(None, None, 0)], None, None),
            vec![Ok(vec![1]), Ok(vec![0])]
        );
    }

    #[test]
    fn returning_requests_are_served_nothing_and_keep_nothing() {
        let share = vec![dev("MIG-a", true, 0)];
        let mut back = w(None, Some("MIG-a"), MAX_PASSES);
        back.returning = true;
        let r = serve(&share, &[back, w(None, None, 0)], None, None);
        assert!(r[0].is_err());
        assert_eq!(r[1], Ok(vec![0]));
    }

    fn arb_share() -> impl Strategy<Value = Vec<Candidate>> {
        prop::collection::vec((any::<bool>(), 0u32..3), 1..6).prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (mig, held))| dev(&format!("D-{i}"), mig, held))
                .collect()
        })
    }

    fn arb_queue() -> impl Strategy<Value = Vec<Waiter>> {
        prop::collection::vec(
            (
                prop::option::of(1u32..3),
                prop::option::of(0usize..6),
                0u32..(MAX_PASSES + 2),
            ),
            0..8,
        )
        .prop_map(|v| {
            v.into_iter()
                .map(|(n, d, p)| {
                    let d = d.map(|d| format!("D-{d}"));
                    w(if d.is_some() { None } else { n }, d.as_deref(), p)
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn serving_properties(share in arb_share(), q in arb_queue(), jpd in prop::option::of(1u32..3)) {
            let r = serve(&share, &q, None, jpd);
            prop_assert_eq!(r.len(), q.len());
            // No device is given past its capacity, counting what is already held.
            let mut held: Vec<u32> = share.iter().map(|c| c.held).collect();
            for picked in r.iter().flatten() {
                for &i in picked {
                    held[i] += 1;
                }
            }
            for (i, c) in share.iter().enumerate() {
                let cap = capacity(jpd, c).unwrap_or(u32::MAX);
                let fresh = held[i] - c.held;
                prop_assert!(fresh == 0 || held[i] <= cap, "device {} over capacity", i);
            }
            // A request that is not served, names no device and was not passed over too often
            // holds back nobody: without it, the others get exactly the same.
            for k in 0..q.len() {
                if r[k].is_ok() || q[k].request.device.is_some() || q[k].passed >= MAX_PASSES {
                    continue;
                }
                let mut without = q.clone();
                without.remove(k);
                let r2 = serve(&share, &without, None, jpd);
                let mut expect = r.clone();
                let _unserved = expect.remove(k);
                prop_assert_eq!(r2, expect);
            }
            // The first request that a free device can serve is served: nobody ahead of the
            // first servable one keeps what it needs unless it named it or waited too long.
            if let Some(first) = q.iter().position(|x| choose(&share, &x.request, None, jpd).is_ok()) {
                let ahead_keep = q[..first]
                    .iter()
                    .any(|x| x.request.device.is_some() || x.passed >= MAX_PASSES);
                if !ahead_keep {
                    prop_assert!(r[first].is_ok());
                }
            }
        }
    }

    /// Jobs end and one-GPU requests keep coming: a two-GPU request at the head is served
    /// within a bounded number of rounds.
    #[test]
    fn a_stream_of_small_jobs_does_not_starve_a_big_one() {
        let mut share = vec![dev("GPU-0", false, 1), dev("GPU-1", false, 1)];
        let mut big = w(Some(2), None, 0);
        let mut running: Vec<(usize, u32)> = vec![(0, 1), (1, 2)]; // (device, ends at round)
        for round in 0..100u32 {
            running.retain(|(d, end)| {
                if *end == round {
                    share[*d].held -= 1;
                }
                *end != round
            });
            let small = w(None, None, 0);
            let r = serve(&share, &[big.clone(), small], None, None);
            if let Ok(p) = &r[0] {
                assert_eq!(p.len(), 2);
                assert!(round <= MAX_PASSES + 3, "served at round {round}");
                return;
            }
            if let Ok(p) = &r[1] {
                share[p[0]].held += 1;
                running.push((p[0], round + 2));
                big.passed += 1;
            }
        }
        panic!("the two-GPU request starved");
    }
}
