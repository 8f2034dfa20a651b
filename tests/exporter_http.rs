//! gpuctl-exporter's HTTP side: a slow or malformed request does not stall other scrapes, and
//! a flood beyond the connection limit is answered 503 at once.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn start(opts: gpuctl::exporter::Options) -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    l.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            let _ = gpuctl::exporter::serve(l, opts, || async {
                Ok::<_, String>("gpuctl_up 1\n# EOF\n".to_string())
            })
            .await;
        });
    });
    addr
}

fn request(addr: std::net::SocketAddr, raw: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(raw).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn slow_and_malformed_requests_do_not_stall_scrapes() {
    let addr = start(gpuctl::exporter::Options {
        read_timeout: Duration::from_secs(30),
        ..Default::default()
    });
    // Three clients that never finish their request head, one sending half a line.
    let mut silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    silent[0].write_all(b"GET /metr").unwrap();
    let t = Instant::now();
    let ok = request(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(ok.contains("application/openmetrics-text"), "{ok}");
    assert!(ok.ends_with("gpuctl_up 1\n# EOF\n"), "{ok}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "a scrape waited {:?}",
        t.elapsed()
    );

    let bad = request(addr, b"\x16\x03\x01 binary junk\r\n\r\n");
    assert!(bad.starts_with("HTTP/1.1 400 "), "{bad}");
    let big = request(addr, &[b'A'; 9000]);
    assert!(big.starts_with("HTTP/1.1 431 "), "{big}");
    let nf = request(addr, b"GET /secret HTTP/1.1\r\n\r\n");
    assert!(nf.starts_with("HTTP/1.1 404 "), "{nf}");
    let post = request(addr, b"POST /metrics HTTP/1.1\r\n\r\n");
    assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
    let head = request(addr, b"HEAD /metrics HTTP/1.0\r\n\r\n");
    assert!(
        head.starts_with("HTTP/1.1 200 OK") && head.ends_with("\r\n\r\n"),
        "{head}"
    );
    // Still served after all that, with the silent clients still connected.
    assert!(request(addr, b"GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
    drop(silent);
}

// No sleeps: the kernel's accept queue is first in, first out, so connections made before a
// request are accepted before it; and gpuctl-exporter's one thread frees a connection's slot in
// the poll that closes it, before it accepts the next. Each outcome follows from that order, not
// from how fast this host runs.
#[test]
fn a_silent_client_times_out_with_408_and_frees_its_slot() {
    let addr = start(gpuctl::exporter::Options {
        read_timeout: Duration::from_millis(300),
        max_connections: 1,
        ..Default::default()
    });
    let mut a = TcpStream::connect(addr).unwrap();
    // Blocks until the exporter gives up on the silent client (the bound is only a backstop).
    a.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut out = String::new();
    let _ = a.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 408 "), "{out}");
    // The only slot was the silent client's: it is free again.
    assert!(request(addr, b"GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
}

/// A metrics source that answers only when the test says so, so "every slot is serving" is a
/// state the test sets up, not a race.
fn start_gated(
    opts: gpuctl::exporter::Options,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<tokio::sync::Semaphore>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let waiting = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (g, w) = (gate.clone(), waiting.clone());
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    l.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            let _ = gpuctl::exporter::serve(l, opts, move || {
                let (g, w) = (g.clone(), w.clone());
                async move {
                    w.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let _p = g.acquire().await.map_err(|e| e.to_string())?;
                    Ok::<_, String>("gpuctl_up 1\n# EOF\n".to_string())
                }
            })
            .await;
        });
    });
    (addr, gate, waiting)
}

/// Send a whole request and read the whole answer; a reset is an error, not an empty answer.
fn exchange(addr: std::net::SocketAddr) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[test]
fn silent_connections_filling_every_slot_do_not_stop_a_scrape() {
    // A long head timeout: only eviction can make room.
    let (addr, gate, _) = start_gated(gpuctl::exporter::Options {
        read_timeout: Duration::from_secs(60),
        max_connections: 4,
        ..Default::default()
    });
    gate.add_permits(1000);
    let mut silent: Vec<TcpStream> = (0..6).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // Each silent connection is accepted before the scrape: the first byte of a request to
    // an accepted connection is what orders them, so wait for the exporter to have them all
    // by sending one scrape first (it evicts the oldest silent one, too).
    let first = exchange(addr).unwrap();
    assert!(first.starts_with("HTTP/1.1 200 OK\r\n"), "{first}");
    for _ in 0..3 {
        let r = exchange(addr).unwrap();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    }
    // The oldest silent ones were dropped (answered and closed), the newest still wait.
    silent[0]
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut out = String::new();
    let _ = silent[0].read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 503 "), "{out}");
    assert!(out.contains("dropped for a newer connection"), "{out}");
    let last = silent.last_mut().unwrap();
    last.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut b = [0u8; 1];
    assert!(
        matches!(last.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut),
        "the newest silent connection is still open"
    );
}

#[test]
fn a_flood_of_requests_gets_200_or_a_well_formed_503_never_a_reset() {
    let (addr, gate, waiting) = start_gated(gpuctl::exporter::Options {
        read_timeout: Duration::from_secs(10),
        fetch_timeout: Duration::from_secs(600),
        max_connections: 4,
    });
    // Fill every slot with a request that waits for the gate.
    let held: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(move || exchange(addr)))
        .collect();
    while waiting.load(std::sync::atomic::Ordering::SeqCst) < 4 {
        std::thread::sleep(Duration::from_millis(10));
    }
    // Every slot serves a request: each new one is refused, with a whole 503 after its
    // request was read.
    for _ in 0..50 {
        let r = exchange(addr).expect("an answer, not a reset");
        assert!(r.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{r}");
        assert!(r.contains("Content-Length: 21\r\n"), "{r}");
        assert!(r.ends_with("too many connections\n"), "{r}");
    }
    gate.add_permits(1000);
    for h in held {
        let r = h.join().unwrap().expect("an answer, not a reset");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    }
    // 200 concurrent scrapes: each gets 200 or a whole 503.
    let all: Vec<_> = (0..200)
        .map(|_| std::thread::spawn(move || exchange(addr)))
        .collect();
    for h in all {
        let r = h.join().unwrap().expect("an answer, not a reset");
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") || r.starts_with("HTTP/1.1 503 "),
            "{r}"
        );
        assert!(r.contains("\r\n\r\n"), "a whole answer: {r}");
    }
}
