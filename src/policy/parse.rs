//! One policy file → a [`Fragment`]: every key checked, every value typed, every value's place in
//! the file kept.
//!
//! The file is walked with `toml_edit` rather than deserialised with serde because serde stops at
//! the first problem, while an admin wants every problem of a file in one run, each with its line,
//! column and key path. Checks that need one value only (a size parses, a weight is in range, a
//! team name is legal) happen here; checks that need the merged policy (a team exists, a device is
//! not owned twice, a MIG geometry fits) happen in [`super::validate`].

use super::caps::{self, within};
use super::lend::{Window, MAX_HALF_LIFE, MAX_LEND_GRACE, WINDOW_HELP};
use super::{
    valid_team_name, Accounting, Diagnostic, IdleAction, Loc, Member, Outside, Reconfigure,
    Selector, Size,
};
use crate::settings::value::{
    duration_item, int_in, over_cap, size_item, type_name, valid_gpu_uuid, want_str, Fail,
    DURATION_HELP, MAX_DRAIN_TIMEOUT, SIZE_HELP_BYTES,
};
pub use crate::settings::value::{parse_cpus, parse_duration, parse_size, At};
use crate::settings::{LimitsPart, KEYS as LIMIT_KEYS};
use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml_edit::{Document, Item, Key, TableLike, Value};

/// One parsed file. `None` fields were not set in this file (so a lower file's value stays).
#[derive(Debug, Clone, Default)]
pub struct Fragment {
    /// Host path of the file.
    pub file: PathBuf,
    /// `[host]`.
    pub host: HostPart,
    /// `[teams.*]`, in file order.
    pub teams: Vec<TeamPart>,
    /// `[[gpu]]` entries that parsed, in file order.
    pub gpus: Vec<GpuPart>,
    /// Teams named by `[[gpu]]` entries that did not parse (their error is reported): such a
    /// team is not also told it has no GPUs.
    pub teams_of_bad_gpus: Vec<String>,
    /// `[slurm]`.
    pub slurm: SlurmPart,
}

/// `[slurm]` keys set in one file (merged per key, like `[host]`).
#[derive(Debug, Clone, Default)]
pub struct SlurmPart {
    /// `enabled`.
    pub enabled: Option<At<bool>>,
    /// `gres-file`.
    pub gres_file: Option<At<PathBuf>>,
    /// `node-name`.
    pub node_name: Option<At<String>>,
    /// `team-types`.
    pub team_types: Option<At<bool>>,
    /// `restart`: units restarted after the GRES file changed.
    pub restart: Option<At<Vec<String>>>,
    /// `node-file`.
    pub node_file: Option<At<PathBuf>>,
}

/// `[host]` keys set in one file.
#[derive(Debug, Clone, Default)]
pub struct HostPart {
    /// `reconfigure`.
    pub reconfigure: Option<At<Reconfigure>>,
    /// `drain-timeout`.
    pub drain_timeout: Option<At<Duration>>,
    /// `nvml-library`.
    pub nvml_library: Option<At<PathBuf>>,
    /// `accounting`.
    pub accounting: Option<At<Accounting>>,
    /// `outside`.
    pub outside: Option<At<Outside>>,
    /// `admin-group`.
    pub admin_group: Option<At<String>>,
    /// `fair-share-half-life`.
    pub fair_share_half_life: Option<At<Duration>>,
    /// `[host.health]`, merged per key.
    pub health: HealthPart,
}

/// `[host.health]` keys set in one file.
#[derive(Debug, Clone, Default)]
pub struct HealthPart {
    /// `application-xids`.
    pub application_xids: Option<At<Vec<u32>>>,
    /// `on-fault`.
    pub on_fault: Option<At<crate::health::OnFault>>,
    /// `grace`.
    pub grace: Option<At<Duration>>,
    /// `reset-when-idle`.
    pub reset_when_idle: Option<At<bool>>,
}

/// `[teams.NAME]` keys set in one file. An inner `None` is an explicit `"infinity"`: it removes a
/// limit a lower file set.
#[derive(Debug, Clone)]
pub struct TeamPart {
    /// Team name (may be invalid; the error is already reported, and keeping the team avoids a
    /// cascade of "unknown team" errors).
    pub name: String,
    /// Where the team's table key is.
    pub loc: Loc,
    /// `members`.
    pub members: Option<At<Vec<Member>>>,
    /// The cgroup settings (`memory-max`, `cpu-weight`, …).
    pub limits: LimitsPart,
    /// `[teams.NAME.mps]`, when present in this file.
    pub mps: Option<MpsPart>,
    /// `[teams.NAME.idle]`, when present in this file.
    pub idle: Option<IdlePart>,
    /// `[teams.NAME.placement]`, when present in this file.
    pub placement: Option<PlacementPart>,
    /// `[teams.NAME.lend]`, when present in this file.
    pub lend: Option<LendPart>,
    /// `borrow`.
    pub borrow: Option<At<bool>>,
}

/// `[teams.NAME.lend]` keys set in one file (merged per key, like `mps`).
#[derive(Debug, Clone)]
pub struct LendPart {
    /// Where the table is.
    pub loc: Loc,
    /// `to`: `"all"` or team names, each where it was written.
    pub to: Option<At<LendToPart>>,
    /// `after`.
    pub after: Option<At<Duration>>,
    /// `grace`.
    pub grace: Option<At<Duration>>,
    /// `when`: calendar windows.
    pub when: Option<At<Vec<Window>>>,
}

/// `to` as written: the team names are checked against the merged policy.
#[derive(Debug, Clone)]
pub enum LendToPart {
    /// `"all"`.
    All,
    /// Team names.
    Teams(Vec<At<String>>),
}

/// `[teams.NAME.placement]` keys set in one file (merged per key, like `mps`).
#[derive(Debug, Clone)]
pub struct PlacementPart {
    /// Where the table is.
    pub loc: Loc,
    /// `jobs-per-device` (0: no placement).
    pub jobs_per_device: Option<At<u32>>,
    /// `gpus`: a job's devices unless it says `--gpus`.
    pub gpus: Option<At<crate::placement::Gpus>>,
    /// `gpu-memory`: a job's MPS pinned device memory limit unless it says `--gpu-memory`.
    pub gpu_memory: Option<At<u64>>,
}

/// `[teams.NAME.idle]` keys set in one file (merged per key, like `mps`).
#[derive(Debug, Clone)]
pub struct IdlePart {
    /// Where the table is.
    pub loc: Loc,
    /// `after`.
    pub after: Option<At<Duration>>,
    /// `below`, percent.
    pub below: Option<At<f64>>,
    /// `action`.
    pub action: Option<At<IdleAction>>,
    /// `grace`.
    pub grace: Option<At<Duration>>,
    /// `exclude`: unit-name globs.
    pub exclude: Option<At<Vec<String>>>,
    /// `memory-alarm`, percent of the share's memory.
    pub memory_alarm: Option<At<f64>>,
}

/// `[teams.NAME.mps]` keys set in one file.
#[derive(Debug, Clone)]
pub struct MpsPart {
    /// Where the table is.
    pub loc: Loc,
    /// `active-thread-percentage`.
    pub active_thread_percentage: Option<At<u32>>,
    /// `pinned-memory-limit`, bytes.
    pub pinned_memory_limit: Option<At<u64>>,
    /// `user`.
    pub user: Option<At<String>>,
}

/// One `[[gpu]]` entry whose selector and use parsed.
#[derive(Debug, Clone)]
pub struct GpuPart {
    /// `gpu[N]`, N counting entries in this file.
    pub key: String,
    /// Where the entry starts.
    pub loc: Loc,
    /// The selector and where it was written.
    pub selector: At<Selector>,
    /// What the GPUs are for.
    pub usage: UsagePart,
    /// `[[gpu.layout]]`: the other layouts the GPUs may take, those that parsed.
    pub layouts: Vec<LayoutPart>,
    /// `[gpu.reslice]`.
    pub reslice: Option<ReslicePart>,
}

/// One `[[gpu.layout]]`.
#[derive(Debug, Clone)]
pub struct LayoutPart {
    /// `gpu[N].layout[M]`.
    pub key: String,
    /// Where it starts.
    pub loc: Loc,
    /// `name`.
    pub name: At<String>,
    /// `owner`, `shared` or `mig`, as in the entry.
    pub usage: UsagePart,
    /// `when`.
    pub when: Option<At<Vec<Window>>>,
}

/// `[gpu.reslice]`.
#[derive(Debug, Clone)]
pub struct ReslicePart {
    /// Where the table starts.
    pub loc: Loc,
    /// `after`.
    pub after: Option<At<Duration>>,
    /// `hold`.
    pub hold: Option<At<Duration>>,
}

/// The use of a `[[gpu]]` entry, with locations of team references.
#[derive(Debug, Clone)]
pub enum UsagePart {
    /// `owner = "team"`.
    Owned(At<String>),
    /// `shared = ["a", "b"]`.
    Shared(Vec<At<String>>),
    /// `mig = [...]`; empty for `mig = []` (MIG on, no instances).
    Mig(Vec<MigPart>),
}

/// One element of `mig = [...]`.
#[derive(Debug, Clone)]
pub struct MigPart {
    /// `gpu[N].mig[M]`.
    pub key: String,
    /// Where the element starts.
    pub loc: Loc,
    /// `profile`.
    pub profile: At<String>,
    /// `owner`.
    pub owner: At<String>,
    /// `count` (default 1).
    pub count: u32,
    /// `compute`, empty when absent.
    pub compute: Option<At<Vec<String>>>,
}

const ROOT_KEYS: &[&str] = &["version", "host", "teams", "gpu", "slurm"];
const SLURM_KEYS: &[&str] = &[
    "enabled",
    "gres-file",
    "node-file",
    "node-name",
    "team-types",
    "restart",
];
const HOST_KEYS: &[&str] = &[
    "reconfigure",
    "drain-timeout",
    "nvml-library",
    "accounting",
    "outside",
    "admin-group",
    "health",
    "fair-share-half-life",
];
const HEALTH_KEYS: &[&str] = &["application-xids", "on-fault", "grace", "reset-when-idle"];
/// The highest XID accepted in `application-xids`: the catalogue ends in the low hundreds,
/// and a five-digit number is a typo.
pub const MAX_XID: i64 = 9999;
const MPS_KEYS: &[&str] = &["active-thread-percentage", "pinned-memory-limit", "user"];
const PLACEMENT_KEYS: &[&str] = &["jobs-per-device", "gpus", "gpu-memory"];
const LEND_KEYS: &[&str] = &["to", "after", "grace", "when"];
/// Most jobs one device may be set to take: far above MPS's 48 clients per server, so it never
/// binds a real setting, and it keeps the lease counts small numbers.
pub const MAX_JOBS_PER_DEVICE: u64 = 1024;
const IDLE_KEYS: &[&str] = &[
    "after",
    "below",
    "action",
    "grace",
    "exclude",
    "memory-alarm",
];
const SELECTOR_KEYS: &[&str] = &["index", "uuid", "model", "all"];
const USE_KEYS: &[&str] = &["owner", "shared", "mig"];
const LAYOUT_KEYS: &[&str] = &["name", "when"];
const RESLICE_KEYS: &[&str] = &["after", "hold"];
const MIG_KEYS: &[&str] = &["profile", "owner", "count", "compute"];

/// Parse one file. `file` is the host path used in diagnostics. Returns `None` when the file is
/// not TOML at all (the syntax error is in `diags`); otherwise a fragment of whatever parsed, with
/// every problem found appended to `diags`.
pub fn parse_fragment(file: &Path, text: &str, diags: &mut Vec<Diagnostic>) -> Option<Fragment> {
    let first = diags.len();
    let frag = parse_inner(file, text, diags);
    // Checks run in key order, not file order; an admin reads top to bottom.
    diags[first..].sort_by_key(|d| d.loc.as_ref().map(|l| (l.line, l.col)));
    frag
}

fn parse_inner(file: &Path, text: &str, diags: &mut Vec<Diagnostic>) -> Option<Fragment> {
    let mut cx = Cx::new(file, text, diags);
    let doc = match Document::parse(text) {
        Ok(doc) => doc,
        Err(e) => {
            let msg = e.message().trim().replace('\n', "; ");
            cx.error(e.span(), "", format!("TOML syntax error: {msg}"), None);
            return None;
        }
    };
    let root = doc.as_table();
    let mut frag = Fragment {
        file: file.to_path_buf(),
        ..Fragment::default()
    };

    match root.get_key_value("version") {
        None => cx.error(
            Some(0..0),
            "version",
            "missing `version`".into(),
            Some("every policy file starts with `version = 1`".into()),
        ),
        Some((k, item)) => match item.as_integer() {
            Some(1) => {}
            Some(v) => {
                // A file written for another format version would produce a storm of misleading
                // key errors; report the version alone.
                cx.error(
                    span(k, item),
                    "version",
                    format!("unsupported policy version {v}"),
                    Some("this gpuctl reads `version = 1`".into()),
                );
                return Some(frag);
            }
            None => cx.type_error(k, item, "version", "the integer 1"),
        },
    }
    cx.check_keys(root, "", ROOT_KEYS);

    if let Some((k, item)) = root.get_key_value("host") {
        match item.as_table_like() {
            Some(t) => frag.host = cx.host(t),
            None => cx.type_error(k, item, "host", "a table `[host]`"),
        }
    }
    if let Some((k, item)) = root.get_key_value("slurm") {
        match item.as_table_like() {
            Some(t) => frag.slurm = cx.slurm(t),
            None => cx.type_error(k, item, "slurm", "a table `[slurm]`"),
        }
    }
    if let Some((k, item)) = root.get_key_value("teams") {
        match item.as_table_like() {
            Some(t) if t.len() > caps::MAX_TEAMS => cx.error(
                span(k, item),
                "teams",
                over_cap("teams", t.len(), caps::MAX_TEAMS, "MAX_TEAMS"),
                Some("split the host, or check the file was generated as intended".into()),
            ),
            Some(t) => {
                for (name, titem) in t.iter() {
                    let key = t.key(name).expect("key of iterated entry");
                    if let Some(team) = cx.team(name, key, titem) {
                        frag.teams.push(team);
                    }
                }
            }
            None => cx.type_error(k, item, "teams", "tables `[teams.NAME]`"),
        }
    }
    if let Some((k, item)) = root.get_key_value("gpu") {
        match tables_of(item) {
            Some(entries) if entries.len() > caps::MAX_GPU_ENTRIES => cx.error(
                span(k, item),
                "gpu",
                over_cap(
                    "[[gpu]] entries",
                    entries.len(),
                    caps::MAX_GPU_ENTRIES,
                    "MAX_GPU_ENTRIES",
                ),
                Some("one entry can name many GPUs (index = [...], model, all)".into()),
            ),
            Some(entries) => {
                for (i, (t, sp)) in entries.into_iter().enumerate() {
                    let key = format!("gpu[{i}]");
                    let sp = sp.or_else(|| k.span());
                    match cx.gpu(&key, t, sp) {
                        Some(g) => frag.gpus.push(g),
                        None => frag.teams_of_bad_gpus.extend(teams_named(t)),
                    }
                }
            }
            None => cx.type_error(k, item, "gpu", "`[[gpu]]` entries"),
        }
    }
    Some(frag)
}

/// The team names a `[[gpu]]` entry writes (`owner`, `shared`, `mig[].owner`), whatever else
/// is wrong with it.
fn teams_named(t: &dyn TableLike) -> Vec<String> {
    let strs = |i: &Item| -> Vec<String> {
        match i.as_array() {
            Some(a) => a
                .iter()
                .filter_map(|v| v.as_str())
                .map(String::from)
                .collect(),
            None => i.as_str().map(String::from).into_iter().collect(),
        }
    };
    let mut out: Vec<String> = ["owner", "shared"]
        .iter()
        .filter_map(|k| t.get(k))
        .flat_map(strs)
        .collect();
    match t.get("mig") {
        Some(Item::Value(Value::Array(a))) => out.extend(a.iter().filter_map(|m| {
            m.as_inline_table()?
                .get("owner")?
                .as_str()
                .map(String::from)
        })),
        Some(Item::ArrayOfTables(a)) => out.extend(
            a.iter()
                .filter_map(|m| m.get("owner")?.as_str().map(String::from)),
        ),
        _ => {}
    }
    out
}

/// A table of an array and its span.
type Elem<'a> = (&'a dyn TableLike, Option<Range<usize>>);

/// The elements of `[[x]]` or `x = [{...}, ...]`, each with its span.
fn tables_of(item: &Item) -> Option<Vec<Elem<'_>>> {
    match item {
        Item::ArrayOfTables(a) => Some(a.iter().map(|t| (t as &dyn TableLike, t.span())).collect()),
        Item::Value(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_inline_table().map(|t| (t as &dyn TableLike, v.span())))
            .collect(),
        _ => None,
    }
}

/// Where a value is, falling back to its key (implicit tables have no span of their own).
fn span(k: &Key, item: &Item) -> Option<Range<usize>> {
    item.span().or_else(|| k.span())
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Levenshtein distance, for "did you mean" hints on misspelt keys and team names.
pub(crate) fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// `help`, led by "did you mean 'X'?" when X is the closest candidate within a small edit
/// distance of `word`.
pub(crate) fn suggest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    help: String,
) -> String {
    // Distance is quadratic in length: a long word is no typo of a short name anyway.
    if word.len() > 64 {
        return help;
    }
    let closest = candidates
        .into_iter()
        .map(|c| (distance(word, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 4) && *d > 0)
        .min();
    match closest {
        Some((_, c)) => format!("did you mean '{c}'? {help}"),
        None => help,
    }
}

/// Parsing context: the file, its line starts, and the diagnostics sink.
struct Cx<'a> {
    file: &'a Path,
    text: &'a str,
    line_starts: Vec<usize>,
    diags: &'a mut Vec<Diagnostic>,
}

impl<'a> Cx<'a> {
    fn new(file: &'a Path, text: &'a str, diags: &'a mut Vec<Diagnostic>) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Cx {
            file,
            text,
            line_starts,
            diags,
        }
    }

    fn loc(&self, sp: Option<Range<usize>>) -> Loc {
        let off = sp.map(|r| r.start).unwrap_or(0).min(self.text.len());
        let line = self.line_starts.partition_point(|&s| s <= off);
        let start = self.line_starts[line - 1];
        let col = self.text[start..off].chars().count() + 1;
        Loc {
            file: self.file.to_path_buf(),
            line: line as u32,
            col: col as u32,
        }
    }

    fn error(
        &mut self,
        sp: Option<Range<usize>>,
        key: &str,
        message: String,
        help: Option<String>,
    ) {
        let loc = self.loc(sp);
        self.diags
            .push(Diagnostic::error(Some(loc), key, message, help));
    }

    fn type_error(&mut self, k: &Key, item: &Item, key: &str, expected: &str) {
        self.error(
            span(k, item),
            key,
            format!("expected {expected}, found {}", type_name(item)),
            None,
        );
    }

    fn check_keys(&mut self, t: &dyn TableLike, path: &str, allowed: &[&str]) {
        for (name, _) in t.iter() {
            if allowed.contains(&name) {
                continue;
            }
            let sp = t.key(name).and_then(Key::span);
            let help = format!("expected one of: {}", allowed.join(", "));
            let help = suggest(name, allowed.iter().copied(), help);
            self.error(
                sp,
                &join(path, name),
                format!("unknown key '{name}'"),
                Some(help),
            );
        }
    }

    /// Run `f` on the value of `key` in `t` when present, reporting its `Err` at the value.
    fn field<T>(
        &mut self,
        t: &dyn TableLike,
        path: &str,
        key: &str,
        f: impl FnOnce(&Item) -> Result<T, (String, Option<String>)>,
    ) -> Option<At<T>> {
        let (k, item) = t.get_key_value(key)?;
        let sp = span(k, item);
        match f(item) {
            Ok(value) => Some(At {
                value,
                loc: self.loc(sp),
            }),
            Err((msg, help)) => {
                self.error(sp, &join(path, key), msg, help);
                None
            }
        }
    }

    fn host(&mut self, t: &dyn TableLike) -> HostPart {
        if let Some(k) = t.key("mps-control") {
            // Accepted once and never used: gpuctl-mps@.service runs the binary itself.
            self.error(
                k.span(),
                "host.mps-control",
                "`mps-control` is no longer a setting: nothing used it".into(),
                Some(
                    "remove the line; to run another nvidia-cuda-mps-control, override ExecStart= \
                     of gpuctl-mps@.service with a drop-in"
                        .into(),
                ),
            );
        }
        let keys: Vec<&str> = HOST_KEYS.iter().copied().chain(["mps-control"]).collect();
        self.check_keys(t, "host", &keys);
        let health = match t.get_key_value("health") {
            None => HealthPart::default(),
            Some((k, item)) => match item.as_table_like() {
                Some(h) => self.health(h),
                None => {
                    self.type_error(k, item, "host.health", "a table `[host.health]`");
                    HealthPart::default()
                }
            },
        };
        HostPart {
            health,
            reconfigure: self.field(t, "host", "reconfigure", |i| {
                let s = want_str(i)?;
                match s {
                    "when-idle" => Ok(Reconfigure::WhenIdle),
                    "drain" => Ok(Reconfigure::Drain),
                    "never" => Ok(Reconfigure::Never),
                    _ => Err((
                        format!("unknown reconfigure mode '{s}'"),
                        Some("expected one of: when-idle, drain, never".into()),
                    )),
                }
            }),
            drain_timeout: self.field(t, "host", "drain-timeout", |i| {
                duration_item(i, MAX_DRAIN_TIMEOUT, "MAX_DRAIN_TIMEOUT")
            }),
            nvml_library: self.field(t, "host", "nvml-library", |i| abs_path(want_str(i)?)),
            accounting: self.field(t, "host", "accounting", |i| {
                let s = want_str(i)?;
                match s {
                    "auto" => Ok(Accounting::Auto),
                    "on" => Ok(Accounting::On),
                    "off" => Ok(Accounting::Off),
                    _ => Err((
                        format!("unknown accounting mode '{s}'"),
                        Some("expected one of: auto, on, off".into()),
                    )),
                }
            }),
            outside: self.field(t, "host", "outside", |i| match want_str(i)? {
                "closed" => Ok(Outside::Closed),
                "open" => Ok(Outside::Open),
                s => Err((
                    format!("unknown outside mode '{s}'"),
                    Some("expected one of: closed, open".into()),
                )),
            }),
            admin_group: self.field(t, "host", "admin-group", |i| {
                let s = want_str(i)?;
                match s.strip_prefix('@').unwrap_or(s) {
                    g if valid_unix_name(g) => Ok(g.to_string()),
                    _ => Err((
                        format!("invalid group name '{s}'"),
                        Some(
                            "a group name as NSS knows it, e.g. \"gpu-admins\" (letters, digits, \
                             _ - ., at most 32 characters)"
                                .into(),
                        ),
                    )),
                }
            }),
            fair_share_half_life: self.field(t, "host", "fair-share-half-life", |i| {
                positive_duration(i, MAX_HALF_LIFE, "MAX_HALF_LIFE", "a half-life")
            }),
        }
    }

    fn health(&mut self, t: &dyn TableLike) -> HealthPart {
        const P: &str = "host.health";
        self.check_keys(t, P, HEALTH_KEYS);
        HealthPart {
            application_xids: self.field(t, P, "application-xids", |i| {
                let v = list_of(i, Value::as_integer).ok_or_else(|| {
                    (
                        format!("expected a list of XID numbers, found {}", type_name(i)),
                        Some("e.g. application-xids = [13, 31, 43, 45, 68, 109]".into()),
                    )
                })?;
                if let Some(bad) = v.iter().find(|x| !(1..=MAX_XID).contains(*x)) {
                    return Err((
                        format!("{bad} is not an XID"),
                        Some(format!("XIDs are numbers from 1 to {MAX_XID} (MAX_XID)")),
                    ));
                }
                let v: Vec<u32> = v.into_iter().map(|x| x as u32).collect();
                if let Some((x, name)) = v
                    .iter()
                    .find_map(|x| crate::health::fatal_name(*x).map(|n| (x, n)))
                {
                    return Err((
                        format!("XID {x} ({name}) is fatal: it always quarantines the device"),
                        Some("list only XIDs an application causes; see docs/health.md".into()),
                    ));
                }
                no_dups(&v)?;
                Ok(v)
            }),
            on_fault: self.field(t, P, "on-fault", |i| match want_str(i)? {
                "keep" => Ok(crate::health::OnFault::Keep),
                "stop" => Ok(crate::health::OnFault::Stop),
                s => Err((
                    format!("unknown on-fault action '{s}'"),
                    Some("expected one of: keep, stop".into()),
                )),
            }),
            grace: self.field(t, P, "grace", idle_duration),
            reset_when_idle: self.field(t, P, "reset-when-idle", |i| {
                i.as_bool().ok_or_else(|| {
                    (
                        format!("expected true or false, found {}", type_name(i)),
                        None,
                    )
                })
            }),
        }
    }

    fn slurm(&mut self, t: &dyn TableLike) -> SlurmPart {
        self.check_keys(t, "slurm", SLURM_KEYS);
        let boolean = |i: &Item| {
            i.as_bool().ok_or_else(|| {
                (
                    format!("expected true or false, found {}", type_name(i)),
                    None,
                )
            })
        };
        SlurmPart {
            enabled: self.field(t, "slurm", "enabled", boolean),
            gres_file: self.field(t, "slurm", "gres-file", |i| abs_path(want_str(i)?)),
            node_file: self.field(t, "slurm", "node-file", |i| abs_path(want_str(i)?)),
            node_name: self.field(t, "slurm", "node-name", |i| {
                let s = want_str(i)?;
                if valid_node_name(s) {
                    Ok(s.to_string())
                } else {
                    Err((
                        format!("invalid Slurm node name '{s}'"),
                        Some(
                            "the NodeName of slurm.conf: letters, digits, '-', '_' and '.', \
                             at most 64 characters"
                                .into(),
                        ),
                    ))
                }
            }),
            team_types: self.field(t, "slurm", "team-types", boolean),
            restart: self.field(t, "slurm", "restart", |i| {
                let v = list_of(i, |v| v.as_str().map(str::to_string)).ok_or_else(|| {
                    (
                        format!("expected a list of unit names, found {}", type_name(i)),
                        Some("e.g. restart = [\"slurmd.service\"]".into()),
                    )
                })?;
                if let Some(bad) = v
                    .iter()
                    .find(|u| !valid_unit_glob(u) || u.contains(['*', '?']) || !u.contains('.'))
                {
                    return Err((
                        format!("'{bad}' is not a unit name"),
                        Some("a unit name with its suffix, e.g. \"slurmd.service\"".into()),
                    ));
                }
                no_dups(&v)?;
                Ok(v)
            }),
        }
    }

    fn team(&mut self, name: &str, k: &Key, item: &Item) -> Option<TeamPart> {
        let path = format!("teams.{name}");
        let loc = self.loc(k.span());
        if !valid_team_name(name) {
            let why = crate::names::team_name_problem(name);
            let help = "a team name matches [a-z][a-z0-9_]{0,30}".to_string();
            let help = match crate::names::team_name_fix(name) {
                Some(fix) => format!("did you mean '{fix}'? {help}"),
                None => help,
            };
            self.error(
                k.span(),
                &path,
                format!("invalid team name '{name}': {why}"),
                Some(help),
            );
        }
        if name == crate::names::LOANS {
            self.error(
                k.span(),
                &path,
                format!("team name '{name}' is reserved: borrowed jobs run in gpu-{name}.slice"),
                Some("choose another name for this team".into()),
            );
        }
        let Some(t) = item.as_table_like() else {
            self.type_error(k, item, &path, "a table `[teams.NAME]`");
            return None;
        };
        let keys: Vec<&str> = ["members"]
            .iter()
            .chain(LIMIT_KEYS)
            .chain(&["mps", "idle", "placement", "lend", "borrow"])
            .copied()
            .collect();
        self.check_keys(t, &path, &keys);
        let p = path.as_str();
        let mut errors = Vec::new();
        let limits = LimitsPart::parse(t, &|k, i| self.loc(span(k, i)), &mut errors);
        for (key, loc, (msg, help)) in errors {
            self.diags
                .push(Diagnostic::error(Some(loc), &join(p, key), msg, help));
        }
        let team = TeamPart {
            name: name.to_string(),
            loc,
            members: self.field(t, p, "members", members),
            limits,
            mps: match t.get_key_value("mps") {
                None => None,
                Some((mk, mi)) => match mi.as_table_like() {
                    Some(mt) => Some(self.mps(&join(p, "mps"), mt, span(mk, mi))),
                    None => {
                        self.type_error(mk, mi, &join(p, "mps"), "a table `[teams.NAME.mps]`");
                        None
                    }
                },
            },
            idle: match t.get_key_value("idle") {
                None => None,
                Some((ik, ii)) => match ii.as_table_like() {
                    Some(it) => Some(self.idle(&join(p, "idle"), it, span(ik, ii))),
                    None => {
                        self.type_error(ik, ii, &join(p, "idle"), "a table `[teams.NAME.idle]`");
                        None
                    }
                },
            },
            placement: match t.get_key_value("placement") {
                None => None,
                Some((pk, pi)) => match pi.as_table_like() {
                    Some(pt) => Some(self.placement(&join(p, "placement"), pt, span(pk, pi))),
                    None => {
                        let what = "a table `[teams.NAME.placement]`";
                        self.type_error(pk, pi, &join(p, "placement"), what);
                        None
                    }
                },
            },
            lend: match t.get_key_value("lend") {
                None => None,
                Some((lk, li)) => match li.as_table_like() {
                    Some(lt) => Some(self.lend(&join(p, "lend"), lt, span(lk, li))),
                    None => {
                        self.type_error(lk, li, &join(p, "lend"), "a table `[teams.NAME.lend]`");
                        None
                    }
                },
            },
            borrow: self.field(t, p, "borrow", |i| {
                i.as_bool().ok_or_else(|| {
                    (
                        format!("expected true or false, found {}", type_name(i)),
                        None,
                    )
                })
            }),
        };
        Some(team)
    }

    fn mps(&mut self, path: &str, t: &dyn TableLike, sp: Option<Range<usize>>) -> MpsPart {
        self.check_keys(t, path, MPS_KEYS);
        MpsPart {
            loc: self.loc(sp),
            active_thread_percentage: self.field(t, path, "active-thread-percentage", |i| {
                int_in(i, 1, 100).map(|n| n as u32)
            }),
            pinned_memory_limit: self.field(t, path, "pinned-memory-limit", |i| {
                match size_item(i, false)? {
                    Some(Size::Bytes(b)) if b > 0 => Ok(b),
                    _ => Err((
                        "the pinned memory limit must be a positive size".into(),
                        Some(SIZE_HELP_BYTES.into()),
                    )),
                }
            }),
            user: self.field(t, path, "user", |i| {
                let s = want_str(i)?;
                if valid_unix_name(s) {
                    Ok(s.to_string())
                } else {
                    Err((
                        format!("invalid user name '{s}'"),
                        Some("expected a Unix user name such as \"mps-infer\"".into()),
                    ))
                }
            }),
        }
    }

    fn placement(
        &mut self,
        path: &str,
        t: &dyn TableLike,
        sp: Option<Range<usize>>,
    ) -> PlacementPart {
        self.check_keys(t, path, PLACEMENT_KEYS);
        PlacementPart {
            loc: self.loc(sp),
            jobs_per_device: self.field(t, path, "jobs-per-device", |i| {
                int_in(i, 0, MAX_JOBS_PER_DEVICE).map(|n| n as u32)
            }),
            gpus: self.field(t, path, "gpus", |i| {
                let help =
                    Some("a whole number from 1, or \"all\" (gpus = 2, gpus = \"all\")".into());
                match (i.as_integer(), i.as_str()) {
                    (Some(n), _) if (1..=i64::from(u32::MAX)).contains(&n) => {
                        Ok(crate::placement::Gpus::Count(n as u32))
                    }
                    (_, Some("all")) => Ok(crate::placement::Gpus::All),
                    _ => Err((
                        format!("expected a device count or \"all\", found {}", type_name(i)),
                        help,
                    )),
                }
            }),
            gpu_memory: self.field(t, path, "gpu-memory", |i| match size_item(i, false)? {
                Some(Size::Bytes(b)) if b > 0 => Ok(b),
                _ => Err((
                    "a job's GPU memory must be a positive size".into(),
                    Some(SIZE_HELP_BYTES.into()),
                )),
            }),
        }
    }

    fn lend(&mut self, path: &str, t: &dyn TableLike, sp: Option<Range<usize>>) -> LendPart {
        self.check_keys(t, path, LEND_KEYS);
        let to = match t.get_key_value("to") {
            None => None,
            Some((k, item)) => {
                let key = join(path, "to");
                let help = Some("to = \"all\" or a list of team names, e.g. [\"interns\"]".into());
                match (item.as_str(), item.as_array()) {
                    (Some("all"), _) => Some(LendToPart::All),
                    (_, Some(arr)) if arr.len() > caps::MAX_TEAMS => {
                        let m = over_cap("teams", arr.len(), caps::MAX_TEAMS, "MAX_TEAMS");
                        self.error(span(k, item), &key, m, None);
                        None
                    }
                    (_, Some(arr)) if arr.is_empty() => {
                        self.error(span(k, item), &key, "lends to no team".into(), help);
                        None
                    }
                    (_, Some(arr)) => {
                        let mut out: Vec<At<String>> = Vec::new();
                        let mut ok = true;
                        for v in arr.iter() {
                            match v.as_str() {
                                Some(s) if out.iter().any(|o| o.value == s) => {
                                    let m = format!("team '{s}' is listed twice");
                                    self.error(v.span(), &key, m, None);
                                    ok = false;
                                }
                                Some(s) => out.push(At {
                                    value: s.to_string(),
                                    loc: self.loc(v.span()),
                                }),
                                None => {
                                    let m = "expected a team name".into();
                                    self.error(v.span(), &key, m, help.clone());
                                    ok = false;
                                }
                            }
                        }
                        ok.then_some(LendToPart::Teams(out))
                    }
                    (Some(s), None) => {
                        let m = format!("'{s}' is neither \"all\" nor a list of teams");
                        self.error(span(k, item), &key, m, help);
                        None
                    }
                    _ => {
                        self.type_error(k, item, &key, "\"all\" or a list of team names");
                        None
                    }
                }
                .map(|value| At {
                    value,
                    loc: self.loc(span(k, item)),
                })
            }
        };
        LendPart {
            loc: self.loc(sp),
            to,
            after: self.field(t, path, "after", |i| {
                positive_duration(i, caps::MAX_IDLE_WINDOW, "MAX_IDLE_WINDOW", "the idle time")
            }),
            grace: self.field(t, path, "grace", |i| {
                positive_duration(i, MAX_LEND_GRACE, "MAX_LEND_GRACE", "a borrower's grace")
            }),
            when: self.field(t, path, "when", |i| {
                windows(
                    i,
                    "no window: nothing would ever be lent",
                    "remove `when` to lend at any time, or remove the lend table",
                )
            }),
        }
    }

    fn idle(&mut self, path: &str, t: &dyn TableLike, sp: Option<Range<usize>>) -> IdlePart {
        self.check_keys(t, path, IDLE_KEYS);
        let positive = |i: &Item| -> Result<Duration, Fail> {
            let d = idle_duration(i)?;
            if d.is_zero() {
                return Err((
                    "the idle window must be longer than 0".into(),
                    Some(DURATION_HELP.into()),
                ));
            }
            Ok(d)
        };
        IdlePart {
            loc: self.loc(sp),
            after: self.field(t, path, "after", positive),
            below: self.field(t, path, "below", |i| percent_item(i, "activity threshold")),
            action: self.field(t, path, "action", |i| match want_str(i)? {
                "report" => Ok(IdleAction::Report),
                "warn" => Ok(IdleAction::Warn),
                "stop" => Ok(IdleAction::Stop),
                s => Err((
                    format!("unknown idle action '{s}'"),
                    Some("expected one of: report, warn, stop".into()),
                )),
            }),
            grace: self.field(t, path, "grace", idle_duration),
            exclude: self.field(t, path, "exclude", |i| {
                let v = list_of(i, |v| v.as_str().map(str::to_string)).ok_or_else(|| {
                    (
                        format!("expected a list of unit-name globs, found {}", type_name(i)),
                        Some("e.g. exclude = [\"triton-*.service\"]".into()),
                    )
                })?;
                if let Some(bad) = v.iter().find(|g| !valid_unit_glob(g)) {
                    return Err((
                        format!("'{bad}' is not a unit-name glob"),
                        Some(
                            "unit names with * and ? wildcards, e.g. \"triton-*.service\"; \
                             letters, digits and :-_.\\@ only"
                                .into(),
                        ),
                    ));
                }
                no_dups(&v)?;
                Ok(v)
            }),
            memory_alarm: self.field(t, path, "memory-alarm", |i| percent_item(i, "memory alarm")),
        }
    }

    fn gpu(&mut self, key: &str, t: &dyn TableLike, sp: Option<Range<usize>>) -> Option<GpuPart> {
        let allowed: Vec<&str> = SELECTOR_KEYS
            .iter()
            .chain(USE_KEYS)
            .chain(&["layout", "reslice"])
            .copied()
            .collect();
        self.check_keys(t, key, &allowed);
        let loc = self.loc(sp.clone());
        let layouts = self.layouts(key, t);
        let reslice = match t.get_key_value("reslice") {
            None => None,
            Some((k, item)) => match item.as_table_like() {
                Some(rt) => Some(self.reslice(&join(key, "reslice"), rt, span(k, item))),
                None => {
                    let rkey = join(key, "reslice");
                    self.type_error(
                        k,
                        item,
                        &rkey,
                        "a table { after = \"10m\", hold = \"30m\" }",
                    );
                    None
                }
            },
        };

        let selector = self
            .one_of(
                t,
                key,
                sp.clone(),
                SELECTOR_KEYS,
                "GPU selectors",
                "no GPU selector",
                "set exactly one of: index = [0, 1], uuid = [\"GPU-…\"], model = \"*H100*\", \
                 all = true",
            )
            .and_then(|one| self.selector(t, key, one));
        // `owner`/`shared` beside `mig = []` reads as "MIG on, for this team", which the empty
        // geometry cannot give: say so rather than only "several uses".
        let empty_mig = matches!(t.get("mig"), Some(Item::Value(Value::Array(a))) if a.is_empty());
        if let Some(other) = ["owner", "shared"]
            .into_iter()
            .find(|k| empty_mig && t.contains_key(k))
        {
            self.error(
                t.key(other).and_then(Key::span),
                &join(key, other),
                format!(
                    "`{other}` beside `mig = []`: an entry with mig = [] keeps its GPUs in MIG \
                     mode with no instances and gives them to no team"
                ),
                Some(
                    "to give a team MIG devices, list them: mig = [{ profile = \"3g.40gb\", \
                     owner = \"infer\" }]; to give it the whole GPU, drop mig = []"
                        .into(),
                ),
            );
            return None;
        }
        let usage = self
            .one_of(
                t,
                key,
                sp,
                USE_KEYS,
                "uses",
                "the entry says nothing about what the GPUs are for",
                "set exactly one of: owner = \"team\", shared = [\"a\", \"b\"], mig = [...]",
            )
            .and_then(|one| self.usage(t, key, one));
        Some(GpuPart {
            key: key.to_string(),
            loc,
            selector: selector?,
            usage: usage?,
            layouts,
            reslice,
        })
    }

    /// `[[gpu.layout]]` of entry `key`: those that parse (the others' errors are reported).
    fn layouts(&mut self, key: &str, t: &dyn TableLike) -> Vec<LayoutPart> {
        let Some((k, item)) = t.get_key_value("layout") else {
            return Vec::new();
        };
        let lkey = join(key, "layout");
        let Some(elems) = tables_of(item) else {
            self.type_error(
                k,
                item,
                &lkey,
                "[[gpu.layout]] tables { name, mig | owner | shared }",
            );
            return Vec::new();
        };
        if let Err(m) = within!("layouts", elems.len(), MAX_LAYOUTS) {
            self.error(span(k, item), &lkey, m, None);
            return Vec::new();
        }
        let mut out = Vec::new();
        for (i, (lt, sp)) in elems.into_iter().enumerate() {
            if let Some(l) = self.layout(&format!("{lkey}[{i}]"), lt, sp.or_else(|| k.span())) {
                out.push(l);
            }
        }
        out
    }

    fn layout(
        &mut self,
        key: &str,
        t: &dyn TableLike,
        sp: Option<Range<usize>>,
    ) -> Option<LayoutPart> {
        let allowed: Vec<&str> = LAYOUT_KEYS.iter().chain(USE_KEYS).copied().collect();
        self.check_keys(t, key, &allowed);
        let loc = self.loc(sp.clone());
        if !t.contains_key("name") {
            self.error(
                sp.clone(),
                key,
                "missing name".into(),
                Some("e.g. name = \"night\"".into()),
            );
        }
        let name = self.field(t, key, "name", |i| {
            let s = want_str(i)?;
            if s == crate::policy::DEFAULT_LAYOUT {
                return Err((
                    "`default` names the entry's own use".into(),
                    Some("give this layout another name, e.g. \"night\"".into()),
                ));
            }
            if s.is_empty()
                || s.len() > 64
                || !s
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err((
                    format!("{} is not a layout name", crate::settings::value::quote(s)),
                    Some("letters, digits, '-' and '_', at most 64, e.g. \"night\"".into()),
                ));
            }
            Ok(s.to_string())
        });
        let usage = self
            .one_of(
                t,
                key,
                sp,
                USE_KEYS,
                "uses",
                "the layout says nothing about what the GPUs are for",
                "set exactly one of: owner = \"team\", shared = [\"a\", \"b\"], mig = [...]",
            )
            .and_then(|one| self.usage(t, key, one));
        let when = self.field(t, key, "when", |i| {
            windows(
                i,
                "no window: the layout would never be preferred",
                "remove `when` to take this layout only for waiting work",
            )
        });
        Some(LayoutPart {
            key: key.to_string(),
            loc,
            name: name?,
            usage: usage?,
            when,
        })
    }

    fn reslice(&mut self, path: &str, t: &dyn TableLike, sp: Option<Range<usize>>) -> ReslicePart {
        self.check_keys(t, path, RESLICE_KEYS);
        ReslicePart {
            loc: self.loc(sp),
            after: self.field(t, path, "after", |i| {
                positive_duration(i, caps::MAX_IDLE_WINDOW, "MAX_IDLE_WINDOW", "the idle time")
            }),
            hold: self.field(t, path, "hold", |i| {
                positive_duration(i, caps::MAX_IDLE_WINDOW, "MAX_IDLE_WINDOW", "the hold time")
            }),
        }
    }

    /// The one key of `keys` that `t` sets. None set is an error at the entry (`none`, with
    /// `none_help`); several, an error at the second one, naming them all.
    #[allow(clippy::too_many_arguments)]
    fn one_of(
        &mut self,
        t: &dyn TableLike,
        key: &str,
        sp: Option<Range<usize>>,
        keys: &[&'static str],
        several: &str,
        none: &str,
        none_help: &str,
    ) -> Option<&'static str> {
        let present: Vec<&'static str> =
            keys.iter().copied().filter(|k| t.contains_key(k)).collect();
        match present.as_slice() {
            [one] => return Some(one),
            [] => self.error(sp, key, none.into(), Some(none_help.into())),
            many => self.error(
                t.key(many[1]).and_then(Key::span),
                &join(key, many[1]),
                format!("several {several}: {}", many.join(", ")),
                Some(format!("set exactly one of: {}", keys.join(", "))),
            ),
        }
        None
    }

    fn selector(&mut self, t: &dyn TableLike, path: &str, which: &str) -> Option<At<Selector>> {
        self.field(t, path, which, |i| {
            if let Some(a) = i.as_array() {
                within!("GPUs", a.len(), MAX_SELECTED_GPUS).map_err(|m| (m, None))?;
            }
            Self::selector_value(i, which)
        })
    }

    fn selector_value(i: &Item, which: &str) -> Result<Selector, Fail> {
        match which {
            "index" => {
                let v = list_of(i, |v| match v.as_integer() {
                    Some(n) if (0..=u32::MAX as i64).contains(&n) => Some(n as u32),
                    _ => None,
                })
                .ok_or_else(|| {
                    (
                        format!("expected a list of GPU indices, found {}", type_name(i)),
                        Some("e.g. index = [0, 1]".into()),
                    )
                })?;
                no_dups(&v)?;
                Ok(Selector::Index(v))
            }
            "uuid" => {
                let v = list_of(i, |v| v.as_str().map(str::to_string)).ok_or_else(|| {
                    (
                        format!("expected a list of GPU UUIDs, found {}", type_name(i)),
                        Some("e.g. uuid = [\"GPU-5a1b…\"]".into()),
                    )
                })?;
                if let Some(bad) = v.iter().find(|u| !valid_gpu_uuid(u)) {
                    return Err((
                        format!("'{bad}' is not a GPU UUID (GPU- and 8-4-4-4-12 hex digits)"),
                        Some(
                            "GPU UUIDs look like GPU-5a1b2c3d-…, as `nvidia-smi -L` prints".into(),
                        ),
                    ));
                }
                no_dups(&v)?;
                Ok(Selector::Uuid(v))
            }
            "model" => {
                let s = want_str(i)?;
                if s.is_empty() {
                    return Err(("empty model pattern".into(), Some(MODEL_HELP.into())));
                }
                Ok(Selector::Model(s.to_string()))
            }
            _ => match i.as_bool() {
                Some(true) => Ok(Selector::All),
                Some(false) => Err((
                    "`all = false` selects nothing".into(),
                    Some("write `all = true`, or use index/uuid/model".into()),
                )),
                None => Err((format!("expected true, found {}", type_name(i)), None)),
            },
        }
    }

    fn usage(&mut self, t: &dyn TableLike, path: &str, which: &str) -> Option<UsagePart> {
        match which {
            "owner" => self
                .field(t, path, "owner", |i| want_str(i).map(str::to_string))
                .map(UsagePart::Owned),
            "shared" => {
                let (k, item) = t.get_key_value("shared")?;
                let key = join(path, "shared");
                let Some(arr) = item.as_array() else {
                    self.type_error(k, item, &key, "a list of team names");
                    return None;
                };
                if let Err(m) = within!("teams", arr.len(), MAX_SHARED_TEAMS) {
                    self.error(span(k, item), &key, m, None);
                    return None;
                }
                if arr.is_empty() {
                    self.error(
                        span(k, item),
                        &key,
                        "no teams to share with".into(),
                        Some("list at least one team".into()),
                    );
                    return None;
                }
                let mut out = Vec::new();
                for v in arr.iter() {
                    match v.as_str() {
                        Some(s) => out.push(At {
                            value: s.to_string(),
                            loc: self.loc(v.span()),
                        }),
                        None => self.error(v.span(), &key, "expected a team name".into(), None),
                    }
                }
                (!out.is_empty()).then_some(UsagePart::Shared(out))
            }
            _ => {
                let (k, item) = t.get_key_value("mig")?;
                let key = join(path, "mig");
                let Some(elems) = tables_of(item) else {
                    self.type_error(
                        k,
                        item,
                        &key,
                        "a list of { profile, owner, count, compute }",
                    );
                    return None;
                };
                if let Err(m) = within!("MIG entries", elems.len(), MAX_MIG_ENTRIES) {
                    self.error(span(k, item), &key, m, None);
                    return None;
                }
                // `mig = []`: MIG on, no instances (a GPU held for later carving, no team's).
                let mut out = Vec::new();
                let mut ok = true;
                for (i, (et, sp)) in elems.into_iter().enumerate() {
                    match self.mig(&format!("{key}[{i}]"), et, sp.or_else(|| k.span())) {
                        Some(m) => out.push(m),
                        None => ok = false,
                    }
                }
                ok.then_some(UsagePart::Mig(out))
            }
        }
    }

    fn mig(&mut self, key: &str, t: &dyn TableLike, sp: Option<Range<usize>>) -> Option<MigPart> {
        self.check_keys(t, key, MIG_KEYS);
        let loc = self.loc(sp.clone());
        let profile = self.field(t, key, "profile", |i| want_str(i).map(str::to_string));
        let owner = self.field(t, key, "owner", |i| want_str(i).map(str::to_string));
        let count = match t.get("count") {
            None => Some(1),
            Some(_) => self
                .field(t, key, "count", |i| int_in(i, 1, 7))
                .map(|a| a.value as u32),
        };
        let compute = self.field(t, key, "compute", |i| {
            if let Some(a) = i.as_array() {
                within!("compute instances", a.len(), MAX_COMPUTE).map_err(|m| (m, None))?;
            }
            list_of(i, |v| v.as_str().map(str::to_string))
                .filter(|v| !v.is_empty())
                .ok_or_else(|| {
                    (
                        "expected a non-empty list of compute-instance profiles".into(),
                        Some("e.g. compute = [\"1c\", \"2c\"]".into()),
                    )
                })
        });
        let missing: Vec<&str> = ["profile", "owner"]
            .into_iter()
            .filter(|k| !t.contains_key(k))
            .collect();
        if !missing.is_empty() {
            self.error(
                sp,
                key,
                format!("missing {}", missing.join(" and ")),
                Some(
                    "a MIG entry is { profile = \"3g.40gb\", owner = \"team\", count = 1 }".into(),
                ),
            );
        }
        Some(MigPart {
            key: key.to_string(),
            loc,
            profile: profile?,
            owner: owner?,
            count: count?,
            compute,
        })
    }
}

/// A `when`: a window or a list of windows, at least one (`empty` and `empty_help` say what no
/// window would mean there).
fn windows(i: &Item, empty: &str, empty_help: &str) -> Result<Vec<Window>, Fail> {
    let help = Some(WINDOW_HELP.to_string());
    let texts = list_of(i, |v| v.as_str().map(str::to_string)).ok_or_else(|| {
        (
            format!(
                "expected a window or a list of windows, found {}",
                type_name(i)
            ),
            help.clone(),
        )
    })?;
    within!("windows", texts.len(), MAX_WINDOWS).map_err(|m| (m, None))?;
    if texts.is_empty() {
        return Err((empty.into(), Some(empty_help.into())));
    }
    texts
        .iter()
        .map(|w| Window::parse(w).map_err(|m| (m, help.clone())))
        .collect()
}

const MODEL_HELP: &str = "a glob over the NVML name or the simulate name, e.g. \"*H100*\"";

/// The longest idle window (`after`, `grace`): a month. Longer is a typo (`"15d"` for
/// `"15m"`) more often than a rule, and it bounds the idle tracker's arithmetic.
/// An idle window: a duration of at most [`caps::MAX_IDLE_WINDOW`].
fn idle_duration(i: &Item) -> Result<Duration, Fail> {
    duration_item(i, caps::MAX_IDLE_WINDOW, "MAX_IDLE_WINDOW")
}

/// A duration more than 0 and at most `max` (named `max_name` in the error); `what` names it.
fn positive_duration(
    i: &Item,
    max: Duration,
    max_name: &str,
    what: &str,
) -> Result<Duration, Fail> {
    let d = duration_item(i, max, max_name)?;
    if d.is_zero() {
        return Err((
            format!("{what} must be longer than 0"),
            Some(DURATION_HELP.into()),
        ));
    }
    Ok(d)
}

/// A percentage written `"5%"` (a string; a bare number would be ambiguous between a share and
/// a fraction): more than 0, at most 100.
fn percent_item(i: &Item, what: &str) -> Result<f64, Fail> {
    let fail = |m: String| {
        let help = "is a percentage such as \"5%\" or \"2.5%\" (more than 0, at most 100)";
        (m, Some(format!("the {what} {help}")))
    };
    let s = i
        .as_str()
        .ok_or_else(|| fail(format!("expected a percentage, found {}", type_name(i))))?;
    let v: f64 = s
        .trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| fail(format!("'{s}' is not a percentage")))?;
    if !(v > 0.0 && v <= 100.0) {
        return Err(fail(format!(
            "'{s}': a percentage must be more than 0 and at most 100"
        )));
    }
    Ok(v)
}

/// A unit-name glob: the characters systemd allows in unit names, plus `*` and `?`.
/// A Slurm `NodeName` gpuctl may pass to `scontrol` as one argument.
fn valid_node_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn valid_unit_glob(g: &str) -> bool {
    !g.is_empty()
        && g.len() <= 255
        && g.chars()
            .all(|c| c.is_ascii_alphanumeric() || ":-_.\\@*?".contains(c))
}

fn abs_path(s: &str) -> Result<PathBuf, Fail> {
    if s.starts_with('/') {
        Ok(PathBuf::from(s))
    } else {
        Err((
            format!("'{s}' is not an absolute path"),
            Some("write the full path, starting with /".into()),
        ))
    }
}

/// A single value or an array of values, each converted by `f`; `None` when any fails.
fn list_of<T>(i: &Item, f: impl Fn(&Value) -> Option<T>) -> Option<Vec<T>> {
    match i.as_value()? {
        Value::Array(a) => a.iter().map(f).collect(),
        v => f(v).map(|x| vec![x]),
    }
}

/// Linear: a set, not a scan of the prefix (a 200,000-entry list took over a minute that way).
fn no_dups<T: Eq + std::hash::Hash + std::fmt::Debug>(v: &[T]) -> Result<(), Fail> {
    let mut seen = HashSet::with_capacity(v.len());
    for a in v {
        if !seen.insert(a) {
            return Err((format!("{a:?} is listed twice"), None));
        }
    }
    Ok(())
}

fn members(i: &Item) -> Result<Vec<Member>, Fail> {
    let help =
        Some("expected a list of user names and @groups, e.g. [\"alice\", \"@ml-infer\"]".into());
    let found = || format!("expected a list, found {}", type_name(i));
    let arr = i.as_array().ok_or_else(|| (found(), help.clone()))?;
    within!("members", arr.len(), MAX_MEMBERS).map_err(|m| (m, help.clone()))?;
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for v in arr.iter() {
        let Some(s) = v.as_str() else {
            return Err(("every member must be a string".into(), help));
        };
        let (name, m) = match s.strip_prefix('@') {
            Some(g) => (g, Member::Group(g.to_string())),
            None => (s, Member::User(s.to_string())),
        };
        if !valid_unix_name(name) {
            return Err((format!("invalid member '{s}'"), help));
        }
        if !seen.insert(m.clone()) {
            return Err((format!("member '{s}' is listed twice"), None));
        }
        out.push(m);
    }
    Ok(out)
}

/// User and group names as NSS commonly allows them (including LDAP-style capitals, dots and a
/// trailing `$` for machine accounts); a numeric ID is refused because groups and users are
/// resolved by name.
pub(crate) fn valid_unix_name(s: &str) -> bool {
    let body = s.strip_suffix('$').unwrap_or(s);
    let b = body.as_bytes();
    !b.is_empty()
        && s.len() <= 32
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> (Option<Fragment>, Vec<Diagnostic>) {
        let mut d = Vec::new();
        let f = parse_fragment(Path::new("/etc/gpuctl/policy.toml"), text, &mut d);
        (f, d)
    }

    #[test]
    fn unix_names() {
        for ok in ["alice", "ml-infer", "Bob.Smith", "_svc", "host$"] {
            assert!(valid_unix_name(ok), "{ok}");
        }
        for bad in ["", "1000", "-x", "a b", "a:b", &"a".repeat(33)] {
            assert!(!valid_unix_name(bad), "{bad}");
        }
    }

    #[test]
    fn admin_group_is_a_group_name_with_or_without_its_at() {
        for (v, want) in [("gpu-admins", "gpu-admins"), ("@ops.team", "ops.team")] {
            let (f, d) = parse(&format!("version = 1\n[host]\nadmin-group = \"{v}\"\n"));
            assert!(d.is_empty(), "{d:?}");
            assert_eq!(f.unwrap().host.admin_group.unwrap().value, want);
        }
        for bad in ["\"\"", "\"1000\"", "\"a b\"", "[\"x\"]", "\"@\""] {
            let (_, d) = parse(&format!("version = 1\n[host]\nadmin-group = {bad}\n"));
            assert_eq!(d.len(), 1, "{bad}: {d:?}");
            assert_eq!(d[0].key, "host.admin-group");
            assert_eq!(d[0].loc.as_ref().unwrap().line, 3, "{bad}");
        }
    }

    #[test]
    fn the_loans_slice_name_is_no_team_name() {
        let (_, d) = parse("version = 1\n[teams.train]\nmembers = [\"a\"]\n[teams.loans]\n");
        assert_eq!(d.len(), 1, "{d:?}");
        let loc = d[0].loc.as_ref().unwrap();
        assert_eq!(
            (loc.line, loc.col, d[0].key.as_str()),
            (4, 8, "teams.loans")
        );
        assert!(d[0].message.contains("reserved"), "{}", d[0]);
        let (_, d) = parse("version = 1\n[teams.loans_team]\nmembers = [\"a\"]\n");
        assert!(d.is_empty(), "{d:?}");
    }

    #[test]
    fn unknown_key_has_line_col_and_suggestion() {
        let (_, d) = parse("version = 1\n[teams.infer]\nmemroy-max = \"1G\"\n");
        assert_eq!(d.len(), 1, "{d:?}");
        let e = &d[0];
        assert_eq!(
            (e.loc.as_ref().unwrap().line, e.loc.as_ref().unwrap().col),
            (3, 1)
        );
        assert_eq!(e.key, "teams.infer.memroy-max");
        let help = e.help.as_deref().unwrap();
        assert!(help.contains("did you mean 'memory-max'"), "{e}");
        assert!(help.contains("members, memory-max"), "{e}");
    }

    #[test]
    fn value_errors_point_at_the_value_and_all_are_reported() {
        let text = "version = 1\n[teams.a]\ncpu-weight = 0\nmemory-max = \"12X\"\n[teams.a.mps]\nactive-thread-percentage = 101\n";
        let (_, d) = parse(text);
        let keys: Vec<_> = d
            .iter()
            .map(|e| {
                (
                    e.key.as_str(),
                    e.loc.as_ref().unwrap().line,
                    e.loc.as_ref().unwrap().col,
                )
            })
            .collect();
        assert_eq!(
            keys,
            vec![
                ("teams.a.cpu-weight", 3, 14),
                ("teams.a.memory-max", 4, 14),
                ("teams.a.mps.active-thread-percentage", 6, 28)
            ]
        );
    }

    #[test]
    fn host_outside_is_closed_or_open_and_a_typo_is_located() {
        let (f, d) = parse("version = 1\n[host]\noutside = \"open\"\n");
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(
            f.unwrap().host.outside.map(|a| a.value),
            Some(Outside::Open)
        );
        let (_, d) = parse("version = 1\n[host]\noutside = \"closd\"\n");
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].key, "host.outside");
        let loc = d[0].loc.as_ref().unwrap();
        assert_eq!((loc.line, loc.col), (3, 11));
        assert!(d[0].to_string().contains("closed, open"), "{}", d[0]);
    }

    #[test]
    fn host_health_keys_parse_and_errors_are_located() {
        let (f, d) = parse(
            "version = 1\n[host.health]\napplication-xids = [13, 999]\non-fault = \"stop\"\n\
             grace = \"2m\"\nreset-when-idle = true\n",
        );
        assert!(d.is_empty(), "{d:?}");
        let h = f.unwrap().host.health;
        assert_eq!(h.application_xids.unwrap().value, [13, 999]);
        assert_eq!(h.on_fault.unwrap().value, crate::health::OnFault::Stop);
        assert_eq!(h.grace.unwrap().value, Duration::from_secs(120));
        assert!(h.reset_when_idle.unwrap().value);
        for (text, key, col, says) in [
            (
                "application-xids = [13, 79]",
                "host.health.application-xids",
                20,
                "fatal",
            ),
            (
                "application-xids = [0]",
                "host.health.application-xids",
                20,
                "not an XID",
            ),
            (
                "application-xids = [13, 13]",
                "host.health.application-xids",
                20,
                "twice",
            ),
            (
                "on-fault = \"drain\"",
                "host.health.on-fault",
                12,
                "keep, stop",
            ),
            (
                "reset-when-idle = \"yes\"",
                "host.health.reset-when-idle",
                19,
                "true or false",
            ),
            ("grace = \"soon\"", "host.health.grace", 9, ""),
            ("on-falt = \"keep\"", "host.health.on-falt", 1, "on-fault"),
        ] {
            let (_, d) = parse(&format!("version = 1\n[host.health]\n{text}\n"));
            assert_eq!(d.len(), 1, "{text}: {d:?}");
            assert_eq!(d[0].key, key, "{text}");
            let loc = d[0].loc.as_ref().unwrap();
            assert_eq!((loc.line, loc.col), (3, col), "{text}");
            assert!(d[0].to_string().contains(says), "{text}: {}", d[0]);
        }
    }

    #[test]
    fn missing_version_and_syntax_errors() {
        let (f, d) = parse("[host]\nreconfigure = \"drain\"\n");
        assert!(f.is_some());
        assert_eq!(d[0].key, "version");
        let (f, d) = parse("version = 1\n[teams.a\n");
        assert!(f.is_none());
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].loc.as_ref().unwrap().line, 2);
        assert!(d[0].message.contains("syntax"), "{}", d[0]);
    }

    #[test]
    fn accounting_modes_and_a_bad_one_named_with_its_line() {
        for (v, want) in [
            ("auto", Accounting::Auto),
            ("on", Accounting::On),
            ("off", Accounting::Off),
        ] {
            let (f, d) = parse(&format!("version = 1\n[host]\naccounting = \"{v}\"\n"));
            assert!(d.is_empty(), "{d:?}");
            assert_eq!(f.unwrap().host.accounting.map(|a| a.value), Some(want));
        }
        let (_, d) = parse("version = 1\n[host]\naccounting = \"yes\"\n");
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].key, "host.accounting");
        assert_eq!(d[0].loc.as_ref().unwrap().line, 3);
        assert!(d[0].message.contains("'yes'"), "{}", d[0]);
    }

    #[test]
    fn gpu_entries_in_both_spellings() {
        let text = r#"version = 1
[[gpu]]
index = [0, 1]
owner = "a"
[[gpu]]
model = "*H100*"
mig = [ { profile = "3g.40gb", owner = "a" }, { profile = "1g.10gb", owner = "b", count = 4, compute = ["1c"] } ]
[[gpu]]
uuid = "GPU-00000000-1111-2222-3333-444455556666"
[[gpu.mig]]
profile = "7g.80gb"
owner = "c"
"#;
        let (f, d) = parse(text);
        assert!(d.is_empty(), "{d:?}");
        let f = f.unwrap();
        assert_eq!(f.gpus.len(), 3);
        assert_eq!(f.gpus[0].selector.value, Selector::Index(vec![0, 1]));
        assert_eq!(f.gpus[1].loc.line, 5);
        let UsagePart::Mig(m) = &f.gpus[1].usage else {
            panic!()
        };
        assert_eq!((m[1].count, m[1].owner.value.as_str()), (4, "b"));
        assert_eq!(m[1].owner.loc.line, 7);
        let UsagePart::Mig(m) = &f.gpus[2].usage else {
            panic!()
        };
        assert_eq!(m[0].profile.value, "7g.80gb");
    }

    #[test]
    fn selector_and_use_must_be_exactly_one() {
        let text = "version = 1\n[[gpu]]\nindex = [0]\nall = true\nowner = \"a\"\nshared = [\"b\"]\n[[gpu]]\nowner = \"a\"\n";
        let (f, d) = parse(text);
        assert_eq!(f.unwrap().gpus.len(), 0);
        let msgs: Vec<_> = d.iter().map(|e| e.to_string()).collect();
        assert_eq!(d.len(), 3, "{msgs:#?}");
        for (m, want) in msgs.iter().zip([
            ":4:1: error: gpu[0].all: several GPU selectors",
            ":6:1: error: gpu[0].shared: several uses",
            "gpu[1]: no GPU selector",
        ]) {
            assert!(m.contains(want), "{msgs:#?}");
        }
    }

    #[test]
    fn empty_mig_is_mig_on_for_no_team_and_takes_no_owner_beside_it() {
        let (f, d) = parse("version = 1\n[[gpu]]\nindex = [0]\nmig = []\n");
        assert!(d.is_empty(), "{d:?}");
        let f = f.unwrap();
        assert!(matches!(&f.gpus[0].usage, UsagePart::Mig(m) if m.is_empty()));

        // An owner (or a shared list) beside it is an error at that key, saying why.
        for (line, want) in [
            (
                "owner = \"infer\"",
                ":4:1: error: gpu[0].owner: `owner` beside `mig = []`",
            ),
            (
                "shared = [\"a\"]",
                ":4:1: error: gpu[0].shared: `shared` beside `mig = []`",
            ),
        ] {
            let (f, d) = parse(&format!(
                "version = 1\n[[gpu]]\nindex = [0]\n{line}\nmig = []\n"
            ));
            let f = f.unwrap();
            assert!(f.gpus.is_empty());
            let msgs: Vec<_> = d.iter().map(|e| e.to_string()).collect();
            assert_eq!(msgs.len(), 1, "{msgs:#?}");
            assert!(msgs[0].starts_with("/etc/gpuctl/policy.toml"), "{msgs:#?}");
            assert!(msgs[0].contains(want), "{msgs:#?}");
            assert!(msgs[0].contains("gives them to no team"), "{msgs:#?}");
            assert!(msgs[0].contains("drop mig = []"), "{msgs:#?}");
        }
        // Beside a non-empty geometry, an owner is the plain "several uses".
        let (_, d) = parse(
            "version = 1\n[[gpu]]\nindex = [0]\nowner = \"a\"\nmig = [{ profile = \"7g.80gb\", owner = \"a\" }]\n",
        );
        assert!(
            d[0].to_string()
                .contains(":5:1: error: gpu[0].mig: several uses"),
            "{d:?}"
        );
    }

    #[test]
    fn team_name_with_dash_explains_nesting() {
        let (f, d) = parse("version = 1\n[teams.ml-infer]\nmembers = [\"a\"]\n");
        assert_eq!(f.unwrap().teams.len(), 1);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].loc.as_ref().unwrap().line, 2);
        assert!(d[0].message.contains("child of gpu-ml.slice"), "{}", d[0]);
    }
}
