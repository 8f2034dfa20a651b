//! A minimal blocking D-Bus client for the one call on the path of every `gpuctl run` and
//! `gpuctl shell`: `Join(s) -> (a{ss}, s)`.
//!
//! Why not zbus here: the whole point of `gpuctl run` is to get out of the way, and setting up
//! a zbus connection (an async runtime, its reader task, the `Hello` round trip before the first
//! call) cost more than the placement itself in the VM benchmark (`vm-tests/scenarios/63-*`).
//! This client writes the authentication, `Hello` and the call in one go and reads until the
//! call's reply, so the bus round trips overlap; it is the same pipelining sd-bus clients such
//! as `systemd-run` do. Everything else in gpuctl (and any address this client does not handle)
//! goes through zbus.
//!
//! What it speaks: SASL `EXTERNAL` on a `unix:path=` socket, little-endian messages out, either
//! byte order in, header fields of the types a bus sends (`s`, `o`, `g`, `u`), and the two reply
//! bodies it needs (`a{ss}s` and an error's leading `s`). No file descriptors, no signals
//! (ignored), no introspection.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the system bus listens unless `DBUS_SYSTEM_BUS_ADDRESS` says otherwise: the D-Bus
/// specification's default, which zbus (every other call of ours) and libdbus use too.
pub const SYSTEM_BUS_SOCKET: &str = "/var/run/dbus/system_bus_socket";

/// Longest reply accepted: a team's environment is a handful of short variables, so anything
/// near this is not a reply of ours.
const MAX_MESSAGE: usize = 1 << 20;

/// How long to wait for the reply. gpuctld waits up to 30 s for systemd's job itself.
const REPLY_TIMEOUT: Duration = Duration::from_secs(90);

/// What went wrong, in terms the caller maps to exit codes.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The socket could not be opened (no bus, or no permission).
    #[error("{}: {source}", path.display())]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Reading or writing failed after connecting (the bus closed the connection, a timeout).
    #[error("system bus: {0}")]
    Io(io::Error),
    /// The bus refused the authentication.
    #[error("system bus refused authentication: {0}")]
    Auth(String),
    /// Something that is not the D-Bus protocol as this client knows it.
    #[error("system bus: unexpected data: {0}")]
    Protocol(String),
    /// The call was answered with a D-Bus error.
    #[error("{}", message.as_deref().unwrap_or(name))]
    Method {
        /// The error name, e.g. `org.gpuctl.Agent1.Error.NotMember`.
        name: String,
        /// Its message, when it carried one.
        message: Option<String>,
    },
}

fn proto(s: impl Into<String>) -> WireError {
    WireError::Protocol(s.into())
}

/// The socket of the first `unix:path=` entry of a D-Bus address list (`%xx` unescaped);
/// `None` when the list has no such entry (abstract sockets, tcp, …: left to zbus).
pub fn socket_of_address(address: &str) -> Option<PathBuf> {
    address.split(';').find_map(|entry| {
        let rest = entry.strip_prefix("unix:")?;
        let v = rest.split(',').find_map(|kv| kv.strip_prefix("path="))?;
        unescape(v).map(PathBuf::from)
    })
}

fn unescape(v: &str) -> Option<String> {
    let mut parts = v.split('%');
    let mut out = parts.next()?.as_bytes().to_vec();
    for p in parts {
        out.push(u8::from_str_radix(p.get(..2)?, 16).ok()?);
        out.extend(&p.as_bytes()[2..]);
    }
    String::from_utf8(out).ok()
}

/// The system bus socket this process would use: from `DBUS_SYSTEM_BUS_ADDRESS` when set
/// (`None` when it names no `unix:path=`), else [`SYSTEM_BUS_SOCKET`].
pub fn system_bus_socket() -> Option<PathBuf> {
    match std::env::var("DBUS_SYSTEM_BUS_ADDRESS") {
        Ok(a) => socket_of_address(&a),
        Err(_) => Some(PathBuf::from(SYSTEM_BUS_SOCKET)),
    }
}

/// Call `Join(team)` on gpuctld through the bus at `socket`, or `JoinWith(team, options)` when
/// there are options (so a plain `gpuctl run` still speaks to a gpuctld without `JoinWith`);
/// returns the environment and the scope's name.
pub fn join(
    socket: &Path,
    team: &str,
    options: &BTreeMap<String, String>,
) -> Result<(BTreeMap<String, String>, String), WireError> {
    let mut body = Vec::new();
    put_string(&mut body, team);
    let (member, signature) = if options.is_empty() {
        ("Join", "s")
    } else {
        put_string_map(&mut body, options);
        ("JoinWith", "sa{ss}")
    };
    let reply = call(
        socket,
        &Call {
            destination: super::BUS_NAME,
            path: super::OBJECT_PATH,
            interface: "org.gpuctl.Agent1",
            member,
            signature,
            body: &body,
        },
    )?;
    join_reply(&reply)
}

/// The `wait` option (milliseconds) of a `JoinWith` body this client marshalled.
fn wait_of(body: &[u8]) -> Option<Duration> {
    let mut r = Reader::new(body, false);
    r.string().ok()?;
    let len = r.u32().ok()? as usize;
    r.align(8).ok()?;
    let end = r.pos + len;
    while r.pos < end {
        r.align(8).ok()?;
        let (k, v) = (r.string().ok()?, r.string().ok()?);
        if k == "wait" {
            return v.parse().ok().map(Duration::from_millis);
        }
    }
    None
}

/// Marshal an `a{ss}`, little-endian, aligned relative to the start of `m`.
pub fn put_string_map(m: &mut Vec<u8>, map: &BTreeMap<String, String>) {
    pad(m, 4);
    let len_at = m.len();
    m.extend([0u8; 4]);
    // The array's length counts from its first element, which is 8-aligned (a dict entry).
    pad(m, 8);
    let start = m.len();
    for (k, v) in map {
        pad(m, 8);
        put_string(m, k);
        put_string(m, v);
    }
    let len = (m.len() - start) as u32;
    m[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
}

/// The body of a `Join` reply: the environment and the scope name.
pub fn join_reply(reply: &Reply) -> Result<(BTreeMap<String, String>, String), WireError> {
    if reply.signature != "a{ss}s" {
        return Err(proto(format!(
            "Join replied with signature '{}', expected 'a{{ss}}s'",
            reply.signature
        )));
    }
    let mut r = Reader::new(&reply.body, reply.big_endian);
    let len = r.u32()? as usize;
    r.align(8)?;
    let end = r
        .pos
        .checked_add(len)
        .ok_or_else(|| proto("array length"))?;
    let mut env = BTreeMap::new();
    while r.pos < end {
        r.align(8)?;
        let k = r.string()?;
        let v = r.string()?;
        env.insert(k, v);
    }
    if r.pos != end {
        return Err(proto("array overruns its length"));
    }
    let scope = r.string()?;
    Ok((env, scope))
}

/// One method call.
pub struct Call<'a> {
    /// Destination bus name.
    pub destination: &'a str,
    /// Object path.
    pub path: &'a str,
    /// Interface.
    pub interface: &'a str,
    /// Method.
    pub member: &'a str,
    /// Body signature (empty for none).
    pub signature: &'a str,
    /// Body, marshalled little-endian from offset 0 (message bodies start 8-aligned).
    pub body: &'a [u8],
}

/// A method return.
#[derive(Debug)]
pub struct Reply {
    /// Body signature.
    pub signature: String,
    /// Body bytes; alignment is relative to their start.
    pub body: Vec<u8>,
    /// Whether the body is big-endian.
    pub big_endian: bool,
}

const METHOD_CALL: u8 = 1;
const METHOD_RETURN: u8 = 2;
const ERROR: u8 = 3;

/// Connect, authenticate, `Hello`, call; all written at once, then read until the call's
/// reply.
pub fn call(socket: &Path, c: &Call<'_>) -> Result<Reply, WireError> {
    let mut s = UnixStream::connect(socket).map_err(|source| WireError::Connect {
        path: socket.to_path_buf(),
        source,
    })?;
    // A `--wait` call is answered when a device frees: no deadline but the one it carries.
    let wait = (c.member == "JoinWith")
        .then(|| wait_of(c.body))
        .flatten()
        .unwrap_or_default();
    s.set_read_timeout(Some(REPLY_TIMEOUT + wait))
        .map_err(WireError::Io)?;

    let uid = nix::unistd::getuid().as_raw().to_string();
    let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
    let mut out = format!("\0AUTH EXTERNAL {hex}\r\nBEGIN\r\n").into_bytes();
    out.extend(message(
        1,
        &Call {
            destination: "org.freedesktop.DBus",
            path: "/org/freedesktop/DBus",
            interface: "org.freedesktop.DBus",
            member: "Hello",
            signature: "",
            body: &[],
        },
    ));
    out.extend(message(2, c));
    s.write_all(&out).map_err(WireError::Io)?;

    let mut buf = Vec::with_capacity(4096);
    let line_end = loop {
        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
            break i;
        }
        if buf.len() > 4096 {
            return Err(WireError::Auth("no end of line in the reply".into()));
        }
        fill(&mut s, &mut buf)?;
    };
    let line = String::from_utf8_lossy(&buf[..line_end]).into_owned();
    if !line.starts_with("OK ") {
        return Err(WireError::Auth(line));
    }
    buf.drain(..line_end + 2);
    let reply = read_reply(&mut buf, |b| fill(&mut s, b).map(|()| true))?;
    Ok(reply.expect("fill fails rather than run dry"))
}

/// Whole messages from `buf`, topped up by `more` (`Ok(false)`: no more bytes), until the call's
/// reply (`Some`), its error, or the end of the bytes (`None`).
fn read_reply(
    buf: &mut Vec<u8>,
    mut more: impl FnMut(&mut Vec<u8>) -> Result<bool, WireError>,
) -> Result<Option<Reply>, WireError> {
    loop {
        while buf.len() < 16 {
            if !more(buf)? {
                return Ok(None);
            }
        }
        let f = frame(&buf[..16])?;
        while buf.len() < f.total {
            if !more(buf)? {
                return Ok(None);
            }
        }
        let msg: Vec<u8> = buf.drain(..f.total).collect();
        if let Some(r) = handle(&msg, &f)? {
            return Ok(Some(r));
        }
    }
}

/// One whole message: `Some` for the call's reply, `Err` for its error (or a malformed
/// message), `None` for anything else (Hello's reply, signals).
fn handle(msg: &[u8], f: &Frame) -> Result<Option<Reply>, WireError> {
    let big = f.big;
    let h = parse_header(msg, big, f.fields_len)?;
    let body = msg
        .get(f.header_len..)
        .ok_or_else(|| proto("message ends inside its header"))?;
    match (h.kind, h.reply_serial) {
        (METHOD_RETURN, Some(2)) => Ok(Some(Reply {
            signature: h.signature,
            body: body.to_vec(),
            big_endian: big,
        })),
        (ERROR, Some(serial @ (1 | 2))) => {
            let name = h.error_name.unwrap_or_else(|| "unnamed error".into());
            let message = if h.signature.starts_with('s') {
                Reader::new(body, big).string().ok()
            } else {
                None
            };
            let name = if serial == 1 {
                format!("{name} (Hello)")
            } else {
                name
            };
            Err(WireError::Method { name, message })
        }
        // Hello's reply, NameAcquired and any other signal: not what we wait for.
        _ => Ok(None),
    }
}

/// What the client makes of `stream`, the bytes a bus sends after `OK <guid>\r\n`: the reply
/// to the call (serial 2), its error, or `Ok(None)` when the stream ends first. The same
/// framing and parsing as [`call`], without a socket, for tests and the fuzzer.
pub fn parse_stream(stream: &[u8]) -> Result<Option<Reply>, WireError> {
    read_reply(&mut stream.to_vec(), |_| Ok(false))
}

/// Sizes of a message, from its first 16 bytes.
struct Frame {
    big: bool,
    fields_len: usize,
    header_len: usize,
    total: usize,
}

fn frame(head: &[u8]) -> Result<Frame, WireError> {
    let big = match head[0] {
        b'l' => false,
        b'B' => true,
        b => return Err(proto(format!("byte-order mark {b:#04x}"))),
    };
    let u32_at = |pos| Reader { b: head, pos, big }.u32().map(|n| n as usize);
    let fields_len = u32_at(12)?;
    let header_len = (16 + fields_len).next_multiple_of(8);
    let total = header_len.saturating_add(u32_at(4)?);
    if total > MAX_MESSAGE {
        return Err(proto(format!("a {total}-byte message")));
    }
    Ok(Frame {
        big,
        fields_len,
        header_len,
        total,
    })
}

fn fill(s: &mut UnixStream, buf: &mut Vec<u8>) -> Result<(), WireError> {
    let mut chunk = [0u8; 4096];
    let n = s.read(&mut chunk).map_err(WireError::Io)?;
    if n == 0 {
        return Err(WireError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the bus closed the connection",
        )));
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

struct Header {
    kind: u8,
    reply_serial: Option<u32>,
    error_name: Option<String>,
    signature: String,
}

fn parse_header(msg: &[u8], big: bool, fields_len: usize) -> Result<Header, WireError> {
    let mut h = Header {
        kind: msg[1],
        reply_serial: None,
        error_name: None,
        signature: String::new(),
    };
    let mut r = Reader::new(msg, big);
    r.pos = 16;
    let end = 16 + fields_len;
    while r.pos < end {
        r.align(8)?;
        let code = r.u8()?;
        let sig = r.signature()?;
        match (code, sig.as_str()) {
            (5, "u") => h.reply_serial = Some(r.u32()?),
            (4, "s") => h.error_name = Some(r.string()?),
            (8, "g") => h.signature = r.signature()?,
            (_, "s" | "o") => _ = r.string()?,
            (_, "g") => _ = r.signature()?,
            (_, "u") => _ = r.u32()?,
            (c, s) => return Err(proto(format!("header field {c} of type '{s}'"))),
        }
    }
    Ok(h)
}

/// A method call message, little-endian.
fn message(serial: u32, c: &Call<'_>) -> Vec<u8> {
    let mut m = vec![b'l', METHOD_CALL, 0, 1];
    m.extend((c.body.len() as u32).to_le_bytes());
    m.extend(serial.to_le_bytes());
    m.extend([0u8; 4]); // header fields length, filled in below
    let field = |m: &mut Vec<u8>, code: u8, sig: u8| {
        pad(m, 8);
        m.extend([code, 1, sig, 0]);
    };
    for (code, sig, value) in [
        (1, b'o', c.path),
        (2, b's', c.interface),
        (3, b's', c.member),
        (6, b's', c.destination),
    ] {
        field(&mut m, code, sig);
        put_string(&mut m, value);
    }
    if !c.signature.is_empty() {
        field(&mut m, 8, b'g');
        m.push(c.signature.len() as u8);
        m.extend(c.signature.as_bytes());
        m.push(0);
    }
    let fields_len = (m.len() - 16) as u32;
    m[12..16].copy_from_slice(&fields_len.to_le_bytes());
    pad(&mut m, 8);
    m.extend(c.body);
    m
}

fn pad(m: &mut Vec<u8>, to: usize) {
    while m.len() % to != 0 {
        m.push(0);
    }
}

/// Marshal a string (`s` or `o`), little-endian, aligned relative to the start of `m`.
pub fn put_string(m: &mut Vec<u8>, s: &str) {
    pad(m, 4);
    m.extend((s.len() as u32).to_le_bytes());
    m.extend(s.as_bytes());
    m.push(0);
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    big: bool,
}

impl<'a> Reader<'a> {
    fn new(b: &'a [u8], big: bool) -> Self {
        Reader { b, pos: 0, big }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| proto("message ends early"))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn align(&mut self, n: usize) -> Result<(), WireError> {
        let to = self.pos.next_multiple_of(n);
        self.take(to - self.pos).map(|_| ())
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        self.align(4)?;
        let a: [u8; 4] = self.take(4)?.try_into().expect("4 bytes");
        Ok(if self.big {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        })
    }

    fn text(&mut self, len: usize) -> Result<String, WireError> {
        let s = self.take(len)?;
        if self.take(1)? != [0] {
            return Err(proto("string without its terminating NUL"));
        }
        // D-Bus strings contain no NUL; one inside would cut an environment value short
        // wherever it is used as a C string.
        if s.contains(&0) {
            return Err(proto("string with a NUL byte inside"));
        }
        String::from_utf8(s.to_vec()).map_err(|_| proto("string is not UTF-8"))
    }

    fn string(&mut self) -> Result<String, WireError> {
        let len = self.u32()? as usize;
        self.text(len)
    }

    fn signature(&mut self) -> Result<String, WireError> {
        let len = self.u8()? as usize;
        self.text(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::HashMap;

    #[test]
    fn the_default_socket_is_the_one_zbus_uses() {
        // One default for the hand-written Join client and the zbus calls: what zbus resolves
        // with the variable unset (as it is in a plain `cargo test`).
        if std::env::var_os("DBUS_SYSTEM_BUS_ADDRESS").is_none() {
            let zbus_default = zbus::Address::system().unwrap().to_string();
            assert_eq!(
                socket_of_address(&zbus_default),
                Some(PathBuf::from(SYSTEM_BUS_SOCKET)),
                "{zbus_default}"
            );
        }
    }

    #[test]
    fn addresses_name_their_unix_path() {
        assert_eq!(
            socket_of_address("unix:path=/run/dbus/system_bus_socket"),
            Some(PathBuf::from("/run/dbus/system_bus_socket"))
        );
        assert_eq!(
            socket_of_address("unix:abstract=/x;unix:guid=1,path=/tmp/a%20b"),
            Some(PathBuf::from("/tmp/a b"))
        );
        assert_eq!(socket_of_address("tcp:host=localhost,port=1"), None);
        assert_eq!(socket_of_address("unix:path=/bad%zz"), None);
    }

    #[test]
    fn a_call_round_trips_through_zbus_parser() {
        let mut body = Vec::new();
        put_string(&mut body, "infer");
        let bytes = message(
            7,
            &Call {
                destination: "org.gpuctl.Agent1",
                path: "/org/gpuctl/Agent1",
                interface: "org.gpuctl.Agent1",
                member: "Join",
                signature: "s",
                body: &body,
            },
        );
        let data = zbus::zvariant::serialized::Data::new(
            bytes,
            zbus::zvariant::serialized::Context::new_dbus(zbus::zvariant::LE, 0),
        );
        // SAFETY: the bytes carry no file descriptors.
        let msg = unsafe { zbus::Message::from_bytes(data) }.expect("zbus parses our call");
        let h = msg.header();
        assert_eq!(h.primary().serial_num().get(), 7);
        assert_eq!(h.member().map(|m| m.as_str()), Some("Join"));
        assert_eq!(h.interface().map(|m| m.as_str()), Some("org.gpuctl.Agent1"));
        assert_eq!(h.path().map(|m| m.as_str()), Some("/org/gpuctl/Agent1"));
        assert_eq!(
            h.destination().map(|m| m.to_string()),
            Some("org.gpuctl.Agent1".to_string())
        );
        let team: String = msg.body().deserialize().expect("body is one string");
        assert_eq!(team, "infer");
    }

    #[test]
    fn join_with_options_round_trips_through_zbus_parser() {
        let mut body = Vec::new();
        put_string(&mut body, "interns");
        let opts: BTreeMap<String, String> = [("device", "MIG-1"), ("gpus", "1")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        put_string_map(&mut body, &opts);
        let bytes = message(
            3,
            &Call {
                destination: "org.gpuctl.Agent1",
                path: "/org/gpuctl/Agent1",
                interface: "org.gpuctl.Agent1",
                member: "JoinWith",
                signature: "sa{ss}",
                body: &body,
            },
        );
        let data = zbus::zvariant::serialized::Data::new(
            bytes,
            zbus::zvariant::serialized::Context::new_dbus(zbus::zvariant::LE, 0),
        );
        // SAFETY: the bytes carry no file descriptors.
        let msg = unsafe { zbus::Message::from_bytes(data) }.expect("zbus parses our call");
        let (team, got): (String, HashMap<String, String>) =
            msg.body().deserialize().expect("body is (s, a{ss})");
        assert_eq!(team, "interns");
        assert_eq!(got.into_iter().collect::<BTreeMap<_, _>>(), opts);
        assert_eq!(wait_of(&body), None);
        let mut with_wait = opts.clone();
        with_wait.insert("wait".into(), "1500".into());
        let mut b = Vec::new();
        put_string(&mut b, "interns");
        put_string_map(&mut b, &with_wait);
        assert_eq!(wait_of(&b), Some(Duration::from_millis(1500)));
        // An empty map too (alignment with nothing after the length).
        let mut body = Vec::new();
        put_string(&mut body, "abc");
        put_string_map(&mut body, &BTreeMap::new());
        let bytes = message(
            4,
            &Call {
                destination: "org.gpuctl.Agent1",
                path: "/org/gpuctl/Agent1",
                interface: "org.gpuctl.Agent1",
                member: "JoinWith",
                signature: "sa{ss}",
                body: &body,
            },
        );
        let ctx = zbus::zvariant::serialized::Context::new_dbus(zbus::zvariant::LE, 0);
        let data = zbus::zvariant::serialized::Data::new(bytes, ctx);
        // SAFETY: the bytes carry no file descriptors.
        let msg = unsafe { zbus::Message::from_bytes(data) }.expect("zbus parses our call");
        let (t, m): (String, HashMap<String, String>) = msg.body().deserialize().expect("parses");
        assert_eq!((t.as_str(), m.len()), ("abc", 0));
    }

    #[test]
    fn strings_with_an_interior_nul_are_refused() {
        let mut b = Vec::new();
        put_string(&mut b, "a\0b");
        let e = Reader::new(&b, false).string().unwrap_err();
        assert!(e.to_string().contains("NUL byte inside"), "{e}");
        let mut b = Vec::new();
        put_string(&mut b, "ab");
        assert_eq!(Reader::new(&b, false).string().unwrap(), "ab");
    }

    #[test]
    fn truncated_or_unterminated_strings_are_protocol_errors() {
        let mut r = Reader::new(&[5, 0, 0, 0, b'a', b'b'], false);
        assert!(matches!(r.string(), Err(WireError::Protocol(_))));
        let mut r = Reader::new(&[1, 0, 0, 0, b'a', b'b'], false);
        assert!(matches!(r.string(), Err(WireError::Protocol(_))));
        let mut r = Reader::new(&[0, 0, 0, 1, b'a', 0], true);
        assert_eq!(r.string().unwrap(), "a");
    }

    /// A stand-in bus on a socket: reads the client's authentication and two messages, checks
    /// them, and answers with `answer(join_call)`'s bytes after `OK`.
    fn fake_bus(
        answer: impl FnOnce(&zbus::Message) -> Vec<zbus::Message> + Send + 'static,
    ) -> (tempfile::TempDir, PathBuf, std::thread::JoinHandle<()>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bus");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = Vec::new();
            let begin = loop {
                if let Some(i) = buf.windows(7).position(|w| w == b"BEGIN\r\n") {
                    break i + 7;
                }
                fill(&mut s, &mut buf).unwrap();
            };
            assert!(buf.starts_with(b"\0AUTH EXTERNAL "), "{buf:?}");
            buf.drain(..begin);
            let mut msgs = Vec::new();
            while msgs.len() < 2 {
                while buf.len() < 16 {
                    fill(&mut s, &mut buf).unwrap();
                }
                let total = frame(&buf[..16]).unwrap().total;
                while buf.len() < total {
                    fill(&mut s, &mut buf).unwrap();
                }
                let bytes: Vec<u8> = buf.drain(..total).collect();
                let ctx = zbus::zvariant::serialized::Context::new_dbus(zbus::zvariant::LE, 0);
                let data = zbus::zvariant::serialized::Data::new(bytes, ctx);
                // SAFETY: no file descriptors travel here.
                msgs.push(unsafe { zbus::Message::from_bytes(data) }.unwrap());
            }
            assert_eq!(msgs[0].header().member().unwrap().as_str(), "Hello");
            assert_eq!(msgs[1].header().member().unwrap().as_str(), "Join");
            let mut out = b"OK 0123456789abcdef0123456789abcdef\r\n".to_vec();
            for m in answer(&msgs[1]) {
                out.extend_from_slice(m.data().bytes());
            }
            s.write_all(&out).unwrap();
        });
        (dir, path, t)
    }

    #[test]
    fn big_endian_replies_after_signals_and_hellos_reply_are_read() {
        use zbus::zvariant::Endian;
        let (_d, path, t) = fake_bus(|join| {
            let hello = zbus::Message::method_call("/org/freedesktop/DBus", "Hello")
                .unwrap()
                .serial(std::num::NonZeroU32::new(1).unwrap())
                .build(&())
                .unwrap();
            let env: HashMap<&str, &str> = [
                ("CUDA_VISIBLE_DEVICES", "MIG-1"),
                ("GPUCTL_TEAM", "infer"),
                ("E", ""),
            ]
            .into();
            vec![
                zbus::Message::signal(
                    "/org/freedesktop/DBus",
                    "org.freedesktop.DBus",
                    "NameAcquired",
                )
                .unwrap()
                .endian(Endian::Big)
                .build(&":1.9")
                .unwrap(),
                zbus::Message::method_return(&hello.header())
                    .unwrap()
                    .endian(Endian::Big)
                    .build(&":1.9")
                    .unwrap(),
                zbus::Message::method_return(&join.header())
                    .unwrap()
                    .endian(Endian::Big)
                    .build(&(env, "gpuctl-run-infer-9.scope"))
                    .unwrap(),
            ]
        });
        let (env, scope) = join(&path, "infer", &BTreeMap::new()).unwrap();
        t.join().unwrap();
        assert_eq!(scope, "gpuctl-run-infer-9.scope");
        assert_eq!(env.len(), 3);
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "MIG-1");
        assert_eq!(env["GPUCTL_TEAM"], "infer");
        assert_eq!(env["E"], "");
    }

    #[test]
    fn a_big_endian_error_keeps_its_name_and_message_and_a_wrong_signature_is_refused() {
        let (_d, path, t) = fake_bus(|join| {
            vec![
                zbus::Message::error(&join.header(), "org.gpuctl.Agent1.Error.NoDevices")
                    .unwrap()
                    .endian(zbus::zvariant::Endian::Big)
                    .build(&"team \"x\" has no GPU")
                    .unwrap(),
            ]
        });
        match join(&path, "x", &BTreeMap::new()) {
            Err(WireError::Method { name, message }) => {
                assert_eq!(name, "org.gpuctl.Agent1.Error.NoDevices");
                assert_eq!(message.as_deref(), Some("team \"x\" has no GPU"));
            }
            other => panic!("{other:?}"),
        }
        t.join().unwrap();
        let (_d, path, t) = fake_bus(|join| {
            vec![zbus::Message::method_return(&join.header())
                .unwrap()
                .build(&"just a string")
                .unwrap()]
        });
        assert!(matches!(
            join(&path, "x", &BTreeMap::new()),
            Err(WireError::Protocol(_))
        ));
        t.join().unwrap();
    }
}
