//! The lean D-Bus client of `gpuctl run` (`gpuctl::dbus_api::wire`) against a real
//! `dbus-daemon` and a zbus service: the bus accepts its pipelined authentication, `Hello` and
//! call, reports the calling process's own credentials to the service, and its replies and
//! errors come back intact.
//!
//! Needs `dbus-daemon`; without it the tests say so and pass, unless
//! `GPUCTL_REQUIRE_DBUS_DAEMON=1` (set by `.ci/run`), where they fail.

use gpuctl::dbus_api::join::JoinError;
use gpuctl::dbus_api::wire::{self, Call, WireError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zbus::message::Header;
use zbus::Connection;

struct Bus {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_bus() -> Option<Bus> {
    if Command::new("dbus-daemon")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        assert!(
            std::env::var_os("GPUCTL_REQUIRE_DBUS_DAEMON").is_none(),
            "dbus-daemon is required here (GPUCTL_REQUIRE_DBUS_DAEMON is set) but not installed"
        );
        eprintln!("dbus-daemon not installed: skipping (install package dbus-daemon)");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bus");
    let conf = dir.path().join("bus.conf");
    std::fs::write(
        &conf,
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*"/>
    <allow own="*"/>
    <allow receive_sender="*"/>
    <allow send_requested_reply="true"/>
    <allow receive_requested_reply="true"/>
  </policy>
</busconfig>"#,
            socket.display()
        ),
    )
    .unwrap();
    let child = Command::new("dbus-daemon")
        .arg(format!("--config-file={}", conf.display()))
        .arg("--nofork")
        .stdout(Stdio::null())
        // It complains that it cannot raise its fd limit when not started by init.
        .stderr(Stdio::null())
        .spawn()
        .expect("start dbus-daemon");
    let t = Instant::now();
    while !socket.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "dbus-daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(Bus {
        child,
        socket,
        _dir: dir,
    })
}

struct Fake;

#[zbus::interface(name = "org.gpuctl.Agent1")]
impl Fake {
    /// Answers with what the bus says about the caller, so the test can compare it with itself.
    async fn join(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        team: &str,
    ) -> Result<(HashMap<String, String>, String), JoinError> {
        if team == "nope" {
            return Err(JoinError::NotMember(
                "you are not a member of team \"nope\" (members: @ml)".into(),
            ));
        }
        let sender = hdr.sender().unwrap().to_owned();
        let creds = zbus::fdo::DBusProxy::new(conn)
            .await?
            .get_connection_credentials(sender.into())
            .await
            .map_err(|e| JoinError::ZBus(e.into()))?;
        let mut env = HashMap::new();
        env.insert("GPUCTL_TEAM".into(), team.to_string());
        env.insert("CUDA_VISIBLE_DEVICES".into(), "GPU-from-the-daemon".into());
        env.insert("PID".into(), creds.process_id().unwrap().to_string());
        env.insert("UID".into(), creds.unix_user_id().unwrap().to_string());
        env.insert("EMPTY".into(), String::new());
        env.insert("ODD".into(), "ünï côdé = \"q\" \n".into());
        for i in 0..20 {
            env.insert(format!("K{i}"), "v".repeat(i));
        }
        Ok((env, format!("gpuctl-run-{team}-1.scope")))
    }
}

/// Serve `Fake` as org.gpuctl.Agent1 on the bus from a thread of its own; returns once the name
/// is owned.
fn serve(socket: &Path) {
    let addr = format!("unix:path={}", socket.display());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let conn = zbus::connection::Builder::address(addr.as_str())
                .unwrap()
                .serve_at("/org/gpuctl/Agent1", Fake)
                .unwrap()
                .name("org.gpuctl.Agent1")
                .unwrap()
                .build()
                .await
                .unwrap();
            tx.send(()).unwrap();
            std::future::pending::<()>().await;
            drop(conn);
        });
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("service is on the bus");
}

#[test]
fn join_through_a_real_bus_returns_the_services_reply_and_our_own_credentials() {
    let Some(bus) = start_bus() else { return };
    serve(&bus.socket);
    let (env, scope) = wire::join(&bus.socket, "infer").expect("Join succeeds");
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
    match wire::join(&bus.socket, "nope") {
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
    match wire::join(&socket, "infer") {
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
