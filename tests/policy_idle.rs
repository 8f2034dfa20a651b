//! `[teams.NAME.idle]`: good values become an `IdleRule`, bad ones the usual
//! `file:line:col: error: key: message` and no policy; drop-ins merge per key.

mod common;

use common::write;
use gpuctl::policy::{load_files, IdleAction, Severity};
use std::time::Duration;

const HEAD: &str = "version = 1\n[teams.research]\nmembers = [\"ann\"]\n[[gpu]]\nindex = [0]\nowner = \"research\"\n";

/// Diagnostics of one file holding `HEAD` + `idle`, with the temp dir cut from paths.
fn diags(idle: &str) -> (bool, Vec<String>) {
    let (p, d) = common::load_text(&format!("{HEAD}{idle}"));
    (p.is_some(), d)
}

#[test]
fn a_full_rule_parses() {
    let (ok, d) = diags(
        "[teams.research.idle]\nafter = \"2h\"\nbelow = \"5%\"\naction = \"stop\"\ngrace = \"15m\"\n\
         exclude = [\"triton-*.service\", \"jupyter?.scope\"]\nmemory-alarm = \"95%\"\n",
    );
    assert!(ok, "{d:?}");
    assert!(d.is_empty(), "{d:?}");
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "p.toml",
        &format!("{HEAD}[teams.research.idle]\nafter = 7200\nbelow = \"2.5%\"\naction = \"warn\"\nexclude = \"x.service\"\n"),
    );
    let pol = load_files(&[p]).policy.unwrap();
    let r = pol.teams["research"].idle.clone().unwrap();
    assert_eq!(r.after, Duration::from_secs(7200));
    assert_eq!(r.below, 2.5);
    assert_eq!(r.action, IdleAction::Warn);
    assert_eq!(r.grace, Duration::from_secs(900), "default grace");
    assert_eq!(r.exclude, vec!["x.service"]);
    assert_eq!(r.memory_alarm, None);
}

#[test]
fn defaults_and_no_rule() {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "p.toml", HEAD);
    assert_eq!(
        load_files(&[p]).policy.unwrap().teams["research"].idle,
        None
    );
    let p = write(
        d.path(),
        "q.toml",
        &format!("{HEAD}[teams.research.idle]\nafter = \"30m\"\n"),
    );
    let r = load_files(&[p]).policy.unwrap().teams["research"]
        .idle
        .clone()
        .unwrap();
    assert_eq!(r.below, 5.0);
    assert_eq!(r.action, IdleAction::Report);
    assert!(r.exclude.is_empty());
}

/// Every bad value: rejected, with file, line, column, key and a message naming the value.
#[test]
fn bad_values_name_file_line_and_key() {
    let cases: &[(&str, &str)] = &[
        (
            "after = \"2 hours\"",
            "p.toml:8:9: error: teams.research.idle.after: '2 hours'",
        ),
        (
            "after = \"0s\"",
            "p.toml:8:9: error: teams.research.idle.after: the idle window must be longer than 0",
        ),
        (
            "after = -5",
            "p.toml:8:9: error: teams.research.idle.after: negative duration -5",
        ),
        (
            "after = \"1h\"\nbelow = 5",
            "p.toml:9:9: error: teams.research.idle.below: expected a percentage, found an integer",
        ),
        (
            "after = \"1h\"\nbelow = \"0%\"",
            "p.toml:9:9: error: teams.research.idle.below: '0%': a percentage must be more than 0",
        ),
        (
            "after = \"1h\"\nbelow = \"150%\"",
            "p.toml:9:9: error: teams.research.idle.below: '150%': a percentage must be more than 0",
        ),
        (
            "after = \"1h\"\nbelow = \"five%\"",
            "p.toml:9:9: error: teams.research.idle.below: 'five%' is not a percentage",
        ),
        (
            "after = \"1h\"\naction = \"kill\"",
            "p.toml:9:10: error: teams.research.idle.action: unknown idle action 'kill' (expected one of: report, warn, stop)",
        ),
        (
            "after = \"1h\"\naction = \"stop\"\ngrace = \"soon\"",
            "p.toml:10:9: error: teams.research.idle.grace: 'soon'",
        ),
        (
            "after = \"1h\"\nexclude = [\"ok.service\", \"bad/unit\"]",
            "p.toml:9:11: error: teams.research.idle.exclude: 'bad/unit' is not a unit-name glob",
        ),
        (
            "after = \"1h\"\nexclude = [\"a.service\", \"a.service\"]",
            "p.toml:9:11: error: teams.research.idle.exclude: \"a.service\" is listed twice",
        ),
        (
            "after = \"1h\"\nexclude = [1]",
            "p.toml:9:11: error: teams.research.idle.exclude: expected a list of unit-name globs",
        ),
        (
            "after = \"1h\"\nmemory-alarm = \"101%\"",
            "p.toml:9:16: error: teams.research.idle.memory-alarm: '101%': a percentage must be more than 0",
        ),
        (
            "after = \"1h\"\nafterr = \"2h\"",
            "p.toml:9:1: error: teams.research.idle.afterr: unknown key 'afterr' (did you mean 'after'?",
        ),
        (
            "below = \"5%\"",
            "p.toml:7:1: error: teams.research.idle: missing `after`",
        ),
    ];
    for (body, want) in cases {
        let (ok, d) = diags(&format!("[teams.research.idle]\n{body}\n"));
        assert!(!ok, "{body}: accepted: {d:?}");
        assert!(
            d.iter().any(|l| l.starts_with(want)),
            "{body}: want {want:?}, got {d:?}"
        );
    }
    // Not a table at all.
    let (ok, d) = diags("").clone();
    assert!(ok, "{d:?}");
    let d2 = tempfile::tempdir().unwrap();
    let p = write(
        d2.path(),
        "p.toml",
        "version = 1\n[teams.research]\nidle = \"2h\"\n",
    );
    let o = load_files(&[p]);
    assert!(o.policy.is_none() || o.diagnostics.iter().any(|d| d.severity == Severity::Error));
    assert!(
        o.diagnostics
            .iter()
            .any(|d| d.key == "teams.research.idle" && d.message.contains("a table")),
        "{:?}",
        o.diagnostics
    );
}

#[test]
fn grace_without_stop_warns() {
    let (ok, d) = diags("[teams.research.idle]\nafter = \"1h\"\ngrace = \"5m\"\n");
    assert!(ok, "{d:?}");
    assert!(
        d.iter().any(|l| l.starts_with(
            "p.toml:9:9: warning: teams.research.idle.grace: grace has no effect with action = \"report\""
        )),
        "{d:?}"
    );
}

#[test]
fn drop_ins_merge_per_key() {
    let d = tempfile::tempdir().unwrap();
    let a = write(
        d.path(),
        "10-base.toml",
        &format!(
            "{HEAD}[teams.research.idle]\nafter = \"2h\"\naction = \"stop\"\ngrace = \"10m\"\n"
        ),
    );
    let b = write(
        d.path(),
        "20-site.toml",
        "version = 1\n[teams.research.idle]\nafter = \"30m\"\nexclude = [\"triton-*.service\"]\n",
    );
    let o = load_files(&[a, b]);
    let r = o.policy.unwrap().teams["research"].idle.clone().unwrap();
    assert_eq!(r.after, Duration::from_secs(1800));
    assert_eq!(r.action, IdleAction::Stop);
    assert_eq!(r.grace, Duration::from_secs(600));
    assert_eq!(r.exclude, vec!["triton-*.service"]);
}
