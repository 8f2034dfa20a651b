//! `gpuctl doctor` against fake hosts: a root directory standing for `/` (cgroup files,
//! `/proc/devices`, device nodes) and the fake NVML library holding the GPUs.
//!
//! Device nodes are symlinks to the host's `/dev/null` (1:3), `/dev/zero` (1:5) and `/dev/full`
//! (1:7), so they are real character devices without privileges; the fake `/proc/devices`
//! gives the nvidia drivers major 1, and the GPUs the minors 3, 5 and 7.

mod fakehost;
#[path = "common/golden.rs"]
mod golden;

use gpuctl::doctor::record::Recording;
use gpuctl::nvml::{NvmlBackend, ResetCommand};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// In-process tests load the fake with `FAKE_NVML_STATE` set in this process's environment.
static ENV: Mutex<()> = Mutex::new(());

const FIXTURE: &str = "tests/data/doctor-recording-fake-550.54.15.json";

fn write(root: &Path, p: &str, text: &str) {
    let p = root.join(p.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn link(root: &Path, p: &str, target: &str) {
    let p = root.join(p.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, p).unwrap();
}

/// A ready host: cgroup v2 with every controller, systemd 252 running, a kernel with
/// CONFIG_CGROUP_BPF, the nvidia majors and nodes, the MPS binaries.
fn ready_root(root: &Path) {
    write(
        root,
        "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n",
    );
    write(
        root,
        "/sys/fs/cgroup/cgroup.controllers",
        "cpuset cpu io memory hugetlb pids rdma misc\n",
    );
    std::fs::create_dir_all(root.join("run/systemd/system")).unwrap();
    write(
        root,
        "/usr/lib/x86_64-linux-gnu/systemd/libsystemd-shared-252.so",
        "",
    );
    write(root, "/proc/sys/kernel/osrelease", "6.1.0-test\n");
    // /proc mounted with hidepid=invisible, as docs/monitoring.md recommends.
    write(
        root,
        "/proc/self/mounts",
        "proc /proc proc rw,nosuid,nodev,noexec,relatime,hidepid=invisible 0 0\n",
    );
    write(
        root,
        "/boot/config-6.1.0-test",
        "CONFIG_CGROUP=y\nCONFIG_CGROUP_BPF=y\n",
    );
    write(
        root,
        "/proc/devices",
        "Character devices:\n  1 mem\n  1 nvidia-frontend\n  1 nvidia-uvm\n  1 nvidia-caps\n\n\
         Block devices:\n  8 sd\n",
    );
    for n in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia3"] {
        link(root, &format!("/dev/{n}"), "/dev/null");
    }
    link(root, "/dev/nvidia5", "/dev/zero");
    link(root, "/dev/nvidia7", "/dev/full");
    for b in ["nvidia-cuda-mps-control", "nvidia-cuda-mps-server"] {
        write(root, &format!("/usr/bin/{b}"), "#!/bin/sh\n");
        let p = root.join("usr/bin").join(b);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// An H100 with MIG on (a 3g.40gb GI at 4+4 split 1c + 2c, a 1g.10gb GI at slice 0, a process
/// on each of two CIs), an L40S with one process, and an A100 with MIG off.
fn fake_state() -> Value {
    json!({
        "gpus": [
            {"model": "H100-SXM5-80GB", "minor": 3, "mig": {"current": 1, "pending": 1},
             "gpu_instances": [
                {"id": 1, "profile_id": 9, "start": 4, "size": 4, "compute_instances": [
                    {"id": 0, "profile_id": 0, "start": 0, "size": 1},
                    {"id": 1, "profile_id": 1, "start": 1, "size": 2}]},
                {"id": 11, "profile_id": 19, "start": 0, "size": 1, "compute_instances": [
                    {"id": 0, "profile_id": 0, "start": 0, "size": 1}]}]},
            {"model": "L40S", "minor": 5},
            {"model": "A100-SXM4-40GB", "minor": 7}
        ],
        "processes": [
            {"pid": 4242, "gpu": 0, "gi": 1, "ci": 1, "used_memory_mib": 512},
            {"pid": 4343, "gpu": 0, "gi": 11, "ci": 0, "used_memory_mib": 64},
            {"pid": 77, "gpu": 1, "used_memory_mib": 100}
        ]
    })
}

struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new(state: &Value) -> Host {
        let dir = tempfile::tempdir().unwrap();
        ready_root(&dir.path().join("root"));
        std::fs::write(dir.path().join("state.json"), state.to_string()).unwrap();
        Host { dir }
    }
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    fn state(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }
    /// `gpuctl --root ROOT doctor ARGS` against this host: (exit code, stdout, stderr).
    fn doctor(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_gpuctl"))
            .arg("--root")
            .arg(self.root())
            .arg("doctor")
            .args(args)
            .env("GPUCTL_NVML_LIBRARY", fakehost::lib_path())
            .env("FAKE_NVML_STATE", self.state())
            .env("FAKE_NVML_ROOT", self.root())
            .env_remove("FAKE_NVML_SPEC")
            .env_remove("FAKE_NVML_FAIL")
            .env_remove("FAKE_NVML_FAIL_AT")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

fn checks(json_text: &str) -> Vec<(String, String, String)> {
    let v: Value = serde_json::from_str(json_text).unwrap_or_else(|e| panic!("{e}: {json_text}"));
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
                c["summary"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn fake_host_is_all_ok() {
    let h = Host::new(&fake_state());
    let (code, out, err) = h.doctor(&["--json"]);
    // The document as `doctor --json` prints it (tests/golden_json.rs has the others).
    let shown = out.replace(&h.root().display().to_string(), "<root>");
    golden::check(&golden::repo_path("tests/golden-json/doctor.json"), &shown);
    let c = checks(&out);
    let not_ok: Vec<_> = c.iter().filter(|c| c.1 != "OK").collect();
    assert!(not_ok.is_empty(), "{not_ok:#?}\n{err}");
    assert_eq!(code, 0, "{out}{err}");
    let get = |id: &str| {
        c.iter()
            .find(|x| x.0 == id)
            .unwrap_or_else(|| panic!("no {id}: {c:#?}"))
            .2
            .clone()
    };
    assert!(get("nvml").contains("driver 550.54.15"), "{}", get("nvml"));
    assert!(
        get("gpu0.gi-profiles").contains("7 GI profiles"),
        "{}",
        get("gpu0.gi-profiles")
    );
    assert!(
        get("gpu0.ci-profiles").contains("[1g.10gb, 3g.40gb]"),
        "{}",
        get("gpu0.ci-profiles")
    );
    assert!(get("gpu0.processes").contains("pid 4242 (gi1/ci1, 512 MiB)"));
    assert!(get("gpu1.processes").contains("pid 77 (whole GPU, 100 MiB)"));
    assert_eq!(get("gpu1.mig"), "not MIG-capable");
    assert!(get("gpu2.gi-profiles").contains("not readable while MIG is off"));
    assert!(get("node.nvidia5").contains("1:5"));
    assert!(get("mig-minors").contains("every live instance listed (5)"));
    // The text form: one line per check, same ids and statuses.
    let (code, text, _) = h.doctor(&[]);
    assert_eq!(code, 0);
    assert_eq!(text.lines().count(), c.len() + 1, "{text}");
    assert!(
        text.contains("OK   gpu0.mig: MIG capable, current on, pending on\n"),
        "{text}"
    );
    // Read-only: the fake counted no mutating call and logged none.
    let st: Value = serde_json::from_str(&std::fs::read_to_string(h.state()).unwrap()).unwrap();
    assert_eq!(
        st.get("mutating_calls")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        0
    );
}

#[test]
fn host_without_nvml_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    // The fake without state or spec is a host whose driver is not loaded.
    let out = Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .arg("--root")
        .arg(&root)
        .arg("doctor")
        .env("GPUCTL_NVML_LIBRARY", fakehost::lib_path())
        .env("FAKE_NVML_STATE", dir.path().join("absent.json"))
        .env_remove("FAKE_NVML_SPEC")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for line in [
        "FAIL nvml: NVML not available: ",
        "FAIL kernel-module: /proc/driver/nvidia/version absent: the nvidia kernel module is not loaded",
        "FAIL cgroup: no cgroup v2 at /sys/fs/cgroup",
        "FAIL systemd: /run/systemd/system absent",
        "FAIL majors: /proc/devices unreadable",
        "FAIL node.nvidiactl: /dev/nvidiactl absent",
    ] {
        assert!(text.lines().any(|l| l.starts_with(line)), "no line {line:?} in\n{text}");
    }
    assert!(
        text.contains("driver is not loaded; GPU checks skipped"),
        "{text}"
    );
    // No GPU lines, and --record has nothing to write.
    assert!(!text.contains("gpu0"), "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .arg("--root")
        .arg(&root)
        .args(["doctor", "--record"])
        .arg(dir.path().join("rec.json"))
        .env("GPUCTL_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing recorded"));
    assert!(!dir.path().join("rec.json").exists());
}

/// The H100 reference entry with a tampered 1g.10gb memory size, 3g.40gb placements and the
/// SM count of the 1c CI inside 3g.40gb.
fn tampered_state() -> Value {
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("data/gpu-profiles.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut h100 = reference["gpus"]["H100-SXM5-80GB"].clone();
    for p in h100["gi_profiles"].as_array_mut().unwrap() {
        match p["name"].as_str().unwrap() {
            "1g.10gb" => p["memory_size_mb"] = json!(9000),
            "3g.40gb" => p["placements"] = json!([{"start": 4, "size": 4}]),
            _ => {}
        }
    }
    h100["ci_profiles_by_gi"]["3g.40gb"][0]["multiprocessor_count"] = json!(20);
    let mut st = fake_state();
    st["models"] = json!({ "H100-SXM5-80GB": h100 });
    st
}

#[test]
fn tampered_profile_table_names_each_difference() {
    let h = Host::new(&tampered_state());
    let (code, out, err) = h.doctor(&[]);
    assert_eq!(code, 1, "{out}{err}");
    let diffs: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("WARN ") || l.starts_with("FAIL "))
        .collect();
    assert_eq!(
        diffs,
        [
            "WARN gpu0.gi-profile.19.memory_size_mb: GI profile 19 (1g.10gb): memory_size_mb: \
             driver 9000, data/gpu-profiles.json 9984",
            "FAIL gpu0.gi-profile.9.placements: GI profile 9 (3g.40gb): placements: driver [4+4], \
             data/gpu-profiles.json [0+4 4+4]",
            "WARN gpu0.ci-profile.3g.40gb.0.multiprocessor_count: CI profile 0 (1c.3g.40gb) in \
             3g.40gb: multiprocessor_count: driver 20, data/gpu-profiles.json 16",
        ],
        "{out}"
    );
    assert!(
        out.lines().last().unwrap().ends_with("2 WARN, 1 FAIL"),
        "{out}"
    );
}

#[test]
fn sick_gpus_are_named_with_what_a_reset_clears_and_what_gpuctld_holds_out() {
    let mut st = fake_state();
    st["health"] = json!({"gpus": {
        "0": {"remap_pending": true},
        "1": {"lost": true},
        "2": {"ecc_disabled": true, "remap_failed": true}
    }});
    let h = Host::new(&st);
    // gpuctld took a MIG device of GPU 0 out (its registry, as the daemon writes it).
    let mig = observe(&h.state())[0].mig.as_ref().unwrap().instances[0].compute[0]
        .uuid
        .clone();
    write(
        &h.root(),
        "run/gpuctl/health.json",
        &json!({"devices": {mig.clone(): {"service": gpuctl::health::Service::Out {
            reason: "XID 94".into(),
            since: 0,
            by: gpuctl::health::Actor::Watcher,
            reset_when_idle: false,
            stopped: false,
        }}}})
        .to_string(),
    );
    let (code, out, err) = h.doctor(&[]);
    assert_eq!(code, 1, "{out}{err}");
    let line = |id: &str| {
        out.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(&format!("{id}:")[..]))
            .unwrap_or_else(|| panic!("no {id}: {out}"))
            .to_string()
    };
    assert_eq!(
        line("gpu0.health"),
        format!(
            "WARN gpu0.health: row remap pending yes, failed no; retired pages pending not \
             available; uncorrectable ECC 0; {mig} out of service since 1970-01-01T00:00:00Z \
             (by gpuctld): XID 94"
        )
    );
    assert_eq!(
        line("gpu1.health"),
        "FAIL gpu1.health: the GPU is lost (NVML: GPU is lost)"
    );
    assert_eq!(
        line("gpu2.health"),
        "FAIL gpu2.health: row remap pending no, failed yes; retired pages pending not \
         available; uncorrectable ECC not available"
    );
}

/// gpuctl's own NVML observation of the host in `state`.
fn observe(state: &Path) -> Vec<gpuctl::observe::GpuState> {
    std::env::set_var("FAKE_NVML_STATE", state);
    std::env::remove_var("FAKE_NVML_SPEC");
    std::env::remove_var("FAKE_NVML_FAIL");
    std::env::remove_var("FAKE_NVML_FAIL_AT");
    let mut b = NvmlBackend::open(Some(fakehost::lib_path()), ResetCommand::Exec(vec![]))
        .expect("fake loads");
    b.observe_gpus().expect("observe")
}

#[test]
fn record_then_replay_observes_the_same_host() {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let h = Host::new(&fake_state());
    let rec = h.dir.path().join("rec.json");
    let (code, out, err) = h.doctor(&["--record", rec.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let text = std::fs::read_to_string(&rec).unwrap();
    let recording: Recording = serde_json::from_str(&text).unwrap();
    if golden::updating() {
        std::fs::write(golden::repo_path(FIXTURE), &text).unwrap();
    }
    // Replay: a fresh fake whose state is the recording.
    let replay = Host::new(&serde_json::from_str::<Value>(&text).unwrap());
    let original = observe(&h.state());
    let replayed = observe(&replay.state());
    assert_eq!(replayed, original);
    assert_eq!(replayed, recording.expected_observation());
    assert!(replayed[0].mig.as_ref().unwrap().instances.len() == 2);
    // Recording the replayed host gives the same file.
    let rec2 = replay.dir.path().join("rec2.json");
    let (code, _, _) = replay.doctor(&["--record", rec2.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(&rec2).unwrap(), text);
}

#[test]
fn checked_in_recording_replays() {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE)).expect(
        "fixture (GPUCTL_UPDATE_GOLDEN=1 cargo test --test doctor record_then_replay writes it)",
    );
    let recording: Recording = serde_json::from_str(&text).unwrap();
    let h = Host::new(&serde_json::from_str::<Value>(&text).unwrap());
    assert_eq!(observe(&h.state()), recording.expected_observation());
    let (code, out, err) = h.doctor(&[]);
    assert_eq!(code, 0, "{out}{err}");
    let rec = h.dir.path().join("again.json");
    h.doctor(&["--record", rec.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(rec).unwrap(), text);
}
