//! The devices out of service ([`crate::health`]), as gpuctld's health watcher last published
//! them: read by placement ([`super::place::place`]) on every `Join`, written by the daemon
//! after every change. A process-wide value like the usage collector's last collection, so
//! that the placement path needs no new argument.

use crate::health::OutOfService;
use std::collections::BTreeMap;
use std::sync::RwLock;

static OUT: RwLock<BTreeMap<String, OutOfService>> = RwLock::new(BTreeMap::new());

/// Replace the published set (device UUID → why it is out); whether the devices in it changed.
pub fn publish(out: BTreeMap<String, OutOfService>) -> bool {
    let mut now = OUT.write().unwrap_or_else(|e| e.into_inner());
    let changed = !now.keys().eq(out.keys());
    *now = out;
    changed
}

/// The devices (GPU or MIG UUIDs) in the published set.
pub fn out_of_service_ids() -> std::collections::BTreeSet<String> {
    OUT.read()
        .unwrap_or_else(|e| e.into_inner())
        .keys()
        .cloned()
        .collect()
}

/// The published set.
pub fn out_of_service() -> BTreeMap<String, OutOfService> {
    OUT.read().unwrap_or_else(|e| e.into_inner()).clone()
}
