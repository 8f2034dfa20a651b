//! The fleet rules (contrib/prometheus): `promtool check rules` and `promtool test rules` on the
//! PromQL unit tests next to them, and every gpuctl metric they use is one docs/fleet.md lists as
//! exported. Without promtool (Debian's `prometheus` package) the promtool part is skipped with a
//! note, except under `GPUCTL_REQUIRE_PROMTOOL=1` (set by `.ci/run`), where it fails.

use std::path::Path;
use std::process::Command;

fn dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/prometheus")
}

fn promtool(args: &[&str]) -> Option<(bool, String)> {
    match Command::new("promtool")
        .args(args)
        .current_dir(dir())
        .output()
    {
        Ok(o) => Some((
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("GPUCTL_REQUIRE_PROMTOOL").is_none(),
                "promtool is required here (GPUCTL_REQUIRE_PROMTOOL is set) but not installed"
            );
            eprintln!("promtool not installed (apt-get install prometheus): skipped");
            None
        }
        Err(e) => panic!("promtool: {e}"),
    }
}

#[test]
fn rules_check_and_unit_tests_pass() {
    if let Some((ok, out)) = promtool(&["check", "rules", "gpuctl-fleet.rules.yml"]) {
        assert!(ok, "{out}");
    }
    if let Some((ok, out)) = promtool(&["test", "rules", "gpuctl-fleet.test.yml"]) {
        assert!(ok, "{out}");
        assert!(out.contains("SUCCESS"), "{out}");
    }
}

/// The `gpuctl_*` names in a text (recording rules' own `…:gpuctl_…:…` names excluded).
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for (i, _) in text.match_indices("gpuctl_") {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        out.insert(name);
    }
    out
}

#[test]
fn rules_use_only_documented_metrics() {
    let rules = std::fs::read_to_string(dir().join("gpuctl-fleet.rules.yml")).unwrap();
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/fleet.md"))
        .unwrap();
    let table = doc
        .split("## Metrics the rules use")
        .nth(1)
        .expect("docs/fleet.md: section 'Metrics the rules use'");
    let documented = metric_names(table.split("\n## ").next().unwrap());
    let used = metric_names(&rules);
    assert!(used.contains("gpuctl_device_team_info"), "{used:?}");
    let missing: Vec<_> = used.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "rules use metrics docs/fleet.md does not list: {missing:?}"
    );
    // And the exporter really exports them: a rule over a name nobody sends is silently empty.
    let exported: Vec<_> = used
        .iter()
        .filter(|n| !gpuctl::metrics::METRIC_NAMES.contains(&n.as_str()))
        .collect();
    assert!(
        exported.is_empty(),
        "rules use metrics gpuctl-exporter does not export (metrics::METRIC_NAMES): {exported:?}"
    );
}
