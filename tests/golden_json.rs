//! Golden JSON: every document a `gpuctl … --json` prints, fixed in `tests/golden-json/`. The bus
//! replies (`status`, `teams`, `top`, `idle`, `report`) are built from one simulated host
//! (`tests/golden-json/root`, a100-40gb*3: `train` a whole GPU, `infer` MPS on a whole GPU,
//! `interns` two MIG devices) with fixed times, serialised as gpuctld does and printed through
//! the CLI's own rendering; root's view and a non-member's redacted one where the call redacts.
//! `env --format json` renders the `Env` reply. The local commands (`plan`, `validate`) run the
//! binary; `doctor --json`'s golden is checked in tests/doctor.rs, against its fake host.
//! A changed document is a changed bus interface (`reply::v1`): `GPUCTL_UPDATE_GOLDEN=1`
//! rewrites the files (tests/common/golden.rs), to be reviewed with `git diff`.

mod common;
#[path = "common/golden.rs"]
mod golden;

use gpuctl::cli::shell::render_json;
use gpuctl::dbus_api::ledger::ledger_reply;
use gpuctl::dbus_api::reply::v1::{IdleReply, StatusReply, TeamInfo, Usage};
use gpuctl::dbus_api::reply::{HostView, ReconcileReport, ReportReply};
use gpuctl::dbus_api::{AgentState, LiveStatus};
use gpuctl::idle::{Activity, HolderSample, Sample, Tracker};
use gpuctl::join::{Via, Viewer};
use gpuctl::ledger::{By, Day, Figures, Key};
use gpuctl::observe::Observed;
use gpuctl::paths::Root;
use gpuctl::placement::Lease;
use gpuctl::policy::{IdleAction, IdleRule, Policy};
use gpuctl::sim::SimHost;
use gpuctl::systemd::client::UnitState;
use gpuctl::systemd::SliceUsage;
use gpuctl::usage::{GpuUsage, MigUsage, Owners, ProcessUsage};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const ROOT: &str = "tests/golden-json/root";
const SPEC: &str = "a100-40gb*3";
/// 2025-12-03T10:00:00Z: every time in the documents is this or derived from it.
const AT: u64 = 1_764_756_000;

fn check(name: &str, got: &str) {
    golden::check(
        &golden::repo_path(&format!("tests/golden-json/{name}")),
        got,
    );
}

/// The host as gpuctld's last reconcile left it: the policy applied to the simulated host.
fn converged() -> (Policy, Observed, HostView) {
    let outcome = gpuctl::policy::load(&Root::new(golden::repo_path(ROOT)));
    let policy = outcome.policy.expect("the golden policy is valid");
    let mut host = SimHost::from_spec(SPEC).unwrap();
    let (_, left) = common::apply(&policy, &mut host);
    assert!(left.is_converged(), "{left:#?}");
    let observed = host.state.clone();
    let d = gpuctl::plan::desired(&policy, &observed);
    let view = HostView {
        teams: d.teams,
        gpus: observed.gpus.clone(),
    };
    (policy, observed, view)
}

fn mig_uuids(view: &HostView, team: &str) -> Vec<String> {
    view.teams[team]
        .mig_devices
        .iter()
        .map(|m| m.uuid.clone())
        .collect()
}

/// alice's job on infer's GPU and an intern's on the first MIG device.
fn leases(view: &HostView) -> Vec<Lease> {
    vec![
        Lease {
            unit: "gpuctl-run-infer-4242.scope".into(),
            team: "infer".into(),
            user: "alice".into(),
            uid: 1001,
            pid: 4242,
            devices: vec![view.gpus[1].uuid.clone()],
            since: AT - 600,
            gpu_memory: Some(8 << 30),
            borrowed_from: None,
        },
        Lease {
            unit: "gpuctl-run-interns-5150.scope".into(),
            team: "interns".into(),
            user: "dave".into(),
            uid: 1004,
            pid: 5150,
            devices: vec![mig_uuids(view, "interns")[0].clone()],
            since: AT - 60,
            gpu_memory: None,
            borrowed_from: None,
        },
    ]
}

/// gpuctld's `Status` reply, built by its own `status_reply` from the state the reconcile
/// left and what systemd reports live, with the live values fixed.
fn status_reply(policy: &Policy, view: &HostView) -> StatusReply {
    let state = AgentState {
        status_text: "3 teams, 3 GPUs converged".into(),
        last_report: Some(ReconcileReport {
            view: Some(view.clone()),
            ..report()
        }),
        policy_error: None,
        policy: Some(policy.clone()),
        policy_origin: Some("current"),
        cycle_started_us: AT * 1_000_000,
        busy: false,
        idle: Default::default(),
    };
    let mut live = LiveStatus::default();
    for (name, tv) in &view.teams {
        let usage = SliceUsage {
            active_state: "active".into(),
            memory_current: Some(3 << 30),
            tasks_current: Some(42),
        };
        live.slices
            .insert(name.to_string(), (Some(tv.slice.clone()), Some(usage)));
        for (inst, spec) in &tv.mps {
            live.mps.push((inst.clone(), spec.clone()));
            let state = UnitState {
                load: "loaded".into(),
                active: "active".into(),
                sub: "running".into(),
            };
            live.units.insert(gpuctl::systemd::mps::unit(inst), state);
        }
    }
    live.leases = leases(view);
    let mut reply = gpuctl::dbus_api::status_reply(state, &live);
    // The queue is filled per caller, outside the reply builder.
    reply.queue = vec![gpuctl::dbus_api::reply::v1::QueuedRequest {
        position: 1,
        team: "interns".into(),
        uid: 1002,
        user: Some("carol".into()),
        profile: None,
        reason: None,
    }];
    reply
}

/// The last reconcile: a policy change that raised train's CPU weight.
fn report() -> ReconcileReport {
    ReconcileReport {
        at: AT,
        teams: 3,
        gpus: 3,
        changes: vec!["set gpu-train.slice CPUWeight=400".into()],
        units: vec![
            "gpu-infer.slice".into(),
            "gpu-interns.slice".into(),
            "gpu-train.slice".into(),
            "gpuctl-mps@infer-gpus.service".into(),
        ],
        ..Default::default()
    }
}

#[test]
fn status_json() {
    let (policy, _, view) = converged();
    let s = status_reply(&policy, &view);
    assert_eq!(s.teams.len(), policy.teams.len());
    let text = serde_json::to_string(&s).unwrap();
    check("status.json", &render_json(text));
}

/// `Plan`, `Apply` and `Reload` (read by scripts with busctl and jq; `gpuctl apply` prints
/// lines from it): the daemon's report converted to the wire type.
#[test]
fn report_reply_json() {
    let mut r = report();
    let blocked = "gpu 2: destroy GI 3g.20gb gi@0+4 blocked: in use by pid 5150 \
                   (gpuctl-run-interns-5150.scope)";
    r.warnings = vec![blocked.into()];
    r.differs = vec![blocked.into()];
    let text = serde_json::to_string(&ReportReply::from(r)).unwrap();
    check("report-reply.json", &render_json(text));
}

/// `Teams` for root (every team) and for alice (her team only: `Teams` lists, it does not
/// redact).
#[test]
fn teams_json() {
    let (policy, _, view) = converged();
    let leases = leases(&view);
    let info = |name: &str, via: Via| {
        let t = &policy.teams[name];
        let env = team_env(&view, name);
        TeamInfo {
            devices: env.get("CUDA_VISIBLE_DEVICES").cloned(),
            env: Some(env),
            limits: t.limits.clone(),
            members: t.members.iter().map(ToString::to_string).collect(),
            mps: t.mps.clone(),
            slice: gpuctl::systemd::props::slice_unit(name),
            team: name.into(),
            via,
            share: gpuctl::dbus_api::place::holds(
                t,
                &gpuctl::dbus_api::place::share(&view, name),
                &leases,
                &Default::default(),
            ),
        }
    };
    let all: Vec<TeamInfo> = ["infer", "interns", "train"]
        .into_iter()
        .map(|n| info(n, Via::Root))
        .collect();
    let text = serde_json::to_string(&all).unwrap();
    check("teams-root.json", &render_json(text));
    let alice = vec![info("infer", Via::User("alice".into()))];
    let text = serde_json::to_string(&alice).unwrap();
    check("teams-alice.json", &render_json(text));
}

/// A team's environment as gpuctld serves it (`Env`, and in `Teams`): its env file's lines.
fn team_env(view: &HostView, team: &str) -> BTreeMap<String, String> {
    view.teams[team]
        .env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `env --format json` of the MPS team and of the MIG team.
#[test]
fn env_json() {
    let (_, _, view) = converged();
    for team in ["infer", "interns"] {
        let text = gpuctl::cli::env::render(
            &team.parse().unwrap(),
            &team_env(&view, team),
            &Default::default(),
            gpuctl::cli::env::Format::Json,
            None,
        );
        check(&format!("env-{team}.json"), &text);
    }
}

fn process(pid: u32, user: &str, uid: u32, command: &str, cgroup_unit: &str) -> ProcessUsage {
    let team = cgroup_unit
        .strip_prefix("gpu-")
        .and_then(|s| s.split_once(".slice/"))
        .map(|(t, _)| t.to_string());
    let unit = cgroup_unit.rsplit('/').next().unwrap().to_string();
    ProcessUsage {
        pid,
        ns_pid: None,
        kind: "compute".into(),
        used_memory: Some(u64::from(pid % 7 + 1) << 30),
        uid: Some(uid),
        user: Some(user.into()),
        command: Some(command.into()),
        team_unit: team.as_ref().map(|_| unit.clone()),
        unit: Some(unit),
        team,
        ..Default::default()
    }
}

/// One collection: carol trains on GPU 0, infer's MPS server and alice's job on GPU 1, an
/// intern idles on a MIG device of GPU 2 and root runs a stray on the other.
fn usage(observed: &Observed, view: &HostView) -> Usage {
    let gpu = |i: usize, util: Option<u32>, procs: Vec<ProcessUsage>| {
        let g = &observed.gpus[i];
        GpuUsage {
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            memory_used: Some(procs.iter().filter_map(|p| p.used_memory).sum()),
            memory_total: Some(40 << 30),
            utilization_gpu: util,
            utilization_memory: util.map(|u| u / 2),
            activity: None,
            power_mw: Some(180_000 + 10_000 * g.index),
            temperature_c: Some(50 + g.index),
            mig: g.mig.as_ref().is_some_and(|m| m.current),
            processes: procs,
            ..Default::default()
        }
    };
    let mig = mig_uuids(view, "interns");
    let mig_dev = |k: usize, gi_id: u32, profile: &str, procs: Vec<ProcessUsage>| MigUsage {
        uuid: mig[k].clone(),
        gi_id,
        ci_id: 0,
        profile: profile.into(),
        memory_used: Some(procs.iter().filter_map(|p| p.used_memory).sum()),
        memory_total: Some(if k == 0 { 20 << 30 } else { 10 << 30 }),
        activity: None,
        processes: procs,
        ..Default::default()
    };
    let mut g2 = gpu(2, None, vec![]);
    g2.mig_devices = vec![
        mig_dev(
            0,
            1,
            "3g.20gb",
            vec![{
                let mut p = process(
                    5150,
                    "dave",
                    1004,
                    "python3",
                    "gpu-interns.slice/gpuctl-run-interns-5150.scope",
                );
                p.idle = Some("idle".into());
                p
            }],
        ),
        mig_dev(
            1,
            2,
            "2g.10gb",
            vec![process(
                777,
                "root",
                0,
                "nvtest",
                "system.slice/nvtest.service",
            )],
        ),
    ];
    g2.memory_used = Some(g2.mig_devices.iter().filter_map(|m| m.memory_used).sum());
    let mut u = Usage {
        collected_at_ms: AT * 1000,
        interval_ms: 2000,
        nvml_unavailable: None,
        gpus: vec![
            gpu(
                0,
                Some(97),
                vec![process(
                    3001,
                    "carol",
                    1002,
                    "torchrun",
                    "gpu-train.slice/train-llm.service",
                )],
            ),
            gpu(
                1,
                Some(40),
                vec![
                    process(
                        2101,
                        "root",
                        0,
                        "nvidia-cuda-mps",
                        "gpu-infer.slice/gpuctl-mps@infer-gpus.service",
                    ),
                    process(
                        4242,
                        "alice",
                        1001,
                        "vllm",
                        "gpu-infer.slice/gpuctl-run-infer-4242.scope",
                    ),
                ],
            ),
            g2,
        ],
    };
    gpuctl::usage::attribute(&mut u, &Owners::from(view));
    u
}

/// `top --json` as root (everything), alice (infer's processes; the others counted) and bob
/// (in no team: counts only), redacted as gpuctld's `Usage` does.
#[test]
fn top_json() {
    let (_, observed, view) = converged();
    let u = usage(&observed, &view);
    assert!(
        u.processes().any(|(_, _, p)| p.stray),
        "the root job is a stray"
    );
    let viewers = [
        ("root", Viewer::All),
        ("alice", Viewer::Teams(["infer".to_string()].into())),
        ("bob", Viewer::Teams(Default::default())),
    ];
    for (who, v) in viewers {
        let mut mine = u.clone();
        mine.redact(|t| v.sees(t));
        // The document travels as JSON and `top` reads it back before printing.
        let read: Usage = serde_json::from_str(&serde_json::to_string(&mine).unwrap()).unwrap();
        check(
            &format!("top-{who}.json"),
            &gpuctl::cli::top::render_json(&read),
        );
    }
}

/// `idle --json` as root and as bob: interns' rule stops a holder idle for an hour.
#[test]
fn idle_json() {
    let (_, _, view) = converged();
    let mig = mig_uuids(&view, "interns");
    let mut t = Tracker::new(10_000);
    t.set_rules(
        [(
            "interns".to_string(),
            IdleRule {
                after: Duration::from_secs(60),
                below: 5.0,
                action: IdleAction::Stop,
                grace: Duration::from_secs(600),
                exclude: vec![],
                memory_alarm: None,
            },
        )]
        .into(),
    );
    let holder = |unit: &str, user: &str, uid: u32, dev: &str, a| HolderSample {
        pids: vec![uid + 4146],
        team: "interns".into(),
        unit: unit.into(),
        user: Some(user.into()),
        uid: Some(uid),
        device: dev.into(),
        memory: Some(2 << 30),
        activity: a,
        sharing: 1,
        ..Default::default()
    };
    let start = AT * 1000 - 80_000;
    let mut at = start;
    while at <= AT * 1000 {
        t.observe(&Sample {
            at_ms: at,
            holders: vec![
                holder(
                    "gpuctl-run-interns-5150.scope",
                    "dave",
                    1004,
                    &mig[0],
                    Activity::Percent(0.0),
                ),
                holder(
                    "notebook.service",
                    "erin",
                    1005,
                    &mig[1],
                    Activity::Percent(80.0),
                ),
            ],
        });
        at += 10_000;
    }
    let reply = |holders| IdleReply {
        at_ms: AT * 1000,
        interval_ms: 10_000,
        sampling: true,
        holders,
    };
    let root = reply(t.holders());
    check("idle-root.json", &gpuctl::cli::idle::render_json(&root));
    let mut hidden = t.holders();
    gpuctl::dbus_api::usage::redact_idle(&mut hidden, &Viewer::Teams(Default::default()));
    check(
        "idle-bob.json",
        &gpuctl::cli::idle::render_json(&reply(hidden)),
    );
}

/// `report --json`: a week by team, as root, built by gpuctld's own `ledger_reply` from the
/// day files' figures: carol trains all week, alice serves on half of each day, dave's intern
/// job holds a MIG device for a day, half of it with activity unknown, until an idle stop.
#[test]
fn report_json() {
    let (policy, _, _) = converged();
    let first = AT / 86_400 - 6;
    let days: Vec<Day> = (first..=first + 6)
        .map(|day| {
            let mut figures = BTreeMap::new();
            let mut put = |team: &str, user: &str, device: &str, kind: &str, f: Figures| {
                let key = Key {
                    team: team.into(),
                    user: user.into(),
                    device: device.into(),
                    kind: kind.into(),
                };
                figures.insert(key, f);
            };
            let gib_s = |gib: u64, ms: u64| (gib << 30) as f64 * ms as f64 / 1000.0;
            put(
                "train",
                "carol",
                "0",
                "gpu",
                Figures {
                    held_ms: 86_400_000,
                    active_ms: 77_760_000,
                    memory_byte_s: gib_s(20, 86_400_000),
                    ..Default::default()
                },
            );
            put(
                "infer",
                "alice",
                "1",
                "gpu",
                Figures {
                    held_ms: 43_200_000,
                    active_ms: 12_960_000,
                    memory_byte_s: gib_s(8, 43_200_000),
                    ..Default::default()
                },
            );
            if day == first + 6 {
                put(
                    "interns",
                    "dave",
                    "MIG-0",
                    "3g.20gb",
                    Figures {
                        held_ms: 86_400_000,
                        active_ms: 8_640_000,
                        unknown_ms: 43_200_000,
                        memory_byte_s: gib_s(2, 86_400_000),
                        reclaimed_ms: 1_800_000,
                        stops: 1,
                        ..Default::default()
                    },
                );
                // A night's loan of train's GPU 0 to interns: borrowed on bob's line, lent on
                // train's.
                put(
                    "interns",
                    "bob",
                    "0",
                    "gpu",
                    Figures {
                        held_ms: 28_800_000,
                        active_ms: 28_800_000,
                        borrowed_ms: 28_800_000,
                        ..Default::default()
                    },
                );
                put(
                    "train",
                    "",
                    "0",
                    "gpu",
                    Figures {
                        lent_ms: 28_800_000,
                        ..Default::default()
                    },
                );
            }
            Day { day, figures }
        })
        .collect();
    let r = ledger_reply(
        &days,
        vec![],
        By::Team,
        (first, first + 6),
        &Viewer::All,
        Some(&policy),
    );
    assert_eq!(
        (r.from.as_str(), r.to.as_str()),
        ("2025-11-27", "2025-12-03")
    );
    let text = serde_json::to_string(&r).unwrap();
    check("report.json", &render_json(text));
}

/// `gpuctl ARGS` from the repository root: (exit code, stdout).
fn gpuctl(args: &[&str]) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8(o.stdout).unwrap(),
    )
}

/// `plan --json` of the golden policy on the bare simulated host, and the `validate`-shaped
/// document it prints instead when the policy does not fit the host (GPU 2 missing).
#[test]
fn plan_json() {
    let (code, out) = gpuctl(&["--root", ROOT, "plan", "--json", "--simulate", SPEC]);
    assert_eq!(code, 0, "{out}");
    check("plan.json", &out);
    let (code, out) = gpuctl(&[
        "--root",
        ROOT,
        "plan",
        "--json",
        "--simulate",
        "a100-40gb*2",
    ]);
    assert_eq!(code, 1, "{out}");
    check("plan-host-mismatch.json", &out);
}

/// `validate --json` of the golden policy, and of a policy with an error and a warning.
#[test]
fn validate_json() {
    let (code, out) = gpuctl(&["--root", ROOT, "validate", "--json"]);
    assert_eq!(code, 0, "{out}");
    check("validate.json", &out);
    let (code, out) = gpuctl(&["validate", "--json", "tests/golden-json/invalid.toml"]);
    assert_eq!(code, 1, "{out}");
    check("validate-invalid.json", &out);
}

/// The golden policy's root is read relative to the repository: the documents name no
/// machine's paths.
#[test]
fn documents_name_no_machine_paths() {
    let dir = golden::repo_path("tests/golden-json");
    let home = env!("CARGO_MANIFEST_DIR");
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "json") {
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(!text.contains(home), "{}", p.display());
            assert!(!text.contains("/tmp/"), "{}", p.display());
        }
    }
    assert!(Path::new(&dir).join("root").is_dir());
}

/// `device list --json`: XID 79 took GPU 1 out, XID 13 only counted on GPU 0, an admin
/// drained one of interns' MIG devices, a pending row remap on GPU 2.
#[test]
fn health_json() {
    use gpuctl::health::{Counters, HealthSettings, Observation, Registry};
    let (_, _, view) = converged();
    let topo = gpuctl::daemon::health::topology(&view.gpus);
    let s = HealthSettings::default();
    let mut reg = Registry::default();
    let uuid = |i: usize| topo.gpus[i].uuid.clone();
    let xid = |i: usize, code| Observation::Xid {
        gpu: uuid(i),
        code,
        gi: None,
        ci: None,
    };
    reg.observe(&xid(0, 13), &topo, &s, AT - 600);
    reg.observe(&xid(1, 79), &topo, &s, AT - 300);
    let remap = Observation::Counters {
        gpu: uuid(2),
        counters: Counters {
            remap_pending: Some(true),
            ..Counters::default()
        },
    };
    reg.observe(&remap, &topo, &s, AT - 120);
    let mig = mig_uuids(&view, "interns");
    reg.drain(&topo, &mig[0], "memory test", "alice", AT - 60)
        .unwrap();
    let mut r = gpuctl::dbus_api::reply::HealthReply::from_registry(&reg, &topo);
    r.watching = true;
    check(
        "health.json",
        &serde_json::to_string_pretty(&r).unwrap_or_default(),
    );
    check("health.txt", &gpuctl::cli::device::render(&r));
}

/// `events --json` (one object per line) and its lines in words: an idle warning of
/// alice's, a queued job of bob's placed on a loan, a device drained (the host's).
#[test]
fn events_json() {
    use gpuctl::dbus_api::reply::v1::{EventRecord, EventsReply};
    let (_, _, view) = converged();
    let mig = mig_uuids(&view, "interns");
    let at = |s: u64| (AT + s) * 1000;
    let r = EventsReply {
        started_ms: at(0) - 3_600_000,
        next: 7,
        lost: false,
        events: vec![
            EventRecord {
                seq: 4,
                at_ms: at(0),
                kind: "idle-warn".into(),
                team: Some("interns".into()),
                user: Some("alice".into()),
                uid: Some(1001),
                unit: Some("gpuctl-run-3f2a.scope".into()),
                device: Some(mig[0].clone()),
                message: format!(
                    "Your GPU job gpuctl-run-3f2a.scope (team interns) on device {}: idle for \
                     30m00s (activity below 5%). It will be stopped in 10m00s unless it becomes \
                     active.",
                    mig[0]
                ),
            },
            EventRecord {
                seq: 6,
                at_ms: at(40),
                kind: "queue-placed".into(),
                team: Some("interns".into()),
                uid: Some(1002),
                device: Some(mig[1].clone()),
                message: format!(
                    "Your queued job (team interns) starts after 95 s in the queue, on {}.",
                    mig[1]
                ),
                ..EventRecord::default()
            },
            EventRecord {
                seq: 7,
                at_ms: at(60),
                kind: "device-out".into(),
                device: Some(mig[0].clone()),
                message: format!(
                    "GPU device {} is out of service, drained by root: memory test",
                    mig[0]
                ),
                ..EventRecord::default()
            },
        ],
    };
    let doc = serde_json::to_string(&r).unwrap_or_default();
    let back: EventsReply = serde_json::from_str(&doc).unwrap();
    assert_eq!(back, r);
    let lines = |f: fn(&EventRecord) -> String| {
        r.events.iter().map(f).collect::<Vec<_>>().join("\n") + "\n"
    };
    check(
        "events.jsonl",
        &lines(|e| serde_json::to_string(e).unwrap_or_default()),
    );
    check("events.txt", &lines(gpuctl::cli::events::render));
}
