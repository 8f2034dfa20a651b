//! The daemon side of `gpuctl shell`, `run`, `env` and `teams`: `Join`, `Env` and `Teams`.
//!
//! Identity comes only from the bus daemon (`GetConnectionCredentials` on the message's sender):
//! uid, groups, and the pid of the process that opened the connection. The message body carries
//! nothing but the team name, so a client cannot name someone else's process or claim a uid.
//!
//! Placement moves exactly the connection's own process into a new transient scope in
//! `gpu-<team>.slice`. bookworm's bus (dbus-daemon 1.14) offers no `ProcessFD` and systemd 252
//! takes no `PIDFDs`, so the pid is pinned here instead: the daemon opens a pidfd, checks every
//! uid of `/proc/<pid>` against the caller's, moves the pid, and checks again with the pidfd
//! still alive. A live pidfd means the pid was never recycled in between, so the process moved
//! is the process checked. Where the bus does hand out a `ProcessFD`, that fd is used instead
//! of opening one.
//!
//! A live pidfd does not stop the pid *number* being reused after the process exits, so before
//! the move the daemon records where the process is ([`record_origin`]: its unit through
//! `GetUnitByPIDFD`, systemd ≥ 249, else `GetUnitByPID`, and its cgroup), and when the
//! after-check fails it attaches whatever now has that pid in the new scope back there
//! (`AttachProcessesToUnit`, systemd ≥ 238) instead of leaving it in the team's slice.
//! Versions: `PIDFDs` in `StartTransientUnit` (systemd ≥ 253) would close the window entirely and
//! `ProcessFD` in `GetConnectionCredentials` (dbus-broker, dbus-daemon ≥ 1.15.7) pins the caller;
//! Debian bookworm has systemd 252 and dbus-daemon 1.14, so the daemon uses `GetUnitByPIDFD` and
//! its own pidfd there, and `ProcessFD` wherever the bus offers it.

use super::place::{self, JoinOptions};
use super::reply::TeamInfo;
use super::Backend;
use crate::join::{
    self, check_team_name, nss::Nss, parse_env_file, scope_name, verify_process, Caller,
    ProcIdentity, Refusal, Via,
};
use crate::paths::Root;
use crate::placement::Lease;
use crate::placement::Waiter;
use crate::policy::TeamName;
use crate::systemd::scope::{call_manager, string_property, JobWaiter};
use crate::systemd::{props, Systemd, SystemdError};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use tracing::{info, warn};
use zbus::message::Header;
use zbus::{fdo, Connection};

/// Errors of the join methods. The D-Bus name (`org.gpuctl.Agent1.Error.<Variant>`) is what
/// `gpuctl` maps to its exit codes; the message is the one line it prints.
#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "org.gpuctl.Agent1.Error")]
pub enum JoinError {
    /// A bus-level failure.
    #[zbus(error)]
    ZBus(zbus::Error),
    /// Not a valid team name.
    InvalidTeamName(String),
    /// No such team.
    UnknownTeam(String),
    /// The caller is not a member.
    NotMember(String),
    /// The team has no devices now.
    NoDevices(String),
    /// The process to move is not the caller's.
    NotYourProcess(String),
    /// No valid policy loaded yet.
    NoPolicy(String),
    /// Authorized, but systemd could not place the process.
    PlacementFailed(String),
    /// Every device the job could have is held to capacity now; the message names the holders.
    NoFreeDevice(String),
    /// The placement asked for can never be met (two MIG devices, a device outside the share,
    /// a memory cap nothing enforces), or an option is unknown.
    PlacementRefused(String),
}

/// The outcome label of a `Join` result for metrics: `ok` or the refusal's kind.
pub fn outcome<T>(r: &Result<T, JoinError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(JoinError::ZBus(_)) => "bus-error",
        Err(JoinError::InvalidTeamName(_)) => "invalid-team-name",
        Err(JoinError::UnknownTeam(_)) => "unknown-team",
        Err(JoinError::NotMember(_)) => "not-member",
        Err(JoinError::NoDevices(_)) => "no-devices",
        Err(JoinError::NotYourProcess(_)) => "not-your-process",
        Err(JoinError::NoPolicy(_)) => "no-policy",
        Err(JoinError::PlacementFailed(_)) => "placement-failed",
        Err(JoinError::NoFreeDevice(_)) => "no-free-device",
        Err(JoinError::PlacementRefused(_)) => "placement-refused",
    }
}

impl From<Refusal> for JoinError {
    fn from(r: Refusal) -> Self {
        let m = r.to_string();
        match r {
            Refusal::BadTeamName { .. } => JoinError::InvalidTeamName(m),
            Refusal::UnknownTeam { .. } => JoinError::UnknownTeam(m),
            Refusal::NotMember { .. } => JoinError::NotMember(m),
            Refusal::NoDevices { .. } => JoinError::NoDevices(m),
            Refusal::NotYourProcess { .. } => JoinError::NotYourProcess(m),
            Refusal::NoPolicy(_) => JoinError::NoPolicy(m),
        }
    }
}

impl From<fdo::Error> for JoinError {
    fn from(e: fdo::Error) -> Self {
        JoinError::ZBus(zbus::Error::FDO(Box::new(e)))
    }
}

/// The caller's credentials from the bus, with the process fd when the bus offers one.
pub struct BusCaller {
    /// uid, pid, groups.
    pub caller: Caller,
    /// `ProcessFD` (a pidfd), where the bus daemon supports it.
    pub pidfd: Option<OwnedFd>,
}

/// Ask the bus daemon who sent `hdr`.
pub async fn bus_caller(conn: &Connection, hdr: &Header<'_>) -> Result<BusCaller, JoinError> {
    let sender = hdr
        .sender()
        .ok_or_else(|| fdo::Error::AccessDenied("message has no sender".into()))?;
    let creds = fdo::DBusProxy::new(conn)
        .await?
        .get_connection_credentials(sender.clone().into())
        .await?;
    let uid = creds
        .unix_user_id()
        .ok_or_else(|| fdo::Error::AccessDenied(format!("the bus reports no uid for {sender}")))?;
    let pidfd = creds
        .process_fd()
        .and_then(|fd| std::os::fd::AsFd::as_fd(fd).try_clone_to_owned().ok());
    let caller = Caller {
        uid,
        pid: creds.process_id(),
        gids: creds.unix_group_ids().cloned(),
    };
    Ok(BusCaller { caller, pidfd })
}

/// Authorize on a blocking thread: NSS may be LDAP or SSSD, and the runtime thread also serves
/// the watchdog and every other caller.
async fn authorize(
    backend: &dyn Backend,
    caller: &Caller,
    team: &TeamName,
) -> Result<join::Grant, Refusal> {
    let policy = backend.policy()?;
    let (c, t) = (caller.clone(), team.clone());
    tokio::task::spawn_blocking(move || join::authorize(&c, &policy, &t, &Nss))
        .await
        .map_err(|e| Refusal::NoPolicy(format!("authorization task failed: {e}")))?
}

/// The team's environment as the daemon last wrote it. Refused only when the policy gives the
/// team devices that are missing now ([`join::check_devices`]), or when gpuctld has not written
/// the team's env file yet.
pub fn team_env(
    root: &Root,
    policy: &crate::policy::Policy,
    team: &TeamName,
) -> Result<BTreeMap<String, String>, Refusal> {
    let path = join::team_env_path(team);
    let text = std::fs::read_to_string(root.join(&path)).map_err(|e| Refusal::NoDevices {
        team: team.to_string(),
        missing: vec![format!(
            "its view: {path}: {e} (gpuctld has not configured the team yet)"
        )],
    })?;
    let env = parse_env_file(&text);
    join::check_devices(&env, policy, team)?;
    Ok(env)
}

/// `Env(team)`: the environment of a team the caller may use.
pub async fn env(
    backend: &dyn Backend,
    root: &Root,
    conn: &Connection,
    hdr: &Header<'_>,
    team: &str,
) -> Result<HashMap<String, String>, JoinError> {
    let team = &check_team_name(team)?;
    let bc = bus_caller(conn, hdr).await?;
    authorize(backend, &bc.caller, team).await?;
    let policy = backend.policy()?;
    Ok(team_env(root, &policy, team)?.into_iter().collect())
}

/// `Teams()`: JSON array of the teams the caller may use and what each gives.
pub async fn teams(
    backend: &dyn Backend,
    sd: &Systemd,
    root: &Root,
    conn: &Connection,
    hdr: &Header<'_>,
) -> Result<String, JoinError> {
    let c = bus_caller(conn, hdr).await?.caller;
    let policy = backend.policy()?;
    let state = backend.state();
    let view = state.last_report.as_ref().and_then(|r| r.view.as_ref());
    // Shown as "not available" (no holds) when systemd cannot list them, not as all free.
    let leases = place::leases(sd, root).await.ok();
    let p = policy.clone();
    let mine: Vec<(String, Via)> =
        tokio::task::spawn_blocking(move || join::joinable(&c, &p, &Nss))
            .await
            .map_err(|e| fdo::Error::Failed(format!("authorization task failed: {e}")))?;
    let out: Vec<TeamInfo> = mine
        .into_iter()
        .map(|(name, via)| {
            let t = &policy.teams[name.as_str()];
            // Names in a validated policy are team names; parsing cannot fail here.
            let env = name
                .parse()
                .ok()
                .and_then(|t: TeamName| team_env(root, &policy, &t).ok());
            TeamInfo {
                slice: props::slice_unit(&name),
                devices: env
                    .as_ref()
                    .and_then(|e| e.get("CUDA_VISIBLE_DEVICES").cloned()),
                env,
                limits: t.limits.clone(),
                mps: t.mps.clone(),
                members: t.members.iter().map(ToString::to_string).collect(),
                share: match (view, &leases) {
                    (Some(v), Some(l)) => place::holds(
                        t,
                        &place::share(v, &name),
                        l,
                        &super::health::out_of_service(),
                    ),
                    _ => Vec::new(),
                },
                team: name,
                via,
            }
        })
        .collect();
    serde_json::to_string(&out).map_err(|e| JoinError::ZBus(zbus::Error::Failure(e.to_string())))
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no memory is shared.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid as nix::libc::pid_t, 0) };
    // SAFETY: a non-negative return is a fresh fd that nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether the process behind `pidfd` still runs (signal 0 through the pidfd: ESRCH once it
/// has exited, however the pid number is reused meanwhile).
fn pidfd_alive(pidfd: &OwnedFd) -> bool {
    // SAFETY: pidfd_send_signal with signal 0 and no siginfo only checks the target.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<u8>(),
            0,
        )
    };
    r == 0
}

/// The pid a pidfd refers to (`Pid:` in its fdinfo).
fn pid_of_pidfd(pidfd: &OwnedFd) -> Option<u32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("Pid:"))?
        .trim()
        .parse()
        .ok()
}

/// Where `pid` (pinned by `pidfd`) is now: its unit and its cgroup relative to that unit.
/// `GetUnitByPIDFD` (systemd ≥ 249) answers for the process behind the fd, never another that
/// took its number; older systemd gets `GetUnitByPID`.
pub async fn record_origin(
    conn: &Connection,
    root: &Root,
    pid: u32,
    pidfd: &OwnedFd,
) -> Option<join::cgroup::Origin> {
    let cgroup = join::cgroup::read_proc_cgroup(root, pid)?;
    let fd = zbus::zvariant::Fd::from(std::os::fd::AsFd::as_fd(pidfd));
    let by_fd = call_manager(conn, "GetUnitByPIDFD", &(fd,))
        .await
        .ok()
        .and_then(|m| {
            m.body()
                .deserialize::<(zbus::zvariant::OwnedObjectPath, String, Vec<u8>)>()
                .ok()
        });
    let (path, unit, by_pidfd) = match by_fd {
        Some((p, id, _)) => (p.to_string(), id, true),
        None => {
            let m = call_manager(conn, "GetUnitByPID", &(pid,)).await.ok()?;
            let p: zbus::zvariant::OwnedObjectPath = m.body().deserialize().ok()?;
            let id = string_property(conn, p.as_str(), "org.freedesktop.systemd1.Unit", "Id")
                .await
                .ok()?;
            (p.to_string(), id, false)
        }
    };
    let iface = join::cgroup::unit_interface(&unit)?;
    let unit_cgroup = string_property(conn, &path, iface, "ControlGroup")
        .await
        .ok()?;
    let subcgroup = join::cgroup::subcgroup(&unit_cgroup, &cgroup)?;
    Some(join::cgroup::Origin {
        unit,
        subcgroup,
        by_pidfd,
    })
}

/// After a failed after-check: attach the process that has `pid` now, if it sits in `scope`,
/// back to `origin`. Returns what was done, for the journal.
async fn put_back(
    conn: &Connection,
    root: &Root,
    pid: u32,
    scope: &str,
    origin: Option<&join::cgroup::Origin>,
) -> String {
    let now = join::cgroup::read_proc_cgroup(root, pid);
    let o = match join::cgroup::put_back_target(pid, now.as_deref(), scope, origin) {
        Ok(o) => o,
        Err(why) => return why,
    };
    let args = (o.unit.as_str(), o.subcgroup.as_str(), vec![pid]);
    match call_manager(conn, "AttachProcessesToUnit", &args).await {
        Ok(_) => format!("pid {pid} put back into {}{}", o.unit, o.subcgroup),
        Err(e) => format!(
            "pid {pid} stays in {scope}: putting it back into {} failed: {e}",
            o.unit
        ),
    }
}

/// What a `Join` needs from the agent besides the caller.
pub struct JoinCtx<'a> {
    /// The daemon's state and policy.
    pub backend: &'a dyn Backend,
    /// systemd.
    pub sd: &'a Systemd,
    /// The shared job waiter.
    pub jobs: &'a JobWaiter,
    /// Held from reading the leases until the new scope exists, so two joins never pick the
    /// same free device.
    pub placing: &'a tokio::sync::Mutex<()>,
    /// The host root.
    pub root: &'a Root,
    /// Requests waiting for a free device (`--wait`).
    pub queue: &'a std::sync::Mutex<super::queue::Queues>,
    /// Signalled when a waiting request leaves the queue or another is found a device.
    pub queue_changed: &'a tokio::sync::Notify,
}

impl JoinCtx<'_> {
    fn loans(&self) -> super::loans::Cx<'_> {
        super::loans::Cx {
            backend: self.backend,
            sd: self.sd,
            root: self.root,
            placing: self.placing,
            queue: self.queue,
            queue_changed: self.queue_changed,
        }
    }

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, super::queue::Queues> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keep the queue where a restarted gpuctld finds it ([`super::queue`]); a failure costs
    /// only the places after a restart, so it is logged, not returned.
    fn save_queue(&self) {
        let saved = self.lock_queue().saved();
        if let Err(e) = save_queue(self.root, &saved) {
            warn!("{e}");
        }
    }
}

/// Where the `--wait` queue is kept across a gpuctld restart: a directory only root reads,
/// since the entries name users and teams.
pub const QUEUE_FILE: &str = "/run/gpuctl/queue/waiting.json";

/// Set once gpuctld is stopping: the waiters' calls are dropped with the runtime, and their
/// leaving must not empty the file the next gpuctld restores them from.
static KEEP_QUEUE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// gpuctld is stopping: keep the queue file as it is.
pub fn keep_queue() {
    KEEP_QUEUE.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Write the queue's state file.
pub fn save_queue(
    root: &Root,
    saved: &[super::queue::Saved],
) -> Result<(), crate::files::FileError> {
    use std::os::unix::fs::DirBuilderExt;
    if KEEP_QUEUE.load(std::sync::atomic::Ordering::SeqCst) {
        return Ok(());
    }
    let path = root.join(QUEUE_FILE);
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| crate::files::FileError::new(dir, e))?;
    }
    let text = serde_json::to_vec(saved).unwrap_or_default();
    crate::files::write_atomic(&path, &text)
}

/// The queue a previous gpuctld left, if it left one that reads.
pub fn load_queue(root: &Root) -> Vec<super::queue::Saved> {
    std::fs::read(root.join(QUEUE_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// `Join(team)` / `JoinWith(team, options)`: authorize the caller, place the job on devices of
/// the team's share (unless the team sets `jobs-per-device = 0` and the job asks for nothing),
/// move its own process into a new scope in the team's slice fenced to those devices, and
/// return the job's environment and the scope's name.
pub async fn join(
    cx: &JoinCtx<'_>,
    conn: &Connection,
    hdr: &Header<'_>,
    team: &str,
    options: &HashMap<String, String>,
) -> Result<(HashMap<String, String>, String), JoinError> {
    let (backend, sd, jobs, root) = (cx.backend, cx.sd, cx.jobs, cx.root);
    let team = &check_team_name(team)?;
    let opts =
        JoinOptions::parse(options).map_err(|e| JoinError::PlacementRefused(e.to_string()))?;
    let bc = bus_caller(conn, hdr).await?;
    let uid = bc.caller.uid;
    let grant = match authorize(backend, &bc.caller, team).await {
        Ok(g) => g,
        Err(r) => {
            if let Some(held_back) = crate::ratelimit::refusal_log() {
                info!(gpuctl_team = %team, gpuctl_action = "join-refused", uid, held_back, "{r}");
            }
            return Err(r.into());
        }
    };
    let policy = backend.policy()?;
    let env = team_env(root, &policy, team)?;

    // Pin the process before looking at it: with a pidfd held, its pid cannot be reused.
    let (pid, pidfd) = match bc.pidfd {
        Some(fd) => (pid_of_pidfd(&fd).or(bc.caller.pid), Some(fd)),
        None => (bc.caller.pid, bc.caller.pid.and_then(pidfd_open)),
    };
    let Some(pid) = pid else {
        return Err(JoinError::NotYourProcess(format!(
            "the bus reports no process id for uid {uid}; cannot place it"
        )));
    };
    let Some(pidfd) = pidfd else {
        return Err(Refusal::NotYourProcess {
            pid,
            why: "it has exited (no pidfd)".into(),
        }
        .into());
    };
    let before = ProcIdentity::read(root, pid)?;
    if let Err(r) = verify_process(uid, &before) {
        if let Some(held_back) = crate::ratelimit::refusal_log() {
            warn!(gpuctl_team = %team, gpuctl_action = "join-refused", uid, pid, held_back, "{r}");
        }
        return Err(r.into());
    }

    // A slice that gpuctld has not configured would be an implicit one without a device
    // filter: placing anyone there would hand out every GPU.
    let slice = props::slice_unit(team);
    let unplaceable = match sd.slice_device_policy(&slice).await {
        Ok(p) if p == "closed" => None,
        Ok(p) => Some(format!(
            "{slice} is not under gpuctl's device control yet (DevicePolicy={p}); \
             gpuctld has not configured team \"{team}\""
        )),
        Err(SystemdError::Bus { source, .. }) => Some(format!("{slice}: {source}")),
        Err(e) => Some(e.to_string()),
    };
    if let Some(why) = unplaceable {
        return Err(JoinError::PlacementFailed(why));
    }

    let id = lease_id().map_err(|e| {
        JoinError::PlacementFailed(format!("cannot make an id for the job's scope: {e}"))
    })?;
    let scope = scope_name(&id);
    let t = policy
        .teams
        .get(&**team)
        .ok_or_else(|| JoinError::NoPolicy(format!("team \"{team}\" left the policy")))?;
    // A device-less team is joinable as before: nothing to place on.
    let placing = !opts.is_empty() || (t.placement.enabled() && join::has_devices(&env));
    let (_placing, placed) = if placing {
        let (guard, p) = place_or_wait(cx, conn, t, &opts, uid, pid, &pidfd).await?;
        (Some(guard), Some(p))
    } else {
        (None, None)
    };
    let (slice, limits) = scope_slice(sd, root, t, placed.as_ref(), slice).await?;
    // Recorded after the checks and right before the move, to put back what the after-check
    // rejects.
    let origin = record_origin(conn, root, pid, &pidfd).await;
    let (env, allow, lease) = if let Some(p) = placed {
        let lease = Lease {
            unit: scope.clone(),
            team: team.to_string(),
            user: grant.user.clone(),
            uid,
            pid,
            devices: p.devices.iter().map(|d| d.id.clone()).collect(),
            since: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            gpu_memory: opts.gpu_memory.or(t.placement.gpu_memory),
            borrowed_from: p.lender.clone(),
        };
        let env = place::placed_env(team, &env, &p, lease.gpu_memory);
        (env, Some(p.allow), Some(lease))
    } else {
        let mut env = env;
        if join::has_devices(&env) {
            env.insert(place::CDI_DEVICE.into(), crate::cdi::device_name(team));
        }
        (env, None, None)
    };
    // Recorded before the scope exists: a crash in between leaves a record of no live scope
    // (ignored), never a placed job whose devices look free.
    if let Some(l) = &lease {
        place::store::write(root, l).map_err(|e| {
            JoinError::PlacementFailed(format!("cannot record the lease of {scope}: {e}"))
        })?;
    }
    let description = join::scope_description(&id);
    if let Err(e) = sd
        .start_scope(
            jobs,
            &scope,
            &slice,
            pid,
            description,
            allow.as_deref(),
            limits,
        )
        .await
    {
        if lease.is_some() {
            place::store::remove(root, &scope);
        }
        return Err(JoinError::PlacementFailed(format!(
            "cannot place pid {pid} of {} in {slice}: {e}",
            grant.user
        )));
    }
    drop(_placing);
    let after = ProcIdentity::read(root, pid);
    if !pidfd_alive(&pidfd) || after.as_ref().ok() != Some(&before) {
        // The checked process is gone: the pid may now be someone else's. Nothing is killed
        // (never kill a job); whatever has the pid now goes back where the pid was.
        let done = put_back(conn, root, pid, &scope, origin.as_ref()).await;
        if lease.is_some() {
            place::store::remove(root, &scope);
        }
        warn!(
            gpuctl_team = %team,
            gpuctl_action = "join-raced",
            uid,
            pid,
            "pid {pid} exited or changed while being placed in {scope}: {done}"
        );
        return Err(JoinError::NotYourProcess(format!(
            "pid {pid}: the process changed while it was placed in {scope}"
        )));
    }
    match &lease {
        Some(l) => info!(
            gpuctl_team = %team,
            gpuctl_action = "lease",
            gpuctl_unit = %scope,
            gpuctl_devices = %l.devices.join(","),
            uid,
            pid,
            "{} joined team {team} ({}) as {scope} on {}",
            grant.user,
            grant.via,
            l.devices.join(",")
        ),
        None => info!(
            gpuctl_team = %team,
            gpuctl_action = "join",
            uid,
            pid,
            "{} joined team {team} ({}) as {scope}",
            grant.user,
            grant.via
        ),
    }
    Ok((env.into_iter().collect(), scope))
}

/// The slice a job's scope goes in, and limits of its own. A borrowed job runs in the loans
/// slice (closed, or nothing is placed there), with its own team's limits on its scope, since it
/// is outside the team's slice; any other in `slice`, its team's.
async fn scope_slice(
    sd: &Systemd,
    root: &Root,
    team: &crate::policy::Team,
    placed: Option<&place::Placed>,
    slice: String,
) -> Result<(String, Vec<(&'static str, zbus::zvariant::Value<'static>)>), JoinError> {
    let Some(lender) = placed.and_then(|p| p.lender.as_deref()) else {
        return Ok((slice, Vec::new()));
    };
    let loans = props::slice_unit(crate::names::LOANS);
    match sd.slice_device_policy(&loans).await {
        Ok(p) if p == "closed" => {}
        r => {
            return Err(JoinError::PlacementFailed(format!(
                "{loans} is not under gpuctl's device control ({}); cannot place a job on team \
                 {lender}'s lent device",
                match r {
                    Ok(p) => format!("DevicePolicy={p}"),
                    Err(e) => e.to_string(),
                }
            )))
        }
    }
    let host = crate::real::procfs::host_info(root);
    let spec = team.limits.resolve(host.memory_bytes);
    Ok((
        loans,
        spec.bus_changes(&crate::settings::SliceSpec::default()),
    ))
}

/// A member scope's opaque id: 64 random bits in hex. Its scope's name and description are
/// readable by every local user; the id says nothing of the job (not even its order).
fn lease_id() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Place the job, or with `--wait` queue it (round-robin across users, [`super::queue`]) and
/// look again whenever a device may have freed: every [`WAIT_TICK`] the first waiter of the team
/// looks for everyone ([`place::serve_queue`]: a request that cannot be served holds back
/// nobody a free device can serve) and the waiters it finds a device for look for themselves.
/// A client that asks again after a gpuctld restart takes back its place. Returns the
/// placement lock still held, so the devices are taken before anyone else looks.
async fn place_or_wait<'a>(
    cx: &'a JoinCtx<'_>,
    conn: &Connection,
    team: &crate::policy::Team,
    opts: &JoinOptions,
    uid: u32,
    pid: u32,
    pidfd: &OwnedFd,
) -> Result<(tokio::sync::MutexGuard<'a, ()>, place::Placed), JoinError> {
    let started = std::time::Instant::now();
    let mut limit = opts.wait.unwrap_or_default();
    let borrow = opts.borrow.unwrap_or(team.borrow);
    // Told once that a loan is coming back for it.
    let mut told_coming = false;
    let mut waiting = opts
        .wait
        .and_then(|_| Waiting::attach(cx, &team.name, uid, pid));
    if let Some(w) = &waiting {
        info!(
            gpuctl_team = %team.name,
            gpuctl_action = "queue-returned",
            uid,
            "uid {uid}'s request is back in its place {} after a restart",
            w.position()
        );
    }
    let mut last = String::new();
    loop {
        if cx.lock_queue().expire(std::time::Instant::now()) {
            cx.save_queue();
        }
        let look = waiting
            .as_ref()
            .is_none_or(|w| w.is_head() || w.is_granted());
        if look {
            let usage = placement_usage(cx).await;
            let guard = cx.placing.lock().await;
            let Some(mut snap) =
                snapshot(cx.backend, cx.sd, cx.root, team, usage.as_deref()).await?
            else {
                // A gpuctld that has just started (the waiters of the last one ask again at
                // once) has no share yet: a request that may wait does.
                const STARTING: &str = "gpuctld has not finished its first reconcile";
                if opts.wait.is_none() {
                    return Err(JoinError::PlacementFailed(STARTING.into()));
                }
                if waiting.is_none() {
                    waiting = Some(
                        Waiting::new(cx, &team.name, uid, pid, opts.request(), borrow).map_err(
                            |e| JoinError::NoFreeDevice(format!("{STARTING}; cannot wait: {e}")),
                        )?,
                    );
                }
                last = STARTING.into();
                drop(guard);
                tokio::time::sleep(WAIT_TICK).await;
                continue;
            };
            let entries = cx.lock_queue().entries(&team.name);
            let mut waiters: Vec<Waiter> = entries
                .iter()
                .map(|e| Waiter {
                    request: e.request.clone(),
                    passed: e.passed,
                    returning: e.returning,
                })
                .collect();
            let mut memory = vec![None; waiters.len()];
            let mine = match &waiting {
                Some(w) => entries
                    .iter()
                    .position(|e| e.ticket == w.ticket)
                    .inspect(|i| {
                        memory[*i] = opts.gpu_memory;
                    }),
                None => {
                    waiters.push(Waiter {
                        request: opts.request(),
                        passed: 0,
                        returning: false,
                    });
                    memory.push(opts.gpu_memory);
                    Some(waiters.len() - 1)
                }
            };
            let Some(mine) = mine else {
                return Err(JoinError::PlacementFailed(
                    "the request left the queue while it waited".into(),
                ));
            };
            let results = place::serve_queue(
                team,
                &snap.share,
                &snap.leases,
                &snap.load,
                &waiters,
                &memory,
            );
            let served: BTreeSet<super::queue::Ticket> = entries
                .iter()
                .zip(&results)
                .filter(|(_, r)| r.is_ok())
                .map(|(e, _)| e.ticket)
                .collect();
            if let Some(w) = waiting.as_ref().filter(|w| w.is_head()) {
                let others = served.iter().any(|t| *t != w.ticket);
                let reasons = profile_reasons(cx, &team.name, &entries, &results);
                let mut q = cx.lock_queue();
                q.grant(&team.name, served.clone());
                q.set_reasons(&team.name, &reasons);
                drop(q);
                if others {
                    cx.queue_changed.notify_waiters();
                }
            }
            let ask = Ask {
                team,
                opts,
                uid,
                pid,
                borrow,
            };
            match results.into_iter().nth(mine) {
                Some(Ok(p)) => {
                    // Those ahead that this look did not serve were passed over once more.
                    let ahead: BTreeSet<super::queue::Ticket> = entries
                        .iter()
                        .take(mine)
                        .filter(|e| !served.contains(&e.ticket))
                        .map(|e| e.ticket)
                        .collect();
                    cx.lock_queue().passed_over(&team.name, &ahead);
                    if waiting.is_some() {
                        placed_after_wait(&team.name, uid, &p, started.elapsed());
                    }
                    return Ok((guard, p));
                }
                Some(Err(r)) if r.busy => {
                    let leases = std::mem::take(&mut snap.leases);
                    let lent = from_loans(cx, conn, &ask, &mut waiting, leases, usage.as_deref());
                    let (message, coming_back) = match lent.await? {
                        Lent::Placed(p) => {
                            if waiting.is_some() {
                                placed_after_wait(&team.name, uid, &p, started.elapsed());
                            }
                            return Ok((guard, p));
                        }
                        Lent::Wait(why, coming) => (format!("{}{why}", r.message), coming),
                    };
                    if let Some(left) = coming_back {
                        // Wait for it: at most the reclaim's grace and the start.
                        limit = limit.max(started.elapsed() + left);
                        if !told_coming {
                            told_coming = true;
                            let text = format!(
                                "gpuctl: your job of team {} waits for a lent device to come \
                                 back: {message}",
                                team.name
                            );
                            let root = cx.root.clone();
                            let _ = tokio::task::spawn_blocking(move || {
                                crate::real::tty::tell(&root, uid, &text)
                            })
                            .await;
                        }
                    } else if opts.wait.is_none() {
                        return Err(JoinError::NoFreeDevice(message));
                    }
                    if waiting.is_none() {
                        waiting = Some(queue_with(cx, &ask, &message, None)?);
                    }
                    last = message;
                }
                Some(Err(r)) if r.no_profile.is_some() => {
                    // No device of the profile at all: only a re-slice can bring one.
                    let have = r.no_profile.unwrap_or_default();
                    let layouts = layouts_for(cx, &team.name);
                    let why = place::without_profile(
                        &team.name,
                        opts.profile.as_deref(),
                        &have,
                        &layouts,
                        opts.wait.is_some(),
                    )
                    .map_err(JoinError::PlacementRefused)?;
                    if waiting.is_none() {
                        waiting = Some(queue_with(cx, &ask, &why, Some(&why))?);
                    }
                    last = why;
                }
                Some(Err(r)) => return Err(JoinError::PlacementRefused(r.message)),
                None => unreachable!("one answer per request"),
            }
        }
        if started.elapsed() >= limit {
            return Err(JoinError::NoFreeDevice(format!(
                "waited {} ms: {last}",
                started.elapsed().as_millis()
            )));
        }
        if !pidfd_alive(pidfd) {
            return Err(JoinError::NotYourProcess(
                "the waiting process has exited".into(),
            ));
        }
        let left = limit.saturating_sub(started.elapsed());
        tokio::select! {
            _ = cx.queue_changed.notified() => {}
            _ = tokio::time::sleep(WAIT_TICK.min(left)) => {}
        }
    }
}

/// [`place::layout_profiles`] of `team` under the policy now and the GPUs of the last
/// reconcile (none without a policy).
fn layouts_for(cx: &JoinCtx<'_>, team: &str) -> Vec<(String, String)> {
    let Ok(policy) = cx.backend.policy() else {
        return Vec::new();
    };
    let state = cx.backend.state();
    let host = state
        .last_report
        .as_ref()
        .and_then(|r| r.view.as_ref())
        .map(|v| v.gpus.as_slice());
    place::layout_profiles(&policy, host, team)
}

/// Why each of `entries` waits beyond a busy device, from its answer in `results`: a profile
/// no device of the share has (`Status` shows it); `None` for every other.
fn profile_reasons(
    cx: &JoinCtx<'_>,
    team: &str,
    entries: &[super::queue::Entry],
    results: &[Result<place::Placed, place::Refused>],
) -> Vec<(super::queue::Ticket, Option<String>)> {
    let missing = |r: &Result<place::Placed, place::Refused>| {
        r.as_ref().err().and_then(|r| r.no_profile.clone())
    };
    let layouts = if results.iter().any(|r| missing(r).is_some()) {
        layouts_for(cx, team)
    } else {
        Vec::new()
    };
    entries
        .iter()
        .zip(results)
        .map(|(e, r)| {
            let why = missing(r).map(|have| {
                let asked = e.request.profile.as_deref();
                place::without_profile(team, asked, &have, &layouts, true).unwrap_or_else(|e| e)
            });
            (e.ticket, why)
        })
        .collect()
}

/// Queue `ask` (`why`: what it is told when it cannot wait), with `reason` as its waiting
/// reason where that is more than a busy device, and log it.
fn queue_with<'a>(
    cx: &'a JoinCtx<'_>,
    ask: &Ask<'_>,
    why: &str,
    reason: Option<&str>,
) -> Result<Waiting<'a>, JoinError> {
    let team = &ask.team.name;
    let w = Waiting::new(cx, team, ask.uid, ask.pid, ask.opts.request(), ask.borrow)
        .map_err(|e| JoinError::NoFreeDevice(format!("{why}; cannot wait: {e}")))?;
    if let Some(r) = reason {
        cx.lock_queue()
            .set_reasons(team, &[(w.ticket, Some(r.to_string()))]);
    }
    let uid = ask.uid;
    info!(
        gpuctl_team = %team,
        gpuctl_action = "queued",
        uid,
        "uid {uid} waits for a device of team {team}: position {}{}",
        w.position(),
        reason.map_or(String::new(), |r| format!(": {r}"))
    );
    Ok(w)
}

/// A request its own share cannot serve now, as the lending side sees it.
struct Ask<'t> {
    team: &'t crate::policy::Team,
    opts: &'t JoinOptions,
    uid: u32,
    pid: u32,
    borrow: bool,
}

/// What lending gives such a request: a lent device, or why it waits (`"; …"`, added to its
/// own share's refusal) and, when a loan is coming back for it, how long that takes at most.
enum Lent {
    Placed(place::Placed),
    Wait(String, Option<std::time::Duration>),
}

/// Borrow for `ask`, or take a loan back for it, by the one decision ([`super::loans`]). An
/// owner whose devices are lent gets a queue ticket in `waiting` even without `--wait`: its
/// reclaim needs one.
async fn from_loans<'a>(
    cx: &'a JoinCtx<'a>,
    conn: &Connection,
    ask: &Ask<'_>,
    waiting: &mut Option<Waiting<'a>>,
    leases: Vec<Lease>,
    usage: Option<&crate::usage::Usage>,
) -> Result<Lent, JoinError> {
    let team = ask.team;
    if let Some(w) = waiting.as_ref() {
        cx.lock_queue().ungrant(&team.name, w.ticket);
    }
    let policy = cx.backend.policy()?;
    let lent_out = leases
        .iter()
        .any(|l| l.borrowed_from.as_deref() == Some(&*team.name));
    if waiting.is_none() && lent_out {
        *waiting = Waiting::new(
            cx,
            &team.name,
            ask.uid,
            ask.pid,
            ask.opts.request(),
            ask.borrow,
        )
        .ok();
    }
    let ticket = waiting
        .as_ref()
        .map_or(super::loans::UNQUEUED, |w| w.ticket);
    let me = crate::lending::Waiter {
        ticket,
        team: team.name.to_string(),
        uid: ask.uid,
        gpus: ask.opts.gpus,
        device: ask.opts.device.clone(),
        profile: ask.opts.profile.clone(),
        borrow: ask.borrow,
        passed_over: 0,
    };
    let answer = match super::loans::gather(&cx.loans(), &policy, leases, usage, Some(me)) {
        Some(g) => super::loans::decide_and_act(&cx.loans(), Some(conn), g, Some(ticket)).await,
        None => super::loans::Answer::default(),
    };
    let uid = ask.uid;
    if let Some((lender, devices)) = answer.borrowed {
        info!(
            gpuctl_team = %team.name,
            gpuctl_action = "borrowed",
            gpuctl_owner = %lender,
            uid,
            "uid {uid} of team {} borrows {} from team {lender}",
            team.name,
            devices.iter().map(|d| d.id.as_str()).collect::<Vec<_>>().join(",")
        );
        crate::metrics::counters().lent(&team.name, &lender);
        return Ok(Lent::Placed(place::Placed::on(devices, Some(lender))));
    }
    let why = answer.reason.map(|w| format!("; {w}")).unwrap_or_default();
    Ok(Lent::Wait(why, answer.coming_back))
}

/// How often the first waiter of a team looks for a free device: a scope ends without telling
/// gpuctld, so "starts within a second of a device freeing" is a poll of the leases.
pub const WAIT_TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// How long the requests restored after a restart keep their places for their clients.
pub const RETURN_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// How long the ledger days the fair order reads are kept: one read a minute while requests
/// wait, none while nobody does.
const FAIR_REFRESH: std::time::Duration = std::time::Duration::from_secs(60);

type CachedDays = Option<(std::time::Instant, std::sync::Arc<Vec<crate::ledger::Day>>)>;
static LEDGER_DAYS: std::sync::Mutex<CachedDays> = std::sync::Mutex::new(None);

/// Order the queue by each waiting user's recent usage from the ledger, and the loans by each
/// team's recent borrowed time (`fair-share-half-life`; docs/policy.md, "Lending idle devices"):
/// days back to four half-lives, at most 60. Without a ledger everyone has none and the order
/// stays round-robin.
fn refresh_fair_order(cx: &JoinCtx<'_>, joining: u32) {
    use crate::join::Directory;
    let Ok(policy) = cx.backend.policy() else {
        return;
    };
    let half = policy.host.fair_share_half_life;
    let now_ms = super::loans::now_ms();
    let days = {
        let mut cache = LEDGER_DAYS.lock().unwrap_or_else(|e| e.into_inner());
        match cache.as_ref() {
            Some((at, d)) if at.elapsed() < FAIR_REFRESH => d.clone(),
            _ => {
                let back = (half.as_secs() * 4).div_ceil(86_400).clamp(1, 60);
                let today = crate::ledger::day_of(now_ms);
                let (d, _) = crate::ledger::store::Store::new(cx.root)
                    .range(today.saturating_sub(back), today);
                let d = std::sync::Arc::new(d);
                *cache = Some((std::time::Instant::now(), d.clone()));
                d
            }
        }
    };
    let mut uids = cx.lock_queue().uids();
    uids.push(joining);
    let names: HashMap<String, u32> = uids
        .into_iter()
        .map(|u| (Nss.user_by_uid(u).map_or(u.to_string(), |a| a.name), u))
        .collect();
    let usage = crate::lending::from_ledger(&days, &names, now_ms, half);
    cx.lock_queue().set_usage(usage);
}

/// A queued request; leaves the queue however the wait ends (placed, timed out, the client
/// gone, the call dropped) and wakes the others, who may now be served.
struct Waiting<'a> {
    cx: &'a JoinCtx<'a>,
    team: String,
    ticket: super::queue::Ticket,
}

impl<'a> Waiting<'a> {
    fn new(
        cx: &'a JoinCtx<'a>,
        team: &str,
        uid: u32,
        pid: u32,
        request: crate::placement::Request,
        borrow: bool,
    ) -> Result<Self, super::queue::QueueError> {
        refresh_fair_order(cx, uid);
        let ticket = cx.lock_queue().join(team, uid, pid, request, borrow)?;
        cx.save_queue();
        Ok(Waiting {
            cx,
            team: team.to_string(),
            ticket,
        })
    }

    /// The request this process had queued before gpuctld restarted, if it has one.
    fn attach(cx: &'a JoinCtx<'a>, team: &str, uid: u32, pid: u32) -> Option<Self> {
        let ticket = cx.lock_queue().attach(team, uid, pid)?;
        Some(Waiting {
            cx,
            team: team.to_string(),
            ticket,
        })
    }

    fn is_head(&self) -> bool {
        self.cx.lock_queue().head(&self.team) == Some(self.ticket)
    }

    fn is_granted(&self) -> bool {
        self.cx.lock_queue().granted(&self.team, self.ticket)
    }

    fn position(&self) -> usize {
        self.cx
            .lock_queue()
            .position(&self.team, self.ticket)
            .unwrap_or(0)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.cx.lock_queue().leave(&self.team, self.ticket);
        self.cx.save_queue();
        self.cx.queue_changed.notify_waiters();
    }
}

/// What a placement looks at: the share from the last reconcile, the live leases of every
/// team (a GPU the teams share is capped across them), the load from the usage collector.
struct Snapshot {
    share: Vec<place::ShareDevice>,
    leases: Vec<Lease>,
    load: HashMap<String, place::Load>,
}

/// Gather the [`Snapshot`] for `team` with `usage` (none: placed by leases alone); `None`
/// before the first reconcile has made the share.
async fn snapshot(
    backend: &dyn Backend,
    sd: &Systemd,
    root: &Root,
    team: &crate::policy::Team,
    usage: Option<&crate::usage::Usage>,
) -> Result<Option<Snapshot>, JoinError> {
    let share = {
        let state = backend.state();
        let Some(view) = state.last_report.as_ref().and_then(|r| r.view.as_ref()) else {
            return Ok(None);
        };
        place::share(view, &team.name)
    };
    let leases = place::leases(sd, root)
        .await
        .map_err(|e| JoinError::PlacementFailed(format!("cannot read the leases: {e}")))?;
    let load = usage.map(place::load_of).unwrap_or_default();
    Ok(Some(Snapshot {
        share,
        leases,
        load,
    }))
}

/// How long a placement waits for a usage collection before it takes the last one.
const USAGE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The usage a placement looks at: a collection at most one interval old (a process outside
/// every lease makes a device busy, so an old one would keep a freed device busy), waited
/// for at most [`USAGE_WAIT`] (NVML can hang on a sick GPU), else the last one if it is at
/// most a few intervals old, else none.
async fn placement_usage(cx: &JoinCtx<'_>) -> Option<std::sync::Arc<crate::usage::Usage>> {
    if let Ok(Ok(u)) =
        tokio::time::timeout(USAGE_WAIT, super::collector::usage(cx.backend, cx.root)).await
    {
        return Some(std::sync::Arc::new(u));
    }
    let u = super::collector::last_collection()?;
    let age = super::loans::now_ms().saturating_sub(u.collected_at_ms);
    (age <= 3 * u.interval_ms.max(1000)).then_some(u)
}

/// A request that waited is placed: the journal entry, and the requester's event (a job they
/// may have walked away from starts now).
fn placed_after_wait(team: &str, uid: u32, p: &super::place::Placed, waited: std::time::Duration) {
    let ms = waited.as_millis();
    info!(
        gpuctl_team = %team,
        gpuctl_action = "queue-placed",
        uid,
        "uid {uid}'s request placed after {ms} ms in the queue"
    );
    let devices: Vec<&str> = p.devices.iter().map(|d| d.id.as_str()).collect();
    let devices = devices.join(",");
    let lent = p
        .lender
        .as_ref()
        .map_or_else(String::new, |l| format!(", lent by team {l}"));
    let text = format!(
        "Your queued job (team {team}) starts after {} s in the queue, on {devices}{lent}.",
        ms / 1000
    );
    crate::events::post(crate::events::Event {
        uid: Some(uid),
        device: Some(devices),
        ..crate::events::Event::new(crate::events::Kind::QueuePlaced, Some(team), text)
    });
}
