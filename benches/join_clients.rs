//! `gpuctl run` with its two `Join` clients, natively, against a private `dbus-daemon` and a
//! stand-in gpuctld (issue #14 item 5): the hand-written pipelined client (`dbus_api::wire`,
//! used when the system bus address names a socket path) and zbus (used for any other address;
//! here the same bus's `unix:abstract=` socket). The VM measures these under TCG, which
//! exaggerates the cost of code size; this measures them on the build machine.
//!
//! Printed, as medians of `RUNS` runs each, interleaved so that load on the machine hits both
//! alike: a plain `true` (process start, the floor), `gpuctl run --team infer -- true` with each
//! client, and the zbus/wire ratio.
//!
//! Run: `cargo bench --bench join_clients` (needs `dbus-daemon`).

#[path = "../tests/common/dbus.rs"]
mod dbus;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RUNS: usize = 200;

fn time(cmd: &mut Command) -> Duration {
    let t = Instant::now();
    let st = cmd.status().expect("spawn");
    let d = t.elapsed();
    assert!(st.success(), "{cmd:?} failed: {st}");
    d
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let Some(bus) = dbus::start_bus() else {
        eprintln!("join_clients: dbus-daemon not installed, nothing measured");
        return;
    };
    dbus::serve(&bus.socket);
    let gpuctl = env!("CARGO_BIN_EXE_gpuctl");
    let run = |address: &str| {
        let mut c = Command::new(gpuctl);
        c.args(["run", "--team", "infer", "--", "true"])
            .env("DBUS_SYSTEM_BUS_ADDRESS", address)
            .stdout(Stdio::null());
        c
    };
    let wire_addr = format!("unix:path={}", bus.socket.display());
    let zbus_addr = bus.abstract_address.clone();
    // Warm the page cache and the service before measuring.
    for _ in 0..5 {
        time(&mut run(&wire_addr));
        time(&mut run(&zbus_addr));
    }
    let (mut floor, mut wire, mut zbus) = (vec![], vec![], vec![]);
    for _ in 0..RUNS {
        floor.push(time(Command::new("true").stdout(Stdio::null())));
        wire.push(time(&mut run(&wire_addr)));
        zbus.push(time(&mut run(&zbus_addr)));
    }
    let (f, w, z) = (median(floor), median(wire), median(zbus));
    println!("join_clients: medians of {RUNS} runs each, interleaved");
    println!("  true                               {:7.3} ms", ms(f));
    println!("  gpuctl run, wire client            {:7.3} ms", ms(w));
    println!("  gpuctl run, zbus client            {:7.3} ms", ms(z));
    println!(
        "BENCH join_clients zbus/wire={:.2}x (above the floor: {:.2}x) wire/true={:.1}x",
        ms(z) / ms(w),
        (ms(z) - ms(f)) / (ms(w) - ms(f)),
        ms(w) / ms(f)
    );
}
