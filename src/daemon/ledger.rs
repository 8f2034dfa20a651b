//! The GPU-hours ledger at work: fed by the idle loop's usage collections ([`super::idle`]),
//! written to `/var/lib/gpuctl/ledger/` after every sample (on a blocking thread), counted in
//! the Prometheus counters. `[host] accounting` decides whether it runs (docs/ledger.md).

use crate::ledger::store::Store;
use crate::ledger::{from_usage, Credit, Day, Ledger};
use crate::paths::Root;
use crate::policy::{Accounting, IdleRule};
use crate::usage::Usage;
use std::collections::BTreeMap;
use tracing::warn;

/// The ledger and its store; the store is read on the first sample, so a host that never
/// accounts never touches it.
pub(super) struct LedgerSide {
    store: Store,
    nominal_ms: u64,
    ledger: Option<Ledger>,
}

impl LedgerSide {
    /// A ledger of samples `nominal_ms` apart under `root`.
    pub(super) fn new(root: &Root, nominal_ms: u64) -> LedgerSide {
        LedgerSide {
            store: Store::new(root),
            nominal_ms,
            ledger: None,
        }
    }

    fn open(&mut self) -> &mut Ledger {
        let (store, nominal) = (&self.store, self.nominal_ms);
        self.ledger.get_or_insert_with(|| {
            store.clean();
            let (today, last) = store.latest();
            Ledger::new(nominal, today, last)
        })
    }

    /// Take in one collection (unless accounting is off) and store the day.
    pub(super) async fn observe(
        &mut self,
        usage: &Usage,
        rules: &BTreeMap<String, IdleRule>,
        mode: Accounting,
    ) {
        if mode == Accounting::Off {
            return;
        }
        let Some(s) = from_usage(usage) else { return };
        let below = rules.iter().map(|(t, r)| (t.clone(), r.below)).collect();
        let (credit, finished) = self.open().observe(&s, &below);
        self.settle(credit, finished).await;
    }

    /// An idle stop of `unit` was sent at `at_ms`.
    pub(super) async fn reclaimed(&mut self, team: &str, unit: &str, at_ms: u64) {
        let Some(l) = self.ledger.as_mut() else {
            return;
        };
        let (credit, finished) = l.reclaimed(team, unit, at_ms);
        self.settle(credit, finished).await;
    }

    async fn settle(&mut self, credit: Credit, finished: Option<Day>) {
        crate::metrics::ledger::count(&credit);
        // Nothing new to keep (no holder, a gap): no write. The stored sample time then lags,
        // which after a restart reads as a gap: nothing is credited twice.
        if credit.is_empty() && finished.is_none() {
            return;
        }
        let Some(l) = self.ledger.as_ref() else {
            return;
        };
        let (today, last) = (l.today().clone(), l.last_at_ms());
        let store = self.store.clone();
        let saved = tokio::task::spawn_blocking(move || {
            if let Some(d) = finished {
                store.save(&d, None)?;
            }
            store.save(&today, last)
        })
        .await;
        match saved {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(gpuctl_action = "ledger", "ledger: {e}"),
            Err(e) => warn!(gpuctl_action = "ledger", "ledger write task: {e}"),
        }
    }
}
