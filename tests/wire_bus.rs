//! The lean D-Bus client of `gpuctl run` (`gpuctl::dbus_api::wire`) against a real
//! `dbus-daemon` and a zbus service: the bus accepts its pipelined authentication, `Hello` and
//! call, reports the calling process's own credentials to the service, and its replies and
//! errors come back intact.
//!
//! Needs `dbus-daemon`; without it the tests say so and pass, unless
//! `GPUCTL_REQUIRE_DBUS_DAEMON=1` (set by `.ci/run`), where they fail.

#[path = "common/dbus.rs"]
mod dbus;

use dbus::{serve, serve_as, start_bus};
use gpuctl::dbus_api::wire::{self, Call, WireError};
use std::process::Command;

#[test]
fn join_through_a_real_bus_returns_the_services_reply_and_our_own_credentials() {
    let Some(bus) = start_bus() else { return };
    serve(&bus.socket);
    let (env, scope) =
        wire::join(&bus.socket, "infer", &Default::default()).expect("Join succeeds");
    assert_eq!(scope, "gpuctl-run-infer-1.scope");
    assert_eq!(env["GPUCTL_TEAM"], "infer");
    // The bus vouches for this very process: pipelining did not change who is asking.
    assert_eq!(env["PID"], std::process::id().to_string());
    assert_eq!(env["UID"], nix::unistd::getuid().to_string());
    assert_eq!(env["EMPTY"], "");
    assert_eq!(env["ODD"], "ünï côdé = \"q\" \n");
    assert_eq!(env["K19"], "v".repeat(19));
    assert_eq!(env.len(), 26);
}

#[test]
fn errors_come_back_with_their_name_and_message() {
    let Some(bus) = start_bus() else { return };
    serve(&bus.socket);
    match wire::join(&bus.socket, "nope", &Default::default()) {
        Err(WireError::Method { name, message }) => {
            assert_eq!(name, "org.gpuctl.Agent1.Error.NotMember");
            assert_eq!(
                message.as_deref(),
                Some("you are not a member of team \"nope\" (members: @ml)")
            );
        }
        other => panic!("expected NotMember, got {other:?}"),
    }
    // Nobody owns the name: the bus itself answers.
    let r = wire::call(
        &bus.socket,
        &Call {
            destination: "org.example.Nobody",
            path: "/",
            interface: "org.example.Nobody",
            member: "Nothing",
            signature: "",
            body: &[],
        },
    );
    match r {
        Err(WireError::Method { name, .. }) => {
            assert_eq!(name, "org.freedesktop.DBus.Error.ServiceUnknown")
        }
        other => panic!("expected ServiceUnknown, got {other:?}"),
    }
}

#[test]
fn a_missing_bus_is_a_connect_error_naming_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-bus");
    match wire::join(&socket, "infer", &Default::default()) {
        Err(e @ WireError::Connect { .. }) => {
            assert!(e.to_string().contains("no-bus"), "{e}")
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
}

#[test]
fn gpuctl_run_execs_the_command_with_the_daemons_environment_and_maps_refusals() {
    let Some(bus) = start_bus() else { return };
    serve(&bus.socket);
    let run = |team: &str, script: &str| {
        Command::new(env!("CARGO_BIN_EXE_gpuctl"))
            .args(["run", "--team", team, "--", "sh", "-c", script])
            .env(
                "DBUS_SYSTEM_BUS_ADDRESS",
                format!("unix:path={}", bus.socket.display()),
            )
            .env("CUDA_VISIBLE_DEVICES", "inherited-must-not-win")
            .env("GPUCTL_SCOPE", "forged")
            .output()
            .unwrap()
    };
    let o = run(
        "infer",
        "echo \"$GPUCTL_TEAM|$CUDA_VISIBLE_DEVICES|$GPUCTL_SCOPE|$PID|$$\"; exit 7",
    );
    assert_eq!(
        o.status.code(),
        Some(7),
        "the command's own status passes through"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let f: Vec<&str> = out.trim().split('|').collect();
    assert_eq!(
        f[..3],
        ["infer", "GPU-from-the-daemon", "gpuctl-run-infer-1.scope"],
        "{out}"
    );
    // The pid the bus vouched for is the shell's own: gpuctl replaced itself in place.
    assert_eq!(f[3], f[4], "{out}");
    let o = run("nope", "echo ran");
    assert_eq!(o.status.code(), Some(3), "not a member");
    assert!(o.stdout.is_empty(), "the command never ran");
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).trim(),
        "gpuctl: you are not a member of team \"nope\" (members: @ml)"
    );
}

#[test]
fn gpuctl_run_through_an_address_without_a_socket_path_goes_through_zbus() {
    let Some(bus) = start_bus() else { return };
    serve(&bus.socket);
    let o = Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .args([
            "run",
            "--team",
            "infer",
            "--",
            "sh",
            "-c",
            "echo \"$GPUCTL_SCOPE\"",
        ])
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.abstract_address)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "gpuctl-run-infer-1.scope"
    );
}

/// A gpuctld of a later interface version: its `Status` document is one this gpuctl cannot read.
struct Newer;

#[zbus::interface(name = "org.gpuctl.Agent1")]
impl Newer {
    async fn status(&self) -> String {
        r#"{"status": {"text": "converged"}}"#.into()
    }

    #[zbus(property(emits_changed_signal = "const"))]
    async fn interface_version(&self) -> u32 {
        gpuctl::dbus_api::reply::v1::VERSION + 1
    }
}

#[test]
fn a_gpuctld_of_another_interface_version_is_named_not_misread() {
    let Some(bus) = start_bus() else { return };
    serve_as(&bus.socket, Newer);
    let o = Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .args(["status", "--json"])
        .env(
            "DBUS_SYSTEM_BUS_ADDRESS",
            format!("unix:path={}", bus.socket.display()),
        )
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(o.stdout.is_empty(), "nothing printed: {o:?}");
    let v = gpuctl::dbus_api::reply::v1::VERSION;
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).trim(),
        format!(
            "gpuctl: Status: gpuctld speaks version {} of its bus interface and this gpuctl \
             version {v}: gpuctld is newer than this gpuctl (use the gpuctl installed with it, \
             or upgrade this one)",
            v + 1
        )
    );
}
