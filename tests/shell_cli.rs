//! `gpuctl shell/run/env/teams/status` without a daemon: client-side refusals, their exit codes
//! and messages, and the documented exit-code table in `--help`.

use std::process::{Command, Output};

/// Run gpuctl with the system bus pointed at a socket that does not exist, so the result never
/// depends on whether the build machine runs a bus or gpuctld.
fn gpuctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .args(args)
        .env(
            "DBUS_SYSTEM_BUS_ADDRESS",
            "unix:path=/nonexistent/gpuctl-test/system_bus_socket",
        )
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn hostile_team_names_are_refused_before_the_bus_with_exit_4() {
    let long = "a".repeat(5000);
    for bad in [
        "../x",
        "a-b",
        "in\nfer",
        "x\u{1b}[2J",
        "Infer",
        long.as_str(),
    ] {
        for cmd in [
            vec!["run", "--team", bad, "--", "true"],
            vec!["shell", "--team", bad],
            vec!["env", "--team", bad],
        ] {
            let o = gpuctl(&cmd);
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(4), "{cmd:?}: {e}");
            assert!(e.contains("is not a valid team name"), "{e}");
            assert_eq!(
                e.lines().count(),
                1,
                "one line, control characters escaped: {e:?}"
            );
            assert!(!e.contains('\u{1b}'), "{e:?}");
            assert!(e.len() < 200, "long names are truncated: {} bytes", e.len());
            // Refused before anything was reached: no bus error in the message.
            assert!(!e.contains("bus"), "{e}");
        }
    }
}

#[test]
fn no_daemon_is_exit_6_with_the_hint_and_the_command_never_runs() {
    let marker = tempfile::tempdir().unwrap();
    let flag = marker.path().join("ran");
    let o = gpuctl(&[
        "run",
        "--team",
        "infer",
        "--",
        "touch",
        flag.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(6), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("systemctl start gpuctld"),
        "{}",
        stderr(&o)
    );
    assert!(!flag.exists(), "a refused run must not run the command");
    for cmd in [
        vec!["status"],
        vec!["teams"],
        vec!["env", "--team", "infer"],
    ] {
        let o = gpuctl(&cmd);
        assert_eq!(o.status.code(), Some(6), "{cmd:?}: {}", stderr(&o));
    }
}

#[test]
fn help_documents_every_exit_code() {
    for cmd in ["shell", "run"] {
        let o = gpuctl(&[cmd, "--help"]);
        let h = String::from_utf8_lossy(&o.stdout);
        for line in [
            "  3  not a member of the team",
            "  4  no such team, or not a valid team name",
            "  5  the team has no GPU or MIG device",
            "  6  gpuctld is not running (systemctl start gpuctld)",
            "  7  gpuctld could not place the process",
            "127 it was not found",
        ] {
            assert!(h.contains(line), "{cmd} --help lacks {line:?}:\n{h}");
        }
    }
}

#[test]
fn run_needs_a_command() {
    let o = gpuctl(&["run", "--team", "infer"]);
    assert_eq!(o.status.code(), Some(2), "clap usage error: {}", stderr(&o));
}
