//! The shipped monitoring assets against the real tools: the alert rules through
//! `promtool check rules` and `promtool test rules` (every alert has a firing and a
//! must-not-fire case), the exported metrics through `promtool check metrics`, and the Grafana
//! dashboard's queries against the names gpuctl exports.
//!
//! promtool comes from Debian's `prometheus` package. Without it these tests skip, unless
//! `GPUCTL_REQUIRE_PROMTOOL=1` (set by `.ci/run`, which installs the package).

#[path = "common/tool.rs"]
mod tool;

use gpuctl::metrics::{self, cgroup::TeamCgroup, Snapshot, METRIC_NAMES};
use gpuctl::usage::{GpuUsage, MigUsage, ProcessUsage, Usage};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("monitoring")
}

fn promtool() -> Option<PathBuf> {
    tool::find("promtool", "prometheus", "GPUCTL_REQUIRE_PROMTOOL")
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Names after `key:` on lines of a YAML file (enough for our own two files).
fn yaml_values(text: &str, key: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim().trim_start_matches("- ");
            l.strip_prefix(key)?
                .strip_prefix(':')
                .map(|v| v.trim().to_string())
        })
        .collect()
}

#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    let Some(pt) = promtool() else { return };
    let dir = monitoring_dir();
    let (ok, out) = run(Command::new(&pt)
        .args(["check", "rules", "gpuctl.rules.yml"])
        .current_dir(&dir));
    assert!(ok, "promtool check rules:\n{out}");
    assert!(out.contains("SUCCESS: 14 rules found"), "{out}");
    let (ok, out) = run(Command::new(&pt)
        .args(["test", "rules", "gpuctl.rules.test.yml"])
        .current_dir(&dir));
    assert!(ok, "promtool test rules:\n{out}");

    // Every alert has a case where it fires and one where it must not.
    let rules = std::fs::read_to_string(dir.join("gpuctl.rules.yml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("gpuctl.rules.test.yml")).unwrap();
    let alerts = yaml_values(&rules, "alert");
    assert_eq!(alerts.len(), 12);
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    for a in &alerts {
        let mut fires = 0;
        let mut silent = 0;
        for (i, l) in lines.iter().enumerate() {
            if *l == format!("alertname: {a}") {
                match lines.get(i + 1) {
                    Some(n) if n.ends_with("[]") => silent += 1,
                    Some(_) => fires += 1,
                    None => {}
                }
            }
        }
        assert!(
            fires >= 1 && silent >= 1,
            "{a}: {fires} firing, {silent} silent cases"
        );
    }
}

#[test]
fn a_broken_rule_fails_its_unit_test() {
    // The unit tests can fail: loosen the memory threshold and the must-not-fire team fires.
    let Some(pt) = promtool() else { return };
    let dir = monitoring_dir();
    let t = tempfile::tempdir().unwrap();
    let rules = std::fs::read_to_string(dir.join("gpuctl.rules.yml")).unwrap();
    std::fs::write(
        t.path().join("gpuctl.rules.yml"),
        rules.replace("> 0.9", "> 0.4"),
    )
    .unwrap();
    std::fs::copy(
        dir.join("gpuctl.rules.test.yml"),
        t.path().join("gpuctl.rules.test.yml"),
    )
    .unwrap();
    let (ok, out) = run(Command::new(&pt)
        .args(["test", "rules", "gpuctl.rules.test.yml"])
        .current_dir(t.path()));
    assert!(!ok, "{out}");
    assert!(out.contains("GpuctlTeamGpuMemoryNearFull"), "{out}");
}

/// A snapshot with every kind of series.
fn full_snapshot() -> Snapshot {
    // The ledger's counters are gpuctld's process-lifetime ones: one credited sample gives them
    // series.
    let k = gpuctl::ledger::Key {
        team: "train".into(),
        user: "alice".into(),
        device: "0".into(),
        kind: "gpu".into(),
    };
    let f = gpuctl::ledger::Figures {
        held_ms: 30_000,
        active_ms: 20_000,
        unknown_ms: 10_000,
        ..Default::default()
    };
    metrics::ledger::count(&vec![(k, f)]);
    let p = |pid, team: Option<&str>, stray| ProcessUsage {
        pid,
        kind: "compute".into(),
        used_memory: Some(1 << 30),
        uid: Some(1000),
        user: Some("alice".into()),
        team: team.map(str::to_string),
        stray,
        ..Default::default()
    };
    let usage = Usage {
        gpus: vec![
            GpuUsage {
                index: 0,
                uuid: "GPU-0".into(),
                teams: vec!["infer".into()],
                memory_used: Some(2 << 30),
                memory_total: Some(80 << 30),
                utilization_gpu: Some(40),
                utilization_memory: Some(10),
                activity: Some(35.0),
                power_mw: Some(300_000),
                temperature_c: Some(50),
                processes: vec![p(1, Some("infer"), false), p(2, None, true)],
                ..Default::default()
            },
            GpuUsage {
                index: 1,
                uuid: "GPU-1".into(),
                mig: true,
                memory_used: Some(1 << 30),
                memory_total: Some(80 << 30),
                power_mw: Some(100_000),
                temperature_c: Some(40),
                mig_devices: vec![MigUsage {
                    uuid: "MIG-a".into(),
                    gi_id: 3,
                    ci_id: 0,
                    profile: "3g.40gb".into(),
                    teams: vec!["train".into()],
                    memory_used: Some(1 << 30),
                    memory_total: Some(40 << 30),
                    activity: Some(12.5),
                    processes: vec![p(3, Some("train"), false)],
                    hidden: vec![],
                    leases: vec![],
                    out_of_service: None,
                }],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let c = metrics::counters();
    c.reconciled(0.2, true);
    c.reconciled(3.0, false);
    c.joined("infer", "ok");
    c.joined("train", "not-member");
    c.lent("interns", "train");
    c.reclaim("interns", "train", "owner");
    c.overran("interns", "train");
    c.resliced(1, "night", "waiting");
    Snapshot {
        usage,
        teams: [(
            "infer".to_string(),
            TeamCgroup {
                memory_current: Some(1 << 30),
                memory_max: Some(8 << 30),
                oom_kills: Some(2),
                cpu_seconds: Some(12.5),
                pids: Some(7),
            },
        )]
        .into(),
        mps: vec![("infer-gpu0".into(), "infer".into(), true)],
        policy_valid: true,
        last_good_in_force: false,
        last_converged: Some(true),
        idle: idle_holders(),
        leases: Some(vec![gpuctl::placement::Lease {
            unit: "gpuctl-run-infer-812.scope".into(),
            team: "infer".into(),
            user: "alice".into(),
            uid: 1000,
            pid: 812,
            devices: vec!["GPU-aaaa".into()],
            since: 0,
            gpu_memory: None,
            borrowed_from: None,
        }]),
        ledger_users: None,
        health: vec![
            metrics::DeviceHealth {
                device: "GPU-aaaa".into(),
                gpu: 0,
                in_service: false,
                xids: [(13, 2), (79, 1)].into(),
                quarantines: 1,
                resets: 2,
                conditions: vec!["remap-pending".into()],
            },
            metrics::DeviceHealth {
                device: "GPU-bbbb".into(),
                gpu: 1,
                in_service: true,
                ..Default::default()
            },
        ],
        layouts: vec![(1, "night".into(), Some(90)), (2, "default".into(), None)],
    }
}

/// One warned idle holder and one whose device reports no activity.
fn idle_holders() -> Vec<gpuctl::idle::IdleHolder> {
    use gpuctl::idle::{IdleHolder, Phase, Reason};
    let h = IdleHolder {
        team: "infer".into(),
        unit: "nb.scope".into(),
        user: Some("alice".into()),
        uid: Some(1000),
        device: "0".into(),
        pids: vec![4242],
        memory: Some(1 << 30),
        phase: Phase::Warned,
        reason: Some(Reason::Idle),
        idle_seconds: 7300,
        idle_since_ms: Some(1),
        activity_unknown: false,
        activity: Some(0.0),
        shared_device: false,
        excluded: false,
        action: gpuctl::policy::IdleAction::Stop,
        warned_at_ms: Some(2),
        stop_at_ms: Some(3),
        not_stopped: None,
        warn_in_seconds: None,
    };
    let u = IdleHolder {
        unit: "mig.service".into(),
        device: "MIG-a".into(),
        phase: Phase::Busy,
        reason: None,
        activity_unknown: true,
        activity: None,
        ..h.clone()
    };
    vec![h, u]
}

fn series_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .map(|n| {
            for suf in ["_bucket", "_sum", "_count", "_created"] {
                if let Some(b) = n.strip_suffix(suf) {
                    if METRIC_NAMES.contains(&b) {
                        return b.to_string();
                    }
                }
            }
            n
        })
        .collect()
}

#[test]
fn exported_names_are_the_documented_list_and_pass_promtool() {
    let s = full_snapshot();
    let text = metrics::encode_prometheus_text(&s, metrics::counters());
    let got = series_names(&text);
    let want: BTreeSet<String> = METRIC_NAMES.iter().map(|s| s.to_string()).collect();
    assert_eq!(got, want, "encoded series vs METRIC_NAMES:\n{text}");
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/monitoring.md"))
            .unwrap();
    for n in METRIC_NAMES {
        assert!(
            doc.contains(&format!("`{n}`")),
            "docs/monitoring.md does not describe {n}"
        );
    }
    // The dcgm-exporter join labels on the info metric.
    assert!(
        text.contains(r#"gpuctl_device_team_info{gpu="1",UUID="GPU-1",GPU_I_ID="3",GPU_I_PROFILE="3g.40gb",device="MIG-a",team="train"} 1"#),
        "{text}"
    );
    // Not available stays absent: the MIG GPU has no utilisation series.
    assert!(
        !text.contains(r#"gpuctl_device_utilization_ratio{gpu="1""#),
        "{text}"
    );
    let om = metrics::encode_openmetrics(&s, metrics::counters());
    assert!(om.ends_with("# EOF\n"), "{om}");

    let Some(pt) = promtool() else { return };
    let mut child = Command::new(pt)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let msg = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool check metrics:\n{msg}\n{text}"
    );
}

/// Metric names in a PromQL expression: identifiers outside label matchers, ranges, strings
/// and grouping clauses that are not functions or keywords.
fn promql_metrics(expr: &str) -> Vec<String> {
    // Grafana's label_values(metric, label): only the metric is a name.
    let mut e = expr.to_string();
    if let Some(inner) = e
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
    {
        e = inner.split(',').next().unwrap().to_string();
    }
    let mut out = String::new();
    let mut depth_brace = 0;
    let mut depth_bracket = 0;
    let mut in_str = false;
    for ch in e.chars() {
        match ch {
            '"' if depth_brace > 0 || in_str => in_str = !in_str,
            '{' if !in_str => depth_brace += 1,
            '}' if !in_str => depth_brace -= 1,
            '[' if !in_str => depth_bracket += 1,
            ']' if !in_str => depth_bracket -= 1,
            c if depth_brace == 0 && depth_bracket == 0 && !in_str => out.push(c),
            _ => {}
        }
        if matches!(ch, '}' | ']') && depth_brace == 0 && depth_bracket == 0 {
            out.push(' ');
        }
    }
    // Drop grouping label lists: by (...), without (...), on (...), ignoring (...), group_x (...).
    let mut cleaned = String::new();
    let words: Vec<char> = out.chars().collect();
    let mut i = 0;
    let kw = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    while i < words.len() {
        let rest: String = words[i..].iter().collect();
        if let Some(k) = kw.iter().find(|k| {
            rest.starts_with(*k)
                && (i == 0 || !words[i - 1].is_alphanumeric() && words[i - 1] != '_')
                && rest[k.len()..].trim_start().starts_with('(')
        }) {
            let open = i + k.len() + rest[k.len()..].find('(').unwrap();
            let close = open + words[open..].iter().position(|c| *c == ')').unwrap();
            i = close + 1;
            continue;
        }
        cleaned.push(words[i]);
        i += 1;
    }
    let mut names = Vec::new();
    let chars: Vec<char> = cleaned.chars().collect();
    let mut j = 0;
    while j < chars.len() {
        if chars[j].is_ascii_alphabetic() || chars[j] == '_' || chars[j] == ':' {
            let start = j;
            while j < chars.len()
                && (chars[j].is_ascii_alphanumeric() || chars[j] == '_' || chars[j] == ':')
            {
                j += 1;
            }
            let word: String = chars[start..j].iter().collect();
            let next = chars[j..].iter().find(|c| !c.is_whitespace());
            let keywords = [
                "and",
                "or",
                "unless",
                "bool",
                "offset",
                "le",
                "group_left",
                "group_right",
            ];
            if next != Some(&'(') && !keywords.contains(&word.as_str()) {
                names.push(word);
            }
        } else {
            j += 1;
        }
    }
    names
}

fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("query", serde_json::Value::String(s)) if s.contains('(') => {
                        out.push(s.clone())
                    }
                    _ => exprs(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| exprs(x, out)),
        _ => {}
    }
}

#[test]
fn dashboard_queries_name_only_exported_metrics() {
    let d: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(monitoring_dir().join("gpuctl-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut all = Vec::new();
    exprs(&d, &mut all);
    assert!(all.len() >= 12, "{all:?}");
    let exported = |n: &str| {
        METRIC_NAMES.contains(&n)
            || ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| n.strip_suffix(s).is_some_and(|b| METRIC_NAMES.contains(&b)))
    };
    let mut seen = BTreeSet::new();
    for e in &all {
        let names = promql_metrics(e);
        assert!(!names.is_empty(), "no metric in {e:?}");
        for n in names {
            assert!(
                exported(&n),
                "{e:?} names {n}, which gpuctl does not export"
            );
            seen.insert(n);
        }
    }
    // The checker itself catches a foreign name.
    assert_eq!(
        promql_metrics(r#"sum by (team) (DCGM_FI_DEV_GPU_UTIL{gpu="0"}[5m])"#),
        ["DCGM_FI_DEV_GPU_UTIL"]
    );
    assert_eq!(
        promql_metrics("gpuctl_a{x=\"y\"} / on (device, team) gpuctl_b"),
        ["gpuctl_a", "gpuctl_b"]
    );
    assert_eq!(
        promql_metrics("gpuctl_a * on (device) group_right gpuctl_b{t=\"\"} and gpuctl_c"),
        ["gpuctl_a", "gpuctl_b", "gpuctl_c"]
    );
    // Per-team memory, utilisation, processes, OOMs and MPS health are all on it.
    for n in [
        "gpuctl_device_memory_used_bytes",
        "gpuctl_device_utilization_ratio",
        "gpuctl_team_gpu_processes",
        "gpuctl_team_oom_kills_total",
        "gpuctl_mps_daemon_up",
    ] {
        assert!(seen.contains(n), "dashboard lacks {n}");
    }
}

/// The exporter's rule: holders the scraper may not read (every one, for the unprivileged
/// exporter) keep their team, device and state but lose `user` and `unit`; two of them on one
/// device are one series counting both.
#[test]
fn redacted_idle_holders_carry_no_user_or_unit_labels() {
    let mut s = full_snapshot();
    let mut second = s.idle[0].clone();
    second.unit = "other.service".into();
    second.user = Some("alice2".into());
    second.idle_seconds = 9000;
    s.idle.push(second);
    for h in &mut s.idle {
        h.redact();
    }
    // A viewer of no team: the ledger's users are summed into user="" too.
    s.ledger_users = Some(Default::default());
    let text = metrics::encode_prometheus_text(&s, metrics::counters());
    for leak in ["alice", "nb.scope", "other.service", "mig.service", "4242"] {
        assert!(!text.contains(leak), "{leak} in:\n{text}");
    }
    let line = |name: &str| {
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(r#"device="0""#))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        line("gpuctl_idle_holder{"),
        [
            r#"gpuctl_idle_holder{team="infer",user="",unit="",device="0",state="warned",reason="idle",excluded="false"} 2"#
        ]
    );
    // The longest idle time among them.
    assert_eq!(
        line("gpuctl_idle_seconds{"),
        [r#"gpuctl_idle_seconds{team="infer",user="",unit="",device="0"} 9000"#]
    );
}

/// A GPU that teams sa and sb share: its device series count it once (a plain `sum()` is the
/// host's memory in use), the info metric names both owners, and each team's own use is in
/// the team series.
#[test]
fn a_gpu_two_teams_share_is_one_device_series() {
    let p = |pid, team: &str, mib: u64| ProcessUsage {
        pid,
        kind: "compute".into(),
        used_memory: Some(mib << 20),
        team: Some(team.into()),
        ..Default::default()
    };
    let s = Snapshot {
        usage: Usage {
            gpus: vec![
                GpuUsage {
                    index: 0,
                    uuid: "GPU-s".into(),
                    teams: vec!["sa".into(), "sb".into()],
                    memory_used: Some(3 << 30),
                    memory_total: Some(80 << 30),
                    utilization_gpu: Some(40),
                    utilization_memory: Some(10),
                    activity: Some(30.0),
                    processes: vec![p(1, "sa", 1024), p(2, "sb", 2048)],
                    ..Default::default()
                },
                GpuUsage {
                    index: 1,
                    uuid: "GPU-t".into(),
                    teams: vec!["sa".into()],
                    memory_used: Some(1 << 30),
                    memory_total: Some(80 << 30),
                    ..Default::default()
                },
            ],
            ..Default::default()
        },
        ..Default::default()
    };
    let text = metrics::encode_prometheus_text(&s, metrics::counters());
    // Sorted: a metric family's series come out in hash order.
    let lines = |name: &str, device: &str| -> Vec<&str> {
        let mut v: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter(|l| l.contains(&format!("device=\"{device}\"")))
            .collect();
        v.sort_unstable();
        v
    };
    for name in [
        "gpuctl_device_memory_used_bytes",
        "gpuctl_device_memory_total_bytes",
        "gpuctl_device_utilization_ratio",
        "gpuctl_device_memory_utilization_ratio",
        "gpuctl_device_sm_activity_ratio",
    ] {
        let got = lines(name, "GPU-s");
        assert_eq!(got.len(), 1, "{name}: {got:?}");
        assert!(!got[0].contains("team="), "{name}: {got:?}");
    }
    let sum: u64 = text
        .lines()
        .filter(|l| l.starts_with("gpuctl_device_memory_used_bytes{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(sum, 4 << 30, "{text}");
    assert_eq!(
        lines("gpuctl_device_team_info", "GPU-s"),
        [
            r#"gpuctl_device_team_info{gpu="0",UUID="GPU-s",GPU_I_ID="",GPU_I_PROFILE="",device="GPU-s",team="sa"} 1"#,
            r#"gpuctl_device_team_info{gpu="0",UUID="GPU-s",GPU_I_ID="",GPU_I_PROFILE="",device="GPU-s",team="sb"} 1"#,
        ]
    );
    let team_mem = lines("gpuctl_team_gpu_memory_used_bytes", "GPU-s");
    assert_eq!(team_mem.len(), 2, "{team_mem:?}");
    assert!(
        team_mem[0].contains(r#"team="sa"} 1073741824"#),
        "{team_mem:?}"
    );
    assert!(
        team_mem[1].contains(r#"team="sb"} 2147483648"#),
        "{team_mem:?}"
    );
}

/// The label names of every exported family, from an encoded scrape.
fn labels_of(text: &str) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let mut out: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, rest)) = l.split_once('{') else {
            continue;
        };
        let set = out.entry(name.to_string()).or_default();
        let mut rest = rest;
        while let Some((k, v)) = rest.split_once("=\"") {
            set.insert(k.trim_start_matches(',').to_string());
            // Values here are plain (no escaped quotes).
            rest = &v[v.find('"').unwrap() + 1..];
            if rest.starts_with('}') {
                break;
            }
        }
    }
    out
}

/// `(metric, label names)` of every `gpuctl_*{…}` selector in a PromQL text.
fn selectors(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("gpuctl_") {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let Some(body) = text[i + name.len()..].strip_prefix('{') else {
            continue;
        };
        let body = &body[..body.find('}').unwrap()];
        let mut labels = Vec::new();
        let mut in_str = false;
        let mut word = String::new();
        for c in body.chars() {
            match c {
                '"' => in_str = !in_str,
                c if !in_str && (c.is_ascii_alphanumeric() || c == '_') => word.push(c),
                _ if !in_str && !word.is_empty() => labels.push(std::mem::take(&mut word)),
                _ => {}
            }
        }
        out.push((name, labels));
    }
    out
}

/// A selector on a label its series do not carry matches nothing, silently: every label the
/// shipped rules and dashboard select on is one the exporter sends on that metric.
#[test]
fn rules_and_dashboard_select_only_labels_the_series_carry() {
    let text = metrics::encode_prometheus_text(&full_snapshot(), metrics::counters());
    let have = labels_of(&text);
    let dir = monitoring_dir();
    let rules = std::fs::read_to_string(dir.join("gpuctl.rules.yml")).unwrap();
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("gpuctl-dashboard.json")).unwrap())
            .unwrap();
    let mut all = vec![rules];
    exprs(&d, &mut all);
    let mut checked = 0;
    for e in &all {
        for (name, labels) in selectors(e) {
            let Some(carried) = have.get(&name) else {
                continue;
            };
            for l in labels {
                assert!(
                    carried.contains(&l),
                    "{e:?} selects {name} on {l}, which it does not carry ({carried:?})"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "{checked}");
    // The checker itself sees a selector on a missing label.
    assert_eq!(
        selectors(r#"sum(gpuctl_x{team=~"a,b", device!=""}) / gpuctl_y"#),
        [("gpuctl_x".to_string(), vec!["team".into(), "device".into()])]
    );
}

/// The alerts `(group, interval)` they are evaluated in, from the rules file's own lines.
fn alert_groups(text: &str) -> Vec<(String, String, Option<String>)> {
    let (mut group, mut interval) = (String::new(), None);
    let mut out = Vec::new();
    for l in text.lines() {
        let t = l.trim();
        if let Some(g) = t.strip_prefix("- name:") {
            (group, interval) = (g.trim().to_string(), None);
        } else if let Some(i) = t.strip_prefix("interval:") {
            interval = Some(i.trim().to_string());
        } else if let Some(a) = t.strip_prefix("- alert:") {
            out.push((a.trim().to_string(), group.clone(), interval.clone()));
        }
    }
    out
}

/// An alert in a group with an interval of its own (the ledger's 5 minutes) would be seen that
/// much late: GpuctlDeviceOutOfService once sat there and fired minutes after the fault.
#[test]
fn every_alert_is_evaluated_at_prometheus_own_interval() {
    let text = std::fs::read_to_string(monitoring_dir().join("gpuctl.rules.yml")).unwrap();
    let alerts = alert_groups(&text);
    assert!(alerts.len() >= 10, "alerts found: {alerts:?}");
    assert!(
        alerts.iter().any(|(a, ..)| a == "GpuctlDeviceOutOfService"),
        "{alerts:?}"
    );
    let late: Vec<_> = alerts.iter().filter(|(.., i)| i.is_some()).collect();
    assert!(
        late.is_empty(),
        "alerts in a group with its own interval: {late:?}"
    );
    let ledger = "  - name: gpuctl-ledger\n    interval: 5m\n    rules:\n      - alert: X\n";
    assert_eq!(
        alert_groups(ledger),
        [(
            "X".to_string(),
            "gpuctl-ledger".to_string(),
            Some("5m".to_string())
        )],
        "the scanner sees a group's interval"
    );
}

#[test]
fn each_gpus_layout_is_shown_with_the_time_since_its_switch() {
    let text = metrics::encode_prometheus_text(&full_snapshot(), metrics::counters());
    // A family's series come in no set order (prometheus-client keeps them in a HashMap).
    let mut lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("gpuctl_gpu_layout"))
        .collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "gpuctl_gpu_layout_info{gpu=\"1\",layout=\"night\"} 1",
            "gpuctl_gpu_layout_info{gpu=\"2\",layout=\"default\"} 1",
            "gpuctl_gpu_layout_since_seconds{gpu=\"1\",layout=\"night\"} 90",
        ]
    );
}

#[test]
fn each_gpus_idle_resets_are_counted_and_no_mig_device_has_the_series() {
    let mut snap = full_snapshot();
    snap.health.push(metrics::DeviceHealth {
        device: "MIG-cccc".into(),
        gpu: 1,
        in_service: true,
        resets: 3,
        ..Default::default()
    });
    let text = metrics::encode_prometheus_text(&snap, metrics::counters());
    let mut lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("gpuctl_device_resets_total"))
        .collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "gpuctl_device_resets_total{gpu=\"0\",device=\"GPU-aaaa\"} 2",
            "gpuctl_device_resets_total{gpu=\"1\",device=\"GPU-bbbb\"} 0",
        ]
    );
}
