//! A fake `libnvidia-ml.so` for testing gpuctl's real NVML code path without a GPU.
//!
//! Built as a `cdylib`, it is loaded by the real `nvml-wrapper` through
//! `Nvml::builder().lib_path(...)`. The modelled GPUs, their MIG geometry, fake processes,
//! fault knobs and a call log live in a JSON state file named by `FAKE_NVML_STATE`, shared
//! across processes under a `flock`. See `README.md` for the environment variables, the
//! state format, and which driver behaviours are modelled versus assumed.
//!
//! Modules: [`types`] (C ABI), [`model`] (reference profiles), [`state`] (state file),
//! [`mig`] (placement and id rules), [`api`] (exported NVML functions), [`control`]
//! (test controls: reset, reboot, processes, faults), [`health`] (events and health
//! counters), [`usage`]
//! (utilisation, power, temperature, graphics processes, GPM), `stubs` (every other symbol
//! `nvml-wrapper-sys` resolves, answering `NVML_ERROR_NOT_SUPPORTED`).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(not(target_pointer_width = "64"))]
compile_error!("fake-nvml encodes handles in 64-bit pointers");

pub mod api;
pub mod control;
pub mod health;
pub mod mig;
pub mod model;
pub mod state;
mod stubs;
pub mod types;
pub mod usage;
