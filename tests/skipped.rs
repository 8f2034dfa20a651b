//! The tests that need an outside tool skip when it is missing (so that `cargo test` runs on a
//! fresh machine), and libtest shows a passing test's words only with `--nocapture`. This
//! binary has no libtest harness (`harness = false` in Cargo.toml), so what it prints shows in
//! the default `cargo test` output: one line per missing tool, naming the tests that skipped and
//! the package to install. Under `GPUCTL_REQUIRE_<TOOL>=1` (`.ci/run` sets them) a missing tool
//! fails here as it fails in those tests.

use std::path::Path;
use std::process::ExitCode;

/// The tool, the Debian package that has it, the variable that makes it required, and the test
/// files that skip without it.
const TOOLS: &[(&str, &str, &str, &[&str])] = &[
    (
        "promtool",
        "prometheus",
        "GPUCTL_REQUIRE_PROMTOOL",
        &["tests/monitoring.rs", "tests/fleet_promql.rs"],
    ),
    (
        "amtool",
        "prometheus-alertmanager",
        "GPUCTL_REQUIRE_AMTOOL",
        &["tests/alertmanager.rs"],
    ),
    (
        "dbus-daemon",
        "dbus-daemon",
        "GPUCTL_REQUIRE_DBUS_DAEMON",
        &["tests/wire_bus.rs"],
    ),
];

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            let f = d.join(tool);
            f.is_file()
                && std::os::unix::fs::PermissionsExt::mode(&f.metadata().unwrap().permissions())
                    & 0o111
                    != 0
        })
    })
}

fn main() -> ExitCode {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut failed = false;
    // The list above names every test that reads a GPUCTL_REQUIRE_ variable, so none skips
    // unreported.
    for e in std::fs::read_dir(repo.join("tests")).unwrap().flatten() {
        let p = e.path();
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        let name = format!("tests/{}", e.file_name().to_string_lossy());
        let uses = |var: &str| {
            text.contains(var) || text.contains("common/dbus.rs") && var.contains("DBUS")
        };
        for (_, _, var, files) in TOOLS {
            if name != "tests/skipped.rs" && uses(var) && !files.contains(&name.as_str()) {
                println!("tests/skipped.rs: {name} reads {var} but is not listed in TOOLS");
                failed = true;
            }
        }
    }
    for (tool, package, var, files) in TOOLS {
        if on_path(tool) {
            continue;
        }
        let line = format!(
            "{tool} is not installed, so {} ran without it (apt-get install {package}; {var}=1 \
             makes this an error)",
            files.join(" and ")
        );
        if std::env::var_os(var).is_some() {
            println!("FAILED: {line}");
            failed = true;
        } else {
            println!("SKIPPED: {line}");
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
