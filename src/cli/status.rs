//! `gpuctl status [--json]`: what gpuctld reports (`Status` on the system bus).

use super::shell::{print_json, reply, with_agent};
use crate::dbus_api::reply::StatusReply;
use crate::settings::value::compact_bytes;
use clap::Args;

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

fn bytes(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), compact_bytes)
}

fn count(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |n| n.to_string())
}

/// Human rendering of the `Status` reply.
pub fn render(s: &StatusReply) -> String {
    let mut o = format!("gpuctld: {}\n", s.status);
    if let Some(e) = &s.policy_error {
        o.push_str(&format!("policy error: {e}\n"));
    }
    if let Some(p) = &s.policy_in_force {
        o.push_str(&format!("policy in force: {p}\n"));
    }
    if let Some(lr) = &s.last_reconcile {
        o.push_str(&format!(
            "last reconcile: {} at {} (unix), {} change(s), {} error(s)\n",
            lr.result,
            lr.at,
            lr.changes.len(),
            lr.errors.len(),
        ));
        for e in &lr.errors {
            o.push_str(&format!("  error: {e}\n"));
        }
    }
    o.push_str("teams:\n");
    for (name, t) in &s.teams {
        let sl = &t.slice;
        // Whole GPUs by index, MIG devices by UUID (what CUDA_VISIBLE_DEVICES names).
        let gpus: Vec<String> = t
            .gpus
            .iter()
            .map(|g| g.index.to_string())
            .chain(t.mig_instances.iter().map(|m| m.uuid.clone()))
            .collect();
        let wanted = sl.wanted.as_ref();
        o.push_str(&format!(
            "  {name}: {} {}, GPUs [{}], memory {}/{}, tasks {}/{}",
            sl.unit,
            sl.active_state.as_deref().unwrap_or("not loaded"),
            gpus.join(","),
            bytes(sl.memory_current),
            bytes(wanted.and_then(|w| w.memory_max)),
            count(sl.tasks_current),
            count(wanted.and_then(|w| w.tasks_max)),
        ));
        for m in &t.mps {
            o.push_str(&format!(
                ", {} {}",
                m.unit,
                m.active_state.as_deref().unwrap_or("not loaded")
            ));
        }
        o.push('\n');
    }
    o.push_str("leases:\n");
    if s.leases.is_empty() {
        o.push_str("  none\n");
    }
    for l in &s.leases {
        o.push_str(&format!("  {}\n", lease_line(l)));
    }
    if !s.queue.is_empty() {
        o.push_str("waiting (gpuctl run --wait):\n");
    }
    for q in &s.queue {
        o.push_str(&format!("  {}\n", queued_line(q)));
    }
    o.push_str("gpus:\n");
    for g in &s.gpus {
        o.push_str(&format!(
            "  {} {}: teams [{}], MIG {}\n",
            g.index,
            g.node,
            g.teams.join(","),
            g.mig.as_deref().unwrap_or("not supported")
        ));
        for d in &g.out_of_service {
            o.push_str(&format!(
                "    OUT OF SERVICE {} since {} (unix) by {}: {}\n",
                d.device, d.since, d.by, d.reason
            ));
        }
        if let Some(l) = &g.layout {
            match (&l.since, &l.reason) {
                (Some(t), Some(why)) => o.push_str(&format!(
                    "    layout {} since {} (unix): {why}\n",
                    l.name, t
                )),
                _ => o.push_str(&format!(
                    "    layout {} (not switched since boot)\n",
                    l.name
                )),
            }
        }
    }
    o
}

/// Processes on a team's device outside every owning team's slice (a system service, a login
/// session), one line each: what `outside = "closed"` does not fence (system.slice stays the
/// admin's) or what held a device before the fence was closed.
pub fn stray_lines(u: &crate::usage::Usage) -> Vec<String> {
    let line = |p: &crate::usage::ProcessUsage, dev: String, teams: &[String]| {
        format!(
            "  pid {} ({}, user {}) on {dev}, outside the slice of team {}",
            p.pid,
            p.unit.as_deref().unwrap_or("no unit"),
            p.user.as_deref().unwrap_or("?"),
            teams.join(", ")
        )
    };
    let mut out = Vec::new();
    for g in &u.gpus {
        for p in g.processes.iter().filter(|p| p.stray) {
            out.push(line(p, format!("gpu {}", g.index), &g.teams));
        }
        for m in &g.mig_devices {
            for p in m.processes.iter().filter(|p| p.stray) {
                out.push(line(p, format!("gpu {} {}", g.index, m.uuid), &m.teams));
            }
        }
    }
    out
}

/// One lease for humans: `interns MIG-a: alice (uid 1000) gpuctl-run-interns-812.scope since
/// 2026-12-03T17:50:02Z`, with its GPU memory cap when one was set.
pub fn lease_line(l: &crate::dbus_api::reply::v1::LeaseStatus) -> String {
    let mem = l
        .gpu_memory
        .map(|b| format!(", gpu-memory {}", crate::settings::value::human_bytes(b)))
        .unwrap_or_default();
    let lent = l
        .borrowed_from
        .as_ref()
        .map(|o| format!(", borrowed from {o}"))
        .unwrap_or_default();
    format!(
        "{} {}: {} (uid {}) {} since {}{mem}{lent}",
        l.team,
        l.devices.join(","),
        l.user,
        l.uid,
        l.unit,
        crate::placement::utc(l.since)
    )
}

/// One waiting request for humans: `interns #2: bob (uid 1001)`.
pub fn queued_line(q: &crate::dbus_api::reply::v1::QueuedRequest) -> String {
    let profile = q
        .profile
        .as_ref()
        .map_or(String::new(), |p| format!(" --profile {p}"));
    let why = q
        .reason
        .as_ref()
        .map_or(String::new(), |r| format!(": {r}"));
    format!(
        "{} #{}: {} (uid {}){profile}{why}",
        q.team,
        q.position,
        q.user.as_deref().unwrap_or("?"),
        q.uid
    )
}

/// Run `gpuctl status`.
pub fn run(args: &StatusArgs) -> i32 {
    let (text, reply): (_, StatusReply) =
        match reply(with_agent("Status", async |p| p.status().await)) {
            Ok(r) => r,
            Err(code) => return code,
        };
    if args.json {
        print_json(text);
    } else {
        print!("{}", render(&reply));
        // Best effort: the usage collection is a second call, and may be denied or unavailable.
        let usage = reply_usage();
        let strays = usage.as_ref().map(stray_lines).unwrap_or_default();
        if !strays.is_empty() {
            println!("strays (a team's GPU used outside its slice):");
            for l in strays {
                println!("{l}");
            }
        }
    }
    if reply.healthy() {
        super::exit::OK
    } else {
        super::exit::INVALID
    }
}

fn reply_usage() -> Option<crate::usage::Usage> {
    let text = with_agent("Usage", async |p| p.usage().await).ok()?;
    serde_json::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strays_are_named_with_unit_user_and_the_owning_team() {
        let u: crate::usage::Usage = serde_json::from_value(json!({
            "collected_at_ms": 1, "interval_ms": 1,
            "gpus": [{"index": 0, "uuid": "GPU-0", "name": "x", "teams": ["infer"], "mig": false,
                "memory_used": null, "memory_total": null, "utilization_gpu": null,
                "utilization_memory": null, "activity": null, "power_mw": null,
                "temperature_c": null,
                "processes": [
                    {"pid": 7, "kind": "compute", "used_memory": null, "uid": 0, "user": "root",
                     "command": "x", "unit": "nvtest.service", "team": null, "stray": true},
                    {"pid": 8, "kind": "compute", "used_memory": null, "uid": 0, "user": "root",
                     "command": "x", "unit": "job.service", "team": "infer", "stray": false}]}]
        }))
        .unwrap();
        assert_eq!(
            stray_lines(&u),
            ["  pid 7 (nvtest.service, user root) on gpu 0, outside the slice of team infer"]
        );
    }

    #[test]
    fn summary_names_teams_gpus_reconcile_and_policy_error() {
        let s = render(&serde_json::from_value(json!({
            "status": "policy error in /etc/gpuctl/policy.d/20-x.toml:3 — last good policy in force",
            "policy_error": "/etc/gpuctl/policy.d/20-x.toml:3",
            "policy_in_force": "last-good",
            "last_reconcile": {"at": 5, "result": "converged", "changes": ["a"], "errors": []},
            "teams": {"infer": {"gpus": [{"index": 0}], "slice": {"unit": "gpu-infer.slice",
                "active_state": "active", "memory_current": 1048576,
                "tasks_current": 3, "wanted": {"memory_max": 268435456, "tasks_max": 128,
                    "device_allow": []}},
                "mps": [{"unit": "gpuctl-mps@infer-0.service", "active_state": "active"}]}},
            "gpus": [{"index": 0, "node": "/dev/nvidia0", "teams": ["infer"], "mig": null},
                {"index": 1, "node": "/dev/nvidia1", "teams": ["infer"], "mig": null,
                 "out_of_service": [{"device": "GPU-1", "reason": "XID 79 (GPU has fallen off the bus)",
                    "since": 9, "by": "gpuctld"}]}],
        }))
        .unwrap());
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
        assert!(s.contains("  0 /dev/nvidia0: teams [infer], MIG not supported\n  1 "));
        assert!(
            s.contains(
                "  1 /dev/nvidia1: teams [infer], MIG not supported\n    OUT OF SERVICE GPU-1 \
                 since 9 (unix) by gpuctld: XID 79 (GPU has fallen off the bus)\n"
            ),
            "{s}"
        );
        assert!(s.contains("leases:\n  none\n"), "{s}");
        assert!(
            !s.contains("waiting"),
            "no queue section without a queue: {s}"
        );
    }

    #[test]
    fn the_queue_is_listed_in_order_and_a_waiter_finds_its_first_place() {
        let s: StatusReply = serde_json::from_value(json!({
            "status": "converged",
            "teams": {},
            "gpus": [],
            "queue": [
                {"team": "interns", "uid": 1000, "user": "alice", "position": 1},
                {"team": "interns", "uid": 1001, "user": "bob", "position": 2},
                {"team": "interns", "uid": 1000, "user": "alice", "position": 3},
                {"team": "train", "uid": 1001, "user": null, "position": 1},
            ],
        }))
        .unwrap();
        let text = render(&s);
        assert!(
            text.contains(
                "waiting (gpuctl run --wait):\n  interns #1: alice (uid 1000)\n  \
                 interns #2: bob (uid 1001)\n  interns #3: alice (uid 1000)\n  \
                 train #1: ? (uid 1001)\n"
            ),
            "{text}"
        );
        use crate::cli::shell::position_line;
        assert_eq!(
            position_line(&s, "interns", 1001).as_deref(),
            Some("waiting for a device of team interns: position 2 of 3")
        );
        assert_eq!(
            position_line(&s, "interns", 1000).as_deref(),
            Some("waiting for a device of team interns: position 1 of 3 (2 of your requests wait)")
        );
        assert_eq!(position_line(&s, "train", 1000), None, "not queued there");
    }

    #[test]
    fn leases_name_holder_unit_devices_and_since() {
        let l = crate::dbus_api::reply::v1::LeaseStatus {
            unit: "gpuctl-run-interns-812.scope".into(),
            team: "interns".into(),
            user: "alice".into(),
            uid: 1000,
            pid: 812,
            devices: vec!["MIG-a".into()],
            since: 0,
            gpu_memory: Some(2 << 30),
            borrowed_from: None,
        };
        assert_eq!(
            lease_line(&l),
            "interns MIG-a: alice (uid 1000) gpuctl-run-interns-812.scope since \
             1970-01-01T00:00:00Z, gpu-memory 2 GiB"
        );
        let b = crate::dbus_api::reply::v1::LeaseStatus {
            gpu_memory: None,
            borrowed_from: Some("train".into()),
            ..l
        };
        assert!(lease_line(&b).ends_with("since 1970-01-01T00:00:00Z, borrowed from train"));
    }
}
