//! Where a process was before `Join` moved it, so a failed after-check can put it back.
//!
//! The pid of a joining process is checked, moved by systemd (`StartTransientUnit` with `PIDs`),
//! then checked again. A held pidfd tells whether the checked process is still alive, but does
//! not stop its pid *number* being reused once it has exited: if the after-check fails, the
//! process now in the new scope may be someone else's. Nothing is killed (never kill a job);
//! instead the process at that pid is attached back to the unit and cgroup recorded before the
//! move (`AttachProcessesToUnit`, systemd ≥ 238), so it leaves the team's slice and its devices.
//!
//! The parsing here is pure; the bus calls are in `dbus_api::join`.

use crate::paths::Root;

/// The cgroup v2 path of a process from `/proc/<pid>/cgroup` text (`0::/user.slice/…`).
pub fn parse_proc_cgroup(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end().to_string())
        .filter(|p| p.starts_with('/'))
}

/// The cgroup of `pid` under `root`, `None` when it cannot be read (the process is gone).
pub fn read_proc_cgroup(root: &Root, pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(root.join(format!("/proc/{pid}/cgroup"))).ok()?;
    parse_proc_cgroup(&text)
}

/// `cgroup` relative to its unit's `unit_cgroup` (`""` for the unit's own cgroup), as
/// `AttachProcessesToUnit` takes it; `None` when `cgroup` is not inside the unit.
pub fn subcgroup(unit_cgroup: &str, cgroup: &str) -> Option<String> {
    let rest = cgroup.strip_prefix(unit_cgroup)?;
    (rest.is_empty() || rest.starts_with('/')).then(|| rest.to_string())
}

/// The D-Bus interface carrying `ControlGroup` for a unit, by its type suffix.
pub fn unit_interface(unit: &str) -> Option<&'static str> {
    let (_, kind) = unit.rsplit_once('.')?;
    Some(match kind {
        "scope" => "org.freedesktop.systemd1.Scope",
        "service" => "org.freedesktop.systemd1.Service",
        "slice" => "org.freedesktop.systemd1.Slice",
        "socket" => "org.freedesktop.systemd1.Socket",
        "mount" => "org.freedesktop.systemd1.Mount",
        "swap" => "org.freedesktop.systemd1.Swap",
        _ => return None,
    })
}

/// Where a process was before the move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The unit that held it (`session-3.scope`).
    pub unit: String,
    /// Its cgroup, relative to the unit's (`""` for the unit's own).
    pub subcgroup: String,
    /// Whether the unit was found through the pidfd (`GetUnitByPIDFD`, systemd ≥ 249), which
    /// cannot name another process than the one checked.
    pub by_pidfd: bool,
}

/// After a failed after-check, where the process now at the joined pid goes: back to `origin`
/// when it sits in the new `scope` (its cgroup `now` ends in `/<scope>`), nowhere otherwise.
/// `Err` says, for the journal, why nothing is moved.
pub fn put_back_target<'a>(
    pid: u32,
    now: Option<&str>,
    scope: &str,
    origin: Option<&'a Origin>,
) -> Result<&'a Origin, String> {
    let in_scope = now.is_some_and(|c| {
        c.strip_suffix(scope)
            .is_some_and(|head| head.ends_with('/'))
    });
    if !in_scope {
        return Err(format!(
            "pid {pid} is not in {scope} now; nothing to put back"
        ));
    }
    origin.ok_or_else(|| format!("pid {pid} stays in {scope}: where it was before is unknown"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raced_pid_goes_back_only_from_the_new_scope() {
        let scope = &super::super::scope_name("9f2c4e6a8b0d1357");
        let origin = Origin {
            unit: "session-3.scope".into(),
            subcgroup: String::new(),
            by_pidfd: true,
        };
        let in_scope = format!("/gpu.slice/gpu-infer.slice/{scope}");
        let back = |now: Option<&str>| put_back_target(4242, now, scope, Some(&origin));
        // The pid was reused and the newcomer landed in the scope: it goes back where the pid
        // was before the move.
        assert_eq!(back(Some(in_scope.as_str())), Ok(&origin));
        // Gone, or somewhere else (the newcomer was never moved): nothing to do.
        assert!(back(None)
            .unwrap_err()
            .contains("not in gpuctl-run-9f2c4e6a8b0d1357.scope now"));
        assert!(back(Some("/user.slice/user-1000.slice/session-3.scope")).is_err());
        // A scope whose name merely ends the same is not ours.
        assert!(back(Some(
            "/gpu.slice/gpu-infer.slice/x-gpuctl-run-9f2c4e6a8b0d1357.scope"
        ))
        .is_err());
        // In the scope but the origin is unknown: left there, and said so.
        assert!(put_back_target(4242, Some(&in_scope), scope, None)
            .unwrap_err()
            .contains("where it was before is unknown"));
    }

    #[test]
    fn proc_cgroup_lines() {
        assert_eq!(
            parse_proc_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n").as_deref(),
            Some("/user.slice/user-1000.slice/session-3.scope")
        );
        // A hybrid host lists v1 hierarchies first.
        assert_eq!(
            parse_proc_cgroup("12:pids:/x\n1:name=systemd:/x\n0::/system.slice/a.service\n")
                .as_deref(),
            Some("/system.slice/a.service")
        );
        assert_eq!(parse_proc_cgroup("1:name=systemd:/x\n"), None);
        assert_eq!(parse_proc_cgroup(""), None);
    }

    #[test]
    fn subcgroups_are_relative_to_the_unit() {
        let unit = "/system.slice/a.service";
        assert_eq!(subcgroup(unit, unit).as_deref(), Some(""));
        assert_eq!(
            subcgroup(unit, "/system.slice/a.service/payload").as_deref(),
            Some("/payload")
        );
        assert_eq!(subcgroup(unit, "/system.slice/a.serviceX"), None);
        assert_eq!(subcgroup(unit, "/user.slice"), None);
        assert_eq!(
            unit_interface("session-3.scope"),
            Some("org.freedesktop.systemd1.Scope")
        );
        assert_eq!(unit_interface("x.target"), None);
    }
}
