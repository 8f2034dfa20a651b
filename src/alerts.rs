//! The Alertmanager routing tree for gpuctl's alerts (docs/monitoring.md, "Alerts by team"):
//! every alert with a `team` label goes to that team's receiver, every alert to the admins'
//! too; a device out of service silences the per-device alerts it causes. Pure: team names and
//! receiver templates in, the YAML of an `alertmanager.yml` out (`gpuctl export alertmanager`).

use serde::Serialize;
use std::collections::BTreeMap;

/// Where the alerts go. Each template may hold `{team}`, replaced by the team's name (by
/// [`ADMINS`] for the admins' receiver).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Templates {
    /// A generic webhook URL.
    pub webhook: Option<String>,
    /// A Slack channel, with the file holding the Slack webhook URL (a secret, so a file).
    pub slack: Option<Slack>,
    /// An e-mail address, with the SMTP relay and sender every e-mail receiver needs.
    pub email: Option<Email>,
}

/// Slack: a channel, and the file Alertmanager reads the incoming-webhook URL from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slack {
    /// `#gpu-{team}`.
    pub channel: String,
    /// `/etc/alertmanager/slack-{team}.url`.
    pub api_url_file: String,
}

/// E-mail: the address, and Alertmanager's global SMTP settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Email {
    /// `{team}-leads@example.org`.
    pub to: String,
    /// `host:port`.
    pub smarthost: String,
    /// The sender.
    pub from: String,
}

/// What `{team}` becomes in the admins' receiver.
pub const ADMINS: &str = "admins";

/// The alerts about one device that a device out of service explains: inhibited while
/// `GpuctlDeviceOutOfService` fires for the same `device`.
pub const INHIBITED_BY_OUT_OF_SERVICE: &[&str] = &[
    "GpuctlShareHeldIdle",
    "GpuctlIdleShare",
    "GpuctlStrayGpuProcess",
    "GpuctlRepeatedApplicationXids",
    "GpuctlDeviceResetPending",
];

/// Why a configuration cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AlertsError {
    /// No receiver integration was given.
    #[error("no receiver: give at least one of --webhook, --slack-channel, --email")]
    NoReceiver,
}

#[derive(Serialize)]
struct Config {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    global: BTreeMap<&'static str, String>,
    route: Route,
    inhibit_rules: Vec<Inhibit>,
    receivers: Vec<Receiver>,
}

#[derive(Serialize)]
struct Route {
    receiver: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    matchers: Vec<String>,
    #[serde(rename = "continue", skip_serializing_if = "std::ops::Not::not")]
    cont: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    group_by: Vec<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    group_wait: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    group_interval: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    repeat_interval: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routes: Vec<Route>,
}

impl Route {
    fn to(receiver: String, matchers: Vec<String>, cont: bool) -> Route {
        Route {
            receiver,
            matchers,
            cont,
            group_by: vec![],
            group_wait: None,
            group_interval: None,
            repeat_interval: None,
            routes: vec![],
        }
    }
}

#[derive(Serialize)]
struct Inhibit {
    source_matchers: Vec<String>,
    target_matchers: Vec<String>,
    equal: Vec<&'static str>,
}

#[derive(Serialize)]
struct Receiver {
    name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    webhook_configs: Vec<BTreeMap<&'static str, serde_norway::Value>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    slack_configs: Vec<BTreeMap<&'static str, serde_norway::Value>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    email_configs: Vec<BTreeMap<&'static str, serde_norway::Value>>,
}

/// The receiver of `team`'s alerts.
pub fn receiver_name(team: &str) -> String {
    format!("gpuctl-team-{team}")
}

/// The receiver of every alert.
pub const ADMINS_RECEIVER: &str = "gpuctl-admins";

fn receiver(name: String, who: &str, t: &Templates) -> Receiver {
    let fill = |s: &str| serde_norway::Value::String(s.replace("{team}", who));
    let yes = serde_norway::Value::Bool(true);
    Receiver {
        name,
        webhook_configs: t
            .webhook
            .iter()
            .map(|u| [("url", fill(u)), ("send_resolved", yes.clone())].into())
            .collect(),
        slack_configs: t
            .slack
            .iter()
            .map(|s| {
                [
                    ("api_url_file", fill(&s.api_url_file)),
                    ("channel", fill(&s.channel)),
                    ("send_resolved", yes.clone()),
                    (
                        "title",
                        serde_norway::Value::String(
                            "[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }}".into(),
                        ),
                    ),
                    (
                        "text",
                        serde_norway::Value::String(
                            "{{ range .Alerts }}{{ .Annotations.summary }}\n{{ end }}".into(),
                        ),
                    ),
                ]
                .into()
            })
            .collect(),
        email_configs: t
            .email
            .iter()
            .map(|e| [("to", fill(&e.to)), ("send_resolved", yes.clone())].into())
            .collect(),
    }
}

/// A matcher on one label value, quoted as Alertmanager's matcher syntax wants.
fn eq(label: &str, value: &str) -> String {
    format!(
        "{label}=\"{}\"",
        value.replace('\\', "\\\\").replace('"', "\\\"")
    )
}

/// The `alertmanager.yml` for `teams` (policy order does not matter: sorted by name).
pub fn render(teams: &[&str], t: &Templates) -> Result<String, AlertsError> {
    if t.webhook.is_none() && t.slack.is_none() && t.email.is_none() {
        return Err(AlertsError::NoReceiver);
    }
    let mut teams: Vec<&str> = teams.to_vec();
    teams.sort_unstable();
    teams.dedup();
    let mut global = BTreeMap::new();
    if let Some(e) = &t.email {
        global.insert("smtp_smarthost", e.smarthost.clone());
        global.insert("smtp_from", e.from.clone());
    }
    // The admins see every alert (a child route that continues); then the team's own.
    let mut routes = vec![Route::to(
        ADMINS_RECEIVER.into(),
        vec!["alertname=~\"Gpuctl.+\"".into()],
        true,
    )];
    routes.extend(
        teams
            .iter()
            .map(|team| Route::to(receiver_name(team), vec![eq("team", team)], false)),
    );
    let config = Config {
        global,
        route: Route {
            group_by: vec!["alertname", "team", "gpu"],
            group_wait: Some("30s"),
            group_interval: Some("5m"),
            repeat_interval: Some("4h"),
            routes,
            ..Route::to(ADMINS_RECEIVER.into(), vec![], false)
        },
        inhibit_rules: vec![Inhibit {
            source_matchers: vec![eq("alertname", "GpuctlDeviceOutOfService")],
            target_matchers: vec![format!(
                "alertname=~\"{}\"",
                INHIBITED_BY_OUT_OF_SERVICE.join("|")
            )],
            equal: vec!["device"],
        }],
        receivers: std::iter::once(receiver(ADMINS_RECEIVER.into(), ADMINS, t))
            .chain(
                teams
                    .iter()
                    .map(|team| receiver(receiver_name(team), team, t)),
            )
            .collect(),
    };
    let yaml = serde_norway::to_string(&config).expect("plain data serialises");
    Ok(format!(
        "# Rendered by `gpuctl export alertmanager`: regenerate when the teams change\n\
         # (docs/monitoring.md, \"Alerts by team\"). Teams: {}.\n{yaml}",
        teams.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hooks() -> Templates {
        Templates {
            webhook: Some("http://127.0.0.1:9099/{team}".into()),
            ..Default::default()
        }
    }

    #[test]
    fn each_team_gets_a_route_on_its_label_and_the_admins_get_everything() {
        let y = render(&["train", "interns", "train"], &hooks()).unwrap();
        let v: serde_norway::Value = serde_norway::from_str(&y).unwrap();
        let routes = v["route"]["routes"].as_sequence().unwrap();
        let pairs: Vec<(String, String, bool)> = routes
            .iter()
            .map(|r| {
                (
                    r["receiver"].as_str().unwrap().to_string(),
                    r["matchers"][0].as_str().unwrap().to_string(),
                    r["continue"].as_bool().unwrap_or(false),
                )
            })
            .collect();
        assert_eq!(
            pairs,
            [
                (
                    "gpuctl-admins".into(),
                    "alertname=~\"Gpuctl.+\"".into(),
                    true
                ),
                (
                    "gpuctl-team-interns".into(),
                    "team=\"interns\"".into(),
                    false
                ),
                ("gpuctl-team-train".into(), "team=\"train\"".into(), false),
            ]
        );
        assert_eq!(v["route"]["receiver"].as_str(), Some("gpuctl-admins"));
        let urls: Vec<&str> = v["receivers"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|r| r["webhook_configs"][0]["url"].as_str().unwrap())
            .collect();
        assert_eq!(
            urls,
            [
                "http://127.0.0.1:9099/admins",
                "http://127.0.0.1:9099/interns",
                "http://127.0.0.1:9099/train"
            ]
        );
        assert!(v.get("global").is_none(), "no e-mail, no SMTP settings");
        assert!(
            y.lines()
                .nth(1)
                .unwrap()
                .ends_with("Teams: interns, train."),
            "{y}"
        );
    }

    #[test]
    fn slack_and_email_fill_the_team_in_and_email_brings_the_smtp_settings() {
        let t = Templates {
            webhook: None,
            slack: Some(Slack {
                channel: "#gpu-{team}".into(),
                api_url_file: "/etc/alertmanager/slack-{team}.url".into(),
            }),
            email: Some(Email {
                to: "{team}-leads@example.org".into(),
                smarthost: "smtp.example.org:25".into(),
                from: "gpuctl@example.org".into(),
            }),
        };
        let v: serde_norway::Value =
            serde_norway::from_str(&render(&["infer"], &t).unwrap()).unwrap();
        let infer = &v["receivers"][1];
        assert_eq!(infer["name"].as_str(), Some("gpuctl-team-infer"));
        assert_eq!(
            infer["slack_configs"][0]["channel"].as_str(),
            Some("#gpu-infer")
        );
        assert_eq!(
            infer["slack_configs"][0]["api_url_file"].as_str(),
            Some("/etc/alertmanager/slack-infer.url")
        );
        assert_eq!(
            infer["email_configs"][0]["to"].as_str(),
            Some("infer-leads@example.org")
        );
        assert!(infer.get("webhook_configs").is_none());
        assert_eq!(
            v["global"]["smtp_smarthost"].as_str(),
            Some("smtp.example.org:25")
        );
        assert_eq!(
            v["global"]["smtp_from"].as_str(),
            Some("gpuctl@example.org")
        );
    }

    #[test]
    fn a_device_out_of_service_inhibits_its_device_alerts_and_nothing_renders_without_a_receiver() {
        let v: serde_norway::Value =
            serde_norway::from_str(&render(&["a"], &hooks()).unwrap()).unwrap();
        let rule = &v["inhibit_rules"][0];
        assert_eq!(
            rule["source_matchers"][0].as_str(),
            Some("alertname=\"GpuctlDeviceOutOfService\"")
        );
        assert_eq!(rule["equal"][0].as_str(), Some("device"));
        let target = rule["target_matchers"][0].as_str().unwrap();
        for a in INHIBITED_BY_OUT_OF_SERVICE {
            assert!(target.contains(a), "{target}");
        }
        assert_eq!(
            render(&["a"], &Templates::default()),
            Err(AlertsError::NoReceiver)
        );
    }
}
