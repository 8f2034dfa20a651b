//! The VM scenarios' StatusText predicates (vm-tests/lib/gpuctld.sh: `is_converged`,
//! `is_not_converged`, `is_policy_error`) and list guard (vm-tests/lib/common.sh:
//! `require_nonempty`, `num_gt`, `check_not`), run by bash on the texts gpuctld really writes
//! (`ReconcileReport::summary`). "converged" is a substring of "not converged": a predicate that
//! matched the word would pass every VM wait on a host that did not converge.

use gpuctl::dbus_api::reply::ReconcileReport;
use std::process::Command;

/// Runs `CALL` (a shell command line) with the VM library sourced; its exit status and output.
fn sh(call: &str, args: &[&str]) -> (bool, String) {
    let lib = concat!(env!("CARGO_MANIFEST_DIR"), "/vm-tests/lib");
    let script = format!(". {lib}/common.sh && . {lib}/gpuctld.sh && {call}");
    let out = Command::new("bash")
        .arg("-c")
        .arg(script)
        .arg("vm-status")
        .args(args)
        .env("FAKE_NVML_STATE", "/nonexistent")
        .output()
        .expect("bash runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn report(teams: usize, gpus: usize, differs: &[&str], errors: &[&str]) -> String {
    ReconcileReport {
        teams,
        gpus,
        differs: differs.iter().map(|s| s.to_string()).collect(),
        errors: errors.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
    .summary()
}

fn is(pred: &str, text: &str, extra: &[&str]) -> bool {
    let mut args = vec![text];
    args.extend_from_slice(extra);
    sh(&format!("{pred} \"$@\""), &args).0
}

#[test]
fn converged_matches_only_a_converged_status() {
    let ok = report(2, 2, &[], &[]);
    let waiting = report(
        2,
        2,
        &["gpu 0 not handed over to train: pid 42 (infer) holds it"],
        &[],
    );
    let failed = report(2, 2, &[], &["gpu-infer.slice: converged? no: job failed"]);
    let policy = "policy error in /etc/gpuctl/policy.d/20-x.toml:4:14: teams.x.memory-max: \
                  'lots' is not a size — last good policy in force";
    assert!(waiting.contains("not converged"), "{waiting}");

    assert!(is("is_converged", &ok, &[]), "{ok}");
    assert!(is("is_converged", &ok, &["2", "2"]), "{ok}");
    assert!(!is("is_converged", &ok, &["3"]), "team count checked: {ok}");
    assert!(
        !is("is_converged", &ok, &["2", "1"]),
        "GPU count checked: {ok}"
    );
    for bad in [waiting.as_str(), failed.as_str(), policy, "", "converged"] {
        assert!(!is("is_converged", bad, &[]), "{bad:?} is not converged");
        // What the scenarios grepped before: it passes on these.
        let word = sh("grep -q converged <<<\"$1\"", &[bad]).0;
        assert_eq!(word, bad.contains("converged"), "{bad:?}");
    }

    assert!(is("is_not_converged", &waiting, &[]), "{waiting}");
    assert!(!is("is_not_converged", &ok, &[]), "{ok}");
    assert!(is("is_policy_error", policy, &[]));
    assert!(!is("is_policy_error", &ok, &[]));
    assert!(!is("is_policy_error", &failed, &[]));
}

#[test]
fn require_nonempty_fails_on_an_empty_list() {
    let (ok, out) = sh("require_nonempty units \"$1\"", &["a.service b.service"]);
    assert!(ok && out.contains("ok - units: 2 found"), "{out}");
    for empty in ["", " \n\t "] {
        let (ok, out) = sh("require_nonempty units \"$1\"", &[empty]);
        assert!(!ok && out.contains("not ok - units"), "{empty:?}: {out}");
    }
}

#[test]
fn num_gt_fails_on_an_empty_query_result() {
    assert!(sh("num_gt \"$1\" 0.9", &["0.95"]).0);
    assert!(sh("num_gt \"$1\" 0.9", &["9.5e-01"]).0);
    assert!(!sh("num_gt \"$1\" 0.9", &["0.5"]).0);
    for empty in ["null", "", "NaN", "+Inf"] {
        assert!(!sh("num_gt \"$1\" 0.9", &[empty]).0, "{empty:?}");
        // What 86 did before: awk compares the string "null" with 0.9 and passes.
        if empty == "null" {
            assert!(
                sh("awk -v v=\"$1\" 'BEGIN {exit !(v > 0.9)}'", &[empty]).0,
                "the old check passed on null"
            );
        }
    }
}

/// `check_not`'s verdict on CMD: passed, and the line it printed.
fn check_not(args: &[&str]) -> (bool, String) {
    sh("check_not \"$@\"", args)
}

#[test]
fn check_not_passes_only_on_an_answer_no() {
    assert!(check_not(&["no", "false"]).0);
    assert!(check_not(&["no match", "grep", "-q", "x", "/dev/null"]).0);
    assert!(check_not(&["inactive", "sh", "-c", "exit 3"]).0);
    // podman's own refusals exit 125: an answer, not timeout(1)'s failure.
    assert!(check_not(&["podman refused", "sh", "-c", "exit 125"]).0);
    for (what, cmd) in [
        ("success", vec!["true"]),
        ("a timeout (124)", vec!["timeout", "0.1", "sleep", "5"]),
        ("not executable (126)", vec!["/dev/null"]),
        ("no such command (127)", vec!["no-such-command-anywhere"]),
        ("killed by a signal", vec!["sh", "-c", "kill -9 $$"]),
        ("grep's error (2)", vec!["grep", "-q", "x", "/no/such/file"]),
    ] {
        let mut args = vec!["probe"];
        args.extend(cmd);
        let (ok, out) = check_not(&args);
        assert!(!ok && out.contains("not ok - probe"), "{what}: {out}");
    }
    // With -s the status is the one given, and no other.
    assert!(check_not(&["-s", "7", "exit 7", "sh", "-c", "exit 7"]).0);
    let (ok, out) = check_not(&["-s", "7", "exit 7", "sh", "-c", "exit 1"]);
    assert!(!ok && out.contains("expected exit 7, got 1"), "{out}");
    // What check_not did before: any non-zero status passed, a timeout included.
    let old = "out=$(\"$@\" 2>&1); [ $? -ne 0 ]";
    assert!(sh(old, &["timeout", "0.1", "sleep", "5"]).0);
}
