//! Policy builders for tests that must not depend on the TOML loader.
#![allow(dead_code)]

use gpuctl::apply::execute;
use gpuctl::observe::GpuProcess;
use gpuctl::plan::{plan, ActionKind, Plan};
use gpuctl::policy::{
    GpuAssignment, GpuUse, HostSettings, Limits, MigSpec, MpsSettings, Policy, Reconfigure,
    Selector, Size, Team,
};
use gpuctl::sim::SimHost;

pub fn team(name: &str) -> Team {
    Team {
        name: name.parse().unwrap(),
        members: vec![],
        limits: Limits {
            memory_max: Some(Size::PercentOfRam(10.0)),
            cpu_weight: Some(100),
            ..Default::default()
        },
        mps: None,
        idle: None,
        placement: Default::default(),
        lend: None,
        borrow: false,
        loc: None,
    }
}

pub fn mps_team(name: &str) -> Team {
    Team {
        mps: Some(MpsSettings {
            active_thread_percentage: Some(50),
            ..Default::default()
        }),
        ..team(name)
    }
}

pub fn policy(teams: Vec<Team>, gpus: Vec<GpuAssignment>, reconfigure: Reconfigure) -> Policy {
    Policy {
        host: HostSettings {
            reconfigure,
            ..Default::default()
        },
        teams: teams.into_iter().map(|t| (t.name.clone(), t)).collect(),
        gpus,
        sources: vec![],
        slurm: Default::default(),
        layouts_in_force: Default::default(),
    }
}

pub fn assign(selector: Selector, usage: GpuUse) -> GpuAssignment {
    GpuAssignment {
        selector,
        usage,
        loc: None,
        key: "gpu[0]".into(),
        layouts: None,
    }
}

/// `(profile, owner, count, compute split)`.
pub fn mig(index: u32, specs: &[(&str, &str, u32, &[&str])]) -> GpuAssignment {
    assign(
        Selector::Index(vec![index]),
        GpuUse::Mig(
            specs
                .iter()
                .map(|(p, o, c, s)| MigSpec {
                    profile: p.to_string(),
                    owner: o.parse().unwrap(),
                    count: *c,
                    compute: s.iter().map(|x| x.to_string()).collect(),
                })
                .collect(),
        ),
    )
}

/// Plan and apply until the executor reports its final plan; returns the first plan.
pub fn apply(p: &Policy, host: &mut SimHost) -> (Plan, Plan) {
    let first = plan(p, &host.state);
    let report = execute(p, &first, host).expect("observe never fails on a sim");
    assert!(report.failed.is_empty(), "failures: {:#?}", report.failed);
    (first, report.remaining)
}

pub fn count(p: &Plan, f: impl Fn(&ActionKind) -> bool) -> usize {
    p.actions.iter().filter(|a| f(&a.kind)).count()
}

pub fn proc(pid: u32, unit: Option<&str>) -> GpuProcess {
    GpuProcess {
        pid,
        used_memory: 1 << 30,
        unit: unit.map(String::from),
        cgroup: None,
    }
}

/// `text` written to `dir/name`.
pub fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// `text` loaded as one policy file `p.toml`: the policy when no diagnostic is an error, and
/// every diagnostic with the temp dir cut from its path.
pub fn load_text(text: &str) -> (Option<Policy>, Vec<String>) {
    let d = tempfile::tempdir().unwrap();
    let o = gpuctl::policy::load_files(&[write(d.path(), "p.toml", text)]);
    let prefix = format!("{}/", d.path().display());
    let ds = o
        .diagnostics
        .iter()
        .map(|x| x.to_string().replace(&prefix, ""))
        .collect();
    let ok = !o
        .diagnostics
        .iter()
        .any(|x| x.severity == gpuctl::policy::Severity::Error);
    (o.policy.filter(|_| ok), ds)
}
