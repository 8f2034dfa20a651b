//! Device enumeration, init semantics, cross-process sharing and mig-minors, driven through
//! the real nvml-wrapper.

mod common;

use common::*;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::NvmlLib;
use std::collections::HashSet;

#[test]
fn enumerates_devices_from_spec() {
    let fake = Fake::new("h100-80gb*2,a100-40gb,l40s");
    let nvml = fake.nvml();
    assert_eq!(nvml.device_count().unwrap(), 4);
    assert_eq!(nvml.sys_driver_version().unwrap(), "550.54.15");
    let mut uuids = HashSet::new();
    let expect = [
        ("NVIDIA H100 80GB HBM3", 81559u64),
        ("NVIDIA H100 80GB HBM3", 81559),
        ("NVIDIA A100-SXM4-40GB", 40960),
        ("NVIDIA L40S", 46068),
    ];
    for (i, (name, mib)) in expect.iter().enumerate() {
        let d = nvml.device_by_index(i as u32).unwrap();
        assert_eq!(d.name().unwrap(), *name);
        assert_eq!(d.minor_number().unwrap(), i as u32);
        let mem = d.memory_info().unwrap();
        assert_eq!(mem.total, mib * 1024 * 1024);
        assert_eq!(mem.used, 0);
        assert_eq!(mem.free, mem.total);
        let uuid = d.uuid().unwrap();
        assert!(uuid.starts_with("GPU-") && uuid.len() == 40, "{uuid}");
        assert!(uuids.insert(uuid.clone()), "duplicate uuid {uuid}");
        let by_uuid = nvml.device_by_uuid(uuid.as_str()).unwrap();
        assert_eq!(by_uuid.index().unwrap(), i as u32);
        let pci = d.pci_info().unwrap();
        assert_eq!(pci.bus_id, format!("00000000:{:02X}:00.0", 0x10 + 0x10 * i));
        assert_eq!(
            nvml.device_by_pci_bus_id(pci.bus_id.as_str())
                .unwrap()
                .index()
                .unwrap(),
            i as u32
        );
    }
    assert_eq!(
        nvml.device_by_index(0)
            .unwrap()
            .pci_info()
            .unwrap()
            .pci_device_id,
        0x2330_10DE
    );
    assert!(matches!(
        nvml.device_by_index(4),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        nvml.device_by_uuid("GPU-nope"),
        Err(NvmlError::NotFound)
    ));
}

#[test]
fn hand_written_state_file_is_accepted_and_normalized() {
    let fake = Fake::new("");
    std::fs::write(
        &fake.state,
        r#"{"gpus":[{"model":"A30"},{"model":"H200-141GB","minor":5}]}"#,
    )
    .unwrap();
    let nvml = fake.nvml();
    assert_eq!(nvml.device_count().unwrap(), 2);
    assert_eq!(
        nvml.device_by_index(0).unwrap().name().unwrap(),
        "NVIDIA A30"
    );
    assert_eq!(nvml.device_by_index(1).unwrap().minor_number().unwrap(), 5);
    // Model keys are canonicalized when the state is next written.
    fake.edit(|_| {});
    assert_eq!(fake.read().gpus[0].model, "A30-24GB");
}

#[test]
fn missing_state_without_spec_is_driver_not_loaded_and_bad_model_is_unknown() {
    let fake = Fake::new("");
    std::env::remove_var("FAKE_NVML_SPEC");
    let r = Nvml::builder().lib_path(lib_path().as_os_str()).init();
    assert!(matches!(r, Err(NvmlError::DriverNotLoaded)), "{r:?}");
    std::fs::write(&fake.state, r#"{"gpus":[{"model":"RTX-PRO-5000"}]}"#).unwrap();
    let r = Nvml::builder().lib_path(lib_path().as_os_str()).init();
    assert!(matches!(r, Err(NvmlError::Unknown)), "{r:?}");
}

#[test]
fn calls_before_init_and_after_shutdown_are_uninitialized() {
    let fake = Fake::new("h100-80gb");
    // SAFETY: loading our own library; symbols exist (checked by the calls' results).
    let lib = unsafe { NvmlLib::new(lib_path()) }.unwrap();
    let mut n = 0u32;
    // SAFETY: n is a valid out-pointer.
    assert_eq!(unsafe { lib.nvmlDeviceGetCount_v2(&mut n) }, UNINITIALIZED);
    assert_eq!(unsafe { lib.nvmlShutdown() }, UNINITIALIZED);
    let nvml = fake.nvml();
    // SAFETY: as above.
    assert_eq!(unsafe { lib.nvmlDeviceGetCount_v2(&mut n) }, SUCCESS);
    assert_eq!(n, 1);
    nvml.shutdown().unwrap();
    assert_eq!(unsafe { lib.nvmlDeviceGetCount_v2(&mut n) }, UNINITIALIZED);
    // SAFETY: static string from the library.
    let s = unsafe { std::ffi::CStr::from_ptr(lib.nvmlErrorString(IN_USE)) };
    assert_eq!(s.to_str().unwrap(), "In use by another client");
}

#[test]
fn unmodelled_functions_answer_not_supported() {
    let fake = Fake::new("h100-80gb");
    let nvml = fake.nvml();
    let d = nvml.device_by_index(0).unwrap();
    // Temperature, power and utilisation are modelled now (src/usage.rs); fan speed is not.
    assert!(matches!(d.fan_speed_rpm(0), Err(NvmlError::NotSupported)));
}

#[test]
fn mig_minors_written_in_driver_layout() {
    let fake = Fake::new("h100-80gb*2");
    let _nvml = fake.nvml();
    let text =
        std::fs::read_to_string(fake.root.join("proc/driver/nvidia-caps/mig-minors")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        &lines[..4],
        [
            "config 1",
            "monitor 2",
            "gpu0/gi0/access 3",
            "gpu0/gi0/ci0/access 4"
        ]
    );
    // gpu1/gi7/ci2: 3 + 135*1 + 9*7 + 1 + 2
    assert!(
        lines.contains(&"gpu1/gi7/ci2/access 204"),
        "gpu1 gi7 ci2 numbering"
    );
    assert!(lines.contains(&"gpu31/gi14/ci7/access 4322"));
    assert_eq!(lines.len(), 2 + 32 * 135);
}

/// Helper run in a child process by `second_process_shares_state`.
#[test]
#[ignore = "run by second_process_shares_state"]
fn child_creates_gpu_instance() {
    if std::env::var_os("FAKE_NVML_CHILD").is_none() {
        return;
    }
    let nvml = Nvml::builder()
        .lib_path(lib_path().as_os_str())
        .init()
        .unwrap();
    let d = dev(&nvml, 0);
    let gi = create_gi(&nvml, d, 9, Some((4, 4))).unwrap();
    println!("CHILD-GI {}", gi_info(&nvml, gi).unwrap().0);
}

#[test]
fn second_process_shares_state() {
    let fake = Fake::new("h100-80gb");
    let nvml = fake.nvml();
    nvml.device_by_index(0).unwrap().set_mig_mode(true).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_creates_gpu_instance",
            "--include-ignored",
            "--nocapture",
        ])
        .env("FAKE_NVML_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("CHILD-GI 1"), "{stdout}");
    // This process sees the child's GI, and so does a second Nvml instance.
    let d = dev(&nvml, 0);
    let gis = gis_of_profile(&nvml, d, 9, 2).unwrap();
    assert_eq!(gis.len(), 1);
    assert_eq!(gi_info(&nvml, gis[0]).unwrap(), (1, 9, 4, 4));
    let nvml2 = fake.nvml();
    assert_eq!(
        create_gi(&nvml2, dev(&nvml2, 0), 9, Some((4, 4))),
        Err(INSUFFICIENT_RESOURCES)
    );
}

#[test]
fn c_control_exports_act_on_the_current_state() {
    let fake = Fake::new("a100-40gb");
    let nvml = fake.nvml();
    let a100 = nvml.device_by_index(0).unwrap();
    a100.set_mig_mode(true).unwrap();
    // SAFETY: loading our own library; the signatures match src/control.rs.
    unsafe {
        let lib = libloading::Library::new(lib_path()).unwrap();
        let add: libloading::Symbol<unsafe extern "C" fn(u32, u32, u32, u32, u64) -> u32> =
            lib.get(b"fakeNvmlAddProcess").unwrap();
        let remove: libloading::Symbol<unsafe extern "C" fn(u32) -> u32> =
            lib.get(b"fakeNvmlRemoveProcess").unwrap();
        let reset: libloading::Symbol<unsafe extern "C" fn(u32) -> u32> =
            lib.get(b"fakeNvmlResetGpu").unwrap();
        let calls: libloading::Symbol<unsafe extern "C" fn(*mut u64) -> u32> =
            lib.get(b"fakeNvmlMutatingCallCount").unwrap();
        assert_eq!(add(0, u32::MAX, u32::MAX, 77, 10), SUCCESS);
        assert_eq!(a100.running_compute_processes().unwrap()[0].pid, 77);
        assert_eq!(reset(0), IN_USE);
        assert_eq!(remove(77), SUCCESS);
        assert_eq!(remove(77), NOT_FOUND);
        assert_eq!(reset(0), SUCCESS);
        assert_eq!(reset(1), INVALID_ARGUMENT);
        let mut n = 0u64;
        assert_eq!(calls(&mut n), SUCCESS);
        assert_eq!(n, 1);
        // Queries are counted per process, and only queries.
        let queries: libloading::Symbol<unsafe extern "C" fn(*mut u64) -> u32> =
            lib.get(b"fakeNvmlQueryCallCount").unwrap();
        let (mut q0, mut q1, mut q2) = (0u64, 0u64, 0u64);
        assert_eq!(queries(&mut q0), SUCCESS);
        a100.mig_mode().unwrap();
        a100.running_compute_processes().unwrap();
        assert_eq!(queries(&mut q1), SUCCESS);
        assert!(q1 >= q0 + 2, "{q0} -> {q1}");
        assert_eq!(remove(77), NOT_FOUND);
        assert_eq!(queries(&mut q2), SUCCESS);
        assert_eq!(q2, q1);
        assert_eq!(queries(std::ptr::null_mut()), INVALID_ARGUMENT);
    }
    assert_eq!(a100.mig_mode().unwrap().current, 1);
    let log = fake.log_functions();
    assert_eq!(log.iter().filter(|f| *f == "fakeNvmlResetGpu").count(), 3);
}
