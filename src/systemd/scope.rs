//! Placing a running process into a new transient scope, on the path of every `gpuctl run` and
//! `shell` (gpuctld's `Join`): one long-lived `JobRemoved` subscription shared by all
//! placements ([`JobWaiter`]), and a slice property read by object path without a `LoadUnit`
//! round trip.

use super::client::{bus, job_result, Systemd};
use super::props::unit_object_path;
use super::SystemdError;
use futures_lite::StreamExt;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use zbus::zvariant::{OwnedValue, Value};
use zbus::{Connection, Message};

/// How long a scope's start job may take.
const SCOPE_START_LIMIT: Duration = Duration::from_secs(30);

/// Waits for systemd jobs on one long-lived `JobRemoved` subscription, so a placement costs no
/// `AddMatch`/`RemoveMatch` round trips of its own.
#[derive(Default)]
pub struct JobWaiter {
    state: Mutex<WaitState>,
}

#[derive(Default)]
struct WaitState {
    waiting: HashMap<String, oneshot::Sender<String>>,
    /// Results that arrived before their waiter registered (the job finished before the
    /// `StartTransientUnit` reply was handled); bounded, oldest dropped.
    early: VecDeque<(String, String)>,
}

impl JobWaiter {
    /// Subscribe and route results until the stream ends.
    pub async fn spawn(sd: &Systemd) -> zbus::Result<Arc<JobWaiter>> {
        let mut stream = sd.manager().receive_job_removed().await?;
        let w = Arc::new(JobWaiter::default());
        let w2 = w.clone();
        tokio::spawn(async move {
            while let Some(sig) = stream.next().await {
                let Ok(args) = sig.args() else { continue };
                w2.finished(args.job().to_string(), args.result().to_string());
            }
        });
        Ok(w)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WaitState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finished(&self, job: String, result: String) {
        let mut st = self.lock();
        match st.waiting.remove(&job) {
            Some(tx) => _ = tx.send(result),
            None => {
                st.early.push_back((job, result));
                if st.early.len() > 256 {
                    st.early.pop_front();
                }
            }
        }
    }

    /// The result of `job` (`done`, `failed`, …), or `None` after `timeout`.
    pub async fn wait(&self, job: &str, timeout: Duration) -> Option<String> {
        let rx = {
            let mut st = self.lock();
            if let Some(i) = st.early.iter().position(|(j, _)| j == job) {
                return st.early.remove(i).map(|(_, r)| r);
            }
            let (tx, rx) = oneshot::channel();
            st.waiting.insert(job.to_string(), tx);
            rx
        };
        let r = tokio::time::timeout(timeout, rx)
            .await
            .ok()
            .and_then(Result::ok);
        if r.is_none() {
            self.lock().waiting.remove(job);
        }
        r
    }
}

/// `org.freedesktop.systemd1.Manager.<method>(body)` on `conn`.
pub async fn call_manager<B>(conn: &Connection, method: &str, body: &B) -> zbus::Result<Message>
where
    B: serde::Serialize + zbus::zvariant::DynamicType,
{
    conn.call_method(
        Some("org.freedesktop.systemd1"),
        "/org/freedesktop/systemd1",
        Some("org.freedesktop.systemd1.Manager"),
        method,
        body,
    )
    .await
}

/// The string property `name` of `iface` on systemd's object at `path`, in one `Get`.
pub async fn string_property(
    conn: &Connection,
    path: &str,
    iface: &str,
    name: &str,
) -> zbus::Result<String> {
    let reply = conn
        .call_method(
            Some("org.freedesktop.systemd1"),
            path,
            Some("org.freedesktop.DBus.Properties"),
            "Get",
            &(iface, name),
        )
        .await?;
    let v: OwnedValue = reply.body().deserialize()?;
    String::try_from(v).map_err(zbus::Error::from)
}

impl Systemd {
    /// `DevicePolicy` of a slice in one call: systemd loads a unit named by its object path, so
    /// no `LoadUnit` round trip is needed.
    pub async fn slice_device_policy(&self, slice: &str) -> Result<String, SystemdError> {
        let path = unit_object_path(slice);
        let iface = "org.freedesktop.systemd1.Slice";
        string_property(self.connection(), &path, iface, "DevicePolicy")
            .await
            .map_err(bus(slice, "Get(DevicePolicy)"))
    }

    /// Move the running `pid` into a new transient scope `scope` in `slice` and wait (on
    /// `jobs`) for its start job.
    ///
    /// `OOMPolicy=continue` (issue 17 item 6): the kernel's OOM kill of one process in a
    /// member's `gpuctl run`/`shell` scope must not make systemd stop the whole scope, which it
    /// does under the default `stop`. logind gives login sessions (`session-N.scope`) `continue`
    /// for the same reason; a shell in a team share should behave like the login it came from.
    /// The slice's `MemoryMax=` still bounds the team; only the process the kernel picked dies.
    /// systemd < 253 rejects the property on scopes. There the scope is started without it and
    /// then *abandoned* (`AbandonScope`): systemd's OOM handler stops only running scopes, an
    /// abandoned one is left alone (its cgroup, slice and device filter are unchanged, and it
    /// is collected when its last process exits). The refusal is logged once.
    ///
    /// `devices`, when given, fences the scope itself (`DevicePolicy=closed` and exactly these
    /// nodes in `DeviceAllow=`) inside the slice's own fence: a placed job opens its devices
    /// and not its neighbours', though both are the team's. `limits` are resource properties of
    /// the scope's own: a borrowed job, outside its team's slice, carries its team's limits
    /// itself.
    #[allow(clippy::too_many_arguments)]
    pub async fn start_scope(
        &self,
        jobs: &JobWaiter,
        scope: &str,
        slice: &str,
        pid: u32,
        description: String,
        devices: Option<&[String]>,
        limits: Vec<(&'static str, Value<'static>)>,
    ) -> Result<(), SystemdError> {
        use std::sync::atomic::Ordering;
        let with_oom = SCOPE_OOM_POLICY.load(Ordering::Relaxed);
        let s = ScopeSpec {
            scope,
            slice,
            pid,
            description: &description,
            devices,
            limits,
        };
        match self.start_scope_once(jobs, &s, with_oom).await {
            Err(e) if with_oom && e.to_string().contains("OOMPolicy") => {
                SCOPE_OOM_POLICY.store(false, Ordering::Relaxed);
                tracing::warn!(
                    gpuctl_action = "join",
                    "systemd does not take OOMPolicy= on scopes (before 253): {e}; member \
                     scopes are abandoned after their start instead, so that an OOM kill does \
                     not stop them"
                );
                self.start_scope_once(jobs, &s, false).await?;
                self.abandon_scope(scope).await
            }
            Ok(()) if !with_oom => self.abandon_scope(scope).await,
            r => r,
        }
    }

    /// `AbandonScope`: see [`Systemd::start_scope`] for why (systemd < 253 only).
    async fn abandon_scope(&self, scope: &str) -> Result<(), SystemdError> {
        call_manager(self.connection(), "AbandonScope", &(scope,))
            .await
            .map(|_| ())
            .map_err(bus(scope, "AbandonScope"))
    }

    async fn start_scope_once(
        &self,
        jobs: &JobWaiter,
        s: &ScopeSpec<'_>,
        oom_continue: bool,
    ) -> Result<(), SystemdError> {
        let props = scope_properties(s, oom_continue);
        let scope = s.scope;
        let job = self
            .manager()
            .start_transient_unit(scope, "fail", &props, &[])
            .await
            .map_err(bus(scope, "StartTransientUnit"))?;
        let result = jobs.wait(job.as_str(), SCOPE_START_LIMIT).await;
        job_result(scope, "start", result, SCOPE_START_LIMIT)
    }

    /// Name and description of every live member scope (`gpuctl-run-*.scope`): the leases are
    /// the records of these names (`dbus_api::place::store`). One `ListUnitsByPatterns` call; a
    /// scope that has ended (its processes gone, killed or OOM-killed) is not listed.
    pub async fn member_scopes(&self) -> Result<Vec<(String, String)>, SystemdError> {
        let rows = self
            .list_units(
                &["active", "activating", "deactivating", "reloading"],
                &["gpuctl-run-*.scope"],
            )
            .await?;
        Ok(rows.into_iter().map(|r| (r.0, r.1)).collect())
    }
}

/// What a member scope is made of.
struct ScopeSpec<'a> {
    scope: &'a str,
    slice: &'a str,
    pid: u32,
    description: &'a str,
    devices: Option<&'a [String]>,
    limits: Vec<(&'static str, Value<'static>)>,
}

/// The `StartTransientUnit` properties of a member scope.
fn scope_properties<'a>(s: &ScopeSpec<'a>, oom_continue: bool) -> Vec<(&'static str, Value<'a>)> {
    let mut props: Vec<(&str, Value<'_>)> = vec![
        ("Slice", Value::from(s.slice)),
        ("PIDs", Value::from(vec![s.pid])),
        ("Description", Value::from(s.description)),
        // A failed scope would otherwise stay loaded, listed as failed, until `reset-failed`.
        ("CollectMode", Value::from("inactive-or-failed")),
    ];
    if let Some(devices) = s.devices {
        let allow: Vec<(String, String)> = devices
            .iter()
            .map(|d| (d.clone(), super::props::DEVICE_ACCESS.to_string()))
            .collect();
        props.push(("DevicePolicy", Value::from("closed")));
        props.push(("DeviceAllow", Value::from(allow)));
    }
    if oom_continue {
        props.push(("OOMPolicy", Value::from("continue")));
    }
    props.extend(s.limits.iter().map(|(k, v)| (*k, v.clone())));
    props
}

/// Whether systemd takes `OOMPolicy=` on scopes; cleared after the first refusal (systemd
/// before 253 knows it for services only), so later joins do not pay the retry.
static SCOPE_OOM_POLICY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placed_scope_is_fenced_to_its_devices() {
        let devices = vec!["/dev/nvidia0".to_string(), "/dev/nvidiactl".to_string()];
        let s = ScopeSpec {
            scope: "gpuctl-run-t-1.scope",
            slice: "gpu-t.slice",
            pid: 1,
            description: "d",
            devices: Some(&devices),
            limits: Vec::new(),
        };
        let p = scope_properties(&s, true);
        let get = |k: &str| p.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        assert_eq!(get("DevicePolicy"), Some(Value::from("closed")));
        let allow: Vec<(String, String)> = get("DeviceAllow").unwrap().try_into().unwrap();
        assert_eq!(
            allow,
            vec![
                ("/dev/nvidia0".into(), "rwm".into()),
                ("/dev/nvidiactl".into(), "rwm".into())
            ]
        );
        // Unplaced (jobs-per-device = 0): the slice's fence alone, as before.
        let open = ScopeSpec { devices: None, ..s };
        let p = scope_properties(&open, false);
        assert!(!p
            .iter()
            .any(|(n, _)| n.starts_with("Device") || *n == "OOMPolicy"));
    }

    #[tokio::test]
    async fn job_results_reach_waiters_whether_they_come_before_or_after() {
        let w = JobWaiter::default();
        w.finished("/job/1".into(), "done".into());
        assert_eq!(
            w.wait("/job/1", Duration::from_secs(1)).await.as_deref(),
            Some("done")
        );
        let w = Arc::new(w);
        let w2 = w.clone();
        let t = tokio::spawn(async move { w2.wait("/job/2", Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        w.finished("/job/3".into(), "failed".into());
        w.finished("/job/2".into(), "failed".into());
        assert_eq!(t.await.unwrap().as_deref(), Some("failed"));
        assert_eq!(w.wait("/job/9", Duration::from_millis(10)).await, None);
        assert!(
            w.state.lock().unwrap().waiting.is_empty(),
            "timed-out waiter removed"
        );
    }
}
