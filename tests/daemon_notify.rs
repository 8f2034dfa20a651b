//! gpuctld's start is extended (`EXTEND_TIMEOUT_USEC=`) while its first reconcile progresses, and
//! not once that step is past its deadline (issue 14, found in vm-tests 65). One test in its own
//! binary: it sets `NOTIFY_SOCKET` for the whole process.

use gpuctl::daemon::{extend_start_while_progressing, Progress};
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

#[tokio::test(flavor = "current_thread")]
async fn the_start_is_extended_only_while_the_reconcile_progresses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    // SAFETY of the environment: the only test in this binary, set before any task runs.
    std::env::set_var("NOTIFY_SOCKET", &path);

    let progress = Progress::default();
    progress.enter(Duration::from_secs(3600));
    let task = extend_start_while_progressing(
        progress.clone(),
        Duration::from_millis(50),
        Duration::from_secs(90),
    );
    tokio::time::sleep(Duration::from_millis(120)).await;
    let mut buf = [0u8; 256];
    let n = sock
        .recv(&mut buf)
        .expect("no notification while progressing");
    assert_eq!(&buf[..n], b"EXTEND_TIMEOUT_USEC=90000000\n");

    // Past the step's deadline: wedged, so no more extensions.
    progress.enter(Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(60)).await;
    while sock.recv(&mut buf).is_ok() {} // drain what was sent before
    tokio::time::sleep(Duration::from_millis(150)).await;
    sock.set_nonblocking(true).unwrap();
    assert!(
        sock.recv(&mut buf).is_err(),
        "extended although the step is past its deadline"
    );
    task.abort();
}
