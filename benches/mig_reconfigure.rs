//! MIG reconfiguration cost: gpuctl's minimal, transactional apply against mig-parted's
//! strategy (destroy every instance of the configured GPUs, create the whole layout again),
//! both run in this process through the real nvml-wrapper against the fake libnvidia-ml.
//!
//! For each scenario it prints the NVML mutating calls (from the fake's call log), the NVML
//! queries (the fake's per-process counter), the size of the planned diff (GI/CI creates and
//! destroys), wall time (median of several runs) and the baseline/gpuctl ratios. It asserts that gpuctl's mutating calls equal the diff size.
//!
//! Run: `cargo bench --bench mig_reconfigure`.

#[path = "../tests/fakehost/mod.rs"]
mod fakehost;

use fakehost::{policy, FakeHost};
use gpuctl::apply::{GpuEffector, Observer, OwnerLabels};
use gpuctl::observe::Observed;
use gpuctl::plan::{self, desired, ActionKind};
use gpuctl::policy::Policy;
use std::time::{Duration, Instant};

const RUNS: usize = 5;

fn teams(n: &[&str]) -> String {
    n.iter()
        .map(|t| format!("[teams.{t}]\nmembers = [\"@{t}\"]\n"))
        .collect()
}

fn pol(gpus: &[(&str, &str)]) -> String {
    let mut s = format!(
        "version = 1\n{}",
        teams(&["a", "b", "c", "d", "e", "f", "g"])
    );
    for (idx, geo) in gpus {
        s += &format!("[[gpu]]\nindex = [{idx}]\nmig = [ {geo} ]\n");
    }
    s
}

fn seven(last: &str) -> String {
    let mut v: Vec<String> = ["a", "b", "c", "d", "e", "f"]
        .iter()
        .map(|o| format!("{{ profile = \"1g.10gb\", owner = \"{o}\" }}"))
        .collect();
    v.push(format!("{{ profile = \"{last}\", owner = \"g\" }}"));
    v.join(", ")
}

struct Scenario {
    name: &'static str,
    spec: &'static str,
    from: String,
    to: String,
}

fn scenarios() -> Vec<Scenario> {
    let s7 = seven("1g.10gb");
    let s7me = seven("1g.10gb+me");
    let eight_from: Vec<(String, String)> = (0..8).map(|i| (i.to_string(), s7.clone())).collect();
    let mut eight_to = eight_from.clone();
    eight_to[7].1 = s7me.clone();
    let as_ref = |v: &Vec<(String, String)>| -> String {
        pol(&v
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect::<Vec<_>>())
    };
    vec![
        Scenario {
            name: "change one of seven (1g -> 1g+me)",
            spec: "h100",
            from: pol(&[("0", &s7)]),
            to: pol(&[("0", &s7me)]),
        },
        Scenario {
            name: "swap two owners (4g a + 3g b -> 4g b + 3g a)",
            spec: "h100",
            from: pol(&[(
                "0",
                "{ profile = \"4g.40gb\", owner = \"a\" }, { profile = \"3g.40gb\", owner = \"b\" }",
            )]),
            to: pol(&[(
                "0",
                "{ profile = \"4g.40gb\", owner = \"b\" }, { profile = \"3g.40gb\", owner = \"a\" }",
            )]),
        },
        Scenario {
            name: "7 x 1g -> 3g + 4g",
            spec: "h100",
            from: pol(&[("0", &s7)]),
            to: pol(&[(
                "0",
                "{ profile = \"4g.40gb\", owner = \"a\" }, { profile = \"3g.40gb\", owner = \"b\" }",
            )]),
        },
        Scenario {
            name: "add one to a half-full GPU (4g -> 4g + 3g)",
            spec: "h100",
            from: pol(&[("0", "{ profile = \"4g.40gb\", owner = \"a\" }")]),
            to: pol(&[(
                "0",
                "{ profile = \"4g.40gb\", owner = \"a\" }, { profile = \"3g.40gb\", owner = \"b\" }",
            )]),
        },
        Scenario {
            name: "8 GPUs x 7 x 1g, one instance on one GPU changes",
            spec: "h100*8",
            from: as_ref(&eight_from),
            to: as_ref(&eight_to),
        },
    ]
}

/// mig-parted's apply: every GPU the config names loses all its instances, then gets the whole
/// layout again (placements as the planner would choose them on an empty GPU).
fn baseline(fake: &FakeHost, p: &Policy) {
    let mut h = fake.host();
    let obs = h.observe().expect("observe");
    let mut empty: Observed = obs.clone();
    for g in &mut empty.gpus {
        if let Some(m) = &mut g.mig {
            m.instances.clear();
        }
    }
    let d = desired(p, &empty);
    for gd in &d.gpus {
        if gd.mig.layout.is_empty() {
            continue;
        }
        let g = obs.gpu(gd.index).expect("gpu");
        for gi in g.mig.iter().flat_map(|m| &m.instances) {
            for c in &gi.compute {
                h.destroy_ci(&g.uuid, gi.id, c.id).expect("destroy ci");
            }
            h.destroy_gi(&g.uuid, gi.id).expect("destroy gi");
        }
        for l in &gd.mig.layout {
            let id = h
                .create_gi(&g.uuid, l.profile_id, l.placement)
                .expect("create gi");
            for c in &l.cis {
                h.create_ci(&g.uuid, id, c.profile_id, c.placement)
                    .expect("create ci");
            }
            if let Some(o) = &l.owner {
                h.set_owner(&g.uuid, id, o).expect("owner");
            }
        }
    }
    // The device views need the new MIG UUIDs: one more observation, as gpuctl's second round.
    h.observe().expect("observe");
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    println!(
        "{:<52} {:>5} {:>13} {:>7} {:>13} {:>7} {:>21} {:>7}",
        "", "", "mutating", "", "queries", "", "time", ""
    );
    println!(
        "{:<52} {:>5} {:>6} {:>6} {:>7} {:>6} {:>6} {:>7} {:>10} {:>10} {:>7}",
        "scenario",
        "diff",
        "gpuctl",
        "base",
        "calls×",
        "gpuctl",
        "base",
        "query×",
        "gpuctl",
        "baseline",
        "time×"
    );
    for s in scenarios() {
        let mut ours_t = Vec::new();
        let mut base_t = Vec::new();
        let (mut ours_calls, mut base_calls, mut diff) = (0, 0, 0);
        let (mut ours_q, mut base_q) = (0, 0);
        for _ in 0..RUNS {
            // gpuctl
            let fake = FakeHost::new(s.spec);
            let from = policy(fake.dir.path(), "from.toml", &s.from);
            let to = policy(fake.dir.path(), "to.toml", &s.to);
            let r = fake.apply(&from);
            assert!(r.failed.is_empty(), "{}: setup {:?}", s.name, r.failed);
            let snapshot = std::fs::read(&fake.state).unwrap();
            let owners = fake.root.join("var/lib/gpuctl/owners.json");
            let owners_snap = std::fs::read(&owners).unwrap();

            let pl = plan::plan(&to, &fake.observe());
            diff = pl
                .actions
                .iter()
                .filter(|a| {
                    matches!(
                        a.kind,
                        ActionKind::CreateGi { .. }
                            | ActionKind::CreateCi { .. }
                            | ActionKind::DestroyGi { .. }
                            | ActionKind::DestroyCi { .. }
                    )
                })
                .count() as u64;
            let c0 = fake.mutating_calls();
            let q0 = fake.query_calls();
            let t = Instant::now();
            let r = fake.apply(&to);
            ours_t.push(t.elapsed());
            ours_q = fake.query_calls() - q0;
            assert!(r.failed.is_empty(), "{}: {:?}", s.name, r.failed);
            ours_calls = fake.mutating_calls() - c0;
            assert_eq!(
                ours_calls, diff,
                "{}: mutating calls must equal the diff",
                s.name
            );

            // baseline, from the same starting state
            std::fs::write(&fake.state, &snapshot).unwrap();
            std::fs::write(&owners, &owners_snap).unwrap();
            let c0 = fake.mutating_calls();
            let q0 = fake.query_calls();
            let t = Instant::now();
            baseline(&fake, &to);
            base_t.push(t.elapsed());
            base_q = fake.query_calls() - q0;
            base_calls = fake.mutating_calls() - c0;
        }
        let (o, b) = (median(ours_t), median(base_t));
        let calls_ratio = if ours_calls == 0 {
            "inf".to_string()
        } else {
            format!("{:.1}", base_calls as f64 / ours_calls as f64)
        };
        println!(
            "{:<52} {:>5} {:>6} {:>6} {:>7} {:>6} {:>6} {:>7.2} {:>8.1}ms {:>8.1}ms {:>7.2}",
            s.name,
            diff,
            ours_calls,
            base_calls,
            calls_ratio,
            ours_q,
            base_q,
            base_q as f64 / ours_q as f64,
            o.as_secs_f64() * 1e3,
            b.as_secs_f64() * 1e3,
            b.as_secs_f64() / o.as_secs_f64()
        );
        // The figures docs/nvml.md quotes, in the one format every benchmark prints.
        println!(
            "BENCH mig_reconfigure scenario={:?} mutating={ours_calls}/{base_calls} calls_ratio={calls_ratio} queries={ours_q}/{base_q} time_ratio={:.2}",
            s.name,
            b.as_secs_f64() / o.as_secs_f64()
        );
    }
    println!(
        "mutating: NVML mutating calls (GI/CI create/destroy, MIG mode), from the fake's call \
         log; queries: read-only NVML calls (nvmlInit included), from the fake's per-process \
         counter; ×: baseline/gpuctl; time: wall time of the whole apply (open NVML, observe, \
         plan, execute) in this process against the fake, median of {RUNS} runs. On the fake \
         every call, query or mutation, locks and parses the JSON state file; on real GPUs \
         GI/CI create/destroy are the slow part (not measured here)."
    );
}
