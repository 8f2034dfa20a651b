//! A private `dbus-daemon` and a stand-in `org.gpuctl.Agent1` service (zbus) for the tests and
//! benchmarks of the `Join` clients (`tests/wire_bus.rs`, `benches/join_clients.rs`).
//!
//! The bus listens on a socket path (what the lean client of `gpuctl run` speaks) and on an
//! abstract socket (`unix:abstract=`), which `gpuctl run` leaves to zbus, so both clients can be
//! driven against the same bus and service.
#![allow(dead_code)]

use gpuctl::dbus_api::join::JoinError;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zbus::message::Header;
use zbus::Connection;

pub struct Bus {
    child: Child,
    /// The bus's socket path.
    pub socket: PathBuf,
    /// The bus's `unix:abstract=` address, for the zbus client.
    pub abstract_address: String,
    _dir: tempfile::TempDir,
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start_bus() -> Option<Bus> {
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
    let abstract_name = format!(
        "gpuctl-test-{}-{}",
        std::process::id(),
        dir.path().file_name().unwrap().to_string_lossy()
    );
    std::fs::write(
        &conf,
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={}</listen>
  <listen>unix:abstract={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*"/>
    <allow own="*"/>
    <allow receive_sender="*"/>
    <allow send_requested_reply="true"/>
    <allow receive_requested_reply="true"/>
  </policy>
</busconfig>"#,
            socket.display(),
            abstract_name
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
    // The socket file appears at bind(), before listen(): a connect in between is refused
    // (seen once in CI), so wait until one is accepted.
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "dbus-daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(Bus {
        child,
        socket,
        abstract_address: format!("unix:abstract={abstract_name}"),
        _dir: dir,
    })
}

pub struct Fake;

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
pub fn serve(socket: &Path) {
    serve_as(socket, Fake)
}

/// Serve `iface` as org.gpuctl.Agent1, as [`serve`] does `Fake`.
pub fn serve_as(socket: &Path, iface: impl zbus::object_server::Interface) {
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
                .serve_at("/org/gpuctl/Agent1", iface)
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
