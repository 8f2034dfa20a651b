//! `gpuctl doctor`: read-only host readiness report (see [`crate::doctor`]).
use super::Cli;
use crate::doctor::{self, record, Options};
use crate::paths::Root;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `gpuctl doctor`.
#[derive(Debug, Args)]
#[command(after_long_help = "\
Checks, one line each (OK, WARN or FAIL): NVML and driver versions; the kernel module's version; \
cgroup v2 and its controllers; systemd, and whether DevicePolicy=/DeviceAllow= can be enforced \
(cgroup v2, systemd's BPF device control, CONFIG_CGROUP_BPF); the nvidia, nvidia-uvm and \
nvidia-caps majors in /proc/devices; /dev/nvidiactl, /dev/nvidiaN, /dev/nvidia-uvm(-tools); \
/proc/driver/nvidia-caps/mig-minors and /dev/nvidia-caps nodes; the MPS binaries; and per GPU: \
model, MIG capable/current/pending, the driver's GI and CI profile tables compared with \
data/gpu-profiles.json (each difference on its own line), instances and processes.

Read-only: never changes MIG mode, never resets a GPU, never creates or destroys an instance. \
Host paths are read under --root; the NVML library is --nvml-library, else \
$GPUCTL_NVML_LIBRARY, else libnvidia-ml.so.1.

Exit status: 0 no FAIL, 1 at least one FAIL, 2 --record could not be written.")]
pub struct DoctorArgs {
    /// Print one JSON object: {"checks": [{"id", "status", "summary"}], "ok", "warn", "fail"}.
    #[arg(long)]
    pub json: bool,
    /// Also write what the driver reported, in the fake NVML's state format, to FILE (replay
    /// it with FAKE_NVML_STATE=FILE).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// NVML library to load.
    #[arg(long, value_name = "PATH")]
    pub nvml_library: Option<PathBuf>,
    /// nvidia-cuda-mps-control to look for (under --root).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/usr/bin/nvidia-cuda-mps-control"
    )]
    pub mps_control: PathBuf,
}

/// Run `gpuctl doctor`.
pub fn run(cli: &Cli, args: &DoctorArgs) -> anyhow::Result<i32> {
    let opts = Options {
        root: Root::new(&cli.root),
        nvml_library: args
            .nvml_library
            .clone()
            .or_else(|| crate::nvml::library_path(None)),
        mps_control: args.mps_control.clone(),
    };
    let report = doctor::run(&opts);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.render());
    }
    if let Some(path) = &args.record {
        let Some(d) = &report.driver else {
            eprintln!("gpuctl: doctor --record: NVML not available, nothing recorded");
            return Ok(super::exit::UNREADABLE);
        };
        let text = serde_json::to_string_pretty(&record::record(d))? + "\n";
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("gpuctl: doctor --record: {}: {e}", path.display());
            return Ok(super::exit::UNREADABLE);
        }
        if !args.json {
            println!("recorded to {}", path.display());
        }
    }
    Ok(if report.failed() {
        super::exit::INVALID
    } else {
        super::exit::OK
    })
}
