//! gpuctld's D-Bus API: `org.gpuctl.Agent1` at `/org/gpuctl/Agent1` on the system bus.
//!
//! | member | kind | who |
//! |---|---|---|
//! | `Status() -> s` | method, JSON | anyone |
//! | `Plan() -> s` | method, JSON dry run | anyone |
//! | `Apply() -> s` | method, JSON report | root |
//! | `Reload() -> s` | method, JSON report | root |
//! | `Join(s team) -> (a{ss} env, s scope)` | method: move the caller's own process into a new scope in `gpu-<team>.slice` | members, root |
//! | `Env(s team) -> a{ss}` | method: the team's environment | members, root |
//! | `Teams() -> s` | method, JSON: the teams the caller may use and what each gives | anyone (sees own teams) |
//! | `Usage() -> s` | method, JSON of [`crate::usage::Usage`]: who uses which GPU ([`usage`]) | anyone |
//! | `Metrics(s format) -> s` | method: Prometheus metrics, `openmetrics` or `prometheus-text` | anyone |
//! | `StatusText` | property `s`, emits `PropertiesChanged` | anyone |
//! | `LastReconcileStartUsec`, `Reconciling` | properties `t`, `b` | anyone |
//!
//! Root-only methods ask the bus daemon for the caller's uid (`GetConnectionUnixUser` on the
//! message's sender), never trusting anything the client sends. The join methods ([`join`])
//! take uid, groups and pid from `GetConnectionCredentials` the same way. The bus policy file
//! (`packaging/files/org.gpuctl.Agent1.conf`) lets only root own the name and lets other users
//! send only the read and join methods.

use crate::daemon::reconcile::ReconcileReport;
use crate::daemon::{Request, Shared};
use crate::paths::Root;
use crate::systemd::{mps, Systemd};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};
use zbus::{fdo, interface, message::Header, Connection};

pub mod client;
pub mod join;
pub mod usage;
pub mod wire;

/// Well-known bus name.
pub const BUS_NAME: &str = "org.gpuctl.Agent1";
/// Object path.
pub const OBJECT_PATH: &str = "/org/gpuctl/Agent1";

/// The exported object.
pub struct Agent {
    shared: Arc<Mutex<Shared>>,
    tx: mpsc::UnboundedSender<Request>,
    sd: Systemd,
    root: Root,
    jobs: Arc<join::JobWaiter>,
}

async fn caller_uid(conn: &Connection, hdr: &Header<'_>) -> fdo::Result<u32> {
    let sender = hdr
        .sender()
        .ok_or_else(|| fdo::Error::AccessDenied("message has no sender".into()))?;
    let dbus = fdo::DBusProxy::new(conn).await?;
    dbus.get_connection_unix_user(sender.clone().into()).await
}

async fn require_root(conn: &Connection, hdr: &Header<'_>, what: &str) -> fdo::Result<()> {
    match caller_uid(conn, hdr).await? {
        0 => Ok(()),
        uid => Err(fdo::Error::AccessDenied(format!(
            "{what} is for root only (caller uid {uid})"
        ))),
    }
}

fn report_json(r: &ReconcileReport) -> String {
    serde_json::to_string(&json!({
        "converged": r.converged(),
        "report": r,
    }))
    .unwrap_or_default()
}

impl Agent {
    async fn request(&self, reason: &str) -> fdo::Result<ReconcileReport> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Reconcile {
                reason: reason.into(),
                reply: Some(reply),
            })
            .map_err(|_| fdo::Error::Failed("daemon is shutting down".into()))?;
        rx.await
            .map_err(|_| fdo::Error::Failed("reconcile was abandoned".into()))
    }
}

#[interface(name = "org.gpuctl.Agent1")]
impl Agent {
    /// Everything `gpuctl status` shows, as JSON.
    async fn status(&self) -> fdo::Result<String> {
        Ok(status_json(&self.shared, &self.sd, &self.root)
            .await
            .to_string())
    }

    /// What a reconcile would change now, as JSON.
    async fn plan(&self) -> fdo::Result<String> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Plan { reply })
            .map_err(|_| fdo::Error::Failed("daemon is shutting down".into()))?;
        let r = rx
            .await
            .map_err(|_| fdo::Error::Failed("plan was abandoned".into()))?;
        Ok(report_json(&r))
    }

    /// Reconcile now (root only); returns the report as JSON.
    async fn apply(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<String> {
        require_root(conn, &hdr, "Apply").await?;
        Ok(report_json(&self.request("D-Bus Apply").await?))
    }

    /// Reload the policy and reconcile (root only); returns the report as JSON.
    async fn reload(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<String> {
        require_root(conn, &hdr, "Reload").await?;
        Ok(report_json(&self.request("D-Bus Reload").await?))
    }

    /// Move the caller's own process (the bus's `ProcessID` of the connection) into a new
    /// scope `gpuctl-run-<team>-<pid>.scope` in `gpu-<team>.slice`, if the policy lets the
    /// caller use `team`; returns the team's environment and the scope's name.
    async fn join(
        &self,
        team: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(HashMap<String, String>, String), join::JoinError> {
        let r = join::join(
            &self.shared,
            &self.sd,
            &self.jobs,
            &self.root,
            conn,
            &hdr,
            &team,
        )
        .await;
        crate::metrics::counters().joined(&team, join::outcome(&r));
        r
    }

    /// Who uses which GPU and MIG device now, as JSON of [`crate::usage::Usage`].
    async fn usage(&self) -> fdo::Result<String> {
        let u = usage::usage(&self.shared, &self.root).await?;
        serde_json::to_string(&u).map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// Prometheus metrics in `format` (`openmetrics` or `prometheus-text`).
    async fn metrics(&self, format: String) -> fdo::Result<String> {
        usage::metrics(&self.shared, &self.sd, &self.root, &format).await
    }

    /// The environment of a team the caller may use (what `/run/gpuctl/teams/<team>.env`
    /// holds).
    async fn env(
        &self,
        team: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<HashMap<String, String>, join::JoinError> {
        join::env(&self.shared, &self.root, conn, &hdr, &team).await
    }

    /// The teams the caller may use and what each gives, as a JSON array.
    async fn teams(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, join::JoinError> {
        join::teams(&self.shared, &self.root, conn, &hdr).await
    }

    /// Wall-clock µs at which the latest reconcile started.
    #[zbus(property)]
    async fn last_reconcile_start_usec(&self) -> u64 {
        self.shared.lock().map(|s| s.cycle_started_us).unwrap_or(0)
    }

    /// Whether a reconcile is running now.
    #[zbus(property)]
    async fn reconciling(&self) -> bool {
        self.shared.lock().map(|s| s.busy).unwrap_or(false)
    }

    /// The one-line truth, as in `STATUS=`.
    #[zbus(property)]
    async fn status_text(&self) -> String {
        self.shared
            .lock()
            .map(|s| s.status_text.clone())
            .unwrap_or_default()
    }
}

/// Export the object and take the bus name.
pub async fn serve(
    conn: &Connection,
    shared: Arc<Mutex<Shared>>,
    tx: mpsc::UnboundedSender<Request>,
    sd: Systemd,
    root: Root,
) -> zbus::Result<()> {
    // Subscribed before the name is taken, so no placement can miss its job's signal.
    let jobs = join::JobWaiter::spawn(&sd).await?;
    conn.object_server()
        .at(
            OBJECT_PATH,
            Agent {
                shared,
                tx,
                sd,
                root,
                jobs,
            },
        )
        .await?;
    conn.request_name(BUS_NAME).await?;
    Ok(())
}

/// Emit `PropertiesChanged` for `StatusText` (best effort: status is also in `STATUS=`).
pub async fn status_text_changed(conn: &Connection) {
    if let Ok(iface) = conn
        .object_server()
        .interface::<_, Agent>(OBJECT_PATH)
        .await
    {
        let _ = iface
            .get()
            .await
            .status_text_changed(iface.signal_emitter())
            .await;
    }
}

/// Build the `Status` document: per team its GPUs and MIG devices (with UUIDs), live slice
/// limits and usage, MPS units; per GPU its MIG mode and instances; the last reconcile and the
/// last policy error. Devices come from the last reconcile's view of the host (NVML is not
/// touched on the bus thread); limits and usage are read live.
pub async fn status_json(shared: &Arc<Mutex<Shared>>, sd: &Systemd, _root: &Root) -> Value {
    let sh = shared.lock().map(|s| s.clone()).unwrap_or_default();
    let view = sh.last_report.as_ref().and_then(|r| r.view.clone());
    let mut teams = serde_json::Map::new();
    if let (Some(p), Some(v)) = (&sh.policy, &view) {
        let live_mps = sd.list_mps().await.unwrap_or_default();
        for name in p.teams.keys() {
            let tv = v.teams.get(name);
            let live = sd.read_slice(name).await.ok().flatten();
            let usage = sd.slice_usage(name).await.ok();
            let mut mps_units = Vec::new();
            for inst in tv.iter().flat_map(|t| t.mps.keys()) {
                let unit = mps::unit(inst);
                let state = sd.unit_state(&unit).await.ok().flatten();
                mps_units.push(json!({
                    "unit": unit,
                    "active_state": state.as_ref().map(|s| s.active.clone()),
                    "sub_state": state.map(|s| s.sub),
                    "settings": live_mps.iter().find(|(i, _)| i == inst).map(|(_, s)| s),
                }));
            }
            let gpus: Vec<Value> = tv
                .iter()
                .flat_map(|t| &t.whole_gpus)
                .map(|i| {
                    json!({
                        "index": i,
                        "uuid": v.gpus.iter().find(|g| g.index == *i).map(|g| g.uuid.clone()),
                    })
                })
                .collect();
            teams.insert(
                name.clone(),
                json!({
                    "gpus": gpus,
                    "mig_instances": tv.map(|t| t.mig_devices.clone()).unwrap_or_default(),
                    "slice": {
                        "unit": format!("gpu-{name}.slice"),
                        "wanted": tv.map(|t| &t.slice),
                        "live": live,
                        "active_state": usage.as_ref().map(|u| u.active_state.clone()),
                        "memory_current": usage.as_ref().and_then(|u| u.memory_current),
                        "tasks_current": usage.as_ref().and_then(|u| u.tasks_current),
                    },
                    "mps": mps_units,
                }),
            );
        }
    }
    let gpus: Vec<Value> = view
        .iter()
        .flat_map(|v| v.gpus.iter().map(move |g| (v, g)))
        .map(|(v, g)| {
            let owners: Vec<&String> = v
                .teams
                .iter()
                .filter(|(_, t)| {
                    t.whole_gpus.contains(&g.index)
                        || t.mig_devices.iter().any(|m| m.gpu_index == g.index)
                })
                .map(|(n, _)| n)
                .collect();
            json!({
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "node": format!("/dev/nvidia{}", g.minor),
                "teams": owners,
                "mig": g.mig.as_ref().map(|m| {
                    let mode = |on: bool| if on { "on" } else { "off" };
                    let pending = if m.is_pending() {
                        format!(" (pending {}: needs GPU reset)", mode(m.pending))
                    } else {
                        String::new()
                    };
                    format!("{}{pending}, {} instance(s)", mode(m.current), m.instances.len())
                }),
                "instances": g.mig.as_ref().map(|m| &m.instances),
            })
        })
        .collect();
    json!({
        "status": sh.status_text,
        "policy_error": sh.policy_error,
        "policy_in_force": sh.policy_origin,
        "policy_sources": sh.policy.as_ref().map(|p| p.sources.clone()),
        "last_reconcile": sh.last_report.as_ref().map(|r| json!({
            "at": r.at,
            "result": if r.converged() { "converged" } else { "errors" },
            "changes": r.changes,
            "errors": r.errors,
            "warnings": r.warnings,
        })),
        "teams": teams,
        "gpus": gpus,
    })
}
