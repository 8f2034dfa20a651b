//! See issue 2.
use super::{Diagnostic, Policy};
use crate::paths::Root;
use std::path::PathBuf;

/// Result of loading: the policy when there were no errors, and every diagnostic.
#[derive(Debug)]
pub struct LoadOutcome {
    /// The policy, `None` when any error was found.
    pub policy: Option<Policy>,
    /// Errors and warnings, all of them.
    pub diagnostics: Vec<Diagnostic>,
}

/// Load the host policy from the standard directories under `root`.
pub fn load(_root: &Root) -> LoadOutcome {
    unimplemented!()
}

/// Load an explicit list of files, merged in the order given.
pub fn load_files(_files: &[PathBuf]) -> LoadOutcome {
    unimplemented!()
}
