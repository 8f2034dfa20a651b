//! `gpuctl doctor`: is this host ready for gpuctl, and does the driver answer like the
//! reference data (and so like the fake NVML every test runs against)?
//!
//! Read-only by construction: it reads files under the root ([`host`]) and queries NVML
//! ([`driver`]); it never changes MIG mode, never resets a GPU, never creates or destroys an
//! instance. The driver's profile tables are compared with `data/gpu-profiles.json`
//! ([`compare`]), and what the driver reported can be written in the fake's state format
//! ([`record`]) so a real host can be replayed in tests.
//!
//! Each check is one line with a status (OK, WARN, FAIL); any FAIL makes the exit status 1.

pub mod compare;
pub mod driver;
pub mod host;
pub mod record;

use crate::paths::Root;
use crate::profiles::Catalog;
use compare::{Difference, Weight, REFERENCE};
use driver::{DriverRead, GpuRead};
use serde::Serialize;
use std::path::PathBuf;

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Fine.
    Ok,
    /// Works, with a caveat the summary names.
    Warn,
    /// gpuctl cannot work as configured.
    Fail,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        })
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable identifier (`cgroup`, `gpu0.gi-profiles`, `gpu0.gi-profile.19.placements`).
    pub id: String,
    /// OK, WARN or FAIL.
    pub status: Status,
    /// One sentence: what was found.
    pub summary: String,
}

/// Everything doctor found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Checks in the order run.
    pub checks: Vec<Check>,
    /// What the driver reported (`None` when NVML could not be opened).
    #[serde(skip)]
    pub driver: Option<DriverRead>,
}

impl Report {
    /// Whether any check failed.
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.status == Status::Fail)
    }

    /// Count of checks with `status`.
    pub fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }

    /// The text form: one line per check, then a tally.
    pub fn render(&self) -> String {
        let mut s: String = self
            .checks
            .iter()
            .map(|c| format!("{:<4} {}: {}\n", c.status.to_string(), c.id, c.summary))
            .collect();
        s.push_str(&format!(
            "{} OK, {} WARN, {} FAIL\n",
            self.count(Status::Ok),
            self.count(Status::Warn),
            self.count(Status::Fail)
        ));
        s
    }

    /// The `--json` document: `{"checks": [{"id", "status", "summary"}], "ok", "warn", "fail"}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "checks": self.checks,
            "ok": self.count(Status::Ok),
            "warn": self.count(Status::Warn),
            "fail": self.count(Status::Fail),
        })
    }
}

/// Where doctor looks.
#[derive(Debug, Clone)]
pub struct Options {
    /// The directory standing for `/`.
    pub root: Root,
    /// NVML library to load (`None`: the loader's default `libnvidia-ml.so.1`).
    pub nvml_library: Option<PathBuf>,
    /// `nvidia-cuda-mps-control`.
    pub mps_control: PathBuf,
}

fn push(out: &mut Vec<Check>, id: impl Into<String>, status: Status, summary: impl Into<String>) {
    out.push(host::check(id, status, summary));
}

/// Run every check.
pub fn run(opts: &Options) -> Report {
    let mut out = Vec::new();
    let backend = crate::nvml::NvmlBackend::open(
        opts.nvml_library.clone(),
        // Never used: doctor resets nothing.
        crate::nvml::ResetCommand::Exec(vec![]),
    );
    let driver = match &backend {
        Ok(b) => {
            let d = driver::read(b.nvml());
            let v = &d.versions;
            let or_unknown = |s: &Option<String>| s.clone().unwrap_or_else(|| "unknown".into());
            let cuda = v
                .cuda
                .map(|c| format!("{}.{}", c / 1000, (c % 1000) / 10))
                .unwrap_or_else(|| "unknown".into());
            let (status, summary) = match &d.error {
                Some(e) => (Status::Fail, format!("loaded, but {e}")),
                None => (
                    Status::Ok,
                    format!(
                        "driver {}, NVML {}, CUDA {cuda}, {} GPU(s)",
                        or_unknown(&v.driver),
                        or_unknown(&v.nvml),
                        d.gpus.len()
                    ),
                ),
            };
            push(&mut out, "nvml", status, summary);
            Some(d)
        }
        Err(e) => {
            push(
                &mut out,
                "nvml",
                Status::Fail,
                format!("{e}; GPU checks skipped"),
            );
            None
        }
    };
    let root = &opts.root;
    out.push(host::kernel_module(
        root,
        driver.as_ref().and_then(|d| d.versions.driver.as_deref()),
    ));
    let (c, cgroup2) = host::cgroup(root);
    out.push(c);
    let (c, sd) = host::systemd(root);
    out.push(c);
    out.push(host::device_control(root, cgroup2, sd));
    let gpus: &[GpuRead] = driver.as_ref().map_or(&[], |d| &d.gpus);
    let mig_on = gpus
        .iter()
        .any(|g| g.mig.as_ref().is_some_and(|m| m.current));
    let majors = host::majors(root, mig_on, &mut out);
    let minors: Vec<u32> = gpus.iter().filter_map(|g| g.minor).collect();
    host::nodes(root, majors, &minors, &mut out);
    let live: Vec<String> = gpus
        .iter()
        .filter_map(|g| Some((g.minor?, g.mig.as_ref()?)))
        .flat_map(|(minor, m)| {
            m.instances.iter().flat_map(move |gi| {
                std::iter::once(format!("gpu{minor}/gi{}/access", gi.id)).chain(
                    gi.compute
                        .iter()
                        .map(move |ci| format!("gpu{minor}/gi{}/ci{}/access", gi.id, ci.id)),
                )
            })
        })
        .collect();
    host::caps(root, majors, mig_on, &live, &mut out);
    out.push(host::mps(root, &opts.mps_control));
    out.push(host::proc_hidepid(root));
    for g in gpus {
        gpu_checks(g, &mut out);
    }
    if !gpus.is_empty() {
        health_checks(root, opts.nvml_library.clone(), gpus, &mut out);
    }
    Report {
        checks: out,
        driver,
    }
}

/// `gpuN.health`: the counters that show a dying GPU, read now, and whether gpuctld holds it
/// (or a MIG device of it) out of service (its registry, docs/health.md).
fn health_checks(root: &Root, lib: Option<PathBuf>, gpus: &[GpuRead], out: &mut Vec<Check>) {
    let registry: crate::health::Registry = std::fs::read(root.join(crate::paths::HEALTH_REGISTRY))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let observed = match crate::nvml::health::HealthWatch::open(lib) {
        Ok(w) => w.counters(),
        Err(e) => {
            push(
                out,
                "health",
                Status::Warn,
                format!("cannot read the health counters: {e}"),
            );
            return;
        }
    };
    for g in gpus {
        let obs = observed.iter().find(|o| match o {
            crate::health::Observation::Counters { gpu, .. }
            | crate::health::Observation::Lost { gpu } => *gpu == g.uuid,
            _ => false,
        });
        let mut out_lines: Vec<String> = registry
            .devices
            .iter()
            .filter(|(uuid, _)| {
                **uuid == g.uuid
                    || g.mig
                        .iter()
                        .flat_map(|m| &m.instances)
                        .flat_map(|gi| &gi.compute)
                        .any(|ci| ci.uuid == **uuid)
            })
            .filter_map(|(uuid, d)| match &d.service {
                crate::health::Service::Out {
                    reason, since, by, ..
                } => Some(format!(
                    "{uuid} out of service since {} (by {by}): {reason}",
                    crate::placement::utc(*since)
                )),
                crate::health::Service::InService => None,
            })
            .collect();
        let (status, mut summary) = health_summary(obs);
        let status = if out_lines.is_empty() {
            status
        } else {
            status.max(Status::Warn)
        };
        out_lines.insert(0, std::mem::take(&mut summary));
        push(
            out,
            format!("gpu{}.health", g.index),
            status,
            out_lines.join("; "),
        );
    }
}

/// One GPU's counters in a sentence: FAIL for a lost GPU or failed row remapping (the board
/// needs service), WARN for what a reset clears or an uncorrectable ECC count; a counter the
/// model does not report is "not available", never a made-up zero.
fn health_summary(obs: Option<&crate::health::Observation>) -> (Status, String) {
    use crate::health::Observation;
    let c = match obs {
        Some(Observation::Counters { counters, .. }) => counters,
        Some(Observation::Lost { .. }) => {
            return (Status::Fail, "the GPU is lost (NVML: GPU is lost)".into());
        }
        _ => return (Status::Warn, "no health counters read".into()),
    };
    let na = "not available";
    let yes_no = |v: Option<bool>| v.map_or(na, |b| if b { "yes" } else { "no" });
    let ecc = c.ecc_uncorrected.map_or(na.to_string(), |n| n.to_string());
    let status = if c.remap_failed == Some(true) {
        Status::Fail
    } else if c.remap_pending == Some(true)
        || c.retired_pages_pending == Some(true)
        || c.ecc_uncorrected.is_some_and(|n| n > 0)
    {
        Status::Warn
    } else {
        Status::Ok
    };
    (
        status,
        format!(
            "row remap pending {}, failed {}; retired pages pending {}; uncorrectable ECC {ecc}",
            yes_no(c.remap_pending),
            yes_no(c.remap_failed),
            yes_no(c.retired_pages_pending)
        ),
    )
}

fn diff_checks(prefix: &str, diffs: Vec<Difference>, out: &mut Vec<Check>) {
    for d in diffs {
        push(
            out,
            format!("{prefix}.{}", d.id),
            match d.weight {
                Weight::Fail => Status::Fail,
                Weight::Warn => Status::Warn,
            },
            d.text,
        );
    }
}

fn gpu_checks(g: &GpuRead, out: &mut Vec<Check>) {
    let p = format!("gpu{}", g.index);
    let model = Catalog::get().by_nvml_name(&g.name);
    let ident = format!(
        "{} {}, minor {}, {} MiB",
        g.name,
        g.uuid,
        g.minor.map_or("?".into(), |m| m.to_string()),
        g.memory_mib.map_or("?".into(), |m| m.to_string())
    );
    match model {
        _ if !g.errors.is_empty() => push(
            out,
            &p,
            Status::Fail,
            format!("{ident}: {}", g.errors.join("; ")),
        ),
        Some(m) => {
            push(
                out,
                &p,
                Status::Ok,
                format!("{ident} ({} in {REFERENCE})", m.key),
            );
            let facts = compare::GpuFacts {
                memory_mib: g.memory_mib,
                pci_device_id: g.pci_device_id,
                mig_capable: g.mig.is_some(),
                max_mig_device_count: g.mig.as_ref().and_then(|m| m.max_mig_device_count),
            };
            let d = compare::gpu_differences(&facts, m);
            if !d.is_empty() && !m.unverified.is_empty() {
                // Expected where the reference guessed: say which values are guesses.
                push(
                    out,
                    format!("{p}.reference"),
                    Status::Warn,
                    format!(
                        "{} values unverified in {REFERENCE}: {}",
                        m.key,
                        m.unverified.join("; ")
                    ),
                );
            }
            diff_checks(&p, d, out);
        }
        None if g.mig.is_some() => {
            // Known by its PCI id under another name: the reference entry needs this name.
            let by_id = g
                .pci_device_id
                .and_then(|id| Catalog::get().by_pci_device_id(&format!("0x{id:08X}")));
            let hint = by_id.map_or(String::new(), |m| {
                format!(
                    " (its PCI id is {}'s, named '{}' there: add this NVML name to the reference)",
                    m.key, m.nvml_name
                )
            });
            push(
                out,
                &p,
                Status::Warn,
                format!("{ident}: MIG-capable but not in {REFERENCE}{hint}: MIG layouts cannot be validated or planned"),
            )
        }
        None => push(
            out,
            &p,
            Status::Ok,
            format!("{ident} (not in {REFERENCE}; whole-GPU use only)"),
        ),
    }
    let Some(mig) = &g.mig else {
        push(out, format!("{p}.mig"), Status::Ok, "not MIG-capable");
        procs(g, &p, out);
        return;
    };
    let on = |b: bool| if b { "on" } else { "off" };
    let (status, tail) = if mig.current != mig.pending {
        (Status::Warn, ": the change waits for a GPU reset or reboot")
    } else {
        (Status::Ok, "")
    };
    push(
        out,
        format!("{p}.mig"),
        status,
        format!(
            "MIG capable, current {}, pending {}{tail}",
            on(mig.current),
            on(mig.pending)
        ),
    );
    let gi_check = format!("{p}.gi-profiles");
    match (&mig.gi_profiles, model) {
        (Err(e), _) if !mig.current => push(
            out,
            gi_check,
            Status::Ok,
            format!("not readable while MIG is off ({e}); run doctor again with MIG on to compare"),
        ),
        (Err(e), _) => push(out, gi_check, Status::Fail, e.clone()),
        (Ok(t), None) => {
            let n = t.len();
            let why = format!("{n} GI profiles read; no {REFERENCE} entry to compare with");
            push(out, gi_check, Status::Warn, why)
        }
        (Ok(t), Some(m)) => {
            let d = compare::gi_differences(t, m);
            if d.is_empty() {
                let ids: Vec<String> = t.iter().map(|p| format!("{} {}", p.id, p.name)).collect();
                push(
                    out,
                    gi_check,
                    Status::Ok,
                    format!(
                        "{} GI profiles [{}] with placements match {REFERENCE} {}",
                        t.len(),
                        ids.join(", "),
                        m.key
                    ),
                );
            } else {
                diff_checks(&p, d, out);
            }
        }
    }
    if let (Ok(t), Some(m), true) = (&mig.gi_profiles, model, mig.current) {
        let mut matched = vec![];
        let mut unread = vec![];
        for gp in t {
            match mig.ci_profiles.get(&gp.id) {
                Some(ct) => {
                    let d = compare::ci_differences(&gp.name, ct, m);
                    if d.is_empty() {
                        matched.push(gp.name.clone());
                    }
                    diff_checks(&p, d, out);
                }
                None => unread.push(gp.name.clone()),
            }
        }
        push(
            out,
            format!("{p}.ci-profiles"),
            Status::Ok,
            format!(
                "match {REFERENCE} in [{}]; not read in [{}] (a CI table is read through a \
                 live GI of that profile, and doctor creates none)",
                matched.join(", "),
                unread.join(", ")
            ),
        );
    }
    if mig.current {
        let names = |pid: u32| {
            model
                .and_then(|m| m.gi_profile_by_id(pid))
                .map_or(format!("profile {pid}"), |x| x.name.clone())
        };
        let list: Vec<String> = mig
            .instances
            .iter()
            .map(|gi| {
                let cis: Vec<String> = gi
                    .compute
                    .iter()
                    .map(|c| format!("ci{}@{}+{}", c.id, c.placement.start, c.placement.size))
                    .collect();
                format!(
                    "gi{} {}@{}+{} [{}]",
                    gi.id,
                    names(gi.profile_id),
                    gi.placement.start,
                    gi.placement.size,
                    cis.join(" ")
                )
            })
            .collect();
        push(
            out,
            format!("{p}.instances"),
            Status::Ok,
            match list.len() {
                0 => "no GPU instances".to_string(),
                n => format!("{n}: {}", list.join(", ")),
            },
        );
    }
    procs(g, &p, out);
}

fn procs(g: &GpuRead, p: &str, out: &mut Vec<Check>) {
    match &g.processes {
        Err(e) => push(out, format!("{p}.processes"), Status::Warn, e.clone()),
        Ok(ps) if ps.is_empty() => push(out, format!("{p}.processes"), Status::Ok, "none"),
        Ok(ps) => {
            let list: Vec<String> = ps
                .iter()
                .map(|x| {
                    let place = match (x.gi, x.ci) {
                        (Some(gi), Some(ci)) => format!("gi{gi}/ci{ci}"),
                        _ => "whole GPU".into(),
                    };
                    let mem = x.used_memory.map_or("memory not available".into(), |b| {
                        format!("{} MiB", b >> 20)
                    });
                    format!("pid {} ({place}, {mem})", x.pid)
                })
                .collect();
            push(
                out,
                format!("{p}.processes"),
                Status::Ok,
                format!("{}: {}", ps.len(), list.join(", ")),
            );
        }
    }
}
