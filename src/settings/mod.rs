//! Per-team settings, each defined once: its policy key, its type and bounds (how it parses and
//! validates), the systemd property it becomes, how it is read back from systemd, how a unit
//! file writes it, and how `gpuctl plan` shows it.
//!
//! The table at the bottom ([`team_settings!`]) is the one place a setting is named; every
//! layer that handles settings uses what it generates:
//! - `policy::parse` reads [`KEYS`] with [`LimitsPart::parse`], `policy::validate` merges
//!   drop-ins with [`LimitsPart::overlay`] and builds [`Limits`];
//! - `plan::desired` resolves them for the host ([`Limits::resolve`] → [`SliceSpec`]);
//! - `systemd::props` sends [`SliceSpec::bus_properties`], reads back with
//!   [`SliceSpec::from_bus`] and writes unit files with [`SliceSpec::unit_lines`];
//! - `cli::plan` prints [`SliceSpec::show`].
//!
//! What differs between settings of the same shape lives in a [`Kind`] (one per value shape, in
//! [`kinds`]), as youki's libcgroups keeps one file per controller. Adding a setting of an
//! existing kind is one line in the table; a new shape is one new `Kind`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use toml_edit::{Item, Key, TableLike};
use zbus::zvariant::Value;

pub mod kinds;
pub mod value;

use value::{At, Fail, Loc};

/// systemd's "unset / infinity" for `t` cgroup properties.
pub const UNSET: u64 = u64::MAX;

/// The shape of a setting's value, and every conversion it goes through.
pub trait Kind {
    /// The value as the policy states it (may depend on the host, e.g. a share of RAM).
    type Policy: Clone + std::fmt::Debug + PartialEq + Serialize + for<'de> Deserialize<'de>;
    /// The value resolved for one host, as systemd holds it.
    type Live: Clone + std::fmt::Debug + Eq + Serialize + for<'de> Deserialize<'de>;
    /// The policy value of a TOML item; `Ok(None)` is an explicit "no limit" (`"infinity"`),
    /// which removes a value a lower drop-in set.
    fn parse(item: &Item) -> Result<Option<Self::Policy>, Fail>;
    /// The value on a host with `host_ram` bytes of memory.
    fn resolve(v: &Self::Policy, host_ram: u64) -> Self::Live;
    /// The bounds a value must keep beyond its type, on a host with `host_ram` bytes of memory
    /// (0: unknown; only what does not depend on the host is checked). `parse` applies it with
    /// 0; the host check and the read-back of the last good policy apply it again.
    fn check(_v: &Self::Policy, _host_ram: u64) -> Result<(), String> {
        Ok(())
    }
    /// The values of the `SetUnitProperties` assignments that make a live unit hold exactly
    /// `v` (`None`: systemd's default), in order.
    fn to_bus(v: Option<&Self::Live>) -> Vec<Value<'static>>;
    /// The value systemd reports for the property; `None` when unset (or not understood, which
    /// makes the planner set it again).
    fn from_bus(v: &Value<'_>) -> Option<Self::Live>;
    /// The right-hand sides of the unit-file lines that set `v`, one line each.
    fn unit_values(v: &Self::Live) -> Vec<String>;
    /// How `gpuctl plan` shows the value; `None` leaves the setting out of the line.
    fn show(v: Option<&Self::Live>) -> Option<String>;
}

/// Generates, from one table, the types and conversions of every team setting.
macro_rules! team_settings {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $kind:ty, key $key:literal, property $prop:literal, shown $group:literal $label:literal;
    )*) => {
        /// Policy keys of the team settings, in table order.
        pub const KEYS: &[&str] = &[$($key),*];

        /// cgroup limits of a team slice as the policy states them. `None` leaves systemd's
        /// default.
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        pub struct Limits {
            $( $(#[doc = $doc])* #[serde(default)] pub $field: Option<<$kind as Kind>::Policy>, )*
        }

        /// The properties of a team slice that gpuctl manages, resolved for the host. `None`
        /// leaves systemd's default.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct SliceSpec {
            $( $(#[doc = $doc])* #[serde(default)] pub $field: Option<<$kind as Kind>::Live>, )*
            /// `DeviceAllow=` paths, each granted `rwm` (`systemd::props::DEVICE_ACCESS`);
            /// `DevicePolicy=closed` is implied. Read back from a live unit, any other grant is
            /// `<path> <access>` (`/dev/nvidia1 rw`), which no wanted spec holds.
            pub device_allow: BTreeSet<String>,
        }

        /// Team settings set in one policy file, with where each was written. An inner `None`
        /// is an explicit `"infinity"`: it removes a limit a lower file set.
        #[derive(Debug, Clone, Default)]
        pub struct LimitsPart {
            $( $(#[doc = $doc])* pub $field: Option<At<Option<<$kind as Kind>::Policy>>>, )*
        }

        impl LimitsPart {
            /// Read the settings of a `[teams.NAME]` table. `loc` places a value; a value that
            /// does not parse is left out and reported in `errors` with its key.
            pub fn parse(
                t: &dyn TableLike,
                loc: &dyn Fn(&Key, &Item) -> Loc,
                errors: &mut Vec<(&'static str, Loc, Fail)>,
            ) -> LimitsPart {
                LimitsPart {
                    $( $field: t.get_key_value($key).and_then(|(k, item)| {
                        let loc = loc(k, item);
                        match <$kind as Kind>::parse(item) {
                            Ok(value) => Some(At { value, loc }),
                            Err(fail) => {
                                errors.push(($key, loc, fail));
                                None
                            }
                        }
                    }), )*
                }
            }

            /// Merge a later file's settings over these: per key, the later file wins.
            pub fn overlay(&mut self, top: &LimitsPart) {
                $( if top.$field.is_some() {
                    self.$field = top.$field.clone();
                } )*
            }

            /// The merged limits.
            pub fn to_limits(&self) -> Limits {
                Limits { $( $field: self.$field.as_ref().and_then(|a| a.value.clone()), )* }
            }
        }

        impl Limits {
            /// Every setting's [`Kind::check`] on a host with `host_ram` bytes (0: unknown):
            /// `(key, what is wrong)`. The rule between settings is [`Limits::memory_order`].
            pub fn check(&self, host_ram: u64) -> Vec<(&'static str, String)> {
                let mut out = Vec::new();
                $( if let Some(v) = &self.$field {
                    if let Err(m) = <$kind as Kind>::check(v, host_ram) {
                        out.push(($key, m));
                    }
                } )*
                out
            }

            /// The slice properties on a host with `host_ram` bytes of memory (no devices yet).
            pub fn resolve(&self, host_ram: u64) -> SliceSpec {
                SliceSpec {
                    $( $field: self.$field.as_ref().map(|v| <$kind as Kind>::resolve(v, host_ram)), )*
                    device_allow: BTreeSet::new(),
                }
            }
        }

        impl SliceSpec {
            /// `SetUnitProperties` assignments for every setting, unset ones as systemd's
            /// default, so a limit removed from the policy is removed from the unit too.
            pub fn bus_properties(&self) -> Vec<(&'static str, Value<'static>)> {
                let mut out = Vec::new();
                $( for v in <$kind as Kind>::to_bus(self.$field.as_ref()) {
                    out.push(($prop, v));
                } )*
                out
            }

            /// The assignments of [`Self::bus_properties`] for the settings that differ from
            /// `live` only: what a slice holding `live` needs to hold `self`.
            pub fn bus_changes(&self, live: &SliceSpec) -> Vec<(&'static str, Value<'static>)> {
                let mut out = Vec::new();
                $( if self.$field != live.$field {
                    for v in <$kind as Kind>::to_bus(self.$field.as_ref()) {
                        out.push(($prop, v));
                    }
                } )*
                out
            }

            /// `Property=have (policy: want)` for every setting where `self` (the host) differs
            /// from `want`, values as the unit file writes them (`(unset)`: systemd's default).
            pub fn drift(&self, want: &SliceSpec) -> Vec<String> {
                fn shown<K: Kind>(v: Option<&K::Live>) -> String {
                    v.map_or_else(|| "(unset)".into(), |v| K::unit_values(v).join(" "))
                }
                let mut out = Vec::new();
                $( if self.$field != want.$field {
                    out.push(format!(
                        "{}={} (policy: {})",
                        $prop,
                        shown::<$kind>(self.$field.as_ref()),
                        shown::<$kind>(want.$field.as_ref()),
                    ));
                } )*
                out
            }

            /// The settings systemd reports through `get` (a property of the `Slice`
            /// interface by name); no devices.
            pub fn from_bus<'a>(get: impl Fn(&str) -> Option<&'a Value<'a>>) -> SliceSpec {
                SliceSpec {
                    $( $field: get($prop).and_then(|v| <$kind as Kind>::from_bus(v)), )*
                    device_allow: BTreeSet::new(),
                }
            }

            /// `(property, value)` unit-file lines of the settings that are set.
            pub fn unit_lines(&self) -> Vec<(&'static str, String)> {
                let mut out = Vec::new();
                $( if let Some(v) = &self.$field {
                    out.extend(<$kind as Kind>::unit_values(v).into_iter().map(|s| ($prop, s)));
                } )*
                out
            }

            /// One line for people: settings grouped (`memory: max 8 GiB high - · cpu: …`).
            // The last setting's group is written and never read again.
            #[allow(unused_assignments)]
            pub fn show(&self) -> String {
                let mut out = String::new();
                let mut group = "";
                $( if let Some(text) = <$kind as Kind>::show(self.$field.as_ref()) {
                    if group == $group {
                        out.push(' ');
                    } else {
                        if !out.is_empty() {
                            out.push_str(" · ");
                        }
                        out.push_str($group);
                        out.push_str(if $label.is_empty() { " " } else { ": " });
                        group = $group;
                    }
                    if !$label.is_empty() {
                        out.push_str($label);
                        out.push(' ');
                    }
                    out.push_str(&text);
                } )*
                out
            }
        }
    };
}

use kinds::{Bandwidth, Cpus, Memory, Tasks, Weight};

impl Limits {
    /// `memory-high` at most `memory-max`, on a host with `host_ram` bytes (0: unknown, then only
    /// values of the same shape are compared): [`kinds::memory_order`].
    pub fn memory_order(&self, host_ram: u64) -> Result<(), String> {
        kinds::memory_order(
            self.memory_max.as_ref(),
            self.memory_high.as_ref(),
            host_ram,
        )
    }
}

team_settings! {
    /// `MemoryMax=`: the hard memory limit of the slice.
    memory_max: Memory, key "memory-max", property "MemoryMax", shown "memory" "max";
    /// `MemoryHigh=`: the throttling threshold.
    memory_high: Memory, key "memory-high", property "MemoryHigh", shown "memory" "high";
    /// `CPUWeight=` (1..=10000).
    cpu_weight: Weight, key "cpu-weight", property "CPUWeight", shown "cpu" "weight";
    /// `AllowedCPUs=`.
    allowed_cpus: Cpus, key "allowed-cpus", property "AllowedCPUs", shown "cpu" "cpus";
    /// `TasksMax=`.
    tasks_max: Tasks, key "tasks-max", property "TasksMax", shown "tasks" "";
    /// `IOWeight=` (1..=10000).
    io_weight: Weight, key "io-weight", property "IOWeight", shown "io" "";
    /// `IOReadBandwidthMax=`: bytes per second, per block device.
    io_read_bandwidth_max: Bandwidth, key "io-read-bandwidth-max", property "IOReadBandwidthMax", shown "io" "read";
    /// `IOWriteBandwidthMax=`: bytes per second, per block device.
    io_write_bandwidth_max: Bandwidth, key "io-write-bandwidth-max", property "IOWriteBandwidthMax", shown "io" "write";
}
