//! An outside tool a test runs (promtool, amtool), or `None` with a note when it is missing:
//! the test then skips, unless its `GPUCTL_REQUIRE_<TOOL>` variable is set (`.ci/run` sets
//! them), where a missing tool fails. tests/skipped.rs lists who skips for lack of what.
//!
//! Included with `#[path = "common/tool.rs"] mod tool;`.

use std::path::PathBuf;

/// `name` from /usr/bin or /usr/local/bin (Debian's `package` has it).
pub fn find(name: &str, package: &str, require_var: &str) -> Option<PathBuf> {
    let found = ["/usr/bin", "/usr/local/bin"]
        .iter()
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.exists());
    if found.is_none() {
        assert!(
            std::env::var_os(require_var).is_none(),
            "{name} not found and {require_var} is set (apt-get install {package})"
        );
        eprintln!("skipping: {name} not installed (Debian package {package})");
    }
    found
}
