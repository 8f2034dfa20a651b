//! The Alertmanager routing gpuctl renders (`gpuctl export alertmanager`, docs/monitoring.md)
//! against Debian's `amtool`: the shipped example and a rendered config pass `amtool
//! check-config`; an alert of a team reaches that team's receiver and the admins', and no other
//! team's; a device alert reaches the admins alone. The example is the render of its command
//! (no drift), and the alerts the inhibition names are alerts of the shipped rules.
//!
//! amtool comes from Debian's `prometheus-alertmanager` package. Without it the amtool tests
//! skip, unless `GPUCTL_REQUIRE_AMTOOL=1` (set by `.ci/run`, which installs the package).

#[path = "common/golden.rs"]
mod golden;
#[path = "common/tool.rs"]
mod tool;

use std::path::{Path, PathBuf};
use std::process::Command;

const EXAMPLE: &str = "monitoring/alertmanager.example.yml";
const POLICY: &str = "policies/d-eight-gpu-five-teams.toml";
/// The command the example is rendered by (docs/monitoring.md shows it).
const ARGS: &[&str] = &[
    "--webhook",
    "http://127.0.0.1:9099/gpu/{team}",
    "--slack-channel",
    "#gpu-{team}",
    "--slack-api-url-file",
    "/etc/prometheus/alertmanager-slack-{team}.url",
    "--email",
    "{team}-leads@example.org",
    "--smtp-smarthost",
    "smtp.example.org:25",
    "--smtp-from",
    "gpuctl@example.org",
];

fn amtool() -> Option<PathBuf> {
    tool::find("amtool", "prometheus-alertmanager", "GPUCTL_REQUIRE_AMTOOL")
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn render(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .args(["export", "alertmanager"])
        .arg(repo(POLICY))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The receivers amtool routes an alert with these labels to.
fn routes(am: &Path, config: &Path, labels: &[&str]) -> String {
    let out = Command::new(am)
        .args(["config", "routes", "test", "--config.file"])
        .arg(config)
        .args(labels)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn the_example_is_the_render_of_its_command() {
    let (code, yaml, err) = render(ARGS);
    assert_eq!(code, 0, "{err}");
    golden::check(&repo(EXAMPLE), &yaml);
}

#[test]
fn without_a_receiver_nothing_is_printed_and_the_exit_is_1() {
    let (code, yaml, err) = render(&[]);
    assert_eq!(code, 1);
    assert_eq!(yaml, "");
    assert!(err.contains("no receiver"), "{err}");
}

#[test]
fn amtool_accepts_the_configs_and_routes_each_teams_alerts_to_it_alone() {
    let Some(am) = amtool() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (code, hooks, err) = render(&["--webhook", "http://127.0.0.1:9099/{team}"]);
    assert_eq!(code, 0, "{err}");
    let rendered = dir.path().join("hooks.yml");
    std::fs::write(&rendered, hooks).unwrap();
    for config in [repo(EXAMPLE), rendered] {
        let out = Command::new(&am)
            .arg("check-config")
            .arg(&config)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}: {out:?}", config.display());
        assert_eq!(
            routes(&am, &config, &["alertname=GpuctlIdleShare", "team=interns"]),
            "gpuctl-admins,gpuctl-team-interns"
        );
        assert_eq!(
            routes(
                &am,
                &config,
                &["alertname=GpuctlTeamOomKills", "team=training"]
            ),
            "gpuctl-admins,gpuctl-team-training"
        );
        assert_eq!(
            routes(
                &am,
                &config,
                &["alertname=GpuctlDeviceOutOfService", "gpu=1"]
            ),
            "gpuctl-admins"
        );
    }
    // A team the policy lacks has no receiver of its own.
    assert_eq!(
        routes(
            &am,
            &repo(EXAMPLE),
            &["alertname=GpuctlIdleShare", "team=ghost"]
        ),
        "gpuctl-admins"
    );
}

#[test]
fn the_inhibited_alerts_and_the_source_are_alerts_of_the_shipped_rules() {
    let rules = std::fs::read_to_string(repo("monitoring/gpuctl.rules.yml")).unwrap();
    let names: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    for a in gpuctl::alerts::INHIBITED_BY_OUT_OF_SERVICE
        .iter()
        .chain(["GpuctlDeviceOutOfService"].iter())
    {
        assert!(names.contains(a), "{a} is not an alert of gpuctl.rules.yml");
    }
}
