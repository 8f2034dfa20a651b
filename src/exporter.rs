//! `gpuctl-exporter`: the unprivileged HTTP face of gpuctld's metrics. systemd listens on
//! `127.0.0.1:9849` (`gpuctl-exporter.socket`) and starts it as the unprivileged system user
//! `gpuctl-exporter` (not `DynamicUser=`: dbus-daemon drops a dynamic user's connection, see the
//! unit); each
//! `GET /metrics` becomes one `Metrics("openmetrics")` call to gpuctld on the system bus. No
//! HTTP is ever parsed as root, and gpuctld's collector bounds NVML reads however often it is
//! scraped.
//!
//! The HTTP side is hand-written on purpose: it answers exactly one request (`GET /metrics`,
//! `HEAD` too) with `Connection: close`, so all it needs is the request line. A server crate
//! (hyper + hyper-util + http-body-util) would add a dozen crates to a build that CI compiles
//! on two cores, for features (keep-alive, chunking, HTTP/2, bodies) this endpoint refuses
//! anyway. What it guards against instead:
//! - a slow or silent client: the request head must arrive within [`Options::read_timeout`]
//!   (short: Prometheus sends it at once);
//! - slot filling: at most [`Options::max_connections`] at once; when all are taken, the
//!   connection that has waited longest without sending its request head is dropped for the new
//!   one, so silent connections cannot lock a scraper out;
//! - a flood of real requests (every slot serving): the next ones get a well-formed `503`
//!   after their request is read, never a reset (closing a socket with unread input makes the
//!   kernel send RST instead of the answer); at most [`Options::max_connections`] of those at
//!   once, the rest are closed;
//! - a huge head: at most [`MAX_HEAD`] bytes, else `431`;
//! - garbage: anything that is not `METHOD SP TARGET SP HTTP/x` gets `400`.
//!
//! Every connection is its own task, so none of these holds up another scrape.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Largest request head read.
pub const MAX_HEAD: usize = 8192;
/// The port of `gpuctl-exporter.socket` (dcgm-exporter has 9400, node_exporter 9100).
pub const DEFAULT_PORT: u16 = 9849;
/// OpenMetrics content type.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Limits of the server.
#[derive(Debug, Clone)]
pub struct Options {
    /// Time a client has to send its request head.
    pub read_timeout: Duration,
    /// Time gpuctld has to answer.
    pub fetch_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            read_timeout: Duration::from_secs(3),
            fetch_timeout: Duration::from_secs(20),
            max_connections: 64,
        }
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// `GET /metrics` (`head`: `HEAD /metrics`).
    Metrics {
        /// A `HEAD` request: no body.
        head: bool,
    },
    /// Another path: 404.
    NotFound,
    /// Another method: 405.
    BadMethod,
    /// Not HTTP: 400.
    Malformed,
}

/// Parse the request line of a head (the rest of the head is ignored).
pub fn parse_request(head: &[u8]) -> Request {
    let Ok(text) = std::str::from_utf8(head) else {
        return Request::Malformed;
    };
    let line = text
        .split("\r\n")
        .next()
        .unwrap_or("")
        .trim_end_matches('\n');
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Request::Malformed;
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Request::Malformed;
    }
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => Request::Metrics { head: false },
        ("HEAD", "/metrics") => Request::Metrics { head: true },
        ("GET" | "HEAD", _) => Request::NotFound,
        _ => Request::BadMethod,
    }
}

fn response(status: &str, content_type: &str, body: &str, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

fn text(status: &str, body: &str) -> Vec<u8> {
    response(status, "text/plain; charset=utf-8", body, false)
}

/// Read a request head: up to the blank line, at most [`MAX_HEAD`] bytes. `Err` carries the
/// response to send instead.
async fn read_head(s: &mut TcpStream) -> Result<Vec<u8>, Vec<u8>> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = s.read(&mut chunk).await.map_err(|_| Vec::new())?;
        if n == 0 {
            // Closed before a full head: answer what we can (a bare request line is enough).
            return if buf.is_empty() {
                Err(Vec::new())
            } else {
                Ok(buf)
            };
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            return Ok(buf);
        }
        if buf.len() > MAX_HEAD {
            return Err(text(
                "431 Request Header Fields Too Large",
                "request head too large\n",
            ));
        }
    }
}

/// Connections still waiting for their request head, oldest first: the ones to drop when
/// every slot is taken. Each waits on its receiver; sending (or dropping the sender) drops it.
#[derive(Default)]
struct Silent {
    next: u64,
    waiting: BTreeMap<u64, tokio::sync::oneshot::Sender<()>>,
}

/// Connection count and the silent ones, shared by the accept loop and the connection tasks
/// (one thread: `spawn_local`).
#[derive(Default)]
struct Slots {
    busy: usize,
    refusing: usize,
    silent: Silent,
}

/// Frees a slot however the task ends.
struct Slot(Rc<RefCell<Slots>>, bool);

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.0.borrow_mut();
        if self.1 {
            s.refusing -= 1;
        } else {
            s.busy -= 1;
        }
    }
}

async fn handle<F, Fut, E>(
    mut s: TcpStream,
    opts: Arc<Options>,
    fetch: F,
    silent: (u64, tokio::sync::oneshot::Receiver<()>),
    slots: Rc<RefCell<Slots>>,
    _slot: Slot,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<String, E>>,
    E: std::fmt::Display,
{
    let (id, dropped) = silent;
    let head = tokio::select! {
        h = tokio::time::timeout(opts.read_timeout, read_head(&mut s)) => Some(h),
        _ = dropped => None,
    };
    slots.borrow_mut().silent.waiting.remove(&id);
    let reply = match head {
        // Dropped for a newer connection while it had sent no request.
        None => text(
            "503 Service Unavailable",
            "dropped for a newer connection\n",
        ),
        Some(Err(_)) => text("408 Request Timeout", "request head not received in time\n"),
        Some(Ok(Err(r))) => r,
        Some(Ok(Ok(head))) => match parse_request(&head) {
            Request::Metrics { head } => {
                match tokio::time::timeout(opts.fetch_timeout, fetch()).await {
                    Ok(Ok(body)) => response("200 OK", CONTENT_TYPE, &body, head),
                    Ok(Err(e)) => text("503 Service Unavailable", &format!("gpuctld: {e}\n")),
                    Err(_) => text(
                        "503 Service Unavailable",
                        "gpuctld did not answer in time\n",
                    ),
                }
            }
            Request::NotFound => text("404 Not Found", "only /metrics is served here\n"),
            Request::BadMethod => text("405 Method Not Allowed", "GET or HEAD only\n"),
            Request::Malformed => text("400 Bad Request", "not an HTTP/1 request\n"),
        },
    };
    if !reply.is_empty() {
        let _ = tokio::time::timeout(opts.read_timeout, s.write_all(&reply)).await;
    }
    let _ = s.shutdown().await;
}

/// Every slot serves a request: read this one's request (so closing sends FIN, not RST),
/// answer `503`, and wait briefly for the client to close.
async fn refuse(mut s: TcpStream, opts: Arc<Options>, _slot: Slot) {
    let wait = opts.read_timeout.min(Duration::from_secs(1));
    let _ = tokio::time::timeout(wait, read_head(&mut s)).await;
    let r = text("503 Service Unavailable", "too many connections\n");
    if tokio::time::timeout(wait, s.write_all(&r)).await.is_ok() {
        let _ = s.shutdown().await;
        let mut sink = [0u8; 1024];
        let _ = tokio::time::timeout(wait, async {
            while let Ok(n) = s.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
    }
}

/// Serve until the listener fails. `fetch` produces the metrics text for one scrape; its error
/// (gpuctld's, e.g. a `zbus::Error`) is shown in the `503` body.
pub async fn serve<F, Fut, E>(listener: TcpListener, opts: Options, fetch: F) -> std::io::Result<()>
where
    F: Fn() -> Fut + Clone + 'static,
    Fut: Future<Output = Result<String, E>> + 'static,
    E: std::fmt::Display + 'static,
{
    let opts = Arc::new(opts);
    let slots = Rc::new(RefCell::new(Slots::default()));
    loop {
        let (s, _) = listener.accept().await?;
        let mut sl = slots.borrow_mut();
        // When full, the oldest silent connection makes room: it ends at once, and until its
        // task has unwound the count is over the limit by one.
        let evicted = sl.busy >= opts.max_connections
            && sl
                .silent
                .waiting
                .pop_first()
                .map(|(_, tx)| tx.send(()))
                .is_some();
        if sl.busy < opts.max_connections || evicted {
            sl.busy += 1;
            // Registered here, not in its task: a burst of connections is accepted before any
            // task runs, and each must already count as silent for the next.
            let (tx, rx) = tokio::sync::oneshot::channel();
            let id = sl.silent.next;
            sl.silent.next += 1;
            sl.silent.waiting.insert(id, tx);
            drop(sl);
            let slot = Slot(slots.clone(), false);
            let (o, f, sc) = (opts.clone(), fetch.clone(), slots.clone());
            tokio::task::spawn_local(handle(s, o, f, (id, rx), sc, slot));
        } else if sl.refusing < opts.max_connections {
            sl.refusing += 1;
            drop(sl);
            let slot = Slot(slots.clone(), true);
            tokio::task::spawn_local(refuse(s, opts.clone(), slot));
        }
        // Else: as many refusals as slots are under way; this one is closed unanswered.
    }
}

/// The listening socket systemd passed (`LISTEN_FDS`, fd 3), if any.
pub fn socket_from_systemd() -> Option<std::net::TcpListener> {
    use std::os::fd::FromRawFd;
    let pid: u32 = std::env::var("LISTEN_PID").ok()?.parse().ok()?;
    let fds: u32 = std::env::var("LISTEN_FDS").ok()?.parse().ok()?;
    if pid != std::process::id() || fds < 1 {
        return None;
    }
    // SAFETY: systemd passes fd 3 (SD_LISTEN_FDS_START) open for this process, and nothing
    // else in this process owns it.
    Some(unsafe { std::net::TcpListener::from_raw_fd(3) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        let cases: [(&[u8], Request); 8] = [
            (
                b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
                Request::Metrics { head: false },
            ),
            (
                b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n",
                Request::Metrics { head: true },
            ),
            (b"GET / HTTP/1.1\r\n\r\n", Request::NotFound),
            (b"POST /metrics HTTP/1.1\r\n\r\n", Request::BadMethod),
            (b"\x00\xff garbage", Request::Malformed),
            (b"GET /metrics\r\n\r\n", Request::Malformed),
            (b"GET metrics HTTP/1.1\r\n\r\n", Request::Malformed),
            (b"GET /metrics SMTP/1 extra\r\n\r\n", Request::Malformed),
        ];
        for (head, want) in cases {
            let line = String::from_utf8_lossy(head);
            assert_eq!(parse_request(head), want, "{line:?}");
        }
    }
}
