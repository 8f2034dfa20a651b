//! End to end: `plan`, then `apply --simulate --state`, then `check` exits 0.

use std::path::Path;
use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .args(args)
        .output()
        .unwrap()
}

/// Exit code and stdout+stderr together, for messages.
fn gpuctl(args: &[&str]) -> (i32, String) {
    let out = run(args);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn without_simulate_the_real_host_is_observed_through_nvml() {
    // No driver here (and a library path that cannot exist, in case the machine has one):
    // said once, and the plan goes on without GPUs.
    let out = Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .arg("plan")
        .env("GPUCTL_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_eq!(text.matches("NVML not available").count(), 1, "{text}");
    let (code, text) = gpuctl(&["check", "--simulate", "h100"]);
    assert_eq!(code, 2);
    assert!(text.contains("h100-80gb"), "valid names listed: {text}");
}

#[test]
fn plan_apply_check_converges() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/mig-inference-h100");
    let root = root.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("host.json");
    let state = state.to_str().unwrap();
    let spec = "h100-80gb*2,l40s";
    let (code, text) = gpuctl(&["--root", root, "plan", "--simulate", spec]);
    assert_eq!(code, 0, "{text}");
    let (code, _) = gpuctl(&[
        "--root",
        root,
        "check",
        "--simulate",
        spec,
        "--state",
        state,
    ]);
    assert_eq!(code, 1, "nothing applied yet");
    let (code, text) = gpuctl(&[
        "--root",
        root,
        "apply",
        "--simulate",
        spec,
        "--state",
        state,
    ]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = gpuctl(&["--root", root, "check", "--state", state]);
    assert_eq!(code, 0, "{text}");
    // Warnings go to stderr, so stdout stays parseable JSON.
    let out = run(&["--root", root, "plan", "--state", state, "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["actions"].as_array().unwrap().len(), 0);
}
