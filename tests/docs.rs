//! The docs agree with the code: every relative link in the Markdown files resolves (file and
//! heading), every `--flag` the docs and man pages name is a flag of `gpuctl` or `gpuctld` (or of
//! a tool listed below as another's), a value written after a flag that takes a fixed set of
//! values is one of them (`env --format cdi`), and the generated man page's NAME line reads as a
//! NAME line; every `GPUCTL_*` variable they name exists in the code, and the interval defaults
//! gpuctld(8) gives are the code's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown file of the repository outside build output and other checkouts.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || ["target", "shared", "node_modules"].contains(&&*name) {
                continue;
            }
            if p.is_dir() {
                walk(&p, out);
            } else if name.ends_with(".md") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo(), &mut out);
    out.sort();
    assert!(out.len() >= 10, "found only {out:?}");
    out
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.starts_with("```") {
                fenced = !fenced;
            }
            !fenced && l.starts_with('#')
        })
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

/// The targets of `[text](target)` links outside code.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        // Inline code is no link: drop `...` spans first.
        let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = plain.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push((n + 1, target.to_string()));
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_markdown_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let at = format!("{}:{line}: {target}", file.display());
            if !dest.exists() {
                broken.push(format!("{at}: no such file"));
                continue;
            }
            if let (Some(a), true) = (anchor, dest.extension().is_some_and(|e| e == "md")) {
                let text = std::fs::read_to_string(&dest).unwrap();
                if !anchors(&text).contains(a) {
                    broken.push(format!("{at}: no heading #{a}"));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_checker_sees_a_broken_link() {
    let l = links("see [x](docs/nope.md#a) and `[not](code.md)`\n```\n[no](x)\n```\n");
    assert_eq!(l, vec![(1, "docs/nope.md#a".to_string())]);
    assert_eq!(
        slug("LDAP and other directory groups"),
        "ldap-and-other-directory-groups"
    );
    assert_eq!(
        slug("Check a drop-in: `gpuctl validate --as`"),
        "check-a-drop-in-gpuctl-validate---as"
    );
}

/// Flags of other programs that the docs show next to ours, by program. None of gpuctl's or
/// gpuctld's own flags may be listed (checked below): where another tool shares one of ours
/// (`docker run --gpus`, `systemd-run --wait`), ours is what the docs are checked against, so
/// that a flag of ours that goes away cannot hide behind the other tool's.
const OTHER_TOOLS: &[(&str, &[&str])] = &[
    ("vm-tests/run", &["--short"]),
    (
        "cargo",
        &[
            "--release",
            "--example",
            "--workspace",
            "--test",
            "--bin",
            "--bench",
            "--check",
            "--nocapture",
            "--lib",
            "--all-targets",
            "--locked",
            "--timings",
            "--no-run",
        ],
    ),
    (
        "podman/docker",
        &[
            "--cgroup-parent",
            "--rm",
            "--env-file",
            "--cgroup-manager",
            "--cgroups",
            "--mount",
            "--privileged",
        ],
    ),
    (
        "systemd-run/systemctl",
        &["--scope", "--slice", "--now", "--pty"],
    ),
    ("busctl", &["--system", "--match"]),
    (
        "examples/fuzz.rs",
        &["--seconds", "--seed", "--out", "--target", "--execs"],
    ),
    ("ansible-playbook", &["--tags", "--check", "--diff"]),
    ("node_exporter", &["--collector"]),
    ("dcgm-exporter", &["--hpc-job-mapping-dir"]),
    ("a team's own service (docs/shell.md)", &["--port"]),
    ("pip (docs/jupyterhub.md)", &["--break-system-packages"]),
    ("jupyterhub (docs/jupyterhub.md)", &["--upgrade-db"]),
    (
        "vm-tests/run",
        &[
            "--bench",
            "--self-test",
            "--keep",
            "--image-only",
            "--rebuild-image",
            "--tour",
        ],
    ),
    ("packaging/build.sh", &["--debug", "--no-rpm"]),
    ("vm-tests/build-image.sh", &["--host-tools"]),
];

/// Every long flag of `cmd` and its subcommands, with the values it accepts when they are fixed.
fn clap_flags(cmd: &clap::Command, out: &mut BTreeMap<String, BTreeSet<String>>) {
    for a in cmd.get_arguments() {
        if let Some(l) = a.get_long() {
            let values = out.entry(format!("--{l}")).or_default();
            // A switch has the values true and false, which nobody writes after it.
            if !matches!(
                a.get_action(),
                clap::ArgAction::Set | clap::ArgAction::Append
            ) {
                continue;
            }
            values.extend(
                a.get_possible_values()
                    .iter()
                    .map(|v| v.get_name().to_string()),
            );
        }
    }
    for s in cmd.get_subcommands() {
        clap_flags(s, out);
    }
}

/// The long flags `gpuctld --help` lists (its parser lives in the binary).
fn gpuctld_flags() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuctld"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    flags_in(&help).into_iter().map(|(f, _)| f).collect()
}

/// `--flag` words in `text` and the word after each (roff's `\-` read as `-`).
fn flags_in(text: &str) -> Vec<(String, String)> {
    let text = text
        .replace("\\-", "-")
        .replace("\\fB", "")
        .replace("\\fR", "");
    let text = text.replace("\\fI", "");
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || "`()[]|,;\"'".contains(c))
        .filter(|w| !w.is_empty())
        .collect();
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let Some(name) = w.strip_prefix("--") else {
            continue;
        };
        let name = name
            .split('=')
            .next()
            .unwrap_or("")
            .trim_end_matches(['.', ':']);
        let ok = name.len() > 1
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if ok {
            let next = w
                .split_once('=')
                .map(|(_, v)| v.to_string())
                .or_else(|| words.get(i + 1).map(|s| s.to_string()))
                .unwrap_or_default();
            out.push((format!("--{name}"), next));
        }
    }
    out
}

#[test]
fn every_flag_the_docs_and_man_pages_name_exists() {
    let mut ours = BTreeMap::new();
    clap_flags(&gpuctl::cli::command(), &mut ours);
    for f in gpuctld_flags() {
        ours.entry(f).or_default();
    }
    assert!(ours.contains_key("--simulate") && ours.contains_key("--drift-secs"));
    let other: BTreeSet<&str> = OTHER_TOOLS
        .iter()
        .flat_map(|(_, f)| f.iter().copied())
        .collect();
    let shadowed: Vec<&&str> = other.iter().filter(|f| ours.contains_key(**f)).collect();
    assert!(
        shadowed.is_empty(),
        "flags of ours in OTHER_TOOLS (they would pass even if ours went): {shadowed:?}"
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .chain(std::fs::read_dir(repo().join("docs/man")).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.push(repo().join("README.md"));
    files.sort();
    let mut wrong = Vec::new();
    let mut seen = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (flag, next) in flags_in(&text) {
            seen += 1;
            match ours.get(&flag) {
                // A fixed set of values: a plain word written after the flag must be one.
                Some(values) if !values.is_empty() => {
                    let word = next.trim_end_matches(['.', ':']);
                    let plain = !word.is_empty()
                        && word.chars().all(|c| c.is_ascii_lowercase() || c == '-');
                    if plain && !values.contains(word) && !other.contains(flag.as_str()) {
                        wrong.push(format!(
                            "{}: {flag} {word}: not one of {values:?}",
                            file.display()
                        ));
                    }
                }
                Some(_) => {}
                None if other.contains(flag.as_str()) => {}
                None => wrong.push(format!(
                    "{}: {flag}: no such flag of gpuctl or gpuctld",
                    file.display()
                )),
            }
        }
    }
    assert!(seen > 50, "only {seen} flags found: is the scanner broken?");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The long flags a `gpuctl` command line may use after `path` (its subcommands' names):
/// the global ones and those of the subcommand itself.
fn flags_of(path: &[&str]) -> Option<BTreeSet<String>> {
    let root = gpuctl::cli::command();
    let long = |c: &clap::Command, global_only: bool| -> Vec<String> {
        c.get_arguments()
            .filter(|a| !global_only || a.is_global_set())
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect()
    };
    let mut flags: BTreeSet<String> = long(&root, true).into_iter().collect();
    flags.insert("--help".into());
    let mut cmd = &root;
    for name in path {
        cmd = cmd.find_subcommand(name)?;
        flags.extend(long(cmd, true));
    }
    flags.extend(long(cmd, false));
    Some(flags)
}

/// `gpuctl SUB [SUB2] … --flag …` command lines in `text` (Markdown code or roff examples):
/// (line number, the subcommand path, the long flags written after it up to the end of that
/// command: a pipe, `;`, `&&`, `||`, a closing backquote or the end of the line).
fn gpuctl_command_lines(text: &str) -> Vec<(usize, Vec<String>, Vec<String>)> {
    let root = gpuctl::cli::command();
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line
            .replace("\\-", "-")
            .replace("\\fB", "")
            .replace("\\fR", "");
        let mut rest = line.as_str();
        while let Some(i) = rest.find("gpuctl ") {
            let starts_word =
                i == 0 || !rest[..i].ends_with(|c: char| c.is_alphanumeric() || "-_/.".contains(c));
            rest = &rest[i + "gpuctl ".len()..];
            if !starts_word {
                continue;
            }
            let end = ["|", ";", "&&", "`", ")", "#", "\"", " or "]
                .iter()
                .filter_map(|s| rest.find(s))
                .min()
                .unwrap_or(rest.len());
            let words: Vec<&str> = rest[..end].split_whitespace().collect();
            let mut path = Vec::new();
            let mut cmd = &root;
            let mut flags = Vec::new();
            for w in &words {
                // After `--` come the job's own arguments.
                if *w == "--" {
                    break;
                }
                if let Some(f) = w.strip_prefix("--") {
                    let f = f.split('=').next().unwrap_or("");
                    if !f.is_empty() && f.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
                        flags.push(format!("--{f}"));
                    }
                } else if flags.is_empty() && !w.starts_with('-') {
                    match cmd.find_subcommand(w) {
                        Some(s) => {
                            path.push(w.to_string());
                            cmd = s;
                        }
                        // A positional argument (a team, a file) ends the subcommand path.
                        None if !path.is_empty() => {}
                        None => break,
                    }
                }
            }
            if !path.is_empty() && !flags.is_empty() {
                out.push((n + 1, path, flags));
            }
        }
    }
    out
}

#[test]
fn every_flag_after_a_gpuctl_subcommand_is_that_subcommands() {
    let mut files: Vec<PathBuf> = markdown_files();
    files.extend(
        std::fs::read_dir(repo().join("docs/man"))
            .unwrap()
            .flatten()
            .map(|e| e.path()),
    );
    let mut wrong = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for (line, path, flags) in gpuctl_command_lines(&text) {
            let p: Vec<&str> = path.iter().map(String::as_str).collect();
            let known = flags_of(&p).expect("a path found by the scanner");
            for f in flags {
                checked += 1;
                if !known.contains(&f) {
                    wrong.push(format!(
                        "{}:{line}: gpuctl {} has no {f}",
                        file.strip_prefix(repo()).unwrap().display(),
                        path.join(" ")
                    ));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} flags after gpuctl commands: is the scanner broken?"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_command_line_scanner_follows_subcommands_and_stops_at_the_command_end() {
    let got = gpuctl_command_lines(
        "run `gpuctl run --gpus 2 --team t -- python x.py --lr 3` or \n\
         `sudo gpuctl status --json | jq --raw-output .x` and mygpuctl run --nope\n\
         .B gpuctl import mig\\-parted \\-\\-config x",
    );
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        got,
        vec![
            (1, v(&["run"]), v(&["--gpus", "--team"])),
            (2, v(&["status"]), v(&["--json"])),
            (3, v(&["import", "mig-parted"]), v(&["--config"])),
        ]
    );
    let run = flags_of(&["run"]).unwrap();
    assert!(run.contains("--gpus") && run.contains("--root") && !run.contains("--json"));
}

#[test]
fn the_flag_scanner_reads_markdown_and_roff() {
    assert_eq!(
        flags_in("`gpuctl env --format=cdi` and .B \\-\\-drift\\-secs 5"),
        vec![
            ("--format".to_string(), "cdi".to_string()),
            ("--drift-secs".to_string(), "5".to_string())
        ]
    );
    assert!(flags_in("a -- b --X").is_empty());
}

#[test]
fn the_generated_man_page_names_the_command_once() {
    let mut buf = Vec::new();
    clap_mangen::Man::new(gpuctl::cli::command())
        .render_name_section(&mut buf)
        .unwrap();
    let name = String::from_utf8(buf).unwrap();
    let line = name.lines().last().unwrap();
    assert!(line.starts_with("gpuctl \\- "), "{name}");
    assert!(!line.contains("gpuctl \\- gpuctl"), "{name}");
}

#[test]
fn the_summary_of_env_names_every_format() {
    let cmd = gpuctl::cli::command();
    let env = cmd.find_subcommand("env").unwrap();
    let about = env.get_about().unwrap().to_string().to_lowercase();
    let format = env
        .get_arguments()
        .find(|a| a.get_long() == Some("format"))
        .unwrap();
    for v in format.get_possible_values() {
        assert!(
            about.contains(v.get_name()),
            "{about:?} omits {}",
            v.get_name()
        );
    }
}

/// Every `GPUCTL_*` variable the docs, man pages and READMEs name, with the files naming it.
fn documented_variables() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = markdown_files();
    files.extend(
        std::fs::read_dir(repo().join("docs/man"))
            .unwrap()
            .flatten()
            .map(|e| e.path()),
    );
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let rel = f.strip_prefix(repo()).unwrap().display().to_string();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("GPUCTL_") {
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            rest = &rest[i + name.len()..];
            let name = name.trim_end_matches('_').to_string();
            if name.len() > "GPUCTL_".len() {
                out.entry(name).or_default().insert(rel.clone());
            }
        }
    }
    out
}

/// The code that ships or builds what ships, comment lines dropped: src/'s Rust, packaging's
/// scripts and the systemd units (`Environment=`).
fn shipped_code() -> String {
    fn walk(dir: &Path, out: &mut String) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
                continue;
            }
            let comment = match p.extension().and_then(|e| e.to_str()) {
                Some("rs") => "//",
                Some("sh" | "in" | "service" | "socket" | "timer" | "target" | "slice") => "#",
                None => "#",
                _ => continue,
            };
            let Ok(t) = std::fs::read_to_string(&p) else {
                continue;
            };
            for l in t.lines().filter(|l| !l.trim_start().starts_with(comment)) {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    let mut out = String::new();
    walk(&repo().join("src"), &mut out);
    walk(&repo().join("packaging"), &mut out);
    walk(&repo().join("units"), &mut out);
    out
}

/// Whether `code` reads or sets `var`: Rust's `"VAR"` (an `env::var` argument or a constant)
/// or `"VAR=…`, shell's `$VAR`, `${VAR` or `VAR=`, a unit's `Environment=VAR=`, or a tracing
/// field `var =` (the journal upper-cases it).
fn reads_or_sets(code: &str, var: &str) -> bool {
    [
        format!("\"{var}\""),
        format!("\"{var}="),
        format!("${var}"),
        format!("${{{var}"),
        format!("\n{var}="),
        format!(" {var}="),
        format!("={var}="),
        format!("{} =", var.to_lowercase()),
    ]
    .iter()
    .any(|p| code.contains(p.as_str()))
}

/// Variables only the test harness reads: documented for developers, read by no shipped code.
/// The REQUIRE ones are spelt in two parts: tests/skipped.rs takes a test file that names one
/// for a test that skips without its tool.
const HARNESS_VARIABLES: &[&str] = &[
    "GPUCTL_UPDATE_GOLDEN",
    concat!("GPUCTL_REQUIRE", "_DBUS_DAEMON"),
    concat!("GPUCTL_REQUIRE", "_PROMTOOL"),
];

/// The Rust under tests/ but this file.
fn harness_code() -> String {
    fn walk(dir: &Path, out: &mut String) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("tests/docs.rs") {
                out.push_str(&std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    let mut out = String::new();
    walk(&repo().join("tests"), &mut out);
    out
}

#[test]
fn every_variable_the_docs_name_is_read_or_set_by_the_code() {
    let code = shipped_code();
    let vars = documented_variables();
    assert!(vars.contains_key("GPUCTL_USAGE_INTERVAL_MS"), "{vars:?}");
    let harness = harness_code();
    for v in HARNESS_VARIABLES {
        assert!(
            harness.contains(&format!("\"{v}\"")),
            "no test reads {v} any more"
        );
        assert!(
            !reads_or_sets(&code, v),
            "{v} is read by shipped code now: drop it from HARNESS_VARIABLES"
        );
    }
    let unknown: Vec<String> = vars
        .iter()
        .filter(|(v, _)| !HARNESS_VARIABLES.contains(&v.as_str()))
        .filter(|(v, _)| !reads_or_sets(&code, v))
        .map(|(v, files)| format!("{v} (named in {files:?})"))
        .collect();
    assert!(
        unknown.is_empty(),
        "the docs name variables no shipped code reads or sets: {unknown:?}"
    );
}

#[test]
fn the_variable_finder_reads_code_not_comments_or_tests() {
    assert!(reads_or_sets(
        "let v = std::env::var(\"GPUCTL_X\");",
        "GPUCTL_X"
    ));
    assert!(reads_or_sets("if [ -n \"${GPUCTL_X:-}\" ]", "GPUCTL_X"));
    assert!(reads_or_sets("info!(gpuctl_x = %u, \"…\")", "GPUCTL_X"));
    assert!(!reads_or_sets(
        "let v = std::env::var(\"GPUCTL_XY\");",
        "GPUCTL_X"
    ));
    let code = shipped_code();
    assert!(reads_or_sets(&code, "GPUCTL_USAGE_INTERVAL_MS"));
    // Read only by the test harness: not shipped code.
    assert!(!reads_or_sets(&code, "GPUCTL_UPDATE_GOLDEN"));
}

#[test]
fn the_interval_defaults_the_man_page_gives_are_the_codes() {
    let man = std::fs::read_to_string(repo().join("docs/man/gpuctld.8")).unwrap();
    let default_of = |var: &str| -> u128 {
        let at = man
            .find(&format!(".B {var}"))
            .unwrap_or_else(|| panic!("gpuctld(8) does not describe {var}"));
        let after = &man[at..];
        let d = after.find("Default:").expect("a Default: line") + "Default:".len();
        let value: String = after[d..]
            .trim_start_matches(['\n', ' '])
            .trim_start_matches(".BR ")
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        value.parse().unwrap()
    };
    assert_eq!(
        default_of("GPUCTL_USAGE_INTERVAL_MS"),
        gpuctl::usage::collect::DEFAULT_INTERVAL.as_millis()
    );
    assert_eq!(
        default_of("GPUCTL_IDLE_INTERVAL_MS"),
        gpuctl::daemon::idle::DEFAULT_INTERVAL.as_millis()
    );
    // The retry paragraph's figures.
    use gpuctl::daemon::requeue::{FIRST_RETRY, RECHECK, RETRY_CAP};
    let text = man.replace('\n', " ");
    for said in [
        format!("after {} s, then", FIRST_RETRY.as_secs()),
        format!("up to {} s", RETRY_CAP.as_secs()),
        format!("every {} s, logged once", RETRY_CAP.as_secs()),
        format!("checked again every {} s", RECHECK.as_secs()),
    ] {
        assert!(text.contains(&said), "gpuctld(8) does not say {said:?}");
    }
}
