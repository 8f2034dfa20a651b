//! Values as they come from outside (a policy file, a bus call, systemd): where they were written,
//! and the one parser and one formatter of each kind (sizes, durations, CPU lists, bytes).
//!
//! This is a leaf: it imports nothing of the crate, so the policy parser, the team settings
//! table, the systemd encodings and the CLI can all share it without import cycles.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;
use toml_edit::{Item, Value};

/// A place in a policy file, for error messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loc {
    /// The file as the admin knows it (the host path, not the test root).
    pub file: PathBuf,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
}

impl Loc {
    /// The start of `file`, for a problem with the file as a whole.
    pub fn start(file: impl Into<PathBuf>) -> Loc {
        Loc {
            file: file.into(),
            line: 1,
            col: 1,
        }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self.file.to_string_lossy();
        write!(f, "{}:{}:{}", escape_controls(&file), self.line, self.col)
    }
}

/// `text` with control characters (NUL, ESC, newline, DEL, C1) escaped as `\u{1b}`, `\n`, …:
/// a value quoted from a file or a bus call must not forge journal lines or drive a terminal.
/// Borrowed when there is nothing to escape, which is almost always.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `text` for a message: quoted, control characters escaped, and cut after 40 characters, so a
/// hostile value (a 0.5 MiB duration) does not flood the journal or `STATUS=`.
pub fn quote(text: &str) -> String {
    const MAX: usize = 40;
    let mut cut: String = text.chars().take(MAX).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    format!("'{}'", escape_controls(&cut))
}

/// A value and where it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct At<T> {
    /// The value.
    pub value: T,
    /// Where its value starts.
    pub loc: Loc,
}

/// A size: absolute bytes or a share of host RAM.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Size {
    /// Bytes.
    Bytes(u64),
    /// Percent of host RAM (0 < p ≤ 100).
    PercentOfRam(f64),
}

impl Size {
    /// Bytes on a host with `host_ram` bytes of memory.
    pub fn resolve(&self, host_ram: u64) -> u64 {
        match *self {
            Size::Bytes(b) => b,
            Size::PercentOfRam(p) => ((host_ram as f64) * p / 100.0) as u64,
        }
    }
}

/// A value that did not parse: the message, and what would be valid when that can be said.
pub type Fail = (String, Option<String>);

/// Help for sizes that may be a share of RAM.
pub const SIZE_HELP: &str =
    "expected bytes with an optional K, M, G or T suffix (powers of 1024), \
                             a percentage of host RAM such as \"25%\", or \"infinity\"";
/// Help for absolute sizes.
pub const SIZE_HELP_BYTES: &str =
    "expected bytes with an optional K, M, G or T suffix (powers of 1024), e.g. \"20G\"";

/// How a TOML item is called in messages ("a string", "an array").
pub fn type_name(item: &Item) -> &'static str {
    match item {
        Item::None => "nothing",
        Item::Table(_) => "a table",
        Item::ArrayOfTables(_) => "an array of tables",
        Item::Value(v) => match v {
            Value::String(_) => "a string",
            Value::Integer(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Boolean(_) => "a boolean",
            Value::Datetime(_) => "a date-time",
            Value::Array(_) => "an array",
            Value::InlineTable(_) => "an inline table",
        },
    }
}

/// The string of an item, or an error naming what was found.
pub fn want_str(i: &Item) -> Result<&str, Fail> {
    i.as_str()
        .ok_or_else(|| (format!("expected a string, found {}", type_name(i)), None))
}

/// An integer in `lo..=hi`.
pub fn int_in(i: &Item, lo: u64, hi: u64) -> Result<u64, Fail> {
    let fail = |m: String| (m, Some(format!("expected an integer from {lo} to {hi}")));
    match i.as_integer() {
        Some(n) if n >= 0 && (lo..=hi).contains(&(n as u64)) => Ok(n as u64),
        Some(n) => Err(fail(format!("{n} is out of range"))),
        None => Err(fail(format!("expected an integer, found {}", type_name(i)))),
    }
}

/// A size written as an integer or a string; `Ok(None)` is `"infinity"`. Percentages of host RAM
/// only where `allow_percent`.
pub fn size_item(i: &Item, allow_percent: bool) -> Result<Option<Size>, Fail> {
    let help = if allow_percent {
        SIZE_HELP
    } else {
        SIZE_HELP_BYTES
    };
    let fail = |m: String| (m, Some(help.to_string()));
    if let Some(n) = i.as_integer() {
        return if n >= 0 {
            Ok(Some(Size::Bytes(n as u64)))
        } else {
            Err(fail(format!("negative size {n}")))
        };
    }
    let s = i
        .as_str()
        .ok_or_else(|| fail(format!("expected a size, found {}", type_name(i))))?;
    let q = quote(s);
    match parse_size(s) {
        Ok(Some(Size::PercentOfRam(_))) if !allow_percent => Err(fail(format!(
            "{q}: a percentage of host RAM makes no sense here"
        ))),
        Ok(None) if !allow_percent => Err(fail(format!("{q} is not a size"))),
        Ok(v) => Ok(v),
        Err(m) => Err(fail(m)),
    }
}

/// Parse a size: `"64G"`, `"512M"`, `"1048576"`, `"25%"`, `"12.5%"`, or `"infinity"` (→ `None`,
/// no limit). Suffixes K, M, G, T are powers of 1024, as in systemd; `KiB`-style spellings are
/// accepted too.
pub fn parse_size(s: &str) -> Result<Option<Size>, String> {
    let q = quote(s);
    let t = s.trim();
    if t == "infinity" {
        return Ok(None);
    }
    if let Some(p) = t.strip_suffix('%') {
        let v: f64 = p
            .trim()
            .parse()
            .map_err(|_| format!("{q} is not a percentage"))?;
        if !(v > 0.0 && v <= 100.0) {
            return Err(format!(
                "{q}: a percentage must be more than 0 and at most 100"
            ));
        }
        return Ok(Some(Size::PercentOfRam(v)));
    }
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    if num.is_empty() {
        return Err(format!("{q} is not a size"));
    }
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" | "k" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        u => return Err(size_unit_problem(&q, num, u)),
    };
    let n: u64 = num.parse().map_err(|_| format!("{q} is too large"))?;
    n.checked_mul(1u64 << shift)
        .map(|b| Some(Size::Bytes(b)))
        .ok_or_else(|| format!("{q} is too large"))
}

/// Bits to shift for a size suffix (`K` 10 … `T` 40), upper case only.
fn unit_shift(unit: &str) -> Option<u32> {
    ["K", "M", "G", "T"]
        .iter()
        .position(|u| *u == unit)
        .map(|i| 10 * (i as u32 + 1))
}

/// The suffix for `shift` bits (`""` for bytes).
fn unit_name(shift: u32) -> &'static str {
    ["", "K", "M", "G", "T"][(shift / 10) as usize]
}

/// `bytes` in the largest suffix that writes it whole: `1536M`, `64G`, `1000`.
pub fn whole_size(bytes: u64) -> String {
    let shift = [40, 30, 20, 10]
        .into_iter()
        .find(|s| bytes > 0 && bytes % (1u64 << s) == 0)
        .unwrap_or(0);
    format!("{}{}", bytes >> shift, unit_name(shift))
}

/// Why `num` followed by `unit` is no size, said so the reader can fix it: a decimal
/// (`"1.5G"`) gets the same size written whole (`1536M`), an SI unit (`"64GB"`) or a lower-case
/// one (`"32g"`) the suffix meant.
fn size_unit_problem(q: &str, num: &str, unit: &str) -> String {
    let u = unit.trim();
    if let Some(frac) = u.strip_prefix('.') {
        let digits = frac
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(frac.len());
        let (frac, suffix) = frac.split_at(digits);
        let shift = match suffix.trim() {
            "" | "B" => Some(0),
            s => unit_shift(s.trim_end_matches("iB")),
        };
        let whole = |n: &str| n.parse::<u128>().ok();
        // The same size in the next smaller unit (rounded down when it is no whole number of
        // those): 1.5G is 1536M, 1.1G about 1126M.
        let fixed = match (shift, whole(num), whole(frac)) {
            (Some(shift), Some(n), Some(f)) if frac.len() <= 12 && !frac.is_empty() => {
                let scale = 10u128.pow(frac.len() as u32);
                let step = 1u128 << shift.saturating_sub(10);
                let bytes = n
                    .checked_mul(scale)
                    .and_then(|x| x.checked_add(f))
                    .and_then(|x| x.checked_mul(1u128 << shift))
                    .map(|x| x / scale / step * step);
                bytes.and_then(|b| u64::try_from(b).ok()).filter(|b| *b > 0)
            }
            _ => None,
        };
        return match fixed {
            Some(b) => format!(
                "{q}: decimals are not accepted; write it whole with a smaller unit: '{}'",
                whole_size(b)
            ),
            None => {
                format!("{q}: decimals are not accepted; use a whole number with a smaller unit")
            }
        };
    }
    let upper = u.to_ascii_uppercase();
    if let Some(si) = ["KB", "MB", "GB", "TB"].iter().find(|si| **si == upper) {
        let base = &si[..1];
        return format!(
            "{q}: SI units are not accepted ({si} would be a power of 1000); sizes are powers of \
             1024: did you mean '{num}{base}' ({num} {base}iB)?"
        );
    }
    if unit_shift(&upper).is_some() || ["KIB", "MIB", "GIB", "TIB"].contains(&upper.as_str()) {
        return format!(
            "{q}: size units are upper case: did you mean '{num}{}'?",
            &upper[..1]
        );
    }
    format!("{q}: unknown size unit {}", quote(u))
}

/// Parse a duration: `"90"` (seconds), `"5m"`, `"1h30m"`, `"500ms"`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let q = quote(s);
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let d = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if d == 0 {
            return Err(format!("{q} is not a duration"));
        }
        let n: u64 = rest[..d].parse().map_err(|_| format!("{q} is too large"))?;
        rest = &rest[d..];
        let u = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = rest[..u].trim();
        rest = rest[u..].trim_start();
        let per = match unit {
            "ms" => Duration::from_millis(1),
            "s" | "sec" => Duration::from_secs(1),
            "m" | "min" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "d" => Duration::from_secs(86400),
            _ => return Err(format!("{q}: unknown time unit {}", quote(unit))),
        };
        // Checked: a long sum of large terms overflowed `Duration` and panicked here.
        total = per
            .checked_mul(u32::try_from(n).map_err(|_| format!("{q} is too large"))?)
            .and_then(|d| total.checked_add(d))
            .ok_or_else(|| format!("{q} is too large"))?;
    }
    Ok(total)
}

/// Help for durations.
pub const DURATION_HELP: &str =
    "expected seconds, or numbers with units ms, s, m/min, h, d, e.g. \"5m\" or \"1h30m\"";

/// Longest `host.drain-timeout`: a drain holds a MIG change (and the team's restart) this long;
/// a day is far beyond any job's graceful stop.
pub const MAX_DRAIN_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A duration written as whole seconds or a string ([`parse_duration`]), at most `max`
/// (`max_name` is the bound's name, so the error says which limit it met).
pub fn duration_item(i: &Item, max: Duration, max_name: &str) -> Result<Duration, Fail> {
    let fail = |m: String| (m, Some(DURATION_HELP.into()));
    let d = match i.as_integer() {
        Some(n) if n >= 0 => Duration::from_secs(n as u64),
        Some(n) => return Err(fail(format!("negative duration {n}"))),
        None => parse_duration(want_str(i)?).map_err(fail)?,
    };
    if d > max {
        let (secs, max) = (d.as_secs(), human_duration(max));
        return Err(fail(format!(
            "{secs} s is over the maximum of {max} ({max_name})"
        )));
    }
    Ok(d)
}

/// A duration for people: `24 h`, `10 min`, `90 s`.
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 && s % 3600 == 0 {
        format!("{} h", s / 3600)
    } else if s >= 60 && s % 60 == 0 {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

/// A GPU UUID as NVML reports it: `GPU-` and a canonical UUID (8-4-4-4-12 hex digits). MIG
/// device UUIDs (`MIG-…`) are not GPU selectors. Checked in full: a prefix-and-length check let
/// `GPU-../../etc` through.
pub fn valid_gpu_uuid(s: &str) -> bool {
    if !s.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("GPU-")) {
        return false;
    }
    let groups: Vec<&str> = s[4..].split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The error for a list of `n` over its cap, naming the cap.
pub fn over_cap(what: &str, n: usize, cap: usize, cap_name: &str) -> String {
    format!("{n} {what} is over the limit of {cap} ({cap_name})")
}

/// `Err` when a list of `n` is over `cap`.
pub fn check_len(what: &str, n: usize, cap: usize, cap_name: &str) -> Result<(), String> {
    if n > cap {
        Err(over_cap(what, n, cap, cap_name))
    } else {
        Ok(())
    }
}

/// Most comma-separated items in a CPU list: far above any real list (a 512-CPU host written
/// one CPU at a time), and it bounds the work on a hostile one.
pub const MAX_CPU_ITEMS: usize = 4096;

/// A set of CPU numbers, as `AllowedCPUs=` and `/sys/devices/system/cpu/online` write them
/// (`0-5,8`). The one CPU-list parser: it reads the list an admin writes and the list systemd
/// or the kernel report, and prints the normalised form.
///
/// Held as sorted, merged, non-adjacent intervals, never expanded into CPU numbers: parsing is
/// O(n log n) in the number of items (at most [`MAX_CPU_ITEMS`]) whatever the ranges span
/// (`"0-65535,"` × 2,000 expanded to 131 M numbers took over a minute).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CpuSet(Vec<(u32, u32)>);

impl CpuSet {
    /// Sort and merge overlapping and adjacent intervals (0-3 and 4-5 are 0-5).
    fn from_ranges(mut ranges: Vec<(u32, u32)>) -> CpuSet {
        ranges.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
        for (a, b) in ranges {
            match merged.last_mut() {
                Some((_, end)) if a <= end.saturating_add(1) => *end = (*end).max(b),
                _ => merged.push((a, b)),
            }
        }
        CpuSet(merged)
    }

    /// The CPUs of a systemd `AllowedCPUs` bitmask (byte i, bit j = CPU 8i+j).
    pub fn from_mask(mask: &[u8]) -> CpuSet {
        let bits = mask.iter().enumerate().flat_map(|(i, byte)| {
            (0..8u32)
                .filter(move |bit| byte & (1 << bit) != 0)
                .map(move |bit| i as u32 * 8 + bit)
        });
        CpuSet::from_ranges(bits.map(|c| (c, c)).collect())
    }

    /// systemd's `AllowedCPUs` bitmask of these CPUs.
    pub fn to_mask(&self) -> Vec<u8> {
        let Some(max) = self.max() else {
            return Vec::new();
        };
        let mut mask = vec![0u8; (max as usize) / 8 + 1];
        for &(a, b) in &self.0 {
            for c in a..=b {
                mask[c as usize / 8] |= 1 << (c % 8);
            }
        }
        mask
    }

    /// The highest CPU number.
    pub fn max(&self) -> Option<u32> {
        self.0.last().map(|&(_, b)| b)
    }

    /// How many CPUs.
    pub fn len(&self) -> usize {
        self.0.iter().map(|&(a, b)| (b - a) as usize + 1).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromStr for CpuSet {
    type Err = String;

    /// `"0-3, 8,4-5"`: numbers below 65536 and ascending ranges, comma-separated, at most
    /// [`MAX_CPU_ITEMS`] items.
    fn from_str(s: &str) -> Result<CpuSet, String> {
        let q = quote(s);
        let items = s.split(',').count();
        check_len("CPU list items", items, MAX_CPU_ITEMS, "MAX_CPU_ITEMS")
            .map_err(|e| format!("{q}: {e}"))?;
        let mut ranges = Vec::with_capacity(items);
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(format!("{q}: empty item in CPU list"));
            }
            let num = |x: &str| -> Result<u32, String> {
                x.trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n < 65536)
                    .ok_or_else(|| format!("{q}: {} is not a CPU number", quote(x)))
            };
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let (a, b) = (num(a)?, num(b)?);
            if a > b {
                return Err(format!("{q}: range {} runs backwards", quote(part)));
            }
            ranges.push((a, b));
        }
        Ok(CpuSet::from_ranges(ranges))
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(lo, hi)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl TryFrom<String> for CpuSet {
    type Error = String;
    fn try_from(s: String) -> Result<CpuSet, String> {
        s.parse()
    }
}

impl From<CpuSet> for String {
    fn from(c: CpuSet) -> String {
        c.to_string()
    }
}

/// Parse and normalise a CPU list (`"0-3, 8,4-5"` → `"0-5,8"`).
pub fn parse_cpus(s: &str) -> Result<String, String> {
    s.parse::<CpuSet>().map(|c| c.to_string())
}

/// Bytes as GiB/MiB for people.
pub fn human_bytes(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if b >= 1 << 30 {
        let g = b as f64 / GIB;
        if g.fract() == 0.0 {
            format!("{g:.0} GiB")
        } else {
            format!("{g:.1} GiB")
        }
    } else {
        format!("{} MiB", b >> 20)
    }
}

/// Bytes in a message: exact where a unit writes them whole (`64 MiB`, `32 GiB`, `32 bytes`),
/// else to a tenth of the largest unit (`23.5 GiB`), so that no reader counts digits.
pub fn size_words(b: u64) -> String {
    for (shift, name) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        let unit = 1u64 << shift;
        if b >= unit && b % unit == 0 {
            return format!("{} {name}", b >> shift);
        }
        if b >= unit && shift >= 20 {
            let near = format!("{:.1} {name}", b as f64 / unit as f64);
            // "64.0 MiB" for one byte less than 64 MiB would read as the same size.
            return if near.ends_with(&format!(".0 {name}")) {
                format!("{near} ({b} bytes)")
            } else {
                near
            };
        }
    }
    format!("{b} bytes")
}

/// Bytes in a table column, where width matters more than the unit's name: `1.5G`, `512.0M`,
/// `900B`. One place for `gpuctl status` and `gpuctl top`; [`human_bytes`] is the prose form.
pub fn compact_bytes(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1}G", b as f64 / (1u64 << 30) as f64)
    } else if b >= 1 << 20 {
        format!("{:.1}M", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{b}B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_bytes_picks_the_largest_unit_that_fits() {
        assert_eq!(compact_bytes(3 << 29), "1.5G");
        assert_eq!(compact_bytes(512 << 20), "512.0M");
        assert_eq!(compact_bytes((1 << 30) - 1), "1024.0M");
        assert_eq!(compact_bytes(900), "900B");
    }

    #[test]
    fn human_duration_picks_the_largest_whole_unit() {
        let d = Duration::from_secs;
        assert_eq!(human_duration(d(7200)), "2 h");
        assert_eq!(human_duration(d(600)), "10 min");
        assert_eq!(human_duration(d(3660)), "61 min");
        assert_eq!(human_duration(d(90)), "90 s");
        assert_eq!(human_duration(d(1)), "1 s");
        assert_eq!(human_duration(d(0)), "0 s");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64G"), Ok(Some(Size::Bytes(64 << 30))));
        assert_eq!(parse_size("512M"), Ok(Some(Size::Bytes(512 << 20))));
        assert_eq!(parse_size("2TiB"), Ok(Some(Size::Bytes(2 << 40))));
        assert_eq!(parse_size("1000"), Ok(Some(Size::Bytes(1000))));
        assert_eq!(parse_size("25%"), Ok(Some(Size::PercentOfRam(25.0))));
        assert_eq!(parse_size("infinity"), Ok(None));
        for bad in ["", "G", "64X", "0%", "101%", "-1G", "1.5G", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_sizes_say_how_to_write_them() {
        let e = |s: &str| parse_size(s).unwrap_err();
        assert_eq!(
            e("1.5G"),
            "'1.5G': decimals are not accepted; write it whole with a smaller unit: '1536M'"
        );
        assert!(e("0.5T").ends_with(": '512G'"), "{}", e("0.5T"));
        assert!(e("1.25GiB").ends_with(": '1280M'"), "{}", e("1.25GiB"));
        assert!(
            e("2.5").ends_with(": '2'"),
            "bytes round down: {}",
            e("2.5")
        );
        assert!(e("1.1G").ends_with(": '1126M'"), "{}", e("1.1G"));
        assert!(
            e("1.5X").contains("decimals are not accepted"),
            "{}",
            e("1.5X")
        );
        assert_eq!(
            e("64GB"),
            "'64GB': SI units are not accepted (GB would be a power of 1000); sizes are powers \
             of 1024: did you mean '64G' (64 GiB)?"
        );
        assert_eq!(
            e("32g"),
            "'32g': size units are upper case: did you mean '32G'?"
        );
        assert_eq!(e("64X"), "'64X': unknown size unit 'X'");
    }

    #[test]
    fn sizes_in_words_are_exact_or_a_tenth() {
        assert_eq!(size_words(32), "32 bytes");
        assert_eq!(size_words(64 << 20), "64 MiB");
        assert_eq!(size_words(128 << 30), "128 GiB");
        assert_eq!(size_words(137438953472), "128 GiB");
        assert_eq!(size_words((47 << 29) + 12345), "23.5 GiB");
        assert_eq!(size_words((64 << 20) - 1), "64.0 MiB (67108863 bytes)");
        assert_eq!(size_words(3 << 10), "3 KiB");
        assert_eq!(whole_size(1536 << 20), "1536M");
        assert_eq!(whole_size(2 << 40), "2T");
        assert_eq!(whole_size(1000), "1000");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["", "m", "5 parsecs", "1h-3m"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpus("0-3, 8,4-5").unwrap(), "0-5,8");
        assert_eq!(parse_cpus("7").unwrap(), "7");
        for bad in ["", "3-1", "a", "0,,1", "1-", "65536"] {
            assert!(parse_cpus(bad).is_err(), "{bad}");
        }
        let c: CpuSet = "8,0-3, 10-11".parse().unwrap();
        assert_eq!((c.max(), c.len()), (Some(11), 7));
        assert_eq!(c.to_mask(), vec![0b0000_1111, 0b0000_1101]);
        assert_eq!(CpuSet::from_mask(&c.to_mask()), c);
        assert!(CpuSet::default().to_mask().is_empty());
        assert_eq!(serde_json::to_string(&c).unwrap(), "\"0-3,8,10-11\"");
        assert!(serde_json::from_str::<CpuSet>("\"3-1\"").is_err());
    }

    #[test]
    fn duration_sums_that_overflow_are_errors_not_panics() {
        let huge = "4294967295d".repeat(52_000);
        let e = parse_duration(&huge).unwrap_err();
        assert!(e.ends_with("is too large"), "{e}");
        assert!(e.len() < 80, "the value is quoted short: {e}");
    }

    #[test]
    fn durations_have_a_maximum() {
        let item = |t: &str| toml_edit::value(t);
        let max = MAX_DRAIN_TIMEOUT;
        assert_eq!(duration_item(&item("24h"), max, "MAX"), Ok(max));
        assert_eq!(
            duration_item(&toml_edit::value(90), max, "MAX"),
            Ok(Duration::from_secs(90))
        );
        let (m, _) = duration_item(&item("24h1s"), max, "MAX_DRAIN_TIMEOUT").unwrap_err();
        assert!(
            m.contains("over the maximum of 24 h (MAX_DRAIN_TIMEOUT)"),
            "{m}"
        );
        assert!(duration_item(&item("5000000000000000000d"), max, "MAX").is_err());
    }

    #[test]
    fn uuids_are_checked_in_full() {
        assert!(valid_gpu_uuid("GPU-00000000-1111-2222-3333-000000000004"));
        assert!(valid_gpu_uuid("GPU-5a1b2c3d-AAAA-bbbb-0123-456789abcdef"));
        for bad in [
            "GPU-../../etc",
            "GPU-12345678",
            "GPU-00000000-1111-2222-3333-00000000000",
            "GPU-00000000-1111-2222-3333-0000000000000",
            "GPU-0000000g-1111-2222-3333-000000000000",
            "MIG-00000000-1111-2222-3333-000000000000",
            "GPU-00000000-1111-2222-3333-000000000000-",
            "GPU-00000000-1111-2222-3333-00000000000\n",
            "GP",
            "",
        ] {
            assert!(!valid_gpu_uuid(bad), "{bad:?}");
        }
    }

    #[test]
    fn cpu_lists_stay_intervals_and_are_capped() {
        // 2,000 copies of the whole range: one interval, never 131 M numbers.
        let wide = "0-65535,".repeat(2000) + "7";
        let c: CpuSet = wide.parse().unwrap();
        assert_eq!((c.to_string(), c.len()), ("0-65535".to_string(), 65536));
        let many = "1,".repeat(MAX_CPU_ITEMS) + "2";
        let e = many.parse::<CpuSet>().unwrap_err();
        assert!(e.contains("over the limit of 4096 (MAX_CPU_ITEMS)"), "{e}");
        let c: CpuSet = "9,3-4,5,0-1,2".parse().unwrap();
        assert_eq!(c.to_string(), "0-5,9");
    }

    #[test]
    fn quoted_values_are_short_and_escaped() {
        assert_eq!(quote("5m"), "'5m'");
        assert_eq!(quote("a\u{1b}[31mb\n"), "'a\\u{1b}[31mb\\n'");
        let q = quote(&"x".repeat(1000));
        assert!(q.ends_with("…'") && q.chars().count() == 43, "{q}");
    }

    #[test]
    fn bytes_for_people() {
        assert_eq!(human_bytes(80 << 30), "80 GiB");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
        assert_eq!(human_bytes(512 << 20), "512 MiB");
    }
}
