//! A fake `nvidia-cuda-mps-control` that speaks the same command-line interface as the real one.
//!
//! - `nvidia-cuda-mps-control -f` runs the control daemon in the foreground. It listens on
//!   `$CUDA_MPS_PIPE_DIRECTORY/control` (default `/tmp/nvidia-mps`) — a Unix socket here, where
//!   the real daemon uses named pipes in the same directory, so clients find it the same way.
//! - `nvidia-cuda-mps-control` without arguments reads one command per line from stdin, forwards
//!   each to the daemon and prints its reply, as the real client does (`echo quit | …`).
//!
//! The daemon understands `quit`, `set_default_active_thread_percentage N`,
//! `get_default_active_thread_percentage`, `set_default_device_pinned_mem_limit DEV SIZE`,
//! `get_default_device_pinned_mem_limit DEV` and `get_server_list`, and appends everything it
//! was told to `$CUDA_MPS_LOG_DIRECTORY/control.log` (default `/var/log/nvidia-mps`) so tests
//! can assert on it:
//!
//! ```text
//! start pid=123 CUDA_VISIBLE_DEVICES=GPU-1 user=0
//! cmd set_default_active_thread_percentage 40 -> ok
//! cmd quit -> ok
//! exit
//! ```
//!
//! Wire protocol between fake client and fake daemon: one command line in, one reply line out
//! (empty when the real tool prints nothing).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Control socket name inside the pipe directory.
pub const CONTROL: &str = "control";

/// The directories a daemon or client uses, from the environment.
#[derive(Debug, Clone)]
pub struct Dirs {
    /// `CUDA_MPS_PIPE_DIRECTORY`.
    pub pipe: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`.
    pub log: PathBuf,
}

impl Dirs {
    /// From `CUDA_MPS_PIPE_DIRECTORY` / `CUDA_MPS_LOG_DIRECTORY` with MPS's defaults.
    pub fn from_env() -> Self {
        let var = |k: &str, d: &str| PathBuf::from(std::env::var(k).unwrap_or_else(|_| d.into()));
        Dirs {
            pipe: var("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"),
            log: var("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"),
        }
    }
}

/// Settings the daemon holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Default active thread percentage (MPS starts at 100).
    pub active_thread_percentage: Option<u32>,
    /// Pinned memory limit per device ordinal, as given (`2048M`).
    pub pinned_mem_limit: BTreeMap<u32, String>,
}

/// Whether a size string is one MPS accepts: digits with an optional `K`/`M`/`G` suffix.
fn valid_size(s: &str) -> bool {
    let digits = s.trim_end_matches(['K', 'M', 'G', 'k', 'm', 'g']);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && s.len() - digits.len() <= 1
}

/// Apply one command; returns the reply line and whether the daemon should exit.
pub fn handle(state: &mut State, line: &str) -> (String, bool) {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["quit"] => (String::new(), true),
        ["set_default_active_thread_percentage", n] => match n.parse::<u32>() {
            Ok(p) if (1..=100).contains(&p) => {
                state.active_thread_percentage = Some(p);
                (String::new(), false)
            }
            _ => (format!("error: invalid percentage {n}"), false),
        },
        ["get_default_active_thread_percentage"] => (
            format!(
                "{:.1}",
                state.active_thread_percentage.unwrap_or(100) as f64
            ),
            false,
        ),
        ["set_default_device_pinned_mem_limit", dev, size] => {
            match (dev.parse::<u32>(), valid_size(size)) {
                (Ok(d), true) => {
                    state.pinned_mem_limit.insert(d, size.to_string());
                    (String::new(), false)
                }
                _ => (
                    format!("error: invalid device or size: {dev} {size}"),
                    false,
                ),
            }
        }
        ["get_default_device_pinned_mem_limit", dev] => match dev.parse::<u32>() {
            Ok(d) => (
                state
                    .pinned_mem_limit
                    .get(&d)
                    .cloned()
                    .unwrap_or_else(|| "0".into()),
                false,
            ),
            Err(_) => (format!("error: invalid device {dev}"), false),
        },
        ["get_server_list"] => (String::new(), false),
        [] => (String::new(), false),
        _ => (format!("error: unrecognized command: {line}"), false),
    }
}

fn log_line(log: &Path, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log.join("control.log"))
    {
        let _ = writeln!(f, "{line}");
    }
}

/// Run the control daemon until `quit`. Binds `<pipe>/control`, replacing a stale socket.
pub fn serve(dirs: &Dirs) -> std::io::Result<State> {
    std::fs::create_dir_all(&dirs.pipe)?;
    std::fs::create_dir_all(&dirs.log)?;
    let sock = dirs.pipe.join(CONTROL);
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock)?;
    log_line(
        &dirs.log,
        &format!(
            "start pid={} CUDA_VISIBLE_DEVICES={} user={}",
            std::process::id(),
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default(),
            nix_uid()
        ),
    );
    let mut state = State::default();
    'conns: for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let mut out = conn.try_clone()?;
        for line in BufReader::new(conn).lines() {
            let Ok(line) = line else { break };
            let (reply, quit) = handle(&mut state, &line);
            let verdict = if reply.starts_with("error") {
                reply.clone()
            } else {
                "ok".into()
            };
            log_line(&dirs.log, &format!("cmd {} -> {verdict}", line.trim()));
            let _ = writeln!(out, "{reply}");
            if quit {
                break 'conns;
            }
        }
    }
    let _ = std::fs::remove_file(&sock);
    log_line(&dirs.log, "exit");
    Ok(state)
}

fn nix_uid() -> u32 {
    // SAFETY-free way to learn our uid without a libc dependency: /proc/self/status.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .and_then(|u| u.parse().ok())
        .unwrap_or(u32::MAX)
}

/// Forward each line of `input` to the daemon and write non-empty replies to `output`.
pub fn client(dirs: &Dirs, input: impl BufRead, mut output: impl Write) -> Result<(), String> {
    let sock = dirs.pipe.join(CONTROL);
    let conn = UnixStream::connect(&sock).map_err(|e| {
        format!(
            "Cannot find MPS control daemon process ({}: {e})",
            sock.display()
        )
    })?;
    let mut w = conn.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(conn);
    for line in input.lines() {
        let line = line.map_err(|e| e.to_string())?;
        if line.trim().is_empty() {
            continue;
        }
        writeln!(w, "{line}").map_err(|e| e.to_string())?;
        let mut reply = String::new();
        if r.read_line(&mut reply).map_err(|e| e.to_string())? == 0 {
            break;
        }
        if !reply.trim().is_empty() {
            let _ = write!(output, "{reply}");
        }
        if line.trim() == "quit" {
            break;
        }
    }
    Ok(())
}

/// The binary's logic; returns the exit code.
pub fn main_with(args: &[String]) -> i32 {
    let dirs = Dirs::from_env();
    match args.first().map(String::as_str) {
        Some("-f") => match serve(&dirs) {
            Ok(_) => 0,
            Err(e) => {
                eprintln!("nvidia-cuda-mps-control: {}: {e}", dirs.pipe.display());
                1
            }
        },
        None => {
            let stdin = std::io::stdin();
            match client(&dirs, stdin.lock(), std::io::stdout()) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("{e}");
                    1
                }
            }
        }
        Some(other) => {
            eprintln!(
                "nvidia-cuda-mps-control (fake): unsupported option {other}; use -f or stdin"
            );
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn dirs(t: &Path) -> Dirs {
        Dirs {
            pipe: t.join("pipe"),
            log: t.join("log"),
        }
    }

    fn wait_for_socket(d: &Dirs) {
        for _ in 0..200 {
            if d.pipe.join(CONTROL).exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("daemon did not create its socket");
    }

    #[test]
    fn daemon_records_commands_and_answers_queries() {
        let t = tempfile::tempdir().unwrap();
        let d = dirs(t.path());
        let dd = d.clone();
        let daemon = std::thread::spawn(move || serve(&dd).unwrap());
        wait_for_socket(&d);

        let mut out = Vec::new();
        let cmds = "set_default_active_thread_percentage 40\n\
                    set_default_device_pinned_mem_limit 0 2048M\n\
                    get_default_active_thread_percentage\n\
                    get_default_device_pinned_mem_limit 0\n\
                    set_default_active_thread_percentage 400\n";
        client(&d, cmds.as_bytes(), &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "40.0\n2048M\nerror: invalid percentage 400\n"
        );
        // A second client session sees the state the first one left.
        let mut out = Vec::new();
        client(
            &d,
            "get_default_active_thread_percentage\nquit\n".as_bytes(),
            &mut out,
        )
        .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "40.0\n");

        let state = daemon.join().unwrap();
        assert_eq!(state.active_thread_percentage, Some(40));
        assert_eq!(
            state.pinned_mem_limit.get(&0).map(String::as_str),
            Some("2048M")
        );
        assert!(!d.pipe.join(CONTROL).exists(), "socket removed on quit");
        let log = std::fs::read_to_string(d.log.join("control.log")).unwrap();
        assert!(log.starts_with("start pid="), "{log}");
        assert!(log.contains("cmd set_default_active_thread_percentage 40 -> ok\n"));
        assert!(log.contains("cmd set_default_device_pinned_mem_limit 0 2048M -> ok\n"));
        assert!(log.contains("-> error: invalid percentage 400\n"));
        assert!(log.contains("cmd quit -> ok\nexit\n"));
    }

    #[test]
    fn client_without_daemon_fails_like_the_real_one() {
        let t = tempfile::tempdir().unwrap();
        let err = client(&dirs(t.path()), "quit\n".as_bytes(), Vec::new()).unwrap_err();
        assert!(
            err.starts_with("Cannot find MPS control daemon process"),
            "{err}"
        );
    }

    #[test]
    fn command_parsing() {
        let mut s = State::default();
        assert_eq!(handle(&mut s, "quit"), (String::new(), true));
        assert!(handle(&mut s, "bogus").0.starts_with("error: unrecognized"));
        assert!(handle(&mut s, "set_default_device_pinned_mem_limit 0 2X")
            .0
            .starts_with("error"));
        assert_eq!(
            handle(&mut s, "set_default_device_pinned_mem_limit 1 3G").0,
            ""
        );
        assert_eq!(
            handle(&mut s, "get_default_device_pinned_mem_limit 1").0,
            "3G"
        );
        assert_eq!(
            handle(&mut s, "get_default_active_thread_percentage").0,
            "100.0"
        );
    }
}
