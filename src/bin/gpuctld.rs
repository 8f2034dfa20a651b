//! `gpuctld`: the agent daemon. All logic lives in the library's `daemon` module.
use anyhow::Context;
use clap::Parser;
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

/// Keep this host's GPUs, MPS daemons and team slices matching the gpuctl policy.
#[derive(Debug, Parser)]
#[command(name = "gpuctld", version, after_help = ENVIRONMENT)]
struct Args {
    /// Log filter (`info`, `debug`, `gpuctl=trace`); overrides GPUCTL_LOG.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Resolve every host path under DIR (tests).
    #[arg(long, value_name = "DIR", default_value = "/")]
    root: PathBuf,
    /// Seconds between drift checks.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    drift_secs: u64,
}

fn main() -> anyhow::Result<()> {
    one_malloc_arena();
    let args = Args::parse();
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
