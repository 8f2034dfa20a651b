//! The async systemd client, and [`BlockingSystemd`], its face for the executor (the slice, MPS
//! and unit effectors of [`crate::apply`]) and the observer ([`LiveUnits`]).

use super::proxy::{ManagerProxy, UnitProxy, UnitRow};
use super::{mps, props, LiveUnits, SliceUsage, SystemdError};
use crate::apply::{EffectError, MpsEffector, SliceEffector, UnitEffector};
use crate::files::{remove_if_exists, write_if_changed};
use crate::observe::{MpsSpec, SliceSpec};
use crate::paths::Root;
use crate::policy::TeamName;
use futures_lite::StreamExt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use zbus::proxy::CacheProperties;
use zbus::zvariant::{OwnedObjectPath, Value};
use zbus::Connection;

/// `ActiveState` values counted as running.
const RUNNING: [&str; 3] = ["active", "activating", "reloading"];

/// Load, active and sub state of a unit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UnitState {
    /// `LoadState`.
    pub load: String,
    /// `ActiveState`.
    pub active: String,
    /// `SubState`.
    pub sub: String,
}

impl UnitState {
    /// Active, activating or reloading.
    pub fn is_running(&self) -> bool {
        RUNNING.contains(&self.active.as_str())
    }
}

/// A client of systemd's manager on one bus connection.
///
/// Host files it writes (MPS env files, drop-ins) and cgroupfs reads resolve under `root`, so
/// the same code runs against a temp dir in tests.
#[derive(Debug, Clone)]
pub struct Systemd {
    conn: Connection,
    mgr: ManagerProxy<'static>,
    root: Root,
    job_timeout: Duration,
}

/// The unit of an MPS instance that is `<team>-<n>`: its name becomes file paths under `/run`.
fn checked_mps_unit(instance: &str) -> Result<String, SystemdError> {
    let unit = mps::unit(instance);
    if mps::valid_instance(instance) {
        Ok(unit)
    } else {
        Err(SystemdError::Invalid {
            unit,
            message: "instance must be <team>-<n>".into(),
        })
    }
}

/// The [`SystemdError::Bus`] of `op` on `unit`, for `map_err`.
pub(super) fn bus<'a>(
    unit: &'a str,
    op: &'static str,
) -> impl FnOnce(zbus::Error) -> SystemdError + 'a {
    move |source| SystemdError::Bus {
        unit: unit.to_string(),
        op,
        source: Box::new(source),
    }
}

/// `Ok` for a job that ended `done`; else its result, or (`None`) the wait of `limit` ran out.
pub(super) fn job_result(
    unit: &str,
    op: &'static str,
    result: Option<String>,
    limit: Duration,
) -> Result<(), SystemdError> {
    match result {
        Some(r) if r == "done" => Ok(()),
        Some(result) => Err(SystemdError::Job {
            unit: unit.to_string(),
            op,
            result,
        }),
        None => Err(SystemdError::JobTimeout {
            unit: unit.to_string(),
            op,
            secs: limit.as_secs(),
        }),
    }
}

fn is_no_such_unit(e: &zbus::Error) -> bool {
    matches!(e, zbus::Error::MethodError(name, _, _)
        if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit")
}

impl Systemd {
    /// Connect to the system bus and subscribe to manager signals.
    pub async fn system(root: Root) -> Result<Self, SystemdError> {
        let conn = Connection::system()
            .await
            .map_err(bus("org.freedesktop.systemd1", "connect"))?;
        Self::with_connection(conn, root).await
    }

    /// Use an existing connection (the daemon shares one with its D-Bus API).
    pub async fn with_connection(conn: Connection, root: Root) -> Result<Self, SystemdError> {
        let mgr = ManagerProxy::new(&conn)
            .await
            .map_err(bus("org.freedesktop.systemd1", "proxy"))?;
        // Without Subscribe systemd may not emit JobRemoved/UnitRemoved to us at all.
        mgr.subscribe()
            .await
            .map_err(bus("org.freedesktop.systemd1", "Subscribe"))?;
        Ok(Systemd {
            conn,
            mgr,
            root,
            job_timeout: Duration::from_secs(90),
        })
    }

    /// The bus connection.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The manager proxy, for signal streams (`receive_unit_removed`, …).
    pub fn manager(&self) -> &ManagerProxy<'static> {
        &self.mgr
    }

    /// Object path of a loaded unit; `None` when systemd has no such unit in memory.
    pub async fn unit_path(&self, name: &str) -> Result<Option<OwnedObjectPath>, SystemdError> {
        match self.mgr.get_unit(name).await {
            Ok(p) => Ok(Some(p)),
            Err(e) if is_no_such_unit(&e) => Ok(None),
            Err(e) => Err(bus(name, "GetUnit")(e)),
        }
    }

    /// Object path of a unit, loading it from disk if needed.
    pub async fn load_unit(&self, name: &str) -> Result<OwnedObjectPath, SystemdError> {
        self.mgr
            .load_unit(name)
            .await
            .map_err(bus(name, "LoadUnit"))
    }

    async fn unit_proxy(&self, path: OwnedObjectPath) -> Result<UnitProxy<'static>, zbus::Error> {
        // No property cache: a cached proxy subscribes to PropertiesChanged (AddMatch) and
        // fetches the whole Unit interface (GetAll, ~130 properties) on the first read, then
        // unsubscribes on drop; these proxies live for one or three reads (measured in VM 70:
        // that was most of a drift repair).
        UnitProxy::builder(&self.conn)
            .cache_properties(CacheProperties::No)
            .path(path)?
            .build()
            .await
    }

    /// States of a loaded unit; `None` when it is not in memory.
    pub async fn unit_state(&self, name: &str) -> Result<Option<UnitState>, SystemdError> {
        let Some(path) = self.unit_path(name).await? else {
            return Ok(None);
        };
        let get = async {
            let u = self.unit_proxy(path).await?;
            Ok::<_, zbus::Error>(UnitState {
                load: u.load_state().await?,
                active: u.active_state().await?,
                sub: u.sub_state().await?,
            })
        };
        get.await.map(Some).map_err(bus(name, "Get(ActiveState)"))
    }

    /// Whether a unit is loaded and [`UnitState::is_running`].
    async fn is_running(&self, name: &str) -> Result<bool, SystemdError> {
        Ok(self.unit_state(name).await?.is_some_and(|s| s.is_running()))
    }

    /// The slice a loaded service or scope runs in (its `Slice` property); `None` when the
    /// unit is not in memory or is neither a service nor a scope.
    pub async fn unit_slice(&self, name: &str) -> Result<Option<String>, SystemdError> {
        let Some(path) = self.unit_path(name).await? else {
            return Ok(None);
        };
        let iface = match name.rsplit_once('.') {
            Some((_, "service")) => "org.freedesktop.systemd1.Service",
            Some((_, "scope")) => "org.freedesktop.systemd1.Scope",
            _ => return Ok(None),
        };
        let get = async {
            let iface = zbus::names::InterfaceName::from_static_str(iface)?;
            let slice = self.properties(path).await?.get(iface, "Slice").await?;
            String::try_from(slice).map_err(zbus::Error::from)
        };
        get.await.map(Some).map_err(bus(name, "Get(Slice)"))
    }

    /// The device filter of a loaded slice or scope (a team slice, or a placed job's scope,
    /// whose `DeviceAllow=` is its devices); `None` when the unit is not in memory.
    pub async fn unit_fence(
        &self,
        name: &str,
    ) -> Result<Option<crate::observe::Fence>, SystemdError> {
        let iface = match name.rsplit_once('.') {
            Some((_, "slice")) => "org.freedesktop.systemd1.Slice",
            Some((_, "scope")) => "org.freedesktop.systemd1.Scope",
            _ => return Ok(None),
        };
        let Some(path) = self.unit_path(name).await? else {
            return Ok(None);
        };
        let get = async {
            let iface = zbus::names::InterfaceName::from_static_str(iface)?;
            let all = self.properties(path).await?.get_all(iface).await?;
            Ok::<_, zbus::Error>(props::fence_from_raw(&all.into_iter().collect()))
        };
        get.await
            .map(Some)
            .map_err(bus(name, "GetAll(DeviceAllow)"))
    }

    /// Queue a job with `issue` and wait for its `JobRemoved`; `Ok` only for result `done`.
    ///
    /// The signal stream is opened *before* the job is queued: a short job can finish before
    /// the method reply arrives, and its signal would otherwise be lost.
    async fn run_job<F>(&self, unit: &str, op: &'static str, issue: F) -> Result<(), SystemdError>
    where
        F: Future<Output = zbus::Result<OwnedObjectPath>>,
    {
        self.run_job_within(unit, op, issue, self.job_timeout).await
    }

    /// [`Self::run_job`] with its own time limit (a drain waits as long as the policy says).
    async fn run_job_within<F>(
        &self,
        unit: &str,
        op: &'static str,
        issue: F,
        limit: Duration,
    ) -> Result<(), SystemdError>
    where
        F: Future<Output = zbus::Result<OwnedObjectPath>>,
    {
        let mut removed = self
            .mgr
            .receive_job_removed()
            .await
            .map_err(bus(unit, "AddMatch(JobRemoved)"))?;
        let job = issue.await.map_err(bus(unit, op))?;
        let wait = async {
            while let Some(sig) = removed.next().await {
                let Ok(args) = sig.args() else { continue };
                if *args.job() == job {
                    return args.result().clone();
                }
            }
            "signal stream closed".to_string()
        };
        job_result(
            unit,
            op,
            tokio::time::timeout(limit, wait).await.ok(),
            limit,
        )
    }

    /// Start a unit (mode `replace`) and wait for the job.
    pub async fn start_unit(&self, name: &str) -> Result<(), SystemdError> {
        self.run_job(name, "StartUnit", self.mgr.start_unit(name, "replace"))
            .await
    }

    /// Stop a unit (mode `replace`) and wait for the job.
    pub async fn stop_unit(&self, name: &str) -> Result<(), SystemdError> {
        self.run_job(name, "StopUnit", self.mgr.stop_unit(name, "replace"))
            .await
    }

    /// Send `signal` to every process of a unit (a borrower's notice: SIGTERM now, the stop
    /// after its grace), without stopping it.
    pub async fn kill_unit(&self, name: &str, signal: i32) -> Result<(), SystemdError> {
        self.mgr
            .kill_unit(name, "all", signal)
            .await
            .map_err(bus(name, "KillUnit"))
    }

    /// Stop a unit and wait for the job at most `limit` (a drain: the unit's own stop timeout
    /// may be longer than the manager's default job wait).
    pub async fn stop_unit_within(&self, name: &str, limit: Duration) -> Result<(), SystemdError> {
        self.run_job_within(name, "StopUnit", self.mgr.stop_unit(name, "replace"), limit)
            .await
    }

    /// Restart a unit (mode `replace`) and wait for the job.
    pub async fn restart_unit(&self, name: &str) -> Result<(), SystemdError> {
        self.run_job(name, "RestartUnit", self.mgr.restart_unit(name, "replace"))
            .await
    }

    /// `SetUnitProperties`. `runtime = true` writes drop-ins to `/run/systemd/system.control/`.
    pub async fn set_unit_properties(
        &self,
        name: &str,
        runtime: bool,
        properties: &[(&str, Value<'_>)],
    ) -> Result<(), SystemdError> {
        self.mgr
            .set_unit_properties(name, runtime, properties)
            .await
            .map_err(bus(name, "SetUnitProperties"))
    }

    /// Loaded units matching glob `patterns` whose load/active/sub state is in `states`
    /// (empty: any state).
    pub async fn list_units(
        &self,
        states: &[&str],
        patterns: &[&str],
    ) -> Result<Vec<UnitRow>, SystemdError> {
        self.mgr
            .list_units_by_patterns(states, patterns)
            .await
            .map_err(bus(&patterns.join(" "), "ListUnitsByPatterns"))
    }

    /// `daemon-reload`: re-runs generators and reloads unit files. Blocks until systemd is done.
    pub async fn reload(&self) -> Result<(), SystemdError> {
        self.mgr
            .reload()
            .await
            .map_err(bus("org.freedesktop.systemd1", "Reload"))
    }

    /// Make `gpu-<team>.slice` hold exactly `spec` (limits, `DevicePolicy=closed`, the device
    /// list, which [`props::slice_properties`] resets before setting it) and make sure it is
    /// active, so its cgroup exists.
    pub async fn set_slice(&self, team: &str, spec: &SliceSpec) -> Result<(), SystemdError> {
        self.update_slice(team, spec, None).await
    }

    /// [`Self::set_slice`] for a slice last read as `live`: only what differs is sent
    /// ([`props::slice_property_changes`]).
    pub async fn update_slice(
        &self,
        team: &str,
        spec: &SliceSpec,
        live: Option<&SliceSpec>,
    ) -> Result<(), SystemdError> {
        let unit = props::slice_unit(team);
        let p = props::slice_property_changes(team, spec, live).map_err(|message| {
            SystemdError::Invalid {
                unit: unit.clone(),
                message,
            }
        })?;
        if !p.is_empty() {
            let t = std::time::Instant::now();
            self.set_unit_properties(&unit, true, &p).await?;
            // For the timeline of one change (VM 59): when the new limits went live.
            tracing::debug!(
                gpuctl_action = "reconcile-timing",
                "SetUnitProperties {unit} ({} setting(s)) took {:.1} ms",
                p.len(),
                t.elapsed().as_secs_f64() * 1000.0
            );
        }
        // An implicit or freshly loaded slice is inactive and has no cgroup yet; starting it
        // makes the limits live in cgroupfs now rather than when the first job arrives.
        if !self.is_running(&unit).await? {
            self.start_unit(&unit).await?;
        }
        Ok(())
    }

    /// The raw `Slice` properties of `gpu-<team>.slice`, `None` when it is not loaded.
    pub async fn read_slice_raw(
        &self,
        team: &str,
    ) -> Result<Option<props::RawSlice>, SystemdError> {
        let unit = props::slice_unit(team);
        let Some(path) = self.unit_path(&unit).await? else {
            return Ok(None);
        };
        let read = async {
            let u = self.unit_proxy(path.clone()).await?;
            if u.load_state().await? != "loaded" {
                return Ok(None);
            }
            Ok(Some(self.slice_get_all(path).await?))
        };
        read.await.map_err(bus(&unit, "Get(Slice properties)"))
    }

    /// An uncached `org.freedesktop.DBus.Properties` proxy of systemd's object at `path`.
    async fn properties<P>(&self, path: P) -> zbus::Result<zbus::fdo::PropertiesProxy<'static>>
    where
        P: TryInto<zbus::zvariant::ObjectPath<'static>>,
        P::Error: Into<zbus::Error>,
    {
        zbus::fdo::PropertiesProxy::builder(&self.conn)
            .destination("org.freedesktop.systemd1")?
            .path(path)?
            .cache_properties(CacheProperties::No)
            .build()
            .await
    }

    /// One `GetAll` of the `Slice` interface at `path`: every setting the table in
    /// `crate::settings` knows.
    async fn slice_get_all<P>(&self, path: P) -> zbus::Result<props::RawSlice>
    where
        P: TryInto<zbus::zvariant::ObjectPath<'static>>,
        P::Error: Into<zbus::Error>,
    {
        let iface = zbus::names::InterfaceName::from_static_str("org.freedesktop.systemd1.Slice")?;
        let all = self.properties(path).await?.get_all(iface).await?;
        Ok(all.into_iter().collect())
    }

    /// See [`LiveUnits::read_slice`].
    pub async fn read_slice(&self, team: &str) -> Result<Option<SliceSpec>, SystemdError> {
        Ok(self
            .read_slice_raw(team)
            .await?
            .and_then(|r| props::spec_from_raw(&r)))
    }

    /// Every running team slice that gpuctl controls, with its live settings: one
    /// `ListUnitsByPatterns`, then one `GetAll` per slice, all in flight at once. A listed unit
    /// is loaded, so its object path is computed ([`super::props::unit_object_path`]) rather
    /// than asked for, and its load state is not read again: three calls per team fewer than
    /// [`Self::list_slices`] + [`Self::read_slice`], and on a policy change this read is most
    /// of what gpuctld waits for before it applies (VM 59, issue 14).
    pub async fn read_running_slices(
        &self,
    ) -> Result<std::collections::BTreeMap<TeamName, SliceSpec>, SystemdError> {
        let mut reads = tokio::task::JoinSet::new();
        for team in self.list_slices().await? {
            let sd = self.clone();
            reads.spawn(async move {
                let unit = props::slice_unit(&team);
                let path = super::props::unit_object_path(&unit);
                let raw = sd
                    .slice_get_all(path)
                    .await
                    .map_err(bus(&unit, "GetAll(Slice properties)"));
                (team, raw)
            });
        }
        let mut out = std::collections::BTreeMap::new();
        while let Some(done) = reads.join_next().await {
            // Never cancelled; a panic in a read is re-raised here, as it would be unspawned.
            let (team, raw) = done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
            // Only slices gpuctl controls (DevicePolicy=closed) count as existing.
            if let Some(spec) = props::spec_from_raw(&raw?) {
                out.insert(team, spec);
            }
        }
        Ok(out)
    }

    /// Teams with a running `gpu-<team>.slice`.
    ///
    /// Inactive slices are left out: a slice that was stopped (team removed) but is still in
    /// memory because of its unit file holds nothing and must not be planned away again.
    pub async fn list_slices(&self) -> Result<Vec<TeamName>, SystemdError> {
        let rows = self.list_units(&RUNNING, &["gpu-*.slice"]).await?;
        Ok(rows
            .iter()
            .filter_map(|r| props::team_of_slice(&r.0))
            .collect())
    }

    /// Current usage of a team slice, from the unit and its cgroup (read with cgroups-rs).
    pub async fn slice_usage(&self, team: &str) -> Result<SliceUsage, SystemdError> {
        let unit = props::slice_unit(team);
        let active_state = self
            .unit_state(&unit)
            .await?
            .map(|s| s.active)
            .unwrap_or_else(|| "not-loaded".into());
        let (memory_current, tasks_current) = cgroup_usage(&self.root, &props::slice_cgroup(team));
        Ok(SliceUsage {
            active_state,
            memory_current,
            tasks_current,
        })
    }

    /// Give `slice` (outside the team shares) exactly `fence`'s device filter. The slice is not
    /// started: an inactive `machine.slice` gets its filter when its first machine starts.
    pub async fn set_fence(
        &self,
        slice: &str,
        fence: &crate::observe::Fence,
    ) -> Result<(), SystemdError> {
        self.set_unit_properties(slice, true, &props::fence_properties(fence))
            .await
    }

    /// The device filter of `slice` as systemd holds it. Loaded if need be: an idle
    /// `machine.slice` may have been unloaded, and loading reads its runtime drop-ins back.
    pub async fn read_fence(&self, slice: &str) -> Result<crate::observe::Fence, SystemdError> {
        let path = self.load_unit(slice).await?;
        let raw = self
            .slice_get_all(path)
            .await
            .map_err(bus(slice, "GetAll(Slice properties)"))?;
        Ok(props::fence_from_raw(&raw))
    }

    /// Remove a team's slice. Refuses ([`SystemdError::Busy`]) while processes run in it:
    /// removing a team from the policy must not kill its jobs.
    pub async fn remove_slice(&self, team: &str) -> Result<(), SystemdError> {
        let unit = props::slice_unit(team);
        let usage = self.slice_usage(team).await?;
        if let Some(tasks) = usage.tasks_current.filter(|&n| n > 0) {
            return Err(SystemdError::Busy { unit, tasks });
        }
        self.stop_unit(&unit).await
    }

    /// Write the instance's files (`.env`, `.ctl` with the limits `ExecStartPost=` sends, a
    /// `User=` drop-in when the policy names one) and start `gpuctl-mps@<instance>.service`, or
    /// restart it when its settings changed.
    pub async fn start_mps(&self, instance: &str, spec: &MpsSpec) -> Result<(), SystemdError> {
        let changed = self.stage_mps_dropins(&[(instance, spec)]).await?;
        self.start_mps_staged(instance, spec, !changed.is_empty())
            .await
    }

    /// Write the `User=`/`Group=` drop-ins of the MPS instances about to start, then one
    /// daemon-reload if any changed; returns the instances whose drop-in changed. User= and
    /// Group= cannot come from the environment file, and a drop-in is read only at a reload.
    ///
    /// One reload for all: a reload re-runs every generator and re-reads every unit (5 to 6 s
    /// each under TCG in VM 65), and it resets an extended start timeout to `TimeoutStartSec=`,
    /// so 56 MPS units with a reload each had systemd kill gpuctld's first reconcile.
    pub async fn stage_mps_dropins(
        &self,
        starts: &[(&str, &MpsSpec)],
    ) -> Result<std::collections::BTreeSet<String>, SystemdError> {
        let mut changed = std::collections::BTreeSet::new();
        for (instance, spec) in starts {
            let unit = checked_mps_unit(instance)?;
            let dropin = self
                .root
                .join(format!("/run/systemd/system/{unit}.d/50-gpuctl-user.conf"));
            if write_if_changed(&dropin, &mps::dropin(spec))? {
                changed.insert(instance.to_string());
            }
        }
        if !changed.is_empty() {
            self.reload().await?;
        }
        Ok(changed)
    }

    /// Start (or restart, when its files or, per `dropin_changed`, its drop-in changed) an MPS
    /// daemon whose drop-in [`Self::stage_mps_dropins`] has written.
    pub async fn start_mps_staged(
        &self,
        instance: &str,
        spec: &MpsSpec,
        dropin_changed: bool,
    ) -> Result<(), SystemdError> {
        let unit = checked_mps_unit(instance)?;
        let env = self.root.join(mps::env_path(instance));
        let mut changed = write_if_changed(&env, &mps::env_file(instance, spec))?;
        // Only systemd (EnvironmentFile=, as root) and gpuctld read it.
        set_mode(&env, 0o640)?;
        changed |= write_if_changed(
            &self.root.join(mps::ctl_path(instance)),
            &mps::control_commands(spec),
        )?;
        changed |= dropin_changed;
        match (self.is_running(&unit).await?, changed) {
            (true, false) => Ok(()),
            (true, true) => self.restart_unit(&unit).await,
            (false, _) => {
                // A daemon that crashed too often sits in `failed`; clear it so start works.
                let _ = self.mgr.reset_failed_unit(&unit).await;
                self.start_unit(&unit).await
            }
        }
    }

    /// Stop an MPS daemon (its `ExecStop` sends `quit`) and remove its files.
    pub async fn stop_mps(&self, instance: &str) -> Result<(), SystemdError> {
        self.stop_unit(&mps::unit(instance)).await?;
        remove_if_exists(&self.root.join(mps::env_path(instance)))?;
        remove_if_exists(&self.root.join(mps::ctl_path(instance)))?;
        Ok(())
    }

    /// See [`LiveUnits::list_mps`].
    pub async fn list_mps(&self) -> Result<Vec<(String, MpsSpec)>, SystemdError> {
        let rows = self.list_units(&RUNNING, &["gpuctl-mps@*.service"]).await?;
        Ok(rows
            .iter()
            .filter_map(|r| mps::instance_of(&r.0))
            .map(|inst| {
                let text = std::fs::read_to_string(self.root.join(mps::env_path(inst)));
                (inst.to_string(), mps::parse_env(&text.unwrap_or_default()))
            })
            .collect())
    }
}

/// `memory.current` and `pids.current` of a cgroup (relative to the cgroup2 mount under `root`);
/// `None` for values that cannot be read (no cgroup yet, controller not enabled).
pub fn cgroup_usage(root: &Root, cgroup: &str) -> (Option<u64>, Option<u64>) {
    use cgroups_rs::fs::memory::MemController;
    use cgroups_rs::fs::pid::PidController;
    let base = root.join("/sys/fs/cgroup");
    let dir = base.join(cgroup);
    if !dir.is_dir() {
        return (None, None);
    }
    // memory_stat() reports 0 for an unreadable file, which would look like an idle slice;
    // check the file first so "unknown" stays unknown.
    let mem = dir.join("memory.current").exists().then(|| {
        MemController::new(dir.clone(), base.clone(), true)
            .memory_stat()
            .usage_in_bytes
    });
    let pids = PidController::new(dir, base, true).get_pid_current().ok();
    (mem, pids)
}

fn set_mode(path: &std::path::Path, mode: u32) -> Result<(), SystemdError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
        SystemdError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// The async client as the executor's slice, MPS and unit effectors and the observer's
/// [`LiveUnits`], for code running on a blocking thread (`tokio::task::spawn_blocking`, or a
/// CLI's main thread) while a runtime thread keeps driving the bus.
///
/// Calling it on a runtime thread panics (tokio refuses nested `block_on`).
#[derive(Debug, Clone)]
pub struct BlockingSystemd {
    handle: tokio::runtime::Handle,
    inner: Arc<Systemd>,
    _runtime: Option<Arc<RuntimeThread>>,
    /// MPS instances whose drop-in [`MpsEffector::prepare_mps`] wrote (and reloaded for): the
    /// drop-in's text and whether it changed. A `start_mps` for the same text neither writes it
    /// nor reloads again; any other start does both itself.
    staged_mps: std::collections::BTreeMap<String, (String, bool)>,
}

/// A current-thread runtime driven by a thread of its own, for callers that have no runtime
/// (the CLI): `Handle::block_on` on a current-thread runtime does not drive its I/O, so some
/// thread must sit in `Runtime::block_on` for the bus connection to make progress.
#[derive(Debug)]
struct RuntimeThread {
    stop: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl Drop for RuntimeThread {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.lock().ok().and_then(|mut s| s.take()) {
            let _ = tx.send(());
        }
    }
}

impl BlockingSystemd {
    /// Wrap a client; `handle` is the runtime the client's connection lives on.
    pub fn new(handle: tokio::runtime::Handle, inner: Arc<Systemd>) -> Self {
        BlockingSystemd {
            handle,
            inner,
            _runtime: None,
            staged_mps: Default::default(),
        }
    }

    /// Connect to systemd on the system bus from code without a runtime (`gpuctl apply
    /// --local`): the connection lives on a runtime thread that ends when the last clone of
    /// the returned value is dropped.
    pub fn connect_system(root: Root) -> Result<Self, SystemdError> {
        let io = |source| SystemdError::Io {
            path: "tokio runtime".into(),
            source,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(io)?;
        let handle = rt.handle().clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("gpuctl-bus".into())
            .spawn(move || {
                let _ = rt.block_on(rx);
            })
            .map_err(io)?;
        let guard = Arc::new(RuntimeThread {
            stop: std::sync::Mutex::new(Some(tx)),
        });
        let sd = handle.block_on(Systemd::system(root))?;
        Ok(BlockingSystemd {
            _runtime: Some(guard),
            ..Self::new(handle, Arc::new(sd))
        })
    }

    /// The async client.
    pub fn inner(&self) -> &Arc<Systemd> {
        &self.inner
    }
}

impl SliceEffector for BlockingSystemd {
    fn set_slice(&mut self, team: &TeamName, spec: &SliceSpec) -> Result<(), EffectError> {
        Ok(self.handle.block_on(self.inner.set_slice(team, spec))?)
    }
    fn update_slice(
        &mut self,
        team: &TeamName,
        spec: &SliceSpec,
        live: Option<&SliceSpec>,
    ) -> Result<(), EffectError> {
        Ok(self
            .handle
            .block_on(self.inner.update_slice(team, spec, live))?)
    }
    fn remove_slice(&mut self, team: &TeamName) -> Result<(), EffectError> {
        Ok(self.handle.block_on(self.inner.remove_slice(team))?)
    }
    fn set_fence(&mut self, slice: &str, fence: &crate::observe::Fence) -> Result<(), EffectError> {
        Ok(self.handle.block_on(self.inner.set_fence(slice, fence))?)
    }
}

impl MpsEffector for BlockingSystemd {
    fn prepare_mps(&mut self, starts: &[(&str, &MpsSpec)]) -> Result<(), EffectError> {
        self.staged_mps.clear();
        let changed = self.handle.block_on(self.inner.stage_mps_dropins(starts))?;
        for (instance, spec) in starts {
            self.staged_mps.insert(
                instance.to_string(),
                (mps::dropin(spec), changed.contains(*instance)),
            );
        }
        Ok(())
    }
    fn start_mps(&mut self, instance: &str, spec: &MpsSpec) -> Result<(), EffectError> {
        let start = match self.staged_mps.remove(instance) {
            Some((text, dropin_changed)) if text == mps::dropin(spec) => self
                .handle
                .block_on(self.inner.start_mps_staged(instance, spec, dropin_changed)),
            _ => self.handle.block_on(self.inner.start_mps(instance, spec)),
        };
        Ok(start?)
    }
    fn stop_mps(&mut self, instance: &str) -> Result<(), EffectError> {
        Ok(self.handle.block_on(self.inner.stop_mps(instance))?)
    }
}

impl UnitEffector for BlockingSystemd {
    fn stop_units(&mut self, units: &[String], timeout: Duration) -> Result<(), EffectError> {
        for u in units {
            self.handle
                .block_on(self.inner.stop_unit_within(u, timeout))?;
        }
        Ok(())
    }
    fn start_units(&mut self, units: &[String]) -> Result<(), EffectError> {
        for u in units {
            self.handle.block_on(self.inner.start_unit(u))?;
        }
        Ok(())
    }
    fn restart_units(&mut self, units: &[String]) -> Result<(), EffectError> {
        for u in units {
            self.handle.block_on(self.inner.restart_unit(u))?;
        }
        Ok(())
    }
}

impl LiveUnits for BlockingSystemd {
    fn read_slice(&mut self, team: &str) -> Result<Option<SliceSpec>, SystemdError> {
        self.handle.block_on(self.inner.read_slice(team))
    }
    fn list_slices(&mut self) -> Result<Vec<TeamName>, SystemdError> {
        self.handle.block_on(self.inner.list_slices())
    }
    fn list_mps(&mut self) -> Result<Vec<(String, MpsSpec)>, SystemdError> {
        self.handle.block_on(self.inner.list_mps())
    }
    fn read_running_slices(
        &mut self,
    ) -> Result<std::collections::BTreeMap<TeamName, SliceSpec>, SystemdError> {
        self.handle.block_on(self.inner.read_running_slices())
    }
    fn read_fences(
        &mut self,
        slices: &[&str],
    ) -> Result<std::collections::BTreeMap<String, crate::observe::Fence>, SystemdError> {
        let mut out = std::collections::BTreeMap::new();
        for s in slices {
            out.insert(
                s.to_string(),
                self.handle.block_on(self.inner.read_fence(s))?,
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_usage_reads_under_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let cg = root.join("/sys/fs/cgroup/gpu.slice/gpu-infer.slice");
        assert_eq!(
            cgroup_usage(&root, "gpu.slice/gpu-infer.slice"),
            (None, None)
        );
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(cg.join("memory.current"), "4096\n").unwrap();
        std::fs::write(cg.join("pids.current"), "3\n").unwrap();
        assert_eq!(
            cgroup_usage(&root, "gpu.slice/gpu-infer.slice"),
            (Some(4096), Some(3))
        );
    }
}
