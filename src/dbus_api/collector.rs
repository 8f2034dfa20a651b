//! The one usage [`Collector`] of gpuctld: `Usage`, `Metrics` and the idle loop collect through
//! it, and `Join` places by its last figures. A leaf of its own, so that `join` and `usage`,
//! which both need it, need not import each other.

use crate::usage::collect::Collector;
use crate::usage::Usage;
use std::sync::{Arc, OnceLock};

static COLLECTOR: OnceLock<Collector> = OnceLock::new();

/// The process's collector, made at first use with the NVML library `lib`.
pub fn collector(lib: Option<std::path::PathBuf>) -> &'static Collector {
    COLLECTOR.get_or_init(|| Collector::new(lib, Collector::interval_from_env()))
}

/// The last collection, however old, without collecting (`Join` places by it and must not
/// wait for NVML); `None` before the first one or while one runs.
pub fn last_collection() -> Option<Arc<Usage>> {
    COLLECTOR.get()?.last()
}
