//! A team's share for Docker and docker-compose, which Debian's Docker (20.10) cannot take as a
//! CDI device: the same [`ContainerEdits`] as the team's CDI spec, written as `docker run` flags
//! ([`run_flags`]) or as a compose service fragment ([`compose`]), plus the team slice as the
//! cgroup parent (limits and the device filter: docs/containers.md, "Docker").
//!
//! Pure: `gpuctl env --format docker|compose` gathers the edits (the slice's or a placed job's
//! `DeviceAllow=` nodes, the env, the MPS pipe directories) and prints these.

use crate::cdi::ContainerEdits;

/// Quote for POSIX sh: single quotes, with `'` written as `'\''` (also `gpuctl env`'s shell
/// format).
pub fn sh_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', r"'\''"))
}

/// Whether `v` survives the shell's word splitting and globbing unquoted (`$(gpuctl env …)`).
fn plain_word(v: &str) -> bool {
    !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || ",-_./:@+=%".contains(c))
}

/// One `docker run` argument: bare when it is a plain word, else quoted for `sh` (then the
/// line is for `eval`; gpuctld's values are UUIDs, paths and numbers, so this is a safeguard).
fn arg(v: &str) -> String {
    if plain_word(v) {
        v.to_string()
    } else {
        sh_quote(v)
    }
}

/// The `docker run` flags that put a container into `team`'s share, on one line:
/// `--cgroup-parent=gpu-<team>.slice`, a `--device` per node, an `-e` per variable and a bind
/// `--mount` per MPS pipe directory (`--mount`, not `-v`: Docker refuses a missing source
/// instead of creating an empty directory, so a container of an MPS team whose daemon is down
/// fails to start rather than run outside MPS, as with CDI).
pub fn run_flags(team: &str, edits: &ContainerEdits) -> String {
    let mut out = vec![format!(
        "--cgroup-parent={}",
        crate::systemd::props::slice_unit(team)
    )];
    out.extend(edits.nodes.iter().map(|n| format!("--device={}", arg(n))));
    out.extend(edits.env.iter().map(|kv| format!("-e {}", arg(kv))));
    out.extend(
        edits
            .mounts
            .iter()
            .map(|d| format!("--mount {}", arg(&format!("type=bind,src={d},dst={d}")))),
    );
    out.join(" ") + "\n"
}

/// A YAML scalar: double-quoted JSON string syntax, which YAML reads the same (every JSON
/// escape is a YAML escape), so no value is taken for a number, bool, null or anchor.
fn yaml_str(v: &str) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A YAML mapping key: bare when it is an identifier (environment names), else quoted.
fn yaml_key(k: &str) -> String {
    if !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        k.to_string()
    } else {
        yaml_str(k)
    }
}

/// A compose file with one service, `service`, holding `team`'s share: `cgroup_parent`,
/// `devices`, `environment` and bind `volumes` for the MPS pipe directories. No `version` key:
/// the Compose Specification (docker-compose 1.27 and later, Compose v2) takes the file as an
/// override (`-f docker-compose.yml -f gpu.yml`) of a service of that name, or its lines can be
/// merged into the service by hand.
pub fn compose(team: &str, service: &str, edits: &ContainerEdits) -> String {
    let mut y = format!(
        "# gpuctl env --team {team} --format compose: team {team}'s share for a compose \
         service.\n# Use as an override file (docker-compose -f docker-compose.yml -f THIS up) \
         or merge into the service.\nservices:\n  {}:\n    cgroup_parent: {}\n",
        yaml_key(service),
        yaml_str(&crate::systemd::props::slice_unit(team))
    );
    if !edits.nodes.is_empty() {
        y.push_str("    devices:\n");
        for n in &edits.nodes {
            y.push_str(&format!("      - {}\n", yaml_str(&format!("{n}:{n}"))));
        }
    }
    if !edits.env.is_empty() {
        y.push_str("    environment:\n");
        for kv in &edits.env {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            y.push_str(&format!("      {}: {}\n", yaml_key(k), yaml_str(v)));
        }
    }
    if !edits.mounts.is_empty() {
        y.push_str("    volumes:\n");
        for d in &edits.mounts {
            let d = yaml_str(d);
            y.push_str(&format!(
                "      - type: bind\n        source: {d}\n        target: {d}\n"
            ));
        }
    }
    y
}

/// Whether `name` is a compose service name (`[a-zA-Z0-9._-]+`, the Compose Specification's).
pub fn valid_service_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn edits(env: &str, mps: &[&str]) -> ContainerEdits {
        let nodes: BTreeSet<String> = ["/dev/nvidia0", "/dev/nvidiactl"].map(String::from).into();
        ContainerEdits::new(&nodes, env, mps)
    }

    #[test]
    fn flags_are_plain_words_and_odd_values_are_quoted_for_sh() {
        let e = edits(
            "GPUCTL_TEAM=a\nCUDA_VISIBLE_DEVICES=\nX=it's $HOME\n",
            &["a-gpus"],
        );
        let f = run_flags("a", &e);
        assert_eq!(
            f,
            "--cgroup-parent=gpu-a.slice --device=/dev/nvidia0 --device=/dev/nvidiactl \
             -e GPUCTL_TEAM=a -e CUDA_VISIBLE_DEVICES= -e 'X=it'\\''s $HOME' \
             --mount type=bind,src=/run/gpuctl/mps/a-gpus,dst=/run/gpuctl/mps/a-gpus\n"
        );
        // What a shell hands docker: each flag and value one word, the odd one intact.
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("for w in {}; do echo \"[$w]\"; done", f.trim_end()))
            .output()
            .unwrap();
        let words = String::from_utf8_lossy(&out.stdout);
        assert!(words.contains("[X=it's $HOME]\n"), "{words}");
        assert!(words.contains("[CUDA_VISIBLE_DEVICES=]\n"), "{words}");
    }

    #[test]
    fn compose_reads_back_as_the_same_service_whatever_the_values() {
        let e = edits(
            "GPUCTL_TEAM=a\nCUDA_VISIBLE_DEVICES=\nN=0123\nB=yes\nQ=\"x\": #y\n",
            &["a-gpus"],
        );
        let y = compose("a", "web.1", &e);
        let v: serde_json::Value = serde_norway::from_str(&y).unwrap();
        let s = &v["services"]["web.1"];
        assert_eq!(s["cgroup_parent"], "gpu-a.slice");
        assert_eq!(
            s["devices"],
            serde_json::json!(["/dev/nvidia0:/dev/nvidia0", "/dev/nvidiactl:/dev/nvidiactl"])
        );
        // Strings stay strings: no number, bool or comment read into them.
        for (k, want) in [
            ("GPUCTL_TEAM", "a"),
            ("CUDA_VISIBLE_DEVICES", ""),
            ("N", "0123"),
            ("B", "yes"),
            ("Q", "\"x\": #y"),
        ] {
            assert_eq!(s["environment"][k], want, "{k}");
        }
        assert_eq!(
            s["volumes"][0],
            serde_json::json!({"type": "bind", "source": "/run/gpuctl/mps/a-gpus",
                "target": "/run/gpuctl/mps/a-gpus"})
        );
    }

    #[test]
    fn a_share_without_devices_has_no_devices_or_volumes() {
        let e = ContainerEdits::new(&BTreeSet::new(), "NVIDIA_VISIBLE_DEVICES=void\n", &[]);
        let v: serde_json::Value = serde_norway::from_str(&compose("idle", "idle", &e)).unwrap();
        let s = &v["services"]["idle"];
        assert!(
            s.get("devices").is_none() && s.get("volumes").is_none(),
            "{s}"
        );
        assert_eq!(
            run_flags("idle", &e),
            "--cgroup-parent=gpu-idle.slice -e NVIDIA_VISIBLE_DEVICES=void\n"
        );
    }

    #[test]
    fn service_names() {
        for ok in ["web", "a.b-c_1", "X"] {
            assert!(valid_service_name(ok), "{ok}");
        }
        for bad in ["", "a b", "a:b", "é"] {
            assert!(!valid_service_name(bad), "{bad}");
        }
    }
}
