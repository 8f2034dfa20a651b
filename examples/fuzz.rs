//! Structure-aware fuzzing of the two parsers that take input from outside: the policy
//! parser+validator (a file any admin or config tool writes) and the wire client's reply parser
//! (bytes from the system bus).
//!
//! ```sh
//! cargo run --example fuzz -- --seconds 30                      # each target 30 s (CI: .ci/run; debug: overflow checks)
//! cargo run --release --example fuzz -- --seconds 3600 --seed 7 # the longer run (docs/fuzzing.md)
//! cargo run --example fuzz -- --target policy --seed S --execs N   # replay a failure (the profile it failed in)
//! ```
//!
//! Without `--seed` each run takes a new seed (from the clock and the pid), so CI explores new
//! inputs every time; the seed is printed first, and a failure prints the command that replays
//! it: the inputs are a pure function of the seed and the target.
//!
//! Why not coverage-guided: `cargo afl` needs AFL++ built from source and LLVM plugins matching
//! the toolchain, and `cargo fuzz` needs nightly; neither is on this stable toolchain (see
//! docs/fuzzing.md for what was tried). Instead each input is generated from the grammar the
//! parser expects (every key, values at and around every bound, wrong types, control
//! characters, huge numbers and lists) and then mutated at the byte level, so both deep and
//! malformed inputs are reached. Every execution runs under `catch_unwind` and is timed: a panic
//! or an execution over 1 s of CPU time is a failure, printed with its input (and saved under
//! `--out`). CPU time, not wall time: CI runs this niced beside the VM tests, where a wait for the
//! CPU is no finding. A watchdog thread aborts the run, printing the input, if one execution
//! takes over 60 s of wall time.

use gpuctl::observe::{GpuState, MigState, Observed};
use gpuctl::policy::parse::parse_fragment;
use gpuctl::policy::validate::{build, check_against_host};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The CPU time this thread has used.
fn thread_cpu() -> Duration {
    let mut ts = nix::libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; the clock id is a constant every Linux has.
    let rc = unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// SplitMix64: small, fast, reproducible from `--seed`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

const KEYS_HOST: &[&str] = &[
    "reconfigure",
    "drain-timeout",
    "nvml-library",
    "admin-group",
    "mps-control",
];
/// The team settings' keys come from the one settings table, so a new setting is fuzzed too.
const KEYS_TEAM: &[&str] = gpuctl::settings::KEYS;
const KEYS_MPS: &[&str] = &["active-thread-percentage", "pinned-memory-limit", "user"];
const PROFILES: &[&str] = &[
    "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.5gb", "3g.20gb",
    "1g.12gb", "7g.40gb", "bogus",
];
const WORDS: &[&str] = &[
    "infer",
    "train",
    "a",
    "b",
    "ml_team",
    "@ml-infer",
    "alice",
    "root",
    "x-y",
    "",
    "GPU-00000000-1111-2222-3333-000000000000",
    "GPU-../../etc",
    "*H100*",
    "h100-80gb",
    "when-idle",
    "drain",
    "never",
    "infinity",
    "25%",
    "100%",
    "0%",
    "12.5%",
    "64G",
    "63M",
    "1T",
    "99999999999T",
    "0",
    "5m",
    "1h30m",
    "0s",
    "4294967295d4294967295d",
    "0-7,16",
    "0-65535",
    "3-1",
    "/usr/lib/x.so",
    "rel/path",
    "\u{1b}[31m",
    "a\u{0}b",
    "line\nbreak",
    "ünïcödé",
    "1c",
    "2c",
    "7c",
];

fn scalar(r: &mut Rng) -> String {
    match r.below(10) {
        0 => format!("{}", r.next() as i64),
        1 => format!("{}", r.below(20) as i64 - 2),
        2 => format!(
            "{}",
            [
                0u64,
                1,
                7,
                8,
                100,
                101,
                10_000,
                10_001,
                1 << 26,
                u32::MAX as u64
            ][r.below(10)]
        ),
        3 => ["true", "false", "1.5", "-0.0", "nan", "inf", "1979-05-27"][r.below(7)].into(),
        4 => format!("{:?}", "x".repeat(r.below(300))),
        5 => {
            let n = r.below(8);
            let items: Vec<String> = (0..n).map(|_| scalar(r)).collect();
            format!("[{}]", items.join(", "))
        }
        6 => format!("{{ {} = {} }}", r.pick(KEYS_TEAM), scalar_simple(r)),
        _ => format!("{:?}", r.pick(WORDS)),
    }
}

fn scalar_simple(r: &mut Rng) -> String {
    match r.below(3) {
        0 => format!("{}", r.below(200)),
        _ => format!("{:?}", r.pick(WORDS)),
    }
}

fn list_of_words(r: &mut Rng, max: usize) -> String {
    let n = if r.chance(40) {
        2000 + r.below(3000)
    } else {
        r.below(max)
    };
    let items: Vec<String> = (0..n)
        .map(|i| {
            if r.chance(3) {
                format!("\"u{i}\"")
            } else {
                format!("{:?}", r.pick(WORDS))
            }
        })
        .collect();
    format!("[{}]", items.join(", "))
}

fn team_name(r: &mut Rng) -> String {
    if r.chance(10) {
        format!("{:?}", r.pick(WORDS))
    } else {
        ["infer", "train", "a", "b", "ml_team"][r.below(5)].to_string()
    }
}

/// A policy file from the grammar, values at and around the rules' bounds.
fn gen_policy(r: &mut Rng) -> String {
    let mut s = String::new();
    if !r.chance(20) {
        s.push_str(if r.chance(30) {
            "version = 2\n"
        } else {
            "version = 1\n"
        });
    }
    if r.chance(2) {
        s.push_str("[host]\n");
        for _ in 0..r.below(4) {
            let k = r.pick(KEYS_HOST);
            s.push_str(&format!("{k} = {}\n", scalar(r)));
        }
    }
    for _ in 0..r.below(5) {
        let t = team_name(r);
        s.push_str(&format!("[teams.{t}]\n"));
        if r.chance(2) {
            s.push_str(&format!("members = {}\n", list_of_words(r, 6)));
        }
        for _ in 0..r.below(5) {
            s.push_str(&format!("{} = {}\n", r.pick(KEYS_TEAM), scalar(r)));
        }
        if r.chance(3) {
            s.push_str(&format!("[teams.{t}.mps]\n"));
            for _ in 0..r.below(4) {
                s.push_str(&format!("{} = {}\n", r.pick(KEYS_MPS), scalar(r)));
            }
        }
    }
    for _ in 0..r.below(5) {
        s.push_str("[[gpu]]\n");
        match r.below(5) {
            0 => {
                let n = if r.chance(30) { 3000 } else { r.below(9) };
                let idx: Vec<String> = (0..n).map(|_| r.below(12).to_string()).collect();
                s.push_str(&format!("index = [{}]\n", idx.join(", ")));
            }
            1 => s.push_str(&format!("uuid = {}\n", scalar(r))),
            2 => s.push_str(&format!("model = {:?}\n", r.pick(WORDS))),
            3 => s.push_str("all = true\n"),
            _ => s.push_str(&format!(
                "{} = {}\n",
                r.pick(&["index", "uuid", "model", "all"]),
                scalar(r)
            )),
        }
        match r.below(4) {
            0 => s.push_str(&format!("owner = {:?}\n", team_name(r))),
            1 => s.push_str(&format!("shared = {}\n", list_of_words(r, 4))),
            _ => {
                let n = r.below(9);
                let items: Vec<String> = (0..n)
                    .map(|_| {
                        let mut e = format!(
                            "{{ profile = {:?}, owner = {:?}",
                            r.pick(PROFILES),
                            team_name(r)
                        );
                        if r.chance(2) {
                            e.push_str(&format!(", count = {}", r.below(9)));
                        }
                        if r.chance(3) {
                            e.push_str(&format!(", compute = {}", list_of_words(r, 4)));
                        }
                        e.push_str(" }");
                        e
                    })
                    .collect();
                s.push_str(&format!("mig = [{}]\n", items.join(", ")));
            }
        }
    }
    s
}

/// Byte-level mutations, kept to UTF-8 (the loader refuses other bytes before parsing).
fn mutate(r: &mut Rng, text: &str) -> String {
    let mut b = text.as_bytes().to_vec();
    for _ in 0..1 + r.below(4) {
        if b.is_empty() {
            b.push(b'[');
        }
        let at = r.below(b.len());
        match r.below(7) {
            0 => b[at] = r.pick(b"[]{}=\",.\n#'\\-0123456789%@*").to_owned(),
            1 => {
                b.remove(at);
            }
            2 => b.insert(at, r.pick(b"[]{}=\",\n\0\x1b\x7f").to_owned()),
            3 => {
                let end = (at + r.below(64)).min(b.len());
                let chunk = b[at..end].to_vec();
                b.splice(at..at, chunk);
            }
            4 => b.truncate(at),
            5 => {
                let w = r.pick(WORDS).as_bytes().to_vec();
                b.splice(at..at, w);
            }
            _ => b[at] ^= 1 << r.below(7),
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

fn host(r: &mut Rng) -> Observed {
    let models = gpuctl::profiles::Catalog::get().models();
    let mut o = Observed::default();
    for i in 0..r.below(4) as u32 {
        let m = r.pick(models);
        o.gpus.push(GpuState {
            index: i,
            uuid: format!("GPU-00000000-1111-2222-3333-{i:012}"),
            name: m.nvml_name.clone(),
            model: Some(m.key.clone()),
            minor: i,
            memory_mib: m.memory_total_mib,
            mig: m.mig_capable().then(MigState::default),
            processes: vec![],
        });
    }
    o.host.cpus = [0, 8, 128][r.below(3)];
    o.host.memory_bytes = [0u64, 1 << 30, 1 << 40][r.below(3)];
    o
}

fn run_policy(text: &str, obs: &Observed) {
    let mut d = Vec::new();
    let frag = parse_fragment(Path::new("/etc/gpuctl/policy.toml"), text, &mut d);
    let frags: Vec<_> = frag.into_iter().collect();
    let p = build(&frags, &mut d);
    for x in &d {
        let _ = x.to_string();
    }
    if !d
        .iter()
        .any(|x| x.severity == gpuctl::policy::Severity::Error)
    {
        let _ = check_against_host(&p, obs);
    }
}

// ---- wire replies -----------------------------------------------------------------------

fn put_u32(m: &mut Vec<u8>, v: u32, big: bool) {
    m.extend(if big {
        v.to_be_bytes()
    } else {
        v.to_le_bytes()
    });
}

fn pad(m: &mut Vec<u8>, to: usize) {
    while m.len() % to != 0 {
        m.push(0);
    }
}

fn put_str(m: &mut Vec<u8>, s: &[u8], big: bool) {
    pad(m, 4);
    put_u32(m, s.len() as u32, big);
    m.extend(s);
    m.push(0);
}

fn put_sig(m: &mut Vec<u8>, s: &[u8]) {
    m.push(s.len() as u8);
    m.extend(s);
    m.push(0);
}

fn wire_word(r: &mut Rng) -> Vec<u8> {
    match r.below(5) {
        0 => vec![b'x'; r.below(200)],
        1 => b"a\0b".to_vec(),
        2 => vec![0xff, 0xfe],
        _ => r
            .pick(&["CUDA_VISIBLE_DEVICES", "GPU-0", "gpuctl-run-a-1.scope", ""])
            .as_bytes()
            .to_vec(),
    }
}

const FIELD_SIGS: [&[u8]; 6] = [b"s", b"o", b"g", b"u", b"v", b"ay"];

/// One message as a bus would send it, then possibly broken.
fn gen_message(r: &mut Rng) -> Vec<u8> {
    let big = r.chance(3);
    let kind = [2u8, 3, 4, 1, 0, 9][r.below(6)];
    let mut fields: Vec<u8> = Vec::new();
    let serial = [1u32, 2, 3, u32::MAX][r.below(4)];
    let sigs: [&[u8]; 6] = [b"a{ss}s", b"s", b"", b"a{ss}", b"as", b"a{sv}s"];
    let sig: &[u8] = sigs[r.below(sigs.len())];
    // Fields start at offset 16 of the message; alignment is relative to the message start.
    let mut buf = vec![0u8; 16];
    for f in 0..1 + r.below(5) {
        pad(&mut buf, 8);
        match (f, r.below(6)) {
            (0, _) | (_, 0) => {
                buf.push(5);
                put_sig(&mut buf, b"u");
                pad(&mut buf, 4);
                put_u32(&mut buf, serial, big);
            }
            (_, 1) => {
                buf.push(8);
                put_sig(&mut buf, sig);
            }
            (_, 2) => {
                buf.push(4);
                put_sig(&mut buf, b"s");
                let w = wire_word(r);
                put_str(&mut buf, &w, big);
            }
            (_, 3) => {
                buf.push(r.below(10) as u8);
                put_sig(&mut buf, FIELD_SIGS[r.below(FIELD_SIGS.len())]);
                let w = wire_word(r);
                put_str(&mut buf, &w, big);
            }
            _ => {
                buf.push(7);
                put_sig(&mut buf, b"s");
                put_str(&mut buf, b":1.1", big);
            }
        }
    }
    fields.extend(&buf[16..]);
    let fields_len = fields.len();
    pad(&mut buf, 8);
    let mut body = Vec::new();
    if r.chance(2) {
        // a{ss}s
        let mut arr = Vec::new();
        for _ in 0..r.below(6) {
            pad(&mut arr, 8);
            // Offsets inside the array are relative to the body start: 8 bytes precede it.
            let mut entry = Vec::new();
            let k = wire_word(r);
            let v = wire_word(r);
            put_str(&mut entry, &k, big);
            put_str(&mut entry, &v, big);
            arr.extend(entry);
        }
        put_u32(&mut body, arr.len() as u32, big);
        pad(&mut body, 8);
        body.extend(arr);
        let w = wire_word(r);
        put_str(&mut body, &w, big);
    } else {
        let w = wire_word(r);
        put_str(&mut body, &w, big);
    }
    let mut msg = buf;
    msg[0] = if big { b'B' } else { b'l' };
    msg[1] = kind;
    msg[3] = 1;
    let blen = body.len() as u32;
    let b4 = if big {
        blen.to_be_bytes()
    } else {
        blen.to_le_bytes()
    };
    msg[4..8].copy_from_slice(&b4);
    let fl = fields_len as u32;
    let f4 = if big {
        fl.to_be_bytes()
    } else {
        fl.to_le_bytes()
    };
    msg[12..16].copy_from_slice(&f4);
    msg.extend(body);
    if r.chance(2) {
        for _ in 0..1 + r.below(3) {
            if msg.is_empty() {
                break;
            }
            let at = r.below(msg.len());
            match r.below(4) {
                0 => msg[at] = r.next() as u8,
                1 => msg.truncate(at),
                2 => msg[at] ^= 1 << r.below(8),
                _ => {
                    let at = at & !3;
                    if at + 4 <= msg.len() {
                        msg[at..at + 4].copy_from_slice(&(r.next() as u32).to_le_bytes());
                    }
                }
            }
        }
    }
    msg
}

fn run_wire(stream: &[u8]) {
    if let Ok(Some(reply)) = gpuctl::dbus_api::wire::parse_stream(stream) {
        let _ = gpuctl::dbus_api::wire::join_reply(&reply);
    }
}

// ---- driver -----------------------------------------------------------------------------

struct Stats {
    execs: u64,
    panics: u64,
    slow: u64,
    max: Duration,
}

/// A seed of its own for each run: the clock's nanoseconds mixed with the pid.
fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    Rng(nanos ^ (u64::from(std::process::id()) << 32)).next()
}

fn main() {
    let mut seconds = 60u64;
    let mut seed: Option<u64> = None;
    let mut max_execs = u64::MAX;
    let mut out: Option<PathBuf> = None;
    let mut targets = vec!["policy".to_string(), "wire".to_string()];
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--seconds" => seconds = args[i + 1].parse().expect("--seconds N"),
            "--seed" => seed = Some(args[i + 1].parse().expect("--seed N")),
            "--execs" => max_execs = args[i + 1].parse().expect("--execs N"),
            "--out" => out = Some(PathBuf::from(&args[i + 1])),
            "--target" => targets = vec![args[i + 1].clone()],
            a => panic!("unknown argument {a}"),
        }
        i += 2;
    }
    let seed = seed.unwrap_or_else(fresh_seed);
    println!("FUZZ seed={seed} (replay: --seed {seed})");
    // Panics are counted, not printed one by one.
    std::panic::set_hook(Box::new(|_| {}));

    let current: Arc<Mutex<Vec<u8>>> = Arc::default();
    let started = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    {
        let (current, started) = (current.clone(), started.clone());
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            let s = started.load(Ordering::SeqCst);
            if s != 0 && epoch.elapsed().as_millis() as u64 > s + 60_000 {
                let input = current.lock().map(|c| c.clone()).unwrap_or_default();
                eprintln!(
                    "FUZZ HANG: one execution over 60 s; input ({} bytes):\n{}",
                    input.len(),
                    String::from_utf8_lossy(&input)
                );
                std::process::exit(3);
            }
        });
    }

    // Sorted: a replay picks the same corpus entries whatever order the directory lists.
    let mut paths: Vec<PathBuf> = std::fs::read_dir("policies")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    paths.sort();
    let corpus: Vec<String> = paths
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect();

    let mut failed = false;
    let mut total = 0u64;
    for target in &targets {
        let mut r = Rng(seed ^ if target == "wire" { 0x5eed } else { 0 });
        let mut st = Stats {
            execs: 0,
            panics: 0,
            slow: 0,
            max: Duration::ZERO,
        };
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let mut obs = host(&mut r);
        while Instant::now() < deadline && st.execs < max_execs {
            for _ in 0..64.min(max_execs - st.execs) {
                let input: Vec<u8> = match target.as_str() {
                    "policy" => {
                        let base = if !corpus.is_empty() && r.chance(3) {
                            r.pick(&corpus).clone()
                        } else {
                            gen_policy(&mut r)
                        };
                        if r.chance(2) {
                            mutate(&mut r, &base).into_bytes()
                        } else {
                            base.into_bytes()
                        }
                    }
                    _ => {
                        let mut s = Vec::new();
                        for _ in 0..1 + r.below(3) {
                            s.extend(gen_message(&mut r));
                        }
                        s
                    }
                };
                if st.execs % 256 == 0 {
                    obs = host(&mut r);
                    *current.lock().unwrap() = input.clone();
                }
                let t = thread_cpu();
                started.store(epoch.elapsed().as_millis() as u64, Ordering::SeqCst);
                let res = std::panic::catch_unwind(|| match target.as_str() {
                    "policy" => run_policy(&String::from_utf8_lossy(&input), &obs),
                    _ => run_wire(&input),
                });
                started.store(0, Ordering::SeqCst);
                let dt = thread_cpu().saturating_sub(t);
                st.execs += 1;
                st.max = st.max.max(dt);
                let bad = res.is_err() || dt > Duration::from_secs(1);
                if res.is_err() {
                    st.panics += 1;
                }
                if dt > Duration::from_secs(1) {
                    st.slow += 1;
                }
                if bad {
                    failed = true;
                    // The profile it failed in: an overflow panics only with debug checks.
                    let profile = if cfg!(debug_assertions) {
                        ""
                    } else {
                        "--release "
                    };
                    eprintln!(
                        "FUZZ FAILURE target={target} {} ({} ms) at execution {}; replay: \
                         cargo run {}--example fuzz -- --target {target} --seed {seed} \
                         --execs {}; input:\n{}",
                        if res.is_err() { "panic" } else { "slow" },
                        dt.as_millis(),
                        st.execs,
                        profile,
                        st.execs,
                        String::from_utf8_lossy(&input)
                    );
                    if let Some(dir) = &out {
                        let _ = std::fs::create_dir_all(dir);
                        let _ = std::fs::write(dir.join(format!("{target}-{}", st.execs)), &input);
                    }
                }
            }
        }
        total += st.execs;
        println!(
            "FUZZ target={target} seconds={seconds} seed={seed} execs={} panics={} slow_over_1s={} max_exec_ms={:.1}",
            st.execs,
            st.panics,
            st.slow,
            st.max.as_secs_f64() * 1000.0
        );
    }
    println!(
        "FUZZ total execs={total} result={}",
        if failed { "FAILED" } else { "ok" }
    );
    if failed {
        std::process::exit(1);
    }
}
