//! `gpuctl top`: who uses which GPU and MIG device, with teams, from gpuctld's `Usage` call
//! (so an unprivileged member sees what root sees). Live in a terminal (q to quit), `--once`
//! for scripts, `--json` for the typed document, `--team T` to filter.

use super::shell::{parse_reply, with_agent, Failure};
use crate::settings::value::{compact_bytes, human_bytes};
use crate::usage::{DeviceLease, GpuUsage, HiddenProcesses, MigUsage, ProcessUsage, Usage};
use clap::Args;
use std::time::Duration;

/// Arguments of `gpuctl top`.
#[derive(Debug, Args)]
#[command(
    after_long_help = "Per GPU and MIG device: owning team(s), memory used/total, \
utilisation (whole GPUs) or GPM activity (MIG devices on Hopper+), power and temperature, then \
each process with pid, user, team, unit (a Slurm job, or a container as `docker <short id>`) \
and GPU memory (of teams you are not a member of: \
their count and memory only, `(hidden)`, unless you are root or in the policy's \
`[host] admin-group`). `!` marks a stray: a process on a team's \
device outside that team's slice. `[idle]`, `[warned]`, `[stopping]`, `[activity unknown]`: \
flagged by its team's idle rule (`gpuctl idle`). `lease`: a placed `gpuctl run`/`shell` \
job holds the device (holder, team, scope, since; of other teams `(hidden)`). `n/a`: the driver does not offer the value (e.g. utilisation \
of a MIG device); never shown as 0.

Exit status: 0; 6 gpuctld not running; 2 other failure."
)]
pub struct TopArgs {
    /// Print one snapshot and exit (the default when stdout is not a terminal).
    #[arg(long)]
    pub once: bool,
    /// Print the `Usage` document as JSON (implies --once).
    #[arg(long)]
    pub json: bool,
    /// Only devices the team owns and the team's processes elsewhere.
    #[arg(long, value_name = "TEAM")]
    pub team: Option<String>,
    /// Seconds between refreshes in live mode.
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub interval: f64,
}

/// "n/a", not "-": NVML did not report it, which is not the same as "no limit".
fn bytes(v: Option<u64>) -> String {
    v.map_or_else(|| "n/a".into(), compact_bytes)
}

fn mem(used: Option<u64>, total: Option<u64>) -> String {
    format!("{}/{}", bytes(used), bytes(total))
}

fn teams(t: &[String]) -> String {
    if t.is_empty() {
        "-".into()
    } else {
        t.join(",")
    }
}

fn proc_lines(o: &mut String, procs: &[ProcessUsage]) {
    for p in procs {
        let pid = p
            .ns_pid
            .map_or_else(|| p.pid.to_string(), |n| format!("{}({n})", p.pid));
        o.push_str(&format!(
            "    {}{:<12} {:<10} {:<12} {:<36} {:>8}  {}{}\n",
            if p.stray { "!" } else { " " },
            pid,
            p.user.as_deref().unwrap_or("?"),
            p.team.as_deref().unwrap_or("-"),
            p.slurm_job
                .map(|j| format!("slurm job {j}"))
                .as_deref()
                .or(p.container.as_deref())
                .or(p.unit.as_deref())
                .unwrap_or("-"),
            bytes(p.used_memory),
            p.command.as_deref().unwrap_or(""),
            p.idle
                .as_deref()
                .map_or(String::new(), |i| format!("  [{i}]")),
        ));
    }
}

/// Processes of teams the caller may not read one by one: a count per team, with memory.
fn hidden_lines(o: &mut String, hidden: &[HiddenProcesses]) {
    for h in hidden {
        let who = format!("{} process(es)", h.processes);
        o.push_str(&format!(
            "    {}{:<12} {:<10} {:<12} {:<36} {:>8}\n",
            if h.stray { "!" } else { " " },
            "-",
            "(hidden)",
            h.team.as_deref().unwrap_or("-"),
            who,
            bytes(h.used_memory),
        ));
    }
}

/// The placement leases on a device, one line each in the process columns: holder, team,
/// scope and since; `(hidden)` where the caller may not read the team's detail.
fn lease_lines(o: &mut String, leases: &[DeviceLease]) {
    for l in leases {
        o.push_str(&format!(
            "     {:<12} {:<10} {:<12} {:<36} since {}{}\n",
            "lease",
            l.user.as_deref().unwrap_or("(hidden)"),
            l.team,
            l.unit.as_deref().unwrap_or("-"),
            crate::placement::utc(l.since),
            l.gpu_memory
                .map_or(String::new(), |b| format!(" gpu-memory {}", human_bytes(b))),
        ));
    }
}

/// A device that takes no new work: why, since when, by whom (`gpuctl status` and `teams` say
/// the same).
fn out_line(o: &mut String, out: Option<&crate::usage::DeviceOut>) {
    if let Some(d) = out {
        o.push_str(&format!(
            "     OUT OF SERVICE since {} ({}): {}\n",
            crate::placement::utc(d.since),
            d.by,
            d.reason
        ));
    }
}

fn gpu_line(g: &GpuUsage) -> String {
    let util = match (g.mig, g.utilization_gpu, g.activity) {
        (true, _, _) => "n/a (MIG)".to_string(),
        (_, Some(u), Some(a)) => format!("{u}% (sm {a:.0}%)"),
        (_, Some(u), None) => format!("{u}%"),
        (_, None, Some(a)) => format!("sm {a:.0}%"),
        (_, None, None) => "n/a".into(),
    };
    format!(
        "GPU {:<2} {:<28} {:<14} mem {:<17} util {:<14} {:>5} {:>5}\n",
        g.index,
        g.name,
        teams(&g.teams),
        mem(g.memory_used, g.memory_total),
        util,
        g.power_mw
            .map_or("n/a".into(), |p| format!("{}W", p / 1000)),
        g.temperature_c.map_or("n/a".into(), |t| format!("{t}C")),
    )
}

fn mig_line(m: &MigUsage) -> String {
    format!(
        "  MIG gi{} ci{} {:<14} {:<14} mem {:<17} activity {}\n",
        m.gi_id,
        m.ci_id,
        m.profile,
        teams(&m.teams),
        mem(m.memory_used, m.memory_total),
        m.activity.map_or("n/a".into(), |a| format!("{a:.0}%")),
    )
}

/// The human view of a `Usage` document.
pub fn render(u: &Usage) -> String {
    let mut o = String::new();
    if let Some(why) = &u.nvml_unavailable {
        o.push_str(&format!("{why}\n"));
    }
    let (hidden, hidden_strays) = u.hidden_counts();
    let strays = u.processes().filter(|(_, _, p)| p.stray).count() + hidden_strays as usize;
    o.push_str(&format!(
        "{} GPU(s), {} process(es), {} stray(s)\n",
        u.gpus.len(),
        u.processes().count() + hidden as usize,
        strays
    ));
    for g in &u.gpus {
        o.push_str(&gpu_line(g));
        out_line(&mut o, g.out_of_service.as_ref());
        lease_lines(&mut o, &g.leases);
        proc_lines(&mut o, &g.processes);
        hidden_lines(&mut o, &g.hidden);
        for m in &g.mig_devices {
            o.push_str(&mig_line(m));
            out_line(&mut o, m.out_of_service.as_ref());
            lease_lines(&mut o, &m.leases);
            proc_lines(&mut o, &m.processes);
            hidden_lines(&mut o, &m.hidden);
        }
    }
    o
}

/// `--json`: the `Usage` document as read (and filtered by `--team`), fields in their declared
/// order.
pub fn render_json(u: &Usage) -> String {
    serde_json::to_string_pretty(u).unwrap_or_default()
}

fn fetch(team: Option<&str>) -> Result<Usage, Failure> {
    let text = with_agent("Usage", async |p| p.usage().await)?;
    parse(&text, team)
}

fn parse(text: &str, team: Option<&str>) -> Result<Usage, Failure> {
    let mut u: Usage = parse_reply("Usage", text)?;
    if let Some(t) = team {
        u.filter_team(t);
    }
    Ok(u)
}

/// Run `gpuctl top`.
pub fn run(args: &TopArgs) -> i32 {
    use std::io::IsTerminal;
    let live = !args.once
        && !args.json
        && std::io::stdout().is_terminal()
        && std::io::stdin().is_terminal();
    if !live {
        return match fetch(args.team.as_deref()) {
            Ok(u) if args.json => {
                println!("{}", render_json(&u));
                super::exit::OK
            }
            Ok(u) => {
                print!("{}", render(&u));
                super::exit::OK
            }
            Err(f) => f.report(),
        };
    }
    // Nothing to watch without gpuctld: say so and exit 6 before taking the terminal over.
    match fetch(args.team.as_deref()) {
        Ok(u) => live_loop(args, u),
        Err(f) => f.report(),
    }
}

/// Live mode: redraw every interval, quit on `q` (or Ctrl-C, read as a key while the
/// terminal is raw). The terminal is restored on every way out.
/// The exit code is that of the last refresh: 0, or the failure's (6 when gpuctld went away).
fn live_loop(args: &TopArgs, first: Usage) -> i32 {
    use nix::sys::termios::{self, LocalFlags, SetArg};
    use std::io::{Read, Write};
    let stdin = std::io::stdin();
    let saved = termios::tcgetattr(&stdin).ok();
    if let Some(t) = &saved {
        let mut raw = t.clone();
        raw.local_flags
            .remove(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG);
        let _ = termios::tcsetattr(&stdin, SetArg::TCSANOW, &raw);
    }
    let (tx, rx) = std::sync::mpsc::channel::<u8>();
    std::thread::spawn(move || {
        let mut b = [0u8; 1];
        while let Ok(1) = std::io::stdin().read(&mut b) {
            if tx.send(b[0]).is_err() {
                break;
            }
        }
    });
    let every = Duration::from_secs_f64(args.interval.clamp(0.2, 3600.0));
    let mut first = Some(first);
    let mut last;
    let code = loop {
        let got = first.take().map_or_else(|| fetch(args.team.as_deref()), Ok);
        let frame = match got {
            Ok(u) => {
                last = super::exit::OK;
                render(&u)
            }
            Err(f) => {
                last = f.code;
                format!("gpuctl: {}\n", f.message)
            }
        };
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "\x1b[H\x1b[2J{frame}\n(q to quit)\n");
        let _ = out.flush();
        drop(out);
        match rx.recv_timeout(every) {
            Ok(b'q' | b'Q' | 3 | 4) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                break last
            }
            _ => {}
        }
    };
    if let Some(t) = &saved {
        let _ = termios::tcsetattr(&stdin, SetArg::TCSANOW, t);
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Usage {
        Usage {
            gpus: vec![
                GpuUsage {
                    index: 0,
                    name: "NVIDIA L40S".into(),
                    teams: vec!["infer".into()],
                    memory_used: Some(2 << 30),
                    memory_total: Some(46068 << 20),
                    utilization_gpu: Some(37),
                    power_mw: Some(120_000),
                    temperature_c: Some(41),
                    processes: vec![ProcessUsage {
                        pid: 4242,
                        ns_pid: Some(7),
                        kind: "compute".into(),
                        used_memory: Some(1 << 30),
                        user: Some("alice".into()),
                        team: Some("infer".into()),
                        unit: Some("serve.service".into()),
                        command: Some("python3".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                GpuUsage {
                    index: 1,
                    name: "NVIDIA H100 80GB HBM3".into(),
                    mig: true,
                    mig_devices: vec![MigUsage {
                        uuid: "MIG-x".into(),
                        gi_id: 2,
                        ci_id: 0,
                        profile: "3g.40gb".into(),
                        teams: vec!["train".into()],
                        memory_used: Some(512 << 20),
                        memory_total: Some(40 << 30),
                        activity: None,
                        processes: vec![ProcessUsage {
                            pid: 99,
                            kind: "compute".into(),
                            used_memory: Some(512 << 20),
                            user: Some("root".into()),
                            unit: Some("cron.service".into()),
                            stray: true,
                            ..Default::default()
                        }],
                        hidden: vec![],
                        leases: vec![],
                        out_of_service: None,
                    }],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn render_shows_teams_processes_strays_and_not_available() {
        let s = render(&sample());
        assert!(
            s.starts_with("2 GPU(s), 2 process(es), 1 stray(s)\n"),
            "{s}"
        );
        assert!(s.contains("GPU 0  NVIDIA L40S"), "{s}");
        assert!(s.contains("util 37%"), "{s}");
        assert!(s.contains("4242(7)"), "namespace pid shown: {s}");
        assert!(s.contains("alice") && s.contains("serve.service"), "{s}");
        assert!(s.contains("util n/a (MIG)"), "{s}");
        assert!(s.contains("MIG gi2 ci0 3g.40gb"), "{s}");
        assert!(s.contains("activity n/a"), "never a made-up 0: {s}");
        let stray = s.lines().find(|l| l.contains("cron.service")).unwrap();
        assert!(stray.trim_start().starts_with('!'), "{stray}");
    }

    #[test]
    fn an_out_of_service_device_is_marked_under_its_line() {
        let mut u = sample();
        assert!(!render(&u).contains("OUT OF SERVICE"));
        let out = crate::usage::DeviceOut {
            reason: "XID 79 (GPU has fallen off the bus)".into(),
            since: 1_764_783_110,
            by: "gpuctld".into(),
        };
        let mig = u.gpus[1].mig_devices[0].uuid.clone();
        u.mark_out(&mig, out);
        let s = render(&u);
        let lines: Vec<&str> = s.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.contains("MIG gi2 ci0"))
            .unwrap();
        assert!(
            lines[at + 1].contains("OUT OF SERVICE since ")
                && lines[at + 1].ends_with("(gpuctld): XID 79 (GPU has fallen off the bus)"),
            "{s}"
        );
        assert_eq!(s.matches("OUT OF SERVICE").count(), 1, "{s}");
    }

    #[test]
    fn docker_containers_are_named_in_their_team_or_as_strays() {
        let id = "4f1c2a9b8e7d6c5b4a3928170615f4e3d2c1b0a99887766554433221100ffee";
        let mut u = sample();
        let in_infer = format!("/gpu.slice/gpu-infer.slice/docker-{id}.scope");
        let outside = format!("/system.slice/docker-{id}.scope");
        let ctr = |pid, cg: &str| ProcessUsage {
            pid,
            kind: "compute".into(),
            team: crate::usage::procfs::team_of_cgroup(cg),
            unit: Some(format!("docker-{id}.scope")),
            container: crate::names::container_of_cgroup(cg),
            ..Default::default()
        };
        u.gpus[0].processes = vec![ctr(5, &in_infer), ctr(6, &outside)];
        crate::usage::attribute(
            &mut u,
            &crate::usage::Owners {
                gpus: [(0, vec!["infer".to_string()])].into(),
                ..Default::default()
            },
        );
        let s = render(&u);
        let line = |pid: &str| {
            s.lines()
                .find(|l| l.trim_start_matches([' ', '!']).starts_with(pid))
                .unwrap()
                .to_string()
        };
        let (a, b) = (line("5 "), line("6 "));
        assert!(
            a.contains("infer") && a.contains("docker 4f1c2a9b8e7d"),
            "{a}"
        );
        assert!(!a.trim_start().starts_with('!'), "in infer's slice: {a}");
        assert!(
            b.trim_start().starts_with('!') && b.contains("docker 4f1c2a9b8e7d"),
            "{b}"
        );
        assert!(!s.contains(".scope"), "the short id, not the scope: {s}");
    }

    #[test]
    fn a_redacted_view_counts_other_teams_processes_without_names() {
        let mut u = sample();
        u.redact(|t| t == Some("train"));
        let s = render(&u);
        assert!(
            s.starts_with("2 GPU(s), 2 process(es), 1 stray(s)\n"),
            "{s}"
        );
        for name in [
            "alice",
            "serve.service",
            "python3",
            "4242",
            "root",
            "cron.service",
        ] {
            assert!(!s.contains(name), "{name}: {s}");
        }
        let hidden: Vec<&str> = s.lines().filter(|l| l.contains("(hidden)")).collect();
        assert_eq!(hidden.len(), 2, "{s}");
        assert!(hidden[0].contains("infer") && hidden[0].contains("1 process(es)"));
        assert!(hidden[1].trim_start().starts_with("!-"), "{}", hidden[1]);
        // --team keeps a team's hidden processes on devices it does not own.
        let mut u = sample();
        u.redact(|_| false);
        u.filter_team("infer");
        assert_eq!(u.gpus.len(), 1);
        assert_eq!(u.gpus[0].hidden.len(), 1);
    }

    fn leased() -> Usage {
        let mut u = sample();
        let lease = |team: &str, user: &str, unit: &str| DeviceLease {
            team: team.into(),
            user: Some(user.into()),
            uid: Some(1000),
            unit: Some(unit.into()),
            since: 1_764_783_110,
            gpu_memory: None,
        };
        u.gpus[0].leases.push(DeviceLease {
            gpu_memory: Some(2 << 30),
            ..lease("infer", "alice", "gpuctl-run-infer-812.scope")
        });
        u.add_lease("MIG-x", lease("train", "bob", "gpuctl-run-train-9.scope"));
        u
    }

    #[test]
    fn each_device_shows_who_holds_its_lease() {
        let s = render(&leased());
        let lines: Vec<&str> = s.lines().collect();
        let gpu0 = lines.iter().position(|l| l.starts_with("GPU 0")).unwrap();
        assert_eq!(
            lines[gpu0 + 1],
            "     lease        alice      infer        gpuctl-run-infer-812.scope           \
             since 2025-12-03T17:31:50Z gpu-memory 2 GiB",
            "{s}"
        );
        let mig = lines
            .iter()
            .position(|l| l.contains("MIG gi2 ci0"))
            .unwrap();
        assert!(
            lines[mig + 1].trim_start().starts_with("lease        bob"),
            "{s}"
        );
        assert!(
            lines[mig + 1].contains("train") && lines[mig + 1].contains("gpuctl-run-train-9.scope")
        );
        // Leases are not processes: the header counts stay those of the processes.
        assert!(
            s.starts_with("2 GPU(s), 2 process(es), 1 stray(s)\n"),
            "{s}"
        );
        // --json carries them.
        let text = serde_json::to_string(&leased()).unwrap();
        let back = parse(&text, None).unwrap();
        assert_eq!(back.gpus[0].leases[0].user.as_deref(), Some("alice"));
        assert_eq!(
            back.gpus[1].mig_devices[0].leases[0].unit.as_deref(),
            Some("gpuctl-run-train-9.scope")
        );
    }

    #[test]
    fn other_teams_leases_show_held_without_naming_the_holder() {
        let mut u = leased();
        u.redact(|t| t == Some("train"));
        let s = render(&u);
        for name in ["alice", "gpuctl-run-infer-812.scope", "1000"] {
            assert!(!s.contains(name), "{name}: {s}");
        }
        let hidden = s
            .lines()
            .find(|l| l.contains("(hidden)") && l.contains("lease"))
            .unwrap();
        assert!(
            hidden.contains("infer") && hidden.contains("since 2025-12-03T17:31:50Z"),
            "{hidden}"
        );
        assert!(
            s.contains("bob") && s.contains("gpuctl-run-train-9.scope"),
            "own team's lease stays: {s}"
        );
        let json: serde_json::Value = serde_json::to_value(&u).unwrap();
        assert_eq!(
            json["gpus"][0]["leases"][0]["user"],
            serde_json::Value::Null
        );
        assert_eq!(
            json["gpus"][0]["leases"][0]["unit"],
            serde_json::Value::Null
        );
        assert_eq!(json["gpus"][0]["leases"][0]["team"], "infer");
    }

    #[test]
    fn idle_holders_are_marked() {
        let mut u = sample();
        let h = crate::idle::IdleHolder {
            team: "infer".into(),
            unit: "serve.service".into(),
            user: Some("alice".into()),
            uid: Some(1000),
            device: "0".into(),
            pids: vec![4242],
            memory: None,
            phase: crate::idle::Phase::Warned,
            reason: Some(crate::idle::Reason::Idle),
            idle_seconds: 7200,
            idle_since_ms: None,
            activity_unknown: false,
            activity: Some(0.0),
            shared_device: false,
            excluded: false,
            action: crate::policy::IdleAction::Stop,
            warned_at_ms: None,
            stop_at_ms: None,
            not_stopped: None,
            warn_in_seconds: None,
        };
        crate::idle::mark(&mut u, std::slice::from_ref(&h));
        let s = render(&u);
        let line = s.lines().find(|l| l.contains("serve.service")).unwrap();
        assert!(line.ends_with("[warned]"), "{line}");
        // The same pid on another device is not that holder.
        let mut other = h.clone();
        other.device = "1".into();
        crate::idle::mark(&mut u, &[other]);
        assert!(!render(&u).contains("[warned]"));
    }

    #[test]
    fn parse_filters_by_team_and_rejects_garbage() {
        let text = serde_json::to_string(&sample()).unwrap();
        let u = parse(&text, Some("train")).unwrap();
        assert_eq!(u.gpus.len(), 1);
        assert_eq!(u.gpus[0].index, 1);
        assert!(parse("{", None).is_err());
    }
}
