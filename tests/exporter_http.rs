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
fn a_flood_beyond_the_limit_gets_503() {
    let addr = start(gpuctl::exporter::Options {
        // Longer than any stall of this test: the two holders keep their slots.
        read_timeout: Duration::from_secs(120),
        max_connections: 2,
        ..Default::default()
    });
    let mut a = TcpStream::connect(addr).unwrap();
    let _b = TcpStream::connect(addr).unwrap();
    let third = request(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(third.starts_with("HTTP/1.1 503 "), "{third}");
    // A holder finishes its request: answered, closed, and its slot serves the next scrape.
    a.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut out = String::new();
    a.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let _ = a.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
    assert!(request(addr, b"GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
}

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
