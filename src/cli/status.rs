//! `gpuctl status [--json]`: what gpuctld reports (`Status` on the system bus).

use super::shell::with_agent;
use clap::Args;
use serde_json::Value;

/// Arguments of `gpuctl status`.
#[derive(Debug, Args)]
#[command(
    after_long_help = "Per team: slice state, GPUs, memory and tasks usage against the \
limits, MPS daemons. Per GPU: device node, owning teams, MIG state. Then the last reconcile and \
the last policy error.

Exit status: 0; 1 when the last reconcile had errors or a policy error is pending; 6 gpuctld \
not running; 2 other failure."
)]
pub struct StatusArgs {
    /// Print the daemon's JSON document.
    #[arg(long)]
    pub json: bool,
}

fn bytes(v: &Value) -> String {
    match v.as_u64() {
        None => "-".into(),
        Some(b) if b >= 1 << 30 => format!("{:.1}G", b as f64 / (1u64 << 30) as f64),
        Some(b) if b >= 1 << 20 => format!("{:.1}M", b as f64 / (1u64 << 20) as f64),
        Some(b) => format!("{b}B"),
    }
}

fn count(v: &Value) -> String {
    v.as_u64().map_or_else(|| "-".into(), |n| n.to_string())
}

/// Human rendering of the `Status` document.
pub fn render(s: &Value) -> String {
    let mut o = String::new();
    o.push_str(&format!(
        "gpuctld: {}\n",
        s["status"].as_str().unwrap_or("")
    ));
    if let Some(e) = s["policy_error"].as_str() {
        o.push_str(&format!("policy error: {e}\n"));
    }
    if let Some(p) = s["policy_in_force"].as_str() {
        o.push_str(&format!("policy in force: {p}\n"));
    }
    let lr = &s["last_reconcile"];
    if lr.is_object() {
        o.push_str(&format!(
            "last reconcile: {} at {} (unix), {} change(s), {} error(s)\n",
            lr["result"].as_str().unwrap_or("?"),
            lr["at"],
            lr["changes"].as_array().map_or(0, Vec::len),
            lr["errors"].as_array().map_or(0, Vec::len),
        ));
        for e in lr["errors"].as_array().into_iter().flatten() {
            o.push_str(&format!("  error: {}\n", e.as_str().unwrap_or("")));
        }
    }
    if let Some(teams) = s["teams"].as_object() {
        o.push_str("teams:\n");
        for (name, t) in teams {
            let sl = &t["slice"];
            // Whole GPUs by index, MIG devices by UUID (what CUDA_VISIBLE_DEVICES names).
            let gpus: Vec<String> = t["gpus"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|g| match g.get("index") {
                    Some(i) => i.to_string(),
                    None => g.to_string(),
                })
                .chain(
                    t["mig_instances"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|m| m["uuid"].as_str().map(str::to_string)),
                )
                .collect();
            let wanted = &sl["wanted"];
            o.push_str(&format!(
                "  {name}: {} {}, GPUs [{}], memory {}/{}, tasks {}/{}",
                sl["unit"].as_str().unwrap_or("?"),
                sl["active_state"].as_str().unwrap_or("not loaded"),
                gpus.join(","),
                bytes(&sl["memory_current"]),
                bytes(&wanted["memory_max"]),
                count(&sl["tasks_current"]),
                count(&wanted["tasks_max"]),
            ));
            for m in t["mps"].as_array().into_iter().flatten() {
                o.push_str(&format!(
                    ", {} {}",
                    m["unit"].as_str().unwrap_or("?"),
                    m["active_state"].as_str().unwrap_or("not loaded")
                ));
            }
            o.push('\n');
        }
    }
    if let Some(gpus) = s["gpus"].as_array() {
        o.push_str("gpus:\n");
        for g in gpus {
            let teams: Vec<&str> = g["teams"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            o.push_str(&format!(
                "  {} {}: teams [{}], MIG {}\n",
                g["index"],
                g["node"].as_str().unwrap_or("?"),
                teams.join(","),
                g["mig"].as_str().unwrap_or("not supported")
            ));
        }
    }
    o
}

/// Run `gpuctl status`.
pub fn run(args: &StatusArgs) -> i32 {
    match with_agent("Status", async |p| p.status().await) {
        Ok(text) => {
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if args.json {
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or(text));
            } else {
                print!("{}", render(&v));
            }
            let healthy =
                v["policy_error"].is_null() && v["last_reconcile"]["result"] == "converged";
            if healthy {
                super::exit::OK
            } else {
                super::exit::INVALID
            }
        }
        Err(f) => f.report(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn summary_names_teams_gpus_reconcile_and_policy_error() {
        let s = render(&json!({
            "status": "policy error in /etc/gpuctl/policy.d/20-x.toml:3 — last good policy in force",
            "policy_error": "/etc/gpuctl/policy.d/20-x.toml:3",
            "policy_in_force": "last-good",
            "last_reconcile": {"at": 5, "result": "converged", "changes": ["a"], "errors": []},
            "teams": {"infer": {"gpus": [0], "slice": {"unit": "gpu-infer.slice",
                "active_state": "active", "memory_current": 1048576,
                "tasks_current": 3, "wanted": {"memory_max": 268435456, "tasks_max": 128}},
                "mps": [{"unit": "gpuctl-mps@infer-0.service", "active_state": "active"}]}},
            "gpus": [{"index": 0, "node": "/dev/nvidia0", "teams": ["infer"], "mig": null}],
        }));
        assert!(
            s.contains("policy error: /etc/gpuctl/policy.d/20-x.toml:3\n"),
            "{s}"
        );
        assert!(s.contains("last reconcile: converged at 5 (unix), 1 change(s), 0 error(s)"));
        assert!(
            s.contains(
                "  infer: gpu-infer.slice active, GPUs [0], memory 1.0M/256.0M, tasks 3/128, \
             gpuctl-mps@infer-0.service active\n"
            ),
            "{s}"
        );
        assert!(s.contains("  0 /dev/nvidia0: teams [infer], MIG not supported\n"));
    }
}
