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

use crate::daemon::Shared;
use crate::join::{
    self, check_team_name, nss::Nss, parse_env_file, scope_name, verify_process, Caller,
    ProcIdentity, Refusal, Via,
};
use crate::paths::Root;
use crate::systemd::{props, Systemd};
use futures_lite::StreamExt;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tracing::{info, warn};
use zbus::message::Header;
use zbus::zvariant::{OwnedValue, Value};
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

fn policy_of(shared: &Arc<Mutex<Shared>>) -> Result<crate::policy::Policy, Refusal> {
    let sh = shared.lock().unwrap_or_else(|e| e.into_inner());
    sh.policy.clone().ok_or_else(|| {
        Refusal::NoPolicy(
            sh.policy_error
                .clone()
                .unwrap_or_else(|| "not loaded".into()),
        )
    })
}

/// Authorize on a blocking thread: NSS may be LDAP or SSSD, and the runtime thread also serves
/// the watchdog and every other caller.
async fn authorize(
    shared: &Arc<Mutex<Shared>>,
    caller: &Caller,
    team: &str,
) -> Result<join::Grant, Refusal> {
    check_team_name(team)?;
    let policy = policy_of(shared)?;
    let (c, t) = (caller.clone(), team.to_string());
    tokio::task::spawn_blocking(move || join::authorize(&c, &policy, &t, &Nss))
        .await
        .map_err(|e| Refusal::NoPolicy(format!("authorization task failed: {e}")))?
}

/// The team's environment as the daemon last wrote it; a team without devices is refused.
pub fn team_env(root: &Root, team: &str) -> Result<BTreeMap<String, String>, Refusal> {
    let env = std::fs::read_to_string(root.join(join::team_env_path(team)))
        .map(|t| parse_env_file(&t))
        .unwrap_or_default();
    if join::has_devices(&env) {
        Ok(env)
    } else {
        Err(Refusal::NoDevices { team: team.into() })
    }
}

/// `Env(team)`: the environment of a team the caller may use.
pub async fn env(
    shared: &Arc<Mutex<Shared>>,
    root: &Root,
    conn: &Connection,
    hdr: &Header<'_>,
    team: &str,
) -> Result<HashMap<String, String>, JoinError> {
    check_team_name(team)?;
    let bc = bus_caller(conn, hdr).await?;
    authorize(shared, &bc.caller, team).await?;
    Ok(team_env(root, team)?.into_iter().collect())
}

/// `Teams()`: JSON array of the teams the caller may use and what each gives.
pub async fn teams(
    shared: &Arc<Mutex<Shared>>,
    root: &Root,
    conn: &Connection,
    hdr: &Header<'_>,
) -> Result<String, JoinError> {
    let bc = bus_caller(conn, hdr).await?;
    let policy = policy_of(shared)?;
    let p = policy.clone();
    let c = bc.caller.clone();
    let mine: Vec<(String, Via)> =
        tokio::task::spawn_blocking(move || join::joinable(&c, &p, &Nss))
            .await
            .map_err(|e| fdo::Error::Failed(format!("authorization task failed: {e}")))?;
    let out: Vec<_> = mine
        .into_iter()
        .map(|(name, via)| {
            let t = &policy.teams[&name];
            let env = team_env(root, &name).ok();
            json!({
                "team": name,
                "via": via,
                "slice": props::slice_unit(&name),
                "devices": env.as_ref().and_then(|e| e.get("CUDA_VISIBLE_DEVICES")),
                "env": env,
                "limits": t.limits,
                "mps": t.mps,
                "members": t.members.iter().map(ToString::to_string).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(serde_json::Value::Array(out).to_string())
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

/// systemd's object path of a unit (`bus_label_escape`: every byte other than an ASCII letter
/// or digit, and a leading digit, becomes `_xx`).
pub fn unit_object_path(unit: &str) -> String {
    let mut p = String::from("/org/freedesktop/systemd1/unit/");
    for (i, b) in unit.bytes().enumerate() {
        if b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()) {
            p.push(b as char);
        } else {
            p.push_str(&format!("_{b:02x}"));
        }
    }
    p
}

/// `DevicePolicy` of a slice in one call: systemd loads a unit named by its object path, so no
/// `LoadUnit` round trip is needed (this is on the path of every `gpuctl run`).
async fn device_policy(conn: &Connection, slice: &str) -> Result<String, zbus::Error> {
    let reply = conn
        .call_method(
            Some("org.freedesktop.systemd1"),
            unit_object_path(slice).as_str(),
            Some("org.freedesktop.DBus.Properties"),
            "Get",
            &("org.freedesktop.systemd1.Slice", "DevicePolicy"),
        )
        .await?;
    let v: OwnedValue = reply.body().deserialize()?;
    String::try_from(v).map_err(Into::into)
}

/// Waits for systemd jobs on one long-lived `JobRemoved` subscription, so a placement costs no
/// `AddMatch`/`RemoveMatch` round trips of its own.
#[derive(Default)]
pub struct JobWaiter {
    state: Mutex<WaitState>,
}

#[derive(Default)]
struct WaitState {
    waiting: HashMap<String, oneshot::Sender<String>>,
    /// Results that arrived before their waiter registered (the job finished before the
    /// `StartTransientUnit` reply was handled); bounded, oldest dropped.
    early: VecDeque<(String, String)>,
}

impl JobWaiter {
    /// Subscribe and route results until the stream ends.
    pub async fn spawn(sd: &Systemd) -> zbus::Result<Arc<JobWaiter>> {
        let mut stream = sd.manager().receive_job_removed().await?;
        let w = Arc::new(JobWaiter::default());
        let w2 = w.clone();
        tokio::spawn(async move {
            while let Some(sig) = stream.next().await {
                let Ok(args) = sig.args() else { continue };
                w2.finished(args.job().to_string(), args.result().to_string());
            }
        });
        Ok(w)
    }

    fn finished(&self, job: String, result: String) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match st.waiting.remove(&job) {
            Some(tx) => {
                let _ = tx.send(result);
            }
            None => {
                st.early.push_back((job, result));
                if st.early.len() > 256 {
                    st.early.pop_front();
                }
            }
        }
    }

    /// The result of `job` (`done`, `failed`, …), or `None` after `timeout`.
    pub async fn wait(&self, job: &str, timeout: Duration) -> Option<String> {
        let rx = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = st.early.iter().position(|(j, _)| j == job) {
                return st.early.remove(i).map(|(_, r)| r);
            }
            let (tx, rx) = oneshot::channel();
            st.waiting.insert(job.to_string(), tx);
            rx
        };
        let r = tokio::time::timeout(timeout, rx)
            .await
            .ok()
            .and_then(Result::ok);
        if r.is_none() {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.waiting.remove(job);
        }
        r
    }
}

/// Start the scope and wait for its job on the shared subscription.
async fn start_scope(
    sd: &Systemd,
    jobs: &JobWaiter,
    scope: &str,
    slice: &str,
    pid: u32,
    description: String,
) -> Result<(), String> {
    let props: Vec<(&str, Value<'_>)> = vec![
        ("Slice", Value::from(slice)),
        ("PIDs", Value::from(vec![pid])),
        ("Description", Value::from(description)),
        // A failed scope would otherwise stay loaded and block the name for this pid.
        ("CollectMode", Value::from("inactive-or-failed")),
    ];
    let job = sd
        .manager()
        .start_transient_unit(scope, "fail", &props, &[])
        .await
        .map_err(|e| format!("{scope}: StartTransientUnit: {e}"))?;
    match jobs.wait(job.as_str(), Duration::from_secs(30)).await {
        Some(r) if r == "done" => Ok(()),
        Some(r) => Err(format!("{scope}: start job finished with result '{r}'")),
        None => Err(format!("{scope}: start job did not finish within 30 s")),
    }
}

/// `Join(team)`: authorize the caller, move its own process into a new scope in the team's
/// slice, and return the team's environment and the scope's name.
pub async fn join(
    shared: &Arc<Mutex<Shared>>,
    sd: &Systemd,
    jobs: &JobWaiter,
    root: &Root,
    conn: &Connection,
    hdr: &Header<'_>,
    team: &str,
) -> Result<(HashMap<String, String>, String), JoinError> {
    check_team_name(team)?;
    let bc = bus_caller(conn, hdr).await?;
    let uid = bc.caller.uid;
    let grant = match authorize(shared, &bc.caller, team).await {
        Ok(g) => g,
        Err(r) => {
            info!(gpuctl_team = %team, gpuctl_action = "join-refused", uid, "{r}");
            return Err(r.into());
        }
    };
    let env = team_env(root, team)?;

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
        warn!(gpuctl_team = %team, gpuctl_action = "join-refused", uid, pid, "{r}");
        return Err(r.into());
    }

    // A slice that gpuctld has not configured would be an implicit one without a device
    // filter: placing anyone there would hand out every GPU.
    let slice = props::slice_unit(team);
    match device_policy(sd.connection(), &slice).await {
        Ok(p) if p == "closed" => {}
        Ok(p) => {
            return Err(JoinError::PlacementFailed(format!(
                "{slice} is not under gpuctl's device control yet (DevicePolicy={p}); \
                 gpuctld has not configured team \"{team}\""
            )))
        }
        Err(e) => return Err(JoinError::PlacementFailed(format!("{slice}: {e}"))),
    }

    let scope = scope_name(team, pid);
    let description = format!("gpuctl: {} (pid {pid}) in team {team}", grant.user);
    if let Err(e) = start_scope(sd, jobs, &scope, &slice, pid, description).await {
        return Err(JoinError::PlacementFailed(format!(
            "cannot place pid {pid} of {} in {slice}: {e}",
            grant.user
        )));
    }
    let after = ProcIdentity::read(root, pid);
    if !pidfd_alive(&pidfd) || after.as_ref().ok() != Some(&before) {
        // The checked process is gone: the pid may now be someone else's. Nothing is killed
        // (never kill a job); the admin is told which scope to look at.
        warn!(
            gpuctl_team = %team,
            gpuctl_action = "join-raced",
            uid,
            pid,
            "pid {pid} exited or changed while being placed in {scope}; check that scope"
        );
        return Err(JoinError::NotYourProcess(format!(
            "pid {pid}: the process changed while it was placed in {scope}"
        )));
    }
    info!(
        gpuctl_team = %team,
        gpuctl_action = "join",
        uid,
        pid,
        "{} joined team {team} ({}) as {scope}",
        grant.user,
        grant.via
    );
    Ok((env.into_iter().collect(), scope))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_object_paths_match_systemds_escaping() {
        assert_eq!(
            unit_object_path("gpu-infer.slice"),
            "/org/freedesktop/systemd1/unit/gpu_2dinfer_2eslice"
        );
        assert_eq!(
            unit_object_path("gpu-ml_2.slice"),
            "/org/freedesktop/systemd1/unit/gpu_2dml_5f2_2eslice"
        );
        assert_eq!(
            unit_object_path("1x"),
            "/org/freedesktop/systemd1/unit/_31x"
        );
    }

    #[tokio::test]
    async fn job_results_reach_waiters_whether_they_come_before_or_after() {
        let w = JobWaiter::default();
        w.finished("/job/1".into(), "done".into());
        assert_eq!(
            w.wait("/job/1", Duration::from_secs(1)).await.as_deref(),
            Some("done")
        );
        let w = Arc::new(w);
        let w2 = w.clone();
        let t = tokio::spawn(async move { w2.wait("/job/2", Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        w.finished("/job/3".into(), "failed".into());
        w.finished("/job/2".into(), "failed".into());
        assert_eq!(t.await.unwrap().as_deref(), Some("failed"));
        assert_eq!(w.wait("/job/9", Duration::from_millis(10)).await, None);
        assert!(
            w.state.lock().unwrap().waiting.is_empty(),
            "timed-out waiter removed"
        );
    }
}
