//! Typed zbus proxies for the parts of `org.freedesktop.systemd1` gpuctl uses.
//!
//! Only the members we call are declared: the full interfaces are large and a narrow surface
//! keeps the wire signatures reviewable against `org.freedesktop.systemd1(5)`.

// The #[proxy] macro generates receiver and argument types without doc comments; their
// meaning is the systemd D-Bus documentation referenced on each method.
#![allow(missing_docs)]

use zbus::proxy;
use zbus::zvariant::{OwnedObjectPath, Value};

/// One row of `ListUnits*`: (name, description, load, active, sub, following, unit path,
/// job id, job type, job path).
pub type UnitRow = (
    String,
    String,
    String,
    String,
    String,
    String,
    OwnedObjectPath,
    u32,
    String,
    OwnedObjectPath,
);

/// `org.freedesktop.systemd1.Manager` on `/org/freedesktop/systemd1`.
#[proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
pub trait Manager {
    /// Object path of a unit already loaded in memory (`NoSuchUnit` otherwise).
    fn get_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    /// Object path of a unit, loading it from disk when needed.
    fn load_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    /// Queue a start job; returns the job path.
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    /// Queue a stop job; returns the job path.
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    /// Send `signal` to the unit's processes; `whom` is `main`, `control` or `all`.
    fn kill_unit(&self, name: &str, whom: &str, signal: i32) -> zbus::Result<()>;
    /// Queue a restart job; returns the job path.
    fn restart_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    /// Change unit properties; `runtime` selects `/run/systemd/system.control` over `/etc`.
    fn set_unit_properties(
        &self,
        name: &str,
        runtime: bool,
        properties: &[(&str, Value<'_>)],
    ) -> zbus::Result<()>;
    /// Create and start a transient unit (scope, slice, service).
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Value<'_>)],
        aux: &[(&str, Vec<(&str, Value<'_>)>)],
    ) -> zbus::Result<OwnedObjectPath>;
    /// Units in memory matching states and glob patterns.
    fn list_units_by_patterns(
        &self,
        states: &[&str],
        patterns: &[&str],
    ) -> zbus::Result<Vec<UnitRow>>;
    /// Ask for signals (`JobRemoved`, `UnitRemoved`, …) on this connection.
    fn subscribe(&self) -> zbus::Result<()>;
    /// `daemon-reload`: re-run generators and reload all unit files.
    fn reload(&self) -> zbus::Result<()>;
    /// Forget the failed state of a unit.
    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;

    /// A job finished; `result` is `done`, `canceled`, `timeout`, `failed`, `dependency` or
    /// `skipped`.
    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: OwnedObjectPath,
        unit: String,
        result: String,
    ) -> zbus::Result<()>;
    /// A unit was dropped from memory.
    #[zbus(signal)]
    fn unit_removed(&self, id: String, unit: OwnedObjectPath) -> zbus::Result<()>;
}

/// `org.freedesktop.systemd1.Unit`: state common to every unit type.
#[proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1",
    gen_blocking = false
)]
pub trait Unit {
    /// `loaded`, `not-found`, `masked`, …
    #[zbus(property)]
    fn load_state(&self) -> zbus::Result<String>;
    /// `active`, `inactive`, `failed`, `activating`, …
    #[zbus(property)]
    fn active_state(&self) -> zbus::Result<String>;
    /// Type-specific state (`running`, `dead`, …).
    #[zbus(property)]
    fn sub_state(&self) -> zbus::Result<String>;
}
