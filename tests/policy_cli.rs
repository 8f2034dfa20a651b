//! `gpuctl validate` through the real binary: exit codes, one-line diagnostics with file, line,
//! column and key, `--json`, and every example policy.

use std::path::{Path, PathBuf};
use std::process::Command;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn gpuctl(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .args(args)
        .output()
        .expect("run gpuctl");
    Run {
        code: out.status.code().expect("exit code"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const GOOD: &str = r#"version = 1
[teams.infer]
members = ["alice", "@ml"]
memory-max = "64G"
[teams.interns]
members = ["@interns"]
[[gpu]]
index = [0]
mig = [ { profile = "3g.40gb", owner = "infer" }, { profile = "1g.10gb", owner = "interns", count = 3 } ]
"#;

/// Each broken policy, and the `file:line:col: error: key:` prefix plus a message fragment that
/// its diagnostic must carry.
const BROKEN: &[(&str, &str, &str, &str)] = &[
    (
        "syntax",
        "version = 1\n[teams.infer]\nmembers = [\"a\"\n",
        // toml_edit 0.25 places an unclosed array at the end of its line, not at end of file.
        ":3:15: error: ",
        "TOML syntax error",
    ),
    (
        "unknown-key",
        "version = 1\n[teams.infer]\nmembers = [\"a\"]\nmemroy-max = \"1G\"\n",
        ":4:1: error: teams.infer.memroy-max: ",
        "expected one of: members, memory-max",
    ),
    (
        "unknown-team",
        "version = 1\n[teams.infer]\nmembers = [\"a\"]\n[[gpu]]\nindex = [0]\nowner = \"infre\"\n",
        ":6:9: error: gpu[0].owner: ",
        "unknown team 'infre' (did you mean 'infer'?",
    ),
    (
        "overfull-mig",
        "version = 1\n[teams.infer]\nmembers = [\"a\"]\n[[gpu]]\nmodel = \"h100-80gb\"\nmig = [ { profile = \"3g.40gb\", owner = \"infer\", count = 3 } ]\n",
        ":4:1: error: gpu[0].mig: ",
        "3g.40gb x3 needs 12 of 8 memory slices",
    ),
    (
        "dash-team",
        "version = 1\n[teams.ml-infer]\nmembers = [\"a\"]\n",
        ":2:8: error: teams.ml-infer: ",
        "would nest the slice",
    ),
    (
        "owned-twice",
        "version = 1\n[teams.a]\nmembers = [\"a\"]\n[teams.b]\nmembers = [\"b\"]\n[[gpu]]\nindex = [0, 1]\nowner = \"a\"\n[[gpu]]\nindex = [1, 2]\nowner = \"b\"\n",
        ":10:9: error: gpu[1]: ",
        "gpu 1 assigned twice: here and at ",
    ),
    (
        "bad-size",
        "version = 1\n[teams.a]\nmembers = [\"a\"]\nmemory-max = \"64GB\"\n",
        ":4:14: error: teams.a.memory-max: ",
        "K, M, G or T suffix",
    ),
    (
        "no-version",
        "[teams.a]\nmembers = [\"a\"]\n",
        ":1:1: error: version: ",
        "missing `version`",
    ),
];

#[test]
fn broken_files_exit_1_with_file_line_and_key() {
    let d = tempfile::tempdir().unwrap();
    for (name, text, prefix, msg) in BROKEN {
        let p = file(d.path(), &format!("{name}.toml"), text);
        let r = gpuctl(&["validate", p.to_str().unwrap()]);
        assert_eq!(r.code, 1, "{name}: {}", r.stderr);
        let want = format!("{}{prefix}", p.display());
        let line = r
            .stderr
            .lines()
            .find(|l| l.starts_with(&want))
            .unwrap_or_else(|| panic!("{name}: no line starting {want:?} in\n{}", r.stderr));
        assert!(line.contains(msg), "{name}: {line:?} lacks {msg:?}");
    }
}

#[test]
fn all_broken_files_at_once_report_every_error() {
    let d = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = BROKEN
        .iter()
        .map(|(name, text, _, _)| file(d.path(), &format!("{name}.toml"), text))
        .collect();
    let mut args = vec!["validate".to_string(), "--json".into()];
    args.extend(paths.iter().map(|p| p.display().to_string()));
    let r = gpuctl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r.code, 1);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["valid"], false);
    let diags = v["diagnostics"].as_array().unwrap();
    // Every file has at least one error of its own.
    for p in &paths {
        let p = p.display().to_string();
        assert!(
            diags
                .iter()
                .any(|d| d["file"] == p.as_str() && d["severity"] == "error"),
            "no error for {p} in {diags:#?}"
        );
    }
}

#[test]
fn valid_file_exits_0_and_json_says_so() {
    let d = tempfile::tempdir().unwrap();
    let p = file(d.path(), "good.toml", GOOD);
    let r = gpuctl(&["validate", p.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("policy valid"), "{}", r.stdout);
    let r = gpuctl(&["validate", "--json", p.to_str().unwrap()]);
    assert_eq!(r.code, 0);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["files"][0], p.to_str().unwrap());
}

#[test]
fn missing_file_exits_2() {
    let d = tempfile::tempdir().unwrap();
    let good = file(d.path(), "good.toml", GOOD);
    let missing = d.path().join("nope.toml");
    let r = gpuctl(&[
        "validate",
        good.to_str().unwrap(),
        missing.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("nope.toml: error: cannot read"),
        "{}",
        r.stderr
    );
    let r = gpuctl(&["validate", "--json", missing.to_str().unwrap()]);
    assert_eq!(r.code, 2);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert_eq!(v["unreadable"][0]["file"], missing.to_str().unwrap());
}

#[test]
fn no_paths_reads_the_host_dirs_under_root() {
    let d = tempfile::tempdir().unwrap();
    let etc = d.path().join("etc/gpuctl/policy.d");
    std::fs::create_dir_all(&etc).unwrap();
    file(&etc, "50-good.toml", GOOD);
    let root = d.path().to_str().unwrap();
    let r = gpuctl(&["--root", root, "validate"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    file(
        &etc,
        "60-bad.toml",
        "version = 1\n[teams.infer]\ncpu-weight = 0\n",
    );
    let r = gpuctl(&["validate", "--root", root]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr
            .contains("/etc/gpuctl/policy.d/60-bad.toml:3:14: error: teams.infer.cpu-weight"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains(root), "temp root leaked: {}", r.stderr);
}

#[test]
fn every_example_policy_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let r = gpuctl(&["validate", p.to_str().unwrap()]);
            assert_eq!(r.code, 0, "{}: {}", p.display(), r.stderr);
            assert!(
                !r.stderr.contains("warning"),
                "{}: examples should be warning-free: {}",
                p.display(),
                r.stderr
            );
            n += 1;
        }
    }
    assert!(n >= 4, "expected the four example policies, found {n}");
}

#[test]
fn man_page_example_validates() {
    let man = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/man/gpuctl.policy.5"),
    )
    .unwrap();
    let start =
        man.find(".SH EXAMPLE\n.nf\n").expect("EXAMPLE section") + ".SH EXAMPLE\n.nf\n".len();
    let len = man[start..].find("\n.fi").expect("end of example");
    let d = tempfile::tempdir().unwrap();
    let p = file(d.path(), "example.toml", &man[start..start + len]);
    let r = gpuctl(&["validate", p.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
}
