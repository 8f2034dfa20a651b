//! Prometheus metrics: gpuctld encodes them (with the `prometheus-client` crate) for its
//! `Metrics` bus call; the unprivileged `gpuctl-exporter` serves them over HTTP and
//! `gpuctl metrics --textfile` writes them for node_exporter. Every name and label is listed in
//! `docs/monitoring.md`, and [`METRIC_NAMES`] is the list the dashboard test checks against.
//!
//! A value that is not available (utilisation of a MIG device, GPM before Hopper, a cgroup
//! file that does not exist) has no series; it is never exported as 0.
//!
//! - [`counters`]: what only gpuctld sees happen (reconcile durations and errors, Join
//!   outcomes), kept for the life of the process;
//! - [`cgroup`]: per-team cgroup statistics (cgroups-rs);
//! - [`hpc`]: dcgm-exporter's HPC job-mapping directory, kept current with the teams.

use crate::usage::{GpuUsage, MigUsage, Usage};
use prometheus_client::encoding::{prometheus_text, text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

pub mod cgroup;
pub mod hpc;
pub mod ledger;

/// Every metric family gpuctl exports, as Prometheus names its series' stem (`_total`,
/// `_bucket`, `_sum`, `_count` are added to some by the encoder).
pub const METRIC_NAMES: &[&str] = &[
    "gpuctl_up",
    "gpuctl_nvml_up",
    "gpuctl_device_team_info",
    "gpuctl_device_memory_used_bytes",
    "gpuctl_device_memory_total_bytes",
    "gpuctl_device_utilization_ratio",
    "gpuctl_device_memory_utilization_ratio",
    "gpuctl_device_sm_activity_ratio",
    "gpuctl_gpu_power_watts",
    "gpuctl_gpu_temperature_celsius",
    "gpuctl_team_gpu_memory_used_bytes",
    "gpuctl_team_gpu_processes",
    "gpuctl_device_stray_processes",
    "gpuctl_team_memory_current_bytes",
    "gpuctl_team_memory_max_bytes",
    "gpuctl_team_oom_kills_total",
    "gpuctl_team_cpu_usage_seconds_total",
    "gpuctl_team_pids",
    "gpuctl_mps_daemon_up",
    "gpuctl_policy_valid",
    "gpuctl_policy_last_good_in_force",
    "gpuctl_reconcile_duration_seconds",
    "gpuctl_reconcile_errors_total",
    "gpuctl_reconcile_last_converged",
    "gpuctl_join_total",
    "gpuctl_loans_total",
    "gpuctl_loan_reclaims_total",
    "gpuctl_loan_reclaim_overruns_total",
    "gpuctl_gpu_reslices_total",
    "gpuctl_gpu_layout_info",
    "gpuctl_gpu_layout_since_seconds",
    "gpuctl_idle_holder",
    "gpuctl_idle_seconds",
    "gpuctl_idle_activity_unknown",
    "gpuctl_ledger_held_seconds_total",
    "gpuctl_ledger_active_seconds_total",
    "gpuctl_ledger_unknown_seconds_total",
    "gpuctl_device_leases",
    "gpuctl_device_in_service",
    "gpuctl_device_xid_total",
    "gpuctl_device_quarantines_total",
    "gpuctl_device_resets_total",
    "gpuctl_device_health_condition",
];

type Labels = Vec<(String, String)>;
type FGauge = Gauge<f64, AtomicU64>;

/// Process-lifetime counters of gpuctld.
#[derive(Debug)]
pub struct Counters {
    /// Seconds per reconcile.
    pub reconcile_duration: Histogram,
    /// Reconciles that ended with errors.
    pub reconcile_errors: Counter,
    /// Join outcomes by team and outcome.
    pub joins: Family<Labels, Counter>,
    /// Borrowed placements by borrowing team and lender.
    pub loans: Family<Labels, Counter>,
    /// Loans taken back by borrowing team, lender and why.
    pub reclaims: Family<Labels, Counter>,
    /// Borrowed jobs still running when their grace ran out (stopped by gpuctld).
    pub reclaim_overruns: Family<Labels, Counter>,
    /// GPUs switched to another allowed layout, by GPU, layout and cause.
    pub reslices: Family<Labels, Counter>,
}

/// gpuctld's counters (one set per process).
pub fn counters() -> &'static Counters {
    static C: OnceLock<Counters> = OnceLock::new();
    C.get_or_init(|| Counters {
        reconcile_duration: Histogram::new([
            0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ]),
        reconcile_errors: Counter::default(),
        joins: Family::default(),
        loans: Family::default(),
        reclaims: Family::default(),
        reclaim_overruns: Family::default(),
        reslices: Family::default(),
    })
}

impl Counters {
    /// Record one reconcile.
    pub fn reconciled(&self, seconds: f64, ok: bool) {
        self.reconcile_duration.observe(seconds);
        if !ok {
            self.reconcile_errors.inc();
        }
    }

    /// Record one `Join` call's outcome (`ok`, or the refusal's name).
    pub fn joined(&self, team: &str, outcome: &str) {
        self.joins
            .get_or_create(&l(&[("team", team), ("outcome", outcome)]))
            .inc();
    }

    /// A job of `team` placed on devices lent by `from`.
    pub fn lent(&self, team: &str, from: &str) {
        self.loans
            .get_or_create(&l(&[("team", team), ("from", from)]))
            .inc();
    }

    /// A loan of `from` to `team` taken back (`why`: `owner`, `window`, `not-lent`).
    pub fn reclaim(&self, team: &str, from: &str, why: &str) {
        self.reclaims
            .get_or_create(&l(&[("team", team), ("from", from), ("why", why)]))
            .inc();
    }

    /// A borrowed job of `team` outlived its grace and was stopped.
    pub fn overran(&self, team: &str, from: &str) {
        self.reclaim_overruns
            .get_or_create(&l(&[("team", team), ("from", from)]))
            .inc();
    }

    /// GPU `gpu` switched to `layout` (`cause`: `waiting`, `calendar`, `rollback`).
    pub fn resliced(&self, gpu: u32, layout: &str, cause: &str) {
        self.reslices
            .get_or_create(&l(&[
                ("gpu", &gpu.to_string()),
                ("layout", layout),
                ("cause", cause),
            ]))
            .inc();
    }
}

/// Everything one scrape shows besides the counters.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// GPU usage with owners and strays.
    pub usage: Usage,
    /// Team slices' cgroup statistics by team.
    pub teams: BTreeMap<String, cgroup::TeamCgroup>,
    /// MPS daemons: (instance, team, running).
    pub mps: Vec<(String, String, bool)>,
    /// A policy loaded without errors (the last load).
    pub policy_valid: bool,
    /// The last good policy is in force because the current one is broken.
    pub last_good_in_force: bool,
    /// Whether the last reconcile converged; `None` before the first.
    pub last_converged: Option<bool>,
    /// The holders gpuctld's idle rules track (empty without rules).
    pub idle: Vec<crate::idle::IdleHolder>,
    /// Live placement leases (`None`: systemd could not list them, so no series rather than
    /// a made-up zero).
    pub leases: Option<Vec<crate::placement::Lease>>,
    /// The teams whose user names the ledger counters may carry (`None`: every team's); the
    /// others' users are summed into `user=""`, like the other per-process labels.
    pub ledger_users: Option<std::collections::BTreeSet<String>>,
    /// Device health from gpuctld's watcher (docs/health.md).
    pub health: Vec<DeviceHealth>,
    /// The layout of each GPU whose entry allows several: (GPU, layout, seconds since gpuctld
    /// switched it there; `None`: not switched since boot).
    pub layouts: Vec<(u32, String, Option<u64>)>,
}

/// One device's health for the metrics.
#[derive(Debug, Clone, Default)]
pub struct DeviceHealth {
    /// `GPU-…` or `MIG-…` UUID.
    pub device: String,
    /// NVML index of the GPU (the parent's for a MIG device).
    pub gpu: u32,
    /// Takes new work.
    pub in_service: bool,
    /// XIDs seen, by code.
    pub xids: BTreeMap<u32, u64>,
    /// Times a fault took it out of service.
    pub quarantines: u64,
    /// Times gpuctld reset it while idle.
    pub resets: u64,
    /// Standing conditions (`remap-pending`, `lost`, …) and `slowdown`.
    pub conditions: Vec<String>,
}

fn l(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// dcgm-exporter's identifying labels for a device: `gpu` (index), `UUID` (the parent GPU's),
/// `GPU_I_ID` and `GPU_I_PROFILE` (empty for a whole GPU), plus our `device` (its own UUID).
fn device_labels(g: &GpuUsage, m: Option<&MigUsage>) -> Labels {
    let gi = m.map(|m| m.gi_id.to_string()).unwrap_or_default();
    l(&[
        ("gpu", &g.index.to_string()),
        ("UUID", &g.uuid),
        ("GPU_I_ID", &gi),
        ("GPU_I_PROFILE", m.map_or("", |m| m.profile.as_str())),
        ("device", m.map_or(g.uuid.as_str(), |m| m.uuid.as_str())),
    ])
}

/// A gauge already set to `v`.
fn gauge(v: i64) -> Gauge {
    let g = Gauge::default();
    g.set(v);
    g
}

/// Set the series `l` of `f` when the value is known (no series otherwise, never 0).
fn set_known(f: &Family<Labels, Gauge>, l: &Labels, v: Option<u64>) {
    if let Some(v) = v {
        f.get_or_create(l).set(v as i64);
    }
}

fn with(mut base: Labels, k: &str, v: &str) -> Labels {
    base.push((k.into(), v.into()));
    base
}

#[derive(Default)]
struct Families {
    info: Family<Labels, Gauge>,
    mem_used: Family<Labels, Gauge>,
    mem_total: Family<Labels, Gauge>,
    util: Family<Labels, FGauge>,
    mem_util: Family<Labels, FGauge>,
    activity: Family<Labels, FGauge>,
    team_mem: Family<Labels, Gauge>,
    team_procs: Family<Labels, Gauge>,
    strays: Family<Labels, Gauge>,
    power: Family<Labels, FGauge>,
    temp: Family<Labels, FGauge>,
}

/// The registry for one scrape.
pub fn registry(s: &Snapshot, c: &Counters) -> Registry {
    let mut r = Registry::with_prefix("gpuctl");
    r.register("up", "gpuctld answered this scrape", gauge(1));
    let nvml_up = i64::from(s.usage.nvml_unavailable.is_none());
    r.register("nvml_up", "NVML could be read", gauge(nvml_up));

    let f = Families::default();
    let pct = |v: u32| f64::from(v) / 100.0;
    for g in &s.usage.gpus {
        let gl = l(&[("gpu", &g.index.to_string()), ("UUID", &g.uuid)]);
        if let Some(p) = g.power_mw {
            f.power.get_or_create(&gl).set(f64::from(p) / 1000.0);
        }
        if let Some(t) = g.temperature_c {
            f.temp.get_or_create(&gl).set(f64::from(t));
        }
        let devices: Vec<Option<&MigUsage>> = if g.mig {
            g.mig_devices.iter().map(Some).collect()
        } else {
            vec![None]
        };
        for m in devices {
            let labels = &device_labels(g, m);
            let (teams, used, total, activity) = match m {
                Some(m) => (&m.teams, m.memory_used, m.memory_total, m.activity),
                None => (&g.teams, g.memory_used, g.memory_total, g.activity),
            };
            let procs = m.map_or(&g.processes, |m| &m.processes);
            let owners: Vec<&str> = if teams.is_empty() {
                vec![""]
            } else {
                teams.iter().map(String::as_str).collect()
            };
            // Which teams own the device is the info metric's, one series per owner; the
            // device's own figures are one series per device, so that a plain sum() over a
            // GPU several teams share counts it once.
            for t in &owners {
                f.info
                    .get_or_create(&with(labels.clone(), "team", t))
                    .set(1);
            }
            set_known(&f.mem_used, labels, used);
            set_known(&f.mem_total, labels, total);
            if m.is_none() {
                if let Some(v) = g.utilization_gpu {
                    f.util.get_or_create(labels).set(pct(v));
                }
                if let Some(v) = g.utilization_memory {
                    f.mem_util.get_or_create(labels).set(pct(v));
                }
            }
            if let Some(a) = activity {
                f.activity.get_or_create(labels).set(a / 100.0);
            }
            if !teams.is_empty() {
                let n = procs.iter().filter(|p| p.stray).count();
                f.strays
                    .get_or_create(&with(labels.clone(), "device_team", &teams.join(",")))
                    .set(n as i64);
            }
            let mut by_team: BTreeMap<&str, (u64, i64)> = BTreeMap::new();
            for p in procs {
                let e = by_team.entry(p.team.as_deref().unwrap_or("")).or_default();
                e.0 += p.used_memory.unwrap_or(0);
                e.1 += 1;
            }
            for (t, (mem, n)) in by_team {
                let tl = with(labels.clone(), "team", t);
                f.team_mem.get_or_create(&tl).set(mem as i64);
                f.team_procs.get_or_create(&tl).set(n);
            }
        }
    }
    r.register(
        "device_team_info",
        "Maps GPUs and MIG devices (dcgm-exporter's gpu, UUID, GPU_I_ID, GPU_I_PROFILE) to the teams that own them; team=\"\" when none",
        f.info,
    );
    r.register_with_unit(
        "device_memory_used",
        "Framebuffer memory in use on the device",
        Unit::Bytes,
        f.mem_used,
    );
    r.register_with_unit(
        "device_memory_total",
        "Framebuffer memory of the device",
        Unit::Bytes,
        f.mem_total,
    );
    r.register(
        "device_utilization_ratio",
        "NVML GPU utilisation (0-1) of a whole GPU; no series where the driver offers none (MIG)",
        f.util,
    );
    r.register(
        "device_memory_utilization_ratio",
        "NVML memory utilisation (0-1) of a whole GPU",
        f.mem_util,
    );
    r.register(
        "device_sm_activity_ratio",
        "GPM SM activity (0-1) of a GPU or its GPU instance between two collections (Hopper+)",
        f.activity,
    );
    r.register_with_unit(
        "team_gpu_memory_used",
        "GPU memory used by a team's processes on a device (team of the process's slice; \"\" outside any)",
        Unit::Bytes,
        f.team_mem,
    );
    r.register(
        "team_gpu_processes",
        "GPU processes of a team on a device",
        f.team_procs,
    );
    r.register(
        "device_stray_processes",
        "Processes on a team's device outside every owning team's slice",
        f.strays,
    );

    r.register_with_unit(
        "gpu_power",
        "Board power draw",
        Unit::Other("watts".into()),
        f.power,
    );
    r.register_with_unit("gpu_temperature", "GPU temperature", Unit::Celsius, f.temp);

    let mem_cur: Family<Labels, Gauge> = Family::default();
    let mem_max: Family<Labels, Gauge> = Family::default();
    let pids: Family<Labels, Gauge> = Family::default();
    let mut oom_values: Vec<(Labels, u64)> = Vec::new();
    let mut cpu_values: Vec<(Labels, f64)> = Vec::new();
    for (team, c) in &s.teams {
        let tl = l(&[("team", team)]);
        set_known(&mem_cur, &tl, c.memory_current);
        set_known(&mem_max, &tl, c.memory_max);
        oom_values.extend(c.oom_kills.map(|v| (tl.clone(), v)));
        cpu_values.extend(c.cpu_seconds.map(|v| (tl.clone(), v)));
        set_known(&pids, &tl, c.pids);
    }
    r.register_with_unit(
        "team_memory_current",
        "memory.current of the team's slice",
        Unit::Bytes,
        mem_cur,
    );
    r.register_with_unit(
        "team_memory_max",
        "memory.max of the team's slice (no series when unlimited)",
        Unit::Bytes,
        mem_max,
    );
    r.register_collector(Box::new(cgroup::CounterCollector {
        oom: oom_values,
        cpu: cpu_values,
    }));
    r.register("team_pids", "pids.current of the team's slice", pids);

    let mps: Family<Labels, Gauge> = Family::default();
    for (inst, team, up) in &s.mps {
        mps.get_or_create(&l(&[("instance_name", inst), ("team", team)]))
            .set(i64::from(*up));
    }
    r.register(
        "mps_daemon_up",
        "1 when the team's MPS control daemon unit is active",
        mps,
    );

    r.register(
        "policy_valid",
        "1 when the policy on disk loaded without errors",
        gauge(i64::from(s.policy_valid)),
    );
    r.register(
        "policy_last_good_in_force",
        "1 when a broken policy left the last good one in force",
        gauge(i64::from(s.last_good_in_force)),
    );
    if let Some(ok) = s.last_converged {
        r.register(
            "reconcile_last_converged",
            "1 when the last reconcile converged",
            gauge(i64::from(ok)),
        );
    }
    r.register_with_unit(
        "reconcile_duration",
        "Time per reconcile",
        Unit::Seconds,
        c.reconcile_duration.clone(),
    );
    r.register(
        "reconcile_errors",
        "Reconciles that ended with errors",
        c.reconcile_errors.clone(),
    );
    r.register("join", "Join calls by team and outcome", c.joins.clone());
    r.register(
        "loans",
        "Jobs placed on another team's lent devices, by borrowing team and lender",
        c.loans.clone(),
    );
    r.register(
        "loan_reclaims",
        "Loans taken back, by borrowing team, lender and why",
        c.reclaims.clone(),
    );
    r.register(
        "loan_reclaim_overruns",
        "Borrowed jobs still running when their grace ran out, stopped by gpuctld",
        c.reclaim_overruns.clone(),
    );
    r.register(
        "gpu_reslices",
        "GPUs switched to another allowed layout, by GPU, layout and cause",
        c.reslices.clone(),
    );
    register_idle(&mut r, &s.idle);
    register_health(&mut r, &s.health);
    register_layouts(&mut r, &s.layouts);
    ledger::register(&mut r, &|team: &str| {
        s.ledger_users.as_ref().is_none_or(|t| t.contains(team))
    });
    if let Some(leases) = &s.leases {
        let per: Family<Labels, Gauge> = Family::default();
        for lease in leases {
            for d in &lease.devices {
                per.get_or_create(&l(&[("team", &lease.team), ("device", d)]))
                    .inc();
            }
        }
        r.register(
            "device_leases",
            "Jobs placed on a device of a team's share now (gpuctl run/shell leases)",
            per,
        );
    }
    r
}

/// The layout of each GPU whose entry allows several, and how long it has had it.
fn register_layouts(r: &mut Registry, layouts: &[(u32, String, Option<u64>)]) {
    if layouts.is_empty() {
        return;
    }
    let info: Family<Labels, Gauge> = Family::default();
    let since: Family<Labels, Gauge> = Family::default();
    for (gpu, name, secs) in layouts {
        let labels = l(&[("gpu", &gpu.to_string()), ("layout", name)]);
        info.get_or_create(&labels).set(1);
        if let Some(t) = secs {
            since.get_or_create(&labels).set(*t as i64);
        }
    }
    r.register(
        "gpu_layout_info",
        "The layout each GPU has among those its [[gpu]] entry allows",
        info,
    );
    r.register(
        "gpu_layout_since_seconds",
        "Seconds since gpuctld switched the GPU to its layout (absent: not since boot)",
        since,
    );
}

/// Device health: in service or not, XIDs by code, quarantines, idle resets, standing
/// conditions.
fn register_health(r: &mut Registry, devices: &[DeviceHealth]) {
    if devices.is_empty() {
        return;
    }
    let up: Family<Labels, Gauge> = Family::default();
    let xids: Family<Labels, Counter> = Family::default();
    let quarantines: Family<Labels, Counter> = Family::default();
    let resets: Family<Labels, Counter> = Family::default();
    let conditions: Family<Labels, Gauge> = Family::default();
    for d in devices {
        let gpu = d.gpu.to_string();
        let base = l(&[("gpu", &gpu), ("device", &d.device)]);
        up.get_or_create(&base).set(i64::from(d.in_service));
        quarantines.get_or_create(&base).inc_by(d.quarantines);
        if !d.device.starts_with("MIG-") {
            resets.get_or_create(&base).inc_by(d.resets);
        }
        for (code, n) in &d.xids {
            let mut k = base.clone();
            k.push(("xid".into(), code.to_string()));
            xids.get_or_create(&k).inc_by(*n);
        }
        for c in &d.conditions {
            let mut k = base.clone();
            k.push(("condition".into(), c.clone()));
            conditions.get_or_create(&k).set(1);
        }
    }
    r.register(
        "device_in_service",
        "1 while the device takes new work; 0 while a fault or an admin keeps it out",
        up,
    );
    r.register("device_xid", "XID errors seen on the device, by code", xids);
    r.register(
        "device_quarantines",
        "Times a fault took the device out of service",
        quarantines,
    );
    r.register(
        "device_resets",
        "Times gpuctld reset the GPU while idle to bring it back (reset-when-idle)",
        resets,
    );
    r.register(
        "device_health_condition",
        "1 while the device shows the condition (lost, remap-failed, remap-pending, \
         retired-pages-pending, slowdown)",
        conditions,
    );
}

/// The idle rules' holders: flagged ones (`gpuctl_idle_holder`), observed idle time of every
/// holder whose activity is known, and those whose device reports no activity.
fn register_idle(r: &mut Registry, holders: &[crate::idle::IdleHolder]) {
    use crate::idle::{Phase, Reason};
    let flagged: Family<Labels, Gauge> = Family::default();
    let seconds: Family<Labels, Gauge> = Family::default();
    let unknown: Family<Labels, Gauge> = Family::default();
    for h in holders {
        let base = l(&[
            ("team", &h.team),
            ("user", h.user.as_deref().unwrap_or("")),
            ("unit", &h.unit),
            ("device", &h.device),
        ]);
        // Holders whose unit and user the caller may not read share one series per team and
        // device (`user=""`, `unit=""`): a count, and the longest idle time among them.
        if h.activity_unknown {
            unknown.get_or_create(&base).inc();
        } else {
            let g = seconds.get_or_create(&base);
            g.set(g.get().max(h.idle_seconds as i64));
        }
        let state = match h.phase {
            Phase::Idle => "idle",
            Phase::Warned => "warned",
            Phase::Stopping => "stopping",
            Phase::Busy | Phase::Idling => continue,
        };
        let reason = match h.reason {
            Some(Reason::MemoryAlarm(_)) => "memory-runaway",
            _ => "idle",
        };
        let fl = with(with(base, "state", state), "reason", reason);
        let fl = with(fl, "excluded", &h.excluded.to_string());
        flagged.get_or_create(&fl).inc();
    }
    r.register(
        "idle_holder",
        "1 per holder an idle rule flagged (idle for its window, or over its memory alarm); state idle, warned or stopping",
        flagged,
    );
    r.register_with_unit(
        "idle",
        "Observed idle time of a holder under an idle rule (gaps in sampling not counted)",
        Unit::Seconds,
        seconds,
    );
    r.register(
        "idle_activity_unknown",
        "1 per holder under an idle rule whose device reports no activity (never acted on)",
        unknown,
    );
}

/// OpenMetrics text (what Prometheus scrapes; ends with `# EOF`).
pub fn encode_openmetrics(s: &Snapshot, c: &Counters) -> String {
    let mut out = String::new();
    let _ = text::encode(&mut out, &registry(s, c));
    out
}

/// Prometheus text format 0.0.4 (what node_exporter's textfile collector reads).
pub fn encode_prometheus_text(s: &Snapshot, c: &Counters) -> String {
    let mut out = String::new();
    let _ = prometheus_text::encode(&mut out, &registry(s, c));
    out
}
