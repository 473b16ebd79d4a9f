//! Reaching the cluster, shared by [`crate::KafkaTransport`] and [`crate::KafkaSource`]: the
//! `kafka://` URL, the librdkafka client configuration (TLS and SASL are librdkafka properties,
//! passed through from the settings), and librdkafka's logs and errors routed to `tracing`.
//! librdkafka connects and reconnects by itself.

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;

use crate::config::Properties;

/// The default Kafka port, used for a broker address without one.
pub const DEFAULT_PORT: u16 = 9092;

/// Why a `kafka://` URL cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaUrlError {
    /// Not `kafka://...`.
    #[error("a Kafka address starts with `kafka://` (got `{0}`)")]
    Scheme(String),
    /// User name or password in the URL.
    #[error(
        "a Kafka address carries no credentials; set `sasl.username` and `sasl.password` in \
         `[kafka.properties]` (with `security.protocol` and `sasl.mechanism`)"
    )]
    Credentials,
    /// No broker, an empty entry, or a bad port.
    #[error("`{0}` is not a list of brokers `host:port,host:port`")]
    Brokers(String),
}

/// The bootstrap list of `url`: `kafka://host:port,host:port` (a missing port is 9092; a
/// trailing `/` is allowed). TLS and SASL are librdkafka properties, not part of the URL.
///
/// # Errors
/// [`KafkaUrlError`] for another scheme, credentials in the URL, or a bad broker list. The
/// error never repeats a password.
pub fn bootstrap_servers(url: &str) -> Result<String, KafkaUrlError> {
    let Some(rest) = url.strip_prefix("kafka://") else {
        return Err(KafkaUrlError::Scheme(outbox_core::secrets::redact_url(url)));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('@') {
        return Err(KafkaUrlError::Credentials);
    }
    let mut brokers = Vec::new();
    for entry in rest.split(',') {
        let entry = entry.trim();
        let bad = || KafkaUrlError::Brokers(rest.to_owned());
        if entry.is_empty() || entry.contains(['/', '?', '#', ' ']) {
            return Err(bad());
        }
        // `[v6]:port`, `host:port` or `host`.
        let (host, port) = match entry.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(':') && (h.starts_with('[') || !h.contains(':')) => {
                (h, p.parse::<u16>().map_err(|_| bad())?)
            }
            _ => (entry, DEFAULT_PORT),
        };
        if host.is_empty() || port == 0 {
            return Err(bad());
        }
        brokers.push(format!("{host}:{port}"));
    }
    Ok(brokers.join(","))
}

/// A librdkafka configuration for `bootstrap` with the caller's `properties` (already checked
/// against the owned ones) and the toolkit's logging.
pub(crate) fn client_config(bootstrap: &str, properties: &Properties) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    for (name, value) in &properties.0 {
        config.set(name, value);
    }
    config.set_log_level(RDKafkaLogLevel::Info);
    config
}

/// The toolkit's client context: librdkafka's log lines and client errors go to `tracing`
/// (target `librdkafka`), at the matching level. Connection errors during an outage are logged
/// by librdkafka itself at most once per broker state change.
#[derive(Debug, Clone, Default)]
pub struct LogContext;

impl ClientContext for LogContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility, "{message}");
            }
            // The transport sets `enable.gapless.guarantee` on purpose (ordered pipelining, see
            // the crate's docs); librdkafka warns on every start that the property is
            // experimental, which would teach operators to ignore its warnings.
            RDKafkaLogLevel::Warning
                if facility == "CONFWARN" && message.contains("enable.gapless.guarantee") =>
            {
                tracing::debug!(target: "librdkafka", facility, "{message}");
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", facility, "{message}");
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility, "{message}");
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", facility, "{message}");
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", %error, "{reason}");
    }

    // Statistics are not requested (`statistics.interval.ms` is not set by the toolkit); if a
    // user sets it, they go to debug, not info.
    fn stats_raw(&self, statistics: &[u8]) {
        tracing::debug!(target: "librdkafka", bytes = statistics.len(), "statistics");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_lists_are_parsed() {
        assert_eq!(
            bootstrap_servers("kafka://127.0.0.1:9092").unwrap(),
            "127.0.0.1:9092"
        );
        assert_eq!(
            bootstrap_servers("kafka://a:1, b ,[::1]:3/").unwrap(),
            "a:1,b:9092,[::1]:3"
        );
        assert!(matches!(
            bootstrap_servers("nats://a:1"),
            Err(KafkaUrlError::Scheme(_))
        ));
        for bad in [
            "kafka://",
            "kafka://a:1,,b:2",
            "kafka://a:x",
            "kafka://a:0",
            "kafka://a/b",
        ] {
            assert!(
                matches!(bootstrap_servers(bad), Err(KafkaUrlError::Brokers(_))),
                "{bad}"
            );
        }
        let e = bootstrap_servers("kafka://u:hunter2@a:1").unwrap_err();
        assert_eq!(e, KafkaUrlError::Credentials);
        assert!(!e.to_string().contains("hunter2"));
    }
}
