//! gpuctl: a declarative, systemd-native split of a shared NVIDIA GPU host between teams.
//!
//! The crate is laid out as the data flows:
//! - [`policy`]: TOML drop-ins → validated [`policy::Policy`];
//! - [`observe`]: a typed snapshot of the host ([`observe::Observed`]);
//! - [`plan`]: the pure planner, `plan(&Policy, &Observed) -> Plan`, with no I/O;
//! - [`apply`]: the executor and the effector traits it drives;
//! - [`nvml`]: the NVML backend; [`real`]: the real host (NVML + files under the root);
//! - [`sim`]: simulated hosts built from the reference data, for offline plans and tests;
//! - [`geometry`]: the exact MIG placement search shared by validation and the planner;
//!   [`reslice`]: which allowed layout a GPU switches to for the work that waits (pure);
//! - [`systemd`], [`daemon`], [`dbus_api`]: the systemd client, the `gpuctld` runtime and its
//!   bus interface;
//! - [`cdi`]: the per-team CDI spec for container engines (`gpuctl.io/team=<team>`); [`docker`]:
//!   the same share as `docker run` flags and a compose fragment, for Docker without CDI;
//! - [`join`]: who may step into which team share (`gpuctl shell/run/env`), checked by gpuctld;
//! - [`doctor`]: read-only host readiness checks and driver recordings (`gpuctl doctor`);
//! - [`usage`]: who uses which GPU (NVML + `/proc`), served by gpuctld's `Usage` call;
//!   [`metrics`]: the Prometheus metrics of its `Metrics` call;
//! - [`profiles`]: the MIG reference data; [`paths`]: host paths under an injectable root.
#![warn(missing_docs)]

pub mod alerts;
pub mod apply;
pub mod cdi;
pub mod cli;
pub mod daemon;
pub mod dbus_api;
pub mod docker;
pub mod doctor;
pub mod events;
pub mod exporter;
pub mod files;
pub mod geometry;
pub mod health;
pub mod idle;
pub mod import;
pub mod join;
pub mod ledger;
pub mod lending;
pub mod metrics;
pub mod names;
pub mod nvml;
pub mod observe;
pub mod paths;
pub mod placement;
pub mod plan;
pub mod policy;
pub mod profiles;
pub mod ratelimit;
pub mod real;
pub mod reslice;
pub mod settings;
pub mod sim;
pub mod slurm;
pub mod systemd;
pub mod usage;
