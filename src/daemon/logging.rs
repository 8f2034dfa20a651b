//! Logging: the journal with structured fields when running under systemd, stderr otherwise.
//!
//! Events carry `gpuctl_team`, `gpuctl_gpu` and `gpuctl_action` fields. tracing-journald
//! upper-cases field names and by default prefixes them with `F_`; the prefix is switched off
//! so they arrive as exactly `GPUCTL_TEAM=`, `GPUCTL_GPU=`, `GPUCTL_ACTION=`
//! (`journalctl GPUCTL_TEAM=infer`).
//!
//! The filter is tracing-subscriber's `Targets` (`info`, `info,gpuctl=debug`), not `EnvFilter`:
//! `EnvFilter` brings regex-automata and regex-syntax for span and field matching that gpuctld's
//! logs never used, and gpuctld's idle RSS is mostly its own resident code (figures:
//! docs/performance.md).

use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

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

/// Parse a `--log-level`/`GPUCTL_LOG` value once, at the boundary.
fn parse_filter(spec: String) -> Result<Targets, LoggingError> {
    spec.parse::<Targets>()
        .map_err(|source| LoggingError::Filter { spec, source })
}

/// Install the global subscriber. `level` (from `--log-level`) wins over `GPUCTL_LOG`; both take
/// `Targets` syntax (`debug`, `info,gpuctl=trace`); the default is `info`.
pub fn init(level: Option<&str>) -> Result<(), LoggingError> {
    let spec = level
        .map(str::to_string)
        .or_else(|| std::env::var("GPUCTL_LOG").ok())
        .unwrap_or_else(|| "info".into());
    let filter = parse_filter(spec)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn a_default_level_and_per_target_levels() {
        let f = parse_filter("info,gpuctl=debug".into()).unwrap();
        assert!(f.would_enable("gpuctl::daemon", &Level::DEBUG));
        assert!(!f.would_enable("gpuctl::daemon", &Level::TRACE));
        assert!(f.would_enable("zbus::connection", &Level::INFO));
        assert!(!f.would_enable("zbus::connection", &Level::DEBUG));
        let f = parse_filter("warn".into()).unwrap();
        assert!(!f.would_enable("gpuctl", &Level::INFO));
        assert!(f.would_enable("gpuctl", &Level::WARN));
    }

    #[test]
    fn a_bad_filter_is_an_error_that_quotes_it() {
        let e = parse_filter("gpuctl=loud".into()).unwrap_err();
        assert!(
            e.to_string().starts_with("log level \"gpuctl=loud\": "),
            "{e}"
        );
    }
}
