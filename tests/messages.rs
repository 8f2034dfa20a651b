//! Messages a new admin meets first, through the real binaries: each says what to write instead,
//! in the reader's units, and a JSON consumer gets JSON even when the policy is refused.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `gpuctl` with no NVML, no system bus and nothing of this host's policy: every test sees the
/// same host whatever machine runs it.
fn gpuctl(root: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuctl"));
    c.arg("--root")
        .arg(root)
        .env("GPUCTL_NVML_LIBRARY", root.join("no/libnvidia-ml.so.1"))
        .env(
            "DBUS_SYSTEM_BUS_ADDRESS",
            format!("unix:path={}", root.join("no-bus").display()),
        );
    c
}

fn run(c: &mut Command) -> (i32, String, String) {
    let o: Output = c.output().expect("run");
    (
        o.status.code().expect("exit code"),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn policy(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("policy.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn validate(text: &str) -> (i32, String) {
    let d = tempfile::tempdir().unwrap();
    let p = policy(d.path(), text);
    let (code, _, err) = run(gpuctl(d.path()).arg("validate").arg(&p));
    (code, err)
}

#[test]
fn a_decimal_size_is_refused_with_the_size_written_whole() {
    let (code, err) = validate("version = 1\n[teams.infer]\nmemory-high = \"1.5G\"\n");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(
            "teams.infer.memory-high: '1.5G': decimals are not accepted; write it whole with a \
             smaller unit: '1536M'"
        ),
        "{err}"
    );
}

#[test]
fn a_size_without_unit_below_the_floor_asks_whether_gib_were_meant() {
    let (code, err) = validate("version = 1\n[teams.infer]\nmemory-max = 32\n");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("teams.infer.memory-max: 32 bytes is below the floor of 64 MiB")
            && err.contains("did you mean \"32G\"?"),
        "{err}"
    );
    assert!(
        !err.contains("MIN_MEMORY_BYTES"),
        "no internal names: {err}"
    );
}

#[test]
fn an_si_unit_is_refused_naming_the_power_of_1024_meant() {
    let (code, err) = validate("version = 1\n[teams.infer]\nmemory-max = \"64GB\"\n");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("did you mean '64G' (64 GiB)?"), "{err}");
}

#[test]
fn a_gpu_entry_with_a_wrong_type_does_not_also_say_its_team_has_no_gpus() {
    let (code, err) =
        validate("version = 1\n[teams.infer]\n[[gpu]]\nindex = \"0\"\nowner = \"infer\"\n");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("gpu[0].index: "), "{err}");
    assert!(!err.contains("has no GPUs"), "a false warning: {err}");
    // The warning itself still comes where it is true.
    let (code, err) = validate("version = 1\n[teams.infer]\n");
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("team 'infer' has no GPUs"), "{err}");
}

#[test]
fn cpus_given_as_an_array_are_told_to_be_a_string() {
    let (_, err) = validate("version = 1\n[teams.infer]\nallowed-cpus = [0, 1]\n");
    assert!(
        err.contains("expected a string, found an array (expected CPU numbers and ranges in a string, e.g. \"0-15,32\")"),
        "{err}"
    );
}

#[test]
fn env_with_a_dash_in_the_team_suggests_the_underscore_name() {
    let d = tempfile::tempdir().unwrap();
    let (code, _, err) = run(gpuctl(d.path()).args(["env", "--team", "ml-infer"]));
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("did you mean \"ml_infer\"?"), "{err}");
    // The same name in a policy: validate says the same.
    let (_, err) = validate("version = 1\n[teams.ml-infer]\n");
    assert!(err.contains("did you mean 'ml_infer'?"), "{err}");
}

#[test]
fn plan_without_nvml_still_rejects_a_cpu_the_host_lacks() {
    let d = tempfile::tempdir().unwrap();
    let bad = policy(
        d.path(),
        "version = 1\n[teams.infer]\nallowed-cpus = \"4000-4001\"\n[[gpu]]\nindex = [0]\nowner = \"infer\"\n",
    );
    let (code, out, err) = run(gpuctl(d.path()).arg("plan").arg(&bad));
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("teams.infer.allowed-cpus: CPU 4001 does not exist"),
        "{err}"
    );
    assert!(err.contains("the GPUs are unknown"), "{err}");
    let good = policy(
        d.path(),
        "version = 1\n[teams.infer]\nallowed-cpus = \"0\"\n[[gpu]]\nindex = [0]\nowner = \"infer\"\n",
    );
    let (code, out, err) = run(gpuctl(d.path()).arg("plan").arg(&good));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("Host: GPUs unknown (NVML not available), "),
        "{out}"
    );
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

#[test]
fn plan_json_on_a_refused_policy_prints_the_diagnostics_as_validate_json_does() {
    let d = tempfile::tempdir().unwrap();
    let p = policy(
        d.path(),
        "version = 1\n[teams.infer]\nmemory-max = \"1.5G\"\n",
    );
    let (code, out, _) = run(gpuctl(d.path()).args(["plan", "--json"]).arg(&p));
    assert_eq!(code, 1);
    let (_, want, _) = run(gpuctl(d.path()).args(["validate", "--json"]).arg(&p));
    assert_eq!(
        json(&out),
        json(&want),
        "the same document as validate --json"
    );
    assert_eq!(json(&out)["valid"], false);
    // Refused by the host check (a simulated one): the same schema.
    let p = policy(
        d.path(),
        "version = 1\n[teams.infer]\n[[gpu]]\nindex = [5]\nowner = \"infer\"\n",
    );
    let (code, out, err) = run(gpuctl(d.path())
        .args(["plan", "--json", "--simulate", "h100-80gb*2"])
        .arg(&p));
    assert_eq!(code, 1, "{err}");
    let v = json(&out);
    assert_eq!(v["valid"], false);
    let diag = &v["diagnostics"][0];
    for k in [
        "severity", "file", "line", "column", "key", "message", "help",
    ] {
        assert!(diag.get(k).is_some(), "{k} missing: {diag}");
    }
    assert_eq!(diag["severity"], "error");
    assert!(
        diag["message"].as_str().unwrap().contains("gpu 5"),
        "{diag}"
    );
    assert!(v["files"].is_array() && v["unreadable"].is_array(), "{v}");
}

/// Wait for `child` at most `limit`; killed (and the test failed) when it takes longer.
fn wait(child: &mut std::process::Child, limit: Duration) -> i32 {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code().unwrap_or(-1);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn top_in_a_terminal_without_gpuctld_exits_6_as_its_help_says() {
    let d = tempfile::tempdir().unwrap();
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let mut child = gpuctl(d.path())
        .arg("top")
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    let mut master = std::fs::File::from(pty.master);
    // Quit at once, as a person would on seeing the error: the code must still be 6.
    let _ = master.write_all(b"q");
    let code = wait(&mut child, Duration::from_secs(30));
    assert_eq!(code, 6);
    let mut buf = [0u8; 4096];
    let n = master.read(&mut buf).unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(
        text.contains("gpuctld is not running") || text.contains("system bus"),
        "{text}"
    );
}

#[test]
fn top_once_without_gpuctld_exits_6() {
    let d = tempfile::tempdir().unwrap();
    let (code, _, err) = run(gpuctl(d.path()).args(["top", "--once"]));
    assert_eq!(code, 6, "{err}");
}

fn gpuctld(root: &Path) -> (i32, String) {
    let (code, _, err) = run(Command::new(env!("CARGO_BIN_EXE_gpuctld"))
        .arg("--root")
        .arg(root)
        .env_remove("JOURNAL_STREAM")
        .env_remove("NOTIFY_SOCKET")
        .env(
            "DBUS_SYSTEM_BUS_ADDRESS",
            format!("unix:path={}", root.join("no-bus").display()),
        ));
    (code, err)
}

#[test]
fn gpuctld_without_systemd_as_pid_1_says_so() {
    let d = tempfile::tempdir().unwrap();
    let (code, err) = gpuctld(d.path());
    assert_ne!(code, 0);
    assert!(
        err.contains(
            "gpuctld needs systemd as PID 1 (no /run/systemd/system, and PID 1 is unknown)"
        ),
        "{err}"
    );
    // On a systemd host the same failure is the bus's own words, not a wrong hint.
    std::fs::create_dir_all(d.path().join("run/systemd/system")).unwrap();
    let (code, err) = gpuctld(d.path());
    assert_ne!(code, 0);
    assert!(!err.contains("needs systemd"), "{err}");
    assert!(err.contains("system bus"), "{err}");
}
