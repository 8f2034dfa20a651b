//! Client side of `org.gpuctl.Agent1`, for `gpuctl status` and friends.

use std::collections::HashMap;
use zbus::proxy;

/// Proxy of gpuctld's interface.
#[proxy(
    interface = "org.gpuctl.Agent1",
    default_service = "org.gpuctl.Agent1",
    default_path = "/org/gpuctl/Agent1",
    gen_blocking = false
)]
pub trait Agent1 {
    /// Status JSON.
    fn status(&self) -> zbus::Result<String>;
    /// Dry-run JSON.
    fn plan(&self) -> zbus::Result<String>;
    /// Reconcile now (root only).
    fn apply(&self) -> zbus::Result<String>;
    /// Reload and reconcile (root only).
    fn reload(&self) -> zbus::Result<String>;
    /// Move the calling process into a new scope in the team's slice; returns (env, scope).
    fn join(&self, team: &str) -> zbus::Result<(HashMap<String, String>, String)>;
    /// `Join` with placement options; returns (env, scope).
    fn join_with(
        &self,
        team: &str,
        options: HashMap<String, String>,
    ) -> zbus::Result<(HashMap<String, String>, String)>;
    /// The team's environment.
    fn env(&self, team: &str) -> zbus::Result<HashMap<String, String>>;
    /// JSON array of the caller's teams.
    fn teams(&self) -> zbus::Result<String>;
    /// JSON of [`crate::usage::Usage`].
    fn usage(&self) -> zbus::Result<String>;
    /// JSON of [`crate::dbus_api::reply::IdleReply`].
    fn idle(&self) -> zbus::Result<String>;
    /// JSON of [`crate::dbus_api::reply::HealthReply`].
    fn health(&self) -> zbus::Result<String>;
    /// JSON of [`crate::dbus_api::reply::DeviceChangeReply`] (root).
    fn device_drain(&self, device: &str, reason: &str) -> zbus::Result<String>;
    /// JSON of [`crate::dbus_api::reply::DeviceChangeReply`] (root).
    fn device_resume(&self, device: &str, reason: &str) -> zbus::Result<String>;
    /// JSON of [`crate::dbus_api::reply::LedgerReply`].
    fn report(&self, from: &str, to: &str, by: &str) -> zbus::Result<String>;
    /// JSON of [`crate::dbus_api::reply::EventsReply`]: the caller's events after `after`,
    /// waiting up to `wait_ms` for a first one.
    fn events(&self, after: u64, wait_ms: u32) -> zbus::Result<String>;
    /// Prometheus metrics (`openmetrics` or `prometheus-text`).
    fn metrics(&self, format: &str) -> zbus::Result<String>;
    /// One-line status.
    #[zbus(property)]
    fn status_text(&self) -> zbus::Result<String>;
    /// The version of the JSON documents ([`crate::dbus_api::reply::v1::VERSION`]).
    #[zbus(property)]
    fn interface_version(&self) -> zbus::Result<u32>;
}
