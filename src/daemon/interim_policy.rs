//! TEMPORARY policy reader — to be replaced by `crate::policy::load` at merge.
//!
//! `policy::load` is still being written on another branch, and the daemon must be provable in
//! the VM before that lands. This module reads a small TOML subset into the shared
//! [`Policy`] type so everything downstream is already the final code. The only caller is
//! [`super::load_policy`]; switching to the real loader is a one-line change there.
//!
//! Subset understood:
//! ```toml
//! version = 1
//! [teams.infer]
//! members = ["alice", "@ml-infer"]
//! memory-max = "256M"          # or "25%"; also memory-high
//! cpu-weight = 200
//! allowed-cpus = "0-1"
//! tasks-max = 512
//! io-weight = 100
//! [teams.infer.mps]
//! active-thread-percentage = 50
//! pinned-memory-limit = "2G"
//! user = "mps"
//! [[gpu]]
//! index = [0, 1]               # or all = true
//! owner = "infer"              # or shared = ["infer", "train"]
//! ```

use crate::paths::{self, Root};
use crate::policy::{
    self, GpuAssignment, GpuUse, HostSettings, Limits, Member, MpsSettings, Policy, Selector, Size,
    Team,
};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Doc {
    version: Option<i64>,
    #[serde(default)]
    teams: BTreeMap<String, TeamDoc>,
    #[serde(default)]
    gpu: Vec<GpuDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct TeamDoc {
    #[serde(default)]
    members: Vec<String>,
    memory_max: Option<String>,
    memory_high: Option<String>,
    cpu_weight: Option<u64>,
    allowed_cpus: Option<String>,
    tasks_max: Option<u64>,
    io_weight: Option<u64>,
    mps: Option<MpsDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct MpsDoc {
    active_thread_percentage: Option<u32>,
    pinned_memory_limit: Option<String>,
    user: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct GpuDoc {
    index: Option<Vec<u32>>,
    all: Option<bool>,
    owner: Option<String>,
    shared: Option<Vec<String>>,
}

/// Parse a size: bytes with an optional K/M/G/T suffix (powers of 1024), or `N%` of RAM.
pub fn parse_size(s: &str) -> Option<Size> {
    let s = s.trim();
    if let Some(p) = s.strip_suffix('%') {
        let p: f64 = p.trim().parse().ok()?;
        return (p > 0.0 && p <= 100.0).then_some(Size::PercentOfRam(p));
    }
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1u64 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        'T' | 't' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(mult)
        .map(Size::Bytes)
}

/// Policy files in merge order: `policy.toml`, then the `policy.d` fragments by file name, a
/// same-name file in `/etc` replacing `/run` replacing `/usr/lib`, a `/dev/null` symlink masking.
pub fn policy_files(root: &Root) -> Vec<(PathBuf, PathBuf)> {
    let mut out = Vec::new();
    let main = root.join(paths::POLICY_MAIN);
    if main.is_file() {
        out.push((PathBuf::from(paths::POLICY_MAIN), main));
    }
    let mut frags: BTreeMap<String, (PathBuf, PathBuf)> = BTreeMap::new();
    for dir in [
        paths::POLICY_DIR_VENDOR,
        paths::POLICY_DIR_RUN,
        paths::POLICY_DIR_ETC,
    ] {
        let Ok(rd) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".toml") && !name.starts_with('.') {
                frags.insert(name.clone(), (Path::new(dir).join(&name), e.path()));
            }
        }
    }
    for (_, (host, real)) in frags {
        let masked = std::fs::read_link(&real).is_ok_and(|t| t == Path::new("/dev/null"));
        if !masked {
            out.push((host, real));
        }
    }
    out
}

fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .map_or(1, |i| i + 1)
}

fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Load the policy under `root`; the error is one line: `file:line: key: what is wrong`.
pub fn load(root: &Root) -> Result<Policy, String> {
    let files = policy_files(root);
    let mut teams: BTreeMap<String, Team> = BTreeMap::new();
    let mut gpus = Vec::new();
    let mut refs: Vec<(String, String, usize, String)> = Vec::new(); // team, file, line, key
    for (host, real) in &files {
        let shown = host.display().to_string();
        let text =
            std::fs::read_to_string(real).map_err(|e| format!("{shown}: cannot read: {e}"))?;
        let doc: Doc = toml::from_str(&text).map_err(|e| {
            let line = e.span().map_or(1, |s| line_at(&text, s.start));
            format!("{shown}:{line}: {}", e.message().trim())
        })?;
        if doc.version != Some(1) {
            return Err(format!(
                "{shown}:{}: version: must be 1",
                line_of(&text, "version")
            ));
        }
        for (name, t) in doc.teams {
            let line = line_of(&text, &format!("teams.{name}"));
            let at = |key: &str, msg: &str| format!("{shown}:{line}: teams.{name}.{key}: {msg}");
            if !policy::valid_team_name(&name) {
                return Err(at("", "team name must match [a-z][a-z0-9_]{0,30}"));
            }
            let size = |key: &str, v: &Option<String>| match v {
                None => Ok(None),
                Some(s) => parse_size(s)
                    .map(Some)
                    .ok_or_else(|| at(key, &format!("bad size {s:?} (e.g. 512M, 2G, 25%)"))),
            };
            let limits = Limits {
                memory_max: size("memory-max", &t.memory_max)?,
                memory_high: size("memory-high", &t.memory_high)?,
                cpu_weight: t.cpu_weight,
                allowed_cpus: t.allowed_cpus.clone(),
                tasks_max: t.tasks_max,
                io_weight: t.io_weight,
            };
            if let Some(cpus) = &limits.allowed_cpus {
                crate::systemd::props::parse_cpu_list(cpus).map_err(|e| at("allowed-cpus", &e))?;
            }
            let mps = match t.mps {
                None => None,
                Some(m) => Some(MpsSettings {
                    active_thread_percentage: m.active_thread_percentage,
                    pinned_memory_limit: match size(
                        "mps.pinned-memory-limit",
                        &m.pinned_memory_limit,
                    )? {
                        Some(Size::Bytes(b)) => Some(b),
                        Some(Size::PercentOfRam(_)) => {
                            return Err(at("mps.pinned-memory-limit", "must be absolute"))
                        }
                        None => None,
                    },
                    user: m.user,
                }),
            };
            let members = t
                .members
                .iter()
                .map(|m| match m.strip_prefix('@') {
                    Some(g) => Member::Group(g.to_string()),
                    None => Member::User(m.clone()),
                })
                .collect();
            teams.insert(
                name.clone(),
                Team {
                    name: name.clone(),
                    members,
                    limits,
                    mps,
                    loc: Some(policy::Loc {
                        file: host.clone(),
                        line: line as u32,
                        col: 1,
                    }),
                },
            );
        }
        for (i, g) in doc.gpu.into_iter().enumerate() {
            let key = format!("gpu[{i}]");
            let line = line_of(&text, "[[gpu]]");
            let selector = match (g.index, g.all) {
                (Some(ix), None) => Selector::Index(ix),
                (None, Some(true)) => Selector::All,
                _ => {
                    return Err(format!(
                        "{shown}:{line}: {key}: give exactly one of index = [..] or all = true"
                    ))
                }
            };
            let usage = match (g.owner, g.shared) {
                (Some(o), None) => GpuUse::Owned(o),
                (None, Some(s)) => GpuUse::Shared(s),
                _ => {
                    return Err(format!(
                        "{shown}:{line}: {key}: give exactly one of owner or shared"
                    ))
                }
            };
            let names: Vec<String> = match &usage {
                GpuUse::Owned(o) => vec![o.clone()],
                GpuUse::Shared(s) => s.clone(),
                GpuUse::Mig(_) => vec![],
            };
            for n in names {
                let l = line_of(&text, &format!("\"{n}\""));
                refs.push((n, shown.clone(), l, key.clone()));
            }
            gpus.push(GpuAssignment {
                selector,
                usage,
                loc: None,
                key,
            });
        }
    }
    for (team, file, line, key) in refs {
        if !teams.contains_key(&team) {
            let known: Vec<&str> = teams.keys().map(String::as_str).collect();
            return Err(format!(
                "{file}:{line}: {key}: unknown team {team:?} (defined: {})",
                known.join(", ")
            ));
        }
    }
    let mut owned: BTreeMap<u32, usize> = BTreeMap::new();
    for (i, g) in gpus.iter().enumerate() {
        if let (Selector::Index(ix), GpuUse::Owned(_)) = (&g.selector, &g.usage) {
            for n in ix {
                if let Some(prev) = owned.insert(*n, i) {
                    return Err(format!(
                        "{}: gpu {n} is owned by both gpu[{prev}] and gpu[{i}] (mark it shared)",
                        g.key
                    ));
                }
            }
        }
    }
    Ok(Policy {
        host: HostSettings::default(),
        teams,
        gpus,
        sources: files.into_iter().map(|(h, _)| h).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_with(files: &[(&str, &str)]) -> (tempfile::TempDir, Root) {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        for (p, c) in files {
            let path = root.join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, c).unwrap();
        }
        (d, root)
    }

    #[test]
    fn loads_and_overrides_by_name() {
        let (_d, root) = root_with(&[
            (
                "/usr/lib/gpuctl/policy.d/10-a.toml",
                "version = 1\n[teams.a]\nmemory-max = \"1G\"\n",
            ),
            (
                "/etc/gpuctl/policy.d/10-a.toml",
                "version = 1\n[teams.a]\nmemory-max = \"2G\"\n[[gpu]]\nindex = [0]\nowner = \"a\"\n",
            ),
        ]);
        let p = load(&root).unwrap();
        assert_eq!(p.teams["a"].limits.memory_max, Some(Size::Bytes(2 << 30)));
        assert_eq!(p.gpus.len(), 1);
        assert_eq!(
            p.sources,
            vec![PathBuf::from("/etc/gpuctl/policy.d/10-a.toml")]
        );
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let (_d, root) = root_with(&[(
            "/etc/gpuctl/policy.d/20-x.toml",
            "version = 1\n\n[teams.x]\nmemory-max = \"lots\"\n",
        )]);
        let e = load(&root).unwrap_err();
        assert!(
            e.starts_with("/etc/gpuctl/policy.d/20-x.toml:3: teams.x.memory-max: bad size"),
            "{e}"
        );
        let (_d, root) = root_with(&[(
            "/etc/gpuctl/policy.d/20-x.toml",
            "version = 1\n[teams.x]\nbogus = 1\n",
        )]);
        let e = load(&root).unwrap_err();
        assert!(
            e.starts_with("/etc/gpuctl/policy.d/20-x.toml:3: unknown field `bogus`"),
            "{e}"
        );
        let (_d, root) = root_with(&[(
            "/etc/gpuctl/policy.d/20-x.toml",
            "version = 1\n[teams.x]\n[[gpu]]\nindex = [1]\nowner = \"y\"\n",
        )]);
        let e = load(&root).unwrap_err();
        assert!(e.contains(":5: gpu[0]: unknown team \"y\""), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Some(Size::Bytes(256 << 20)));
        assert_eq!(parse_size("25%"), Some(Size::PercentOfRam(25.0)));
        assert_eq!(parse_size("0%"), None);
        assert_eq!(parse_size("x"), None);
    }
}
