//! The value shapes of team settings ([`Kind`]s): how each parses from the policy, resolves for
//! the host, travels over D-Bus, reads back, lands in a unit file and shows for people.

use super::value::{
    human_bytes, int_in, size_item, size_words, type_name, want_str, CpuSet, Fail, Size, SIZE_HELP,
};
use super::{Kind, UNSET};
use std::collections::BTreeMap;
use toml_edit::Item;
use zbus::zvariant::Value;

/// The [`Kind`] methods of a setting that systemd holds as a `t`, [`UNSET`] meaning none.
macro_rules! live_u64 {
    () => {
        fn to_bus(v: Option<&u64>) -> Vec<Value<'static>> {
            vec![Value::from(v.copied().unwrap_or(UNSET))]
        }
        fn from_bus(v: &Value<'_>) -> Option<u64> {
            u64::try_from(v).ok().filter(|n| *n != UNSET)
        }
        fn unit_values(v: &u64) -> Vec<String> {
            vec![v.to_string()]
        }
    };
}

fn dash_or(v: Option<String>) -> Option<String> {
    Some(v.unwrap_or_else(|| "-".into()))
}

/// Smallest memory limit (`memory-max`, `memory-high`) once resolved: below this a team's shell
/// and its CUDA context do not start, and `0` kills every job of the team.
pub const MIN_MEMORY_BYTES: u64 = 64 << 20;

/// A memory size (`t`): bytes, or a share of host RAM in the policy; `"infinity"` is no limit.
/// Resolved, it is at least [`MIN_MEMORY_BYTES`] and at most the host's RAM.
pub struct Memory;

impl Kind for Memory {
    type Policy = Size;
    type Live = u64;
    fn parse(item: &Item) -> Result<Option<Size>, Fail> {
        let v = size_item(item, true)?;
        if let Some(s) = &v {
            Self::check(s, 0).map_err(|m| {
                // A bare number is bytes; one this small was almost surely meant in GiB.
                let bare = item.as_integer().is_some()
                    || item
                        .as_str()
                        .is_some_and(|t| t.trim().bytes().all(|b| b.is_ascii_digit()));
                match *s {
                    Size::Bytes(b @ 1..=16384) if bare => (
                        format!("{m}; a number without a unit is bytes: did you mean \"{b}G\"?"),
                        Some(SIZE_HELP.into()),
                    ),
                    _ => (m, Some(SIZE_HELP.into())),
                }
            })?;
        }
        Ok(v)
    }
    fn resolve(v: &Size, host_ram: u64) -> u64 {
        v.resolve(host_ram)
    }
    fn check(v: &Size, host_ram: u64) -> Result<(), String> {
        let what = match *v {
            Size::Bytes(b) => size_words(b),
            Size::PercentOfRam(p) if !(p > 0.0 && p <= 100.0) => {
                return Err(format!("{p}% is not a share of host RAM"))
            }
            // Without the host's RAM a share cannot be resolved; the host check says so.
            Size::PercentOfRam(_) if host_ram == 0 => return Ok(()),
            Size::PercentOfRam(p) => {
                format!("{p}% of host RAM ({})", size_words(v.resolve(host_ram)))
            }
        };
        let bytes = v.resolve(host_ram);
        if bytes < MIN_MEMORY_BYTES {
            return Err(format!(
                "{what} is below the floor of {}: the team's jobs could not start, and 0 kills \
                 every one of them",
                size_words(MIN_MEMORY_BYTES)
            ));
        }
        if host_ram > 0 && bytes > host_ram {
            return Err(format!(
                "{what} is above this host's RAM ({}), so it limits nothing",
                size_words(host_ram)
            ));
        }
        Ok(())
    }
    live_u64!();
    fn show(v: Option<&u64>) -> Option<String> {
        dash_or(v.map(|b| human_bytes(*b)))
    }
}

/// `memory-high` above `memory-max` never throttles. Compared after resolution on a host with
/// `host_ram` bytes, so `"50%"` against `"10G"` is caught; with the RAM unknown (0) only values
/// of the same shape (bytes and bytes, percent and percent) can be compared.
pub fn memory_order(max: Option<&Size>, high: Option<&Size>, host_ram: u64) -> Result<(), String> {
    let (Some(max), Some(high)) = (max, high) else {
        return Ok(());
    };
    let (m, h) = match (max, high) {
        (Size::PercentOfRam(m), Size::PercentOfRam(h)) if host_ram == 0 => {
            return if h > m {
                Err(format!(
                    "memory-high ({h}% of host RAM) is above memory-max ({m}%), so it never \
                     throttles"
                ))
            } else {
                Ok(())
            };
        }
        (Size::Bytes(_), Size::Bytes(_)) => (max.resolve(0), high.resolve(0)),
        _ if host_ram == 0 => return Ok(()),
        _ => (max.resolve(host_ram), high.resolve(host_ram)),
    };
    if h > m {
        Err(format!(
            "memory-high ({}) is above memory-max ({}), so it never throttles",
            size_words(h),
            size_words(m)
        ))
    } else {
        Ok(())
    }
}

/// An integer (`t`) in `LO..=HI`; where `INFINITY`, also `"infinity"` (no limit).
pub struct Int<const LO: u64, const HI: u64, const INFINITY: bool>;

/// A weight, as `CPUWeight=` and `IOWeight=` take it.
pub type Weight = Int<1, 10_000, false>;

/// A task count or `"infinity"`, as `TasksMax=` takes it.
pub type Tasks = Int<1, { u32::MAX as u64 }, true>;

impl<const LO: u64, const HI: u64, const INFINITY: bool> Kind for Int<LO, HI, INFINITY> {
    type Policy = u64;
    type Live = u64;
    fn parse(item: &Item) -> Result<Option<u64>, Fail> {
        if !INFINITY {
            return int_in(item, LO, HI).map(Some);
        }
        if item.as_str() == Some("infinity") {
            return Ok(None);
        }
        let help = "expected a positive integer or \"infinity\"";
        int_in(item, LO, HI)
            .map(Some)
            .map_err(|(m, _)| (m, Some(help.into())))
    }
    fn resolve(v: &u64, _: u64) -> u64 {
        *v
    }
    fn check(v: &u64, _: u64) -> Result<(), String> {
        if (LO..=HI).contains(v) {
            Ok(())
        } else {
            Err(format!("{v} is out of range {LO} to {HI}"))
        }
    }
    live_u64!();
    fn show(v: Option<&u64>) -> Option<String> {
        dash_or(v.map(u64::to_string))
    }
}

/// A CPU list; on D-Bus the `ay` bitmask of `AllowedCPUs`, where an empty mask is unset.
pub struct Cpus;

impl Kind for Cpus {
    type Policy = CpuSet;
    type Live = CpuSet;
    fn parse(item: &Item) -> Result<Option<CpuSet>, Fail> {
        let help = || Some("expected CPU numbers and ranges in a string, e.g. \"0-15,32\"".into());
        let text = want_str(item).map_err(|(m, _)| (m, help()))?;
        text.parse().map(Some).map_err(|m| (m, help()))
    }
    fn resolve(v: &CpuSet, _: u64) -> CpuSet {
        v.clone()
    }
    fn to_bus(v: Option<&CpuSet>) -> Vec<Value<'static>> {
        vec![Value::from(v.map(CpuSet::to_mask).unwrap_or_default())]
    }
    fn from_bus(v: &Value<'_>) -> Option<CpuSet> {
        let mask = Vec::<u8>::try_from(v.try_clone().ok()?).ok()?;
        Some(CpuSet::from_mask(&mask)).filter(|c| !c.is_empty())
    }
    fn unit_values(v: &CpuSet) -> Vec<String> {
        vec![v.to_string()]
    }
    fn show(v: Option<&CpuSet>) -> Option<String> {
        Some(v.map_or_else(|| "all".into(), CpuSet::to_string))
    }
}

/// Bytes per second per block device (`a(st)` on D-Bus), as `IOReadBandwidthMax=` and
/// `IOWriteBandwidthMax=` take it. Written `{ "/dev/nvme0n1" = "100M" }`; suffixes K, M, G, T
/// are powers of 1000, as systemd reads them for bandwidths.
pub struct Bandwidth;

const RATE_HELP: &str = "expected a table of block devices and bytes per second, e.g. \
                         { \"/dev/nvme0n1\" = \"200M\" } (K, M, G, T are powers of 1000), \
                         or \"infinity\"";

fn rate(v: &Item) -> Option<u64> {
    if let Some(n) = v.as_integer() {
        return u64::try_from(n).ok().filter(|n| *n > 0);
    }
    let s = v.as_str()?.trim();
    let (num, pow) = match s.char_indices().last()? {
        (i, c @ ('K' | 'M' | 'G' | 'T')) => (&s[..i], "KMGT".find(c)? as u32 + 1),
        _ => (s, 0),
    };
    let n: u64 = num.parse().ok().filter(|n| *n > 0)?;
    n.checked_mul(1000u64.checked_pow(pow)?)
}

impl Kind for Bandwidth {
    type Policy = BTreeMap<String, u64>;
    type Live = BTreeMap<String, u64>;
    fn parse(item: &Item) -> Result<Option<Self::Policy>, Fail> {
        if item.as_str() == Some("infinity") {
            return Ok(None);
        }
        let fail = |m: String| (m, Some(RATE_HELP.into()));
        let Some(t) = item.as_table_like() else {
            return Err(fail(format!("expected a table, found {}", type_name(item))));
        };
        let mut out = BTreeMap::new();
        for (dev, v) in t.iter() {
            // A unit file splits `path rate` at whitespace; a relative path means nothing.
            if !dev.starts_with("/dev/") || dev.contains(char::is_whitespace) {
                return Err(fail(format!("'{dev}' is not a block device path")));
            }
            let Some(r) = rate(v) else {
                return Err(fail(format!("'{dev}': not a positive rate")));
            };
            out.insert(dev.to_string(), r);
        }
        Ok(Some(out).filter(|m| !m.is_empty()))
    }
    fn resolve(v: &Self::Policy, _: u64) -> Self::Live {
        v.clone()
    }
    /// An empty array resets the list (systemd merges the entries of an assignment into what
    /// the unit has), so it goes first, then the wanted entries, as with `DeviceAllow`.
    fn to_bus(v: Option<&Self::Live>) -> Vec<Value<'static>> {
        let reset = Value::from(Vec::<(String, u64)>::new());
        let set = v.map(|m| Value::from(m.clone().into_iter().collect::<Vec<_>>()));
        [Some(reset), set].into_iter().flatten().collect()
    }
    fn from_bus(v: &Value<'_>) -> Option<Self::Live> {
        let list = Vec::<(String, u64)>::try_from(v.try_clone().ok()?).ok()?;
        // A reset keeps the device's entry with the limit back at infinity.
        let m: BTreeMap<_, _> = list.into_iter().filter(|(_, r)| *r != UNSET).collect();
        Some(m).filter(|m| !m.is_empty())
    }
    fn unit_values(v: &Self::Live) -> Vec<String> {
        v.iter().map(|(d, r)| format!("{d} {r}")).collect()
    }
    fn show(v: Option<&Self::Live>) -> Option<String> {
        let m = v?;
        let rates = m.iter().map(|(d, r)| {
            let (n, unit) = [
                (1_000_000_000_000, "T"),
                (1_000_000_000, "G"),
                (1_000_000, "M"),
                (1_000, "K"),
            ]
            .into_iter()
            .find(|(f, _)| r % f == 0)
            .map_or((*r, ""), |(f, u)| (r / f, u));
            format!("{d} {n}{unit}B/s")
        });
        Some(rates.collect::<Vec<_>>().join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::value::{Loc, Size};
    use crate::settings::{Limits, LimitsPart, SliceSpec};

    fn parse(toml: &str) -> (LimitsPart, Vec<String>) {
        let doc: toml_edit::Document<&str> = toml_edit::Document::parse(toml).unwrap();
        let loc = |_: &toml_edit::Key, _: &Item| Loc::start("/etc/gpuctl/policy.toml");
        let mut errors = Vec::new();
        let part = LimitsPart::parse(doc.as_table(), &loc, &mut errors);
        let errors = errors
            .into_iter()
            .map(|(k, _, (m, _))| format!("{k}: {m}"))
            .collect();
        (part, errors)
    }

    #[test]
    fn bandwidths_parse_with_systemd_units_and_refuse_what_systemd_would_misread() {
        let (p, e) = parse(
            "io-read-bandwidth-max = { \"/dev/vda\" = \"10M\", \"/dev/nvme0n1\" = 4096 }\n\
             io-write-bandwidth-max = \"infinity\"\n",
        );
        assert!(e.is_empty(), "{e:?}");
        let read = p.io_read_bandwidth_max.unwrap().value.unwrap();
        assert_eq!(read["/dev/vda"], 10_000_000);
        assert_eq!(read["/dev/nvme0n1"], 4096);
        assert_eq!(p.io_write_bandwidth_max.unwrap().value, None);
        for bad in [
            "{ \"vda\" = \"1M\" }",
            "{ \"/dev/my disk\" = \"1M\" }",
            "{ \"/dev/vda\" = 0 }",
            "{ \"/dev/vda\" = \"1.5M\" }",
            "{ \"/dev/vda\" = \"10X\" }",
            "{ \"/dev/vda\" = \"99999999T\" }",
            "\"10M\"",
        ] {
            let (p, e) = parse(&format!("io-read-bandwidth-max = {bad}\n"));
            assert!(p.io_read_bandwidth_max.is_none(), "{bad}");
            assert_eq!(e.len(), 1, "{bad}: {e:?}");
            assert!(e[0].starts_with("io-read-bandwidth-max: "), "{e:?}");
        }
    }

    #[test]
    fn memory_has_a_floor_when_parsed_and_a_ceiling_on_the_host() {
        for bad in ["0", "\"1M\"", "67108863"] {
            let (p, e) = parse(&format!("memory-max = {bad}\n"));
            assert!(p.memory_max.is_none(), "{bad}");
            assert!(e[0].contains("below the floor of 64 MiB: "), "{e:?}");
            assert!(
                !e[0].contains("MIN_MEMORY_BYTES"),
                "no internal names: {e:?}"
            );
        }
        let (_, e) = parse("memory-max = 32\n");
        assert!(
            e[0].starts_with("memory-max: 32 bytes is below the floor of 64 MiB")
                && e[0].ends_with("a number without a unit is bytes: did you mean \"32G\"?"),
            "{e:?}"
        );
        let (_, e) = parse("memory-max = \"1M\"\n");
        assert!(!e[0].contains("did you mean"), "a unit was given: {e:?}");
        let e = Memory::check(&Size::Bytes(256 << 30), 128 << 30).unwrap_err();
        assert_eq!(
            e,
            "256 GiB is above this host's RAM (128 GiB), so it limits nothing"
        );
        let e = Memory::check(&Size::PercentOfRam(0.01), 128 << 30).unwrap_err();
        assert!(
            e.starts_with("0.01% of host RAM (13.1 MiB) is below"),
            "{e}"
        );
        let (p, e) = parse("memory-max = \"64M\"\nmemory-high = \"0.1%\"\n");
        assert!(e.is_empty(), "a share is checked on the host: {e:?}");
        let ram = 16u64 << 30;
        let limits = p.to_limits();
        let errs = limits.check(ram);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].0, "memory-high");
        assert!(errs[0].1.contains("below the floor"), "{errs:?}");
        assert!(Memory::check(&Size::Bytes(32 << 30), ram)
            .unwrap_err()
            .contains("above this host's RAM"));
        assert!(
            Memory::check(&Size::Bytes(32 << 30), 0).is_ok(),
            "RAM unknown"
        );
        assert!(Memory::check(&Size::PercentOfRam(50.0), ram).is_ok());
    }

    #[test]
    fn memory_high_is_compared_with_max_after_resolution() {
        let b = Size::Bytes;
        let p = Size::PercentOfRam;
        let ram = 100u64 << 30;
        assert!(memory_order(Some(&b(10 << 30)), Some(&b(20 << 30)), 0).is_err());
        assert!(memory_order(Some(&p(10.0)), Some(&p(20.0)), 0).is_err());
        assert!(
            memory_order(Some(&b(10 << 30)), Some(&p(50.0)), 0).is_ok(),
            "no RAM"
        );
        let e = memory_order(Some(&b(10 << 30)), Some(&p(50.0)), ram).unwrap_err();
        assert_eq!(
            e,
            "memory-high (50 GiB) is above memory-max (10 GiB), so it never throttles"
        );
        assert!(memory_order(Some(&p(50.0)), Some(&b(10 << 30)), ram).is_ok());
        assert!(memory_order(None, Some(&b(1)), ram).is_ok());
    }

    fn io_spec() -> SliceSpec {
        let limits = Limits {
            io_read_bandwidth_max: Some([("/dev/vda".to_string(), 10_000_000)].into()),
            io_write_bandwidth_max: Some([("/dev/vda".to_string(), 2_000)].into()),
            io_weight: Some(50),
            ..Limits::default()
        };
        limits.resolve(1 << 30)
    }

    #[test]
    fn bandwidths_reset_then_set_on_the_bus_and_read_back_as_set() {
        let spec = io_spec();
        let props = spec.bus_properties();
        let read: Vec<&Value> = props
            .iter()
            .filter(|(k, _)| *k == "IOReadBandwidthMax")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(read.len(), 2, "reset, then set");
        assert_eq!(read[0].value_signature().to_string(), "a(st)");
        assert_eq!(*read[0], Value::from(Vec::<(String, u64)>::new()));
        // What systemd answers after that call; a device reset elsewhere reads as infinity.
        let live: Vec<(String, Value)> = vec![
            ("IOWeight".into(), Value::from(50u64)),
            (
                "IOReadBandwidthMax".into(),
                Value::from(vec![
                    ("/dev/vda".to_string(), 10_000_000u64),
                    ("/dev/sdb".into(), UNSET),
                ]),
            ),
            (
                "IOWriteBandwidthMax".into(),
                Value::from(vec![("/dev/vda".to_string(), 2_000u64)]),
            ),
        ];
        let back = SliceSpec::from_bus(|n| live.iter().find(|(k, _)| k == n).map(|(_, v)| v));
        assert_eq!(back, spec);
        let unset = SliceSpec::default().bus_properties();
        assert!(unset.contains(&(
            "IOWriteBandwidthMax",
            Value::from(Vec::<(String, u64)>::new())
        )));
        assert_eq!(SliceSpec::from_bus(|_| None), SliceSpec::default());
    }

    #[test]
    fn bandwidths_in_unit_files_and_for_people() {
        let spec = io_spec();
        let lines = spec.unit_lines();
        for line in [
            ("IOReadBandwidthMax", "/dev/vda 10000000".into()),
            ("IOWriteBandwidthMax", "/dev/vda 2000".into()),
        ] {
            assert!(lines.contains(&line), "{lines:?}");
        }
        assert_eq!(
            spec.show(),
            "memory: max - high - · cpu: weight - cpus all · tasks - · io 50 \
             read /dev/vda 10MB/s write /dev/vda 2KB/s"
        );
        assert!(SliceSpec::default().show().ends_with("· io -"));
    }
}
