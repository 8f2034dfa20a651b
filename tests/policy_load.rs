//! Loading the host policy from drop-in directories under a temp root: precedence, masking,
//! merge order, per-key overrides, and "every error in one run".

use gpuctl::paths::Root;
use gpuctl::policy::{load, GpuUse, Reconfigure, Selector, Severity, Size};
use std::path::{Path, PathBuf};

const USR: &str = "usr/lib/gpuctl/policy.d";
const RUN: &str = "run/gpuctl/policy.d";
const ETC: &str = "etc/gpuctl/policy.d";

fn write(root: &Path, rel: &str, text: &str) -> PathBuf {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, text).unwrap();
    p
}

fn mask(root: &Path, rel: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/dev/null", p).unwrap();
}

/// A well-formed GPU UUID of its own per team name.
fn uuid_of(name: &str) -> String {
    let h = name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    });
    format!("GPU-{h:08x}-0000-0000-0000-000000000000")
}

fn team(name: &str, extra: &str) -> String {
    let uuid = uuid_of(name);
    format!("version = 1\n[teams.{name}]\nmembers = [\"u\"]\n{extra}\n[[gpu]]\nuuid = [\"{uuid}\"]\nowner = \"{name}\"\n")
}

#[test]
fn etc_beats_run_beats_vendor_by_same_name() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    write(r, &format!("{USR}/50-a.toml"), &team("vendor", ""));
    write(r, &format!("{RUN}/50-a.toml"), &team("runtime", ""));
    write(r, &format!("{USR}/60-b.toml"), &team("vendorb", ""));
    write(r, &format!("{RUN}/60-b.toml"), &team("runtimeb", ""));
    write(r, &format!("{ETC}/60-b.toml"), &team("admin", ""));
    let o = load(&Root::new(r));
    assert!(o.diagnostics.is_empty(), "{:?}", o.diagnostics);
    let p = o.policy.unwrap();
    let names: Vec<&str> = p.teams.keys().map(AsRef::as_ref).collect();
    assert_eq!(names, ["admin", "runtime"]);
    assert_eq!(
        p.sources,
        [
            PathBuf::from("/run/gpuctl/policy.d/50-a.toml"),
            PathBuf::from("/etc/gpuctl/policy.d/60-b.toml")
        ]
    );
}

#[test]
fn dev_null_symlink_masks_lower_files() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    write(r, &format!("{USR}/10-vendor.toml"), &team("vendor", ""));
    write(r, &format!("{USR}/20-keep.toml"), &team("keep", ""));
    mask(r, &format!("{ETC}/10-vendor.toml"));
    // A mask also hides the admin's main file.
    write(r, "etc/gpuctl/policy-main.real", &team("main", ""));
    mask(r, "etc/gpuctl/policy.toml");
    let o = load(&Root::new(r));
    let p = o.policy.expect("valid");
    assert_eq!(
        p.teams.keys().map(AsRef::as_ref).collect::<Vec<&str>>(),
        ["keep"]
    );

    // A symlink to some other file is followed, not treated as a mask.
    std::os::unix::fs::symlink(
        r.join("etc/gpuctl/policy-main.real"),
        r.join(format!("{ETC}/30-link.toml")),
    )
    .unwrap();
    let p = load(&Root::new(r)).policy.expect("valid");
    assert_eq!(
        p.teams.keys().map(AsRef::as_ref).collect::<Vec<&str>>(),
        ["keep", "main"]
    );
}

#[test]
fn main_file_first_then_fragments_in_lexical_order_with_per_key_override() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    write(
        r,
        "etc/gpuctl/policy.toml",
        "version = 1\n[host]\nreconfigure = \"never\"\ndrain-timeout = \"1m\"\n\
         [teams.infer]\nmembers = [\"alice\"]\nmemory-max = \"64G\"\ncpu-weight = 200\n\
         [[gpu]]\nindex = [0]\nowner = \"infer\"\n",
    );
    // Lexical order across directories: 10 (vendor) < 20 (etc) < 30 (run).
    write(
        r,
        &format!("{USR}/10-base.toml"),
        "version = 1\n[host]\nreconfigure = \"drain\"\n[teams.infer]\nmemory-max = \"8G\"\n",
    );
    write(r, &format!("{ETC}/20-limits.toml"), "version = 1\n[teams.infer]\nmemory-max = \"32G\"\n[teams.infer.mps]\nuser = \"mps-infer\"\n");
    write(r, &format!("{RUN}/30-late.toml"), "version = 1\n[host]\nreconfigure = \"when-idle\"\n[[gpu]]\nindex = [1]\nshared = [\"infer\"]\n");
    let o = load(&Root::new(r));
    assert!(o.diagnostics.is_empty(), "{:?}", o.diagnostics);
    assert_eq!(
        o.files,
        [
            "/etc/gpuctl/policy.toml",
            "/usr/lib/gpuctl/policy.d/10-base.toml",
            "/etc/gpuctl/policy.d/20-limits.toml",
            "/run/gpuctl/policy.d/30-late.toml"
        ]
        .map(PathBuf::from)
    );
    let p = o.policy.unwrap();
    assert_eq!(p.host.reconfigure, Reconfigure::WhenIdle);
    assert_eq!(p.host.drain_timeout.as_secs(), 60, "untouched keys survive");
    let t = &p.teams["infer"];
    assert_eq!(t.limits.memory_max, Some(Size::Bytes(32 << 30)));
    assert_eq!(
        t.limits.cpu_weight,
        Some(200),
        "keys a drop-in does not set survive"
    );
    assert_eq!(t.mps.as_ref().unwrap().user.as_deref(), Some("mps-infer"));
    assert_eq!(p.gpus.len(), 2, "[[gpu]] entries concatenate");
    assert_eq!(p.gpus[0].selector, Selector::Index(vec![0]));
    assert_eq!(
        p.gpus[1].usage,
        GpuUse::Shared(vec!["infer".parse().unwrap()])
    );
}

#[test]
fn infinity_in_a_drop_in_removes_a_limit() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    write(
        r,
        &format!("{ETC}/10.toml"),
        &team("a", "memory-max = \"8G\"\ntasks-max = 10"),
    );
    write(
        r,
        &format!("{ETC}/20.toml"),
        "version = 1\n[teams.a]\nmemory-max = \"infinity\"\ntasks-max = \"infinity\"\n",
    );
    let p = load(&Root::new(r)).policy.unwrap();
    assert_eq!(p.teams["a"].limits.memory_max, None);
    assert_eq!(p.teams["a"].limits.tasks_max, None);
}

#[test]
fn reports_every_error_across_files_in_one_run() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    write(
        r,
        &format!("{ETC}/10-syntax.toml"),
        "version = 1\n[teams.a\n",
    );
    write(
        r,
        &format!("{ETC}/20-key.toml"),
        "version = 1\n[teams.b]\nmemroy-max = \"1G\"\n",
    );
    write(
        r,
        &format!("{RUN}/30-size.toml"),
        "version = 1\n[teams.c]\nmemory-max = \"12 parsecs\"\n",
    );
    write(
        r,
        &format!("{USR}/40-team.toml"),
        "version = 1\n[[gpu]]\nindex = [0]\nowner = \"nobody\"\n",
    );
    let o = load(&Root::new(r));
    assert!(o.policy.is_none());
    let errors: Vec<String> = o
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .map(|d| d.to_string())
        .collect();
    let expect = [
        "/etc/gpuctl/policy.d/10-syntax.toml:2:",
        "/etc/gpuctl/policy.d/20-key.toml:3:1: error: teams.b.memroy-max: unknown key",
        "/run/gpuctl/policy.d/30-size.toml:3:14: error: teams.c.memory-max:",
        "/usr/lib/gpuctl/policy.d/40-team.toml:4:9: error: gpu[0].owner: unknown team 'nobody'",
    ];
    assert_eq!(errors.len(), expect.len(), "{errors:#?}");
    for (e, want) in errors.iter().zip(expect) {
        assert!(e.starts_with(want), "{e}\n does not start with\n{want}");
    }
    // Host paths only: the temp root never leaks into messages.
    let root = r.display().to_string();
    assert!(errors.iter().all(|e| !e.contains(&root)));
}

#[test]
fn unreadable_file_is_distinct_from_invalid() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    // A directory named like a fragment cannot be read as a file.
    std::fs::create_dir_all(r.join(format!("{ETC}/10-dir.toml"))).unwrap();
    write(r, &format!("{ETC}/20-ok.toml"), &team("ok", ""));
    let o = load(&Root::new(r));
    assert_eq!(o.unreadable.len(), 1);
    assert_eq!(
        o.unreadable[0].0,
        PathBuf::from("/etc/gpuctl/policy.d/10-dir.toml")
    );
    assert!(o.policy.is_none());
    assert_eq!(
        o.verdict().unwrap_err(),
        gpuctl::policy::Rejected::Unreadable
    );
    assert_eq!(gpuctl::cli::exit::of_load(&o), 2);
}

#[test]
fn empty_host_is_valid_with_a_warning() {
    let d = tempfile::tempdir().unwrap();
    let o = load(&Root::new(d.path()));
    assert!(o.verdict().is_ok());
    assert_eq!(gpuctl::cli::exit::of_load(&o), 0);
    assert!(o.policy.unwrap().gpus.is_empty());
    assert_eq!(o.diagnostics.len(), 1);
    assert_eq!(o.diagnostics[0].severity, Severity::Warning);
}
