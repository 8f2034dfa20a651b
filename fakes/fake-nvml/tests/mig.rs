//! MIG behaviour through nvml-wrapper and raw nvml-wrapper-sys calls.

mod common;

use common::*;
use fake_nvml::control;
use fake_nvml::state::Process;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::*;

fn enable_mig(nvml: &nvml_wrapper::Nvml, index: u32) {
    nvml.device_by_index(index)
        .unwrap()
        .set_mig_mode(true)
        .unwrap();
}

#[test]
fn hopper_enables_at_once_ampere_stays_pending_until_reset() {
    let fake = Fake::new("h100-80gb,a100-40gb");
    let nvml = fake.nvml();
    let h100 = nvml.device_by_index(0).unwrap();
    assert_eq!(h100.set_mig_mode(true).unwrap(), SUCCESS);
    let m = h100.mig_mode().unwrap();
    assert_eq!((m.current, m.pending), (1, 1));

    let a100 = nvml.device_by_index(1).unwrap();
    assert_eq!(
        a100.set_mig_mode(true).unwrap(),
        IN_USE,
        "activation status"
    );
    let m = a100.mig_mode().unwrap();
    assert_eq!((m.current, m.pending), (0, 1));
    assert!(matches!(a100.profile_info(0), Err(NvmlError::NotSupported)));

    // A reset fails while a process holds the GPU, then applies the pending mode.
    control::add_process(
        &fake.state,
        Process {
            pid: 42,
            gpu: 1,
            gi: None,
            ci: None,
            used_memory_mib: 100,
        },
    )
    .unwrap();
    assert_eq!(control::reset_gpu(&fake.state, 1).unwrap(), IN_USE);
    assert_eq!(a100.mig_mode().unwrap().current, 0);
    control::remove_process(&fake.state, 42).unwrap();
    assert_eq!(control::reset_gpu(&fake.state, 1).unwrap(), SUCCESS);
    let m = a100.mig_mode().unwrap();
    assert_eq!((m.current, m.pending), (1, 1));
    assert_eq!(a100.profile_info(0).unwrap().id, 19);

    // An idle A100 whose inline reset succeeds activates at once.
    fake.edit(|st| st.gpus[1].inline_reset_ok = true);
    assert_eq!(a100.set_mig_mode(false).unwrap(), SUCCESS);
    assert_eq!(a100.mig_mode().unwrap().current, 0);
}

#[test]
fn non_mig_model_and_mig_off_are_not_supported() {
    let fake = Fake::new("l40s,h100-80gb");
    let nvml = fake.nvml();
    let l40s = nvml.device_by_index(0).unwrap();
    assert!(matches!(l40s.mig_mode(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        l40s.set_mig_mode(true),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        l40s.mig_device_count(),
        Err(NvmlError::NotSupported)
    ));
    let h100 = dev(&nvml, 1);
    assert!(matches!(
        nvml.device_by_index(1).unwrap().profile_info(0),
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(create_gi(&nvml, h100, 19, None), Err(NOT_SUPPORTED));
    assert_eq!(gi_placements(&nvml, h100, 19), Err(NOT_SUPPORTED));
    let mut gi = std::ptr::null_mut();
    // SAFETY: gi is a valid out-pointer.
    assert_eq!(
        unsafe { nvml.lib().nvmlDeviceGetGpuInstanceById(h100, 0, &mut gi) },
        NOT_SUPPORTED
    );
}

#[test]
fn profile_index_is_not_profile_id() {
    let fake = Fake::new("a100-40gb,a30");
    let nvml = fake.nvml();
    fake.edit(|st| {
        st.gpus.iter_mut().for_each(|g| {
            g.mig = fake_nvml::state::MigMode {
                current: 1,
                pending: 1,
            }
        })
    });
    let a100 = nvml.device_by_index(0).unwrap();
    let p = a100
        .profile_info(NVML_GPU_INSTANCE_PROFILE_1_SLICE)
        .unwrap();
    assert_eq!(
        (p.id, p.slice_count, p.instance_count, p.memory_size_mb),
        (19, 1, 7, 4864)
    );
    assert_eq!(
        a100.profile_info(NVML_GPU_INSTANCE_PROFILE_7_SLICE)
            .unwrap()
            .id,
        0
    );
    assert_eq!(
        a100.profile_info(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2)
            .unwrap()
            .id,
        15
    );
    assert!(matches!(
        a100.profile_info(NVML_GPU_INSTANCE_PROFILE_8_SLICE),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(a100.profile_info(18), Err(NvmlError::InvalidArg)));
    // A30 publishes different IDs for the same index.
    assert_eq!(
        nvml.device_by_index(1).unwrap().profile_info(0).unwrap().id,
        14
    );

    // The V variant checks the version word and fills the name.
    let d = dev(&nvml, 0);
    for version in [0x0200_0098u32, 0x0300_0098] {
        // SAFETY: zeroed POD; v3 has the same size as v2 (152 bytes).
        let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        info.version = version;
        // SAFETY: info is a valid out-pointer of the announced size.
        assert_eq!(
            unsafe {
                nvml.lib()
                    .nvmlDeviceGetGpuInstanceProfileInfoV(d, 2, &mut info)
            },
            SUCCESS
        );
        assert_eq!(info.id, 9);
        // SAFETY: NUL-terminated by the fake.
        let name = unsafe {
            std::ffi::CStr::from_ptr(if version == 0x0200_0098 {
                info.name.as_ptr()
            } else {
                (&info as *const _ as *const u8).add(48).cast()
            })
        };
        assert_eq!(name.to_str().unwrap(), "MIG 3g.20gb");
    }
    // SAFETY: as above.
    let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    info.version = 0x0100_0098;
    assert_eq!(
        unsafe {
            nvml.lib()
                .nvmlDeviceGetGpuInstanceProfileInfoV(d, 2, &mut info)
        },
        ARGUMENT_VERSION_MISMATCH
    );

    // Placements take the profile ID; unknown IDs are invalid arguments.
    assert_eq!(gi_placements(&nvml, d, 9).unwrap(), [(0, 4), (4, 4)]);
    assert_eq!(gi_placements(&nvml, d, 19).unwrap().len(), 7);
    assert_eq!(gi_placements(&nvml, d, 2), Err(INVALID_ARGUMENT));
    // nvml-wrapper's own possible_placements drops the results (Vec::with_capacity, never set_len).
    assert!(a100.possible_placements(19).unwrap().is_empty());
    // A too-small buffer reports the needed count.
    let mut buf = [nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 2];
    let mut count = 2u32;
    // SAFETY: buf holds `count` placements.
    assert_eq!(
        unsafe {
            nvml.lib().nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                d,
                19,
                buf.as_mut_ptr(),
                &mut count,
            )
        },
        INSUFFICIENT_SIZE
    );
    assert_eq!(count, 7);
}

#[test]
fn auto_created_1g_instances_get_driver_ids_until_full() {
    let fake = Fake::new("h100-80gb");
    let nvml = fake.nvml();
    enable_mig(&nvml, 0);
    let d = dev(&nvml, 0);
    assert_eq!(gi_remaining(&nvml, d, 19).unwrap(), 7);
    let mut ids = Vec::new();
    for _ in 0..7 {
        let gi = create_gi(&nvml, d, 19, None).unwrap();
        ids.push(gi_info(&nvml, gi).unwrap().0);
    }
    assert_eq!(ids, [9, 7, 8, 11, 12, 13, 14]);
    assert_eq!(create_gi(&nvml, d, 19, None), Err(INSUFFICIENT_RESOURCES));
    assert_eq!(gi_remaining(&nvml, d, 19).unwrap(), 0);
    assert_eq!(gi_remaining(&nvml, d, 0).unwrap(), 0);
    let listed: Vec<u32> = gis_of_profile(&nvml, d, 19, 7)
        .unwrap()
        .into_iter()
        .map(|g| gi_info(&nvml, g).unwrap().0)
        .collect();
    assert_eq!(listed, [7, 8, 9, 11, 12, 13, 14]);
    let mut gi = std::ptr::null_mut();
    // SAFETY: gi is a valid out-pointer.
    unsafe {
        assert_eq!(
            nvml.lib().nvmlDeviceGetGpuInstanceById(d, 9, &mut gi),
            SUCCESS
        );
        assert_eq!(gi_info(&nvml, gi).unwrap(), (9, 19, 6, 1));
        assert_eq!(
            nvml.lib().nvmlDeviceGetGpuInstanceById(d, 10, &mut gi),
            NOT_FOUND
        );
        assert_eq!(
            nvml.lib().nvmlDeviceGetGpuInstanceById(d, 15, &mut gi),
            INVALID_ARGUMENT
        );
    }
}

#[test]
fn explicit_placements_overlap_and_validity() {
    let fake = Fake::new("a100-80gb");
    let nvml = fake.nvml();
    fake.edit(|st| {
        st.gpus[0].mig = fake_nvml::state::MigMode {
            current: 1,
            pending: 1,
        }
    });
    let d = dev(&nvml, 0);
    let g3 = create_gi(&nvml, d, 9, Some((0, 4))).unwrap();
    assert_eq!(gi_info(&nvml, g3).unwrap(), (2, 9, 0, 4));
    assert_eq!(
        create_gi(&nvml, d, 14, Some((0, 2))),
        Err(INSUFFICIENT_RESOURCES),
        "overlap"
    );
    assert_eq!(
        create_gi(&nvml, d, 14, Some((1, 2))),
        Err(INVALID_ARGUMENT),
        "not a placement"
    );
    assert_eq!(
        create_gi(&nvml, d, 5, Some((0, 4))),
        Err(INSUFFICIENT_RESOURCES)
    );
    let g2 = create_gi(&nvml, d, 14, Some((4, 2))).unwrap();
    assert_eq!(gi_info(&nvml, g2).unwrap(), (3, 14, 4, 2));
    assert_eq!(gi_remaining(&nvml, d, 14).unwrap(), 0);
    assert_eq!(gi_remaining(&nvml, d, 19).unwrap(), 1);
    let g1 = create_gi(&nvml, d, 19, None).unwrap();
    assert_eq!(gi_info(&nvml, g1).unwrap(), (9, 19, 6, 1));
    // Destroyed handles become invalid; the freed placement is reusable.
    destroy_gi(&nvml, g3).unwrap();
    assert_eq!(gi_info(&nvml, g3), Err(INVALID_ARGUMENT));
    assert_eq!(destroy_gi(&nvml, g3), Err(INVALID_ARGUMENT));
    let g4 = create_gi(&nvml, d, 5, Some((0, 4))).unwrap();
    assert_eq!(gi_info(&nvml, g4).unwrap().0, 2);
    // Disabling MIG with instances present fails.
    assert!(matches!(
        nvml.device_by_index(0).unwrap().set_mig_mode(false),
        Err(NvmlError::InUse)
    ));
}

#[test]
fn compute_instances_mig_devices_and_busy_destroys() {
    let fake = Fake::new("a100-40gb");
    let nvml = fake.nvml();
    fake.edit(|st| {
        st.gpus[0].mig = fake_nvml::state::MigMode {
            current: 1,
            pending: 1,
        }
    });
    let d = dev(&nvml, 0);
    let gi = create_gi(&nvml, d, 9, None).unwrap();
    let gi_id = gi_info(&nvml, gi).unwrap().0;
    let p = ci_profile(&nvml, gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE).unwrap();
    assert_eq!((p.id, p.instanceCount, p.multiprocessorCount), (0, 3, 14));
    assert_eq!(
        ci_profile(&nvml, gi, NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE).unwrap_err(),
        NOT_SUPPORTED
    );
    assert_eq!(ci_profile(&nvml, gi, 9).unwrap_err(), INVALID_ARGUMENT);

    let cis: Vec<_> = (0..3)
        .map(|_| create_ci(&nvml, gi, 0, None).unwrap())
        .collect();
    let infos: Vec<_> = cis.iter().map(|c| ci_info(&nvml, *c).unwrap()).collect();
    assert_eq!(infos, [(0, 0, 0, 1), (1, 0, 1, 1), (2, 0, 2, 1)]);
    assert_eq!(create_ci(&nvml, gi, 0, None), Err(INSUFFICIENT_RESOURCES));
    assert_eq!(
        create_ci(&nvml, gi, 1, Some((0, 2))),
        Err(INSUFFICIENT_RESOURCES)
    );
    assert_eq!(create_ci(&nvml, gi, 7, None), Err(INVALID_ARGUMENT));

    // MIG devices through nvml-wrapper.
    let parent = nvml.device_by_index(0).unwrap();
    assert_eq!(parent.mig_device_count().unwrap(), 7);
    assert!(!parent.mig_is_mig_device_handle().unwrap());
    let mut mig_uuids = Vec::new();
    for i in 0..3 {
        let m = parent.mig_device_by_index(i).unwrap();
        assert!(m.mig_is_mig_device_handle().unwrap());
        let uuid = m.uuid().unwrap();
        assert!(uuid.starts_with("MIG-") && uuid.len() == 40, "{uuid}");
        assert_eq!(m.name().unwrap(), "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb");
        assert_eq!(m.memory_info().unwrap().total, 19968 * 1024 * 1024);
        // SAFETY: raw calls on a live MIG handle with valid out-pointers.
        unsafe {
            let (mut g, mut c) = (0, 0);
            assert_eq!(
                nvml.lib().nvmlDeviceGetGpuInstanceId(m.handle(), &mut g),
                SUCCESS
            );
            assert_eq!(
                nvml.lib()
                    .nvmlDeviceGetComputeInstanceId(m.handle(), &mut c),
                SUCCESS
            );
            assert_eq!((g, c), (gi_id, i));
            let mut up = std::ptr::null_mut();
            assert_eq!(
                nvml.lib()
                    .nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m.handle(), &mut up),
                SUCCESS
            );
            assert_eq!(up, d);
        }
        assert_eq!(
            nvml.device_by_uuid(uuid.as_str()).unwrap().uuid().unwrap(),
            uuid
        );
        mig_uuids.push(uuid);
    }
    assert!(matches!(
        parent.mig_device_by_index(3),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        parent.mig_device_by_index(7),
        Err(NvmlError::InvalidArg)
    ));
    let mut id = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(
        unsafe { nvml.lib().nvmlDeviceGetGpuInstanceId(d, &mut id) },
        NOT_SUPPORTED
    );

    // A process in CI 1 blocks destroying that CI and the GI, not the other CIs.
    control::add_process(
        &fake.state,
        Process {
            pid: 4242,
            gpu: 0,
            gi: Some(gi_id),
            ci: Some(1),
            used_memory_mib: 512,
        },
    )
    .unwrap();
    let procs = parent.running_compute_processes().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(
        (
            procs[0].pid,
            procs[0].gpu_instance_id,
            procs[0].compute_instance_id
        ),
        (4242, Some(gi_id), Some(1))
    );
    let m1 = parent.mig_device_by_index(1).unwrap();
    assert_eq!(m1.running_compute_processes().unwrap().len(), 1);
    assert!(parent
        .mig_device_by_index(0)
        .unwrap()
        .running_compute_processes()
        .unwrap()
        .is_empty());
    assert_eq!(destroy_ci(&nvml, cis[1]), Err(IN_USE));
    assert_eq!(destroy_gi(&nvml, gi), Err(IN_USE));
    destroy_ci(&nvml, cis[0]).unwrap();
    destroy_ci(&nvml, cis[2]).unwrap();
    assert_eq!(destroy_gi(&nvml, gi), Err(IN_USE), "child CI left");
    control::remove_process(&fake.state, 4242).unwrap();
    destroy_ci(&nvml, cis[1]).unwrap();
    destroy_gi(&nvml, gi).unwrap();
    assert_eq!(ci_info(&nvml, cis[1]), Err(INVALID_ARGUMENT));
    // A re-created instance gets a fresh MIG UUID.
    let gi = create_gi(&nvml, d, 9, None).unwrap();
    create_ci(&nvml, gi, 2, None).unwrap();
    let uuid = parent.mig_device_by_index(0).unwrap().uuid().unwrap();
    assert!(!mig_uuids.contains(&uuid));
}

#[test]
fn process_list_count_query_and_non_mig_ids() {
    let fake = Fake::new("l40s");
    let nvml = fake.nvml();
    for pid in [10, 11, 12] {
        control::add_process(
            &fake.state,
            Process {
                pid,
                gpu: 0,
                gi: None,
                ci: None,
                used_memory_mib: 1000,
            },
        )
        .unwrap();
    }
    let d = nvml.device_by_index(0).unwrap();
    let procs = d.running_compute_processes().unwrap();
    assert_eq!(
        procs.iter().map(|p| p.pid).collect::<Vec<_>>(),
        [10, 11, 12]
    );
    assert!(procs
        .iter()
        .all(|p| p.gpu_instance_id.is_none() && p.compute_instance_id.is_none()));
    assert_eq!(d.memory_info().unwrap().used, 3000 * 1024 * 1024);
    let raw = dev(&nvml, 0);
    let mut count = 0;
    // SAFETY: count query with NULL array, then a 1-element buffer.
    unsafe {
        assert_eq!(
            nvml.lib().nvmlDeviceGetComputeRunningProcesses_v3(
                raw,
                &mut count,
                std::ptr::null_mut()
            ),
            INSUFFICIENT_SIZE
        );
        assert_eq!(count, 3);
        let mut one: [nvmlProcessInfo_t; 1] = std::mem::zeroed();
        count = 1;
        assert_eq!(
            nvml.lib()
                .nvmlDeviceGetComputeRunningProcesses_v3(raw, &mut count, one.as_mut_ptr()),
            INSUFFICIENT_SIZE
        );
        assert_eq!(count, 3);
        let mut three: [nvmlProcessInfo_t; 3] = std::mem::zeroed();
        count = 3;
        assert_eq!(
            nvml.lib()
                .nvmlDeviceGetComputeRunningProcesses_v3(raw, &mut count, three.as_mut_ptr()),
            SUCCESS
        );
        assert_eq!((three[2].pid, three[2].gpuInstanceId), (12, 0xFFFF_FFFF));
    }
    // Processes naming a missing CI are rejected.
    let r = control::add_process(
        &fake.state,
        Process {
            pid: 1,
            gpu: 0,
            gi: Some(1),
            ci: Some(0),
            used_memory_mib: 0,
        },
    )
    .unwrap();
    assert_eq!(r, NOT_FOUND);
}

#[test]
fn named_function_fault_from_env_fails_without_changing_state() {
    let fake = Fake::new("h100-80gb");
    let nvml = fake.nvml();
    enable_mig(&nvml, 0);
    std::env::set_var(
        "FAKE_NVML_FAIL",
        "nvmlDeviceCreateGpuInstanceWithPlacement:NVML_ERROR_UNKNOWN",
    );
    let d = dev(&nvml, 0);
    assert_eq!(create_gi(&nvml, d, 19, Some((0, 1))), Err(UNKNOWN));
    assert!(fake.read().gpus[0].gpu_instances.is_empty());
    // Other functions are unaffected.
    create_gi(&nvml, d, 19, None).unwrap();
    std::env::remove_var("FAKE_NVML_FAIL");
    create_gi(&nvml, d, 19, Some((0, 1))).unwrap();
    let log = fake.read().call_log;
    let results: Vec<(&str, &str)> = log
        .iter()
        .map(|r| (r.function.as_str(), r.result.as_str()))
        .collect();
    assert_eq!(
        results,
        [
            ("nvmlDeviceSetMigMode", "NVML_SUCCESS"),
            (
                "nvmlDeviceCreateGpuInstanceWithPlacement",
                "NVML_ERROR_UNKNOWN"
            ),
            ("nvmlDeviceCreateGpuInstance", "NVML_SUCCESS"),
            ("nvmlDeviceCreateGpuInstanceWithPlacement", "NVML_SUCCESS"),
        ]
    );
    assert_eq!(log[3].args["placement"]["start"], 0);
    assert_eq!(log[3].args["gpuInstanceId"], 11);
}

#[test]
fn a_fail_once_fault_fails_the_next_call_of_that_function_only() {
    let fake = Fake::new("h100-80gb");
    let nvml = fake.nvml();
    enable_mig(&nvml, 0);
    let d = dev(&nvml, 0);
    control::update(&fake.state, |st| {
        st.faults.fail_once.insert(
            "nvmlDeviceCreateGpuInstanceWithPlacement".into(),
            "NVML_ERROR_INSUFFICIENT_RESOURCES".into(),
        );
    })
    .unwrap();
    // Another function first: not its fault.
    create_gi(&nvml, d, 19, None).unwrap();
    assert_eq!(
        create_gi(&nvml, d, 19, Some((1, 1))),
        Err(fake_nvml::types::NVML_ERROR_INSUFFICIENT_RESOURCES)
    );
    create_gi(&nvml, d, 19, Some((1, 1))).unwrap();
    let st = fake.read();
    assert!(st.faults.fail_once.is_empty());
    assert_eq!(st.gpus[0].gpu_instances.len(), 2);
}

#[test]
fn nth_mutating_call_fault_counts_persistently() {
    let fake = Fake::new("h100-80gb");
    let nvml = fake.nvml();
    enable_mig(&nvml, 0); // mutating call 1
    let d = dev(&nvml, 0);
    std::env::set_var("FAKE_NVML_FAIL_AT", "3:NVML_ERROR_IN_USE");
    create_gi(&nvml, d, 19, None).unwrap(); // 2
    gi_remaining(&nvml, d, 19).unwrap(); // reads do not count
    assert_eq!(create_gi(&nvml, d, 19, None), Err(IN_USE)); // 3
    create_gi(&nvml, d, 19, None).unwrap(); // 4
    std::env::remove_var("FAKE_NVML_FAIL_AT");
    assert_eq!(fake.read().mutating_calls, 4);

    // Relative arming through the control API, counted across Nvml instances.
    let armed =
        control::fail_nth_mutating_call(&fake.state, 2, fake_nvml::types::NVML_ERROR_UNKNOWN)
            .unwrap();
    assert_eq!(armed, 6);
    let nvml2 = fake.nvml();
    let d2 = dev(&nvml2, 0);
    create_gi(&nvml2, d2, 19, None).unwrap(); // 5
    assert_eq!(create_gi(&nvml, d, 19, None), Err(UNKNOWN)); // 6
    create_gi(&nvml, d, 19, None).unwrap(); // 7
    let st = fake.read();
    assert_eq!(st.gpus[0].gpu_instances.len(), 4);
    let creates = st
        .call_log
        .iter()
        .filter(|r| r.function == "nvmlDeviceCreateGpuInstance")
        .count();
    assert_eq!(creates, 6);

    // A named fault stored in the state applies to destroys too, until cleared.
    control::set_function_fault(
        &fake.state,
        "nvmlGpuInstanceDestroy",
        fake_nvml::types::NVML_ERROR_UNKNOWN,
    )
    .unwrap();
    let gi = gis_of_profile(&nvml, d, 19, 7).unwrap()[0];
    assert_eq!(destroy_gi(&nvml, gi), Err(UNKNOWN));
    control::clear_faults(&fake.state).unwrap();
    destroy_gi(&nvml, gi).unwrap();
}

#[test]
fn reboot_drops_instances_and_processes_and_applies_pending() {
    let fake = Fake::new("a100-40gb,h100-80gb");
    let nvml = fake.nvml();
    enable_mig(&nvml, 0); // pending on A100
    enable_mig(&nvml, 1);
    let d = dev(&nvml, 1);
    let gi = create_gi(&nvml, d, 0, None).unwrap();
    create_ci(&nvml, gi, 4, None).unwrap();
    control::reboot(&fake.state).unwrap();
    assert_eq!(
        nvml.device_by_index(0).unwrap().mig_mode().unwrap().current,
        1
    );
    assert!(gis_of_profile(&nvml, d, 0, 1).unwrap().is_empty());
    assert_eq!(gi_info(&nvml, gi), Err(INVALID_ARGUMENT));
}
