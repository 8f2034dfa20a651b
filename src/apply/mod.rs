//! Carrying out a plan: the executor and the small effector traits it drives.
//!
//! Each effector is one narrow trait so that a real backend (NVML, systemd over D-Bus, files
//! under a root) and a simulated one are interchangeable, and tests can verify the exact calls.

use crate::profiles::Placement;
use thiserror::Error;

/// A failed effector call, carrying what it concerned.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EffectError {
    /// The thing is busy (NVML_ERROR_IN_USE): processes or child instances hold it.
    #[error("{what}: in use")]
    InUse {
        /// What was being changed.
        what: String,
    },
    /// Not enough free slices (NVML_ERROR_INSUFFICIENT_RESOURCES).
    #[error("{what}: insufficient resources")]
    InsufficientResources {
        /// What was being created.
        what: String,
    },
    /// Anything else, with the backend's words.
    #[error("{what}: {message}")]
    Other {
        /// What was being changed.
        what: String,
        /// The backend's message.
        message: String,
    },
}

/// MIG mutations on one host. GPUs are named by UUID, instances by driver id.
pub trait GpuEffector {
    /// Set MIG mode; returns `true` when the change is pending a GPU reset.
    fn set_mig_mode(&mut self, gpu: &str, enable: bool) -> Result<bool, EffectError>;
    /// Reset one GPU (never more than the one named).
    fn reset_gpu(&mut self, gpu: &str) -> Result<(), EffectError>;
    /// Create a GPU instance at a placement; returns the driver-chosen GI id.
    fn create_gi(
        &mut self,
        gpu: &str,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, EffectError>;
    /// Destroy a GPU instance.
    fn destroy_gi(&mut self, gpu: &str, gi: u32) -> Result<(), EffectError>;
    /// Create a compute instance at a placement inside a GI; returns the CI id.
    fn create_ci(
        &mut self,
        gpu: &str,
        gi: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, EffectError>;
    /// Destroy a compute instance.
    fn destroy_ci(&mut self, gpu: &str, gi: u32, ci: u32) -> Result<(), EffectError>;
}
