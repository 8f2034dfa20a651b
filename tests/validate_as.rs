//! `gpuctl validate --as DEST FILE` through the real binary: the drop-in is checked merged with
//! the host's other files under `--root`, with validate's exit codes, and its errors name FILE as
//! given (the way Ansible's `template: validate:` shows its temp path).

use std::path::Path;
use std::process::Command;

fn gpuctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .args(args)
        .output()
        .expect("run gpuctl");
    (
        out.status.code().expect("exit code"),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn put(root: &Path, host: &str, text: &str) {
    let p = root.join(host.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

const TEAMS: &str = "version = 1\n[teams.infer]\nmembers = [\"alice\"]\n";
const DEST: &str = "/etc/gpuctl/policy.d/50-gpus.toml";

#[test]
fn drop_in_valid_in_place_invalid_alone() {
    let root = tempfile::tempdir().unwrap();
    put(root.path(), "/etc/gpuctl/policy.d/10-teams.toml", TEAMS);
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("source");
    std::fs::write(
        &file,
        "version = 1\n[[gpu]]\nindex = [0]\nowner = \"infer\"\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let r = root.path().to_str().unwrap();

    // The report: alone, the drop-in names an unknown team.
    let (code, _, err) = gpuctl(&["validate", f]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unknown team 'infer'"), "{err}");

    let (code, out, err) = gpuctl(&["--root", r, "validate", "--as", DEST, f]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("policy valid: 2 file(s), 1 team(s), 1 gpu entry"),
        "{out}"
    );

    let (code, out, _) = gpuctl(&["--root", r, "validate", "--json", "--as", DEST, f]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["files"][1], f);
}

#[test]
fn errors_name_the_temp_file_and_exit_1() {
    let root = tempfile::tempdir().unwrap();
    put(root.path(), "/etc/gpuctl/policy.d/10-teams.toml", TEAMS);
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("ansible-tmp-123/source");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(
        &file,
        "version = 1\n[[gpu]]\nindex = [0]\nowner = \"infre\"\n",
    )
    .unwrap();
    let (code, _, err) = gpuctl(&[
        "--root",
        root.path().to_str().unwrap(),
        "validate",
        "--as",
        DEST,
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "{}:4:9: error: gpu[0].owner: unknown team 'infre'",
            file.display()
        )),
        "{err}"
    );
    // Nothing was installed: --as only reads.
    assert!(!root.path().join(DEST.trim_start_matches('/')).exists());
}

#[test]
fn usage_errors_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("x.toml");
    std::fs::write(&f, TEAMS).unwrap();
    let f = f.to_str().unwrap();
    let (code, _, err) = gpuctl(&["validate", "--as", "/etc/gpuctl/other.toml", f]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--as /etc/gpuctl/other.toml: not a path gpuctld loads"),
        "{err}"
    );
    let (code, _, err) = gpuctl(&["validate", "--as", DEST, f, f]);
    assert_eq!(code, 2);
    assert!(err.contains("takes exactly one FILE"), "{err}");
    let (code, _, err) = gpuctl(&["validate", "--as", DEST, "/nonexistent/source"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/source"), "{err}");
}
