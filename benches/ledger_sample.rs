//! What the GPU-hours ledger adds to a sample, against the usage collection it rides on
//! (docs/ledger.md): 8 H100s × 7 MIG devices with 500 processes through the real nvml-wrapper
//! and the fake libnvidia-ml. Printed, as medians of `RUNS` interleaved runs: one collection
//! (the baseline: what gpuctld pays per sample anyway), the ledger's pure step
//! (`ledger::from_usage` plus `Ledger::observe`), its write of the day file (`Store::save`:
//! write, fsync, rename), and their ratios to the collection. Then the store's size for 90 days
//! of 50 users × 56 devices: every user on every device every day (the worst case) and each
//! user on 2 devices a day.
//!
//! Run: `cargo bench --bench ledger_sample`.

#[path = "../tests/fakehost/mod.rs"]
mod fakehost;
#[path = "../tests/usagehost/mod.rs"]
mod usagehost;

use fakehost::{lib_path, FakeHost};
use gpuctl::ledger::store::{encode, Store};
use gpuctl::ledger::{from_usage, Day, Figures, Key, Ledger};
use gpuctl::paths::Root;
use gpuctl::usage::collect::Collector;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const RUNS: usize = 9;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn day_bytes(users: usize, devices: usize, per_user: usize) -> usize {
    let mut d = Day {
        day: 20_000,
        figures: BTreeMap::new(),
    };
    for u in 0..users {
        for j in 0..per_user {
            let dev = (u * per_user + j) % devices;
            let key = Key {
                team: format!("team{:02}", u % 7),
                user: format!("user{u:03}"),
                device: format!("MIG-{:08x}-1111-2222-3333-{:012x}", dev, dev),
                kind: "1g.10gb".into(),
            };
            let f = Figures {
                held_ms: 86_400_000 - u as u64 * 1_000,
                active_ms: 43_200_000 + dev as u64 * 1_000,
                unknown_ms: 12_345_678,
                memory_byte_s: 1.234_567_8e14,
                reclaimed_ms: 3_600_000,
                stops: 3,
                ..Default::default()
            };
            d.figures.insert(key, f);
        }
    }
    encode(&d, Some(1_728_000_000_000)).len()
}

fn main() {
    let fake = FakeHost::new("h100-80gb*8");
    let p = usagehost::seven_policy(fake.dir.path(), 8);
    let owners = usagehost::apply_and_own(&fake, &p);
    usagehost::spread(&fake, &owners, 500);
    let root = Root::new(&fake.root);
    let c = Collector::new(Some(lib_path()), Duration::ZERO);
    let _ = c.get(&root, &owners, &usagehost::Names); // opens NVML
    let store = Store::new(&root);
    let mut ledger = Ledger::new(30_000, None, None);
    let below = BTreeMap::new();
    let (mut collect, mut step, mut save) = (Vec::new(), Vec::new(), Vec::new());
    let mut holders = 0;
    for i in 0..RUNS {
        let t = Instant::now();
        let mut u = c.get(&root, &owners, &usagehost::Names);
        collect.push(t.elapsed());
        u.collected_at_ms = 1_728_000_000_000 + i as u64 * 30_000;
        let t = Instant::now();
        let s = from_usage(&u).expect("NVML readable");
        let credit = ledger.observe(&s, &below);
        step.push(t.elapsed());
        holders = s.holders.len();
        std::hint::black_box(credit);
        let t = Instant::now();
        store.save(ledger.today(), ledger.last_at_ms()).unwrap();
        save.push(t.elapsed());
    }
    assert!(holders > 0);
    let (c, s, w) = (median(collect), median(step), median(save));
    println!(
        "BENCH ledger_sample holders={holders} collection_ms={:.2} ledger_step_ms={:.3} \
         ledger_save_ms={:.3} step/collection={:.4} save/collection={:.4}",
        c.as_secs_f64() * 1e3,
        s.as_secs_f64() * 1e3,
        w.as_secs_f64() * 1e3,
        s.as_secs_f64() / c.as_secs_f64(),
        w.as_secs_f64() / c.as_secs_f64()
    );
    let worst = day_bytes(50, 56, 56);
    let typical = day_bytes(50, 56, 2);
    println!(
        "BENCH ledger_size users=50 devices=56 days=90 worst_day_bytes={worst} \
         worst_90d_mib={:.1} two_devices_day_bytes={typical} two_devices_90d_mib={:.2} \
         cap_mib={}",
        worst as f64 * 90.0 / (1 << 20) as f64,
        typical as f64 * 90.0 / (1 << 20) as f64,
        gpuctl::ledger::store::DEFAULT_CAP_BYTES >> 20
    );
}
