//! `gpuctl plan`, `gpuctl apply` and `gpuctl check`.
//!
//! Without `--simulate`/`--state` they observe the real host: GPUs through NVML (see
//! [`crate::nvml`] for how the library is found), files under `--root`. `apply` on the real
//! host goes to the daemon (`Apply` on the bus, root only), or with `--local` runs in this
//! process, as root, like `mig-parted apply`, with the MIG journal under `/var/lib/gpuctl`:
//! the same observe/plan/execute path as the daemon, driving slices, MPS daemons and team units
//! through systemd when the system bus is reachable (otherwise those phases are listed as
//! skipped).
use super::{exit, Cli};
use crate::apply::journal::FileJournal;
use crate::apply::{execute, execute_observed, Observer, Report};
use crate::observe::Observed;
use crate::paths::Root;
use crate::plan::{self, desired, Action, Desired, Plan};
use crate::policy::{self, GpuUse, Policy};
use crate::real::RealHost;
use crate::settings::value::{human_bytes, human_duration};
use crate::sim::SimHost;
use crate::systemd::client::BlockingSystemd;
use anyhow::Context;
use clap::Args;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Where the host state comes from.
#[derive(Debug, Args)]
pub struct HostArgs {
    /// Plan against a simulated host, e.g. `h100-80gb*8` or `a100-40gb*4,h200*2`. Models:
    /// every entry of data/gpu-profiles.json by its simulate name or alias (a100, a800, h100,
    /// h800, h20, h200-nvl, gh200, b200, gb200, b300, rtx-pro-6000, a30, …) and l40s (no MIG); an
    /// unknown name is answered with the list.
    #[arg(long, value_name = "SPEC")]
    pub simulate: Option<String>,
    /// State file of the simulated host (JSON); created from SPEC when missing, updated by
    /// apply. Given alone, the host it describes is reused.
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// Policy files to use instead of the host's policy directories, merged in the order given.
    #[arg(value_name = "POLICY")]
    pub policy: Vec<PathBuf>,
}

/// Arguments of `gpuctl plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Host.
    #[command(flatten)]
    pub host: HostArgs,
    /// Machine-readable output: the plan and what each team gets.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `gpuctl apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Host.
    #[command(flatten)]
    pub host: HostArgs,
    /// Apply to this host in-process, without the daemon (as root; for recovery and scripts).
    /// Without a reachable systemd only MIG and files are applied, the other steps are listed
    /// as skipped.
    #[arg(long, conflicts_with_all = ["simulate", "state"])]
    pub local: bool,
    /// With --local: how long to wait for another writer (gpuctld's reconcile, another
    /// `apply --local`) to finish before giving up, naming it.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, requires = "local")]
    pub lock_wait: u64,
}

/// Arguments of `gpuctl check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Host.
    #[command(flatten)]
    pub host: HostArgs,
}

/// The host a command works on.
pub enum Target {
    /// A simulated host (`--simulate`/`--state`).
    /// Boxed: a simulated host holds a whole observation.
    Sim(Box<SimHost>),
    /// This machine: NVML and files under `--root`.
    Real(Box<RealHost>),
}

/// The simulated host the arguments name; `Ok(None)` when they name the real host.
pub fn sim_host(a: &HostArgs) -> anyhow::Result<Option<SimHost>> {
    match (&a.simulate, &a.state) {
        (None, None) => Ok(None),
        (spec, Some(path)) if path.exists() => {
            let h = SimHost::load(path)?;
            if let Some(spec) = spec {
                let want = crate::sim::build(spec)?;
                let names =
                    |o: &Observed| o.gpus.iter().map(|g| g.name.clone()).collect::<Vec<_>>();
                anyhow::ensure!(
                    names(&want) == names(&h.state),
                    "state file {} describes other GPUs than --simulate {spec:?}; remove it or drop --simulate",
                    path.display()
                );
            }
            Ok(Some(h))
        }
        (Some(spec), _) => Ok(Some(SimHost::from_spec(spec)?)),
        (None, Some(path)) => anyhow::bail!(
            "state file {} does not exist; give --simulate SPEC to create it",
            path.display()
        ),
    }
}

/// Load the policy under `--root`, printing diagnostics; `Err(code)` when it is unusable. With
/// `json`, an unusable policy's diagnostics also go to stdout as `validate --json` prints them,
/// so a JSON consumer is never left with nothing.
pub(super) fn load_policy(cli: &Cli, files: &[PathBuf], json: bool) -> Result<Policy, i32> {
    let out = if files.is_empty() {
        policy::load(&Root::new(&cli.root))
    } else {
        policy::load_files(files)
    };
    for d in &out.diagnostics {
        eprintln!("{d}");
    }
    for (path, why) in &out.unreadable {
        eprintln!("{}: cannot read: {why}", path.display());
    }
    if json && (out.verdict().is_err() || out.policy.is_none()) {
        print_json(&super::validate::to_json(&out));
    }
    match out.verdict() {
        Ok(_) => out.policy.ok_or(exit::INVALID),
        Err(_) => Err(exit::of_load(&out)),
    }
}

fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Checks that need the host: selectors that name absent GPUs, MIG on a model without it, a
/// geometry that does not fit the GPU it lands on; without NVML only the CPU and RAM ones.
fn check_host(p: &Policy, observed: &Observed, json: bool) -> Result<(), i32> {
    let diags = if observed.nvml_unavailable.is_some() {
        policy::validate::check_host_limits(p, observed)
    } else {
        policy::validate::check_against_host(p, observed)
    };
    for d in &diags {
        eprintln!("{d}");
    }
    if diags.iter().any(|d| d.severity == policy::Severity::Error) {
        if json {
            print_json(&super::validate::host_json(&p.sources, &diags));
        }
        return Err(exit::INVALID);
    }
    Ok(())
}

/// Load the policy, open the host (simulated or real) and observe it once. NVML missing on a
/// real host is said once here; the GPUs are then simply not observed (nothing is planned for
/// them) and the rest of the plan stands.
pub(super) fn prepare(
    cli: &Cli,
    host: &HostArgs,
    say_no_systemd: bool,
    json: bool,
) -> anyhow::Result<Result<(Policy, Target, Observed), i32>> {
    let sim = sim_host(host)?;
    let p = match load_policy(cli, &host.policy, json) {
        Ok(p) => p,
        Err(code) => return Ok(Err(code)),
    };
    if let Some(h) = sim {
        let obs = h.state.clone();
        return Ok(check_host(&p, &obs, json).map(|()| (p, Target::Sim(Box::new(h)), obs)));
    }
    let root = Root::new(&cli.root);
    // The layouts gpuctld switched GPUs to are this host's policy, as gpuctld reconciles it.
    let p = crate::reslice::state::InForce::read(&root).apply(&p);
    let lib = crate::nvml::library_path(p.host.nvml_library.as_deref());
    let mut h = RealHost::open(root.clone(), lib);
    // Live slices and MPS daemons are part of the host: observed (and, by apply --local,
    // changed) through systemd when there is one to talk to.
    match BlockingSystemd::connect_system(root) {
        Ok(sd) => h = h.with_systemd(Box::new(sd)),
        Err(e) if say_no_systemd => eprintln!(
            "gpuctl: systemd is not reachable ({e}); the drain, slice, MPS and resume steps \
             are skipped"
        ),
        Err(_) => {}
    }
    h.set_slurm(&p.slurm);
    let obs = h
        .observe()
        .map_err(|e| anyhow::anyhow!("observing the host: {e}"))?;
    if let Some(why) = &obs.nvml_unavailable {
        eprintln!(
            "gpuctl: {why}; the GPUs are unknown: not observed, and nothing is planned for them \
             (CPUs and RAM are still checked)"
        );
    }
    if let Err(code) = check_host(&p, &obs, json) {
        return Ok(Err(code));
    }
    Ok(Ok((p, Target::Real(Box::new(h)), obs)))
}

impl Target {
    /// Whether the host can carry out (and so check) actions of `phase`: a real host without
    /// systemd runs only the MIG and device phases.
    fn supports(&self, phase: plan::Phase) -> bool {
        match self {
            Target::Sim(_) => true,
            Target::Real(h) => h.supports(phase),
        }
    }
}

#[derive(Serialize)]
struct JsonPlan<'a> {
    #[serde(flatten)]
    plan: &'a Plan,
    teams: &'a BTreeMap<crate::policy::TeamName, plan::TeamView>,
    /// Pending idle actions (gpuctld's idle rules), when the policy has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    idle_pending: Option<Vec<String>>,
}

/// The idle actions gpuctld has pending, when the policy has idle rules and the plan is for the
/// real host: `Ok(lines)`, or `Err(why)` when gpuctld cannot be asked. Idle rules act on
/// what runs now, which only the daemon's sampler has seen, so they come from its `Idle` call.
fn idle_pending(p: &Policy, host: &HostArgs) -> Option<Result<Vec<String>, String>> {
    if host.simulate.is_some() || host.state.is_some() || p.teams.values().all(|t| t.idle.is_none())
    {
        return None;
    }
    Some(
        super::idle::fetch()
            .map(|r| r.pending())
            .map_err(|f| f.message),
    )
}

/// The idle section of `gpuctl plan`.
fn render_idle(r: &Result<Vec<String>, String>) -> String {
    match r {
        Ok(v) if v.is_empty() => "idle actions: none pending\n".into(),
        Ok(v) => {
            let mut o = format!("idle actions pending ({}):\n", v.len());
            for l in v {
                let _ = writeln!(o, "  {l}");
            }
            o
        }
        Err(e) => format!("idle actions: not known ({e})\n"),
    }
}

/// Run `gpuctl plan`.
pub fn run_plan(cli: &Cli, a: &PlanArgs) -> anyhow::Result<i32> {
    let (p, _h, obs) = match prepare(cli, &a.host, false, a.json)? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let d = desired(&p, &obs);
    let pl = plan::slurm::around(&p, &obs, plan::diff(&d, &obs));
    let idle = idle_pending(&p, &a.host);
    if a.json {
        let j = JsonPlan {
            plan: &pl,
            teams: &d.teams,
            idle_pending: idle.as_ref().and_then(|r| r.as_ref().ok().cloned()),
        };
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        print!("{}", render(&obs, &d, &pl));
        print!("{}", render_layouts(&p, &obs));
        if let Some(r) = &idle {
            print!("{}", render_idle(r));
        }
    }
    Ok(exit::OK)
}

/// The layouts each GPU's entry allows (`[[gpu.layout]]`), after the plan; nothing when no
/// entry has any. gpuctld switches among them (`gpuctl status` shows each GPU's now).
pub fn render_layouts(p: &Policy, obs: &Observed) -> String {
    let mut out = String::new();
    for a in &p.gpus {
        let Some(ls) = &a.layouts else { continue };
        if out.is_empty() {
            out.push_str(
                "\nLayouts (gpuctld switches each GPU among its entry's; `gpuctl status` shows which it has)\n",
            );
        }
        let gpus: Vec<String> = obs
            .gpus
            .iter()
            .filter(|g| a.selector.matches(g))
            .map(|g| g.index.to_string())
            .collect();
        let _ = writeln!(
            out,
            "  {} (gpu {}): reslice after {}, hold {}",
            a.key,
            if gpus.is_empty() {
                "-".into()
            } else {
                gpus.join(", ")
            },
            human_duration(ls.after),
            human_duration(ls.hold)
        );
        for l in ls.all(&a.usage) {
            let when: Vec<String> = l.when.iter().map(|w| w.to_string()).collect();
            let pref = if when.is_empty() {
                String::new()
            } else {
                format!(" · preferred {}", when.join(", "))
            };
            let has: Vec<String> = obs
                .gpus
                .iter()
                .filter(|g| a.selector.matches(g))
                .filter(|g| {
                    p.layout_in_force(a, g.index)
                        .map_or(crate::policy::DEFAULT_LAYOUT, |x| &x.name)
                        == l.name
                })
                .map(|g| g.index.to_string())
                .collect();
            let now = if has.is_empty() {
                String::new()
            } else {
                format!(" · now on gpu {}", has.join(", "))
            };
            let _ = writeln!(out, "    {}: {}{pref}{now}", l.name, usage_line(&l.usage));
        }
    }
    out
}

/// Run `gpuctl apply`: exit 0 when the host converged, 1 when changes remain blocked, 2 when
/// steps failed.
pub fn run_apply(cli: &Cli, a: &ApplyArgs) -> anyhow::Result<i32> {
    if a.host.simulate.is_none() && a.host.state.is_none() && !a.local {
        return Ok(apply_by_daemon());
    }
    // One writer (issue 17): taken before observing, so the plan is made from what the other
    // writer left, and held until the apply ends.
    let lock = a.local.then(|| {
        crate::apply::lock::ApplyLock::acquire(
            &Root::new(&cli.root),
            "gpuctl apply --local",
            std::time::Duration::from_secs(a.lock_wait),
            |holder| eprintln!("gpuctl: waiting for the apply lock: held by {holder}"),
        )
    });
    let Ok(_lock) = lock.transpose().inspect_err(|e| eprintln!("gpuctl: {e}")) else {
        return Ok(exit::UNREADABLE);
    };
    let (p, h, obs) = match prepare(cli, &a.host, true, false)? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let pl = plan::plan(&p, &obs);
    let (report, h) = match h {
        Target::Sim(mut h) => {
            let r = execute(&p, &pl, &mut *h).context("simulated host")?;
            match &a.host.state {
                Some(path) => h.save(path)?,
                None => {
                    eprintln!("gpuctl: no --state FILE given: the simulated result is not kept")
                }
            }
            (r, Target::Sim(h))
        }
        Target::Real(mut h) => {
            let mut journal = FileJournal::new(h.root());
            let phases = h.phases();
            // The plan was made from `obs`; the executor starts from it rather than asking NVML
            // for the whole host again.
            let r = execute_observed(&p, &pl, obs, h.as_mut(), &mut journal, phases.as_ref())
                .with_context(|| format!("applying on {}", cli.root.display()))?;
            (r, Target::Real(h))
        }
    };
    print_report(&report);
    // Only the steps this host could have run remain.
    let mut remaining = report.remaining.clone();
    remaining.actions.retain(|a| h.supports(a.phase));
    print_pending(&remaining);
    if !report.not_run.is_empty() {
        println!(
            "note: no systemd: --local ran the MIG and device phases only; {} step(s) of the \
             drain, slice, MPS and resume phases were skipped",
            report.not_run.len()
        );
    }
    Ok(if !report.failed.is_empty() {
        exit::UNREADABLE
    } else if remaining.is_converged() {
        exit::OK
    } else {
        exit::INVALID
    })
}

/// `gpuctl apply` on the real host without `--local`: the daemon applies (its `Apply` method,
/// root only, checked by the daemon against the caller's bus credentials) and reports.
fn apply_by_daemon() -> i32 {
    let text = super::shell::with_agent("Apply", async |p| p.apply().await);
    let no_daemon = matches!(&text, Err(f) if f.code == exit::NO_DAEMON);
    let (_, reply): (_, crate::dbus_api::reply::ReportReply) = match super::shell::reply(text) {
        Ok(r) => r,
        Err(code) => {
            if no_daemon {
                eprintln!("gpuctl: without the daemon, as root: gpuctl apply --local");
            }
            return code;
        }
    };
    let r = &reply.report;
    for l in &r.changes {
        println!("done    {l}");
    }
    for l in &r.warnings {
        println!("warning {l}");
    }
    for l in &r.errors {
        println!("FAILED  {l}");
    }
    if r.errors.is_empty() {
        println!("converged: {} teams, {} GPUs", r.teams, r.gpus);
        exit::OK
    } else {
        exit::UNREADABLE
    }
}

fn print_report(report: &Report) {
    for r in &report.recovered {
        println!("journal {r}");
    }
    for act in &report.done {
        println!("done    [{}] {}", act.phase, act.kind);
    }
    for act in &report.restored {
        println!("restored [{}] {} — {}", act.phase, act.kind, act.reason);
    }
    for act in &report.skipped {
        println!("skipped [{}] {}", act.phase, act.kind);
    }
    for act in &report.not_run {
        println!("skipped [{}] {} (needs systemd)", act.phase, act.kind);
    }
    for (act, e) in &report.failed {
        println!("FAILED  [{}] {}: {e}", act.phase, act.kind);
    }
    for pm in &report.pending {
        println!(
            "pending gpu {} ({}): MIG mode change {}",
            pm.index, pm.gpu, pm.reason
        );
    }
}

fn print_pending(p: &Plan) {
    if p.is_converged() {
        println!("converged: the host matches the policy");
        return;
    }
    for act in &p.actions {
        println!("pending [{}] {} — {}", act.phase, act.kind, act.reason);
    }
    for b in &p.blocked {
        println!("blocked {}", blocked_line(b));
    }
}

/// Run `gpuctl check`: exit 0 when converged, 1 when changes are pending or blocked.
pub fn run_check(cli: &Cli, a: &CheckArgs) -> anyhow::Result<i32> {
    let (p, h, obs) = match prepare(cli, &a.host, false, false)? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let mut pl = plan::plan(&p, &obs);
    let (checked, unchecked): (Vec<_>, Vec<_>) =
        pl.actions.into_iter().partition(|a| h.supports(a.phase));
    pl.actions = checked;
    print_pending(&pl);
    if !unchecked.is_empty() {
        println!(
            "note: {} step(s) of the slice/MPS phases are not checked: this build observes \
             no systemd state",
            unchecked.len()
        );
    }
    if obs.nvml_unavailable.is_some() && !p.gpus.is_empty() {
        // The GPU part of the policy cannot be verified: neither converged nor pending.
        return Ok(exit::UNREADABLE);
    }
    Ok(if pl.is_converged() {
        exit::OK
    } else {
        exit::INVALID
    })
}

fn blocked_line(b: &plan::Blocked) -> String {
    let mut s = format!("gpu {}: {}", b.index, b.reason);
    if !b.holders.is_empty() {
        let _ = write!(s, " [held by {}]", b.holders.join(", "));
    }
    s
}

fn action_line(out: &mut String, a: &Action) {
    let _ = writeln!(out, "    [{}] {} — {}", a.phase, a.kind, a.reason);
}

fn usage_line(u: &GpuUse) -> String {
    match u {
        GpuUse::Owned(t) => format!("whole GPU, owned by {t}"),
        GpuUse::Shared(ts) => format!("whole GPU, shared by {}", ts.join(", ")),
        GpuUse::Mig(specs) if specs.is_empty() => {
            "MIG on, no instances (mig = []): no team gets this GPU".into()
        }
        GpuUse::Mig(specs) => {
            let parts: Vec<String> = specs
                .iter()
                .map(|s| {
                    let mut x = format!("{}x{} → {}", s.count, s.profile, s.owner);
                    if !s.compute.is_empty() {
                        let _ = write!(x, " (split {})", s.compute.join("+"));
                    }
                    x
                })
                .collect();
            format!("MIG {}", parts.join(", "))
        }
    }
}

/// The human-readable plan: per GPU what the policy wants and the MIG steps, per team what it
/// gets and its steps, then host-wide steps and what is blocked.
pub fn render(obs: &Observed, d: &Desired, pl: &Plan) -> String {
    let mut out = String::new();
    let gpus = match &obs.nvml_unavailable {
        Some(_) => "GPUs unknown (NVML not available)".to_string(),
        None => format!("{} GPUs", obs.gpus.len()),
    };
    let _ = writeln!(
        out,
        "Host: {gpus}, {} RAM, {} CPUs",
        human_bytes(obs.host.memory_bytes),
        obs.host.cpus
    );
    let converged = if pl.is_converged() {
        " (converged)"
    } else {
        ""
    };
    let (actions, blocked) = (pl.actions.len(), pl.blocked.len());
    let _ = writeln!(out, "Plan: {actions} actions, {blocked} blocked{converged}");
    if pl.replan_after_mig {
        let _ = writeln!(
            out,
            "Note: MIG changes run first; device, slice and MPS steps are then planned again from \
             the new state (<new MIG …> values are filled in then)."
        );
    }
    let mut shown = vec![false; pl.actions.len()];

    let _ = writeln!(out, "\nGPUs");
    for g in &obs.gpus {
        let sim = desired::model_of(g).map(|m| m.sim_name()).unwrap_or("?");
        let _ = writeln!(out, "  gpu {} · {} ({sim}) · {}", g.index, g.name, g.uuid);
        let Some(gd) = d.gpus.iter().find(|x| x.index == g.index) else {
            let _ = writeln!(out, "    not named by the policy: left alone");
            continue;
        };
        let _ = writeln!(out, "    wants: {}", usage_line(&gd.usage));
        for l in &gd.mig.layout {
            let state = if l.existing.is_some() { "kept" } else { "new" };
            let cis: Vec<String> = l.cis.iter().map(|c| c.profile.clone()).collect();
            let _ = writeln!(
                out,
                "    gi@{}+{} {} → {} [{state}] CIs: {}",
                l.placement.start,
                l.placement.size,
                l.profile,
                l.owner.as_deref().unwrap_or("(no owner)"),
                cis.join(", ")
            );
        }
        for (i, a) in pl.actions.iter().enumerate() {
            if a.kind.gpu_index() == Some(g.index) {
                action_line(&mut out, a);
                shown[i] = true;
            }
        }
    }

    let _ = writeln!(out, "\nTeams");
    for t in d.teams.values() {
        let _ = writeln!(out, "  {} → gpu-{}.slice", t.name, t.name);
        let mut gets: Vec<String> = t
            .whole_gpus
            .iter()
            .map(|i| format!("gpu {i} (whole)"))
            .collect();
        gets.extend(t.mig_devices.iter().map(|m| {
            format!(
                "gpu {} {} gi@{}+{} ci {}",
                m.gpu_index, m.gi_profile, m.gi_placement.start, m.gi_placement.size, m.ci_profile
            )
        }));
        if gets.is_empty() {
            gets.push("no GPUs".into());
        }
        let _ = writeln!(out, "    gets: {}", gets.join("; "));
        let s = &t.slice;
        let _ = writeln!(out, "    {}", s.show());
        if !s.device_allow.is_empty() {
            let devs: Vec<&str> = s.device_allow.iter().map(String::as_str).collect();
            let _ = writeln!(out, "    devices: {}", devs.join(" "));
        }
        for line in t.env.lines().filter(|l| !l.starts_with('#')) {
            let _ = writeln!(out, "    env: {line}");
        }
        for (inst, spec) in &t.mps {
            let _ = writeln!(out, "    mps: {inst} on {}", spec.devices.join(","));
        }
        for (i, a) in pl.actions.iter().enumerate() {
            let team = a.kind.team().map(str::to_string).or_else(|| match &a.kind {
                plan::ActionKind::StopMps { instance } => {
                    obs.mps.get(instance).map(|m| m.team.clone())
                }
                _ => None,
            });
            if !shown[i] && team.as_deref() == Some(&*t.name) {
                action_line(&mut out, a);
                shown[i] = true;
            }
        }
    }
    if shown.iter().any(|s| !s) {
        let _ = writeln!(out, "\nHost-wide and removed teams");
        for (i, a) in pl.actions.iter().enumerate() {
            if !shown[i] {
                action_line(&mut out, a);
            }
        }
    }
    if !pl.blocked.is_empty() {
        let _ = writeln!(out, "\nBlocked");
        for b in &pl.blocked {
            let _ = writeln!(out, "  {}", blocked_line(b));
        }
    }
    out
}

#[cfg(test)]
mod idle_tests {
    use super::render_idle;

    #[test]
    fn the_idle_section_says_what_is_pending_or_why_it_is_not_known() {
        assert_eq!(
            render_idle(&Ok(vec![
                "stop a.scope (research, user ann, device 0) in 20s".into()
            ])),
            "idle actions pending (1):\n  stop a.scope (research, user ann, device 0) in 20s\n"
        );
        assert_eq!(render_idle(&Ok(vec![])), "idle actions: none pending\n");
        assert_eq!(
            render_idle(&Err("gpuctld is not running".into())),
            "idle actions: not known (gpuctld is not running)\n"
        );
    }
}
