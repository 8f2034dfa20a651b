//! Pure conversions between [`SliceSpec`] and systemd's representations: D-Bus property lists
//! for `SetUnitProperties`, the values read back from the `Slice` interface, and `[Slice]`
//! unit-file text for the generator. No I/O here, so every encoding is unit-tested.

use crate::observe::SliceSpec;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use zbus::zvariant::Value;

/// systemd's "unset / infinity" for `t` cgroup properties.
pub const UNSET: u64 = u64::MAX;

/// The unit name of a team's slice: `gpu-<team>.slice` (a child of `gpu.slice`, because systemd
/// nests slices by their dash-separated prefix).
pub fn slice_unit(team: &str) -> String {
    format!("gpu-{team}.slice")
}

/// The team of a `gpu-<team>.slice` unit name, `None` for any other name (including deeper
/// slices such as `gpu-infer-0.slice`, which belong to MPS daemons).
pub fn team_of_slice(unit: &str) -> Option<&str> {
    let team = unit.strip_prefix("gpu-")?.strip_suffix(".slice")?;
    (crate::policy::valid_team_name(team)).then_some(team)
}

/// The cgroup directory of a team slice, relative to the cgroup2 mount.
pub fn slice_cgroup(team: &str) -> String {
    format!("gpu.slice/gpu-{team}.slice")
}

/// Parse a CPU list (`0-3,8,10-11`) into sorted CPU numbers.
pub fn parse_cpu_list(s: &str) -> Result<BTreeSet<u32>, String> {
    let mut out = BTreeSet::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let lo: u32 = lo.parse().map_err(|_| format!("bad CPU {lo:?} in {s:?}"))?;
        let hi: u32 = hi.parse().map_err(|_| format!("bad CPU {hi:?} in {s:?}"))?;
        if lo > hi || hi >= 8192 {
            return Err(format!("bad CPU range {part:?} in {s:?}"));
        }
        out.extend(lo..=hi);
    }
    Ok(out)
}

/// Format CPU numbers as a normalised list (`0-3,8`).
pub fn format_cpu_list(cpus: &BTreeSet<u32>) -> String {
    let mut out = String::new();
    let mut it = cpus.iter().copied().peekable();
    while let Some(lo) = it.next() {
        let mut hi = lo;
        while it.peek() == Some(&(hi + 1)) {
            hi = it.next().unwrap_or(hi);
        }
        if !out.is_empty() {
            out.push(',');
        }
        if lo == hi {
            let _ = write!(out, "{lo}");
        } else {
            let _ = write!(out, "{lo}-{hi}");
        }
    }
    out
}

/// CPU numbers → systemd's `AllowedCPUs` `ay` bitmask (byte i, bit j = CPU 8i+j).
pub fn cpus_to_mask(cpus: &BTreeSet<u32>) -> Vec<u8> {
    let Some(&max) = cpus.iter().next_back() else {
        return Vec::new();
    };
    let mut mask = vec![0u8; (max as usize) / 8 + 1];
    for &c in cpus {
        mask[c as usize / 8] |= 1 << (c % 8);
    }
    mask
}

/// systemd's `AllowedCPUs` bitmask → CPU numbers.
pub fn mask_to_cpus(mask: &[u8]) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    for (i, byte) in mask.iter().enumerate() {
        for bit in 0..8 {
            if byte & (1 << bit) != 0 {
                out.insert(i as u32 * 8 + bit);
            }
        }
    }
    out
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
    let cpus = match &spec.allowed_cpus {
        Some(s) => cpus_to_mask(&parse_cpu_list(s)?),
        None => Vec::new(),
    };
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
        .map(|p| (p.clone(), "rw".to_string()))
        .collect();
    Ok(vec![
        ("Description", Value::from(format!("gpuctl team {team}"))),
        ("MemoryMax", Value::from(spec.memory_max.unwrap_or(UNSET))),
        ("MemoryHigh", Value::from(spec.memory_high.unwrap_or(UNSET))),
        ("CPUWeight", Value::from(spec.cpu_weight.unwrap_or(UNSET))),
        ("AllowedCPUs", Value::from(cpus)),
        ("TasksMax", Value::from(spec.tasks_max.unwrap_or(UNSET))),
        ("IOWeight", Value::from(spec.io_weight.unwrap_or(UNSET))),
        ("DevicePolicy", Value::from("closed")),
        ("DeviceAllow", Value::from(Vec::<(String, String)>::new())),
        ("DeviceAllow", Value::from(devices)),
    ])
}

/// Raw values read from the `Slice` D-Bus interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawSlice {
    /// `MemoryMax`.
    pub memory_max: u64,
    /// `MemoryHigh`.
    pub memory_high: u64,
    /// `CPUWeight`.
    pub cpu_weight: u64,
    /// `AllowedCPUs` bitmask.
    pub allowed_cpus: Vec<u8>,
    /// `TasksMax`.
    pub tasks_max: u64,
    /// `IOWeight`.
    pub io_weight: u64,
    /// `DevicePolicy`.
    pub device_policy: String,
    /// `DeviceAllow` (path, access).
    pub device_allow: Vec<(String, String)>,
}

/// Turn live values back into a [`SliceSpec`], so the planner compares like with like.
///
/// Returns `None` when the slice is not under gpuctl's device control (`DevicePolicy` is not
/// `closed`): such a slice cannot be described by a `SliceSpec`, and planning a `SetSlice` for it
/// is exactly what should happen.
pub fn spec_from_raw(raw: &RawSlice) -> Option<SliceSpec> {
    if raw.device_policy != "closed" {
        return None;
    }
    let opt = |v: u64| (v != UNSET).then_some(v);
    let cpus = mask_to_cpus(&raw.allowed_cpus);
    Some(SliceSpec {
        memory_max: opt(raw.memory_max),
        memory_high: opt(raw.memory_high),
        cpu_weight: opt(raw.cpu_weight),
        allowed_cpus: (!cpus.is_empty()).then(|| format_cpu_list(&cpus)),
        tasks_max: opt(raw.tasks_max),
        io_weight: opt(raw.io_weight),
        // Only full read-write grants count: a narrower grant is not what gpuctl set, and
        // leaving it out makes the planner set the slice again.
        device_allow: raw
            .device_allow
            .iter()
            .filter(|(_, acc)| acc.contains('r') && acc.contains('w'))
            .map(|(p, _)| p.clone())
            .collect(),
    })
}

/// `[Unit]` + `[Slice]` text of a team slice unit file, as the generator writes it.
pub fn slice_unit_file(team: &str, spec: &SliceSpec, source: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Generated by gpuctl-generator from {source}; do not edit."
    );
    let _ = writeln!(
        s,
        "# gpuctld keeps the live unit in step with the policy at runtime."
    );
    s.push_str("[Unit]\n");
    let _ = writeln!(s, "Description=gpuctl team {team}");
    s.push_str("Documentation=man:gpuctld(8)\n\n[Slice]\n");
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            let _ = writeln!(s, "{k}={v}");
        }
    };
    put("MemoryMax", spec.memory_max.map(|v| v.to_string()));
    put("MemoryHigh", spec.memory_high.map(|v| v.to_string()));
    put("CPUWeight", spec.cpu_weight.map(|v| v.to_string()));
    put("AllowedCPUs", spec.allowed_cpus.clone());
    put("TasksMax", spec.tasks_max.map(|v| v.to_string()));
    put("IOWeight", spec.io_weight.map(|v| v.to_string()));
    s.push_str("DevicePolicy=closed\n");
    for dev in &spec.device_allow {
        // Unit-file syntax treats spaces as separators; device paths never contain them, but a
        // path that did would change meaning, so it is left out rather than mangled.
        if !dev.contains(char::is_whitespace) {
            let _ = writeln!(s, "DeviceAllow={dev} rw");
        }
    }
    s
}

/// The parent `gpu.slice` unit file the generator writes.
pub fn parent_slice_unit_file(source: &str) -> String {
    format!(
        "# Generated by gpuctl-generator from {source}; do not edit.\n\
         [Unit]\nDescription=gpuctl GPU team slices\nDocumentation=man:gpuctld(8)\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SliceSpec {
        SliceSpec {
            memory_max: Some(1 << 30),
            memory_high: None,
            cpu_weight: Some(200),
            allowed_cpus: Some("0-3,8".into()),
            tasks_max: Some(512),
            io_weight: None,
            device_allow: ["/dev/nvidia0", "/dev/nvidiactl"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }

    #[test]
    fn cpu_list_round_trip() {
        let cpus = parse_cpu_list("8,0-3, 10-11").unwrap();
        assert_eq!(format_cpu_list(&cpus), "0-3,8,10-11");
        assert_eq!(cpus_to_mask(&cpus), vec![0b0000_1111, 0b0000_1101]);
        assert_eq!(mask_to_cpus(&cpus_to_mask(&cpus)), cpus);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(cpus_to_mask(&BTreeSet::new()).is_empty());
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
        match &props[idx[1]].1 {
            Value::Array(a) => assert_eq!(a.len(), 2),
            v => panic!("{v:?}"),
        }
        let get = |k: &str| props.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(get("MemoryHigh"), Value::from(UNSET));
        assert_eq!(get("MemoryMax"), Value::from(1u64 << 30));
        assert_eq!(get("AllowedCPUs").value_signature().to_string(), "ay");
        assert_eq!(get("DevicePolicy"), Value::from("closed"));
    }

    #[test]
    fn live_values_read_back_as_the_spec_that_was_set() {
        let s = spec();
        let raw = RawSlice {
            memory_max: 1 << 30,
            memory_high: UNSET,
            cpu_weight: 200,
            allowed_cpus: cpus_to_mask(&parse_cpu_list("0-3,8").unwrap()),
            tasks_max: 512,
            io_weight: UNSET,
            device_policy: "closed".into(),
            device_allow: vec![
                ("/dev/nvidia0".into(), "rw".into()),
                ("/dev/nvidiactl".into(), "rwm".into()),
            ],
        };
        assert_eq!(spec_from_raw(&raw), Some(s));
        let auto = RawSlice {
            device_policy: "auto".into(),
            ..raw.clone()
        };
        assert_eq!(spec_from_raw(&auto), None);
        let ro = RawSlice {
            device_allow: vec![("/dev/nvidia0".into(), "r".into())],
            ..raw
        };
        assert!(spec_from_raw(&ro).unwrap().device_allow.is_empty());
    }

    #[test]
    fn slice_names() {
        assert_eq!(slice_unit("infer"), "gpu-infer.slice");
        assert_eq!(team_of_slice("gpu-infer.slice"), Some("infer"));
        assert_eq!(team_of_slice("gpu-infer-0.slice"), None);
        assert_eq!(team_of_slice("gpu.slice"), None);
        assert_eq!(team_of_slice("user-0.slice"), None);
    }

    #[test]
    fn unit_file_lists_only_set_limits() {
        let text = slice_unit_file("infer", &spec(), "/var/lib/gpuctl/slices.json");
        assert!(text.contains("MemoryMax=1073741824\n"));
        assert!(!text.contains("MemoryHigh"));
        assert!(text.contains("DevicePolicy=closed\nDeviceAllow=/dev/nvidia0 rw\n"));
        assert!(text.contains("AllowedCPUs=0-3,8\n"));
    }
}
