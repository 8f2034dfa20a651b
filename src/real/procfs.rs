//! What gpuctl reads from `/proc` and `/sys` about the host: a PID's cgroup and unit, memory
//! and online CPUs, the registered device majors.

use crate::observe::{HostInfo, Major};
use crate::paths::Root;

/// The cgroup v2 path and unit of a PID, from `/proc/<pid>/cgroup` under `root`, read by the one
/// parser of that file ([`crate::join::cgroup::parse_proc_cgroup`]), and its unit
/// ([`crate::names::innermost_unit`]).
pub fn pid_cgroup(root: &Root, pid: u32) -> (Option<String>, Option<String>) {
    let Some(cg) = crate::join::cgroup::read_proc_cgroup(root, pid) else {
        return (None, None);
    };
    let unit = crate::names::innermost_unit(&cg).map(str::to_string);
    (Some(cg), unit)
}

/// Memory (`/proc/meminfo`) and online CPUs (`/sys/devices/system/cpu/online`, else what the
/// process may use).
pub fn host_info(root: &Root) -> HostInfo {
    let memory_bytes = std::fs::read_to_string(root.join("/proc/meminfo"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0);
    let cpus = std::fs::read_to_string(root.join("/sys/devices/system/cpu/online"))
        .ok()
        .and_then(|t| crate::policy::parse::parse_cpus(t.trim()).ok())
        .map(|list| count_cpus(&list))
        .filter(|n| *n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1)
        });
    HostInfo { memory_bytes, cpus }
}

/// The registered device majors, from `/proc/devices` under `root`; `None` when it cannot be
/// read.
pub fn majors(root: &Root) -> Option<Vec<Major>> {
    std::fs::read_to_string(root.join("/proc/devices"))
        .ok()
        .map(|t| parse_devices(&t))
}

/// `/proc/devices`: a `Character devices:` and a `Block devices:` section of `<major> <name>`
/// lines. A line that does not parse is skipped: a name it hid stays out of the fence's
/// allow-list, so its devices are denied outside the shares rather than NVIDIA's allowed.
pub fn parse_devices(text: &str) -> Vec<Major> {
    let mut block = None;
    let mut out = Vec::new();
    for line in text.lines() {
        match line.trim() {
            "Character devices:" => block = Some(false),
            "Block devices:" => block = Some(true),
            l => {
                let (Some(b), Some((n, name))) = (block, l.split_once(char::is_whitespace)) else {
                    continue;
                };
                if let Ok(number) = n.parse() {
                    let name = name.trim().to_string();
                    out.push(Major {
                        block: b,
                        number,
                        name,
                    });
                }
            }
        }
    }
    out
}

fn count_cpus(list: &str) -> u32 {
    list.split(',')
        .filter_map(|r| match r.split_once('-') {
            Some((a, b)) => Some(b.parse::<u32>().ok()? + 1 - a.parse::<u32>().ok()?),
            None => r.parse::<u32>().ok().map(|_| 1),
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn cgroup_and_unit_of_a_pid() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let p = root.join("/proc/42/cgroup");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "0::/gpu.slice/gpu-prod.slice/train.service/payload\n").unwrap();
        assert_eq!(
            pid_cgroup(&root, 42),
            (
                Some("/gpu.slice/gpu-prod.slice/train.service/payload".into()),
                Some("train.service".into())
            )
        );
        std::fs::write(&p, "0::/user.slice/user-1000.slice/session-3.scope\n").unwrap();
        assert_eq!(pid_cgroup(&root, 42).1.as_deref(), Some("session-3.scope"));
        assert_eq!(pid_cgroup(&root, 43), (None, None));
    }

    #[test]
    fn devices_sections_and_odd_lines() {
        let m = parse_devices(
            "Character devices:\n  1 mem\n195 nvidia\nbogus\n\nBlock devices:\n  8 sd\n253 device-mapper\n",
        );
        let got: Vec<(bool, u32, &str)> = m
            .iter()
            .map(|m| (m.block, m.number, m.name.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (false, 1, "mem"),
                (false, 195, "nvidia"),
                (true, 8, "sd"),
                (true, 253, "device-mapper")
            ]
        );
        // Lines before a section header name nothing.
        assert!(parse_devices("1 mem\n").is_empty());
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(majors(&Root::new(dir.path())), None);
    }

    /// `/proc/devices` of a host with the NVIDIA driver loaded (driver 550, Ubuntu 22.04, an
    /// 8-GPU HGX): 195 for the GPUs, nvidiactl and nvidia-modeset; the dynamic majors of
    /// nvidia-uvm, nvidia-caps and the IMEX channels; DRM 226 and misc 10 (FUSE, KVM).
    const HGX: &str = "Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
  4 ttyS
  5 /dev/tty
  5 /dev/console
  5 /dev/ptmx
  7 vcs
 10 misc
 13 input
 21 sg
 29 fb
116 alsa
128 ptm
136 pts
180 usb
189 usb_device
195 nvidia
195 nvidia-modeset
195 nvidiactl
226 drm
234 nvidia-nvswitch
235 nvidia-caps-imex-channels
236 nvidia-nvlink
237 nvidia-caps
238 nvidia-uvm
239 hidraw
240 aux
511 nvidia-frontend

Block devices:
  7 loop
  8 sd
  9 md
259 blkext
253 device-mapper
";

    /// The same kind of host before the driver is loaded (a boot where gpuctld starts first).
    const NO_DRIVER: &str = "Character devices:
  1 mem
  4 tty
  5 /dev/tty
  5 /dev/ptmx
 10 misc
 13 input
116 alsa
136 pts
226 drm

Block devices:
  8 sd
";

    fn sample(t: &str) -> Vec<Major> {
        parse_devices(t)
    }

    // The fence's allow-list from the samples (plan::fence), parsed here as gpuctld reads them.
    #[test]
    fn every_major_but_nvidias_is_allowed_by_name() {
        let allow = crate::plan::fence::allow_list(&sample(HGX));
        for name in [
            "mem", "tty", "pts", "ptm", "misc", "drm", "input", "alsa", "hidraw",
        ] {
            assert!(
                allow.contains(&format!("char-{name}")),
                "char-{name}: {allow:?}"
            );
        }
        for name in ["sd", "loop", "device-mapper", "blkext"] {
            assert!(allow.contains(&format!("block-{name}")), "block-{name}");
        }
        assert!(allow.iter().all(|e| !e.contains("nvidia")), "{allow:?}");
        // 195 is registered under three names, all NVIDIA's: no entry names that major.
        let m = sample(HGX);
        let allowed_numbers: BTreeSet<u32> = m
            .iter()
            .filter(|m| !m.block && allow.contains(&format!("char-{}", m.name)))
            .map(|m| m.number)
            .collect();
        for n in [195, 234, 235, 236, 237, 238, 511] {
            assert!(!allowed_numbers.contains(&n), "major {n} allowed");
        }
        assert!(allowed_numbers.contains(&226) && allowed_numbers.contains(&10));
        // Paths registered as names (`/dev/vc/0`) are passed on: systemd takes char-<anything
        // without a glob>, and the major stays usable.
        assert!(allow.contains("char-/dev/tty"));
    }

    #[test]
    fn a_host_without_the_driver_gets_the_same_fence_minus_nothing_nvidia() {
        let allow = crate::plan::fence::allow_list(&sample(NO_DRIVER));
        assert!(allow.contains("char-drm") && allow.contains("block-sd"));
        assert_eq!(allow.len(), 10, "{allow:?}");
        // Loading the driver adds NVIDIA's majors and nothing to the list; a module that
        // registers a new major adds its name, so the fence is planned again.
        let mut loaded = sample(NO_DRIVER);
        loaded.extend(sample("Character devices:\n195 nvidia\n238 nvidia-uvm\n"));
        assert_eq!(crate::plan::fence::allow_list(&loaded), allow);
        loaded.push(Major {
            block: false,
            number: 241,
            name: "gpuctl_test".into(),
        });
        assert!(crate::plan::fence::allow_list(&loaded).contains("char-gpuctl_test"));
    }

    #[test]
    fn cpus_count() {
        assert_eq!(count_cpus("0-3,8,10-11"), 7);
    }
}
