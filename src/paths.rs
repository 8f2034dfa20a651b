//! Host paths, all resolved under an injectable root so that tests run against temp dirs.

use std::path::{Path, PathBuf};

/// The directory that stands for `/` (the real root in production, a temp dir in tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root(PathBuf);

impl Default for Root {
    fn default() -> Self {
        Root(PathBuf::from("/"))
    }
}

impl Root {
    /// A root at `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Root(dir.into())
    }

    /// The root directory itself.
    pub fn dir(&self) -> &Path {
        &self.0
    }

    /// Resolve an absolute host path (`/etc/gpuctl`) under the root.
    pub fn join(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let p = host_path.as_ref();
        self.0.join(p.strip_prefix("/").unwrap_or(p))
    }
}

/// Vendor policy fragments (lowest precedence).
pub const POLICY_DIR_VENDOR: &str = "/usr/lib/gpuctl/policy.d";
/// Runtime policy fragments.
pub const POLICY_DIR_RUN: &str = "/run/gpuctl/policy.d";
/// Admin policy fragments (highest precedence).
pub const POLICY_DIR_ETC: &str = "/etc/gpuctl/policy.d";
/// The admin's main policy file, merged before the fragments.
pub const POLICY_MAIN: &str = "/etc/gpuctl/policy.toml";
/// Persistent agent state: MIG ownership labels and the apply journal.
pub const STATE_DIR: &str = "/var/lib/gpuctl";
/// Runtime state: team environment files, MPS pipe directories.
pub const RUN_DIR: &str = "/run/gpuctl";
/// The placement leases' detail, one root-only file per live member scope (mode 0700:
/// `systemctl` shows every local user a scope's properties, so the detail is not kept there).
pub const LEASE_DIR: &str = "/run/gpuctl/leases";
/// gpuctld's health registry: every quarantine and drain (docs/health.md); kept over a restart
/// of gpuctld, not over a reboot.
pub const HEALTH_REGISTRY: &str = "/run/gpuctl/health.json";
/// Loans being taken back ([`crate::dbus_api::lend`]), one record per borrower's scope: a
/// gpuctld restart keeps each reclaim's notice time, so a borrower's grace neither restarts
/// nor is cut short.
pub const RECLAIM_DIR: &str = "/run/gpuctl/reclaims";
/// The layout gpuctld switched each re-sliced GPU to, since when and why
/// ([`crate::reslice::state`]); not kept over a reboot, which ends every MIG instance anyway.
pub const LAYOUTS: &str = "/run/gpuctl/layouts.json";
/// Where the NVIDIA driver lists MIG capability minors.
pub const MIG_MINORS: &str = "/proc/driver/nvidia-caps/mig-minors";

/// Runtime directory of all MPS instances.
pub const MPS_RUN_DIR: &str = "/run/gpuctl/mps";
/// Log directory root of all MPS instances.
pub const MPS_LOG_DIR: &str = "/var/log/gpuctl/mps";

/// Pipe directory of an instance (`CUDA_MPS_PIPE_DIRECTORY`): the unit's `RuntimeDirectory=`.
pub fn mps_pipe_dir(instance: &str) -> String {
    format!("{MPS_RUN_DIR}/{instance}")
}

/// Log directory of an instance (`CUDA_MPS_LOG_DIRECTORY`).
pub fn mps_log_dir(instance: &str) -> String {
    format!("{MPS_LOG_DIR}/{instance}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_strips_leading_slash() {
        let r = Root::new("/tmp/x");
        assert_eq!(r.join("/etc/gpuctl"), PathBuf::from("/tmp/x/etc/gpuctl"));
        assert_eq!(Root::default().join("/etc"), PathBuf::from("/etc"));
    }
}
