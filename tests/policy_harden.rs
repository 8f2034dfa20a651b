//! Issue #18, items 1 and 2: inputs that crashed, hung or were wrongly accepted by the loader.
//! Each test here failed on `main` before the fix (a panic, a hang caught by the timeout, or a
//! policy accepted that must not be).

use gpuctl::observe::Observed;
use gpuctl::paths::Root;
use gpuctl::policy::validate::check_against_host;
use gpuctl::policy::{load, load_files, LoadOutcome, Policy};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

const ETC: &str = "etc/gpuctl/policy.d";
const GOOD: &str = "version = 1\n[teams.a]\nmembers = [\"u\"]\n";

fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join(ETC)).unwrap();
    for (name, text) in files {
        std::fs::write(d.path().join(ETC).join(name), text).unwrap();
    }
    d
}

/// Load under `root` on another thread: a loader that blocks fails the test instead of hanging
/// it.
fn load_within(root: &Path, secs: u64) -> LoadOutcome {
    let (tx, rx) = mpsc::channel();
    let r = Root::new(root);
    std::thread::spawn(move || {
        let _ = tx.send(load(&r));
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("the loader blocked")
}

fn one(text: &str) -> LoadOutcome {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("p.toml");
    std::fs::write(&p, text).unwrap();
    load_files(&[p])
}

fn errors(o: &LoadOutcome) -> Vec<String> {
    o.diagnostics
        .iter()
        .filter(|d| d.severity == gpuctl::policy::Severity::Error)
        .map(|d| d.to_string())
        .collect()
}

fn rejected(text: &str, needle: &str) {
    let o = one(text);
    let e = errors(&o);
    assert!(o.policy.is_none(), "accepted: {text} {:?}", o.diagnostics);
    assert!(
        e.iter().any(|m| m.contains(needle)),
        "{needle:?} not in {e:#?}"
    );
}

#[test]
fn a_long_sum_of_durations_is_an_error_not_a_panic() {
    // Each term fits a Duration; their sum does not (it panicked in `Duration` addition).
    let sum = vec!["4294967295d"; 60_000].join("");
    rejected(
        &format!("version = 1\n[host]\ndrain-timeout = \"{sum}\"\n"),
        "is too large",
    );
}

#[test]
fn a_fifo_named_toml_is_refused_without_blocking() {
    let d = dir_with(&[("10-good.toml", GOOD)]);
    let fifo = d.path().join(ETC).join("20-fifo.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let o = load_within(d.path(), 20);
    assert!(o.policy.is_none());
    assert_eq!(o.unreadable.len(), 1, "{:?}", o.unreadable);
    assert_eq!(
        o.unreadable[0].0,
        PathBuf::from("/etc/gpuctl/policy.d/20-fifo.toml")
    );
    assert!(o.unreadable[0].1.contains("a FIFO"), "{:?}", o.unreadable);
}

#[test]
fn a_link_to_dev_zero_is_refused_without_reading_it() {
    let d = dir_with(&[("10-good.toml", GOOD)]);
    std::os::unix::fs::symlink("/dev/zero", d.path().join(ETC).join("30-zero.toml")).unwrap();
    let o = load_within(d.path(), 20);
    assert!(o.policy.is_none());
    assert!(
        o.unreadable[0].1.contains("a character device"),
        "{:?}",
        o.unreadable
    );
}

#[test]
fn a_file_over_the_size_cap_is_refused_naming_the_cap() {
    let big = format!("{GOOD}#{}\n", "x".repeat(2 << 20));
    let d = dir_with(&[("10-big.toml", &big)]);
    let o = load_within(d.path(), 20);
    assert!(o.policy.is_none());
    assert!(
        o.unreadable[0].1.contains("over the 1024 KiB limit"),
        "{:?}",
        o.unreadable
    );
}

#[test]
fn long_lists_hit_caps_that_name_themselves() {
    let members: Vec<String> = (0..100_000).map(|i| format!("\"u{i}\"")).collect();
    rejected(
        &format!(
            "version = 1\n[teams.a]\nmembers = [{}]\n",
            members.join(",")
        ),
        "100000 members is over the limit of 4096 (MAX_MEMBERS)",
    );
    // 120,000 entries: as many as fit under the 1 MiB file cap.
    let idx: Vec<String> = (0..120_000).map(|i| i.to_string()).collect();
    rejected(
        &format!(
            "{GOOD}[[gpu]]\nindex = [{}]\nowner = \"a\"\n",
            idx.join(",")
        ),
        "120000 GPUs is over the limit of 1024 (MAX_SELECTED_GPUS)",
    );
    let teams: String = (0..1100)
        .map(|i| format!("[teams.t{i}]\nmembers = [\"u\"]\n"))
        .collect();
    rejected(&format!("version = 1\n{teams}"), "(MAX_TEAMS)");
}

#[test]
fn cpu_ranges_are_merged_not_expanded() {
    // 2,000 full ranges: expanded, 131 million CPU numbers; as intervals, one.
    let list = "0-65535,".repeat(2000);
    let o = one(&format!(
        "version = 1\n[teams.a]\nmembers = [\"u\"]\nallowed-cpus = \"{}\"\n",
        list.trim_end_matches(',')
    ));
    let p = o.policy.unwrap_or_else(|| panic!("{:#?}", o.diagnostics));
    assert_eq!(
        p.teams["a"]
            .limits
            .allowed_cpus
            .as_ref()
            .map(|c| c.to_string())
            .as_deref(),
        Some("0-65535")
    );
    rejected(
        &format!(
            "version = 1\n[teams.a]\nallowed-cpus = \"{}\"\n",
            vec!["1"; 5000].join(",")
        ),
        "(MAX_CPU_ITEMS)",
    );
    assert_eq!(
        gpuctl::policy::parse::parse_cpus("8,0-3,4-5,2,10-11,12").unwrap(),
        "0-5,8,10-12"
    );
}

#[test]
fn memory_limits_below_the_floor_are_errors() {
    rejected(
        "version = 1\n[teams.a]\nmemory-max = 0\n",
        "teams.a.memory-max: 0 bytes is below the floor of 64 MiB",
    );
    rejected(
        "version = 1\n[teams.a]\nmemory-high = \"1M\"\n",
        "teams.a.memory-high: 1 MiB is below the floor of 64 MiB",
    );
}

fn valid(text: &str) -> Policy {
    let o = one(text);
    o.policy.unwrap_or_else(|| panic!("{:#?}", o.diagnostics))
}

fn host_errors(p: &Policy, ram: u64) -> Vec<String> {
    let mut obs = Observed::default();
    obs.host.memory_bytes = ram;
    obs.host.cpus = 8;
    check_against_host(p, &obs)
        .iter()
        .map(|d| d.to_string())
        .collect()
}

#[test]
fn memory_limits_are_resolved_and_compared_on_the_host() {
    let ram = 64u64 << 30;
    let p = valid("version = 1\n[teams.a]\nmemory-max = \"128G\"\n");
    let e = host_errors(&p, ram);
    assert!(
        e.iter()
            .any(|m| m.contains("teams.a.memory-max") && m.contains("above this host's RAM")),
        "{e:#?}"
    );
    let p = valid("version = 1\n[teams.a]\nmemory-max = \"10G\"\nmemory-high = \"50%\"\n");
    let e = host_errors(&p, ram);
    assert!(
        e.iter()
            .any(|m| m.contains("error: teams.a.memory-high") && m.contains("is above memory-max")),
        "{e:#?}"
    );
    let p = valid("version = 1\n[teams.a]\nmemory-max = \"0.01%\"\n");
    assert!(host_errors(&p, ram)
        .iter()
        .any(|m| m.contains("below the floor")));
    let p = valid("version = 1\n[teams.a]\nmemory-max = \"50%\"\nmemory-high = \"10G\"\n");
    assert!(host_errors(&p, ram).is_empty());
}

#[test]
fn durations_have_a_maximum_and_drain_needs_time() {
    // 5·10¹¹ years.
    rejected(
        "version = 1\n[host]\ndrain-timeout = \"15768000000000000000\"\n",
        "(MAX_DRAIN_TIMEOUT)",
    );
    rejected(
        "version = 1\n[host]\ndrain-timeout = 999999999999\n",
        "(MAX_DRAIN_TIMEOUT)",
    );
    rejected(
        "version = 1\n[host]\nreconfigure = \"drain\"\ndrain-timeout = \"0s\"\n",
        "host.drain-timeout: a drain timeout of 0",
    );
    valid("version = 1\n[host]\nreconfigure = \"when-idle\"\ndrain-timeout = \"0s\"\n");
    valid("version = 1\n[host]\nreconfigure = \"drain\"\ndrain-timeout = \"24h\"\n");
}

#[test]
fn mps_control_is_no_longer_accepted() {
    rejected(
        "version = 1\n[host]\nmps-control = \"/usr/bin/nvidia-cuda-mps-control\"\n",
        "host.mps-control: `mps-control` is no longer a setting",
    );
}

#[test]
fn gpu_uuids_are_checked_in_full() {
    rejected(
        &format!("{GOOD}[[gpu]]\nuuid = \"GPU-../../etc\"\nowner = \"a\"\n"),
        "'GPU-../../etc' is not a GPU UUID",
    );
    valid(&format!(
        "{GOOD}[[gpu]]\nuuid = \"GPU-5a1b2c3d-0000-1111-2222-333344445555\"\nowner = \"a\"\n"
    ));
}

#[test]
fn control_characters_in_diagnostics_are_escaped() {
    let o = one("version = 1\n[teams.a]\n\"bad\\u001b[31m\\nkey\\u0000\" = 1\n");
    let e = errors(&o);
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(!e[0].chars().any(char::is_control), "{:?}", e[0]);
    assert!(e[0].contains("bad\\u{1b}[31m\\nkey\\u{0}"), "{}", e[0]);
}

#[test]
fn files_with_names_that_are_not_utf8_are_named_in_a_warning() {
    use std::os::unix::ffi::OsStrExt;
    let d = dir_with(&[("10-good.toml", GOOD)]);
    let name = std::ffi::OsStr::from_bytes(b"20-\xff\xfe.toml");
    std::fs::write(d.path().join(ETC).join(name), GOOD).unwrap();
    let o = load(&Root::new(d.path()));
    assert!(o.policy.is_some(), "{:#?}", o.diagnostics);
    let w: Vec<String> = o.diagnostics.iter().map(|d| d.to_string()).collect();
    assert!(
        w.iter()
            .any(|m| m.contains("warning: /etc/gpuctl/policy.d/20-")
                && m.contains("skipped: the file name is not UTF-8")),
        "{w:#?}"
    );
}
