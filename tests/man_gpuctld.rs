//! gpuctld(8)'s OPTIONS and ENVIRONMENT sections cannot drift from the binary: every option of
//! `gpuctld --help` (with its value name and default) is in OPTIONS and nothing else is; the
//! `Environment:` list of `--help` and ENVIRONMENT name the same variables with the same
//! defaults; and every variable the daemon's code reads (`std::env::var*` in `src/` outside the
//! `gpuctl` CLI) is in that list.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const MAN: &str = include_str!("../docs/man/gpuctld.8");

fn help() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuctld"))
        .arg("--help")
        .output()
        .expect("run gpuctld --help");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// The lines of `.SH NAME` up to the next `.SH`.
fn section<'a>(name: &str) -> Vec<&'a str> {
    let mut lines = MAN.lines().skip_while(|l| *l != format!(".SH {name}"));
    assert!(lines.next().is_some(), "gpuctld.8 has no {name} section");
    lines.take_while(|l| !l.starts_with(".SH ")).collect()
}

/// The arguments of a roff macro line, quotes respected.
fn roff_args(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Plain text of a roff line: font macros' arguments (alternating ones joined without spaces),
/// `\-` as `-`.
fn text(line: &str) -> String {
    let t = if let Some(rest) = line.strip_prefix('.') {
        let (mac, args) = rest.split_once(' ').unwrap_or((rest, ""));
        let args = roff_args(args);
        if mac.len() == 2 && mac != "TP" && mac != "PP" {
            args.concat()
        } else {
            args.join(" ")
        }
    } else {
        line.to_string()
    };
    t.replace("\\-", "-")
}

/// `.TP` paragraphs of a section: the tag line's text → the body's text.
fn tagged(lines: &[&str]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i] == ".TP" && i + 1 < lines.len() {
            let tag = text(lines[i + 1]);
            let mut body = Vec::new();
            i += 2;
            while i < lines.len() && lines[i] != ".TP" {
                body.push(text(lines[i]));
                i += 1;
            }
            out.push((tag, body.join(" ")));
        } else {
            i += 1;
        }
    }
    out
}

/// `--help`'s options: long name → (value name, default).
fn help_options(help: &str) -> BTreeMap<String, (Option<String>, Option<String>)> {
    let mut out = BTreeMap::new();
    let opts = help.split("Options:").nth(1).expect("Options: in --help");
    let opts = opts.split("\n\n").next().unwrap();
    for line in opts.lines() {
        let Some(long) = line.split_whitespace().find(|w| w.starts_with("--")) else {
            continue;
        };
        let after = &line[line.find(long).unwrap() + long.len()..];
        let value = after
            .trim_start()
            .strip_prefix('<')
            .and_then(|v| v.split_once('>'))
            .map(|(v, _)| v.to_string());
        let default = line
            .split_once("[default: ")
            .map(|(_, d)| d.trim_end_matches(']').to_string());
        out.insert(long.to_string(), (value, default));
    }
    out
}

/// `--help`'s `Environment:` list: name → default. An entry starts at a two-space indent;
/// deeper lines continue it (clap wraps long lines).
fn help_env(help: &str) -> Vec<(String, Option<String>)> {
    let env = help
        .split("Environment:\n")
        .nth(1)
        .expect("Environment: in --help");
    let mut entries: Vec<(String, String)> = Vec::new();
    for l in env.lines().take_while(|l| l.starts_with("  ")) {
        if l.starts_with("   ") {
            entries
                .last_mut()
                .expect("continuation line first")
                .1
                .push_str(l);
        } else {
            let name = l.split_whitespace().next().unwrap().to_string();
            entries.push((name, l.to_string()));
        }
    }
    entries
        .into_iter()
        .map(|(name, text)| {
            let default = text
                .rsplit_once("[default: ")
                .map(|(_, d)| d.trim_end_matches(']').to_string());
            (name, default)
        })
        .collect()
}

#[test]
fn options_match_help() {
    let help = help();
    let opts = help_options(&help);
    assert!(opts.contains_key("--drift-secs"), "{help}");
    let man = tagged(&section("OPTIONS"));
    let mut documented = Vec::new();
    for (tag, body) in &man {
        // `--drift-secs SECS`, `-h, --help`
        let long = tag
            .split([' ', ','])
            .find(|w| w.starts_with("--"))
            .unwrap_or_else(|| panic!("OPTIONS tag without a long option: {tag}"));
        documented.push(long.to_string());
        let (value, default) = opts
            .get(long)
            .unwrap_or_else(|| panic!("gpuctld.8 documents {long}, which --help does not have"));
        if let Some(v) = value {
            assert!(
                tag.ends_with(&format!(" {v}")),
                "{long}: man says '{tag}', --help's value name is {v}"
            );
        }
        if let Some(d) = default {
            assert!(
                body.contains(&format!("Default: {d}")),
                "{long}: --help's default is {d}; man says: {body}"
            );
        }
    }
    for long in opts.keys() {
        assert!(documented.contains(long), "gpuctld.8 OPTIONS lacks {long}");
    }
}

#[test]
fn environment_matches_help() {
    let help = help();
    let env = help_env(&help);
    let man = tagged(&section("ENVIRONMENT"));
    let man_names: Vec<&str> = man.iter().map(|(t, _)| t.as_str()).collect();
    let help_names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(man_names, help_names, "gpuctld.8 ENVIRONMENT vs --help");
    for ((name, default), (_, body)) in env.iter().zip(&man) {
        if let Some(d) = default {
            assert!(
                body.contains(&format!("Default: {d}")),
                "{name}: --help's default is {d}; man says: {body}"
            );
        }
    }
    // The library's own constants, so a rename shows here too.
    for name in [gpuctl::nvml::ENV_LIBRARY, gpuctl::nvml::ENV_RESET_CMD] {
        assert!(help_names.contains(&name), "{name} not in --help");
    }
    let reset = env
        .iter()
        .find(|(n, _)| n == gpuctl::nvml::ENV_RESET_CMD)
        .unwrap();
    assert_eq!(reset.1.as_deref(), Some(gpuctl::nvml::DEFAULT_RESET_CMD));
}

/// Every `std::env::var("X")` / `var_os(CONST)` in the daemon's code (all of `src/` but the
/// `gpuctl` CLI and its binary).
fn env_reads(dir: &Path, consts: &BTreeMap<String, String>, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            if p.ends_with("cli") {
                continue;
            }
            env_reads(&p, consts, out);
            continue;
        }
        if p.extension().is_none_or(|e| e != "rs") || p.ends_with("bin/gpuctl.rs") {
            continue;
        }
        let src = std::fs::read_to_string(&p).unwrap();
        // Unit tests set variables of their own; only non-test code counts.
        let src = src.split("#[cfg(test)]").next().unwrap();
        for pat in ["env::var(", "env::var_os("] {
            for (at, _) in src.match_indices(pat) {
                let arg: String = src[at + pat.len()..]
                    .chars()
                    .take_while(|c| *c != ')')
                    .collect();
                let arg = arg.trim();
                let name = match arg.strip_prefix('"') {
                    Some(lit) => lit.trim_end_matches('"').to_string(),
                    None => consts
                        .get(arg.rsplit("::").next().unwrap())
                        .unwrap_or_else(|| panic!("{}: env read of unknown {arg}", p.display()))
                        .clone(),
                };
                out.push((name, p.display().to_string()));
            }
        }
    }
}

fn string_consts(dir: &Path, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            string_consts(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            for line in std::fs::read_to_string(&p).unwrap().lines() {
                let l = line.trim_start().trim_start_matches("pub ");
                if let Some(rest) = l.strip_prefix("const ") {
                    if let Some((name, val)) = rest.split_once(": &str = \"") {
                        out.insert(name.to_string(), val.trim_end_matches("\";").to_string());
                    }
                }
            }
        }
    }
}

#[test]
fn every_variable_the_daemon_reads_is_documented() {
    let help = help();
    let names: Vec<String> = help_env(&help).into_iter().map(|(n, _)| n).collect();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut consts = BTreeMap::new();
    string_consts(&src, &mut consts);
    let mut reads = Vec::new();
    env_reads(&src, &consts, &mut reads);
    assert!(reads.iter().any(|(n, _)| n == "GPUCTL_LOG"), "{reads:?}");
    // src/exporter.rs is gpuctl-exporter's, a program of its own (socket activation's
    // LISTEN_PID/LISTEN_FDS); gpuctld never runs it.
    for (name, file) in reads
        .iter()
        .filter(|(_, f)| !f.ends_with("src/exporter.rs"))
    {
        assert!(
            names.contains(name),
            "{file} reads {name}, which gpuctld --help and gpuctld.8 do not document"
        );
    }
}
