//! The value shapes of team settings ([`Kind`]s): how each parses from the policy, resolves for
//! the host, travels over D-Bus, reads back, lands in a unit file and shows for people.

use super::value::{human_bytes, int_in, size_item, want_str, CpuSet, Fail, Size};
use super::{Kind, UNSET};
use toml_edit::Item;
use zbus::zvariant::Value;

fn u64_to_bus(v: Option<&u64>) -> Vec<Value<'static>> {
    vec![Value::from(v.copied().unwrap_or(UNSET))]
}

fn u64_from_bus(v: &Value<'_>) -> Option<u64> {
    u64::try_from(v).ok().filter(|n| *n != UNSET)
}

fn dash_or(v: Option<String>) -> Option<String> {
    Some(v.unwrap_or_else(|| "-".into()))
}

/// A memory size (`t`): bytes, or a share of host RAM in the policy; `"infinity"` is no limit.
pub struct Memory;

impl Kind for Memory {
    type Policy = Size;
    type Live = u64;
    fn parse(item: &Item) -> Result<Option<Size>, Fail> {
        size_item(item, true)
    }
    fn resolve(v: &Size, host_ram: u64) -> u64 {
        v.resolve(host_ram)
    }
    fn to_bus(v: Option<&u64>) -> Vec<Value<'static>> {
        u64_to_bus(v)
    }
    fn from_bus(v: &Value<'_>) -> Option<u64> {
        u64_from_bus(v)
    }
    fn unit_values(v: &u64) -> Vec<String> {
        vec![v.to_string()]
    }
    fn show(v: Option<&u64>) -> Option<String> {
        dash_or(v.map(|b| human_bytes(*b)))
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
    fn to_bus(v: Option<&u64>) -> Vec<Value<'static>> {
        u64_to_bus(v)
    }
    fn from_bus(v: &Value<'_>) -> Option<u64> {
        u64_from_bus(v)
    }
    fn unit_values(v: &u64) -> Vec<String> {
        vec![v.to_string()]
    }
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
        want_str(item)?.parse().map(Some).map_err(|m| {
            (
                m,
                Some("expected CPU numbers and ranges, e.g. \"0-15,32\"".into()),
            )
        })
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
