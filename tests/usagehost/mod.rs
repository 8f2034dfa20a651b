//! Usage fixtures over a [`crate::fakehost::FakeHost`]: H100s split into seven 1g.10gb MIG
//! devices owned by teams a..g, processes on them whose `/proc` entries (status, cgroup, comm)
//! are written under the fake root, and a fake NSS.
#![allow(dead_code)]

use crate::fakehost::{policy, FakeHost};
use gpuctl::daemon::reconcile::HostView;
use gpuctl::join::{Account, Directory};
use gpuctl::plan::desired;
use gpuctl::policy::Policy;
use gpuctl::usage::Owners;
use std::path::Path;

/// The seven teams.
pub const TEAMS: [&str; 7] = ["a", "b", "c", "d", "e", "f", "g"];

/// A policy with `gpus` H100s of seven 1g.10gb devices each, device k owned by team k.
pub fn seven_policy(dir: &Path, gpus: u32) -> Policy {
    let mut s = String::from("version = 1\n");
    for t in TEAMS {
        s += &format!("[teams.{t}]\nmembers = [\"@{t}\"]\n");
    }
    let devs: Vec<String> = TEAMS
        .iter()
        .map(|o| format!("{{ profile = \"1g.10gb\", owner = \"{o}\" }}"))
        .collect();
    for i in 0..gpus {
        s += &format!("[[gpu]]\nindex = [{i}]\nmig = [ {} ]\n", devs.join(", "));
    }
    policy(dir, "usage.toml", &s)
}

/// Apply `p` to the fake and return who owns which device afterwards.
pub fn apply_and_own(fake: &FakeHost, p: &Policy) -> Owners {
    let r = fake.apply(p);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let obs = fake.observe();
    let d = desired(p, &obs);
    Owners::from(&HostView {
        teams: d.teams,
        gpus: obs.gpus,
    })
}

/// Write `/proc/<pid>/{status,cgroup,comm}` under the fake root.
pub fn write_proc(root: &Path, pid: u32, uid: u32, cgroup: &str, ns_pid: Option<u32>) {
    let d = root.join(format!("proc/{pid}"));
    std::fs::create_dir_all(&d).unwrap();
    let nspid = match ns_pid {
        Some(n) => format!("{pid}\t{n}"),
        None => pid.to_string(),
    };
    std::fs::write(
        d.join("status"),
        format!("Name:\tjob\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t{nspid}\n"),
    )
    .unwrap();
    std::fs::write(d.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
    std::fs::write(d.join("comm"), "job\n").unwrap();
}

/// The cgroup of a job of `team` run as `unit`.
pub fn team_cgroup(team: &str, unit: &str) -> String {
    format!("/gpu.slice/gpu-{team}.slice/{unit}")
}

/// (gpu, gi, ci) of every MIG device of the fake, in GPU then GI order.
pub fn mig_devices(fake: &FakeHost) -> Vec<(u32, u32, u32)> {
    let st = fake.fake();
    let mut v = Vec::new();
    for (g, gpu) in st.gpus.iter().enumerate() {
        for gi in &gpu.gpu_instances {
            for ci in &gi.compute_instances {
                v.push((g as u32, gi.id, ci.id));
            }
        }
    }
    v.sort();
    v
}

/// Put `n` processes (pids from 10000) round-robin on the MIG devices, each in the slice of
/// the team that owns its device (the owners in `owners`), with `/proc` entries.
pub fn spread(fake: &FakeHost, owners: &Owners, n: u32) {
    let devs = mig_devices(fake);
    let obs = fake.observe();
    let uuid_of = |g: u32, gi: u32, ci: u32| -> String {
        let gpu = &obs.gpus[g as usize];
        let i = gpu
            .mig
            .as_ref()
            .unwrap()
            .instances
            .iter()
            .find(|i| i.id == gi)
            .unwrap();
        i.compute.iter().find(|c| c.id == ci).unwrap().uuid.clone()
    };
    let mut procs = Vec::new();
    for k in 0..n {
        let (g, gi, ci) = devs[k as usize % devs.len()];
        let team = owners.mig[&uuid_of(g, gi, ci)][0].clone();
        let pid = 10_000 + k;
        write_proc(
            &fake.root,
            pid,
            2000 + k % 50,
            &team_cgroup(&team, &format!("job-{k}.service")),
            None,
        );
        procs.push(fake_nvml::state::Process {
            pid,
            gpu: g,
            gi: Some(gi),
            ci: Some(ci),
            used_memory_mib: 64,
        });
    }
    fake_nvml::control::update(&fake.state, |st| st.processes.extend(procs)).unwrap();
}

/// NSS stand-in: uid N is `user<N>`, 0 is root; 4242 is unknown.
pub struct Names;

impl Directory for Names {
    fn user_by_uid(&self, uid: u32) -> Option<Account> {
        let name = match uid {
            0 => "root".to_string(),
            4242 => return None,
            n => format!("user{n}"),
        };
        Some(Account {
            name,
            uid,
            gid: uid,
            shell: "/bin/sh".into(),
        })
    }
    fn group_gid(&self, _: &str) -> Option<u32> {
        None
    }
    fn groups_of(&self, a: &Account) -> Vec<u32> {
        vec![a.gid]
    }
}
