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
    assert_eq!(
        text.matches("gpuctl: NVML not available").count(),
        1,
        "{text}"
    );
    assert!(
        text.contains("Host: GPUs unknown (NVML not available)"),
        "{text}"
    );
    let (code, text) = gpuctl(&["check", "--simulate", "h10"]);
    assert_eq!(code, 2);
    assert!(text.contains("did you mean 'h100'?"), "{text}");
    assert!(
        text.contains("h100-80gb (or h100, h100-sxm)"),
        "valid names listed: {text}"
    );
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

/// The simulated host each example in `policies/` is written for (see each file's header).
const EXAMPLE_HOSTS: &[(&str, &str)] = &[
    ("a-whole-gpus.toml", "a100-80gb*4"),
    ("b-mps-small-jobs.toml", "h100-pcie"),
    ("c-mig-inference-interns.toml", "h100-80gb"),
    ("d-eight-gpu-five-teams.toml", "h100-80gb*8"),
];

fn actions(json: &[u8]) -> Vec<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(json).unwrap();
    v["actions"].as_array().unwrap().clone()
}

fn kinds(actions: &[serde_json::Value], kind: &str) -> usize {
    actions.iter().filter(|a| a["kind"] == kind).count()
}

#[test]
fn every_example_plans_applies_and_converges_on_its_host() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    files.sort();
    let listed: Vec<&str> = EXAMPLE_HOSTS.iter().map(|(f, _)| *f).collect();
    assert_eq!(files, listed, "give every example a host in EXAMPLE_HOSTS");

    for (file, spec) in EXAMPLE_HOSTS {
        let policy = dir.join(file);
        let policy = policy.to_str().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("host.json");
        let state = state.to_str().unwrap();

        let out = run(&["plan", "--simulate", spec, "--json", policy]);
        assert_eq!(out.status.code(), Some(0), "{file}: {out:?}");
        let first = actions(&out.stdout);
        assert!(!first.is_empty(), "{file}: a fresh host needs changes");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["blocked"].as_array().unwrap().len(), 0, "{file}: {v:#}");

        let (code, text) = gpuctl(&["apply", "--simulate", spec, "--state", state, policy]);
        assert_eq!(code, 0, "{file}: {text}");
        let (code, text) = gpuctl(&["check", "--state", state, policy]);
        assert_eq!(code, 0, "{file}: {text}");
        let out = run(&["plan", "--state", state, "--json", policy]);
        assert_eq!(actions(&out.stdout).len(), 0, "{file}: replan not empty");
    }
}

#[test]
fn changing_one_of_seven_instances_in_a_policy_file_plans_one_destroy_and_one_create() {
    // Example D gives gpu 7 seven 1g.10gb instances. Turning one of batch's three into a
    // 1g.10gb+me, in a copy of the file, must touch exactly that one instance.
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/d-eight-gpu-five-teams.toml");
    let text = std::fs::read_to_string(&d).unwrap();
    let old = r#"{ profile = "1g.10gb", owner = "batch", count = 3 },"#;
    assert!(text.contains(old), "example D changed; update this test");
    let edited = text.replace(
        old,
        r#"{ profile = "1g.10gb", owner = "batch", count = 2 },
  { profile = "1g.10gb+me", owner = "batch" },"#,
    );
    let tmp = tempfile::tempdir().unwrap();
    let v2 = tmp.path().join("policy-v2.toml");
    std::fs::write(&v2, edited).unwrap();
    let (v1, v2) = (d.to_str().unwrap(), v2.to_str().unwrap());
    let state = tmp.path().join("host.json");
    let state = state.to_str().unwrap();

    let (code, text) = gpuctl(&["apply", "--simulate", "h100-80gb*8", "--state", state, v1]);
    assert_eq!(code, 0, "{text}");
    let out = run(&["plan", "--json", "--state", state, v2]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let plan = actions(&out.stdout);
    assert_eq!(kinds(&plan, "destroy-gi"), 1, "{plan:#?}");
    assert_eq!(kinds(&plan, "create-gi"), 1, "{plan:#?}");
    let mig: Vec<&serde_json::Value> = plan
        .iter()
        .filter(|a| a["phase"] == "mig-instances" || a["phase"] == "mig-mode")
        .collect();
    assert!(
        mig.iter()
            .all(|a| a["gi"]["index"] == 7 || a["ci"]["gi"]["index"] == 7),
        "only gpu 7 changes: {mig:#?}"
    );
    let created = plan.iter().find(|a| a["kind"] == "create-gi").unwrap();
    assert_eq!(created["profile"], "1g.10gb+me");
    assert_eq!(created["owner"], "batch");

    let (code, text) = gpuctl(&["apply", "--state", state, v2]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = gpuctl(&["check", "--state", state, v2]);
    assert_eq!(code, 0, "{text}");
}

#[test]
fn empty_mig_holds_a_gpu_in_mig_mode_and_empties_one_that_had_instances() {
    const TEAMS: &str = "version = 1\n[teams.a]\nmembers = [\"alice\"]\n\
                         [teams.b]\nmembers = [\"bob\"]\n";
    let v1 = format!(
        "{TEAMS}[[gpu]]\nindex = [0]\nmig = [{{ profile = \"3g.40gb\", owner = \"a\" }}, \
         {{ profile = \"3g.40gb\", owner = \"b\" }}]\n[[gpu]]\nindex = [1]\nmig = []\n"
    );
    let v2 = v1.replace(
        "mig = [{ profile = \"3g.40gb\", owner = \"a\" }, { profile = \"3g.40gb\", owner = \"b\" }]",
        "mig = []",
    );
    assert_ne!(v1, v2);
    let tmp = tempfile::tempdir().unwrap();
    let (p1, p2) = (tmp.path().join("v1.toml"), tmp.path().join("v2.toml"));
    std::fs::write(&p1, &v1).unwrap();
    std::fs::write(&p2, &v2).unwrap();
    let (p1, p2) = (p1.to_str().unwrap(), p2.to_str().unwrap());
    let state = tmp.path().join("host.json");
    let state = state.to_str().unwrap();
    let spec = "h100-80gb*2";

    let (code, text) = gpuctl(&["validate", p1]);
    assert_eq!(code, 0, "{text}");
    // gpu 1 turns MIG on and gets nothing else; the plan says whose it is: no team's.
    let (code, text) = gpuctl(&["plan", "--simulate", spec, p1]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("    wants: MIG on, no instances (mig = []): no team gets this GPU\n"),
        "{text}"
    );
    assert!(
        text.contains("— gpu 1 wants MIG mode with no instances (mig = [])"),
        "{text}"
    );
    let out = run(&["plan", "--simulate", spec, "--json", p1]);
    let first = actions(&out.stdout);
    let on_gpu1 = |a: &&serde_json::Value| a["index"] == 1 || a["gi"]["index"] == 1;
    let gpu1: Vec<&serde_json::Value> = first.iter().filter(on_gpu1).collect();
    assert_eq!(gpu1.len(), 1, "{gpu1:#?}");
    assert_eq!(gpu1[0]["kind"], "set-mig-mode");
    assert_eq!(gpu1[0]["enable"], true);

    let (code, text) = gpuctl(&["apply", "--simulate", spec, "--state", state, p1]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = gpuctl(&["check", "--state", state, p1]);
    assert_eq!(code, 0, "{text}");

    // v2 empties gpu 0: its two instances go, the mode stays, nothing is created.
    let out = run(&["plan", "--json", "--state", state, p2]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let plan = actions(&out.stdout);
    assert_eq!(kinds(&plan, "destroy-gi"), 2, "{plan:#?}");
    assert_eq!(kinds(&plan, "destroy-ci"), 2, "{plan:#?}");
    assert_eq!(kinds(&plan, "create-gi"), 0, "{plan:#?}");
    assert_eq!(kinds(&plan, "set-mig-mode"), 0, "{plan:#?}");
    let (code, text) = gpuctl(&["apply", "--state", state, p2]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = gpuctl(&["check", "--state", state, p2]);
    assert_eq!(code, 0, "{text}");
    let out = run(&["plan", "--state", state, "--json", p2]);
    assert_eq!(actions(&out.stdout).len(), 0, "replan not empty");
    let (_, text) = gpuctl(&["plan", "--state", state, p2]);
    assert!(text.contains("gets: no GPUs"), "{text}");
}
