//! Merge parsed fragments into one [`Policy`] and check it as a whole; check a policy against a
//! real (or simulated) host.
//!
//! Merge rules (documented for admins in `docs/policy.md`):
//! - `[host]`: per key, the later file wins;
//! - `[teams.X]`: per key, the later file wins, so a drop-in can change one limit of a team
//!   defined elsewhere; `[teams.X.mps]` likewise per key;
//! - `[[gpu]]`: entries concatenate in merge order.
//!
//! Every check runs even after an error, so one run reports every problem. Checks that need the
//! host (does GPU 5 exist, which model is GPU 0) live in [`check_against_host`]; without a host,
//! MIG profiles are checked against every catalog model a selector could match.

use super::parse::{
    suggest, At, Fragment, GpuPart, HostPart, IdlePart, LendPart, LendToPart, MpsPart, SlurmPart,
    TeamPart, UsagePart,
};
use super::{
    Diagnostic, GpuAssignment, GpuUse, HostSettings, IdleRule, Layout, Layouts, LendRule, LendTo,
    Loc, Member, MigSpec, MpsSettings, PlacementSettings, Policy, Selector, Size, SlurmSettings,
    Team, TeamName,
};
use crate::geometry::{fit, fit_compute};
use crate::observe::{GpuState, Observed};
use crate::profiles::{Catalog, GiProfile, GpuModel};
use std::collections::{BTreeMap, BTreeSet};

fn error(loc: &Loc, key: &str, message: String, help: Option<String>) -> Diagnostic {
    Diagnostic::error(Some(loc.clone()), key, message, help)
}

fn warning(loc: &Loc, key: &str, message: String, help: Option<String>) -> Diagnostic {
    Diagnostic::warning(Some(loc.clone()), key, message, help)
}

/// Merge `fragments` (in merge order), check the result, and build the policy.
///
/// Problems are appended to `diags`. The returned policy is best effort: the caller must not use
/// it when `diags` holds an error (see [`super::LoadOutcome`]).
pub fn build(fragments: &[Fragment], diags: &mut Vec<Diagnostic>) -> Policy {
    let mut host = HostPart::default();
    let mut slurm = SlurmPart::default();
    let mut teams: BTreeMap<String, TeamPart> = BTreeMap::new();
    let mut gpus: Vec<&GpuPart> = Vec::new();
    let mut teams_of_bad_gpus: BTreeSet<&str> = BTreeSet::new();
    for f in fragments {
        teams_of_bad_gpus.extend(f.teams_of_bad_gpus.iter().map(String::as_str));
        overlay(&mut host.reconfigure, &f.host.reconfigure);
        overlay(&mut host.drain_timeout, &f.host.drain_timeout);
        overlay(&mut host.nvml_library, &f.host.nvml_library);
        overlay(&mut host.accounting, &f.host.accounting);
        overlay(&mut host.outside, &f.host.outside);
        overlay(&mut host.admin_group, &f.host.admin_group);
        let (h, fh) = (&mut host.health, &f.host.health);
        overlay(&mut h.application_xids, &fh.application_xids);
        overlay(&mut h.on_fault, &fh.on_fault);
        overlay(&mut h.grace, &fh.grace);
        overlay(&mut h.reset_when_idle, &fh.reset_when_idle);
        overlay(&mut host.fair_share_half_life, &f.host.fair_share_half_life);
        overlay(&mut slurm.enabled, &f.slurm.enabled);
        overlay(&mut slurm.gres_file, &f.slurm.gres_file);
        overlay(&mut slurm.node_name, &f.slurm.node_name);
        overlay(&mut slurm.team_types, &f.slurm.team_types);
        overlay(&mut slurm.restart, &f.slurm.restart);
        overlay(&mut slurm.node_file, &f.slurm.node_file);
        for t in &f.teams {
            teams
                .entry(t.name.clone())
                .and_modify(|base| overlay_team(base, t))
                .or_insert_with(|| t.clone());
        }
        gpus.extend(f.gpus.iter());
    }

    check_drain(&host, diags);
    check_teams(&teams, &gpus, &teams_of_bad_gpus, diags);
    check_lending(&teams, &gpus, diags);
    for g in &gpus {
        check_refs(g, &teams, diags);
        if let UsagePart::Mig(m) = &g.usage {
            check_mig_static(g, m, diags);
        }
        check_layouts(g, &teams, diags);
    }
    check_overlaps_static(&gpus, diags);

    let defaults = HostSettings::default();
    Policy {
        host: HostSettings {
            reconfigure: value(&host.reconfigure).unwrap_or(defaults.reconfigure),
            drain_timeout: value(&host.drain_timeout).unwrap_or(defaults.drain_timeout),
            nvml_library: value(&host.nvml_library),
            accounting: value(&host.accounting).unwrap_or(defaults.accounting),
            outside: value(&host.outside).unwrap_or(defaults.outside),
            admin_group: value(&host.admin_group),
            health: to_health(&host.health),
            fair_share_half_life: value(&host.fair_share_half_life)
                .unwrap_or(defaults.fair_share_half_life),
        },
        teams: teams
            .values()
            .filter_map(|t| Some((named(&t.name)?, to_team(t)?)))
            .collect(),
        gpus: gpus.iter().filter_map(|g| to_assignment(g)).collect(),
        sources: fragments.iter().map(|f| f.file.clone()).collect(),
        slurm: to_slurm(&slurm),
        layouts_in_force: BTreeMap::new(),
    }
}

fn to_health(h: &super::parse::HealthPart) -> crate::health::HealthSettings {
    let d = crate::health::HealthSettings::default();
    crate::health::HealthSettings {
        application_xids: value(&h.application_xids)
            .map_or(d.application_xids, |v| v.into_iter().collect()),
        on_fault: value(&h.on_fault).unwrap_or(d.on_fault),
        grace: value(&h.grace).unwrap_or(d.grace),
        reset_when_idle: value(&h.reset_when_idle).unwrap_or(d.reset_when_idle),
    }
}

fn to_slurm(s: &SlurmPart) -> SlurmSettings {
    let d = SlurmSettings::default();
    SlurmSettings {
        enabled: value(&s.enabled).unwrap_or(d.enabled),
        gres_file: value(&s.gres_file).unwrap_or(d.gres_file),
        node_name: value(&s.node_name),
        team_types: value(&s.team_types).unwrap_or(d.team_types),
        restart: value(&s.restart).unwrap_or(d.restart),
        node_file: value(&s.node_file),
    }
}

fn overlay<T: Clone>(base: &mut Option<At<T>>, top: &Option<At<T>>) {
    if top.is_some() {
        *base = top.clone();
    }
}

/// A sub-table (`mps`, `idle`) of a later file over the one merged so far: taken whole when
/// there is none yet, else `keys` merges it per key.
fn overlay_table<T: Clone>(base: &mut Option<T>, top: &Option<T>, keys: impl FnOnce(&mut T, &T)) {
    match (base.as_mut(), top) {
        (_, None) => {}
        (None, Some(t)) => *base = Some(t.clone()),
        (Some(b), Some(t)) => keys(b, t),
    }
}

fn overlay_team(base: &mut TeamPart, top: &TeamPart) {
    // The team's location follows its latest definition: that is where an admin looks first.
    base.loc = top.loc.clone();
    overlay(&mut base.members, &top.members);
    base.limits.overlay(&top.limits);
    overlay_table(&mut base.mps, &top.mps, |b, m| {
        b.loc = m.loc.clone();
        overlay(&mut b.active_thread_percentage, &m.active_thread_percentage);
        overlay(&mut b.pinned_memory_limit, &m.pinned_memory_limit);
        overlay(&mut b.user, &m.user);
    });
    overlay_table(&mut base.placement, &top.placement, |b, p| {
        b.loc = p.loc.clone();
        overlay(&mut b.jobs_per_device, &p.jobs_per_device);
        overlay(&mut b.gpus, &p.gpus);
        overlay(&mut b.gpu_memory, &p.gpu_memory);
    });
    overlay(&mut base.borrow, &top.borrow);
    overlay_table(&mut base.lend, &top.lend, |b, l| {
        b.loc = l.loc.clone();
        overlay(&mut b.to, &l.to);
        overlay(&mut b.after, &l.after);
        overlay(&mut b.grace, &l.grace);
        overlay(&mut b.when, &l.when);
    });
    overlay_table(&mut base.idle, &top.idle, |b, i| {
        b.loc = i.loc.clone();
        overlay(&mut b.after, &i.after);
        overlay(&mut b.below, &i.below);
        overlay(&mut b.action, &i.action);
        overlay(&mut b.grace, &i.grace);
        overlay(&mut b.exclude, &i.exclude);
        overlay(&mut b.memory_alarm, &i.memory_alarm);
    });
}

/// The value of a key that may be unset.
fn value<T: Clone>(a: &Option<At<T>>) -> Option<T> {
    a.as_ref().map(|a| a.value.clone())
}

/// The merged idle table as a rule; `None` when `after` is missing (reported by `check_teams`).
fn to_idle(i: &IdlePart) -> Option<IdleRule> {
    Some(IdleRule {
        after: value(&i.after)?,
        below: value(&i.below).unwrap_or(IdleRule::DEFAULT_BELOW),
        action: value(&i.action).unwrap_or_default(),
        grace: value(&i.grace).unwrap_or(IdleRule::DEFAULT_GRACE),
        exclude: value(&i.exclude).unwrap_or_default(),
        memory_alarm: value(&i.memory_alarm),
    })
}

/// A name as the type. The parser reported every name that is not one, so a policy that lost
/// a team or an entry here is never used (see [`build`]).
fn named(name: &str) -> Option<TeamName> {
    name.parse().ok()
}

fn to_team(t: &TeamPart) -> Option<Team> {
    Some(Team {
        name: named(&t.name)?,
        members: value(&t.members).unwrap_or_default(),
        limits: t.limits.to_limits(),
        mps: t.mps.as_ref().map(|m: &MpsPart| MpsSettings {
            active_thread_percentage: value(&m.active_thread_percentage),
            pinned_memory_limit: value(&m.pinned_memory_limit),
            user: value(&m.user),
        }),
        idle: t.idle.as_ref().and_then(to_idle),
        placement: t
            .placement
            .as_ref()
            .map(|p| PlacementSettings {
                jobs_per_device: value(&p.jobs_per_device),
                gpus: value(&p.gpus),
                gpu_memory: value(&p.gpu_memory),
            })
            .unwrap_or_default(),
        lend: t.lend.as_ref().and_then(to_lend),
        borrow: value(&t.borrow).unwrap_or(false),
        loc: Some(t.loc.clone()),
    })
}

/// The merged lend table as a rule; `None` when `to` is missing (reported by
/// [`check_lending`]).
fn to_lend(l: &LendPart) -> Option<LendRule> {
    let to = match &l.to.as_ref()?.value {
        LendToPart::All => LendTo::All,
        LendToPart::Teams(ts) => {
            LendTo::Teams(ts.iter().map(|t| named(&t.value)).collect::<Option<_>>()?)
        }
    };
    Some(LendRule {
        to,
        after: value(&l.after).unwrap_or(LendRule::DEFAULT_AFTER),
        grace: value(&l.grace).unwrap_or(LendRule::DEFAULT_GRACE),
        when: value(&l.when).unwrap_or_default(),
    })
}

/// `[teams.NAME.lend]` and `borrow` against the merged teams: `to` is required and names
/// other, defined teams; a team whose every device runs MPS has nothing to lend; a team that
/// borrows by default and that nobody lends to is told so.
fn check_lending(
    teams: &BTreeMap<String, TeamPart>,
    gpus: &[&GpuPart],
    diags: &mut Vec<Diagnostic>,
) {
    let mut lent_to: BTreeSet<&str> = BTreeSet::new();
    let mut lends_to_all = false;
    for t in teams.values() {
        let Some(l) = &t.lend else { continue };
        let key = format!("teams.{}.lend", t.name);
        match l.to.as_ref().map(|a| &a.value) {
            None => diags.push(error(
                &l.loc,
                &key,
                "missing `to`: which teams may borrow".into(),
                Some("e.g. to = [\"interns\"], or to = \"all\"".into()),
            )),
            Some(LendToPart::All) => lends_to_all = true,
            Some(LendToPart::Teams(ts)) => {
                for r in ts {
                    lent_to.insert(&r.value);
                    if r.value == t.name {
                        diags.push(error(
                            &r.loc,
                            &format!("{key}.to"),
                            format!("team '{}' lends to itself", t.name),
                            Some(
                                "a team's own jobs use its devices anyway; list other teams".into(),
                            ),
                        ));
                    } else if !teams.contains_key(&r.value) {
                        let help = format!(
                            "defined teams: {}",
                            teams.keys().cloned().collect::<Vec<_>>().join(", ")
                        );
                        diags.push(error(
                            &r.loc,
                            &format!("{key}.to"),
                            format!("unknown team '{}'", r.value),
                            Some(suggest(&r.value, teams.keys().map(String::as_str), help)),
                        ));
                    }
                }
            }
        }
        // MPS serves every device of a team with [mps], and a device shared through MPS is
        // never lent: its clients share one server and its memory.
        let whole_shared = gpus.iter().any(
            |g| matches!(&g.usage, UsagePart::Shared(ts) if ts.iter().any(|x| x.value == t.name)),
        );
        if t.mps.is_some() || whole_shared {
            let why = if t.mps.is_some() {
                "the team runs MPS on its devices, and a device shared through MPS is never lent"
            } else {
                "some of its GPUs are `shared` with other teams, and a shared GPU is never lent"
            };
            diags.push(warning(
                &l.loc,
                &key,
                format!("team '{}' lends less than it may seem: {why}", t.name),
                Some("docs/policy.md, \"Lending idle devices\"".into()),
            ));
        }
    }
    for t in teams.values() {
        let Some(b) = t.borrow.as_ref().filter(|b| b.value) else {
            continue;
        };
        if !lends_to_all && !lent_to.contains(t.name.as_str()) {
            diags.push(warning(
                &b.loc,
                &format!("teams.{}.borrow", t.name),
                format!(
                    "no team lends to '{}': its jobs have nothing to borrow",
                    t.name
                ),
                Some("add it to a [teams.NAME.lend] `to` list".into()),
            ));
        }
    }
}

fn to_use(u: &UsagePart) -> Option<GpuUse> {
    Some(match u {
        UsagePart::Owned(t) => GpuUse::Owned(named(&t.value)?),
        UsagePart::Shared(ts) => {
            GpuUse::Shared(ts.iter().map(|t| named(&t.value)).collect::<Option<_>>()?)
        }
        UsagePart::Mig(ms) => GpuUse::Mig(mig_specs(ms)?),
    })
}

fn to_assignment(g: &GpuPart) -> Option<GpuAssignment> {
    let layouts = if g.layouts.is_empty() {
        None
    } else {
        Some(Layouts {
            other: g
                .layouts
                .iter()
                .map(|l| {
                    Some(Layout {
                        name: l.name.value.clone(),
                        usage: to_use(&l.usage)?,
                        when: l.when.as_ref().map(|w| w.value.clone()).unwrap_or_default(),
                    })
                })
                .collect::<Option<_>>()?,
            after: (g.reslice.as_ref())
                .and_then(|r| value(&r.after))
                .unwrap_or(super::DEFAULT_RESLICE_AFTER),
            hold: (g.reslice.as_ref())
                .and_then(|r| value(&r.hold))
                .unwrap_or(super::DEFAULT_RESLICE_HOLD),
        })
    };
    Some(GpuAssignment {
        selector: g.selector.value.clone(),
        usage: to_use(&g.usage)?,
        loc: Some(g.loc.clone()),
        key: g.key.clone(),
        layouts,
    })
}

/// Every layout of `g` checked as the entry itself is (owners, MIG geometry); names unique;
/// `reslice` only with layouts.
fn check_layouts(g: &GpuPart, teams: &BTreeMap<String, TeamPart>, diags: &mut Vec<Diagnostic>) {
    if let (Some(r), true) = (&g.reslice, g.layouts.is_empty()) {
        diags.push(error(
            &r.loc,
            &format!("{}.reslice", g.key),
            "`reslice` without any [[gpu.layout]]: there is no other layout to switch to".into(),
            Some("add a [[gpu.layout]] with a name and a use, or remove reslice".into()),
        ));
    }
    let mut names: BTreeSet<&str> = BTreeSet::new();
    for l in &g.layouts {
        if !names.insert(l.name.value.as_str()) {
            diags.push(error(
                &l.name.loc,
                &format!("{}.name", l.key),
                format!("layout '{}' is named twice in this entry", l.name.value),
                Some("give each layout its own name".into()),
            ));
        }
        // The same checks as the entry's own use, at the layout's keys.
        let as_entry = GpuPart {
            key: l.key.clone(),
            loc: l.loc.clone(),
            selector: g.selector.clone(),
            usage: l.usage.clone(),
            layouts: Vec::new(),
            reslice: None,
        };
        check_refs(&as_entry, teams, diags);
        if let UsagePart::Mig(m) = &l.usage {
            check_mig_static(&as_entry, m, diags);
        }
    }
}

fn team_refs(g: &GpuPart) -> Vec<&At<String>> {
    match &g.usage {
        UsagePart::Owned(t) => vec![t],
        UsagePart::Shared(ts) => ts.iter().collect(),
        UsagePart::Mig(ms) => ms.iter().map(|m| &m.owner).collect(),
    }
}

fn check_teams(
    teams: &BTreeMap<String, TeamPart>,
    gpus: &[&GpuPart],
    teams_of_bad_gpus: &BTreeSet<&str>,
    diags: &mut Vec<Diagnostic>,
) {
    let mut used: BTreeSet<&str> = gpus
        .iter()
        .flat_map(|g| {
            team_refs(g)
                .into_iter()
                .chain(g.layouts.iter().flat_map(|l| match &l.usage {
                    UsagePart::Owned(t) => vec![t],
                    UsagePart::Shared(ts) => ts.iter().collect(),
                    UsagePart::Mig(ms) => ms.iter().map(|m| &m.owner).collect(),
                }))
        })
        .map(|t| t.value.as_str())
        .collect();
    used.extend(teams_of_bad_gpus);
    for t in teams.values() {
        let key = format!("teams.{}", t.name);
        // An invalid name has its error already; "no GPUs" would only add noise.
        if !used.contains(t.name.as_str()) && super::valid_team_name(&t.name) {
            diags.push(warning(
                &t.loc,
                &key,
                format!("team '{}' has no GPUs: no [[gpu]] entry names it", t.name),
                Some("its slice is still created, so members can join it".into()),
            ));
        }
        if let (Some(max), Some(high)) = (&t.limits.memory_max, &t.limits.memory_high) {
            // Values of the same shape compare without a host; mixed ones in the host check.
            let order =
                crate::settings::kinds::memory_order(max.value.as_ref(), high.value.as_ref(), 0);
            if let Err(m) = order {
                diags.push(error(
                    &high.loc,
                    &format!("{key}.memory-high"),
                    m,
                    Some("set memory-high below memory-max".into()),
                ));
            }
        }
        if let Some(gm) = t.placement.as_ref().and_then(|p| p.gpu_memory.as_ref()) {
            let daemon = t.mps.as_ref().and_then(|m| value(&m.pinned_memory_limit));
            let why = match (&t.mps, daemon) {
                (None, _) => Some(
                    "only an MPS daemon enforces a job's GPU memory (its pinned device memory \
                     limit); team has no [mps], and on a GPU without MPS no mechanism can"
                        .to_string(),
                ),
                (Some(_), Some(d)) if gm.value > d => Some(format!(
                    "{} bytes is above the team's MPS daemon limit (mps.pinned-memory-limit = \
                     {d} bytes): a client cannot be given more than its server",
                    gm.value
                )),
                _ => None,
            };
            if let Some(m) = why {
                diags.push(error(
                    &gm.loc,
                    &format!("{key}.placement.gpu-memory"),
                    m,
                    Some("add [teams.NAME.mps], or remove gpu-memory".into()),
                ));
            }
        }
        if let Some(idle) = &t.idle {
            if idle.after.is_none() {
                diags.push(error(
                    &idle.loc,
                    &format!("{key}.idle"),
                    "missing `after`: how long a holder must stay idle".into(),
                    Some("e.g. after = \"2h\"".into()),
                ));
            }
            let action = value(&idle.action).unwrap_or_default();
            if let (Some(g), true) = (&idle.grace, action != super::IdleAction::Stop) {
                diags.push(warning(
                    &g.loc,
                    &format!("{key}.idle.grace"),
                    format!("grace has no effect with action = \"{action}\": it is the time between the warning and the stop"),
                    Some("remove it, or set action = \"stop\"".into()),
                ));
            }
        }
        if let Some(mps) = t.mps.as_ref().filter(|m| m.user.is_none()) {
            let members: &[Member] = t.members.as_ref().map(|m| &m.value[..]).unwrap_or(&[]);
            let users = members
                .iter()
                .filter(|m| matches!(m, Member::User(_)))
                .count();
            let groups = members.len() - users;
            if users > 1 || groups > 0 {
                diags.push(warning(
                    &mps.loc,
                    &format!("{key}.mps"),
                    format!(
                        "team '{}' runs MPS for several users without a dedicated `mps.user`: a \
                         legacy MPS server serves one Unix user at a time, so the others' jobs \
                         wait",
                        t.name
                    ),
                    Some("set user = \"mps-<team>\" in the mps table".into()),
                ));
            }
        }
    }
}

/// `reconfigure = "drain"` with a drain timeout of zero stops nothing gracefully: units would be
/// killed the moment the drain starts.
fn check_drain(host: &HostPart, diags: &mut Vec<Diagnostic>) {
    let drain = value(&host.reconfigure) == Some(super::Reconfigure::Drain);
    if let Some(t) = host
        .drain_timeout
        .as_ref()
        .filter(|t| drain && t.value.is_zero())
    {
        diags.push(error(
            &t.loc,
            "host.drain-timeout",
            "a drain timeout of 0 with reconfigure = \"drain\" gives the team's units no time \
             to stop"
                .into(),
            Some(format!(
                "give the units time to stop, e.g. \"5m\" (at most {} h)",
                crate::settings::value::MAX_DRAIN_TIMEOUT.as_secs() / 3600
            )),
        ));
    }
}

fn check_refs(g: &GpuPart, teams: &BTreeMap<String, TeamPart>, diags: &mut Vec<Diagnostic>) {
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for (i, r) in team_refs(g).into_iter().enumerate() {
        let key = match &g.usage {
            UsagePart::Owned(_) => format!("{}.owner", g.key),
            UsagePart::Shared(_) => format!("{}.shared", g.key),
            UsagePart::Mig(ms) => format!("{}.owner", ms[i].key),
        };
        if !teams.contains_key(&r.value) {
            let help = if teams.is_empty() {
                format!("no teams are defined; add [teams.{}]", r.value)
            } else {
                format!(
                    "defined teams: {}",
                    teams.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            };
            let help = suggest(&r.value, teams.keys().map(String::as_str), help);
            diags.push(error(
                &r.loc,
                &key,
                format!("unknown team '{}'", r.value),
                Some(help),
            ));
        }
        if matches!(g.usage, UsagePart::Shared(_)) && !seen.insert(&r.value) {
            diags.push(error(
                &r.loc,
                &key,
                format!("team '{}' is listed twice", r.value),
                None,
            ));
        }
    }
}

/// Case-insensitive glob with `*` and `?`, as used by `model = "*H100*"`.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    glob_case(&pattern.to_lowercase(), &text.to_lowercase())
}

/// Case-sensitive glob with `*` and `?` (one `*` backtrack point: linear in practice).
pub fn glob_case(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Whether a `model` pattern matches a catalog model: by NVML name (`NVIDIA H100 80GB HBM3`),
/// reference key (`H100-SXM5-80GB`) or simulate name (`h100-80gb`).
pub fn model_matches(pattern: &str, model: &GpuModel) -> bool {
    glob_match(pattern, &model.nvml_name)
        || glob_match(pattern, &model.key)
        || glob_match(pattern, model.sim_name())
}

/// The model of an observed GPU, by reference key or NVML name.
pub fn model_of(gpu: &GpuState) -> Option<&'static GpuModel> {
    let c = Catalog::get();
    gpu.model
        .as_deref()
        .and_then(|k| c.by_key(k))
        .or_else(|| c.by_nvml_name(&gpu.name))
}

impl Selector {
    /// Whether the selector names an observed GPU. `model` globs match the NVML name, the
    /// reference key and the simulate name, case-insensitively.
    pub fn matches(&self, gpu: &GpuState) -> bool {
        match self {
            Selector::Index(v) => v.contains(&gpu.index),
            Selector::Uuid(v) => v.iter().any(|u| u.eq_ignore_ascii_case(&gpu.uuid)),
            Selector::Model(p) => {
                glob_match(p, &gpu.name) || model_of(gpu).is_some_and(|m| model_matches(p, m))
            }
            Selector::All => true,
        }
    }

    /// Short human description: `gpu 0`, `gpus 0,1`, `GPU-…`, `GPUs matching '*H100*'`.
    pub fn describe(&self) -> String {
        match self {
            Selector::Index(v) if v.len() == 1 => format!("gpu {}", v[0]),
            Selector::Index(v) => format!(
                "gpus {}",
                v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            ),
            Selector::Uuid(v) => v.join(","),
            Selector::Model(p) => format!("GPUs matching '{p}'"),
            Selector::All => "every GPU".into(),
        }
    }
}

impl Policy {
    /// The other layout of `entry` that GPU `index` has now, if gpuctld switched it to one.
    pub fn layout_in_force<'a>(
        &'a self,
        entry: &'a crate::policy::GpuAssignment,
        index: u32,
    ) -> Option<&'a crate::policy::Layout> {
        let name = self.layouts_in_force.get(&index)?;
        entry
            .layouts
            .as_ref()?
            .other
            .iter()
            .find(|l| &l.name == name)
    }

    /// What the policy wants for one observed GPU; `None` when no entry names it (the GPU is
    /// left untouched). Entries that are all `shared` merge their team lists in order. When
    /// several other entries claim the GPU (an error [`check_against_host`] reports), the first
    /// entry wins.
    pub fn usage_for(&self, gpu: &GpuState) -> Option<GpuUse> {
        let mut matching = self.gpus.iter().filter(|a| a.selector.matches(gpu));
        let entry = matching.next()?;
        if let Some(l) = self.layout_in_force(entry, gpu.index) {
            return Some(l.usage.clone());
        }
        let first = entry.usage.clone();
        let GpuUse::Shared(mut teams) = first else {
            return Some(first);
        };
        for a in matching {
            if let GpuUse::Shared(more) = &a.usage {
                for t in more {
                    if !teams.contains(t) {
                        teams.push(t.clone());
                    }
                }
            }
        }
        Some(GpuUse::Shared(teams))
    }
}

/// The NVML name without the vendor prefix, for messages: `H100 80GB HBM3`.
fn short_name(name: &str) -> &str {
    name.strip_prefix("NVIDIA ").unwrap_or(name)
}

/// `(key, first, item)` triples grouped by key, in the order first seen; a group keeps the
/// `first` of its first triple (the help of a message found on several GPUs or models).
fn group<K: PartialEq, F, V>(triples: impl IntoIterator<Item = (K, F, V)>) -> Vec<(K, F, Vec<V>)> {
    let mut groups: Vec<(K, F, Vec<V>)> = Vec::new();
    for (k, first, v) in triples {
        match groups.iter_mut().find(|(g, _, _)| *g == k) {
            Some((_, _, vs)) => vs.push(v),
            None => groups.push((k, first, vec![v])),
        }
    }
    groups
}

/// Profiles of the given models, grouped by identical lists, for "valid profiles are" hints.
fn profiles_help(models: &[&GpuModel]) -> String {
    let lists = models.iter().map(|m| {
        let names: Vec<&str> = m.gi_profiles.iter().map(|p| p.name.as_str()).collect();
        (names.join(", "), (), m.key.as_str())
    });
    group(lists)
        .iter()
        .map(|(names, (), ms)| format!("{}: {names}", ms.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The MIG part of one entry checked against one model: profiles exist, compute splits are valid
/// and fit their GI, and the geometry fits the GPU. Returns (field, message, help) triples;
/// messages do not name the model, callers prefix it.
type MigProblem = (Field, String, Option<String>);

/// Which part of a MIG entry a problem concerns, to point at the right line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    /// The whole geometry.
    Entry,
    /// `mig[i].profile`.
    Profile(usize),
    /// `mig[i].compute`.
    Compute(usize),
}

fn check_mig_on_model(model: &GpuModel, specs: &[MigSpec]) -> Vec<MigProblem> {
    let mut out = Vec::new();
    if !model.mig_capable() {
        out.push((
            Field::Entry,
            "no MIG".to_string(),
            Some("use owner = \"team\" or shared = [...] for GPUs without MIG".into()),
        ));
        return out;
    }
    let mut wanted: Vec<&GiProfile> = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        let Some(gi) = model.gi_profile(&s.profile) else {
            let names = model.gi_profiles.iter().map(|p| p.name.as_str());
            let help = format!("valid profiles: {}", profiles_help(&[model]));
            let help = suggest(&s.profile, names, help);
            out.push((
                Field::Profile(i),
                format!("no MIG profile '{}'", s.profile),
                Some(help),
            ));
            continue;
        };
        wanted.extend(std::iter::repeat_n(gi, s.count as usize));
        if !s.compute.is_empty() {
            let valid: Vec<&str> = model
                .ci_profiles(&gi.name)
                .iter()
                .map(|c| c.short_name())
                .collect();
            let mut cis = Vec::new();
            for c in &s.compute {
                match model.ci_profile(&gi.name, c) {
                    Some(ci) => cis.push(ci),
                    None => out.push((
                        Field::Compute(i),
                        format!("'{c}' is not a compute-instance profile of {}", gi.name),
                        Some(format!("valid in {}: {}", gi.name, valid.join(", "))),
                    )),
                }
            }
            if cis.len() == s.compute.len() {
                if let Err(m) = fit_compute(gi, &cis) {
                    out.push((
                        Field::Compute(i),
                        format!("compute split of {}: {m}", gi.name),
                        Some(format!(
                            "the CIs of one {} may use {} compute slices in total",
                            gi.name, gi.slice_count
                        )),
                    ));
                }
            }
        }
    }
    if out.is_empty() {
        if let Err(m) = fit(model, &wanted, &[]) {
            out.push((Field::Entry, m.to_string(), Some(misfit_help(model))));
        }
    }
    out
}

fn misfit_help(model: &GpuModel) -> String {
    format!(
        "{} has {} memory and {} compute slices and holds at most {} instances; \
         `nvidia-smi mig -lgipp` lists each profile's placements",
        short_name(&model.nvml_name),
        model.memory_slices,
        model.compute_slices,
        model.max_mig_device_count
    )
}

/// The entries as specs, `None` when one names no valid team (its error is reported; the
/// geometry is checked once the name is fixed).
fn mig_specs(ms: &[super::parse::MigPart]) -> Option<Vec<MigSpec>> {
    ms.iter()
        .map(|m| {
            Some(MigSpec {
                profile: m.profile.value.clone(),
                owner: named(&m.owner.value)?,
                count: m.count,
                compute: value(&m.compute).unwrap_or_default(),
            })
        })
        .collect()
}

/// MIG checks without a host. A `model` selector must work on every catalog model it matches
/// (the geometry is applied to all of them); index, UUID and `all` selectors must work on at
/// least one catalog model, and [`check_against_host`] checks the real one.
fn check_mig_static(g: &GpuPart, ms: &[super::parse::MigPart], diags: &mut Vec<Diagnostic>) {
    let catalog = Catalog::get();
    let Some(specs) = mig_specs(ms) else {
        return;
    };
    let push = |diags: &mut Vec<Diagnostic>, field: Field, msg: String, help| {
        let (loc, key) = match field {
            Field::Profile(i) => (&ms[i].profile.loc, format!("{}.profile", ms[i].key)),
            Field::Compute(i) => match &ms[i].compute {
                Some(c) => (&c.loc, format!("{}.compute", ms[i].key)),
                None => (&ms[i].loc, ms[i].key.clone()),
            },
            Field::Entry => (&g.loc, format!("{}.mig", g.key)),
        };
        diags.push(error(loc, &key, msg, help));
    };

    if let Selector::Model(pat) = &g.selector.value {
        let matched: Vec<&GpuModel> = catalog
            .models()
            .iter()
            .filter(|m| model_matches(pat, m))
            .collect();
        if matched.is_empty() {
            diags.push(warning(
                &g.selector.loc,
                &format!("{}.model", g.key),
                format!("'{pat}' matches no known GPU model, so the MIG geometry is not checked"),
                Some(format!(
                    "known models: {}",
                    catalog
                        .models()
                        .iter()
                        .map(|m| format!("{} ({})", m.nvml_name, m.sim_name()))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            ));
            return;
        }
        // Every matched model gets this geometry: report each model's problems, merging the
        // identical ones (A100-80GB and H100 share profile names and slice counts).
        let found = matched.iter().flat_map(|m| {
            check_mig_on_model(m, &specs)
                .into_iter()
                .map(move |(i, msg, help)| ((i, msg), help, m.key.as_str()))
        });
        for ((i, msg), help, models) in group(found) {
            push(
                diags,
                i,
                format!("{} (matched by '{pat}'): {msg}", models.join(", ")),
                help,
            );
        }
        return;
    }

    // Index, UUID, all: the GPU could be any MIG-capable model. Profile names carry the memory
    // size, so they usually pin the model family.
    let mig_models: Vec<&GpuModel> = catalog
        .models()
        .iter()
        .filter(|m| m.mig_capable())
        .collect();
    let mut all_known = true;
    for (i, s) in specs.iter().enumerate() {
        if !mig_models
            .iter()
            .any(|m| m.gi_profile(&s.profile).is_some())
        {
            all_known = false;
            let help = format!("known profiles by model: {}", profiles_help(&mig_models));
            let names: BTreeSet<&str> = mig_models
                .iter()
                .flat_map(|m| m.gi_profiles.iter().map(|p| p.name.as_str()))
                .collect();
            push(
                diags,
                Field::Profile(i),
                format!("no GPU model has a MIG profile '{}'", s.profile),
                Some(suggest(&s.profile, names, help)),
            );
        }
    }
    if !all_known {
        return;
    }
    let viable: Vec<&GpuModel> = mig_models
        .iter()
        .copied()
        .filter(|m| specs.iter().all(|s| m.gi_profile(&s.profile).is_some()))
        .collect();
    if viable.is_empty() {
        let which = specs
            .iter()
            .map(|s| {
                let ms: Vec<&str> = mig_models
                    .iter()
                    .filter(|m| m.gi_profile(&s.profile).is_some())
                    .map(|m| m.key.as_str())
                    .collect();
                format!("{} ({})", s.profile, ms.join(", "))
            })
            .collect::<Vec<_>>()
            .join(", ");
        push(
            diags,
            Field::Entry,
            "no single GPU model has all of these MIG profiles".into(),
            Some(format!("profiles exist on: {which}")),
        );
        return;
    }
    if viable.len() < mig_models.len() && matches!(g.selector.value, Selector::All) {
        // Valid here, refused by `plan` on a GPU of any other model: say which ones it is for.
        // Index and UUID entries pick GPUs the host check matches against their real model.
        let keys: Vec<&str> = viable.iter().map(|m| m.key.as_str()).collect();
        let profiles: Vec<&str> = specs.iter().map(|s| s.profile.as_str()).collect();
        diags.push(warning(
            &g.loc,
            &format!("{}.mig", g.key),
            format!(
                "MIG profile(s) {} exist only on {}: plan refuses this entry on a GPU of another \
                 model",
                profiles.join(", "),
                keys.join(", ")
            ),
            Some("replace all = true by model = \"…\" (a glob over these names)".into()),
        ));
    }
    let results: Vec<(&GpuModel, Vec<MigProblem>)> = viable
        .iter()
        .map(|m| (*m, check_mig_on_model(m, &specs)))
        .collect();
    if results.iter().any(|(_, p)| p.is_empty()) {
        return;
    }
    // Fails on every model it could be: report the problems of each, merged by text.
    let found = results.into_iter().flat_map(|(m, problems)| {
        problems
            .into_iter()
            .map(move |(i, msg, help)| ((i, msg), help, short_name(&m.nvml_name)))
    });
    for ((i, msg), help, models) in group(found) {
        push(
            diags,
            i,
            format!(
                "{} ({}): {msg}",
                g.selector.value.describe(),
                models.join(", ")
            ),
            help,
        );
    }
}

/// Whether two selectors can name the same GPU without knowing the host, and how to say so.
/// Index/UUID, and model against index/UUID, cannot be decided here (see [`check_against_host`]).
fn static_overlap(a: &Selector, b: &Selector) -> Option<String> {
    match (a, b) {
        (Selector::All, _) | (_, Selector::All) => Some("every GPU".into()),
        (Selector::Index(x), Selector::Index(y)) => {
            common(x, y, |i| *i).map(|both| format!("gpu {both}"))
        }
        (Selector::Uuid(x), Selector::Uuid(y)) => common(x, y, |u| u.to_ascii_lowercase()),
        (Selector::Model(p), Selector::Model(q)) => {
            if p.eq_ignore_ascii_case(q) {
                return Some(format!("GPUs matching '{p}'"));
            }
            let both: Vec<&str> = Catalog::get()
                .models()
                .iter()
                .filter(|m| model_matches(p, m) && model_matches(q, m))
                .map(|m| m.key.as_str())
                .collect();
            (!both.is_empty()).then(|| format!("{} GPUs", both.join(", ")))
        }
        _ => None,
    }
}

/// The items of `x` also in `y` (the same by `key`), comma-separated; `None` when there are none.
fn common<T: ToString, K: Ord>(x: &[T], y: &[T], key: impl Fn(&T) -> K) -> Option<String> {
    let ys: BTreeSet<K> = y.iter().map(&key).collect();
    let both: Vec<String> = x
        .iter()
        .filter(|a| ys.contains(&key(a)))
        .map(T::to_string)
        .collect();
    (!both.is_empty()).then(|| both.join(","))
}

const OVERLAP_HELP: &str = "each GPU may be named by one [[gpu]] entry; only entries that are \
                            both `shared` may overlap, and then their teams add up";

fn check_overlaps_static(gpus: &[&GpuPart], diags: &mut Vec<Diagnostic>) {
    for (j, b) in gpus.iter().enumerate() {
        for a in &gpus[..j] {
            let both_shared = matches!(
                (&a.usage, &b.usage),
                (UsagePart::Shared(_), UsagePart::Shared(_))
            );
            if both_shared {
                continue;
            }
            if let Some(what) = static_overlap(&a.selector.value, &b.selector.value) {
                diags.push(error(
                    &b.selector.loc,
                    &b.key,
                    format!(
                        "{what} assigned twice: here and at {} ({})",
                        a.selector.loc, a.key
                    ),
                    Some(OVERLAP_HELP.into()),
                ));
                // One report per entry is enough to point the admin at the conflict.
                break;
            }
        }
    }
}

/// Team limits that only make sense on some hosts: CPUs the host does not have (systemd would
/// accept `AllowedCPUs=` and the kernel would quietly narrow or refuse the set), and percentages
/// of a RAM size the host did not report (they would resolve to `MemoryMax=0`, which kills every
/// process of the team). A host that reports 0 CPUs or 0 bytes is treated as unknown.
fn check_teams_on_host(
    policy: &Policy,
    observed: &Observed,
    none: &Loc,
    out: &mut Vec<Diagnostic>,
) {
    let host = &observed.host;
    for t in policy.teams.values() {
        let loc = t.loc.as_ref().unwrap_or(none);
        let key = format!("teams.{}", t.name);
        let max_cpu = t.limits.allowed_cpus.as_ref().and_then(|c| c.max());
        if let Some(max) = max_cpu.filter(|max| host.cpus > 0 && *max >= host.cpus) {
            out.push(error(
                loc,
                &format!("{key}.allowed-cpus"),
                format!(
                    "CPU {max} does not exist: this host has {} CPUs (0-{})",
                    host.cpus,
                    host.cpus - 1
                ),
                Some(format!("use CPU numbers below {}", host.cpus)),
            ));
        }
        for (name, size) in [
            ("memory-max", t.limits.memory_max),
            ("memory-high", t.limits.memory_high),
        ] {
            if let (Some(Size::PercentOfRam(p)), 0) = (size, host.memory_bytes) {
                out.push(error(
                    loc,
                    &format!("{key}.{name}"),
                    format!("{p}% of host RAM cannot be resolved: the host's RAM size is unknown"),
                    Some("give an absolute size such as \"64G\"".into()),
                ));
            }
        }
        if host.memory_bytes == 0 {
            continue;
        }
        // Every setting's bounds once resolved for this host (memory floor and host RAM).
        for (name, m) in t.limits.check(host.memory_bytes) {
            out.push(error(loc, &format!("{key}.{name}"), m, None));
        }
        // Compared after resolution, so "50%" against "10G" is caught too; same shapes were
        // compared without a host (in `check_teams`) and are not reported twice.
        if t.limits.memory_order(0).is_ok() {
            if let Err(m) = t.limits.memory_order(host.memory_bytes) {
                out.push(error(
                    loc,
                    &format!("{key}.memory-high"),
                    format!("{m} on this host"),
                    Some("set memory-high below memory-max".into()),
                ));
            }
        }
    }
}

/// The checks of [`check_against_host`] that need no GPU: CPUs and RAM. What `gpuctl plan`
/// runs when NVML is not available, so a CPU the host lacks is caught whatever the driver does.
pub fn check_host_limits(policy: &Policy, observed: &Observed) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let none = Loc::start(policy.sources.first().cloned().unwrap_or_default());
    check_teams_on_host(policy, observed, &none, &mut out);
    out
}

/// Check a validated policy against a host: selectors resolve to real GPUs, MIG geometries use
/// profiles of each GPU's real model and fit it, and no GPU is claimed by two entries (unless
/// both are `shared`). The planner calls this before planning; an error means "do not plan".
///
/// Messages name GPUs as `gpu 0 (H100 80GB HBM3)`; identical problems on several GPUs of one
/// entry are reported once, listing the GPUs.
pub fn check_against_host(policy: &Policy, observed: &Observed) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let none = Loc::start(policy.sources.first().cloned().unwrap_or_default());
    check_teams_on_host(policy, observed, &none, &mut out);
    if let Some(why) = &observed.nvml_unavailable {
        if !policy.gpus.is_empty() {
            out.push(Diagnostic::error(
                None,
                "",
                format!("cannot see the GPUs: {why}"),
                Some("check the NVIDIA driver, or host.nvml-library".into()),
            ));
        }
        return out;
    }
    let host_gpus = || {
        if observed.gpus.is_empty() {
            "this host has no GPUs".to_string()
        } else {
            format!(
                "this host has: {}",
                observed
                    .gpus
                    .iter()
                    .map(|g| format!("gpu {} ({}, {})", g.index, short_name(&g.name), g.uuid))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    };
    for a in &policy.gpus {
        let loc = a.loc.as_ref().unwrap_or(&none);
        let matched: Vec<&GpuState> = observed
            .gpus
            .iter()
            .filter(|g| a.selector.matches(g))
            .collect();
        let missing: Vec<(&str, String)> = match &a.selector {
            Selector::Index(v) => v
                .iter()
                .filter(|i| !observed.gpus.iter().any(|g| g.index == **i))
                .map(|i| ("index", format!("gpu {i} does not exist")))
                .collect(),
            Selector::Uuid(v) => v
                .iter()
                .filter(|u| !observed.gpus.iter().any(|g| g.uuid.eq_ignore_ascii_case(u)))
                .map(|u| ("uuid", format!("no GPU has UUID {u}")))
                .collect(),
            Selector::Model(_) | Selector::All => Vec::new(),
        };
        for (field, msg) in missing {
            let key = format!("{}.{field}", a.key);
            out.push(error(loc, &key, msg, Some(host_gpus())));
        }
        if let (Selector::Model(p), true) = (&a.selector, matched.is_empty()) {
            out.push(warning(
                loc,
                &format!("{}.model", a.key),
                format!("'{p}' matches no GPU on this host; the entry does nothing here"),
                Some(host_gpus()),
            ));
        }
        let uses = std::iter::once((a.key.clone(), &a.usage)).chain(
            a.layouts
                .iter()
                .flat_map(|ls| ls.other.iter().enumerate())
                .map(|(i, l)| (format!("{}.layout[{i}]", a.key), &l.usage)),
        );
        for (ukey, usage) in uses {
            let GpuUse::Mig(specs) = usage else {
                continue;
            };
            // Group identical problems across GPUs of one entry.
            let found = matched.iter().flat_map(|g| {
                let problems: Vec<(String, Option<String>)> = match model_of(g) {
                    None => vec![(
                        format!("unknown GPU model '{}', so MIG cannot be planned", g.name),
                        Some(format!(
                            "known models: {}",
                            Catalog::get()
                                .models()
                                .iter()
                                .map(|m| m.nvml_name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )),
                    )],
                    Some(_) if g.mig.is_none() => vec![(
                        "this GPU has no MIG".into(),
                        Some("use owner = \"team\" or shared = [...] for GPUs without MIG".into()),
                    )],
                    Some(m) => check_mig_on_model(m, specs)
                        .into_iter()
                        .map(|(f, msg, help)| match f {
                            Field::Profile(i) | Field::Compute(i) => {
                                (format!("mig[{i}]: {msg}"), help)
                            }
                            Field::Entry => (msg, help),
                        })
                        .collect(),
                };
                problems.into_iter().map(move |(msg, help)| (msg, help, *g))
            });
            for (msg, help, gs) in group(found) {
                // `gpu 0` or `gpus 2,3`, as a selector of these indices says it.
                let gpus = Selector::Index(gs.iter().map(|g| g.index).collect()).describe();
                let names: BTreeSet<&str> = gs.iter().map(|g| short_name(&g.name)).collect();
                let names = names.into_iter().collect::<Vec<_>>().join(", ");
                let key = format!("{ukey}.mig");
                out.push(error(loc, &key, format!("{gpus} ({names}): {msg}"), help));
            }
        }
    }

    // Double claims on real GPUs: catches what the static check cannot (an index and a model
    // glob that turn out to name the same GPU).
    let mut reported: BTreeSet<(usize, usize)> = BTreeSet::new();
    for g in &observed.gpus {
        let claims: Vec<(usize, &GpuAssignment)> = policy
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, a)| a.selector.matches(g))
            .collect();
        for (n, (j, b)) in claims.iter().enumerate() {
            for (i, a) in &claims[..n] {
                let both_shared =
                    matches!((&a.usage, &b.usage), (GpuUse::Shared(_), GpuUse::Shared(_)));
                if both_shared || !reported.insert((*i, *j)) {
                    continue;
                }
                let aloc = a.loc.as_ref().map(Loc::to_string).unwrap_or_default();
                out.push(error(
                    b.loc.as_ref().unwrap_or(&none),
                    &b.key,
                    format!(
                        "gpu {} ({}) assigned twice: here and at {aloc} ({})",
                        g.index,
                        short_name(&g.name),
                        a.key
                    ),
                    Some(OVERLAP_HELP.into()),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*H100*", "NVIDIA H100 80GB HBM3"));
        assert!(glob_match("*h100*", "NVIDIA H100 80GB HBM3"));
        assert!(glob_match("a100-?0gb", "a100-40gb"));
        assert!(!glob_match("*H100", "NVIDIA H100 80GB HBM3"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a", ""));
        assert!(glob_match("*a*b", "xxaxxb"));
    }

    #[test]
    fn model_patterns_match_names_keys_and_sim_names() {
        let c = Catalog::get();
        let h100 = c.by_key("H100-SXM5-80GB").unwrap();
        for p in ["*H100 80GB*", "H100-SXM5-*", "h100-80gb"] {
            assert!(model_matches(p, h100), "{p}");
        }
        assert!(!model_matches("*A100*", h100));
    }

    use crate::observe::{GpuInstance, MigState};
    use crate::policy::load::{load_sources, Source};
    use std::path::PathBuf;

    /// Validate `text` as one file; returns the outcome's diagnostics as display strings, and the
    /// policy when valid.
    fn check(text: &str) -> (Option<Policy>, Vec<String>) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p.toml");
        std::fs::write(&p, text).unwrap();
        let o = load_sources(&[Source {
            read: p,
            host: PathBuf::from("/etc/gpuctl/policy.toml"),
        }]);
        (
            o.policy,
            o.diagnostics.iter().map(|d| d.to_string()).collect(),
        )
    }

    const TEAMS: &str = "version = 1\n[teams.a]\nmembers = [\"x\"]\n[teams.b]\nmembers = [\"y\"]\n";

    fn gpu(index: u32, key: &str) -> GpuState {
        let m = Catalog::get().by_key(key).unwrap();
        GpuState {
            index,
            uuid: format!("GPU-0000000{index}-0000-0000-0000-000000000000"),
            name: m.nvml_name.clone(),
            model: Some(m.key.clone()),
            minor: index,
            memory_mib: m.memory_total_mib,
            mig: m.mig_capable().then(MigState::default),
            processes: vec![],
        }
    }

    fn host(gpus: Vec<GpuState>) -> Observed {
        Observed {
            gpus,
            ..Observed::default()
        }
    }

    /// [`check_against_host`]'s diagnostics as display strings.
    fn on_host(p: &Policy, obs: &Observed) -> Vec<String> {
        check_against_host(p, obs)
            .iter()
            .map(|d| d.to_string())
            .collect()
    }

    /// Some diagnostic of `d` contains every one of `parts`.
    #[track_caller]
    fn assert_any(d: &[String], parts: &[&str]) {
        assert!(
            d.iter().any(|e| parts.iter().all(|p| e.contains(p))),
            "{parts:?} in {d:#?}"
        );
    }

    #[test]
    fn team_limits_are_checked_against_the_host() {
        let (p, d) = check(
            "version = 1\n[teams.a]\nallowed-cpus = \"0-7,130\"\nmemory-max = \"25%\"\n\
             [teams.b]\nallowed-cpus = \"0-127\"\nmemory-high = \"10%\"\n",
        );
        let p = p.unwrap_or_else(|| panic!("{d:#?}"));
        let mut obs = host(vec![]);
        obs.host.cpus = 128;
        obs.host.memory_bytes = 1 << 40;
        let d = on_host(&p, &obs);
        assert_eq!(
            d,
            vec![
                "/etc/gpuctl/policy.toml:2:8: error: teams.a.allowed-cpus: CPU 130 does not \
                  exist: this host has 128 CPUs (0-127) (use CPU numbers below 128)"
                    .to_string()
            ],
        );
        // RAM unknown: percentages cannot become bytes.
        obs.host.memory_bytes = 0;
        let d = on_host(&p, &obs);
        assert_eq!(d.len(), 3, "{d:#?}");
        assert!(d[1].contains("teams.a.memory-max: 25% of host RAM cannot be resolved"));
        assert!(d[2].contains("teams.b.memory-high: 10% of host RAM cannot be resolved"));
        // CPUs unknown: no CPU check.
        obs.host.cpus = 0;
        obs.host.memory_bytes = 1 << 40;
        assert!(check_against_host(&p, &obs).is_empty());
    }

    #[test]
    fn all_overlaps_everything_but_shared_entries_may_overlap() {
        let (p, d) = check(&format!(
            "{TEAMS}[[gpu]]\nall = true\nowner = \"a\"\n[[gpu]]\nindex = [2]\nowner = \"b\"\n"
        ));
        assert!(p.is_none());
        assert_any(&d, &[":10:9: error: gpu[1]: every GPU assigned twice: here and at /etc/gpuctl/policy.toml:7:7 (gpu[0])"]);
        let (p, d) = check(&format!(
            "{TEAMS}[[gpu]]\nall = true\nshared = [\"a\"]\n[[gpu]]\nindex = [2]\nshared = [\"b\", \"a\"]\n"
        ));
        let p = p.unwrap_or_else(|| panic!("{d:#?}"));
        let g = gpu(2, "H100-SXM5-80GB");
        assert_eq!(
            p.usage_for(&g),
            Some(GpuUse::Shared(vec![
                "a".parse().unwrap(),
                "b".parse().unwrap()
            ]))
        );
        assert!(check_against_host(&p, &host(vec![g])).is_empty());
    }

    #[test]
    fn overlapping_model_globs_conflict_when_a_model_matches_both() {
        let (_, d) = check(&format!(
            "{TEAMS}[[gpu]]\nmodel = \"*H100*\"\nowner = \"a\"\n[[gpu]]\nmodel = \"h100-80gb\"\nowner = \"b\"\n"
        ));
        assert_any(&d, &["H100-SXM5-80GB GPUs assigned twice"]);
        let (p, _) = check(&format!(
            "{TEAMS}[[gpu]]\nmodel = \"*H100*\"\nowner = \"a\"\n[[gpu]]\nmodel = \"*A100*\"\nowner = \"b\"\n"
        ));
        assert!(p.is_some());
    }

    #[test]
    fn mps_for_many_users_without_a_dedicated_user_warns() {
        let text = "version = 1\n[teams.a]\nmembers = [\"x\", \"y\"]\n[teams.a.mps]\nactive-thread-percentage = 50\n[[gpu]]\nindex = [0]\nowner = \"a\"\n";
        let (p, d) = check(text);
        assert!(p.is_some(), "a warning does not reject");
        assert_eq!(d.len(), 1, "{d:#?}");
        assert!(d[0].contains(":4:1: warning: teams.a.mps: "), "{}", d[0]);
        let (_, d) = check(&text.replace("active-thread", "user = \"mps-a\"\nactive-thread"));
        assert!(d.is_empty(), "{d:#?}");
    }

    #[test]
    fn compute_splits_are_checked_against_the_gi() {
        let (_, d) = check(&format!(
            "{TEAMS}[[gpu]]\nindex = [0]\nmig = [{{ profile = \"3g.40gb\", owner = \"a\", compute = [\"2c\", \"2c\"] }}]\n"
        ));
        assert_any(
            &d,
            &["gpu[0].mig[0].compute", "needs 4 of 3 compute slices"],
        );
        let (_, d) = check(&format!(
            "{TEAMS}[[gpu]]\nindex = [0]\nmig = [{{ profile = \"2g.20gb\", owner = \"a\", compute = [\"3c\"] }}]\n"
        ));
        assert_any(&d, &["'3c' is not a compute-instance profile of 2g.20gb"]);
    }

    #[test]
    fn profiles_from_different_models_cannot_mix() {
        let (_, d) = check(&format!(
            "{TEAMS}[[gpu]]\nindex = [0]\nmig = [{{ profile = \"3g.20gb\", owner = \"a\" }}, {{ profile = \"3g.40gb\", owner = \"b\" }}]\n"
        ));
        assert_any(&d, &["no single GPU model has all of these MIG profiles"]);
    }

    #[test]
    fn host_check_resolves_selectors_and_real_models() {
        let text = format!(
            "{TEAMS}[[gpu]]\nindex = [0, 9]\nmig = [{{ profile = \"3g.40gb\", owner = \"a\", count = 2 }}]\n\
             [[gpu]]\nmodel = \"*L40S*\"\nowner = \"b\"\n[[gpu]]\nuuid = [\"GPU-00000001-0000-0000-0000-000000000000\"]\nshared = [\"a\"]\n"
        );
        let (p, d) = check(&text);
        let p = p.unwrap_or_else(|| panic!("{d:#?}"));
        // GPU 0 is an A100-40GB, which has no 3g.40gb; GPU 9 does not exist; GPU 1 is an
        // L40S claimed by both the model glob and the UUID entry.
        let obs = host(vec![gpu(0, "A100-SXM4-40GB"), gpu(1, "L40S-48GB")]);
        let d = on_host(&p, &obs);
        assert_eq!(d.len(), 3, "{d:#?}");
        assert_any(&d[0..1], &["gpu[0].index: gpu 9 does not exist"]);
        assert_any(
            &d[1..2],
            &["gpu 0 (A100-SXM4-40GB): mig[0]: no MIG profile '3g.40gb'"],
        );
        assert_any(&d[2..3], &["gpu 1 (L40S) assigned twice"]);
    }

    #[test]
    fn host_check_explains_misfits_and_missing_mig() {
        let text = format!(
            "{TEAMS}[[gpu]]\nall = true\nmig = [{{ profile = \"4g.40gb\", owner = \"a\" }}, {{ profile = \"4g.40gb\", owner = \"b\" }}]\n"
        );
        let (p, d) = check(&text);
        // Statically this cannot fit on any model (one 4g.40gb per GPU): rejected already.
        assert!(p.is_none());
        assert_any(
            &d,
            &["every GPU (", "4g.40gb x2 needs 8 of 7 compute slices"],
        );

        let text = format!(
            "{TEAMS}[[gpu]]\nall = true\nmig = [{{ profile = \"7g.80gb\", owner = \"a\" }}]\n"
        );
        let p = check(&text).0.unwrap();
        let mut busy = gpu(1, "H100-SXM5-80GB");
        busy.mig.as_mut().unwrap().instances.push(GpuInstance {
            id: 1,
            profile_id: 0,
            profile: "7g.80gb".into(),
            placement: crate::profiles::Placement { start: 0, size: 8 },
            owner: None,
            compute: vec![],
        });
        let obs = host(vec![
            gpu(0, "H100-SXM5-80GB"),
            busy,
            gpu(2, "L40S-48GB"),
            gpu(3, "L40S-48GB"),
        ]);
        let d = on_host(&p, &obs);
        // Existing instances are the planner's business, not a policy error; the L40S pair is.
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_any(&d[0..1], &["gpus 2,3 (L40S): this GPU has no MIG"]);
    }

    #[test]
    fn empty_mig_holds_mig_gpus_for_no_team() {
        // `mig = []` on an index, a model and `all`: valid, MIG on with no instances, and the
        // team it would have named has no GPUs.
        for sel in ["index = [0]", "model = \"*H100*\"", "all = true"] {
            let (p, d) = check(&format!("{TEAMS}[[gpu]]\n{sel}\nmig = []\n"));
            let p = p.unwrap_or_else(|| panic!("{sel}: {d:#?}"));
            assert_eq!(p.gpus[0].usage, GpuUse::Mig(vec![]), "{sel}");
            assert!(d.iter().all(|e| e.contains("warning")), "{sel}: {d:#?}");
            assert_any(&d, &["teams.a: team 'a' has no GPUs"]);
        }
        // A model without MIG cannot be held in MIG mode: statically for a model glob, on the
        // host for the others, with the file and line of the entry.
        let (p, d) = check(&format!("{TEAMS}[[gpu]]\nmodel = \"*L40S*\"\nmig = []\n"));
        assert!(p.is_none());
        assert_any(
            &d,
            &["/etc/gpuctl/policy.toml:6:1: error: gpu[0].mig: ", "no MIG"],
        );
        let p = check(&format!("{TEAMS}[[gpu]]\nall = true\nmig = []\n"))
            .0
            .unwrap();
        let obs = host(vec![gpu(0, "H100-SXM5-80GB"), gpu(1, "L40S-48GB")]);
        let d = on_host(&p, &obs);
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_any(
            &d,
            &["policy.toml:6:1: error: gpu[0].mig: gpu 1 (L40S): this GPU has no MIG"],
        );
        // It claims its GPU like any entry: a second entry naming it is a conflict.
        let (p, d) = check(&format!(
            "{TEAMS}[[gpu]]\nindex = [0]\nmig = []\n[[gpu]]\nindex = [0]\nowner = \"a\"\n"
        ));
        assert!(p.is_none());
        assert_any(
            &d,
            &[
                "policy.toml:10:9: error: gpu[1]: gpu 0 assigned twice",
                "7:9 (gpu[0])",
            ],
        );
    }

    #[test]
    fn host_check_misfit_names_gpu_and_model() {
        // Policies built in code (the planner's property tests do) skip the static checks, so
        // the host check must catch a misfit on its own.
        let p = Policy {
            host: HostSettings::default(),
            teams: BTreeMap::new(),
            gpus: vec![GpuAssignment {
                selector: Selector::Index(vec![0, 1]),
                usage: GpuUse::Mig(vec![MigSpec {
                    profile: "3g.40gb".into(),
                    owner: "a".parse().unwrap(),
                    count: 3,
                    compute: vec![],
                }]),
                loc: None,
                key: "gpu[0]".into(),
                layouts: None,
            }],
            sources: vec![],
            slurm: Default::default(),
            layouts_in_force: Default::default(),
        };
        let obs = host(vec![gpu(0, "H100-SXM5-80GB"), gpu(1, "H100-SXM5-80GB")]);
        let d = on_host(&p, &obs);
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_any(
            &d[0..1],
            &["gpus 0,1 (H100 80GB HBM3): 3g.40gb x3 needs 12 of 8 memory slices"],
        );
    }
}
