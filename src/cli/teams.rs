//! `gpuctl teams [--json]`: the teams the caller may use, and what each gives.

use super::shell::{print_json, reply, with_agent};
use crate::dbus_api::reply::TeamInfo;
use clap::Args;
use serde_json::Value;

/// Arguments of `gpuctl teams`.
#[derive(Debug, Args)]
#[command(
    after_long_help = "Lists only teams you may join (root sees every team): why \
(user, @group or root), the devices (CUDA_VISIBLE_DEVICES), the slice and its limits, and \
whether the team runs MPS.

Exit status: 0, 6 gpuctld not running or no valid policy, 2 other failure."
)]
pub struct TeamsArgs {
    /// Print the daemon's JSON array.
    #[arg(long)]
    pub json: bool,
}

fn limits_line(l: &Value) -> String {
    let Some(m) = l.as_object() else {
        return String::new();
    };
    m.iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| {
            let v = match v {
                Value::Object(o) => o
                    .iter()
                    .map(|(unit, n)| match unit.as_str() {
                        "Bytes" => format!("{n}B"),
                        "PercentOfRam" => format!("{n}% of RAM"),
                        _ => n.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(""),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            format!("{}={v}", k.replace('_', "-"))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Human rendering of the `Teams` reply.
pub fn render(list: &[TeamInfo]) -> String {
    if list.is_empty() {
        return "You may not join any team (ask an admin to add you or your group to one).\n"
            .into();
    }
    let mut s = String::new();
    for t in list {
        let limits = serde_json::to_value(&t.limits).unwrap_or_default();
        s.push_str(&format!(
            "{}  (via {})\n  devices: {}\n  slice:   {}\n  mps:     {}\n",
            t.team,
            t.via,
            t.devices.as_deref().unwrap_or("none on this host now"),
            [t.slice.clone(), limits_line(&limits)].join(" ").trim_end(),
            if t.mps.is_none() { "no" } else { "yes" },
        ));
        for d in &t.share {
            let cap = d.capacity.map_or("no cap".to_string(), |c| c.to_string());
            let state = if d.out_of_service.is_some() {
                "out"
            } else if d.leases.iter().any(|l| l.borrowed_from.is_some()) {
                "lent"
            } else if d.capacity.is_some_and(|c| d.leases.len() as u32 >= c) {
                "held"
            } else {
                "free"
            };
            let profile = d
                .profile
                .as_ref()
                .map_or(String::new(), |p| format!(" {p}"));
            s.push_str(&format!(
                "  [{}] {}{profile} {state} ({}/{cap})\n",
                d.index,
                d.id,
                d.leases.len()
            ));
            if let Some(o) = &d.out_of_service {
                s.push_str(&format!(
                    "      OUT OF SERVICE since {} by {}: {} (no new job lands here)\n",
                    crate::placement::utc(o.since),
                    o.by,
                    o.reason
                ));
            }
            for l in &d.leases {
                let lent = match &l.borrowed_from {
                    Some(_) => format!("lent to {}: ", l.team),
                    None => String::new(),
                };
                s.push_str(&format!(
                    "      {lent}{} {} since {}\n",
                    l.user,
                    l.unit,
                    crate::placement::utc(l.since)
                ));
            }
        }
    }
    s
}

/// Run `gpuctl teams`.
pub fn run(args: &TeamsArgs) -> i32 {
    let (text, list): (_, Vec<TeamInfo>) =
        match reply(with_agent("Teams", async |p| p.teams().await)) {
            Ok(r) => r,
            Err(code) => return code,
        };
    if args.json {
        print_json(text);
    } else {
        print!("{}", render(&list));
    }
    super::exit::OK
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_via_devices_limits_and_mps() {
        let v = json!([{
            "team": "infer",
            "via": {"group": "ml-infer"},
            "slice": "gpu-infer.slice",
            "devices": "0",
            "limits": {"memory_max": {"Bytes": 268435456}, "cpu_weight": 300, "tasks_max": null},
            "mps": {"active_thread_percentage": 40},
        }]);
        let list: Vec<TeamInfo> = serde_json::from_value(v).unwrap();
        let s = render(&list);
        assert!(s.starts_with("infer  (via group @ml-infer)\n"), "{s}");
        assert!(s.contains("devices: 0\n"));
        assert!(s.contains("memory-max=268435456B"), "{s}");
        assert!(s.contains("cpu-weight=300"));
        assert!(!s.contains("tasks-max"));
        assert!(s.contains("mps:     yes"));
        assert!(render(&[]).starts_with("You may not join any team"));
        assert!(!s.contains('['), "no share lines without placement: {s}");
    }

    #[test]
    fn renders_free_and_held_devices_with_holders() {
        let v = json!([{
            "team": "interns", "via": "root", "slice": "gpu-interns.slice",
            "devices": "MIG-a,MIG-b", "limits": {}, "mps": null,
            "share": [
                {"index": 0, "id": "MIG-a", "mig": true, "capacity": 1, "leases": [{
                    "unit": "gpuctl-run-interns-9.scope", "team": "interns", "user": "bob",
                    "uid": 1001, "pid": 9, "devices": ["MIG-a"], "since": 0}]},
                {"index": 1, "id": "MIG-b", "mig": true, "profile": "3g.40gb", "capacity": 1,
                 "leases": []},
                {"index": 3, "id": "MIG-d", "mig": true, "capacity": 1, "leases": [{
                    "unit": "gpuctl-run-7.scope", "team": "research", "user": "dan",
                    "uid": 1007, "pid": 7, "devices": ["MIG-d"], "since": 0,
                    "borrowed_from": "interns"}]},
                {"index": 2, "id": "MIG-c", "mig": true, "capacity": 1, "leases": [],
                 "out_of_service": {"device": "MIG-c", "reason": "XID 94", "since": 60,
                    "by": "gpuctld"}},
            ],
        }]);
        let list: Vec<TeamInfo> = serde_json::from_value(v).unwrap();
        let s = render(&list);
        assert!(
            s.contains(
                "  [2] MIG-c out (0/1)\n      OUT OF SERVICE since 1970-01-01T00:01:00Z by \
                 gpuctld: XID 94 (no new job lands here)\n"
            ),
            "{s}"
        );
        assert!(s.contains("  [0] MIG-a held (1/1)\n      bob gpuctl-run-interns-9.scope since 1970-01-01T00:00:00Z\n"), "{s}");
        assert!(
            s.contains("  [1] MIG-b 3g.40gb free (0/1)\n"),
            "the profile --profile takes: {s}"
        );
        assert!(
            s.contains("  [3] MIG-d lent (1/1)\n      lent to research: dan gpuctl-run-7.scope"),
            "{s}"
        );
    }
}
