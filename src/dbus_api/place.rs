//! `Join`'s placement: the team's share as the last reconcile left it, the live leases (the
//! live member scopes' root-only records, [`store`]), the choice ([`crate::placement`]) and
//! what a placed job gets: its scope's device fence and its environment.
//!
//! Everything but [`leases`] is pure, so the share, fence and environment rules are tested
//! without a bus.

use super::reply::HostView;
use crate::placement::{self, Candidate, Gpus, Lease, PlaceError, Request, Waiter};
use crate::plan::desired::COMMON_DEVICES;
use crate::policy::Team;
use crate::systemd::Systemd;
use std::collections::{BTreeMap, HashMap};

pub mod store;

/// Options of `JoinWith(team, options)`, as `gpuctl run`/`shell` send them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinOptions {
    /// `gpus`: `N` or `all`.
    pub gpus: Option<Gpus>,
    /// `device`: a UUID, MIG UUID or position in the share.
    pub device: Option<String>,
    /// `gpu-memory`: bytes.
    pub gpu_memory: Option<u64>,
    /// `wait`: how long to queue for a free device (`forever`, or milliseconds).
    pub wait: Option<std::time::Duration>,
    /// `borrow`: `true` or `false`; unset: the team's `borrow` setting.
    pub borrow: Option<bool>,
    /// `profile`: one MIG device of this GPU-instance profile (`3g.40gb`).
    pub profile: Option<String>,
}

/// The longest `--wait`: a week (`forever` is this too), so a deadline never overflows.
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(7 * 86_400);

/// A `JoinWith` option that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// Not one of the options, or a device name out of bounds.
    #[error("unknown or bad option {} (options: gpus, device, gpu-memory, wait, borrow, profile)", crate::settings::value::quote(.0))]
    Unknown(String),
    /// `gpus` is not a count.
    #[error(transparent)]
    Gpus(#[from] placement::BadGpus),
    /// `wait` is not milliseconds.
    #[error("wait {0:?}: not milliseconds")]
    Wait(String),
    /// `gpu-memory` is not a byte count.
    #[error("gpu-memory {0:?}: not a byte count")]
    GpuMemory(String),
    /// `borrow` is not `true` or `false`.
    #[error("borrow {0:?}: not true or false")]
    Borrow(String),
    /// `profile` is no GPU-instance profile of any known GPU model.
    #[error(transparent)]
    Profile(#[from] UnknownProfile),
}

/// A GPU-instance profile name that no known GPU model has (`gpuctl run --profile`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--profile {name}: no GPU model has a MIG GPU-instance profile of that name; {help}")]
pub struct UnknownProfile {
    /// What was asked for.
    pub name: String,
    /// A suggestion, or where to look.
    pub help: String,
}

/// Refuse a GPU-instance profile name that no model of the catalog offers, with the closest
/// known name or the one it has now where the driver renamed it.
pub fn check_gi_profile_name(name: &str) -> Result<(), UnknownProfile> {
    if !crate::profiles::GpuModel::offering(name).is_empty() {
        return Ok(());
    }
    let help = match crate::profiles::GpuModel::renamed(name) {
        Some((m, now)) => format!("did you mean '{now}' (its name on {} now)?", m.key),
        None => {
            let names: std::collections::BTreeSet<&str> = crate::profiles::Catalog::get()
                .models()
                .iter()
                .flat_map(|m| m.gi_profiles.iter().map(|p| p.name.as_str()))
                .collect();
            crate::policy::parse::suggest(
                name,
                names,
                "`gpuctl teams` lists the profiles of a team's devices".into(),
            )
        }
    };
    Err(UnknownProfile {
        name: name.to_string(),
        help,
    })
}

impl JoinOptions {
    /// Read the options map; an unknown key or a bad value is refused in words.
    pub fn parse(map: &HashMap<String, String>) -> Result<Self, OptionError> {
        let mut o = JoinOptions::default();
        for (k, v) in map {
            match k.as_str() {
                "gpus" => o.gpus = Some(v.parse()?),
                "device" if !v.is_empty() && v.len() <= 128 => o.device = Some(v.clone()),
                "profile" if !v.is_empty() && v.len() <= 64 => {
                    check_gi_profile_name(v)?;
                    o.profile = Some(v.clone());
                }
                "wait" => {
                    let ms: u64 = match v.as_str() {
                        "forever" => MAX_WAIT.as_millis() as u64,
                        v => v.parse().map_err(|_| OptionError::Wait(v.to_string()))?,
                    };
                    o.wait = Some(std::time::Duration::from_millis(ms).min(MAX_WAIT));
                }
                "gpu-memory" => {
                    o.gpu_memory = Some(
                        v.parse()
                            .ok()
                            .filter(|b| *b > 0)
                            .ok_or_else(|| OptionError::GpuMemory(v.to_string()))?,
                    )
                }
                "borrow" => {
                    o.borrow = Some(match v.as_str() {
                        "true" => true,
                        "false" => false,
                        v => return Err(OptionError::Borrow(v.to_string())),
                    })
                }
                _ => return Err(OptionError::Unknown(k.to_string())),
            }
        }
        Ok(o)
    }

    /// The options map for the wire (the inverse of [`JoinOptions::parse`]).
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        if let Some(g) = self.gpus {
            m.insert("gpus".into(), g.to_string());
        }
        if let Some(d) = &self.device {
            m.insert("device".into(), d.clone());
        }
        if let Some(b) = self.gpu_memory {
            m.insert("gpu-memory".into(), b.to_string());
        }
        if let Some(w) = self.wait {
            m.insert("wait".into(), w.as_millis().to_string());
        }
        if let Some(b) = self.borrow {
            m.insert("borrow".into(), b.to_string());
        }
        if let Some(p) = &self.profile {
            m.insert("profile".into(), p.clone());
        }
        m
    }

    /// The choice's view of the request.
    pub fn request(&self) -> Request {
        Request {
            gpus: self.gpus,
            device: self.device.clone(),
            profile: self.profile.clone(),
        }
    }

    /// Whether the job asked for anything.
    pub fn is_empty(&self) -> bool {
        *self == JoinOptions::default()
    }
}

/// The variable naming the job's CDI device(s): the placed devices' or, for a job that is not
/// placed, the whole share's (`gpuctl.io/team=<team>`).
pub const CDI_DEVICE: &str = "GPUCTL_CDI_DEVICE";

/// One device of the share with what a job on it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareDevice {
    /// UUID.
    pub id: String,
    /// A MIG device.
    pub mig: bool,
    /// The GPU-instance profile of a MIG device (`3g.40gb`); `None` for a whole GPU.
    pub profile: Option<String>,
    /// Its MPS daemon instance, when the team runs one for it.
    pub mps: Option<String>,
    /// The device nodes a job on it opens (besides [`COMMON_DEVICES`]).
    pub nodes: Vec<String>,
}

/// The team's share in order (whole GPUs, then MIG devices), as the last reconcile left it.
/// A MIG device still to be created or whose cap nodes are unknown is left out: a job could
/// not be fenced to it.
pub fn share(view: &HostView, team: &str) -> Vec<ShareDevice> {
    let Some(tv) = view.teams.get(team) else {
        return Vec::new();
    };
    let minor = |i: u32| view.gpus.iter().find(|g| g.index == i).map(|g| g.minor);
    let mps_whole = tv.mps.keys().find(|k| k.ends_with("-gpus")).cloned();
    let mut out = Vec::new();
    for i in &tv.whole_gpus {
        let (Some(g), Some(m)) = (view.gpus.iter().find(|g| g.index == *i), minor(*i)) else {
            continue;
        };
        out.push(ShareDevice {
            id: g.uuid.clone(),
            mig: false,
            profile: None,
            mps: mps_whole.clone(),
            nodes: vec![format!("/dev/nvidia{m}")],
        });
    }
    for d in &tv.mig_devices {
        let Some(nodes) = minor(d.gpu_index).and_then(|m| d.fence_nodes(m)) else {
            continue;
        };
        let instance = d.mps_instance(team);
        out.push(ShareDevice {
            id: d.uuid.clone(),
            mig: true,
            profile: Some(d.gi_profile.clone()),
            mps: tv.mps.contains_key(&instance).then_some(instance),
            nodes,
        });
    }
    out
}

/// The live leases of every member scope ([`store::read`]). A scope whose cgroup is empty has
/// ended even if systemd has not yet noticed (its cgroup-empty notice is asynchronous): its
/// lease is over, so the next job does not find the device held by a job that exited a moment
/// ago.
pub async fn leases(
    sd: &Systemd,
    root: &crate::paths::Root,
) -> Result<Vec<Lease>, crate::systemd::SystemdError> {
    let live = sd.member_scopes().await?;
    Ok(store::read(root, &live, std::time::SystemTime::now())
        .into_iter()
        .filter(|l| {
            let events = root.join(format!(
                "/sys/fs/cgroup/{}/{}/cgroup.events",
                crate::systemd::props::slice_cgroup(lease_slice(l)),
                l.unit
            ));
            std::fs::read_to_string(events).map_or(true, |t| populated(&t))
        })
        .collect())
}

/// The slice a lease's scope runs in: its team's, or the loans slice for a borrowed job.
pub fn lease_slice(l: &Lease) -> &str {
    match l.borrowed_from {
        Some(_) => crate::names::LOANS,
        None => &l.team,
    }
}

/// Whether `cgroup.events` text says the cgroup still has processes (unreadable: assume so).
pub fn populated(events: &str) -> bool {
    !events.lines().any(|l| l.trim() == "populated 0")
}

/// Each device of `team`'s share with its leases and capacity, for `Teams` (empty when the
/// team places no jobs).
pub fn holds(
    team: &Team,
    share: &[ShareDevice],
    leases: &[Lease],
    out: &BTreeMap<String, crate::health::OutOfService>,
) -> Vec<super::reply::DeviceHold> {
    if !team.placement.enabled() {
        return Vec::new();
    }
    share
        .iter()
        .enumerate()
        .map(|(index, d)| super::reply::DeviceHold {
            index,
            id: d.id.clone(),
            mig: d.mig,
            profile: d.profile.clone(),
            capacity: match team.placement.jobs_per_device {
                Some(n) => Some(n),
                None if d.mps.is_some() => None,
                None => Some(1),
            },
            leases: leases
                .iter()
                // Its own jobs, and a borrower's on a device it lent.
                .filter(|l| {
                    (l.team == *team.name || l.borrowed_from.as_deref() == Some(&*team.name))
                        && l.devices.contains(&d.id)
                })
                .map(super::reply::LeaseStatus::from)
                .collect(),
            out_of_service: out.get(&d.id).map(|o| super::reply::DeviceOutStatus {
                device: d.id.clone(),
                reason: o.reason.clone(),
                since: o.since,
                by: o.by.clone(),
            }),
        })
        .collect()
}

/// What a usage collection says of one device: memory held, activity, and a process on it
/// outside every gpuctl job ([`processes`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Load {
    /// Device memory in use.
    pub memory_used: Option<u64>,
    /// Activity 0..=1 where NVML reports it.
    pub activity: Option<f64>,
    /// A process on it in no gpuctl job, in words.
    pub outside: Option<String>,
}

/// Each device's [`Load`] by id, from a collection.
pub fn load_of(u: &crate::usage::Usage) -> HashMap<String, Load> {
    let mut outside = processes(u);
    let mut m = HashMap::new();
    let mut add = |id: &str, memory_used, activity| {
        let outside = outside.remove(id).and_then(|(_, o)| o);
        m.insert(
            id.to_string(),
            Load {
                memory_used,
                activity,
                outside,
            },
        );
    };
    for g in &u.gpus {
        add(&g.uuid, g.memory_used, g.activity);
        for d in &g.mig_devices {
            add(&d.uuid, d.memory_used, d.activity);
        }
    }
    m
}

/// The processes on each device of `usage` (by UUID): how many, and the first one outside
/// every gpuctl job, in words. A process in a gpuctl job scope is never outside: its lease
/// counts it while the scope lives, and once the scope is gone it is ending (a collection
/// may still list it). Empty when NVML was not read.
pub fn processes(usage: &crate::usage::Usage) -> HashMap<String, (usize, Option<String>)> {
    let mut m = HashMap::new();
    if usage.nvml_unavailable.is_some() {
        return m;
    }
    let mut add = |id: &str, procs: &[crate::usage::ProcessUsage]| {
        let outside = procs
            .iter()
            .find(|p| !p.unit.as_deref().is_some_and(crate::join::is_scope_name))
            .map(|p| {
                let what = p.command.as_deref().unwrap_or("?");
                match p.used_memory {
                    Some(b) => format!("pid {} ({what}) holds {} MiB", p.pid, b >> 20),
                    None => format!("pid {} ({what})", p.pid),
                }
            });
        m.insert(id.to_string(), (procs.len(), outside));
    };
    for g in &usage.gpus {
        add(&g.uuid, &g.processes);
        for d in &g.mig_devices {
            add(&d.uuid, &d.processes);
        }
    }
    m
}

/// What the choice made of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    /// The devices, in the share's order.
    pub devices: Vec<ShareDevice>,
    /// Every node the job's scope allows.
    pub allow: Vec<String>,
    /// The team that lent the devices, for a borrowed placement (its scope runs in the loans
    /// slice).
    pub lender: Option<String>,
}

impl Placed {
    /// A placement on `devices`, their nodes and the common ones allowed.
    pub fn on(devices: Vec<ShareDevice>, lender: Option<String>) -> Placed {
        let mut allow: Vec<String> = devices.iter().flat_map(|d| d.nodes.clone()).collect();
        allow.sort();
        allow.dedup();
        allow.extend(COMMON_DEVICES.iter().map(|d| d.to_string()));
        Placed {
            devices,
            allow,
            lender,
        }
    }
}

/// A placement refused: the message and whether it is "nothing free now" (a distinct exit
/// status) or a request that can never be met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// One line.
    pub message: String,
    /// Nothing free now.
    pub busy: bool,
    /// `--profile` names a profile no device of the share has, or the share has no device at
    /// all: the profiles it has. The join layer decides whether a re-slice may bring one
    /// ([`super::join`]).
    pub no_profile: Option<Vec<String>>,
}

/// What [`layout_profiles`] names a layout's whole GPU by (never a MIG profile's name).
pub const WHOLE_GPU: &str = "whole GPU";

/// Where `team` may get a device after a re-slice: (MIG profile or [`WHOLE_GPU`], `gpu[1]
/// layout "night"`) for every allowed layout ([`crate::policy::Layouts::all`], default first)
/// of each `[[gpu]]` entry that claims a GPU of this host (`host`: the observed GPUs; every
/// entry when they are not known), as [`crate::policy::Policy::usage_for`] picks the entry.
pub fn layout_profiles(
    policy: &crate::policy::Policy,
    host: Option<&[crate::observe::GpuState]>,
    team: &str,
) -> Vec<(String, String)> {
    use crate::policy::{GpuUse, Layout, DEFAULT_LAYOUT};
    let claims = |i: usize| {
        host.is_none_or(|gpus| {
            gpus.iter()
                .any(|g| policy.gpus.iter().position(|a| a.selector.matches(g)) == Some(i))
        })
    };
    let mut out = Vec::new();
    for (_, a) in policy.gpus.iter().enumerate().filter(|(i, _)| claims(*i)) {
        let layouts = match &a.layouts {
            Some(l) => l.all(&a.usage),
            None => vec![Layout {
                name: DEFAULT_LAYOUT.to_string(),
                usage: a.usage.clone(),
                when: Vec::new(),
            }],
        };
        for l in layouts {
            let at = format!("{} layout \"{}\"", a.key, l.name);
            let gives: Vec<&str> = match &l.usage {
                GpuUse::Mig(specs) => specs
                    .iter()
                    .filter(|s| *s.owner == *team && s.count > 0)
                    .map(|s| s.profile.as_str())
                    .collect(),
                GpuUse::Owned(t) if **t == *team => vec![WHOLE_GPU],
                GpuUse::Shared(ts) if ts.iter().any(|t| **t == *team) => vec![WHOLE_GPU],
                _ => Vec::new(),
            };
            for p in gives {
                if !out.iter().any(|(q, w)| q == p && *w == at) {
                    out.push((p.to_string(), at.clone()));
                }
            }
        }
    }
    out
}

/// What becomes of a request that no device of `team`'s share can ever serve now: a
/// `--profile` none of its devices has (`have`: the profiles it has), or any request of a team
/// with no device at all (`profile` `None`, `have` empty); `layouts`: [`layout_profiles`].
/// With `wait` it is queued when some layout gives the team such a device, since gpuctld may
/// re-slice a GPU into it: `Ok` says why it waits. Otherwise it is refused in words (`Err`),
/// naming what the team has and may get.
pub fn without_profile(
    team: &str,
    profile: Option<&str>,
    have: &[String],
    layouts: &[(String, String)],
    wait: bool,
) -> Result<String, String> {
    let mut at: Vec<&str> = layouts
        .iter()
        .filter(|(p, _)| profile.is_none_or(|q| p == q))
        .map(|(_, at)| at.as_str())
        .collect();
    at.dedup();
    let Some(profile) = profile else {
        let at = at.join(", ");
        return match (at.is_empty(), wait) {
            (true, _) => Err(format!(
                "team \"{team}\": the share has no devices to place a job on, and no layout of \
                 the policy gives it one"
            )),
            (false, true) => Ok(format!(
                "team {team} has no device now; waiting for a GPU to take a layout that gives \
                 it one ({at})"
            )),
            (false, false) => Err(format!(
                "team \"{team}\" has no device now; {at} gives it one: wait for a GPU to take \
                 it with --wait"
            )),
        };
    };
    let now = match have {
        [] => "it has no MIG device now".to_string(),
        h => format!("its MIG profiles now: {}", h.join(", ")),
    };
    if !at.is_empty() {
        let at = at.join(", ");
        return if wait {
            Ok(format!(
                "no {profile} device in team {team}'s share now; waiting for a GPU to take a \
                 layout that has one ({at})"
            ))
        } else {
            Err(format!(
                "team \"{team}\": no {profile} device in its share now ({now}); {at} has one: \
                 wait for a GPU to take it with --wait"
            ))
        };
    }
    let mut later: Vec<&str> = layouts
        .iter()
        .map(|(p, _)| p.as_str())
        .filter(|p| *p != WHOLE_GPU)
        .collect();
    later.sort_unstable();
    later.dedup();
    let later = match later.as_slice() {
        [] => "no layout gives it a MIG device".to_string(),
        l => format!("its layouts give it: {}", l.join(", ")),
    };
    Err(format!(
        "team \"{team}\": --profile {profile}: no device of its share has that profile, and no \
         layout of the policy gives it one ({now}; {later})"
    ))
}

/// The share as the choice sees it. A device's leases are counted whoever holds them, so
/// `jobs-per-device` caps a GPU that several teams own across those teams (docs/shell.md,
/// "Placement").
fn candidates(
    share: &[ShareDevice],
    leases: &[Lease],
    load: &HashMap<String, Load>,
) -> Vec<Candidate> {
    share
        .iter()
        .map(|d| {
            let l = load.get(&d.id).cloned().unwrap_or_default();
            Candidate {
                id: d.id.clone(),
                mig: d.mig,
                mps: d.mps.is_some(),
                held: placement::held_counts(leases, &d.id),
                memory_used: l.memory_used,
                activity: l.activity,
                outside: l.outside,
                profile: d.profile.clone(),
            }
        })
        .collect()
}

/// Choose for `opts` among `share` under `team`'s settings, with `leases` held now, never on a
/// device the health watcher took out of service ([`super::health`]).
pub fn place(
    team: &Team,
    share: &[ShareDevice],
    leases: &[Lease],
    load: &HashMap<String, Load>,
    opts: &JoinOptions,
) -> Result<Placed, Refused> {
    let out = super::health::out_of_service();
    place_in_service(team, share, leases, load, opts, &out)
}

/// [`place`] with the out-of-service devices given.
pub fn place_in_service(
    team: &Team,
    share: &[ShareDevice],
    leases: &[Lease],
    load: &HashMap<String, Load>,
    opts: &JoinOptions,
    out: &BTreeMap<String, crate::health::OutOfService>,
) -> Result<Placed, Refused> {
    let me = Waiter {
        request: opts.request(),
        passed: 0,
        returning: false,
    };
    let mut r = serve_in_service(team, share, leases, load, &[me], &[opts.gpu_memory], out);
    r.pop()
        .unwrap_or_else(|| unreachable!("one answer per request"))
}

/// What the share gives each request of `team`'s queue now, in serving order
/// ([`placement::serve`]); `gpu_memory` is each request's `--gpu-memory`.
pub fn serve_queue(
    team: &Team,
    share: &[ShareDevice],
    leases: &[Lease],
    load: &HashMap<String, Load>,
    waiting: &[Waiter],
    gpu_memory: &[Option<u64>],
) -> Vec<Result<Placed, Refused>> {
    let out = super::health::out_of_service();
    serve_in_service(team, share, leases, load, waiting, gpu_memory, &out)
}

/// [`serve_queue`] with the out-of-service devices given: they leave the share before the
/// choice, so no job lands there and none gets them in `CUDA_VISIBLE_DEVICES`. Refusals say
/// which devices are out and why, and count as "nothing free now": the device may come back,
/// so a `--wait` keeps waiting.
pub fn serve_in_service(
    team: &Team,
    share: &[ShareDevice],
    leases: &[Lease],
    load: &HashMap<String, Load>,
    waiting: &[Waiter],
    gpu_memory: &[Option<u64>],
    out: &BTreeMap<String, crate::health::OutOfService>,
) -> Vec<Result<Placed, Refused>> {
    let gone: Vec<&ShareDevice> = share.iter().filter(|d| out.contains_key(&d.id)).collect();
    if gone.is_empty() {
        return serve_among(team, share, leases, load, waiting, gpu_memory);
    }
    let why = gone
        .iter()
        .map(|d| {
            format!(
                "{} since {} ({})",
                d.id, out[&d.id].since, out[&d.id].reason
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let out_msg = |m: String| Refused {
        message: format!("{m}; out of service: {why}"),
        busy: true,
        no_profile: None,
    };
    // A position names a device of the whole share, as `gpuctl teams` numbers it: it becomes
    // the device's UUID before the out-of-service ones leave.
    let whole: Vec<Candidate> = candidates(share, &[], &HashMap::new());
    let mut named_out = vec![false; waiting.len()];
    let waiting: Vec<Waiter> = waiting
        .iter()
        .enumerate()
        .map(|(k, w)| {
            let mut w = w.clone();
            if let Some(i) = w
                .request
                .device
                .as_deref()
                .and_then(|a| placement::find_device(&whole, a))
            {
                named_out[k] = out.contains_key(&share[i].id);
                w.request.device = Some(share[i].id.clone());
            }
            w
        })
        .collect();
    let left: Vec<ShareDevice> = share
        .iter()
        .filter(|d| !out.contains_key(&d.id))
        .cloned()
        .collect();
    if left.is_empty() {
        let m = format!("team \"{}\" has no device in service", team.name);
        return waiting.iter().map(|_| Err(out_msg(m.clone()))).collect();
    }
    serve_among(team, &left, leases, load, &waiting, gpu_memory)
        .into_iter()
        .enumerate()
        .map(|(k, r)| {
            if named_out[k] {
                let asked = waiting[k].request.device.clone().unwrap_or_default();
                return Err(out_msg(format!(
                    "team \"{}\": device {asked} is out of service",
                    team.name
                )));
            }
            // A profile that no device has, in service or out, is not one that may come back.
            let asked = waiting[k].request.profile.as_ref();
            r.map_err(|r| match r.no_profile {
                Some(_) if !gone.iter().any(|d| d.profile.as_ref() == asked) => r,
                _ => out_msg(r.message),
            })
        })
        .collect()
}

fn serve_among(
    team: &Team,
    share: &[ShareDevice],
    leases: &[Lease],
    load: &HashMap<String, Load>,
    waiting: &[Waiter],
    gpu_memory: &[Option<u64>],
) -> Vec<Result<Placed, Refused>> {
    let cands = candidates(share, leases, load);
    let jpd = team.placement.jobs_per_device.filter(|n| *n > 0);
    placement::serve(&cands, waiting, team.placement.gpus, jpd)
        .into_iter()
        .enumerate()
        .map(|(k, r)| {
            let picked = r.map_err(|e| refused(team, share, leases, &cands, jpd, e))?;
            let devices: Vec<ShareDevice> = picked.iter().map(|i| share[*i].clone()).collect();
            let cap = gpu_memory.get(k).copied().flatten();
            check_gpu_memory(team, &devices, cap.or(team.placement.gpu_memory))?;
            Ok(Placed::on(devices, None))
        })
        .collect()
}

/// A refusal in words: for "nothing free", who holds the devices and how many are kept for
/// requests ahead in the queue.
fn refused(
    team: &Team,
    share: &[ShareDevice],
    leases: &[Lease],
    cands: &[Candidate],
    jpd: Option<u32>,
    e: PlaceError,
) -> Refused {
    let busy = matches!(e, PlaceError::Busy { .. });
    let no_profile = match &e {
        PlaceError::NoProfile { have, .. } => Some(have.clone()),
        // Nothing at all: like a missing profile, only a re-slice may bring one.
        PlaceError::Empty => Some(Vec::new()),
        _ => None,
    };
    let mut message = format!("team \"{}\": {e}", team.name);
    if let PlaceError::Busy { full, .. } = &e {
        let ids: Vec<&str> = full.iter().map(|i| share[*i].id.as_str()).collect();
        let per = match jpd {
            Some(n) => format!("{n} job(s) per device"),
            None => "1 job per device".into(),
        };
        // Full in the walk of the queue but not by the leases: taken by or kept for requests
        // ahead.
        let kept = full
            .iter()
            .filter(|i| {
                placement::capacity(jpd, &cands[**i]).is_some_and(|c| cands[**i].taken() < c)
            })
            .count();
        let ahead = match kept {
            0 => String::new(),
            n => format!("; {n} kept for requests ahead in the queue"),
        };
        // A device taken by a process gpuctl did not start: who, so that it can be found.
        let outside: String = full
            .iter()
            .filter(|i| !cands[**i].mps)
            .filter_map(|i| {
                let why = cands[*i].outside.as_deref()?;
                Some(format!(
                    "; {} is busy: {why}, outside every lease",
                    cands[*i].id
                ))
            })
            .collect();
        message = format!(
            "team \"{}\" has no free device ({per}); held: {}{outside}{ahead}. Wait with \
             --wait, or ask a holder",
            team.name,
            placement::holders(leases, &ids, &team.name)
        );
    }
    Refused {
        message,
        busy,
        no_profile,
    }
}

/// A job's GPU memory cap is enforced only by an MPS server (the client's pinned device memory
/// limit), and never above the server's own limit.
fn check_gpu_memory(team: &Team, devices: &[ShareDevice], cap: Option<u64>) -> Result<(), Refused> {
    let Some(cap) = cap else { return Ok(()) };
    let refuse = |m: String| Refused {
        message: format!("team \"{}\": --gpu-memory: {m}", team.name),
        busy: false,
        no_profile: None,
    };
    if let Some(d) = devices.iter().find(|d| d.mps.is_none()) {
        return Err(refuse(format!(
            "{} has no MPS daemon, and without one nothing can enforce a job's GPU memory \
             (limit it in the job itself, e.g. torch.cuda.set_per_process_memory_fraction)",
            d.id
        )));
    }
    let daemon = team.mps.as_ref().and_then(|m| m.pinned_memory_limit);
    if let Some(d) = daemon.filter(|d| cap > *d) {
        return Err(refuse(format!(
            "{cap} bytes is above the MPS daemon's own limit of {d} bytes \
             (mps.pinned-memory-limit)"
        )));
    }
    Ok(())
}

/// The placed job's environment: the team's, with only the placed devices, the placed
/// device's MPS directories, the memory cap, and `GPUCTL_CDI_DEVICE`: the placed devices'
/// CDI names (`gpuctl.io/team=<team>.<UUID>`, [`crate::cdi::device_of`]), space-separated when
/// there are several, so `podman run --device "$GPUCTL_CDI_DEVICE"` gives a container the
/// job's own device.
pub fn placed_env(
    team: &str,
    team_env: &BTreeMap<String, String>,
    placed: &Placed,
    gpu_memory: Option<u64>,
) -> BTreeMap<String, String> {
    let mut env = team_env.clone();
    let ids: Vec<&str> = placed.devices.iter().map(|d| d.id.as_str()).collect();
    let list = ids.join(",");
    env.insert("CUDA_VISIBLE_DEVICES".into(), list.clone());
    env.insert("NVIDIA_VISIBLE_DEVICES".into(), list);
    let cdi: Vec<String> = ids
        .iter()
        .map(|id| crate::cdi::device_name(&crate::cdi::device_of(team, id)))
        .collect();
    env.insert(CDI_DEVICE.into(), cdi.join(" "));
    if let Some(lender) = &placed.lender {
        // The lender's CDI spec is not the borrower's to read: no container device.
        env.remove(CDI_DEVICE);
        env.insert("GPUCTL_BORROWED_FROM".into(), lender.clone());
    }
    env.remove("GPUCTL_DEVICES");
    for k in [
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_LOG_DIRECTORY",
        "GPUCTL_MPS_INSTANCES",
    ] {
        env.remove(k);
    }
    if let Some(inst) = placed.devices.first().and_then(|d| d.mps.as_deref()) {
        env.insert(
            "CUDA_MPS_PIPE_DIRECTORY".into(),
            crate::paths::mps_pipe_dir(inst),
        );
        env.insert(
            "CUDA_MPS_LOG_DIRECTORY".into(),
            crate::paths::mps_log_dir(inst),
        );
        env.insert("GPUCTL_MPS_INSTANCES".into(), inst.to_string());
        if let Some(b) = gpu_memory {
            // "<device>=<limit>" per device the client sees (NVIDIA's MPS documentation,
            // CUDA_MPS_PINNED_DEVICE_MEM_LIMIT); the job sees only its devices, as 0..n.
            let per: Vec<String> = (0..placed.devices.len())
                .map(|i| format!("{i}={}M", b.div_ceil(1 << 20)))
                .collect();
            env.insert("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), per.join(","));
        }
    }
    env
}

#[cfg(test)]
mod tests;
