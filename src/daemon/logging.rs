//! Logging: the journal with structured fields when running under systemd, stderr otherwise.
//!
//! Events carry `gpuctl_team`, `gpuctl_gpu` and `gpuctl_action` fields. tracing-journald
//! upper-cases field names and by default prefixes them with `F_`; the prefix is switched off
//! so they arrive as exactly `GPUCTL_TEAM=`, `GPUCTL_GPU=`, `GPUCTL_ACTION=`
//! (`journalctl GPUCTL_TEAM=infer`).

use tracing_subscriber::prelude::*;
use tracing_subscriber::EnvFilter;

/// Logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The filter does not parse.
    #[error("log level {spec:?}: {source}")]
    Filter {
        /// The filter as given.
        spec: String,
        /// Why.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber is already installed.
    #[error("{0}")]
    Init(#[source] tracing_subscriber::util::TryInitError),
}

/// Install the global subscriber. `level` (from `--log-level`) wins over `GPUCTL_LOG`; both take
/// `EnvFilter` syntax (`debug`, `gpuctl=trace`); the default is `info`.
pub fn init(level: Option<&str>) -> Result<(), LoggingError> {
    let spec = level
        .map(str::to_string)
        .or_else(|| std::env::var("GPUCTL_LOG").ok())
        .unwrap_or_else(|| "info".into());
    let filter = match EnvFilter::try_new(&spec) {
        Ok(f) => f,
        Err(source) => return Err(LoggingError::Filter { spec, source }),
    };
    // JOURNAL_STREAM is set by systemd when stderr goes to the journal: log natively there
    // so the fields survive; anywhere else, human-readable stderr.
    let journald = std::env::var_os("JOURNAL_STREAM")
        .is_some()
        .then(|| tracing_journald::layer().ok())
        .flatten()
        .map(|l| {
            l.with_field_prefix(None)
                .with_syslog_identifier("gpuctld".into())
        });
    let registry = tracing_subscriber::registry().with(filter);
    match journald {
        Some(j) => registry.with(j).try_init(),
        None => registry
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .try_init(),
    }
    .map_err(LoggingError::Init)
}
