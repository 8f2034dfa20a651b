//! `gpuctld`: the agent daemon. All logic lives in the library's `daemon` module.
use anyhow::Context;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

/// The environment gpuctld reads, shown by `--help` and kept equal to gpuctld(8)'s ENVIRONMENT
/// section by `tests/man_gpuctld.rs` (which also checks that every variable the daemon's code
/// reads is listed here).
const ENVIRONMENT: &str = "\
Environment:
  GPUCTL_LOG               log filter when --log-level is not given [default: info]
  GPUCTL_NVML_LIBRARY      NVML library to load; wins over the policy's nvml-library
  GPUCTL_GPU_RESET_CMD     GPU reset command ({index}, {uuid} substituted)
                           [default: nvidia-smi -r -i {index}]
  GPUCTL_USAGE_INTERVAL_MS how long one usage collection (NVML + /proc) serves every
                           Usage/Metrics caller, in ms [default: 2000]
  GPUCTL_IDLE_INTERVAL_MS  ms between idle-rule samples (only while a team has
                           [teams.NAME.idle]) [default: 30000]
  GPUCTL_READ_LIMIT        each caller's budget of Usage/Idle/Metrics calls, BURST/PER_SEC
                           (root is never limited) [default: 50/25]
  GPUCTL_HPC_JOB_MAPPING_DIR  dcgm-exporter's HPC job-mapping directory to keep current (one
                           file per GPU index, the owning team as the job); unset: none
  JOURNAL_STREAM           set by systemd: log to the journal with structured fields
  NOTIFY_SOCKET            set by systemd: where READY=1, STATUS= and WATCHDOG=1 go
  DBUS_SYSTEM_BUS_ADDRESS  the system bus
                           [default: unix:path=/var/run/dbus/system_bus_socket]";

/// `--help`: clap's layout, which tests/man_gpuctld.rs and tests/docs.rs read.
const HELP: &str = "\
Keep this host's GPUs, MPS daemons and team slices matching the gpuctl policy

Usage: gpuctld [OPTIONS]

Options:
      --log-level <FILTER>  Log filter (`info`, `debug`, `gpuctl=trace`); overrides GPUCTL_LOG
      --root <DIR>          Resolve every host path under DIR (tests) [default: /]
      --drift-secs <SECS>   Seconds between drift checks [default: 300]
  -h, --help                Print help
  -V, --version             Print version
";

const USAGE: &str = "Usage: gpuctld [OPTIONS]";

/// gpuctld's options. Parsed by hand: three options do not need clap, whose parser would be
/// paged in at every start and then sit in the daemon's idle resident set (docs/performance.md).
#[derive(Debug, PartialEq)]
struct Args {
    log_level: Option<String>,
    root: PathBuf,
    drift_secs: u64,
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
enum Parsed {
    Run(Args),
    Help,
    Version,
}

/// Parse `argv` (without the program name) as clap did: `--opt VALUE` or `--opt=VALUE`, each
/// at most once; the error text is clap's, for exit status 2.
fn parse(argv: impl IntoIterator<Item = OsString>) -> Result<Parsed, String> {
    let mut args = Args {
        log_level: None,
        root: PathBuf::from("/"),
        drift_secs: 300,
    };
    let mut seen: Vec<&str> = Vec::new();
    let mut it = argv.into_iter();
    while let Some(arg) = it.next() {
        let text = arg.to_string_lossy().into_owned();
        let (name, inline) = match text.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (text.clone(), None),
        };
        let (flag, value_name) = match name.as_str() {
            "-h" | "--help" if inline.is_none() => return Ok(Parsed::Help),
            "-V" | "--version" if inline.is_none() => return Ok(Parsed::Version),
            "--log-level" => ("--log-level", "FILTER"),
            "--root" => ("--root", "DIR"),
            "--drift-secs" => ("--drift-secs", "SECS"),
            _ => {
                return Err(format!(
                    "error: unexpected argument '{text}' found\n\n{USAGE}\n\n\
                     For more information, try '--help'."
                ))
            }
        };
        if seen.contains(&flag) {
            return Err(format!(
                "error: the argument '{flag} <{value_name}>' cannot be used multiple times\n\n\
                 {USAGE}\n\nFor more information, try '--help'."
            ));
        }
        seen.push(flag);
        // The value: after `=`, else the next argument (kept as bytes for --root).
        let value: OsString = match inline {
            Some(v) => arg
                .as_bytes()
                .get(flag.len() + 1..)
                .map(|b| OsString::from_vec(b.to_vec()))
                .unwrap_or_else(|| v.into()),
            None => it.next().ok_or_else(|| {
                format!(
                    "error: a value is required for '{flag} <{value_name}>' but none was \
                     supplied\n\nFor more information, try '--help'."
                )
            })?,
        };
        match flag {
            "--log-level" => args.log_level = Some(value.to_string_lossy().into_owned()),
            "--root" => args.root = PathBuf::from(value),
            _ => {
                let v = value.to_string_lossy();
                args.drift_secs = v.parse().map_err(|e| {
                    format!(
                        "error: invalid value '{v}' for '{flag} <{value_name}>': {e}\n\n\
                         For more information, try '--help'."
                    )
                })?;
            }
        }
    }
    Ok(Parsed::Run(args))
}

fn main() -> anyhow::Result<()> {
    one_malloc_arena();
    let args = match parse(std::env::args_os().skip(1)) {
        Ok(Parsed::Run(a)) => a,
        Ok(Parsed::Help) => {
            println!("{HELP}\n{ENVIRONMENT}");
            return Ok(());
        }
        Ok(Parsed::Version) => {
            println!("gpuctld {}", env!("CARGO_PKG_VERSION"));
            return Ok(());
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    gpuctl::daemon::logging::init(args.log_level.as_deref())?;
    let opts = gpuctl::daemon::Options {
        root: gpuctl::paths::Root::new(args.root),
        drift: std::time::Duration::from_secs(args.drift_secs.max(1)),
        ..Default::default()
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // Bounded: each blocking task is a thread, and the unit caps tasks (TasksMax=); callers
        // beyond this wait in tokio's queue instead of failing to spawn.
        .max_blocking_threads(16)
        .build()
        .context("tokio runtime")?
        .block_on(gpuctl::daemon::run(opts))?;
    Ok(())
}

/// One malloc arena for the whole process. glibc gives each thread that allocates its own arena
/// (up to 8 per core); gpuctld's blocking threads (a load, a reconcile) are short-lived, but
/// their arenas stay, each holding what was allocated in it and still alive (the cached host)
/// plus its own slack. VM 59 found three such arenas holding 628 kB of an idle RSS of
/// 8,364 kB (issue 14 asks for at most 8 MiB). gpuctld has at most a handful of threads, so
/// one arena costs no contention worth measuring.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before any other thread exists.
    unsafe {
        nix::libc::mallopt(nix::libc::M_ARENA_MAX, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Parsed, String> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn options_as_clap_took_them() {
        assert_eq!(
            p(&[]),
            Ok(Parsed::Run(Args {
                log_level: None,
                root: "/".into(),
                drift_secs: 300
            }))
        );
        assert_eq!(
            p(&[
                "--root",
                "/tmp/r",
                "--drift-secs=5",
                "--log-level=info,gpuctl=debug"
            ]),
            Ok(Parsed::Run(Args {
                log_level: Some("info,gpuctl=debug".into()),
                root: "/tmp/r".into(),
                drift_secs: 5
            }))
        );
        assert_eq!(
            p(&["--root=/a=b"]).map(|r| match r {
                Parsed::Run(a) => a.root,
                _ => PathBuf::new(),
            }),
            Ok(PathBuf::from("/a=b"))
        );
        assert_eq!(p(&["-h"]), Ok(Parsed::Help));
        assert_eq!(p(&["--drift-secs", "1", "--version"]), Ok(Parsed::Version));
    }

    #[test]
    fn bad_command_lines_are_refused_in_claps_words() {
        let e = p(&["--bogus"]).unwrap_err();
        assert!(
            e.starts_with("error: unexpected argument '--bogus' found"),
            "{e}"
        );
        let e = p(&["--drift-secs", "x"]).unwrap_err();
        assert!(
            e.starts_with("error: invalid value 'x' for '--drift-secs <SECS>'"),
            "{e}"
        );
        let e = p(&["--root"]).unwrap_err();
        assert!(e.contains("a value is required for '--root <DIR>'"), "{e}");
        let e = p(&["--root", "/a", "--root=/b"]).unwrap_err();
        assert!(e.contains("cannot be used multiple times"), "{e}");
        assert!(p(&["--help=x"]).is_err());
    }
}
