//! Per-team CDI specs (`gpuctl.io/team=<team>`) on simulated hosts: golden content for whole
//! GPUs, MIG devices, MPS shares and a device-less team; validation against the CDI JSON schema
//! (tests/cdi-schema, copied from the CDI repository); the spec follows MIG layout and policy
//! changes through the planner, and planning after an apply stays empty. The same share as
//! `docker run` flags and a compose fragment (`gpuctl env --format docker|compose`), golden
//! too, for whole GPUs, MIG devices and MPS shares.
//!
//! `GPUCTL_UPDATE_GOLDEN=1 cargo test --test cdi_spec` rewrites tests/golden-cdi/.

mod common;
#[path = "common/golden.rs"]
mod golden;
use common::*;
use gpuctl::plan::{plan, ActionKind};
use gpuctl::policy::{GpuUse, Policy, Reconfigure, Selector};
use gpuctl::sim::SimHost;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn schema_validator() -> jsonschema::Validator {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cdi-schema");
    let load = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap()
    };
    // schema.json refers to "defs.json#/definitions/…": serve defs.json next to it under one
    // base URI, as the CDI repository's own validator loads both files from one directory.
    let registry = jsonschema::Registry::new()
        .add("https://cdi.invalid/schema/defs.json", load("defs.json"))
        .unwrap()
        .prepare()
        .unwrap();
    jsonschema::options()
        .with_base_uri("https://cdi.invalid/schema/schema.json")
        .with_registry(&registry)
        .build(&load("schema.json"))
        .expect("the CDI schema compiles")
}

fn assert_schema_valid(v: &jsonschema::Validator, name: &str, text: &str) {
    let doc: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
    let errors: Vec<String> = v.iter_errors(&doc).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{name} breaks the CDI schema: {errors:#?}\n{text}"
    );
}

fn golden(case: &str, team: &str, got: &str) {
    let path: PathBuf = golden::repo_path("tests/golden-cdi")
        .join(case)
        .join(format!("{team}.json"));
    golden::check(&path, got);
}

/// The team's share gathered as `gpuctl env --format docker|compose` does (the slice's
/// `DeviceAllow=`, the env, the MPS pipe directories); it must be the spec's, and its Docker and
/// compose renderings are golden.
fn docker_golden(h: &SimHost, case: &str, team: &str) {
    let mut instances: Vec<&str> = h
        .state
        .mps
        .iter()
        .filter(|(_, s)| s.team == team)
        .map(|(i, _)| i.as_str())
        .collect();
    instances.sort();
    let edits = gpuctl::cdi::ContainerEdits::new(
        &h.state.slices[team].device_allow,
        &h.state.env_files[team],
        &instances,
    );
    let share: Value = serde_json::from_str(&gpuctl::cdi::spec_of(team, &edits)).unwrap();
    assert_eq!(
        share["devices"][0],
        spec_json(h, team)["devices"][0],
        "{case}/{team}: the Docker share is the CDI spec's share entry"
    );
    let dir = golden::repo_path("tests/golden-cdi").join(case);
    golden::check(
        &dir.join(format!("{team}.docker")),
        &gpuctl::docker::run_flags(team, &edits),
    );
    let compose = gpuctl::docker::compose(team, team, &edits);
    golden::check(&dir.join(format!("{team}.compose.yml")), &compose);
    let v: Value = serde_norway::from_str(&compose).unwrap();
    let svc = &v["services"][team];
    assert_eq!(svc["cgroup_parent"], format!("gpu-{team}.slice"));
    assert_eq!(
        svc["devices"].as_array().map_or(0, Vec::len),
        edits.nodes.len(),
        "{case}/{team}"
    );
    assert_eq!(
        svc["volumes"].as_array().map_or(0, Vec::len),
        instances.len()
    );
}

fn spec_json(h: &SimHost, team: &str) -> Value {
    serde_json::from_str(&h.state.cdi_specs[team]).unwrap()
}

/// The whole share's entry (named after the team, first).
fn edits(h: &SimHost, team: &str) -> Value {
    let s = spec_json(h, team);
    assert_eq!(s["kind"], "gpuctl.io/team");
    assert_eq!(s["devices"][0]["name"], team);
    s["devices"][0]["containerEdits"].clone()
}

/// The per-device entries: `<team>.<UUID>` → its edits.
fn device_edits(h: &SimHost, team: &str) -> Vec<(String, Value)> {
    let s = spec_json(h, team);
    s["devices"].as_array().unwrap()[1..]
        .iter()
        .map(|d| {
            let name = d["name"].as_str().unwrap();
            let uuid = name
                .strip_prefix(&format!("{team}."))
                .unwrap_or_else(|| panic!("{team}: device {name} is not <team>.<UUID>"));
            (uuid.to_string(), d["containerEdits"].clone())
        })
        .collect()
}

fn env_value(e: &Value, key: &str) -> String {
    strs(e, "env", None)
        .into_iter()
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
        .unwrap_or_else(|| panic!("no {key} in {e}"))
}

fn strs(v: &Value, key: &str, field: Option<&str>) -> Vec<String> {
    v[key]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| match field {
                    Some(f) => x[f].as_str().unwrap().to_string(),
                    None => x.as_str().unwrap().to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What every spec must agree with: the slice's DeviceAllow (nodes), the env file (env), the
/// team's MPS daemons (mounts).
fn assert_consistent(h: &SimHost, team: &str) {
    let e = edits(h, team);
    let nodes = strs(&e, "deviceNodes", Some("path"));
    let allow: Vec<String> = h.state.slices[team].device_allow.iter().cloned().collect();
    assert_eq!(
        nodes, allow,
        "{team}: device nodes are the slice's DeviceAllow"
    );
    let env_file: Vec<String> = h.state.env_files[team]
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(String::from)
        .collect();
    assert_eq!(
        strs(&e, "env", None),
        env_file,
        "{team}: env is the env file's"
    );
    let mut pipes: Vec<String> = h
        .state
        .mps
        .iter()
        .filter(|(_, s)| s.team == team)
        .map(|(i, _)| format!("/run/gpuctl/mps/{i}"))
        .collect();
    pipes.sort();
    assert_eq!(
        strs(&e, "mounts", Some("hostPath")),
        pipes,
        "{team}: MPS pipe dirs"
    );
    assert_eq!(strs(&e, "mounts", Some("containerPath")), pipes);
    let want_version = if pipes.is_empty() { "0.3.0" } else { "0.4.0" };
    assert_eq!(spec_json(h, team)["cdiVersion"], want_version);
    // One entry per device of the share, in CUDA_VISIBLE_DEVICES order, each a fence within the
    // slice's: its UUID alone, nodes the slice allows (and the control nodes), at most its own
    // MPS daemon's pipe.
    let per = device_edits(h, team);
    let cvd = env_value(&e, "CUDA_VISIBLE_DEVICES");
    let uuids: Vec<&str> = cvd.split(',').filter(|d| !d.is_empty()).collect();
    assert_eq!(
        per.iter().map(|(u, _)| u.as_str()).collect::<Vec<_>>(),
        uuids,
        "{team}: a CDI device per device of the share"
    );
    for (uuid, d) in &per {
        assert_eq!(env_value(d, "CUDA_VISIBLE_DEVICES"), *uuid);
        assert_eq!(env_value(d, "NVIDIA_VISIBLE_DEVICES"), *uuid);
        assert_eq!(env_value(d, "GPUCTL_TEAM"), team);
        let n = strs(d, "deviceNodes", Some("path"));
        for p in &n {
            assert!(allow.contains(p), "{team}.{uuid}: {p} is not the slice's");
        }
        for c in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] {
            assert!(n.contains(&c.to_string()), "{team}.{uuid}: {c}");
        }
        let m = strs(d, "mounts", Some("hostPath"));
        assert!(m.len() <= 1 && m.iter().all(|p| pipes.contains(p)), "{m:?}");
        if let Some(p) = m.first() {
            assert_eq!(env_value(d, "CUDA_MPS_PIPE_DIRECTORY"), *p);
        }
    }
}

fn whole_policy() -> Policy {
    policy(
        vec![team("a"), mps_team("b"), team("idle")],
        vec![
            assign(
                Selector::Index(vec![0, 1]),
                GpuUse::Owned("a".parse().unwrap()),
            ),
            assign(
                Selector::Index(vec![2]),
                GpuUse::Owned("b".parse().unwrap()),
            ),
        ],
        Reconfigure::WhenIdle,
    )
}

fn mig_policy() -> Policy {
    policy(
        vec![team("a"), mps_team("b"), team("idle")],
        vec![mig(
            0,
            &[("3g.40gb", "a", 1, &[]), ("2g.20gb", "b", 1, &["1c", "1c"])],
        )],
        Reconfigure::WhenIdle,
    )
}

#[test]
fn golden_specs_and_schema() {
    let v = schema_validator();
    for (case, p) in [("whole-gpus", whole_policy()), ("mig", mig_policy())] {
        let mut h = SimHost::from_spec("h100-80gb*3").unwrap();
        let (_, remaining) = apply(&p, &mut h);
        assert!(remaining.is_converged(), "{case}: {remaining:#?}");
        assert!(plan(&p, &h.state).is_converged(), "{case}: replan is empty");
        assert_eq!(
            h.state.cdi_specs.keys().collect::<Vec<_>>(),
            ["a", "b", "idle"]
        );
        for (team, text) in &h.state.cdi_specs {
            assert_schema_valid(&v, &format!("{case}/{team}"), text);
            assert_consistent(&h, team);
            golden(case, team, text);
            docker_golden(&h, case, team);
        }
        // The device-less team: an entry that grants nothing.
        let idle = edits(&h, "idle");
        assert!(idle.get("deviceNodes").is_none() && idle.get("mounts").is_none());
        let env = strs(&idle, "env", None);
        assert!(
            env.contains(&"CUDA_VISIBLE_DEVICES=".to_string()),
            "{env:?}"
        );
        assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()));
    }
}

#[test]
fn mig_spec_has_parent_caps_and_one_mount_per_mps_device() {
    let mut h = SimHost::from_spec("h100-80gb*3").unwrap();
    apply(&mig_policy(), &mut h);
    let a = strs(&edits(&h, "a"), "deviceNodes", Some("path"));
    // a: /dev/nvidia0, GI + CI caps, ctl + uvm + uvm-tools.
    assert!(a.contains(&"/dev/nvidia0".to_string()));
    assert_eq!(a.iter().filter(|p| p.contains("nvidia-caps/")).count(), 2);
    assert!(!a.iter().any(|p| p == "/dev/nvidia1" || p == "/dev/nvidia2"));
    let b = edits(&h, "b");
    // b: one GI with two CIs: 1 GI cap + 2 CI caps; two MIG devices, so two MPS daemons.
    let bn = strs(&b, "deviceNodes", Some("path"));
    assert_eq!(bn.iter().filter(|p| p.contains("nvidia-caps/")).count(), 3);
    assert_eq!(strs(&b, "mounts", Some("hostPath")).len(), 2);
    let cvd = strs(&b, "env", None)
        .into_iter()
        .find(|l| l.starts_with("CUDA_VISIBLE_DEVICES="))
        .unwrap();
    assert_eq!(cvd.matches("MIG-").count(), 2);
    // No cap node of a is in b's spec and the reverse.
    for p in a.iter().filter(|p| p.contains("nvidia-caps/")) {
        assert!(!bn.contains(p), "{p} in both");
    }
}

#[test]
fn a_device_entry_opens_only_its_own_mig_device() {
    let mut h = SimHost::from_spec("h100-80gb*3").unwrap();
    apply(&mig_policy(), &mut h);
    let caps = |e: &Value| -> Vec<String> {
        strs(e, "deviceNodes", Some("path"))
            .into_iter()
            .filter(|p| p.contains("nvidia-caps/"))
            .collect()
    };
    // b: one GI with two CIs: each device gets the GI's cap and its own CI's, and its own
    // daemon's pipe, so a container on one cannot open the other.
    let b = device_edits(&h, "b");
    assert_eq!(b.len(), 2);
    let (c0, c1) = (caps(&b[0].1), caps(&b[1].1));
    assert_eq!((c0.len(), c1.len()), (2, 2), "{c0:?} {c1:?}");
    assert_eq!(
        c0.iter().filter(|c| c1.contains(c)).count(),
        1,
        "only the GI cap is shared"
    );
    let m0 = strs(&b[0].1, "mounts", Some("hostPath"));
    let m1 = strs(&b[1].1, "mounts", Some("hostPath"));
    assert_eq!(m0.len(), 1);
    assert_ne!(m0, m1);
    let a = device_edits(&h, "a");
    assert_eq!(a.len(), 1);
    assert_eq!(caps(&a[0].1), caps(&edits(&h, "a")));
    // A device-less team has no device entries.
    assert!(device_edits(&h, "idle").is_empty());
    assert_eq!(
        gpuctl::cdi::device_name(&gpuctl::cdi::device_of("b", &b[0].0)),
        format!("gpuctl.io/team=b.{}", b[0].0)
    );
}

#[test]
fn the_schema_rejects_what_cdi_rejects() {
    // The validator can fail: a device without containerEdits, a spec without devices.
    let v = schema_validator();
    let no_edits = r#"{"cdiVersion":"0.3.0","kind":"gpuctl.io/team","devices":[{"name":"a"}]}"#;
    let no_devices = r#"{"cdiVersion":"0.3.0","kind":"gpuctl.io/team"}"#;
    let bad_node = r#"{"cdiVersion":"0.3.0","kind":"k/c","devices":[{"name":"a","containerEdits":{"deviceNodes":[{"major":1}]}}]}"#;
    for doc in [no_edits, no_devices, bad_node] {
        assert!(!v.is_valid(&serde_json::from_str(doc).unwrap()), "{doc}");
    }
}

#[test]
fn spec_follows_a_mig_layout_change_and_a_team_that_goes() {
    let mut h = SimHost::from_spec("h100-80gb*3").unwrap();
    let p1 = mig_policy();
    apply(&p1, &mut h);
    let before = h.state.cdi_specs.clone();
    let a_uuid_before = strs(&edits(&h, "a"), "env", None);

    // New layout: a gets two 1g.10gb instead of one 3g.40gb; b unchanged; team idle goes.
    let mut p2 = policy(
        vec![team("a"), mps_team("b")],
        vec![mig(
            0,
            &[("1g.10gb", "a", 2, &[]), ("2g.20gb", "b", 1, &["1c", "1c"])],
        )],
        Reconfigure::WhenIdle,
    );
    p2.host = p1.host.clone();
    let first = plan(&p2, &h.state);
    assert!(first.actions.iter().any(|x| matches!(
        &x.kind,
        ActionKind::RemoveCdi { team } if team == "idle"
    )));
    let (_, remaining) = apply(&p2, &mut h);
    assert!(remaining.is_converged(), "{remaining:#?}");
    assert!(plan(&p2, &h.state).is_converged());
    assert!(!h.state.cdi_specs.contains_key("idle"));
    assert_ne!(h.state.cdi_specs["a"], before["a"], "a's spec follows");
    assert_eq!(h.state.cdi_specs["b"], before["b"], "b's spec is untouched");
    let a_env = strs(&edits(&h, "a"), "env", None);
    assert_ne!(a_env, a_uuid_before);
    let cvd = a_env
        .iter()
        .find(|l| l.starts_with("CUDA_VISIBLE_DEVICES="))
        .unwrap();
    assert_eq!(cvd.matches("MIG-").count(), 2, "{cvd}");
    assert!(!cvd.contains('<'), "no placeholder reaches the host: {cvd}");
    assert_consistent(&h, "a");
    assert_eq!(
        strs(&edits(&h, "a"), "deviceNodes", Some("path"))
            .iter()
            .filter(|p| p.contains("nvidia-caps/"))
            .count(),
        4
    );
}

#[test]
fn a_team_that_loses_its_gpus_keeps_an_entry_that_grants_nothing() {
    let mut h = SimHost::from_spec("h100-80gb*3").unwrap();
    apply(&whole_policy(), &mut h);
    assert!(!strs(&edits(&h, "b"), "deviceNodes", Some("path")).is_empty());
    let p2 = policy(
        vec![team("a"), mps_team("b"), team("idle")],
        vec![assign(
            Selector::Index(vec![0, 1, 2]),
            GpuUse::Owned("a".parse().unwrap()),
        )],
        Reconfigure::WhenIdle,
    );
    let first = plan(&p2, &h.state);
    assert!(first.actions.iter().any(|x| matches!(
        &x.kind,
        ActionKind::WriteCdi { team, .. } if team == "b"
    )));
    apply(&p2, &mut h);
    assert!(plan(&p2, &h.state).is_converged());
    let b = edits(&h, "b");
    assert!(b.get("deviceNodes").is_none(), "{b}");
    assert!(
        b.get("mounts").is_none(),
        "no MPS daemon without devices: {b}"
    );
    assert!(strs(&b, "env", None).contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()));
    assert_consistent(&h, "b");
    assert_schema_valid(&schema_validator(), "b", &h.state.cdi_specs["b"]);
}

#[test]
fn a_spec_someone_outside_the_team_can_read_is_written_again() {
    let mut h = SimHost::from_spec("h100-80gb*3").unwrap();
    let p = whole_policy();
    apply(&p, &mut h);
    let a: gpuctl::policy::TeamName = "a".parse().unwrap();
    let members = h.state.cdi_readers[&a].clone();
    // A reader the policy no longer lists (a member removed, the content unchanged).
    let mut stale = members.clone();
    stale.push("mallory".into());
    h.state.cdi_readers.insert(a.clone(), stale);
    let again = plan(&p, &h.state);
    assert_eq!(again.actions.len(), 1, "{again:#?}");
    assert!(matches!(
        &again.actions[0].kind,
        ActionKind::WriteCdi { team, readers, .. } if team == "a" && *readers == members
    ));
    assert!(
        again.actions[0].reason.contains("mallory"),
        "{:?}",
        again.actions[0]
    );
    apply(&p, &mut h);
    assert!(plan(&p, &h.state).is_converged());
    // Fewer readers than members (a name NSS did not know, a member added since): not drift.
    h.state.cdi_readers.insert(a, Vec::new());
    assert!(plan(&p, &h.state).is_converged());
}

#[test]
fn a_hand_edited_spec_is_drift_the_plan_repairs() {
    let mut h = SimHost::from_spec("h100-80gb*3").unwrap();
    let p = whole_policy();
    apply(&p, &mut h);
    h.state
        .cdi_specs
        .insert("a".parse().unwrap(), "{\"edited\": true}\n".into());
    let again = plan(&p, &h.state);
    assert_eq!(again.actions.len(), 1, "{again:#?}");
    assert!(matches!(
        &again.actions[0].kind,
        ActionKind::WriteCdi { team, .. } if team == "a"
    ));
    apply(&p, &mut h);
    assert!(plan(&p, &h.state).is_converged());
}
