//! Pure conversions between [`SliceSpec`] and systemd's representations: D-Bus property lists
//! for `SetUnitProperties`, the values read back from the `Slice` interface, and `[Slice]`
//! unit-file text for the generator. No I/O here, so every encoding is unit-tested.

use crate::observe::SliceSpec;
use std::collections::HashMap;
use std::fmt::Write as _;
use zbus::zvariant::{OwnedValue, Value};

pub use crate::settings::UNSET;

/// Access of every `DeviceAllow=` entry of a team slice: read, write and mknod. The one place
/// the grant is spelled: the bus assignment, the read-back and the generator's unit file use it.
///
/// `m` too: a container engine creates the team's nodes in the container's `/dev` with mknod
/// from inside the slice (podman's `--cgroup-parent`, docs/containers.md), and the cgroup device
/// filter checks mknod as well: with `rw` crun fails with `mknod /dev/nvidia-uvm: Operation not
/// permitted`. `m` grants nothing beyond the node's own read and write.
pub const DEVICE_ACCESS: &str = "rwm";

/// The properties of the `Slice` D-Bus interface by name, as `GetAll` returns them.
pub type RawSlice = HashMap<String, OwnedValue>;

/// The unit name of a team's slice: `gpu-<team>.slice` (a child of `gpu.slice`, because systemd
/// nests slices by their dash-separated prefix).
pub fn slice_unit(team: &str) -> String {
    format!("gpu-{team}.slice")
}

/// The team of a `gpu-<team>.slice` unit name, `None` for any other name (including deeper
/// slices such as `gpu-infer-0.slice`, which belong to MPS daemons).
pub fn team_of_slice(unit: &str) -> Option<crate::policy::TeamName> {
    unit.strip_prefix("gpu-")?
        .strip_suffix(".slice")?
        .parse()
        .ok()
}

/// The cgroup directory of a team slice, relative to the cgroup2 mount.
pub fn slice_cgroup(team: &str) -> String {
    format!("gpu.slice/gpu-{team}.slice")
}

/// The `SetUnitProperties` list that makes a live slice hold exactly `spec`.
///
/// Every managed property is sent, `None` as systemd's "unset", so a limit removed from the
/// policy is removed from the unit too. `DeviceAllow` is sent twice: systemd *appends* the
/// entries of a `DeviceAllow` assignment to the unit's list and only an empty array clears it,
/// so the empty array comes first and the wanted list second, in one call (systemd applies the
/// assignments in order, and writes the resulting full list, led by a reset line, to the
/// drop-in).
pub fn slice_properties(
    team: &str,
    spec: &SliceSpec,
) -> Result<Vec<(&'static str, Value<'static>)>, String> {
    // The planner writes a placeholder where a MIG device's cap node is not known yet (the
    // instance is new, or its minor is missing from mig-minors); systemd answers such an entry
    // only with "requires device node or pattern", so name it and what to look at instead.
    if let Some(p) = spec.device_allow.iter().find(|p| !p.starts_with("/dev/")) {
        return Err(format!(
            "DeviceAllow {p:?} is not a device node: a MIG device's cap node is unknown \
             (is {} readable by gpuctld?)",
            crate::paths::MIG_MINORS
        ));
    }
    let devices: Vec<(String, String)> = spec
        .device_allow
        .iter()
        .map(|p| (p.clone(), DEVICE_ACCESS.to_string()))
        .collect();
    let mut props = vec![("Description", Value::from(format!("gpuctl team {team}")))];
    props.extend(spec.bus_properties());
    props.extend([
        ("DevicePolicy", Value::from("closed")),
        ("DeviceAllow", Value::from(Vec::<(String, String)>::new())),
        ("DeviceAllow", Value::from(devices)),
    ]);
    Ok(props)
}

/// The `SetUnitProperties` list that takes a slice holding `live` (as read back, so under
/// gpuctl's device control) to `spec`: only the settings that differ, and the device list only
/// when it differs. Without `live`, [`slice_properties`].
///
/// Why not always the full list: systemd writes a drop-in per assignment and, for any
/// `DeviceAllow` assignment, compiles and attaches a new BPF device program. A limit-only
/// policy change sent in full took 1.9× a hand `set-property` in VM 59 (issue 14).
pub fn slice_property_changes(
    team: &str,
    spec: &SliceSpec,
    live: Option<&SliceSpec>,
) -> Result<Vec<(&'static str, Value<'static>)>, String> {
    let Some(live) = live else {
        return slice_properties(team, spec);
    };
    let mut props = spec.bus_changes(live);
    if spec.device_allow != live.device_allow {
        // The full call checks the device list; take its device assignments (reset, list).
        let full = slice_properties(team, spec)?;
        props.extend(full.into_iter().filter(|(k, _)| *k == "DeviceAllow"));
    }
    Ok(props)
}

/// Turn live values back into a [`SliceSpec`], so the planner compares like with like.
///
/// Returns `None` when the slice is not under gpuctl's device control (`DevicePolicy` is not
/// `closed`): such a slice cannot be described by a `SliceSpec`, and planning a `SetSlice` for it
/// is exactly what should happen.
pub fn spec_from_raw(raw: &RawSlice) -> Option<SliceSpec> {
    let get = |name: &str| raw.get(name).map(|v| &**v);
    if get("DevicePolicy").and_then(|v| <&str>::try_from(v).ok()) != Some("closed") {
        return None;
    }
    let devices = get("DeviceAllow")
        .and_then(|v| Vec::<(String, String)>::try_from(v.try_clone().ok()?).ok())
        .unwrap_or_default();
    Some(SliceSpec {
        // A full grant ([`DEVICE_ACCESS`]) reads back as its path, as the planner wants it; any
        // other (a hand-added `rw`, or the `rw` of versions before containers needed `m`) as
        // `<path> <access>`, which no wanted spec holds: the planner sets the slice again and
        // the drift line names it (`DeviceAllow +/dev/nvidia1 rw`). Left out instead, a
        // narrower grant of a foreign node would be invisible to drift repair.
        device_allow: devices
            .into_iter()
            .map(|(p, acc)| {
                if DEVICE_ACCESS.chars().all(|c| acc.contains(c)) {
                    p
                } else {
                    format!("{p} {acc}")
                }
            })
            .collect(),
        ..SliceSpec::from_bus(get)
    })
}
/// The `SetUnitProperties` list that gives a slice outside the team shares exactly `fence`:
/// its `DevicePolicy`, then the reset and the list of `DeviceAllow` (which appends otherwise,
/// as for team slices), every entry with [`DEVICE_ACCESS`].
pub fn fence_properties(fence: &crate::observe::Fence) -> Vec<(&'static str, Value<'static>)> {
    let entries: Vec<(String, String)> = fence
        .allow
        .iter()
        .map(|e| (e.clone(), DEVICE_ACCESS.to_string()))
        .collect();
    let mut props = vec![
        ("DevicePolicy", Value::from(fence.policy.clone())),
        ("DeviceAllow", Value::from(Vec::<(String, String)>::new())),
    ];
    if !entries.is_empty() {
        props.push(("DeviceAllow", Value::from(entries)));
    }
    props
}

/// The fence of a slice as read back: `DevicePolicy` and the `DeviceAllow` entries, a grant
/// other than [`DEVICE_ACCESS`] as `<entry> <access>` (as for team slices, so a hand change
/// shows as a difference). A property that cannot be read is systemd's default.
pub fn fence_from_raw(raw: &RawSlice) -> crate::observe::Fence {
    let get = |name: &str| raw.get(name).map(|v| &**v);
    let policy = get("DevicePolicy")
        .and_then(|v| <&str>::try_from(v).ok())
        .unwrap_or("auto")
        .to_string();
    let allow = get("DeviceAllow")
        .and_then(|v| Vec::<(String, String)>::try_from(v.try_clone().ok()?).ok())
        .unwrap_or_default()
        .into_iter()
        .map(|(p, acc)| {
            if DEVICE_ACCESS.chars().all(|c| acc.contains(c)) {
                p
            } else {
                format!("{p} {acc}")
            }
        })
        .collect();
    crate::observe::Fence { policy, allow }
}

/// `[Unit]` + `[Slice]` text of a team slice unit file, as the generator writes it.
pub fn slice_unit_file(team: &str, spec: &SliceSpec, source: &str) -> String {
    let mut s = format!(
        "# Generated by gpuctl-generator from {source}; do not edit.\n\
         # gpuctld keeps the live unit in step with the policy at runtime.\n\
         [Unit]\nDescription=gpuctl team {team}\nDocumentation=man:gpuctld(8)\n\n[Slice]\n"
    );
    for (k, v) in spec.unit_lines() {
        let _ = writeln!(s, "{k}={v}");
    }
    s.push_str("DevicePolicy=closed\n");
    for dev in &spec.device_allow {
        // Unit-file syntax treats spaces as separators; device paths never contain them, but a
        // path that did would change meaning, so it is left out rather than mangled.
        if !dev.contains(char::is_whitespace) {
            let _ = writeln!(s, "DeviceAllow={dev} {DEVICE_ACCESS}");
        }
    }
    s
}

/// A drop-in with the fence of a slice outside the team shares, as the generator writes it
/// (the entries of [`fence_properties`]); `None` for a policy systemd does not know, and an
/// entry with whitespace, which would change meaning in a unit file, is left out.
pub fn fence_drop_in(fence: &crate::observe::Fence, source: &str) -> Option<String> {
    if !["auto", "closed", "strict"].contains(&fence.policy.as_str()) {
        return None;
    }
    let mut s = format!(
        "# Generated by gpuctl-generator from {source}; do not edit.\n\
         # gpuctld keeps the live fence in step with [host] outside at runtime.\n\
         [Slice]\nDevicePolicy={}\nDeviceAllow=\n",
        fence.policy
    );
    for entry in fence
        .allow
        .iter()
        .filter(|e| !e.contains(char::is_whitespace))
    {
        let _ = writeln!(s, "DeviceAllow={entry} {DEVICE_ACCESS}");
    }
    Some(s)
}

/// The parent `gpu.slice` unit file the generator writes.
pub fn parent_slice_unit_file(source: &str) -> String {
    format!(
        "# Generated by gpuctl-generator from {source}; do not edit.\n\
         [Unit]\nDescription=gpuctl GPU team slices\nDocumentation=man:gpuctld(8)\n"
    )
}

/// systemd's object path of a unit (`bus_label_escape`: every byte other than an ASCII letter
/// or digit, and a leading digit, becomes `_xx`).
pub fn unit_object_path(unit: &str) -> String {
    let mut p = String::from("/org/freedesktop/systemd1/unit/");
    for (i, b) in unit.bytes().enumerate() {
        if b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()) {
            p.push(b as char);
        } else {
            p.push_str(&format!("_{b:02x}"));
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_object_paths_match_systemds_escaping() {
        assert_eq!(
            unit_object_path("gpu-infer.slice"),
            "/org/freedesktop/systemd1/unit/gpu_2dinfer_2eslice"
        );
        assert_eq!(
            unit_object_path("gpu-ml_2.slice"),
            "/org/freedesktop/systemd1/unit/gpu_2dml_5f2_2eslice"
        );
        assert_eq!(
            unit_object_path("1x"),
            "/org/freedesktop/systemd1/unit/_31x"
        );
    }

    fn spec() -> SliceSpec {
        SliceSpec {
            memory_max: Some(1 << 30),
            cpu_weight: Some(200),
            allowed_cpus: Some("0-3,8".parse().unwrap()),
            tasks_max: Some(512),
            device_allow: ["/dev/nvidia0", "/dev/nvidiactl"].map(String::from).into(),
            ..SliceSpec::default()
        }
    }

    #[test]
    fn a_placeholder_device_is_refused_by_name_before_systemd_sees_it() {
        let mut s = spec();
        let hole = "<cap of gpu0/gi2/access: not in mig-minors>";
        s.device_allow.insert(hole.into());
        let e = slice_properties("infer", &s).unwrap_err();
        assert!(e.contains(hole) && e.contains("mig-minors"), "{e}");
        assert!(slice_properties("infer", &spec()).is_ok());
    }

    fn names(props: &[(&'static str, Value<'static>)]) -> Vec<&'static str> {
        props.iter().map(|(k, _)| *k).collect()
    }

    #[test]
    fn a_limit_change_sends_only_that_limit_and_leaves_the_devices_alone() {
        let live = spec();
        let mut want = spec();
        want.memory_max = Some(2 << 30);
        let p = slice_property_changes("infer", &want, Some(&live)).unwrap();
        assert_eq!(names(&p), ["MemoryMax"]);
        assert_eq!(p[0].1, Value::from(2u64 << 30));
        // A limit removed from the policy is sent as systemd's "unset".
        want.memory_max = None;
        let p = slice_property_changes("infer", &want, Some(&live)).unwrap();
        assert_eq!(names(&p), ["MemoryMax"]);
        assert_eq!(p[0].1, Value::from(UNSET));
        // Nothing differs: nothing to send.
        assert!(slice_property_changes("infer", &live, Some(&live))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_device_change_sends_the_reset_and_the_whole_list() {
        let live = spec();
        let mut want = spec();
        want.device_allow.insert("/dev/nvidia1".into());
        let p = slice_property_changes("infer", &want, Some(&live)).unwrap();
        assert_eq!(names(&p), ["DeviceAllow", "DeviceAllow"]);
        let full = slice_properties("infer", &want).unwrap();
        let full_dev: Vec<_> = full.iter().filter(|(k, _)| *k == "DeviceAllow").collect();
        assert_eq!(p.iter().collect::<Vec<_>>(), full_dev);
        // The placeholder check holds on this path too.
        want.device_allow.insert("<cap of gpu0/gi2/access>".into());
        assert!(slice_property_changes("infer", &want, Some(&live)).is_err());
    }

    #[test]
    fn an_unobserved_slice_is_set_whole() {
        assert_eq!(
            slice_property_changes("infer", &spec(), None).unwrap(),
            slice_properties("infer", &spec()).unwrap()
        );
    }

    #[test]
    fn properties_reset_device_list_before_setting_it() {
        let props = slice_properties("infer", &spec()).unwrap();
        let idx: Vec<usize> = props
            .iter()
            .enumerate()
            .filter(|(_, (k, _))| *k == "DeviceAllow")
            .map(|(i, _)| i)
            .collect();
        assert_eq!(idx.len(), 2);
        assert_eq!(props[idx[0]].1.value_signature().to_string(), "a(ss)");
        match &props[idx[0]].1 {
            Value::Array(a) => assert!(a.is_empty(), "first DeviceAllow must reset"),
            v => panic!("{v:?}"),
        }
        let granted =
            Vec::<(String, String)>::try_from(props[idx[1]].1.try_clone().unwrap()).unwrap();
        assert_eq!(
            granted,
            [
                ("/dev/nvidia0".to_string(), "rwm".to_string()),
                ("/dev/nvidiactl".to_string(), "rwm".to_string())
            ]
        );
        let get = |k: &str| props.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(get("MemoryHigh"), Value::from(UNSET));
        assert_eq!(get("MemoryMax"), Value::from(1u64 << 30));
        assert_eq!(get("AllowedCPUs").value_signature().to_string(), "ay");
        assert_eq!(get("DevicePolicy"), Value::from("closed"));
    }

    #[test]
    fn live_values_read_back_as_the_spec_that_was_set() {
        let s = spec();
        let raw = |policy: &str, devices: Vec<(&str, &str)>| -> RawSlice {
            let devices: Vec<(String, String)> = devices
                .into_iter()
                .map(|(p, a)| (p.to_string(), a.to_string()))
                .collect();
            [
                ("MemoryMax", Value::from(1u64 << 30)),
                ("MemoryHigh", Value::from(UNSET)),
                ("CPUWeight", Value::from(200u64)),
                ("AllowedCPUs", Value::from(vec![0b0000_1111u8, 0b0000_0001])),
                ("TasksMax", Value::from(512u64)),
                ("IOWeight", Value::from(UNSET)),
                ("DevicePolicy", Value::from(policy)),
                ("DeviceAllow", Value::from(devices)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), OwnedValue::try_from(v).unwrap()))
            .collect()
        };
        let full = vec![("/dev/nvidia0", "rwm"), ("/dev/nvidiactl", "mwr")];
        assert_eq!(spec_from_raw(&raw("closed", full.clone())), Some(s.clone()));
        assert_eq!(spec_from_raw(&raw("auto", full)), None);
        let ro = raw(
            "closed",
            vec![("/dev/nvidia0", "r"), ("/dev/nvidiactl", "rwm")],
        );
        let got = spec_from_raw(&ro).unwrap();
        assert_ne!(
            got, s,
            "a narrower grant must not read back as the wanted spec"
        );
        assert_eq!(
            got.device_allow.into_iter().collect::<Vec<_>>(),
            ["/dev/nvidia0 r", "/dev/nvidiactl"]
        );
        // A slice set by a version that granted `rw` differs from the wanted spec, so the planner
        // sets it once more, with `rwm`.
        let old_rw = raw(
            "closed",
            vec![("/dev/nvidia0", "rw"), ("/dev/nvidiactl", "rw")],
        );
        assert_ne!(spec_from_raw(&old_rw), Some(s));
    }

    #[test]
    fn slice_names() {
        assert_eq!(slice_unit("infer"), "gpu-infer.slice");
        assert_eq!(team_of_slice("gpu-infer.slice").as_deref(), Some("infer"));
        assert_eq!(team_of_slice("gpu-infer-0.slice"), None);
        assert_eq!(team_of_slice("gpu.slice"), None);
        assert_eq!(team_of_slice("user-0.slice"), None);
    }

    #[test]
    fn unit_file_lists_only_set_limits() {
        let text = slice_unit_file("infer", &spec(), "/var/lib/gpuctl/slices.json");
        assert!(text.contains("MemoryMax=1073741824\n"));
        assert!(!text.contains("MemoryHigh"));
        assert!(text.contains("DevicePolicy=closed\nDeviceAllow=/dev/nvidia0 rwm\n"));
        assert!(text.contains("AllowedCPUs=0-3,8\n"));
    }

    #[test]
    fn a_fence_resets_its_list_and_reads_back_as_set() {
        let fence = crate::observe::Fence {
            policy: "closed".into(),
            allow: ["char-drm", "block-sd"].map(String::from).into(),
        };
        let p = fence_properties(&fence);
        let keys: Vec<&str> = p.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["DevicePolicy", "DeviceAllow", "DeviceAllow"]);
        assert!(matches!(&p[1].1, Value::Array(a) if a.is_empty()));
        let mut raw = RawSlice::new();
        for (k, v) in p.into_iter().filter(|(k, _)| *k == "DevicePolicy").chain([(
            "DeviceAllow",
            Value::from(vec![
                ("block-sd".to_string(), "rwm".to_string()),
                ("char-drm".to_string(), "rwm".to_string()),
            ]),
        )]) {
            raw.insert(k.to_string(), v.try_to_owned().unwrap());
        }
        assert_eq!(fence_from_raw(&raw), fence);
        // Opening: the policy back to auto and the list emptied, nothing appended.
        let open = fence_properties(&crate::observe::Fence::open());
        assert_eq!(open.len(), 2);
        assert_eq!(
            fence_from_raw(&RawSlice::new()),
            crate::observe::Fence::open()
        );
    }
}
