//! The one usage [`Collector`] of gpuctld: `Usage`, `Metrics`, the idle loop, lending and
//! `Join` collect through it. A leaf of its own, so that `join` and `usage`, which both need
//! it, need not import each other.

use super::{AgentState, Backend};
use crate::join::nss::Nss;
use crate::paths::Root;
use crate::usage::collect::Collector;
use crate::usage::{Owners, Usage};
use std::sync::{Arc, OnceLock};
use zbus::fdo;

static COLLECTOR: OnceLock<Collector> = OnceLock::new();

/// The process's collector, made at first use with the NVML library `lib`.
pub fn collector(lib: Option<std::path::PathBuf>) -> &'static Collector {
    COLLECTOR.get_or_init(|| Collector::new(lib, Collector::interval_from_env()))
}

/// The collector without NVML while the guard lives (`None`: none was made yet, so none holds
/// the library).
pub fn quiet() -> Option<crate::usage::collect::Quiet<'static>> {
    COLLECTOR.get().map(Collector::quiet)
}

/// The last collection, however old, without collecting; `None` before the first one or
/// while one runs.
pub fn last_collection() -> Option<Arc<Usage>> {
    COLLECTOR.get()?.last()
}

fn owners_and_lib(sh: &AgentState) -> (Owners, Option<std::path::PathBuf>) {
    let owners = sh
        .last_report
        .as_ref()
        .and_then(|r| r.view.as_ref())
        .map(Owners::from)
        .unwrap_or_default();
    let lib = crate::nvml::library_path(
        sh.policy
            .as_ref()
            .and_then(|p| p.host.nvml_library.as_deref()),
    );
    (owners, lib)
}

/// The usage now (at most one interval old), with owners and strays. Collections run on a
/// blocking thread, never on the runtime thread that serves the bus.
pub async fn usage(backend: &dyn Backend, root: &Root) -> fdo::Result<Usage> {
    let (owners, lib) = owners_and_lib(&backend.state());
    let root = root.clone();
    tokio::task::spawn_blocking(move || {
        let mut u = collector(lib).get(&root, &owners, &Nss);
        super::place::store::attribute_loans(&root, &mut u);
        u
    })
    .await
    .map_err(|e| fdo::Error::Failed(format!("usage collection failed: {e}")))
}
