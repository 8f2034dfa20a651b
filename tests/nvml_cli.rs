//! `gpuctl plan/check/apply --local` on the real-host path, with the fake NVML library loaded
//! through `GPUCTL_NVML_LIBRARY`. Each test runs the binary with its own environment, so these
//! tests do not share state.

mod fakehost;

use std::path::Path;
use std::process::{Command, Output};

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("root")).unwrap();
        Env { dir }
    }
    fn root(&self) -> std::path::PathBuf {
        self.dir.path().join("root")
    }
    fn state(&self) -> std::path::PathBuf {
        self.dir.path().join("fake.json")
    }
    fn run(&self, spec: &str, lib: &Path, args: &[&str], policy: &str) -> Output {
        let f = self.dir.path().join("policy.toml");
        std::fs::write(&f, policy).unwrap();
        Command::new(env!("CARGO_BIN_EXE_gpuctl"))
            .args(args)
            .arg("--root")
            .arg(self.root())
            .arg(&f)
            .env("GPUCTL_NVML_LIBRARY", lib)
            .env("GPUCTL_GPU_RESET_CMD", "fake:")
            .env("FAKE_NVML_STATE", self.state())
            .env("FAKE_NVML_SPEC", spec)
            .env("FAKE_NVML_ROOT", self.root())
            .env_remove("FAKE_NVML_FAIL")
            .env_remove("FAKE_NVML_FAIL_AT")
            .output()
            .unwrap()
    }
    fn mutating_calls(&self) -> u64 {
        if !self.state().exists() {
            return 0;
        }
        fake_nvml::control::read(&self.state())
            .unwrap()
            .mutating_calls
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn mig_policy(model_index_geometry: &str) -> String {
    format!(
        "version = 1\n[teams.a]\nmembers = [\"@a\"]\n[teams.b]\nmembers = [\"@b\"]\n\
         [[gpu]]\nindex = [0]\nmig = [ {model_index_geometry} ]\n"
    )
}

#[test]
fn invalid_geometries_are_rejected_before_any_nvml_mutation() {
    let lib = fakehost::lib_path();
    // Each case with the reason it is refused for: any refusal would not do (the first case's
    // "compute slices" also matched the hint every geometry error carries).
    let table: &[(&str, &str, &str)] = &[
        (
            "h100",
            "{ profile = \"3g.40gb\", owner = \"a\", count = 3 }",
            "3g.40gb x3 needs 12 of 8 memory slices",
        ),
        (
            "h100",
            "{ profile = \"1g.10gb\", owner = \"a\", count = 8 }",
            "gpu[0].mig[0].count: 8 is out of range (expected an integer from 1 to 7)",
        ),
        (
            "h100",
            "{ profile = \"1g.5gb\", owner = \"a\" }",
            "no MIG profile '1g.5gb'",
        ),
        (
            "h100",
            "{ profile = \"1g.10gb+me\", owner = \"a\", count = 2 }",
            "1g.10gb+me x2 exceeds the 1 instance(s) of 1g.10gb+me",
        ),
        (
            "h100",
            "{ profile = \"3g.40gb\", owner = \"a\", compute = [\"2c\", \"2c\"] }",
            "2c.3g.40gb x2 needs 4 of 3 compute slices",
        ),
        (
            "a100",
            "{ profile = \"4g.20gb\", owner = \"a\" }, { profile = \"4g.20gb\", owner = \"b\" }",
            "4g.20gb x2 needs 8 of 7 compute slices",
        ),
        (
            "a100",
            "{ profile = \"2g.20gb\", owner = \"a\" }",
            "no MIG profile '2g.20gb'",
        ),
        (
            "a30",
            "{ profile = \"4g.24gb\", owner = \"a\", count = 2 }",
            "4g.24gb x2 needs 8 of 4 memory slices",
        ),
        (
            "a30",
            "{ profile = \"3g.40gb\", owner = \"a\" }",
            "no MIG profile '3g.40gb'",
        ),
        (
            "h200",
            "{ profile = \"7g.141gb\", owner = \"a\" }, { profile = \"1g.18gb\", owner = \"b\" }",
            "7g.141gb + 1g.18gb needs 9 of 8 memory slices",
        ),
        (
            "l40s",
            "{ profile = \"1g.10gb\", owner = \"a\" }",
            "this GPU has no MIG",
        ),
    ];
    for (spec, geo, needle) in table {
        let e = Env::new();
        let o = e.run(spec, &lib, &["apply", "--local"], &mig_policy(geo));
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{spec} {geo}: {t}");
        assert!(t.contains(needle), "{spec} {geo}: want {needle:?} in:\n{t}");
        assert_eq!(e.mutating_calls(), 0, "{spec} {geo}: NVML was changed");
    }
}

#[test]
fn apply_local_converges_and_check_agrees() {
    let lib = fakehost::lib_path();
    let e = Env::new();
    let pol = mig_policy(
        "{ profile = \"3g.40gb\", owner = \"a\" }, \
         { profile = \"3g.40gb\", owner = \"b\", compute = [\"1c\", \"1c\", \"1c\"] }",
    );
    let o = e.run("h100*2", &lib, &["check"], &pol);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = e.run("h100*2", &lib, &["plan"], &pol);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("create GI 3g.40gb"), "{}", text(&o));
    let o = e.run("h100*2", &lib, &["apply", "--local"], &pol);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("needs systemd"), "skipped phases are named: {t}");
    assert!(e.root().join("run/gpuctl/teams/a.env").exists());
    assert!(e.root().join("var/lib/gpuctl/owners.json").exists());
    assert!(!e.root().join("var/lib/gpuctl/journal.json").exists());
    let calls = e.mutating_calls();
    let o = e.run("h100*2", &lib, &["check"], &pol);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = e.run("h100*2", &lib, &["apply", "--local"], &pol);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(e.mutating_calls(), calls, "a converged host is not touched");
}

#[test]
fn apply_on_the_real_host_goes_to_the_daemon() {
    let e = Env::new();
    let o = e.run("h100", &fakehost::lib_path(), &["apply"], &mig_policy(""));
    // No system bus here: the daemon cannot be reached, nothing is applied in-process, and
    // the way without the daemon is named.
    assert_eq!(o.status.code(), Some(6), "{}", text(&o));
    assert!(text(&o).contains("gpuctld"), "{}", text(&o));
    assert!(text(&o).contains("--local"), "{}", text(&o));
    assert_eq!(e.mutating_calls(), 0);
}

#[test]
fn without_nvml_plan_and_check_say_so_once_and_keep_working() {
    let e = Env::new();
    let missing = e.dir.path().join("no-such-libnvidia-ml.so.1");
    let pol = "version = 1\n[teams.a]\nmembers = [\"@a\"]\nmemory-max = \"10G\"\n\
               [[gpu]]\nindex = [0]\nowner = \"a\"\n";
    for (cmd, code) in [("plan", 0), ("check", 2)] {
        let o = e.run("h100", &missing, &[cmd], pol);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(code), "{cmd}: {t}");
        assert_eq!(t.matches("NVML not available:").count(), 1, "{cmd}: {t}");
        assert!(!t.contains("panicked"), "{t}");
    }
    // The slice and env parts of the plan are still there.
    let o = e.run("h100", &missing, &["plan"], pol);
    assert!(text(&o).contains("gpu-a.slice"), "{}", text(&o));
    let o = e.run("h100", &missing, &["apply", "--local"], pol);
    assert!(!text(&o).contains("panicked"), "{}", text(&o));
    assert!(e.root().join("run/gpuctl/teams/a.env").exists());
}
