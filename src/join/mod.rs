//! Who may step into which team's share, and how a process is checked before it is moved.
//!
//! Everything here is pure or reads only files under a [`Root`], so the rules that keep a
//! non-member out are unit-tested without a bus, systemd or real users:
//! - [`check_team_name`] rejects hostile names before any lookup (client and daemon both call
//!   it);
//! - [`authorize`] decides membership from the bus credentials ([`Caller`]), the policy and a
//!   [`Directory`] (NSS in production, a fake in tests);
//! - [`ProcIdentity`] and [`verify_process`] check that the pid about to be moved belongs to
//!   the caller, before and after the move;
//! - [`parse_env_file`], [`compose_env`] build the child's environment so that nothing the
//!   client inherited can override what the daemon said.

use crate::paths::Root;
use crate::policy::{Member, Policy, TeamName};
use serde::Serialize;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

pub mod cgroup;
pub mod nss;

/// Environment keys the daemon owns: inherited ones are stripped before the daemon's are set,
/// so `CUDA_VISIBLE_DEVICES=evil gpuctl run …` cannot widen or change the device view.
pub const OWNED_PREFIXES: [&str; 3] = ["CUDA_", "NVIDIA_", "GPUCTL_"];

/// Host directory of the team environment files the daemon keeps current.
pub const TEAM_ENV_DIR: &str = "/run/gpuctl/teams";

/// Host path of a team's environment file. Only call with a name [`check_team_name`] accepted.
pub fn team_env_path(team: &str) -> String {
    format!("{TEAM_ENV_DIR}/{team}.env")
}

/// A team name as it may be shown in a message: control characters escaped, at most 40
/// characters, so a hostile name cannot forge extra lines or flood a terminal or the journal.
pub fn shown(name: &str) -> String {
    let mut s: String = name.chars().take(40).flat_map(char::escape_debug).collect();
    if name.chars().count() > 40 {
        s.push('…');
    }
    format!("\"{s}\"")
}

/// Accept only names that can be teams (`[a-z][a-z0-9_]{0,30}`, the policy's rule): a name
/// becomes a unit name (`gpu-<team>.slice`) and a file name (`<team>.env`), so `../x`, `a-b`
/// (a nested slice), very long names and control characters must never reach a lookup.
pub fn check_team_name(name: &str) -> Result<TeamName, Refusal> {
    name.parse().map_err(|_| {
        // The explanation quotes the name: only a short, printable one (the rest are shown
        // escaped and cut, above).
        let plain = name.len() <= 40 && !name.chars().any(char::is_control);
        let mut why = crate::names::team_name_problem(if plain { name } else { "" });
        if let Some(fix) = crate::names::team_name_fix(name) {
            why = format!("{why}: did you mean \"{fix}\"?");
        }
        Refusal::BadTeamName {
            shown: shown(name),
            why,
        }
    })
}

/// The teams there are, led by the one `team` was probably meant to be, as `validate` says it.
fn teams_help(team: &str, known: &[String]) -> String {
    let list = format!("teams: {}", list_or_none(known));
    crate::policy::parse::suggest(team, known.iter().map(String::as_str), list)
}

/// The caller as the bus daemon reports it (`GetConnectionCredentials`), never as the client
/// says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// `UnixUserID`.
    pub uid: u32,
    /// `ProcessID`: the process that opened the connection.
    pub pid: Option<u32>,
    /// `UnixGroupIDs` (primary and supplementary), when the bus offers them.
    pub gids: Option<Vec<u32>>,
}

/// A user account as NSS knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Login name.
    pub name: String,
    /// Numeric uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
    /// Login shell.
    pub shell: PathBuf,
}

/// User and group lookups. Production uses NSS ([`nss::Nss`]), so LDAP/SSSD users and groups
/// count exactly as local ones do; tests use a table.
pub trait Directory {
    /// The account of `uid`.
    fn user_by_uid(&self, uid: u32) -> Option<Account>;
    /// The gid of group `name`.
    fn group_gid(&self, name: &str) -> Option<u32>;
    /// Every gid `account` is in (primary included), as `getgrouplist(3)` says.
    fn groups_of(&self, account: &Account) -> Vec<u32>;
}

/// Why a caller may use a team.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// uid 0 may join any team.
    Root,
    /// Listed by name.
    User(String),
    /// Member of a listed `@group`.
    Group(String),
}

impl fmt::Display for Via {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Via::Root => write!(f, "root"),
            Via::User(u) => write!(f, "user {u}"),
            Via::Group(g) => write!(f, "group @{g}"),
        }
    }
}

/// A positive decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The team.
    pub team: String,
    /// The caller's name (`uid N` when NSS does not know the uid).
    pub user: String,
    /// Why.
    pub via: Via,
}

/// Why a request is refused. Each maps to one D-Bus error name and one `gpuctl` exit code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The name can never be a team.
    #[error("{shown} is not a valid team name: {why} (teams are [a-z][a-z0-9_]{{0,30}})")]
    BadTeamName {
        /// The name, escaped and truncated.
        shown: String,
        /// Why, and the name meant when it can be guessed (`ml-infer`: `ml_infer`).
        why: String,
    },
    /// No such team in the policy in force.
    #[error("no team \"{team}\" in the policy ({})", teams_help(team, known))]
    UnknownTeam {
        /// The team asked for.
        team: String,
        /// The teams that exist.
        known: Vec<String>,
    },
    /// The caller is neither root nor a listed user nor in a listed group.
    #[error(
        "{user} is not a member of team \"{team}\" (members: {})",
        list_or_none(members)
    )]
    NotMember {
        /// The team.
        team: String,
        /// The caller.
        user: String,
        /// What the policy names (`alice`, `@ml-infer`).
        members: Vec<String>,
    },
    /// The policy gives the team GPU or MIG devices, but none is on this host now.
    #[error(
        "team \"{team}\" has no devices on this host now, though the policy gives it {}",
        missing.join("; ")
    )]
    NoDevices {
        /// The team.
        team: String,
        /// What the policy gives the team (`gpu[0] in /etc/gpuctl/policy.toml:7:1 (index 1)`)
        /// or why the device view is not there.
        missing: Vec<String>,
    },
    /// The process to move is not the caller's (or cannot be checked).
    #[error("pid {pid}: {why}; only the caller's own process is placed")]
    NotYourProcess {
        /// The pid the bus reported.
        pid: u32,
        /// What did not match.
        why: String,
    },
    /// The daemon has no valid policy yet.
    #[error("gpuctld has no valid policy yet: {0}")]
    NoPolicy(String),
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// Decide whether `caller` may use `team` under `policy`. Pure apart from `dir`.
///
/// Membership: root always; a listed user name equal to the caller's NSS name; a listed
/// `@group` whose gid is among the caller's NSS groups (`getgrouplist`) or among the groups the
/// bus reports for the connection (which covers `newgrp`/`sg`).
pub fn authorize(
    caller: &Caller,
    policy: &Policy,
    team: &TeamName,
    dir: &dyn Directory,
) -> Result<Grant, Refusal> {
    let Some(t) = policy.teams.get(&**team) else {
        return Err(Refusal::UnknownTeam {
            team: team.to_string(),
            known: policy.teams.keys().map(|t| t.to_string()).collect(),
        });
    };
    let account = dir.user_by_uid(caller.uid);
    let user = account
        .as_ref()
        .map_or_else(|| format!("uid {}", caller.uid), |a| a.name.clone());
    let grant = |via| Grant {
        team: team.to_string(),
        user: user.clone(),
        via,
    };
    if caller.uid == 0 {
        return Ok(grant(Via::Root));
    }
    // Resolved lazily: a team of listed users never needs a group lookup (LDAP round trips).
    let mut gids: Option<Vec<u32>> = None;
    for m in &t.members {
        match m {
            Member::User(name) => {
                if account.as_ref().is_some_and(|a| &a.name == name) {
                    return Ok(grant(Via::User(name.clone())));
                }
            }
            Member::Group(g) => {
                let Some(gid) = dir.group_gid(g) else {
                    continue;
                };
                let mine = gids.get_or_insert_with(|| {
                    let mut v = caller.gids.clone().unwrap_or_default();
                    if let Some(a) = &account {
                        v.extend(dir.groups_of(a));
                    }
                    v
                });
                if mine.contains(&gid) {
                    return Ok(grant(Via::Group(g.clone())));
                }
            }
        }
    }
    Err(Refusal::NotMember {
        team: team.to_string(),
        user,
        members: t.members.iter().map(Member::to_string).collect(),
    })
}

/// Every team `caller` may use, with the reason, in name order.
pub fn joinable(caller: &Caller, policy: &Policy, dir: &dyn Directory) -> Vec<(String, Via)> {
    policy
        .teams
        .keys()
        .filter_map(|t| {
            authorize(caller, policy, &t.parse().ok()?, dir)
                .ok()
                .map(|g| (g.team, g.via))
        })
        .collect()
}

/// Whose per-process detail (user, uid, pid, command, unit) a caller may read in `Usage`,
/// `Idle` and `Metrics`: everyone's for root and members of the policy's `[host]
/// admin-group`, else only that of the teams the caller may join ([`authorize`]'s rule).
/// Per-device and per-team aggregates are for everyone (docs/monitoring.md, "Who sees what").
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Viewer {
    /// Root or the admin group.
    All,
    /// The teams the caller may join (empty: none).
    Teams(std::collections::BTreeSet<String>),
}

impl Viewer {
    /// Whether the detail of a process or holder of `team` (`None`: in no team's slice) may be
    /// shown. Processes outside every team are root's and the admins' to see.
    pub fn sees(&self, team: Option<&str>) -> bool {
        match self {
            Viewer::All => true,
            Viewer::Teams(t) => team.is_some_and(|x| t.contains(x)),
        }
    }
}

/// The [`Viewer`] `caller` is under `policy` (`None`: no policy loaded: root sees all, the
/// rest nothing one by one).
pub fn viewer(caller: &Caller, policy: Option<&Policy>, dir: &dyn Directory) -> Viewer {
    if caller.uid == 0 {
        return Viewer::All;
    }
    let Some(policy) = policy else {
        return Viewer::Teams(Default::default());
    };
    // A group NSS does not know has no members (as a team's `@group` grants nothing).
    let admin = policy
        .host
        .admin_group
        .as_deref()
        .and_then(|g| dir.group_gid(g));
    if let Some(gid) = admin {
        let in_bus = caller.gids.as_ref().is_some_and(|v| v.contains(&gid));
        if in_bus
            || dir
                .user_by_uid(caller.uid)
                .is_some_and(|a| dir.groups_of(&a).contains(&gid))
        {
            return Viewer::All;
        }
    }
    Viewer::Teams(
        joinable(caller, policy, dir)
            .into_iter()
            .map(|t| t.0)
            .collect(),
    )
}

/// What identifies a process across a check and a move: all four uids and its start time
/// (which a recycled pid does not share).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcIdentity {
    /// The pid.
    pub pid: u32,
    /// Real, effective, saved and filesystem uid.
    pub uids: [u32; 4],
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
}

impl ProcIdentity {
    /// Read `/proc/<pid>/status` and `/proc/<pid>/stat` under `root`.
    pub fn read(root: &Root, pid: u32) -> Result<Self, Refusal> {
        let gone = |what: &str, e: &dyn fmt::Display| Refusal::NotYourProcess {
            pid,
            why: format!("cannot read /proc/{pid}/{what} ({e})"),
        };
        let status = std::fs::read_to_string(root.join(format!("/proc/{pid}/status")))
            .map_err(|e| gone("status", &e))?;
        let stat = std::fs::read_to_string(root.join(format!("/proc/{pid}/stat")))
            .map_err(|e| gone("stat", &e))?;
        let uids = parse_status_uids(&status).ok_or_else(|| gone("status", &"no Uid: line"))?;
        let start_time =
            parse_stat_start_time(&stat).ok_or_else(|| gone("stat", &"no start time"))?;
        Ok(ProcIdentity {
            pid,
            uids,
            start_time,
        })
    }
}

/// The `Uid:` line of `/proc/<pid>/status`: real, effective, saved, filesystem.
pub fn parse_status_uids(status: &str) -> Option<[u32; 4]> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let v: Vec<u32> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    v.try_into().ok()
}

/// Field 22 (`starttime`) of `/proc/<pid>/stat`. The command name (field 2) may contain spaces
/// and parentheses, so fields are counted after the *last* `)`.
pub fn parse_stat_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ")" come field 3 (state) onwards: starttime is the 20th of those.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The process may be moved for `caller_uid`: every one of its uids is the caller's. A set-uid
/// program the caller started (effective uid root) is not the caller's to move.
pub fn verify_process(caller_uid: u32, p: &ProcIdentity) -> Result<(), Refusal> {
    if p.uids.iter().all(|u| *u == caller_uid) {
        Ok(())
    } else {
        Err(Refusal::NotYourProcess {
            pid: p.pid,
            why: format!(
                "it runs as uid {} (real/effective/saved/fs {:?}), the caller is uid {caller_uid}",
                p.uids[1], p.uids
            ),
        })
    }
}

/// Parse an environment file as the daemon writes it (`KEY=VALUE` lines; `#` comments; a value
/// may be double-quoted). Keys that are not shell identifiers are dropped.
pub fn parse_env_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| is_env_key(k))
        .map(|(k, v)| {
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn is_env_key(k: &str) -> bool {
    let b = k.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// Whether the env of a team names at least one device.
pub fn has_devices(env: &BTreeMap<String, String>) -> bool {
    env.get("CUDA_VISIBLE_DEVICES")
        .is_some_and(|v| v.split(',').any(|d| !d.trim().is_empty()))
}

/// The policy entries that give `team` GPU or MIG devices, for humans: `gpu[1] (index 1),
/// owned`, with the file and line when known. Empty for a device-less team (CPU and memory
/// only: data preparation, CPU inference), which members may join all the same.
pub fn policy_devices_of(policy: &Policy, team: &str) -> Vec<String> {
    use crate::policy::{GpuUse, Selector};
    policy
        .gpus
        .iter()
        .filter_map(|a| {
            let how = match &a.usage {
                GpuUse::Owned(t) if **t == *team => "owned".to_string(),
                GpuUse::Shared(ts) if ts.iter().any(|t| **t == *team) => "shared".to_string(),
                GpuUse::Mig(specs) => {
                    let mine: Vec<String> = specs
                        .iter()
                        .filter(|m| *m.owner == *team)
                        .map(|m| format!("{} x{}", m.profile, m.count))
                        .collect();
                    if mine.is_empty() {
                        return None;
                    }
                    format!("MIG {}", mine.join(" + "))
                }
                _ => return None,
            };
            let sel = match &a.selector {
                Selector::Index(i) => format!(
                    "index {}",
                    i.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                ),
                Selector::Uuid(u) => u.join(","),
                Selector::Model(m) => format!("model {m}"),
                Selector::All => "every GPU".into(),
            };
            let at = a
                .loc
                .as_ref()
                .map(|l| format!(" at {l}"))
                .unwrap_or_default();
            Some(format!("{}{at} ({sel}, {how})", a.key))
        })
        .collect()
}

/// Whether a member may join `team` with the environment `env` the daemon wrote: yes when the
/// env names devices, or when the policy gives the team none (a device-less team: its scope
/// lands in the device-closed slice and the env says `GPUCTL_DEVICES=none`); no — naming what
/// the policy gives it — when the policy gives devices that are missing now.
pub fn check_devices(
    env: &BTreeMap<String, String>,
    policy: &Policy,
    team: &str,
) -> Result<(), Refusal> {
    let given = policy_devices_of(policy, team);
    if has_devices(env) || given.is_empty() {
        Ok(())
    } else {
        Err(Refusal::NoDevices {
            team: team.into(),
            missing: given,
        })
    }
}

/// The child's environment: the inherited one without any key the daemon owns
/// ([`OWNED_PREFIXES`]), then the daemon's. Order of the inherited keys is kept; keys and
/// values need not be UTF-8.
pub fn compose_env(
    inherited: impl IntoIterator<Item = (OsString, OsString)>,
    daemon: &BTreeMap<String, String>,
) -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = inherited
        .into_iter()
        .filter(|(k, _)| {
            let k = k.as_encoded_bytes();
            !OWNED_PREFIXES.iter().any(|p| k.starts_with(p.as_bytes()))
        })
        .collect();
    out.extend(daemon.iter().map(|(k, v)| (k.into(), v.into())));
    out
}

/// Name of the transient scope for a placed process, from its opaque id: every local user can
/// list it (`systemctl list-units`), so it names neither the team nor the pid.
pub fn scope_name(id: &str) -> String {
    format!("gpuctl-run-{id}.scope")
}

/// Whether `unit` is a job scope [`scope_name`] makes.
pub fn is_scope_name(unit: &str) -> bool {
    unit.strip_prefix("gpuctl-run-")
        .and_then(|r| r.strip_suffix(".scope"))
        .is_some_and(|id| !id.is_empty())
}

/// The scope's `Description=`: as neutral as its name, for the same reason.
pub fn scope_description(id: &str) -> String {
    format!("gpuctl job {id}")
}

#[cfg(test)]
mod tests;
