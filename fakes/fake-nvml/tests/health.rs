//! The event API and health counters, through the raw nvml-wrapper-sys calls gpuctl makes,
//! with the return codes of nvml.h.

mod common;

use common::*;
use fake_nvml::health::{self, Event, EVENT_DOUBLE_BIT_ECC, EVENT_XID};
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::*;
use std::time::{Duration, Instant};

const TIMEOUT: u32 = 10;

/// The fake's query counter is the process's: the tests of this file take turns, so the one
/// that counts a sleeping wait's looks counts no other test's.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
const NOT_SUPPORTED: u32 = 3;
const GPU_IS_LOST: u32 = 15;

fn event_set(nvml: &Nvml) -> nvmlEventSet_t {
    let mut set: nvmlEventSet_t = std::ptr::null_mut();
    rc(unsafe { nvml.lib().nvmlEventSetCreate(&mut set) }).expect("create");
    set
}

fn wait(nvml: &Nvml, set: nvmlEventSet_t, ms: u32) -> Result<nvmlEventData_t, u32> {
    let mut d: nvmlEventData_t = unsafe { std::mem::zeroed() };
    rc(unsafe { nvml.lib().nvmlEventSetWait_v2(set, &mut d, ms) }).map(|()| d)
}

fn xid(gpu: u32, code: u64) -> Event {
    Event {
        gpu,
        event_type: EVENT_XID,
        data: code,
        gi: None,
        ci: None,
    }
}

#[test]
fn empty_wait_times_out_after_the_timeout() {
    let _serial = serial();
    let fake = Fake::new("h100-80gb*2");
    let nvml = fake.nvml();
    let set = event_set(&nvml);
    let d0 = dev(&nvml, 0);
    rc(unsafe {
        nvml.lib()
            .nvmlDeviceRegisterEvents(d0, (EVENT_XID | EVENT_DOUBLE_BIT_ECC) as _, set)
    })
    .unwrap();
    let t = Instant::now();
    assert_eq!(wait(&nvml, set, 60).unwrap_err(), TIMEOUT);
    assert!(t.elapsed() >= Duration::from_millis(60));
    rc(unsafe { nvml.lib().nvmlEventSetFree(set) }).unwrap();
}

#[test]
fn xid_after_registration_is_delivered_once_with_its_code() {
    let _serial = serial();
    let fake = Fake::new("h100-80gb*2");
    // Raised before the registration: not delivered.
    health::raise_event(&fake.state, xid(1, 31)).unwrap();
    let nvml = fake.nvml();
    let set = event_set(&nvml);
    for g in 0..2 {
        rc(unsafe {
            nvml.lib()
                .nvmlDeviceRegisterEvents(dev(&nvml, g), EVENT_XID as _, set)
        })
        .unwrap();
    }
    assert_eq!(health::raise_event(&fake.state, xid(1, 79)).unwrap(), 0);
    // A double-bit ECC event on GPU 0 is not registered for: skipped.
    let dbe = Event {
        event_type: EVENT_DOUBLE_BIT_ECC,
        ..xid(0, 0)
    };
    health::raise_event(&fake.state, dbe).unwrap();
    let d = wait(&nvml, set, 1000).unwrap();
    assert_eq!(d.eventType, EVENT_XID as u64);
    assert_eq!(d.eventData, 79);
    assert_eq!(d.gpuInstanceId, u32::MAX);
    assert_eq!(d.computeInstanceId, u32::MAX);
    let uuid = unsafe { nvml_wrapper::Device::new(d.device, &nvml) }
        .uuid()
        .unwrap();
    assert_eq!(uuid, nvml.device_by_index(1).unwrap().uuid().unwrap());
    assert_eq!(wait(&nvml, set, 0).unwrap_err(), TIMEOUT);
    // The DBE counted one uncorrected error all the same.
    let mut n = 0u64;
    rc(unsafe {
        nvml.lib()
            .nvmlDeviceGetTotalEccErrors(dev(&nvml, 0), 1, 0, &mut n)
    })
    .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn mig_xid_names_its_instance() {
    let _serial = serial();
    let fake = Fake::new("h100-80gb");
    let nvml = fake.nvml();
    let d = dev(&nvml, 0);
    rc(unsafe { nvml.lib().nvmlDeviceSetMigMode(d, 1, &mut 0) }).unwrap();
    let gi = create_gi(&nvml, d, 19, None).unwrap();
    let (gi_id, ..) = gi_info(&nvml, gi).unwrap();
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    rc(unsafe {
        nvml.lib()
            .nvmlGpuInstanceCreateComputeInstance(gi, 0, &mut ci)
    })
    .unwrap();
    let set = event_set(&nvml);
    rc(unsafe { nvml.lib().nvmlDeviceRegisterEvents(d, EVENT_XID as _, set) }).unwrap();
    // An instance that does not exist is refused.
    let bad = Event {
        gi: Some(gi_id + 1),
        ..xid(0, 43)
    };
    assert_eq!(health::raise_event(&fake.state, bad).unwrap(), 6);
    let ev = Event {
        gi: Some(gi_id),
        ci: Some(0),
        ..xid(0, 43)
    };
    assert_eq!(health::raise_event(&fake.state, ev).unwrap(), 0);
    let got = wait(&nvml, set, 1000).unwrap();
    assert_eq!((got.gpuInstanceId, got.computeInstanceId), (gi_id, 0));
    assert_eq!(got.eventData, 43);
}

#[test]
fn unsupported_types_and_mig_handles_are_refused() {
    let _serial = serial();
    let fake = Fake::new("h100-80gb");
    fake_nvml::health::set_health(&fake.state, 0, |h| h.supported_events = Some(EVENT_XID))
        .unwrap();
    let nvml = fake.nvml();
    let d = dev(&nvml, 0);
    let mut types = 0u64;
    rc(unsafe { nvml.lib().nvmlDeviceGetSupportedEventTypes(d, &mut types) }).unwrap();
    assert_eq!(types, EVENT_XID);
    let set = event_set(&nvml);
    let both = (EVENT_XID | EVENT_DOUBLE_BIT_ECC) as _;
    assert_eq!(
        rc(unsafe { nvml.lib().nvmlDeviceRegisterEvents(d, both, set) }),
        Err(NOT_SUPPORTED)
    );
    // Nothing was registered by the refused call.
    health::raise_event(&fake.state, xid(0, 79)).unwrap();
    assert_eq!(wait(&nvml, set, 0).unwrap_err(), TIMEOUT);
}

#[test]
fn counters_follow_the_state_and_the_generation() {
    let _serial = serial();
    let fake = Fake::new("a100-40gb,h100-80gb");
    health::set_health(&fake.state, 0, |h| {
        h.remap_pending = true;
        h.remapped_uncorrectable = 2;
        h.clocks_event_reasons = 0x8 | 0x40;
    })
    .unwrap();
    health::set_health(&fake.state, 1, |h| {
        h.page_retirement = true;
        h.retired_pages_pending = true;
        h.ecc_disabled = true;
    })
    .unwrap();
    let nvml = fake.nvml();
    let lib = nvml.lib();
    let (a, h) = (dev(&nvml, 0), dev(&nvml, 1));
    let (mut c, mut u, mut p, mut f) = (0u32, 0u32, 0u32, 0u32);
    rc(unsafe { lib.nvmlDeviceGetRemappedRows(a, &mut c, &mut u, &mut p, &mut f) }).unwrap();
    assert_eq!((c, u, p, f), (0, 2, 1, 0));
    assert_eq!(
        rc(unsafe { lib.nvmlDeviceGetRemappedRows(h, &mut c, &mut u, &mut p, &mut f) }),
        Err(NOT_SUPPORTED)
    );
    let mut pending = 0;
    assert_eq!(
        rc(unsafe { lib.nvmlDeviceGetRetiredPagesPendingStatus(a, &mut pending) }),
        Err(NOT_SUPPORTED)
    );
    rc(unsafe { lib.nvmlDeviceGetRetiredPagesPendingStatus(h, &mut pending) }).unwrap();
    assert_eq!(pending, 1);
    let mut reasons = 0u64;
    rc(unsafe { lib.nvmlDeviceGetCurrentClocksEventReasons(a, &mut reasons) }).unwrap();
    assert_eq!(reasons, 0x48);
    let mut n = 0u64;
    assert_eq!(
        rc(unsafe { lib.nvmlDeviceGetTotalEccErrors(h, 1, 1, &mut n) }),
        Err(NOT_SUPPORTED)
    );
}

#[test]
fn a_lost_gpu_answers_gpu_is_lost() {
    let _serial = serial();
    let fake = Fake::new("h100-80gb*2");
    let nvml = fake.nvml();
    let set = event_set(&nvml);
    let d1 = dev(&nvml, 1);
    rc(unsafe { nvml.lib().nvmlDeviceRegisterEvents(d1, EVENT_XID as _, set) }).unwrap();
    health::raise_event(&fake.state, xid(1, 79)).unwrap();
    health::set_health(&fake.state, 1, |h| h.lost = true).unwrap();
    // The event raised before the loss is still delivered, then the loss is reported.
    assert_eq!(wait(&nvml, set, 0).unwrap().eventData, 79);
    assert_eq!(wait(&nvml, set, 0).unwrap_err(), GPU_IS_LOST);
    let mut n = 0u64;
    assert_eq!(
        rc(unsafe { nvml.lib().nvmlDeviceGetTotalEccErrors(d1, 1, 0, &mut n) }),
        Err(GPU_IS_LOST)
    );
    rc(unsafe {
        nvml.lib()
            .nvmlDeviceGetTotalEccErrors(dev(&nvml, 0), 1, 0, &mut n)
    })
    .unwrap();
}

#[test]
fn old_events_are_dropped_but_numbers_stay() {
    let _serial = serial();
    let fake = Fake::new("l40s");
    let nvml = fake.nvml();
    let set = event_set(&nvml);
    rc(unsafe {
        nvml.lib()
            .nvmlDeviceRegisterEvents(dev(&nvml, 0), EVENT_XID as _, set)
    })
    .unwrap();
    let n = health::MAX_EVENTS as u64 + 4;
    fake.edit(|st| st.health.events.extend((0..n).map(|i| xid(0, i))));
    health::raise_event(&fake.state, xid(0, n)).unwrap();
    let st = fake.read();
    assert_eq!(st.health.events.len(), health::MAX_EVENTS);
    assert_eq!(st.health.dropped, 5);
    assert_eq!(wait(&nvml, set, 0).unwrap().eventData, 5);
    assert_eq!(wait(&nvml, set, 0).unwrap().eventData, 6);
}

#[test]
fn a_wait_sleeps_until_the_state_changes() {
    let _serial = serial();
    let fake = Fake::new("h100-80gb");
    let nvml = fake.nvml();
    let set = event_set(&nvml);
    rc(unsafe {
        nvml.lib()
            .nvmlDeviceRegisterEvents(dev(&nvml, 0), EVENT_XID as _, set)
    })
    .unwrap();
    let lib = unsafe { libloading::Library::new(lib_path()).unwrap() };
    let queries: libloading::Symbol<unsafe extern "C" fn(*mut u64) -> u32> =
        unsafe { lib.get(b"fakeNvmlQueryCallCount").unwrap() };
    let count = || {
        let mut n = 0u64;
        assert_eq!(unsafe { queries(&mut n) }, 0);
        n
    };
    // Nothing changes: a look at the start and at the end, none while asleep (a 20 ms poll
    // would make 20; a spurious inotify wake from the state file's own write may add one).
    let q0 = count();
    assert_eq!(wait(&nvml, set, 400).unwrap_err(), TIMEOUT);
    assert!(count() - q0 <= 5, "{} looks in 400 ms", count() - q0);
    // A change wakes it well before the timeout.
    let state = fake.state.clone();
    let raiser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        health::raise_event(&state, xid(0, 79)).unwrap();
    });
    let t = Instant::now();
    assert_eq!(wait(&nvml, set, 5000).unwrap().eventData, 79);
    assert!(
        t.elapsed() < Duration::from_millis(2000),
        "{:?}",
        t.elapsed()
    );
    raiser.join().unwrap();
}

/// nvidia-smi(1): a reset is refused while another client has the GPU open; through the
/// library a caller has open, "another" is any second `nvmlInit` of the process. A reset
/// carries out a pending remap and zeroes the volatile ECC counts; a lost GPU cannot be reset.
#[test]
fn a_reset_needs_the_callers_nvml_alone_and_clears_what_a_reset_clears() {
    let _serial = serial();
    let fake = Fake::new("h100-80gb*2");
    health::set_health(&fake.state, 0, |h| {
        h.remap_pending = true;
        h.ecc_uncorrected_volatile = 3;
        h.ecc_uncorrected_aggregate = 3;
    })
    .unwrap();
    health::set_health(&fake.state, 1, |h| h.lost = true).unwrap();
    let nvml = fake.nvml();
    // SAFETY: loading our own library; the signature matches src/control.rs.
    let lib = unsafe { libloading::Library::new(lib_path()).unwrap() };
    let reset: libloading::Symbol<unsafe extern "C" fn(u32) -> u32> =
        unsafe { lib.get(b"fakeNvmlResetGpu").unwrap() };
    let other = fake.nvml();
    assert_eq!(
        unsafe { reset(0) },
        19,
        "IN_USE while a second client is open"
    );
    drop(other);
    assert_eq!(unsafe { reset(0) }, 0);
    assert_eq!(unsafe { reset(1) }, GPU_IS_LOST);
    let a = dev(&nvml, 0);
    let (mut c, mut u, mut p, mut f) = (0u32, 0u32, 0u32, 0u32);
    rc(unsafe {
        nvml.lib()
            .nvmlDeviceGetRemappedRows(a, &mut c, &mut u, &mut p, &mut f)
    })
    .unwrap();
    assert_eq!((u, p, f), (1, 0, 0), "the pending remap was carried out");
    let (mut vol, mut agg) = (0u64, 0u64);
    rc(unsafe { nvml.lib().nvmlDeviceGetTotalEccErrors(a, 1, 0, &mut vol) }).unwrap();
    rc(unsafe { nvml.lib().nvmlDeviceGetTotalEccErrors(a, 1, 1, &mut agg) }).unwrap();
    assert_eq!(
        (vol, agg),
        (0, 3),
        "volatile counts start again, lifetime ones stay"
    );
}
