//! `gpuctl run --requeue`: a job on a borrowed device runs again, queued, when the device's
//! owner takes it back.
//!
//! Without `--requeue`, `gpuctl run` replaces itself with the command. With it, gpuctl stays
//! the command's parent, outside the job's scope (a reclaim stops the whole scope): each round
//! is a plain `gpuctl run` child that tells this parent its scope through a pipe
//! (`GPUCTL_REQUEUE_FD`, never passed on to the command). When the child ends, the parent asks
//! gpuctld's events whether that scope's loan was taken back (`loan-reclaim`, `loan-stop`): if
//! so it queues the command again (`--wait`, for the caller's duration, else without limit);
//! otherwise the command's exit status is gpuctl's.

use super::exit;
use super::shell::{with_agent, Failure, PlaceArgs};
use crate::dbus_api::reply::{EventRecord, EventsReply};
use crate::events::Kind;
use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicI32, Ordering};

/// The variable naming the pipe a `gpuctl run` child writes its scope to.
pub const FD_VAR: &str = "GPUCTL_REQUEUE_FD";

/// Whether an event of `events` says the loan of `scope` was taken back.
fn taken_back(events: &[EventRecord], scope: &str) -> bool {
    let kinds = [Kind::LoanReclaim.as_str(), Kind::LoanStop.as_str()];
    events
        .iter()
        .any(|e| e.unit.as_deref() == Some(scope) && kinds.contains(&e.kind.as_str()))
}

/// What `gpuctl run --requeue` runs: its team, placement options and command.
pub struct Job<'a> {
    /// `--team`.
    pub team: &'a str,
    /// The placement options.
    pub place: &'a PlaceArgs,
    /// The command and its arguments.
    pub command: &'a [OsString],
}

/// The arguments of one round's `gpuctl run` child: the caller's, without `--requeue`; from
/// the second round on queued (`--wait`, the caller's duration or none).
fn child_args(job: &Job<'_>, round: u32) -> Vec<OsString> {
    let p = job.place;
    let mut v: Vec<OsString> = vec!["run".into(), "--team".into(), job.team.into()];
    if let Some(g) = p.gpus {
        v.push(format!("--gpus={g}").into());
    }
    if let Some(d) = &p.device {
        v.push(format!("--device={d}").into());
    }
    if let Some(m) = p.gpu_memory {
        v.push(format!("--gpu-memory={m}").into());
    }
    if let Some(prof) = &p.profile {
        v.push(format!("--profile={prof}").into());
    }
    match p.wait {
        Some(w) => v.push(format!("--wait={}ms", w.as_millis()).into()),
        None if round > 0 => v.push("--wait".into()),
        None => {}
    }
    if p.borrow {
        v.push("--borrow".into());
    }
    v.push("--".into());
    v.extend(job.command.iter().cloned());
    v
}

/// In a `gpuctl run` child of `--requeue`: tell the parent the job's scope (then close the
/// pipe, so the command does not inherit it). Anything but a pipe named there is left alone.
pub fn report_scope(scope: &str) {
    let Some(fd) = std::env::var(FD_VAR)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return;
    };
    let is_pipe = nix::sys::stat::fstat(fd)
        .is_ok_and(|st| st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFIFO);
    if fd > 2 && is_pipe {
        // SAFETY: the fd is open (fstat succeeded), a pipe the parent made for this; it is ours
        // to write and close, and nothing else in this process uses it.
        let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let _ = std::io::Write::write_all(&mut f, scope.as_bytes());
    }
}

/// The child of the round now running, for the signal handler (0: none).
static CHILD: AtomicI32 = AtomicI32::new(0);
/// The stop signal sent to this parent, if any (0: none): no round after it.
static TERMINATED: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: nix::libc::c_int) {
    TERMINATED.store(sig, Ordering::SeqCst);
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe; pid is our child's.
        unsafe { nix::libc::kill(pid, sig) };
    }
}

/// The exit status a shell would give for `status`.
fn code_of(status: std::process::ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(exit::UNREADABLE)
}

/// The events the caller may read now (those of its teams), for the check after a round.
fn events() -> Result<Vec<EventRecord>, Failure> {
    let text = with_agent("Events", async |p| p.events(0, 0).await)?;
    serde_json::from_str::<EventsReply>(&text)
        .map(|r| r.events)
        .map_err(|e| Failure::new(exit::UNREADABLE, format!("Events: unexpected reply: {e}")))
}

/// Run `gpuctl run --requeue`.
pub fn supervise(job: &Job<'_>) -> i32 {
    use nix::sys::signal::{signal, SigHandler, Signal};
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            return Failure::new(
                exit::UNREADABLE,
                format!("--requeue: cannot find gpuctl: {e}"),
            )
            .report()
        }
    };
    for round in 0.. {
        let (rd, wr) = match nix::unistd::pipe() {
            Ok(p) => p,
            Err(e) => return Failure::new(exit::UNREADABLE, format!("pipe: {e}")).report(),
        };
        let _ = nix::fcntl::fcntl(
            rd.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
        // An ignored signal stays ignored across exec: the child starts with the defaults.
        // SAFETY: restoring default dispositions.
        unsafe {
            for s in [
                Signal::SIGINT,
                Signal::SIGQUIT,
                Signal::SIGTERM,
                Signal::SIGHUP,
            ] {
                let _ = signal(s, SigHandler::SigDfl);
            }
        }
        let child = std::process::Command::new(&exe)
            .args(child_args(job, round))
            .env(FD_VAR, wr.as_raw_fd().to_string())
            .spawn();
        drop(wr);
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                return Failure::new(exit::UNREADABLE, format!("cannot start gpuctl run: {e}"))
                    .report()
            }
        };
        CHILD.store(child.id() as i32, Ordering::SeqCst);
        // The terminal's Ctrl-C and Ctrl-\ reach the command (same process group); this parent
        // waits for its end instead. A stop sent to this parent (a service's) goes to it.
        // SAFETY: plain dispositions and a handler that only stores and calls kill(2).
        unsafe {
            let _ = signal(Signal::SIGINT, SigHandler::SigIgn);
            let _ = signal(Signal::SIGQUIT, SigHandler::SigIgn);
            let _ = signal(Signal::SIGTERM, SigHandler::Handler(forward));
            let _ = signal(Signal::SIGHUP, SigHandler::Handler(forward));
        }
        let mut scope = String::new();
        let _ = std::fs::File::from(rd).read_to_string(&mut scope);
        let status = loop {
            match child.wait() {
                Ok(s) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Failure::new(exit::UNREADABLE, format!("wait: {e}")).report(),
            }
        };
        CHILD.store(0, Ordering::SeqCst);
        let code = code_of(status);
        if scope.is_empty() || TERMINATED.load(Ordering::SeqCst) != 0 {
            // Never placed (gpuctl run said why), or stopped through this parent.
            return code;
        }
        match events() {
            Ok(ev) if taken_back(&ev, &scope) => eprintln!(
                "gpuctl: the lent device of {scope} was taken back by its owner; queued again \
                 (--requeue)"
            ),
            Ok(_) => return code,
            Err(f) => {
                eprintln!(
                    "gpuctl: --requeue: cannot tell whether {scope} was taken back ({}); not \
                     queued again",
                    f.message
                );
                return code;
            }
        }
    }
    unreachable!("the rounds end by returning")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn rec(kind: &str, unit: &str) -> EventRecord {
        EventRecord {
            kind: kind.into(),
            unit: Some(unit.into()),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_reclaim_of_that_scope_requeues() {
        let s = "gpuctl-run-00000000000000aa.scope";
        assert!(taken_back(&[rec("loan-reclaim", s)], s));
        assert!(taken_back(&[rec("loan-stop", s)], s));
        assert!(!taken_back(
            &[rec("loan-reclaim", "gpuctl-run-00000000000000bb.scope")],
            s
        ));
        assert!(!taken_back(
            &[rec("idle-stop", s), rec("device-stop", s)],
            s
        ));
        assert!(!taken_back(&[], s));
    }

    /// `argv` as clap parses it: (team, placement, command, --requeue).
    fn parsed<S: Into<OsString> + Clone>(argv: &[S]) -> (String, PlaceArgs, Vec<OsString>, bool) {
        let argv: Vec<OsString> = argv.iter().cloned().map(Into::into).collect();
        match Cli::try_parse_from(&argv).unwrap().command {
            Command::Run(a) => (a.team, a.place, a.command, a.requeue),
            c => panic!("{c:?}"),
        }
    }

    fn rounds(argv: &[&str], round: u32) -> (String, PlaceArgs, Vec<OsString>, bool) {
        let (team, place, command, requeue) = parsed(argv);
        assert!(requeue);
        let job = Job {
            team: &team,
            place: &place,
            command: &command,
        };
        let mut again: Vec<OsString> = vec!["gpuctl".into()];
        again.extend(child_args(&job, round));
        parsed(&again)
    }

    #[test]
    fn a_round_runs_the_same_request_without_requeue_and_queued_from_the_second_on() {
        let argv = [
            "gpuctl",
            "run",
            "--team",
            "interns",
            "--borrow",
            "--requeue",
            "--gpus",
            "2",
            "--gpu-memory",
            "2G",
            "--",
            "train.py",
            "--epochs",
            "3",
        ];
        let (_, asked, command, _) = parsed(&argv);
        for round in [0, 1] {
            let (team, p, c, requeue) = rounds(&argv, round);
            assert!(!requeue);
            assert_eq!((team.as_str(), c), ("interns", command.clone()));
            assert_eq!(
                (p.gpus, p.gpu_memory, p.borrow, p.device),
                (asked.gpus, Some(2 << 30), true, None)
            );
            let want = (round > 0).then_some(crate::dbus_api::place::MAX_WAIT);
            assert_eq!(p.wait, want, "round {round}");
        }
        let argv = [
            "gpuctl",
            "run",
            "-t",
            "x",
            "--requeue",
            "--wait=90s",
            "--device=1",
            "--",
            "true",
        ];
        let (_, p, _, _) = rounds(&argv, 3);
        assert_eq!(p.wait, Some(std::time::Duration::from_secs(90)));
        assert_eq!(p.device.as_deref(), Some("1"));
    }

    #[test]
    fn a_round_asks_for_the_same_profile() {
        let argv = [
            "gpuctl",
            "run",
            "-t",
            "train",
            "--requeue",
            "--profile",
            "3g.40gb",
            "--",
            "train.py",
        ];
        for round in [0, 1] {
            let (_, p, _, _) = rounds(&argv, round);
            assert_eq!(p.profile.as_deref(), Some("3g.40gb"), "round {round}");
            assert_eq!(
                p.options().get("profile").map(String::as_str),
                Some("3g.40gb")
            );
        }
        let (_, p, _, _) = rounds(
            &argv[..5]
                .iter()
                .chain(&argv[7..])
                .copied()
                .collect::<Vec<_>>(),
            1,
        );
        assert_eq!(p.profile, None);
    }
}
