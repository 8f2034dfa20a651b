//! Geometry that follows demand: which GPU switches to which of the layouts its policy entry
//! allows, from one snapshot (docs/policy.md, "Layouts a GPU may take").
//!
//! [`choose`] is pure, like `plan` and `lending`: the caller gathers a [`Snapshot`] (each GPU's
//! allowed layouts, the devices it has now with whether each is busy or since when it is idle,
//! the time of its last switch; the waiting requests; the local time) and carries out the
//! [`Switch`]es as a normal reconcile towards the chosen layout.
//!
//! The rules:
//! - a GPU switches only to a layout its entry allows, and never within `hold` of its last
//!   switch (no flapping);
//! - every device a switch destroys or hands to another team has had no lease and no process for
//!   `after`; a busy device (or one idle for less) is kept where it is, and a layout that cannot
//!   keep it is not a target now;
//! - a switch serves demand: the first waiting request (in ticket order) that no free device of
//!   any GPU serves, by a device the switch creates; else, with nothing waiting that the GPU's
//!   current layout serves, the calendar: the first layout whose `when` window is open, or the
//!   default outside every window;
//! - of the targets that serve, the one that changes the fewest devices (destroyed + created)
//!   wins, then the lower GPU index, then the earlier layout: kept instances stay at their
//!   placements and the rest is placed around them by the exact search (`geometry::fit`), as the
//!   planner does.
//!
//! An instance is kept only where the target has one of the same profile, owner and compute
//! split; a relabel or a new split counts as a destroy and a create (the planner may do it with
//! less, never with more).

use crate::geometry;
use crate::lending::{window_open, LocalTime};
use crate::policy::{GpuUse, Layout, TeamName};
use crate::profiles::{GpuModel, Placement};
use std::collections::BTreeSet;
use std::time::Duration;

/// Most MIG instances a GPU's current layout may list for the kept-subset search (2^n subsets);
/// the largest real geometry has 7.
pub const MAX_INSTANCES: usize = 12;

/// A device of a layout: a whole GPU (MIG off) for its teams, or one MIG GPU instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unit {
    /// The whole GPU, MIG off, for these teams (one owner, or a `shared` list).
    Whole {
        /// Who may use it.
        teams: Vec<TeamName>,
    },
    /// A GPU instance.
    Mig {
        /// GI profile (`3g.40gb`).
        profile: String,
        /// The team it belongs to.
        owner: TeamName,
        /// Compute split, as in the policy (empty: one full-size compute instance).
        compute: Vec<String>,
        /// Where it is (or, for one a switch creates, will be).
        placement: Placement,
    },
}

impl Unit {
    /// Whether a job of `w` may run on this device.
    pub fn serves(&self, w: &Waiter) -> bool {
        match self {
            Unit::Whole { teams } => w.profile.is_none() && teams.contains(&w.team),
            Unit::Mig { profile, owner, .. } => {
                *owner == w.team && w.profile.as_ref().is_none_or(|p| p == profile)
            }
        }
    }

    fn name(&self) -> String {
        match self {
            Unit::Whole { teams } => format!(
                "whole GPU for {}",
                teams.iter().map(|t| &**t).collect::<Vec<_>>().join(", ")
            ),
            Unit::Mig {
                profile, placement, ..
            } => format!("{profile}@{}+{}", placement.start, placement.size),
        }
    }
}

/// A device the GPU has now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The device.
    pub unit: Unit,
    /// When it last had a lease or a process (ms since the epoch); `None`: busy now.
    pub idle_since_ms: Option<u64>,
}

/// One GPU as the choice sees it.
#[derive(Debug, Clone)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// Its model, for the placement search.
    pub model: &'static GpuModel,
    /// The layouts its entry allows, the default first (`policy::Layouts::all`).
    pub allowed: Vec<Layout>,
    /// Its devices now: one `Whole`, or its MIG instances (none: MIG on, no instances).
    pub now: Vec<Held>,
    /// When it last switched layout (ms since the epoch); `None`: not since gpuctld started.
    pub last_switch_ms: Option<u64>,
    /// `reslice.after`.
    pub after: Duration,
    /// `reslice.hold`.
    pub hold: Duration,
}

/// A `--wait` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    /// Arrival order.
    pub ticket: u64,
    /// Whose request it is.
    pub team: TeamName,
    /// The MIG profile it asks for (`--profile 3g.40gb`), if any.
    pub profile: Option<String>,
}

/// Everything [`choose`] reads.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The GPUs whose entries allow more than one layout.
    pub gpus: Vec<Gpu>,
    /// The `--wait` queue, every team.
    pub waiting: Vec<Waiter>,
    /// Now, ms since the epoch.
    pub now_ms: u64,
    /// Now, local time, for the `when` windows.
    pub local: LocalTime,
}

/// Why a GPU switches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// For this waiting request, which no free device serves.
    Waiting(Waiter),
    /// The calendar prefers the target now (its window, or the default outside every window).
    Calendar,
}

/// One GPU to re-slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// The allowed layout the GPU has now, if it has one of them exactly.
    pub from: Option<String>,
    /// The target layout's name.
    pub to: String,
    /// Devices that stay as they are.
    pub keep: Vec<Unit>,
    /// Devices the switch destroys (each idle for `after`).
    pub destroy: Vec<Unit>,
    /// Devices it creates, at their placements.
    pub create: Vec<Unit>,
    /// Why now.
    pub cause: Cause,
    /// In words, for the journal, `gpuctl plan` and the request's waiting reason.
    pub reason: String,
}

impl Switch {
    /// Devices that change: destroyed plus created.
    pub fn changes(&self) -> usize {
        self.destroy.len() + self.create.len()
    }
}

/// The switches to make now: at most one per GPU.
pub fn choose(s: &Snapshot) -> Vec<Switch> {
    let mut out: Vec<Switch> = Vec::new();
    let mut busy_gpus: BTreeSet<u32> = BTreeSet::new();
    // Free devices now (gpu, index into `now`) and created ones, each serving one request.
    let mut free: Vec<(u32, &Unit)> = s
        .gpus
        .iter()
        .flat_map(|g| {
            g.now
                .iter()
                .filter(|h| h.idle_since_ms.is_some())
                .map(move |h| (g.index, &h.unit))
        })
        .collect();
    let mut spare: Vec<Unit> = Vec::new();
    let mut waiting: Vec<&Waiter> = s.waiting.iter().collect();
    waiting.sort_by_key(|w| w.ticket);
    for w in waiting {
        if let Some(i) = free.iter().position(|(_, u)| u.serves(w)) {
            free.remove(i);
            continue;
        }
        if let Some(i) = spare.iter().position(|u| u.serves(w)) {
            spare.remove(i);
            continue;
        }
        let best = s
            .gpus
            .iter()
            .filter(|g| !busy_gpus.contains(&g.index) && !holding(g, s.now_ms))
            .flat_map(|g| {
                g.allowed
                    .iter()
                    .filter_map(move |l| Some((g, l, diff(g, l, s.now_ms)?)))
            })
            .filter(|(_, _, d)| d.changes() > 0 && d.create.iter().any(|u| u.serves(w)))
            .min_by_key(|(g, _, d)| (d.changes(), g.index));
        let Some((g, l, d)) = best else { continue };
        let mut created = d.create.clone();
        let used = created.iter().position(|u| u.serves(w)).unwrap_or(0);
        created.remove(used);
        spare.extend(created);
        free.retain(|(gi, _)| *gi != g.index);
        busy_gpus.insert(g.index);
        let what = w.profile.as_deref().unwrap_or("job");
        let reason = format!(
            "GPU {} re-sliced to {} ({}) for {}'s waiting {what} request{}",
            g.index,
            l.name,
            summary(&l.usage),
            w.team,
            effort(&d)
        );
        out.push(d.into_switch(g, l, Cause::Waiting(w.clone()), reason));
    }
    for g in &s.gpus {
        if busy_gpus.contains(&g.index) || holding(g, s.now_ms) {
            continue;
        }
        let Some(l) = preferred(g, s.local) else {
            continue;
        };
        // A request waiting for a device of the current layout keeps it.
        if s.waiting
            .iter()
            .any(|w| g.now.iter().any(|h| h.unit.serves(w)))
        {
            continue;
        }
        let Some(d) = diff(g, l, s.now_ms).filter(|d| d.changes() > 0) else {
            continue;
        };
        let why = match l.when.as_slice() {
            [] => "no window of another layout is open".to_string(),
            ws => format!(
                "its window {} is open",
                ws.iter()
                    .find(|w| window_open(std::slice::from_ref(w), s.local))
                    .map_or(String::new(), |w| w.text.clone())
            ),
        };
        let reason = format!(
            "GPU {} re-sliced to {} ({}): the calendar prefers it ({why}) and nothing waits for \
             the current layout{}",
            g.index,
            l.name,
            summary(&l.usage),
            effort(&d)
        );
        out.push(d.into_switch(g, l, Cause::Calendar, reason));
    }
    out
}

/// The layout the calendar prefers at `t`: the first non-default one whose window is open, else
/// the default.
pub fn preferred(g: &Gpu, t: LocalTime) -> Option<&Layout> {
    g.allowed
        .iter()
        .skip(1)
        .find(|l| !l.when.is_empty() && window_open(&l.when, t))
        .or_else(|| g.allowed.first())
}

/// Whether `g` switched less than `hold` ago.
fn holding(g: &Gpu, now_ms: u64) -> bool {
    g.last_switch_ms
        .is_some_and(|t| now_ms.saturating_sub(t) < g.hold.as_millis() as u64)
}

/// `3g.40gb x2`, `whole GPU for train`, `MIG on, no instances`.
pub fn summary(u: &GpuUse) -> String {
    match u {
        GpuUse::Owned(t) => format!("whole GPU for {t}"),
        GpuUse::Shared(ts) => format!(
            "whole GPU shared by {}",
            ts.iter().map(|t| &**t).collect::<Vec<_>>().join(", ")
        ),
        GpuUse::Mig(m) if m.is_empty() => "MIG on, no instances".into(),
        GpuUse::Mig(m) => geometry::summarize(
            m.iter()
                .flat_map(|x| std::iter::repeat_n(x.profile.as_str(), x.count as usize)),
        ),
    }
}

fn effort(d: &Diff) -> String {
    format!(
        ": keeps {}, destroys {}, creates {}",
        d.keep.len(),
        d.destroy.len(),
        d.create.len()
    )
}

/// What moving `g` to one layout takes now.
#[derive(Debug, Clone)]
struct Diff {
    from: Option<String>,
    keep: Vec<Unit>,
    destroy: Vec<Unit>,
    create: Vec<Unit>,
}

impl Diff {
    fn changes(&self) -> usize {
        self.destroy.len() + self.create.len()
    }

    fn into_switch(self, g: &Gpu, l: &Layout, cause: Cause, reason: String) -> Switch {
        Switch {
            gpu: g.index,
            from: self.from,
            to: l.name.clone(),
            keep: self.keep,
            destroy: self.destroy,
            create: self.create,
            cause,
            reason,
        }
    }
}

/// A device a switch may not touch: busy, or idle for less than `after`.
fn pinned(h: &Held, after: Duration, now_ms: u64) -> bool {
    h.idle_since_ms
        .is_none_or(|t| now_ms.saturating_sub(t) < after.as_millis() as u64)
}

/// The fewest-change way to `l` that leaves every pinned device as it is, or `None` when the
/// pinned devices are in the way.
fn diff(g: &Gpu, l: &Layout, now_ms: u64) -> Option<Diff> {
    let from = g
        .allowed
        .iter()
        .find(|a| fewest(g, a, |_| false).is_some_and(|d| d.changes() == 0))
        .map(|a| a.name.clone());
    let mut d = fewest(g, l, |h| pinned(h, g.after, now_ms))?;
    d.from = from;
    Some(d)
}

fn fewest(g: &Gpu, l: &Layout, pin: impl Fn(&Held) -> bool) -> Option<Diff> {
    let whole = |teams: Vec<TeamName>| -> Option<Diff> {
        let want = Unit::Whole { teams };
        let (keep, destroy): (Vec<&Held>, Vec<&Held>) = g.now.iter().partition(|h| h.unit == want);
        if destroy.iter().any(|h| pin(h)) {
            return None;
        }
        Some(Diff {
            from: None,
            create: if keep.is_empty() { vec![want] } else { vec![] },
            keep: keep.into_iter().map(|h| h.unit.clone()).collect(),
            destroy: destroy.into_iter().map(|h| h.unit.clone()).collect(),
        })
    };
    let specs = match &l.usage {
        GpuUse::Owned(t) => return whole(vec![t.clone()]),
        GpuUse::Shared(ts) => return whole(ts.clone()),
        GpuUse::Mig(specs) => specs,
    };
    let wanted: Vec<(&str, &TeamName, &[String])> = specs
        .iter()
        .flat_map(|m| {
            std::iter::repeat_n(
                (m.profile.as_str(), &m.owner, m.compute.as_slice()),
                m.count as usize,
            )
        })
        .collect();
    let n = g.now.len();
    if n > MAX_INSTANCES {
        return None;
    }
    let must: u32 = (0..n)
        .filter(|&i| pin(&g.now[i]))
        .fold(0, |m, i| m | 1 << i);
    let mut masks: Vec<u32> = (0..1u32 << n).filter(|m| m & must == must).collect();
    masks.sort_by_key(|m| (std::cmp::Reverse(m.count_ones()), *m));
    for mask in masks {
        // Match each kept instance to one wanted of the same profile, owner and split.
        let mut rest = wanted.clone();
        let mut fixed = Vec::new();
        let mut ok = true;
        for (_, h) in g.now.iter().enumerate().filter(|(i, _)| mask & 1 << i != 0) {
            let Unit::Mig {
                profile,
                owner,
                compute,
                placement,
            } = &h.unit
            else {
                ok = false;
                break;
            };
            let (Some(at), Some(gp)) = (
                rest.iter()
                    .position(|(p, o, c)| p == profile && *o == owner && *c == compute.as_slice()),
                g.model.gi_profile(profile),
            ) else {
                ok = false;
                break;
            };
            rest.remove(at);
            fixed.push((gp.id, *placement));
        }
        if !ok {
            continue;
        }
        // A profile this model lacks: the layout cannot be taken here at all.
        let profiles = rest
            .iter()
            .map(|(p, _, _)| g.model.gi_profile(p))
            .collect::<Option<Vec<_>>>()?;
        let Ok(at) = geometry::fit(g.model, &profiles, &fixed) else {
            continue;
        };
        let (keep, destroy): (Vec<_>, Vec<_>) = g
            .now
            .iter()
            .enumerate()
            .partition(|(i, _)| mask & 1 << i != 0);
        return Some(Diff {
            from: None,
            keep: keep.into_iter().map(|(_, h)| h.unit.clone()).collect(),
            destroy: destroy.into_iter().map(|(_, h)| h.unit.clone()).collect(),
            create: rest
                .iter()
                .zip(at)
                .map(|((p, o, c), placement)| Unit::Mig {
                    profile: p.to_string(),
                    owner: (*o).clone(),
                    compute: c.to_vec(),
                    placement,
                })
                .collect(),
        });
    }
    None
}

impl std::fmt::Display for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)?;
        if !self.destroy.is_empty() {
            let d: Vec<String> = self.destroy.iter().map(Unit::name).collect();
            write!(f, " (destroys {})", d.join(", "))?;
        }
        Ok(())
    }
}

pub mod state;

#[cfg(test)]
mod tests;
