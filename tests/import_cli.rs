//! `gpuctl import mig-parted` through the real binary, and its output checked in place by
//! `gpuctl validate --as` against a host that defines the team.

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

/// mig-parted's README `custom-config` shape plus an entry gpuctl cannot express.
const YAML: &str = r#"version: v1
mig-configs:
  custom-config:
    - devices: [0,1,2,3]
      mig-enabled: false
    - devices: [4]
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
    - devices: [5]
      mig-enabled: true
      mig-devices:
        "2g.20gb": 3
  with-empty:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
    - devices: [1]
      mig-enabled: true
      mig-devices: {}
"#;

#[test]
fn imported_drop_in_validates_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("config.yaml");
    std::fs::write(&yaml, YAML).unwrap();
    let out = dir.path().join("50-mig.toml");
    let (code, _, err) = gpuctl(&[
        "import",
        "mig-parted",
        yaml.to_str().unwrap(),
        "-c",
        "custom-config",
        "--owner",
        "infer",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let root = dir.path().join("root");
    let d = root.join("etc/gpuctl/policy.d");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("10-teams.toml"),
        "version = 1\n[teams.infer]\nmembers = [\"alice\"]\n",
    )
    .unwrap();
    let (code, stdout, err) = gpuctl(&[
        "--root",
        root.to_str().unwrap(),
        "validate",
        "--as",
        "/etc/gpuctl/policy.d/50-mig.toml",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("3 gpu entries"), "{stdout}");

    // Without --owner: the placeholder fails validation, naming what to replace.
    let (code, text, _) = gpuctl(&[
        "import",
        "mig-parted",
        yaml.to_str().unwrap(),
        "-c",
        "custom-config",
    ]);
    assert_eq!(code, 0);
    std::fs::write(&out, text).unwrap();
    let (code, _, err) = gpuctl(&[
        "--root",
        root.to_str().unwrap(),
        "validate",
        "--as",
        "/etc/gpuctl/policy.d/50-mig.toml",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("FILL-IN-TEAM"), "{err}");
}

#[test]
fn unsupported_is_named_and_nothing_written_unless_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("config.yaml");
    std::fs::write(&yaml, YAML).unwrap();
    let out = dir.path().join("out.toml");
    let args = [
        "import",
        "mig-parted",
        yaml.to_str().unwrap(),
        "-c",
        "with-empty",
        "--owner",
        "infer",
        "-o",
        out.to_str().unwrap(),
    ];
    let (code, _, err) = gpuctl(&args);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(
            "mig-configs.with-empty[1].mig-devices: unsupported: MIG enabled with no MIG devices"
        ),
        "{err}"
    );
    assert!(!out.exists());
    let mut skip = args.to_vec();
    skip.push("--skip-unsupported");
    let (code, _, err) = gpuctl(&skip);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.contains("# NOT IMPORTED: mig-configs.with-empty[1].mig-devices"),
        "{text}"
    );
    assert!(text.contains("profile = \"3g.40gb\""), "{text}");

    let (code, _, err) = gpuctl(&["import", "mig-parted", yaml.to_str().unwrap(), "-c", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("no config 'nope'"), "{err}");
    let (code, _, _) = gpuctl(&["import", "mig-parted", "/nonexistent.yaml", "-c", "x"]);
    assert_eq!(code, 2);
    let (code, _, err) = gpuctl(&[
        "import",
        "mig-parted",
        yaml.to_str().unwrap(),
        "-c",
        "custom-config",
        "--owner",
        "Bad Team",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("not a valid team name"), "{err}");
}
