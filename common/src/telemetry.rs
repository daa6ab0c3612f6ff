//! Process-wide setup that must happen before anything else: the rustls crypto provider and the
//! tracing subscriber.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::ParseError;

use crate::cli::LogFormat;

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `--log-level` or RUST_LOG is not a valid filter.
    #[error("invalid log filter {filter:?}")]
    InvalidFilter {
        /// The filter as given.
        filter: String,
        /// What the parser said.
        #[source]
        source: ParseError,
    },
    /// A global subscriber was already installed in this process.
    #[error("a tracing subscriber is already installed: {0}")]
    AlreadyInstalled(String),
}

/// Displays an error with its sources, `outer: inner: root`, so one log line says everything.
/// A source whose message the line already contains (many errors repeat their source in their
/// own message) is skipped.
#[derive(Debug, Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut line = self.0.to_string();
        let mut source = self.0.source();
        while let Some(error) = source {
            let message = error.to_string();
            if !line.contains(&message) {
                line.push_str(": ");
                line.push_str(&message);
            }
            source = error.source();
        }
        f.write_str(&line)
    }
}

/// Installs ring as the process-wide rustls provider.
///
/// kube's TLS client needs exactly one default provider; when two are compiled in (ring and
/// aws-lc-rs through some dependency) it panics on client creation unless one was installed.
/// Installing it again is harmless, so this may be called more than once.
pub fn install_crypto_provider() {
    // An Err only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Builds the log filter: `--log-level` when given, else RUST_LOG, else `info`.
pub fn build_filter(
    log_level: Option<&str>,
    rust_log: Option<&str>,
) -> Result<EnvFilter, TelemetryError> {
    let filter = log_level
        .or(rust_log.filter(|s| !s.trim().is_empty()))
        .unwrap_or("info");
    EnvFilter::try_new(filter).map_err(|source| TelemetryError::InvalidFilter {
        filter: filter.to_owned(),
        source,
    })
}

/// Installs the crypto provider and the global tracing subscriber (JSON or text on stdout).
pub fn init(format: LogFormat, log_level: Option<&str>) -> Result<(), TelemetryError> {
    install_crypto_provider();
    let rust_log = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    let filter = build_filter(log_level, rust_log.as_deref())?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let result = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
    result.map_err(|e| TelemetryError::AlreadyInstalled(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_wins_over_env() {
        let filter = build_filter(Some("debug"), Some("error")).unwrap();
        assert_eq!(filter.to_string(), "debug");
    }

    #[test]
    fn env_is_used_without_flag() {
        let filter = build_filter(None, Some("warn,kube=debug"))
            .unwrap()
            .to_string();
        let mut directives: Vec<_> = filter.split(',').collect();
        directives.sort_unstable();
        assert_eq!(directives, ["kube=debug", "warn"]);
    }

    #[test]
    fn info_without_flag_or_env() {
        assert_eq!(build_filter(None, None).unwrap().to_string(), "info");
        assert_eq!(build_filter(None, Some(" ")).unwrap().to_string(), "info");
    }

    #[test]
    fn invalid_filter_is_reported() {
        let err = build_filter(Some("kube=notalevel"), None).unwrap_err();
        assert!(err.to_string().contains("kube=notalevel"), "{err}");
    }

    #[test]
    fn error_chain_shows_every_source() {
        let err = build_filter(Some("kube=notalevel"), None).unwrap_err();
        let source = std::error::Error::source(&err).unwrap().to_string();
        assert!(
            !err.to_string().contains(&source),
            "source repeated in {err}"
        );
        assert_eq!(
            ErrorChain(&err).to_string(),
            format!("invalid log filter \"kube=notalevel\": {source}")
        );
    }
}
