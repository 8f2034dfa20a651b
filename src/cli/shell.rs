//! `gpuctl shell --team T`, and the client side of joining a team that `gpuctl run`, `env`,
//! `teams` and `status` share: talking to gpuctld and turning its refusals into exit codes.
//!
//! Joining is: ask gpuctld (`Join`) to move *this* process into a new scope in
//! `gpu-<team>.slice`, then replace this process (`execve`) with the shell or command, with the
//! environment gpuctld returned. Replacing rather than spawning a child keeps the pid that was
//! placed, the terminal, stdin/stdout/stderr, the process group (so Ctrl-C and job control
//! reach the command directly) and makes the command's exit status the one the caller sees,
//! with no wrapper left to forward signals or outlive the command.

use super::exit;
use crate::dbus_api::client::Agent1Proxy;
use crate::dbus_api::wire;
use crate::join::{self, compose_env, Refusal};
use crate::policy::TeamName;
use clap::Args;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The exit-code table of the joining commands, for their `--help` (a macro so that it can be
/// `concat!`ed into the help texts).
macro_rules! exit_table {
    ($what:literal) => {
        concat!(
            "Exit status (before ",
            $what,
            " starts; after that it is ",
            $what,
            "'s own):\n",
            "  3  not a member of the team (the message names the policy's members)\n",
            "  4  no such team, or not a valid team name\n",
            "  5  the team has no GPU or MIG device on this host now\n",
            "  6  gpuctld is not running (systemctl start gpuctld), the system bus is unreachable, or\n     gpuctld has no valid policy yet\n",
            "  7  gpuctld could not place the process in the team's slice, or the placement asked\n     for can never be met (--gpus 2 on MIG devices, --device outside the share)\n",
            "  8  every device the job could have is held now, also after --wait=DURATION (the\n     message names the holders)\n",
            "  2  any other failure (bad reply, refused by the bus policy)\n",
            "126  ",
            $what,
            " could not be executed; 127 it was not found"
        )
    };
}
pub(crate) use exit_table;

/// Arguments of `gpuctl shell`.
#[derive(Debug, Args)]
#[command(after_long_help = SHELL_HELP)]
pub struct ShellArgs {
    /// The team whose share the shell runs in.
    #[arg(long, short = 't', value_name = "TEAM")]
    pub team: String,
    /// Which of the share's devices.
    #[command(flatten)]
    pub place: PlaceArgs,
}

/// Placement options of `gpuctl run` and `shell` (docs/shell.md, "Placement").
#[derive(Debug, Args, Default, Clone, PartialEq, Eq)]
pub struct PlaceArgs {
    /// How many devices of the team's share (a number, or `all`); default from the team's
    /// policy, else 1. A job gets one MIG device at most.
    #[arg(long, value_name = "N")]
    pub gpus: Option<crate::placement::Gpus>,
    /// The device to run on: its UUID, MIG UUID, or its number in `gpuctl teams`.
    #[arg(long, value_name = "ID")]
    pub device: Option<String>,
    /// Cap on the job's GPU memory (e.g. 10G), enforced by the device's MPS daemon; refused
    /// where no MPS daemon serves the device.
    #[arg(long, value_name = "SIZE", value_parser = parse_gpu_memory)]
    pub gpu_memory: Option<u64>,
    /// When no device is free, wait in gpuctld's queue (round-robin across users) for at most
    /// DURATION (e.g. 10m), or without a limit when none is given.
    #[arg(long, value_name = "DURATION", num_args = 0..=1, require_equals = true,
          default_missing_value = "forever", value_parser = parse_wait)]
    pub wait: Option<std::time::Duration>,
    /// When the team's own share has no free device, run on a device another team lends
    /// (its `[teams.NAME.lend]`); the job is preemptible: it gets a notice, SIGTERM and the
    /// lender's grace when the owner wants the device back. Default: the team's `borrow`.
    #[arg(long)]
    pub borrow: bool,
    /// One MIG device of this GPU-instance profile (e.g. 3g.40gb), never a whole GPU. With
    /// --wait, a profile the share has no device of waits for a GPU to take a policy layout
    /// that gives the team one.
    #[arg(long, value_name = "PROFILE", value_parser = parse_profile,
          conflicts_with = "device")]
    pub profile: Option<String>,
}

fn parse_profile(s: &str) -> Result<String, String> {
    crate::dbus_api::place::check_gi_profile_name(s)
        .map(|()| s.to_string())
        .map_err(|e| {
            format!(
                "no GPU model has a MIG GPU-instance profile of that name; {}",
                e.help
            )
        })
}

fn parse_wait(s: &str) -> Result<std::time::Duration, String> {
    if s == "forever" {
        return Ok(crate::dbus_api::place::MAX_WAIT);
    }
    crate::settings::value::parse_duration(s)
}

fn parse_gpu_memory(s: &str) -> Result<u64, String> {
    match crate::settings::value::parse_size(s)? {
        Some(crate::policy::Size::Bytes(b)) if b > 0 => Ok(b),
        _ => Err(format!("{s:?} is not a positive size (e.g. 10G, 512M)")),
    }
}

impl PlaceArgs {
    /// The `JoinWith` options map (empty: a plain `Join`).
    pub fn options(&self) -> BTreeMap<String, String> {
        crate::dbus_api::place::JoinOptions {
            gpus: self.gpus,
            device: self.device.clone(),
            gpu_memory: self.gpu_memory,
            wait: self.wait,
            borrow: self.borrow.then_some(true),
            profile: self.profile.clone(),
        }
        .to_map()
    }
}

const SHELL_HELP: &str = concat!(
    "Starts your login shell (from the passwd database) inside a new scope in \
gpu-<TEAM>.slice: only the team's GPUs or MIG devices open, the team's memory and CPU limits \
apply, and CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, the MPS directories (when the team \
uses MPS) and GPUCTL_TEAM come from gpuctld; inherited CUDA_*, NVIDIA_* and GPUCTL_* variables \
are dropped. Leave with `exit`.\n\n",
    exit_table!("the shell")
);

/// A failure with its exit code and one-line message.
#[derive(Debug)]
pub struct Failure {
    /// Exit code (see [`EXIT_HELP`]).
    pub code: i32,
    /// One line, without the `gpuctl: ` prefix.
    pub message: String,
}

impl Failure {
    /// A failure with `code` and `message`.
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// Print the line and return the code.
    pub fn report(&self) -> i32 {
        eprintln!("gpuctl: {}", self.message);
        self.code
    }
}

impl From<Refusal> for Failure {
    fn from(r: Refusal) -> Self {
        let code = match r {
            Refusal::BadTeamName { .. } | Refusal::UnknownTeam { .. } => exit::UNKNOWN_TEAM,
            Refusal::NotMember { .. } => exit::NOT_MEMBER,
            Refusal::NoDevices { .. } => exit::NO_DEVICES,
            Refusal::NoPolicy(_) => exit::NO_DAEMON,
            Refusal::NotYourProcess { .. } => exit::PLACEMENT,
        };
        Failure::new(code, r.to_string())
    }
}

/// Map a D-Bus error reply (its name and message) to an exit code.
fn method_failure(name: &str, msg: String) -> Failure {
    let code = match name {
        "org.freedesktop.DBus.Error.ServiceUnknown"
        | "org.freedesktop.DBus.Error.NameHasNoOwner" => {
            return Failure::new(
                exit::NO_DAEMON,
                "gpuctld is not running (start it with: systemctl start gpuctld)",
            )
        }
        "org.gpuctl.Agent1.Error.NotMember" => exit::NOT_MEMBER,
        "org.gpuctl.Agent1.Error.UnknownTeam" | "org.gpuctl.Agent1.Error.InvalidTeamName" => {
            exit::UNKNOWN_TEAM
        }
        "org.gpuctl.Agent1.Error.NoDevices" => exit::NO_DEVICES,
        "org.gpuctl.Agent1.Error.NoPolicy" => exit::NO_DAEMON,
        "org.gpuctl.Agent1.Error.PlacementFailed"
        | "org.gpuctl.Agent1.Error.NotYourProcess"
        | "org.gpuctl.Agent1.Error.PlacementRefused" => exit::PLACEMENT,
        "org.gpuctl.Agent1.Error.NoFreeDevice" => exit::NO_FREE_DEVICE,
        // The bus policy refused the call (an old policy file or a method not meant for this
        // user), or anything else.
        _ => exit::UNREADABLE,
    };
    Failure::new(code, msg)
}

fn no_bus(e: impl std::fmt::Display) -> Failure {
    Failure::new(
        exit::NO_DAEMON,
        format!("cannot reach the system bus ({e}); is gpuctld running? (systemctl start gpuctld)"),
    )
}

/// Map a bus error to an exit code; `what` names the call for the message.
pub fn bus_failure(e: zbus::Error, what: &str) -> Failure {
    if let zbus::Error::MethodError(name, msg, _) = &e {
        let msg = msg.clone().unwrap_or_else(|| name.to_string());
        return method_failure(name.as_str(), msg);
    }
    Failure::new(exit::UNREADABLE, format!("{what}: {e}"))
}

fn wire_failure(e: wire::WireError) -> Failure {
    match e {
        wire::WireError::Connect { .. } => no_bus(e),
        wire::WireError::Method { name, message } => {
            let msg = message.unwrap_or_else(|| name.clone());
            method_failure(&name, msg)
        }
        e => Failure::new(exit::UNREADABLE, format!("Join: {e}")),
    }
}

/// Run `f` with a proxy of gpuctld on the system bus, on a private single-thread runtime, once
/// gpuctld has not said it speaks another interface version than this gpuctl.
pub fn with_agent<T>(
    what: &str,
    f: impl AsyncFnOnce(&Agent1Proxy<'static>) -> zbus::Result<T>,
) -> Result<T, Failure> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(exit::UNREADABLE, format!("tokio runtime: {e}")))?;
    rt.block_on(async {
        let conn = zbus::Connection::system().await.map_err(no_bus)?;
        // Uncached: one `Get` for the version, not a `GetAll` and a signal subscription.
        let proxy = Agent1Proxy::builder(&conn)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(|e| bus_failure(e, what))?;
        // A daemon that cannot say (one from before the property: version 1, or gone: the call
        // itself reports that) is called as it is.
        if let Some(m) = proxy
            .interface_version()
            .await
            .ok()
            .and_then(interface_mismatch)
        {
            return Err(Failure::new(exit::UNREADABLE, format!("{what}: {m}")));
        }
        f(&proxy).await.map_err(|e| bus_failure(e, what))
    })
}

/// Why this gpuctl cannot read a gpuctld that speaks interface version `theirs`
/// ([`crate::dbus_api::reply::v1`]): a package upgraded without a restart of gpuctld, or a
/// gpuctl from another build.
pub fn interface_mismatch(theirs: u32) -> Option<String> {
    let ours = crate::dbus_api::reply::v1::VERSION;
    let (who, fix) = match theirs.cmp(&ours) {
        std::cmp::Ordering::Equal => return None,
        std::cmp::Ordering::Less => (
            "older",
            "restart it to run the installed version: systemctl restart gpuctld",
        ),
        std::cmp::Ordering::Greater => (
            "newer",
            "use the gpuctl installed with it, or upgrade this one",
        ),
    };
    Some(format!(
        "gpuctld speaks version {theirs} of its bus interface and this gpuctl version {ours}: \
         gpuctld is {who} than this gpuctl ({fix})"
    ))
}

/// gpuctld's JSON reply to a call, as sent and parsed; `Err` is the exit code, the failure
/// printed.
pub fn reply<T: serde::de::DeserializeOwned>(
    text: Result<String, Failure>,
) -> Result<(String, T), i32> {
    let text = text.map_err(|f| f.report())?;
    match serde_json::from_str(&text) {
        Ok(r) => Ok((text, r)),
        Err(e) => {
            eprintln!("gpuctl: unreadable reply from gpuctld: {e}");
            Err(exit::UNREADABLE)
        }
    }
}

/// gpuctld's JSON reply to the call `what`, parsed; one that does not parse is a failure.
pub fn parse_reply<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, Failure> {
    serde_json::from_str(text)
        .map_err(|e| Failure::new(exit::UNREADABLE, format!("{what}: unexpected reply: {e}")))
}

/// Print a reply's document as the daemon sent it (keys sorted, as they always were).
pub fn print_json(text: String) {
    println!("{}", render_json(text));
}

/// What [`print_json`] prints, without the final newline.
pub fn render_json(text: String) -> String {
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    serde_json::to_string_pretty(&v).unwrap_or(text)
}

/// Ask gpuctld to place this process in `team`'s slice; returns the environment to set (the
/// daemon's, plus `GPUCTL_SCOPE`). The name was checked where it came in (a [`TeamName`]), so a
/// hostile name never even travels to the daemon.
pub fn join_team(team: &TeamName, place: &PlaceArgs) -> Result<BTreeMap<String, String>, Failure> {
    let options = place.options();
    if place.wait.is_some() {
        eprintln!(
            "gpuctl: placing in team {team}; if no device is free, waiting in gpuctld's queue \
             (`gpuctl status` lists it)"
        );
    }
    let _watch = place
        .wait
        .is_some()
        .then(|| watch_position(team.to_string()));
    // The lean client where the bus address allows it (see `wire` for why); zbus otherwise.
    let (mut env, scope): (BTreeMap<String, String>, String) = match wire::system_bus_socket() {
        Some(socket) => join_again_after_restart(&socket, team, options, place.wait)?,
        None => {
            let (env, scope) = with_agent("Join", async |p| {
                if options.is_empty() {
                    p.join(team).await
                } else {
                    p.join_with(team, options.into_iter().collect()).await
                }
            })?;
            (env.into_iter().collect(), scope)
        }
    };
    env.insert("GPUCTL_SCOPE".into(), scope);
    Ok(env)
}

/// `Join` through the lean client; a `--wait` request whose gpuctld goes away (a restart, a
/// crash) asks again when it is back, for what is left of its wait: a gpuctld that restarts
/// gives it back its place in the queue ([`crate::dbus_api::queue`]).
fn join_again_after_restart(
    socket: &std::path::Path,
    team: &TeamName,
    mut options: BTreeMap<String, String>,
    wait: Option<std::time::Duration>,
) -> Result<(BTreeMap<String, String>, String), Failure> {
    let deadline = wait.map(|w| std::time::Instant::now() + w);
    let mut said = false;
    loop {
        let r = wire::join(socket, team, &options);
        let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
        match (r, left) {
            // A gpuctld that has just come back answers before it has loaded its policy.
            (Err(e), Some(left))
                if (daemon_went_away(&e) || (said && starting(&e))) && !left.is_zero() =>
            {
                if !said {
                    eprintln!(
                        "gpuctl: gpuctld went away while this request waited ({e}); asking \
                         again when it is back"
                    );
                    said = true;
                }
                std::thread::sleep(AGAIN_EVERY.min(left));
                let left = deadline.map_or(left, |d| {
                    d.saturating_duration_since(std::time::Instant::now())
                });
                options.insert("wait".into(), left.as_millis().to_string());
            }
            (r, _) => {
                if said && r.is_ok() {
                    eprintln!("gpuctl: placed after gpuctld came back");
                }
                return r.map_err(wire_failure);
            }
        }
    }
}

/// How often a waiting client whose gpuctld went away asks again.
const AGAIN_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// gpuctld's answer while it has no policy loaded yet.
fn starting(e: &wire::WireError) -> bool {
    matches!(e, wire::WireError::Method { name, .. } if name == "org.gpuctl.Agent1.Error.NoPolicy")
}

/// The bus's answers for a call whose recipient left without replying or is not there (yet).
fn daemon_went_away(e: &wire::WireError) -> bool {
    matches!(e, wire::WireError::Method { name, .. } if matches!(
        name.as_str(),
        "org.freedesktop.DBus.Error.NoReply"
            | "org.freedesktop.DBus.Error.ServiceUnknown"
            | "org.freedesktop.DBus.Error.NameHasNoOwner"
            | "org.freedesktop.DBus.Error.Spawn.ChildExited"
            | "org.freedesktop.DBus.Error.TimedOut"
    ))
}

/// How often a waiting client on a terminal asks for its place in the queue: every waiter
/// spends the caller's `Status` budget (5/s, [`crate::ratelimit`]), so ten of one user's
/// waiters stay well under it.
const POSITION_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// While a `--wait` request waits, tell a person at a terminal its place in the team's queue
/// (from `Status`), whenever it changes. Scripts (stderr not a terminal) read `gpuctl status`.
fn watch_position(team: String) -> Watch {
    use std::io::IsTerminal;
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = std::sync::Arc::new(AtomicBool::new(false));
    if !std::io::stderr().is_terminal() {
        return Watch(done);
    }
    let seen = done.clone();
    let uid = nix::unistd::getuid().as_raw();
    std::thread::spawn(move || {
        let mut last = None;
        // Most requests are placed at once: the first look is after a second.
        std::thread::sleep(std::time::Duration::from_secs(1));
        while !seen.load(Ordering::SeqCst) {
            let status = with_agent("Status", async |p| p.status().await).ok();
            let line = status
                .and_then(|t| serde_json::from_str(&t).ok())
                .and_then(|s| position_line(&s, &team, uid));
            if line.is_some() && line != last && !seen.load(Ordering::SeqCst) {
                eprintln!("gpuctl: {}", line.as_deref().unwrap_or_default());
                last = line;
            }
            std::thread::sleep(POSITION_EVERY);
        }
    });
    Watch(done)
}

/// Silences the position watcher when the wait ends, however it ends.
struct Watch(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// `waiting for a device of team interns: position 2 of 5` for `uid`'s first request in
/// `team`'s queue, with why it waits where that is more than a busy device; `None` when it
/// has none there.
pub fn position_line(
    s: &crate::dbus_api::reply::v1::StatusReply,
    team: &str,
    uid: u32,
) -> Option<String> {
    let queue: Vec<_> = s.queue.iter().filter(|q| q.team == team).collect();
    let mine: Vec<_> = queue.iter().filter(|q| q.uid == uid).collect();
    let first = mine.iter().min_by_key(|q| q.position)?;
    let more = match mine.len() {
        1 => String::new(),
        n => format!(" ({n} of your requests wait)"),
    };
    // Why it waits, where that is more than a busy device (a profile no device has yet).
    let why = first
        .reason
        .as_ref()
        .map_or(String::new(), |r| format!("; {r}"));
    Some(format!(
        "waiting for a device of team {team}: position {} of {}{more}{why}",
        first.position,
        queue.len()
    ))
}

/// Replace this process with `program args` under the daemon's environment. Returns only on
/// failure, with 126/127 as a shell would.
pub fn exec_with(
    program: &OsString,
    args: &[OsString],
    daemon_env: &BTreeMap<String, String>,
) -> i32 {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(compose_env(std::env::vars_os(), daemon_env));
    let e = cmd.exec();
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => 127,
        _ => 126,
    };
    eprintln!(
        "gpuctl: cannot run {}: {e} (it was placed in {})",
        program.to_string_lossy(),
        daemon_env
            .get("GPUCTL_SCOPE")
            .map_or("the team's scope", String::as_str)
    );
    code
}

/// The caller's login shell from the passwd database (NSS), `/bin/sh` when it names none.
fn login_shell() -> Result<OsString, Failure> {
    let uid = nix::unistd::getuid();
    let user = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .ok_or_else(|| {
            Failure::new(
                exit::UNREADABLE,
                format!("uid {uid} has no passwd entry: no login shell to start"),
            )
        })?;
    let shell = user.shell.into_os_string();
    Ok(if shell.is_empty() {
        "/bin/sh".into()
    } else {
        shell
    })
}

/// Run `gpuctl shell`.
pub fn run(args: &ShellArgs) -> i32 {
    let joined =
        checked_team(&args.team).and_then(|t| Ok((login_shell()?, join_team(&t, &args.place)?)));
    let (shell, env) = match joined {
        Ok(x) => x,
        Err(f) => return f.report(),
    };
    eprintln!(
        "gpuctl: team {} ({}), CUDA_VISIBLE_DEVICES={}; `exit` leaves",
        args.team,
        env.get("GPUCTL_SCOPE").map_or("", String::as_str),
        env.get("CUDA_VISIBLE_DEVICES").map_or("", String::as_str)
    );
    exec_with(&shell, &[], &env)
}

/// Re-export for `gpuctl teams` and `status`: the team-name check as a [`Failure`].
pub fn checked_team(team: &str) -> Result<TeamName, Failure> {
    join::check_team_name(team).map_err(Failure::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dbus_api::reply::v1::VERSION;

    #[test]
    fn another_interface_version_is_named_with_who_is_behind_and_what_to_do() {
        assert_eq!(interface_mismatch(VERSION), None);
        let newer = interface_mismatch(VERSION + 1).unwrap();
        assert!(
            newer.contains(&format!("version {} of its bus interface", VERSION + 1)),
            "{newer}"
        );
        assert!(
            newer.contains("gpuctld is newer than this gpuctl"),
            "{newer}"
        );
        let older = interface_mismatch(VERSION - 1).unwrap();
        assert!(older.contains("gpuctld is older"), "{older}");
        assert!(older.contains("systemctl restart gpuctld"), "{older}");
    }

    #[test]
    fn a_waiter_is_told_why_it_waits_when_more_than_a_busy_device_holds_it() {
        let s: crate::dbus_api::reply::v1::StatusReply =
            serde_json::from_value(serde_json::json!({
                "status": "converged",
                "teams": {},
                "queue": [
                    {"team": "train", "uid": 1000, "user": "alice", "position": 1},
                    {"team": "train", "uid": 1001, "user": "bob", "position": 2,
                     "profile": "3g.40gb", "reason": "no 3g.40gb device in team train's share now"},
                ],
            }))
            .unwrap();
        assert_eq!(
            position_line(&s, "train", 1001).as_deref(),
            Some(
                "waiting for a device of team train: position 2 of 2; no 3g.40gb device in team \
                 train's share now"
            )
        );
        assert_eq!(
            position_line(&s, "train", 1000).as_deref(),
            Some("waiting for a device of team train: position 1 of 2")
        );
    }

    #[test]
    fn a_profile_is_checked_before_the_bus_and_excludes_a_device() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        let run = |extra: &[&str]| {
            let argv = ["gpuctl", "run", "--team", "t"]
                .iter()
                .chain(extra)
                .chain(&["--", "true"])
                .copied();
            Cli::try_parse_from(argv)
        };
        let Command::Run(r) = run(&["--profile", "3g.40gb", "--wait"]).unwrap().command else {
            panic!("not run");
        };
        assert_eq!(r.place.profile.as_deref(), Some("3g.40gb"));
        assert_eq!(
            r.place.options().get("profile").map(String::as_str),
            Some("3g.40gb")
        );
        let e = run(&["--profile", "3g.40g"]).unwrap_err().to_string();
        assert!(e.contains("did you mean '3g.40gb'?"), "{e}");
        assert!(run(&["--profile", "3g.40gb", "--device", "0"]).is_err());
        assert!(!PlaceArgs::default().options().contains_key("profile"));
    }
}
