//! Security rules of joining a team, against a fake directory and a fake `/proc`.

use super::*;
use crate::policy::{HostSettings, Limits, Team};

/// A directory held in a table: alice (1000, in ml-infer), bob (1001, in nothing), carol
/// (1002, in ml-infer only through the bus's groups, e.g. after `newgrp`).
struct FakeDir;

impl Directory for FakeDir {
    fn user_by_uid(&self, uid: u32) -> Option<Account> {
        let name = match uid {
            0 => "root",
            1000 => "alice",
            1001 => "bob",
            1002 => "carol",
            _ => return None,
        };
        Some(Account {
            name: name.into(),
            uid,
            gid: uid,
            shell: "/bin/bash".into(),
        })
    }
    fn group_gid(&self, name: &str) -> Option<u32> {
        match name {
            "ml-infer" => Some(2000),
            "ml-train" => Some(2001),
            _ => None,
        }
    }
    fn groups_of(&self, a: &Account) -> Vec<u32> {
        match a.name.as_str() {
            "alice" => vec![1000, 2000],
            _ => vec![a.gid],
        }
    }
}

fn team(name: &str, members: Vec<Member>) -> (crate::policy::TeamName, Team) {
    (
        name.parse().unwrap(),
        Team {
            name: name.parse().unwrap(),
            members,
            limits: Limits::default(),
            mps: None,
            idle: None,
            placement: Default::default(),
            lend: None,
            borrow: false,
            loc: None,
        },
    )
}

fn policy() -> Policy {
    Policy {
        host: HostSettings::default(),
        teams: [
            team("infer", vec![Member::Group("ml-infer".into())]),
            team(
                "train",
                vec![
                    Member::User("bob_t".into()),
                    Member::Group("ml-train".into()),
                ],
            ),
            team("solo", vec![Member::User("bob".into())]),
            team("ghost", vec![Member::Group("no-such-group".into())]),
        ]
        .into_iter()
        .collect(),
        gpus: vec![],
        sources: vec![],
        slurm: Default::default(),
        layouts_in_force: Default::default(),
    }
}

/// `authorize` against [`policy`] and [`FakeDir`].
fn auth(c: &Caller, team: &str) -> Result<Grant, Refusal> {
    authorize(c, &policy(), &tn(team), &FakeDir)
}

fn caller(uid: u32) -> Caller {
    Caller {
        uid,
        pid: Some(4242),
        gids: None,
    }
}

#[test]
fn group_member_is_granted_through_nss_groups() {
    let g = auth(&caller(1000), "infer").unwrap();
    assert_eq!(g.via, Via::Group("ml-infer".into()));
    assert_eq!(g.user, "alice");
}

#[test]
fn listed_user_is_granted() {
    let g = auth(&caller(1001), "solo").unwrap();
    assert_eq!(g.via, Via::User("bob".into()));
}

#[test]
fn non_member_is_refused_and_told_who_the_members_are() {
    let e = auth(&caller(1001), "infer").unwrap_err();
    assert_eq!(
        e,
        Refusal::NotMember {
            team: "infer".into(),
            user: "bob".into(),
            members: vec!["@ml-infer".into()],
        }
    );
    assert_eq!(
        e.to_string(),
        "bob is not a member of team \"infer\" (members: @ml-infer)"
    );
    // A user name that merely starts like a member's does not match.
    assert!(auth(&caller(1001), "train").is_err());
}

#[test]
fn unknown_uid_is_refused_by_number() {
    let e = auth(&caller(4711), "solo").unwrap_err();
    assert!(e.to_string().starts_with("uid 4711 is not a member"), "{e}");
}

#[test]
fn bus_groups_count_too() {
    let mut c = caller(1002);
    assert!(auth(&c, "infer").is_err());
    c.gids = Some(vec![1002, 2000]);
    let g = auth(&c, "infer").unwrap();
    assert_eq!(g.via, Via::Group("ml-infer".into()));
}

#[test]
fn a_group_nss_does_not_know_grants_nothing() {
    let mut c = caller(1000);
    c.gids = Some(vec![1000, 2000]);
    assert!(matches!(auth(&c, "ghost"), Err(Refusal::NotMember { .. })));
}

#[test]
fn root_may_join_any_team_but_not_an_unknown_one() {
    for t in ["infer", "train", "solo", "ghost"] {
        assert_eq!(auth(&caller(0), t).unwrap().via, Via::Root);
    }
    let e = auth(&caller(0), "nope").unwrap_err();
    assert!(matches!(e, Refusal::UnknownTeam { .. }));
    assert_eq!(
        e.to_string(),
        "no team \"nope\" in the policy (teams: ghost, infer, solo, train)"
    );
    let e = auth(&caller(0), "infr").unwrap_err();
    assert_eq!(
        e.to_string(),
        "no team \"infr\" in the policy (did you mean 'infer'? teams: ghost, infer, solo, train)"
    );
}

#[test]
fn a_bad_team_name_says_which_name_was_meant() {
    let e = check_team_name("ml-infer").unwrap_err().to_string();
    assert!(
        e.starts_with("\"ml-infer\" is not a valid team name: a '-' would nest the slice")
            && e.contains("use '_' instead: did you mean \"ml_infer\"? (teams are"),
        "{e}"
    );
    let e = check_team_name("../x").unwrap_err().to_string();
    assert!(!e.contains("did you mean"), "{e}");
}

#[test]
fn joinable_lists_exactly_the_callers_teams() {
    let names = |uid| -> Vec<String> {
        joinable(&caller(uid), &policy(), &FakeDir)
            .into_iter()
            .map(|t| t.0)
            .collect()
    };
    assert_eq!(names(1000), vec!["infer"]);
    assert_eq!(names(1001), vec!["solo"]);
    assert!(names(1002).is_empty());
    assert_eq!(names(0).len(), 4);
}

#[test]
fn hostile_team_names_are_rejected_before_any_lookup() {
    // A `TeamName` is the only way into `authorize`, so a hostile name cannot reach a lookup.
    let long = "a".repeat(4096);
    for bad in [
        "../x",
        "../../etc/passwd",
        "a-b",
        "infer.slice",
        "a/b",
        "",
        "Infer",
        "infer\n",
        "in\u{1b}[2Jfer",
        "infer\0",
        long.as_str(),
    ] {
        let e = check_team_name(bad).unwrap_err();
        assert!(matches!(e, Refusal::BadTeamName { .. }), "{bad:?}: {e}");
        let msg = e.to_string();
        assert!(
            !msg.contains('\n') && !msg.contains('\u{1b}') && !msg.contains('\0'),
            "{msg:?}"
        );
        assert!(
            msg.len() < 200,
            "message for a long name stays short: {}",
            msg.len()
        );
        assert!(check_team_name(bad).is_err());
    }
}

fn fake_proc(dir: &std::path::Path, pid: u32, uids: &str, start: u64) -> Root {
    let root = Root::new(dir);
    let p = root.join(format!("/proc/{pid}"));
    std::fs::create_dir_all(&p).unwrap();
    std::fs::write(
        p.join("status"),
        format!("Name:\tbash\nUid:\t{uids}\nGid:\t1000\t1000\t1000\t1000\n"),
    )
    .unwrap();
    std::fs::write(
        p.join("stat"),
        format!(
            "{pid} (a (b) c) S 1 {pid} {pid} 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 {start} 1 2 3\n"
        ),
    )
    .unwrap();
    root
}

#[test]
fn own_process_is_accepted() {
    let d = tempfile::tempdir().unwrap();
    let root = fake_proc(d.path(), 77, "1000\t1000\t1000\t1000", 123456);
    let p = ProcIdentity::read(&root, 77).unwrap();
    assert_eq!(
        p.start_time, 123456,
        "start time read past a comm with ') '"
    );
    assert!(verify_process(1000, &p).is_ok());
}

#[test]
fn forged_pid_of_another_user_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let root = fake_proc(d.path(), 78, "1001\t1001\t1001\t1001", 1);
    let p = ProcIdentity::read(&root, 78).unwrap();
    let e = verify_process(1000, &p).unwrap_err();
    assert!(matches!(e, Refusal::NotYourProcess { pid: 78, .. }));
    assert!(e.to_string().contains("uid 1001"), "{e}");
}

#[test]
fn setuid_process_of_the_caller_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let root = fake_proc(d.path(), 79, "1000\t0\t0\t0", 1);
    assert!(verify_process(1000, &ProcIdentity::read(&root, 79).unwrap()).is_err());
}

#[test]
fn vanished_process_is_refused_naming_the_pid() {
    let d = tempfile::tempdir().unwrap();
    let e = ProcIdentity::read(&Root::new(d.path()), 80).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("pid 80: cannot read /proc/80/status"),
        "{e}"
    );
}

#[test]
fn recycled_pid_has_another_identity() {
    let d = tempfile::tempdir().unwrap();
    let before =
        ProcIdentity::read(&fake_proc(d.path(), 81, "1000 1000 1000 1000", 10), 81).unwrap();
    let after =
        ProcIdentity::read(&fake_proc(d.path(), 81, "1000 1000 1000 1000", 11), 81).unwrap();
    assert_ne!(before, after);
}

#[test]
fn real_proc_self_parses() {
    let me = ProcIdentity::read(&Root::default(), std::process::id()).unwrap();
    assert_eq!(me.uids[0], nix::unistd::getuid().as_raw());
    assert!(me.start_time > 0);
}

#[test]
fn inherited_env_cannot_override_the_daemons() {
    let daemon = parse_env_file(
        "GPUCTL_TEAM=infer\nCUDA_VISIBLE_DEVICES=GPU-aaaa\nNVIDIA_VISIBLE_DEVICES=GPU-aaaa\n",
    );
    let inherited = [
        ("PATH", "/usr/bin"),
        ("CUDA_VISIBLE_DEVICES", "evil"),
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("CUDA_MPS_PIPE_DIRECTORY", "/tmp/evil"),
        ("GPUCTL_TEAM", "train"),
        ("HOME", "/home/alice"),
    ]
    .map(|(k, v)| (k.into(), v.into()));
    let env = compose_env(inherited, &daemon);
    let get = |k: &str| -> Vec<&str> {
        env.iter()
            .filter(|(kk, _)| kk == k)
            .map(|(_, v)| v.to_str().unwrap())
            .collect()
    };
    assert_eq!(get("CUDA_VISIBLE_DEVICES"), vec!["GPU-aaaa"]);
    assert_eq!(get("NVIDIA_VISIBLE_DEVICES"), vec!["GPU-aaaa"]);
    assert_eq!(get("GPUCTL_TEAM"), vec!["infer"]);
    assert!(
        get("CUDA_MPS_PIPE_DIRECTORY").is_empty(),
        "a team without MPS gets no MPS dir"
    );
    assert_eq!(get("PATH"), vec!["/usr/bin"]);
    assert_eq!(get("HOME"), vec!["/home/alice"]);
}

#[test]
fn env_file_parsing_and_device_presence() {
    let e = parse_env_file(
        "# written by gpuctld\nGPUCTL_TEAM=infer\nCUDA_VISIBLE_DEVICES=\"MIG-1,MIG-2\"\nbad key=x\n=y\n",
    );
    assert_eq!(e.len(), 2);
    assert_eq!(e["CUDA_VISIBLE_DEVICES"], "MIG-1,MIG-2");
    assert!(has_devices(&e));
    assert!(!has_devices(&parse_env_file("CUDA_VISIBLE_DEVICES=\n")));
    assert!(!has_devices(&parse_env_file("GPUCTL_TEAM=x\n")));
}

#[test]
fn device_less_teams_are_joinable_and_missing_devices_are_named() {
    use crate::policy::{GpuAssignment, GpuUse, Selector};
    let mut p = policy();
    let name = p.teams.keys().next().unwrap().clone();
    let empty = parse_env_file("GPUCTL_TEAM=x\nCUDA_VISIBLE_DEVICES=\nGPUCTL_DEVICES=none\n");
    // The policy gives the team nothing: joinable with no devices.
    assert_eq!(check_devices(&empty, &p, &name), Ok(()));
    // The policy gives it GPU 3, which is not there now: refused, naming the entry.
    p.gpus.push(GpuAssignment {
        selector: Selector::Index(vec![3]),
        usage: GpuUse::Owned(name.clone()),
        loc: None,
        key: "gpu[0]".into(),
        layouts: None,
    });
    let e = check_devices(&empty, &p, &name).unwrap_err();
    assert!(matches!(e, Refusal::NoDevices { .. }));
    let msg = e.to_string();
    assert!(msg.contains("gpu[0] (index 3, owned)"), "{msg}");
    // With its device present, joinable.
    let full = parse_env_file("CUDA_VISIBLE_DEVICES=GPU-1\n");
    assert_eq!(check_devices(&full, &p, &name), Ok(()));
}

fn tn(s: &str) -> crate::policy::TeamName {
    s.parse().unwrap()
}

#[test]
fn viewers_see_their_own_teams_root_and_admins_everything() {
    let mut p = policy();
    let teams = |v: Viewer| match v {
        Viewer::All => vec!["*".to_string()],
        Viewer::Teams(t) => t.into_iter().collect(),
    };
    assert_eq!(teams(viewer(&caller(0), Some(&p), &FakeDir)), ["*"]);
    assert_eq!(teams(viewer(&caller(1000), Some(&p), &FakeDir)), ["infer"]);
    assert_eq!(teams(viewer(&caller(1001), Some(&p), &FakeDir)), ["solo"]);
    assert!(teams(viewer(&caller(1002), Some(&p), &FakeDir)).is_empty());
    // No policy yet: root still sees all, the rest nothing one by one.
    assert_eq!(teams(viewer(&caller(0), None, &FakeDir)), ["*"]);
    assert!(teams(viewer(&caller(1000), None, &FakeDir)).is_empty());

    p.host.admin_group = Some("ml-train".into());
    // carol is in ml-train only through the bus's groups; alice only through NSS.
    let mut carol = caller(1002);
    carol.gids = Some(vec![2001]);
    assert_eq!(viewer(&carol, Some(&p), &FakeDir), Viewer::All);
    p.host.admin_group = Some("ml-infer".into());
    assert_eq!(viewer(&caller(1000), Some(&p), &FakeDir), Viewer::All);
    assert_eq!(teams(viewer(&caller(1001), Some(&p), &FakeDir)), ["solo"]);
    // A group NSS does not know makes nobody an admin.
    p.host.admin_group = Some("no-such-group".into());
    assert_eq!(teams(viewer(&caller(1000), Some(&p), &FakeDir)), ["infer"]);

    let v = viewer(&caller(1000), Some(&p), &FakeDir);
    assert!(v.sees(Some("infer")));
    assert!(!v.sees(Some("train")));
    assert!(
        !v.sees(None),
        "a process in no team's slice is root's and the admins' to see"
    );
    assert!(Viewer::All.sees(None));
}
