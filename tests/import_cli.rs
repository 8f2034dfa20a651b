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
  with-unsupported:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
    - devices: [1]
      device-filter: "0x233010DE"
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
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
        "with-unsupported",
        "--owner",
        "infer",
        "-o",
        out.to_str().unwrap(),
    ];
    let (code, _, err) = gpuctl(&args);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(
            "mig-configs.with-unsupported[1].device-filter: unsupported: a device-filter on a \
             devices list"
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
        text.contains("# NOT IMPORTED: mig-configs.with-unsupported[1].device-filter"),
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

/// A file of the structure of mig-parted's default config (`tests/data/`, written for gpuctl):
/// every config imports, or is refused naming the part and why; what imports validates, and
/// `all-balanced` on A800, H800, H20, B200, GB200 and H800 NVL hosts plans mig-parted's layout
/// for that model.
#[test]
fn a_default_config_shaped_file_imports_config_by_config() {
    use gpuctl::import::mig_parted::import;
    let yaml = include_str!("data/mig-parted-default-shape.yaml");
    let doc: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
    let names: Vec<String> = doc["mig-configs"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 13);
    // The parts that cannot be imported, and the words that say why.
    let refused = [("all-1g.16gb", "profile 1g.16gb is in no GPU model")];
    let dir = tempfile::tempdir().unwrap();
    let teams = dir.path().join("10-teams.toml");
    std::fs::write(
        &teams,
        "version = 1\n[teams.infer]\nmembers = [\"alice\"]\n",
    )
    .unwrap();
    for name in &names {
        let got = import(yaml, name, Some("infer"), "fixture").unwrap();
        let why: Vec<String> = got.unsupported.iter().map(|u| u.to_string()).collect();
        match refused.iter().find(|(n, _)| n == name) {
            Some((_, words)) => {
                assert_eq!(why.len(), 1, "{name}: {why:?}");
                assert!(why[0].contains(words), "{name}: {why:?}");
                assert!(
                    why[0].starts_with(&format!("mig-configs.{name}[0]")),
                    "{why:?}"
                );
            }
            None => assert!(why.is_empty(), "{name}: {why:?}"),
        }
        if !why.is_empty() {
            continue;
        }
        let f = dir.path().join(format!("50-{name}.toml"));
        std::fs::write(&f, &got.toml).unwrap();
        let out = gpuctl::policy::load_files(&[teams.clone(), f]);
        let errors: Vec<String> = out
            .diagnostics
            .iter()
            .filter(|d| d.severity == gpuctl::policy::Severity::Error)
            .map(|d| d.to_string())
            .collect();
        assert!(errors.is_empty(), "{name}: {errors:?}\n{}", got.toml);
    }

    // Filter IDs of models gpuctl has no entry for are notes, not refusals.
    let balanced = import(yaml, "all-balanced", Some("infer"), "fixture").unwrap();
    let noted: Vec<&str> = balanced.notes.iter().map(|n| n.why.as_str()).collect();
    assert_eq!(noted.len(), 1, "{noted:?}");
    assert!(noted[0].contains("0x233D10DE"), "{noted:?}");
    assert!(balanced.toml.contains("0x233D10DE"));
    // A GB200 profile under its earlier name imports as today's, and says so.
    let old = import(yaml, "all-3g.95gb", Some("infer"), "fixture").unwrap();
    assert!(old.unsupported.is_empty(), "{:?}", old.unsupported);
    assert_eq!(old.notes.len(), 1, "{:?}", old.notes);
    assert!(
        old.notes[0].why.contains("GB200's 3g.93gb") && old.notes[0].why.contains("imported as"),
        "{:?}",
        old.notes
    );
    assert!(
        old.toml
            .contains("profile = \"3g.93gb\"\nowner = \"infer\"\ncount = 2\n"),
        "{}",
        old.toml
    );
    let f = dir.path().join("50-all-balanced.toml");
    let p = gpuctl::policy::load_files(&[teams.clone(), f])
        .policy
        .unwrap();
    for (host, want) in [
        ("a800*8", ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]),
        (
            "a800-pcie-80gb*2",
            ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"],
        ),
        ("h800-80gb*8", ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]),
        ("h800-pcie*2", ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]),
        ("a800-40gb*2", ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]),
        ("h20*8", ["1g.12gb", "1g.12gb", "2g.24gb", "3g.48gb"]),
        ("b200*8", ["1g.23gb", "1g.23gb", "2g.45gb", "3g.90gb"]),
        ("gb200*4", ["1g.23gb", "1g.23gb", "2g.47gb", "3g.93gb"]),
        ("h800-nvl*2", ["1g.12gb", "1g.12gb", "2g.24gb", "3g.47gb"]),
    ] {
        let obs = gpuctl::sim::build(host).unwrap();
        let d = gpuctl::plan::desired(&p, &obs);
        assert_eq!(d.gpus.len(), obs.gpus.len(), "{host}");
        for g in &d.gpus {
            let mut got: Vec<&str> = g.mig.layout.iter().map(|l| l.profile.as_str()).collect();
            got.sort();
            assert_eq!(got, want, "{host} gpu {}", g.index);
        }
    }

    // `all-enabled` (MIG mode only) is `mig = []`: MIG turns on, no instance is made, and no
    // team gets a device.
    let enabled = import(yaml, "all-enabled", Some("infer"), "fixture").unwrap();
    assert!(
        enabled.toml.contains("[[gpu]]\nall = true\nmig = []\n"),
        "{}",
        enabled.toml
    );
    let p = gpuctl::policy::load_files(&[teams, dir.path().join("50-all-enabled.toml")])
        .policy
        .unwrap();
    let obs = gpuctl::sim::build("h800-80gb*2").unwrap();
    let pl = gpuctl::plan::plan(&p, &obs);
    use gpuctl::plan::ActionKind;
    let modes = pl
        .actions
        .iter()
        .filter(|a| matches!(a.kind, ActionKind::SetMigMode { enable: true, .. }))
        .count();
    assert_eq!(modes, 2, "{pl:#?}");
    assert!(
        !pl.actions
            .iter()
            .any(|a| matches!(a.kind, ActionKind::CreateGi { .. })),
        "{pl:#?}"
    );
    assert!(pl.blocked.is_empty(), "{pl:#?}");
    let d = gpuctl::plan::desired(&p, &obs);
    assert!(d.teams["infer"].visible.is_empty());
}
