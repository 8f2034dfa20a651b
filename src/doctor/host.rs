//! Host checks that need no NVML: cgroup v2 and its controllers, systemd and whether its
//! device control (`DevicePolicy=`/`DeviceAllow=`) can work, the nvidia character-device majors,
//! device and capability nodes, `mig-minors`, the MPS binaries, `/proc`'s `hidepid=`. Every
//! path is read under the injectable root, so tests fake `/proc`, `/sys/fs/cgroup`, `/dev`,
//! `/run` and `/usr`.

use super::{Check, Status};
use crate::paths::{Root, MIG_MINORS};
use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// Controllers gpuctl's slices set limits with: without them the limits are not enforced.
const REQUIRED_CONTROLLERS: &[&str] = &["cpu", "memory", "pids"];
/// Controllers for optional settings (`io-weight`, `cpus`).
const OPTIONAL_CONTROLLERS: &[&str] = &["io", "cpuset"];
/// systemd enforces `DeviceAllow=` on the unified hierarchy with a BPF device program since
/// v238; doctor asks for v243 or later (the first release whose BPF device code the project
/// treats as settled) and warns in between.
const SYSTEMD_BPF_DEVICES: u32 = 238;
const SYSTEMD_SETTLED: u32 = 243;
/// Where distributions put `libsystemd-shared-<version>.so`, whose name carries the version.
const SYSTEMD_LIB_DIRS: &[&str] = &[
    "/usr/lib/systemd",
    "/usr/lib64/systemd",
    "/lib/systemd",
    "/usr/lib/x86_64-linux-gnu/systemd",
    "/usr/lib/aarch64-linux-gnu/systemd",
];

pub(super) fn check(id: impl Into<String>, status: Status, summary: impl Into<String>) -> Check {
    Check {
        id: id.into(),
        status,
        summary: summary.into(),
    }
}

/// `cgroup`: the unified hierarchy and the controllers it offers.
pub fn cgroup(root: &Root) -> (Check, bool) {
    let path = root.join("/sys/fs/cgroup/cgroup.controllers");
    let Ok(text) = std::fs::read_to_string(&path) else {
        let hybrid = root
            .join("/sys/fs/cgroup/unified/cgroup.controllers")
            .exists();
        let why = if hybrid {
            "hybrid hierarchy (cgroup v2 only at /sys/fs/cgroup/unified): gpuctl needs the \
             unified hierarchy (boot with systemd.unified_cgroup_hierarchy=1)"
        } else {
            "no cgroup v2 at /sys/fs/cgroup (no cgroup.controllers): gpuctl needs the unified \
             hierarchy"
        };
        return (check("cgroup", Status::Fail, why), false);
    };
    let have: Vec<&str> = text.split_whitespace().collect();
    let absent = |wanted: &[&'static str]| -> Vec<&str> {
        wanted
            .iter()
            .copied()
            .filter(|c| !have.contains(c))
            .collect()
    };
    let (missing, optional) = (absent(REQUIRED_CONTROLLERS), absent(OPTIONAL_CONTROLLERS));
    let list = have.join(" ");
    let (status, tail) = if !missing.is_empty() {
        let why = "team limits would not be enforced";
        (
            Status::Fail,
            format!(": missing {}: {why}", missing.join(", ")),
        )
    } else if !optional.is_empty() {
        let why = "(io-weight / cpus settings have no effect)";
        (
            Status::Warn,
            format!(": missing {} {why}", optional.join(", ")),
        )
    } else {
        (Status::Ok, String::new())
    };
    let summary = format!("cgroup v2, controllers [{list}]{tail}");
    (check("cgroup", status, summary), true)
}

/// The systemd version from the name of `libsystemd-shared-<N>[.x].so` under the root.
pub fn systemd_version(root: &Root) -> Option<u32> {
    SYSTEMD_LIB_DIRS
        .iter()
        .filter_map(|d| std::fs::read_dir(root.join(d)).ok())
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix("libsystemd-shared-")?;
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .max()
}

/// `systemd`: running as init (`/run/systemd/system`, as `sd_booted()` tests) and its version.
pub fn systemd(root: &Root) -> (Check, Option<u32>) {
    let booted = root.join("/run/systemd/system").is_dir();
    let version = systemd_version(root);
    let (status, summary) = match (booted, version) {
        (false, _) => (
            Status::Fail,
            "/run/systemd/system absent: systemd is not the init system; gpuctl needs it".into(),
        ),
        (true, None) => (
            Status::Warn,
            format!(
                "running, version unknown (no libsystemd-shared-N.so in {})",
                SYSTEMD_LIB_DIRS.join(", ")
            ),
        ),
        (true, Some(v)) => (Status::Ok, format!("running, version {v}")),
    };
    (check("systemd", status, summary), version)
}

/// `device-control`: whether `DevicePolicy=closed` + `DeviceAllow=` can be enforced. On cgroup
/// v2 systemd does it with a BPF program of type `BPF_PROG_TYPE_CGROUP_DEVICE` per unit, which
/// needs the unified hierarchy, systemd ≥ 238 and a kernel built with `CONFIG_CGROUP_BPF`. This
/// reads those three facts; it does not start a unit to try (doctor changes nothing).
pub fn device_control(root: &Root, cgroup2: bool, systemd: Option<u32>) -> Check {
    let id = "device-control";
    if !cgroup2 {
        return check(
            id,
            Status::Fail,
            "no cgroup v2: systemd cannot restrict devices per slice",
        );
    }
    if let Some(v) = systemd.filter(|v| *v < SYSTEMD_BPF_DEVICES) {
        return check(
            id,
            Status::Fail,
            format!("systemd {v} < {SYSTEMD_BPF_DEVICES}: no BPF device control on cgroup v2"),
        );
    }
    let release = std::fs::read_to_string(root.join("/proc/sys/kernel/osrelease"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let config_path = root.join(format!("/boot/config-{release}"));
    let config = (!release.is_empty())
        .then(|| std::fs::read_to_string(&config_path).ok())
        .flatten();
    let bpf = config.map(|c| c.lines().any(|l| l.trim() == "CONFIG_CGROUP_BPF=y"));
    let sd = systemd.map_or("systemd version unknown".to_string(), |v| {
        format!("systemd {v}")
    });
    let (status, summary) = match (bpf, systemd) {
        (Some(false), _) => (
            Status::Fail,
            format!(
                "kernel {release} built without CONFIG_CGROUP_BPF ({}): DeviceAllow= cannot be \
                 enforced",
                config_path.display()
            ),
        ),
        (None, _) => (
            Status::Warn,
            format!(
                "cgroup v2 and {sd}, but CONFIG_CGROUP_BPF unverified (no /boot/config-{release}); \
                 DeviceAllow= needs it"
            ),
        ),
        (Some(true), Some(v)) if v >= SYSTEMD_SETTLED => (
            Status::Ok,
            format!("cgroup v2, {sd} (BPF device control), kernel {release} CONFIG_CGROUP_BPF=y"),
        ),
        (Some(true), _) => (
            Status::Warn,
            format!(
                "cgroup v2 and CONFIG_CGROUP_BPF=y, but {sd} (doctor expects ≥ {SYSTEMD_SETTLED})"
            ),
        ),
    };
    check(id, status, summary)
}

/// Character-device majors by name, from the `Character devices:` section of `/proc/devices`.
pub fn char_majors(root: &Root) -> Option<BTreeMap<String, u32>> {
    let text = std::fs::read_to_string(root.join("/proc/devices")).ok()?;
    let mut out = BTreeMap::new();
    let mut in_char = false;
    for line in text.lines() {
        let l = line.trim();
        if l.ends_with(':') {
            in_char = l == "Character devices:";
            continue;
        }
        if !in_char {
            continue;
        }
        if let Some((n, name)) = l.split_once(char::is_whitespace) {
            if let Ok(n) = n.parse() {
                out.insert(name.trim().to_string(), n);
            }
        }
    }
    Some(out)
}

/// The nvidia majors that matter: the GPU driver (`nvidia-frontend` or `nvidia`), `nvidia-uvm`,
/// `nvidia-caps`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Majors {
    /// `/dev/nvidiaN` and `/dev/nvidiactl`.
    pub nvidia: Option<u32>,
    /// `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`.
    pub uvm: Option<u32>,
    /// `/dev/nvidia-caps/nvidia-capN`.
    pub caps: Option<u32>,
}

/// `majors.*`: one check per major.
pub fn majors(root: &Root, mig_on: bool, out: &mut Vec<Check>) -> Majors {
    let Some(m) = char_majors(root) else {
        out.push(check(
            "majors",
            Status::Fail,
            "/proc/devices unreadable: cannot tell whether the nvidia driver is loaded",
        ));
        return Majors::default();
    };
    let nvidia = m
        .get("nvidia-frontend")
        .or_else(|| m.get("nvidia"))
        .copied();
    let uvm = m.get("nvidia-uvm").copied();
    let caps = m.get("nvidia-caps").copied();
    let table = [
        (
            "nvidia",
            nvidia,
            Status::Fail,
            "no nvidia (nvidia-frontend) character device in /proc/devices: the kernel module \
             is not loaded",
        ),
        (
            "nvidia-uvm",
            uvm,
            Status::Warn,
            "nvidia-uvm not loaded (CUDA needs it; `nvidia-modprobe -u -c=0` loads it)",
        ),
        (
            "nvidia-caps",
            caps,
            if mig_on { Status::Fail } else { Status::Warn },
            "no nvidia-caps character device: MIG devices cannot be opened",
        ),
    ];
    for (name, major, absent, why) in table {
        let id = format!("majors.{name}");
        out.push(match major {
            Some(n) => check(&id, Status::Ok, format!("{name} major {n}")),
            None => check(&id, absent, why),
        });
    }
    Majors { nvidia, uvm, caps }
}

/// What one node is: absent, not a char device, or (major, minor).
fn node(path: &Path) -> Result<(u32, u32), &'static str> {
    let md = std::fs::metadata(path).map_err(|_| "absent")?;
    if !md.file_type().is_char_device() {
        return Err("not a character device");
    }
    use nix::sys::stat::{major, minor};
    Ok((major(md.rdev()) as u32, minor(md.rdev()) as u32))
}

/// Check one device node: it exists, is a character device of `major` and (when given) has
/// `minor`.
fn node_check(
    root: &Root,
    host_path: &str,
    major: Option<u32>,
    minor: Option<u32>,
    absent: Status,
) -> Check {
    let id = format!("node.{}", host_path.trim_start_matches("/dev/"));
    match node(&root.join(host_path)) {
        Err("absent") => check(&id, absent, format!("{host_path} absent")),
        Err(why) => check(&id, Status::Warn, format!("{host_path}: {why}")),
        Ok((ma, mi)) => match (major.filter(|&m| m != ma), minor.filter(|&m| m != mi)) {
            (Some(m), _) => check(
                &id,
                Status::Fail,
                format!("{host_path} is {ma}:{mi}, but the driver's major is {m}"),
            ),
            (None, Some(m)) => check(
                &id,
                Status::Fail,
                format!("{host_path} is {ma}:{mi}, expected minor {m}"),
            ),
            (None, None) => check(&id, Status::Ok, format!("{host_path} {ma}:{mi}")),
        },
    }
}

/// `node.*`: the control nodes and `/dev/nvidiaN` of each GPU minor.
pub fn nodes(root: &Root, m: Majors, gpu_minors: &[u32], out: &mut Vec<Check>) {
    let gpus = gpu_minors
        .iter()
        .map(|n| (format!("/dev/nvidia{n}"), m.nvidia, Some(*n), Status::Fail));
    let ctl = ("/dev/nvidiactl".to_string(), m.nvidia, None, Status::Fail);
    let uvm = ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        .map(|p| (p.to_string(), m.uvm, None, Status::Warn));
    for (path, major, minor, absent) in std::iter::once(ctl).chain(gpus).chain(uvm) {
        out.push(node_check(root, &path, major, minor, absent));
    }
}

/// Parsed `mig-minors`: `gpu0/gi1/ci0/access` → minor (the parser the cap-node effector uses).
pub fn mig_minors(root: &Root) -> Option<BTreeMap<String, u32>> {
    let text = std::fs::read_to_string(root.join(MIG_MINORS)).ok()?;
    Some(crate::real::devnodes::parse_mig_minors(&text))
}

/// `mig-minors` and `cap-nodes`: the driver's capability table covers every live instance, and
/// the `/dev/nvidia-caps/nvidia-capN` nodes present are of the caps major with minor N.
/// `live` are the mig-minors keys of live instances (`gpu0/gi1/access`, `gpu0/gi1/ci0/access`).
pub fn caps(root: &Root, m: Majors, mig_on: bool, live: &[String], out: &mut Vec<Check>) {
    let Some(t) = mig_minors(root) else {
        out.push(check(
            "mig-minors",
            if mig_on { Status::Fail } else { Status::Warn },
            format!("{MIG_MINORS} absent: MIG capability minors unknown"),
        ));
        return;
    };
    let missing: Vec<&str> = live
        .iter()
        .filter(|k| !t.contains_key(*k))
        .map(String::as_str)
        .collect();
    out.push(if missing.is_empty() {
        check(
            "mig-minors",
            Status::Ok,
            format!(
                "{} entries, every live instance listed ({})",
                t.len(),
                live.len()
            ),
        )
    } else {
        check(
            "mig-minors",
            Status::Fail,
            format!(
                "{} entries, live instances missing: {}",
                t.len(),
                missing.join(", ")
            ),
        )
    });
    let dir = root.join("/dev/nvidia-caps");
    let mut bad = vec![];
    let mut count = 0;
    let mut present = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(n) = name
            .strip_prefix("nvidia-cap")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        count += 1;
        present.insert(n);
        match node(&e.path()) {
            Ok((ma, mi)) if m.caps.is_none_or(|c| c == ma) && mi == n => {}
            Ok((ma, mi)) => bad.push(format!("{name} is {ma}:{mi}")),
            Err(why) => bad.push(format!("{name}: {why}")),
        }
    }
    let live_minors: Vec<u32> = live.iter().filter_map(|k| t.get(k).copied()).collect();
    let without = live_minors.iter().filter(|n| !present.contains(n)).count();
    out.push(if bad.is_empty() {
        check(
            "cap-nodes",
            Status::Ok,
            format!(
                "/dev/nvidia-caps: {count} nodes, all of the caps major with the minor of \
                 their name; {without} of {} live instance nodes absent (gpuctl apply \
                 creates those of team instances)",
                live_minors.len()
            ),
        )
    } else {
        check(
            "cap-nodes",
            Status::Fail,
            format!("/dev/nvidia-caps: {}", bad.join("; ")),
        )
    });
}

/// `mps`: `nvidia-cuda-mps-control` at the policy's path, and `nvidia-cuda-mps-server` next to
/// it (the control daemon starts the server from its own directory or PATH).
pub fn mps(root: &Root, control: &Path) -> Check {
    let exec = |p: &Path| {
        std::fs::metadata(root.join(p))
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    let server = control.with_file_name("nvidia-cuda-mps-server");
    let (c, s) = (control.display(), server.display());
    let (status, summary) = match (exec(control), exec(&server)) {
        (true, true) => (Status::Ok, format!("{c} and {s}")),
        (true, false) => (Status::Warn, format!("{c} present, {s} absent")),
        _ => (
            Status::Warn,
            format!("{c} absent or not executable: teams with `mps` cannot start their daemon"),
        ),
    };
    check("mps", status, summary)
}

/// `kernel-module`: `/proc/driver/nvidia/version` against the library's driver version (a
/// mismatch is NVML's "Driver/library version mismatch").
pub fn kernel_module(root: &Root, library_driver: Option<&str>) -> Check {
    let path = "/proc/driver/nvidia/version";
    let Ok(text) = std::fs::read_to_string(root.join(path)) else {
        return check(
            "kernel-module",
            Status::Fail,
            format!("{path} absent: the nvidia kernel module is not loaded"),
        );
    };
    let first = text.lines().next().unwrap_or("");
    // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 …"
    let version = first
        .split_whitespace()
        .find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.'));
    let (status, summary) = match (version, library_driver) {
        (Some(k), Some(l)) if k != l => (
            Status::Fail,
            format!("kernel module {k}, library {l}: driver/library version mismatch"),
        ),
        (Some(k), _) => (Status::Ok, format!("nvidia kernel module {k}")),
        (None, _) => (Status::Warn, format!("{path}: no version in {first:?}")),
    };
    check("kernel-module", status, summary)
}

/// `proc-hidepid`: the `hidepid=` option of the `/proc` mount (proc(5)). Without it every
/// local user's `ps` shows every process's user, command line and cgroup (its team's slice and
/// job scope), whatever gpuctl keeps private; `hidepid=invisible` hides other users' processes
/// except from the `gid=` group. A caveat, not a failure: gpuctl works either way.
pub fn proc_hidepid(root: &Root) -> Check {
    let id = "proc-hidepid";
    let path = "/proc/self/mounts";
    let Ok(text) = std::fs::read_to_string(root.join(path)) else {
        return check(
            id,
            Status::Warn,
            format!("{path} unreadable: /proc's options unknown"),
        );
    };
    // The last /proc mount is the one on top.
    let Some(opts) = text
        .lines()
        .rev()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() >= 4 && f[1] == "/proc" && f[2] == "proc")
        .map(|f| f[3].to_string())
    else {
        return check(
            id,
            Status::Warn,
            format!("no proc mount on /proc in {path}"),
        );
    };
    let opt = |k: &str| {
        opts.split(',')
            .find_map(|o| o.strip_prefix(k)?.strip_prefix('='))
    };
    let gid = opt("gid")
        .map(|g| format!(", gid={g} sees them"))
        .unwrap_or_default();
    let shown = "every local user's ps lists every process with its user, command line and \
                 cgroup (team slice and job scope)";
    let (status, summary) = match opt("hidepid") {
        Some(v @ ("2" | "invisible" | "4" | "ptraceable")) => (
            Status::Ok,
            format!("/proc is mounted hidepid={v}: other users' processes are hidden{gid}"),
        ),
        Some(v @ ("1" | "noaccess")) => (
            Status::Warn,
            format!(
                "/proc is mounted hidepid={v}: other users' process directories are unreadable \
                 but still listed with their owner, so ps shows who runs something{gid}; \
                 hidepid=invisible hides them"
            ),
        ),
        v => (
            Status::Warn,
            format!(
                "/proc is mounted {}: {shown}; mount it with hidepid=invisible to keep jobs \
                 private (docs/monitoring.md, \"Who sees what\")",
                v.map_or("without hidepid=".to_string(), |v| format!("hidepid={v}"))
            ),
        ),
    };
    check(id, status, summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_hidepid_from_the_top_proc_mount() {
        let (_d, r) = root();
        let c = proc_hidepid(&r);
        assert_eq!(c.status, Status::Warn);
        assert!(c.summary.contains("unreadable"), "{}", c.summary);
        let mounts = |extra: &str| {
            format!(
                "sysfs /sys sysfs rw,nosuid 0 0\nproc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n{extra}"
            )
        };
        write(&r, "/proc/self/mounts", &mounts(""));
        let c = proc_hidepid(&r);
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.summary
                .starts_with("/proc is mounted without hidepid=: every local user's ps"),
            "{}",
            c.summary
        );
        write(
            &r,
            "/proc/self/mounts",
            &mounts("proc /proc proc rw,relatime,gid=27,hidepid=invisible 0 0\n"),
        );
        let c = proc_hidepid(&r);
        assert_eq!(c.status, Status::Ok);
        assert_eq!(
            c.summary,
            "/proc is mounted hidepid=invisible: other users' processes are hidden, gid=27 sees \
             them"
        );
        write(
            &r,
            "/proc/self/mounts",
            &mounts("proc /proc proc rw,hidepid=1 0 0\n"),
        );
        assert_eq!(proc_hidepid(&r).status, Status::Warn);
        write(
            &r,
            "/proc/self/mounts",
            &mounts("proc /proc proc rw,hidepid=2 0 0\n"),
        );
        assert_eq!(proc_hidepid(&r).status, Status::Ok);
        // A proc mounted elsewhere (a container's) says nothing of the host's /proc.
        write(
            &r,
            "/proc/self/mounts",
            "proc /proc proc rw 0 0\nproc /srv/c/proc proc rw,hidepid=2 0 0\n",
        );
        assert_eq!(proc_hidepid(&r).status, Status::Warn);
    }

    fn root() -> (tempfile::TempDir, Root) {
        let d = tempfile::tempdir().unwrap();
        let r = Root::new(d.path());
        (d, r)
    }

    fn write(r: &Root, p: &str, text: &str) {
        let p = r.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn cgroup_levels() {
        let (_d, r) = root();
        assert_eq!(cgroup(&r).0.status, Status::Fail);
        write(&r, "/sys/fs/cgroup/unified/cgroup.controllers", "memory");
        assert!(cgroup(&r).0.summary.contains("hybrid"));
        write(&r, "/sys/fs/cgroup/cgroup.controllers", "cpu io pids\n");
        let (c, v2) = cgroup(&r);
        assert!(
            v2 && c.status == Status::Fail && c.summary.contains("missing memory"),
            "{c:?}"
        );
        write(
            &r,
            "/sys/fs/cgroup/cgroup.controllers",
            "cpuset cpu io memory pids\n",
        );
        assert_eq!(cgroup(&r).0.status, Status::Ok);
    }

    #[test]
    fn systemd_version_from_the_shared_library_name() {
        let (_d, r) = root();
        assert_eq!(systemd(&r).0.status, Status::Fail);
        std::fs::create_dir_all(r.join("/run/systemd/system")).unwrap();
        assert_eq!(systemd(&r).0.status, Status::Warn);
        write(
            &r,
            "/usr/lib/x86_64-linux-gnu/systemd/libsystemd-shared-252.so",
            "",
        );
        write(&r, "/usr/lib/systemd/libsystemd-shared-255.5-1.fc40.so", "");
        assert_eq!(systemd(&r).1, Some(255));
        assert_eq!(device_control(&r, true, Some(230)).status, Status::Fail);
        let c = device_control(&r, true, Some(255));
        assert_eq!(c.status, Status::Warn, "no kernel config: {c:?}");
        write(&r, "/proc/sys/kernel/osrelease", "6.1.0-9-amd64\n");
        write(
            &r,
            "/boot/config-6.1.0-9-amd64",
            "# CONFIG_CGROUP_BPF is not set\n",
        );
        assert_eq!(device_control(&r, true, Some(255)).status, Status::Fail);
        write(&r, "/boot/config-6.1.0-9-amd64", "CONFIG_CGROUP_BPF=y\n");
        assert_eq!(device_control(&r, true, Some(255)).status, Status::Ok);
        assert_eq!(device_control(&r, true, Some(240)).status, Status::Warn);
    }

    #[test]
    fn majors_from_the_char_section_only() {
        let (_d, r) = root();
        write(
            &r,
            "/proc/devices",
            "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-uvm\n\nBlock devices:\n509 nvidia-caps\n",
        );
        let mut out = vec![];
        let m = majors(&r, true, &mut out);
        assert_eq!((m.nvidia, m.uvm, m.caps), (Some(195), Some(508), None));
        assert_eq!(out[2].status, Status::Fail, "{out:?}");
    }

    #[test]
    fn nodes_and_cap_nodes_are_checked_by_type_major_and_minor() {
        let (_d, r) = root();
        std::fs::create_dir_all(r.join("/dev/nvidia-caps")).unwrap();
        // /dev/null is 1:3 on Linux: stands in for a node of major 1.
        std::os::unix::fs::symlink("/dev/null", r.join("/dev/nvidia3")).unwrap();
        std::os::unix::fs::symlink("/dev/null", r.join("/dev/nvidia4")).unwrap();
        std::fs::write(r.join("/dev/nvidiactl"), "").unwrap();
        let m = Majors {
            nvidia: Some(1),
            uvm: None,
            caps: Some(1),
        };
        let mut out = vec![];
        nodes(&r, m, &[3, 4], &mut out);
        let st: Vec<_> = out.iter().map(|c| (c.id.as_str(), c.status)).collect();
        assert_eq!(
            st,
            [
                ("node.nvidiactl", Status::Warn),
                ("node.nvidia3", Status::Ok),
                ("node.nvidia4", Status::Fail),
                ("node.nvidia-uvm", Status::Warn),
                ("node.nvidia-uvm-tools", Status::Warn),
            ]
        );
        write(
            &r,
            MIG_MINORS,
            "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n",
        );
        std::os::unix::fs::symlink("/dev/null", r.join("/dev/nvidia-caps/nvidia-cap3")).unwrap();
        let mut out = vec![];
        let live = [
            "gpu0/gi1/access".to_string(),
            "gpu0/gi1/ci0/access".to_string(),
        ];
        caps(&r, m, true, &live, &mut out);
        assert_eq!(out[0].status, Status::Ok, "{out:?}");
        assert!(
            out[1].status == Status::Ok && out[1].summary.contains("2 of 2"),
            "{out:?}"
        );
        std::os::unix::fs::symlink("/dev/null", r.join("/dev/nvidia-caps/nvidia-cap12")).unwrap();
        let mut out = vec![];
        caps(
            &r,
            m,
            true,
            &[live[0].clone(), "gpu0/gi2/access".into()],
            &mut out,
        );
        assert_eq!(out[0].status, Status::Fail);
        assert!(out[0].summary.contains("gpu0/gi2/access"), "{out:?}");
        assert!(out[1].summary.contains("nvidia-cap12 is 1:3"), "{out:?}");
    }

    #[test]
    fn kernel_module_version_against_the_library() {
        let (_d, r) = root();
        assert_eq!(kernel_module(&r, None).status, Status::Fail);
        write(
            &r,
            "/proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n",
        );
        assert_eq!(kernel_module(&r, Some("550.54.15")).status, Status::Ok);
        let c = kernel_module(&r, Some("555.42.02"));
        assert!(
            c.status == Status::Fail && c.summary.contains("mismatch"),
            "{c:?}"
        );
    }
}
