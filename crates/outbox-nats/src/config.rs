//! [`NatsConfig`]: what the transport publishes to and how.

use std::time::Duration;

use serde::Deserialize;

use crate::security::NatsSecurity;
use crate::subject;

/// Configuration of the NATS JetStream transport.
///
/// Every key has a default, unknown keys are refused (a typo must not silently fall back to a
/// default), and [`NatsConfig::validate`] names the offending key.
///
/// ```
/// let config: outbox_nats::NatsConfig = toml::from_str(r#"
///     stream = "PAYMENTS"
///     stream_subjects = ["payments.>"]
///     subject_template = "payments.{aggregate_type}.{event_type}"
///     duplicate_window_secs = 600
/// "#).unwrap();
/// assert!(config.validate().is_ok());
/// assert_eq!(config.max_in_flight, 1024);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// JetStream stream the events are stored in. Default `OUTBOX`.
    pub stream: String,
    /// Subjects the stream captures when [`NatsConfig::ensure_stream`] creates it. Default
    /// `["outbox.>"]`. Ignored for an existing stream.
    pub stream_subjects: Vec<String>,
    /// Subject of each event; `{aggregate_type}`, `{aggregate_id}` and `{event_type}` are
    /// replaced by the message's values with characters a subject token cannot hold turned into
    /// `_`. A message's own destination override wins. Default
    /// `outbox.{aggregate_type}.{event_type}`.
    pub subject_template: String,
    /// Create the stream at startup if it is missing (subjects, file storage, duplicate
    /// window). An existing stream is left as it is; a duplicate window shorter than
    /// [`NatsConfig::duplicate_window_secs`] is logged as a warning. Default `true`.
    pub ensure_stream: bool,
    /// The stream's `Nats-Msg-Id` deduplication window, in seconds, for a stream this transport
    /// creates. Default 120.
    pub duplicate_window_secs: u64,
    /// CloudEvents `source` attribute. Default [`outbox_core::wire::DEFAULT_SOURCE`].
    pub source: String,
    /// Most publishes awaiting their `PublishAck` at once; further calls wait. Default 1024.
    pub max_in_flight: usize,
    /// Startup connection timeout, in seconds. Default 5.
    pub connect_timeout_secs: u64,
    /// How long one publish waits to be sent and then for its `PublishAck`, in seconds (each
    /// step). Also the timeout of the JetStream API requests made at startup. Keep it below the
    /// relay's `publish_timeout` so the transport reports `TimedOut` itself. Default 5.
    pub ack_timeout_secs: u64,
    /// TLS and authentication of the connection (`[nats.security]`). Default: none beyond
    /// what the URL says.
    pub security: NatsSecurity,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            stream: "OUTBOX".to_owned(),
            stream_subjects: vec!["outbox.>".to_owned()],
            subject_template: "outbox.{aggregate_type}.{event_type}".to_owned(),
            ensure_stream: true,
            duplicate_window_secs: 120,
            source: outbox_core::wire::DEFAULT_SOURCE.to_owned(),
            max_in_flight: 1024,
            connect_timeout_secs: 5,
            ack_timeout_secs: 5,
            security: NatsSecurity::default(),
        }
    }
}

/// A [`NatsConfig`] value that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid NATS transport config `{key}`: {message}")]
pub struct NatsConfigError {
    /// The configuration key, e.g. `stream`.
    pub key: &'static str,
    /// What is wrong with it.
    pub message: String,
}

fn bad(key: &'static str, message: impl Into<String>) -> Result<(), NatsConfigError> {
    Err(NatsConfigError {
        key,
        message: message.into(),
    })
}

/// Placeholders [`NatsConfig::subject_template`] may contain.
const PLACEHOLDERS: [&str; 3] = ["{aggregate_type}", "{aggregate_id}", "{event_type}"];

/// JetStream refuses larger duplicate windows than this in practice (and a window is kept in
/// server memory); one week is far above any sane relay retry horizon.
const MAX_DUPLICATE_WINDOW_SECS: u64 = 7 * 24 * 3600;

impl NatsConfig {
    /// Checks every key.
    ///
    /// # Errors
    /// A [`NatsConfigError`] naming the first bad key.
    pub fn validate(&self) -> Result<(), NatsConfigError> {
        if let Err(why) = subject::check_stream_name(&self.stream) {
            return bad("stream", why);
        }
        if self.stream_subjects.is_empty() {
            return bad("stream_subjects", "must list at least one subject");
        }
        for s in &self.stream_subjects {
            if let Err(why) = subject::check_filter(s) {
                return bad("stream_subjects", format!("`{s}`: {why}"));
            }
        }
        // Expand the placeholders with a sample token and check the result as a subject.
        let mut sample = self.subject_template.clone();
        for p in PLACEHOLDERS {
            sample = sample.replace(p, "x");
        }
        if sample.contains(['{', '}']) {
            return bad(
                "subject_template",
                format!(
                    "`{}` has an unknown placeholder; use {}",
                    self.subject_template,
                    PLACEHOLDERS.join(", ")
                ),
            );
        }
        if let Err(why) = subject::check_publish_subject(&sample) {
            return bad(
                "subject_template",
                format!("`{}`: {why}", self.subject_template),
            );
        }
        if self.duplicate_window_secs == 0 {
            return bad(
                "duplicate_window_secs",
                "must be positive: Nats-Msg-Id dedup needs a window",
            );
        }
        if self.duplicate_window_secs > MAX_DUPLICATE_WINDOW_SECS {
            return bad(
                "duplicate_window_secs",
                format!("must be at most {MAX_DUPLICATE_WINDOW_SECS} (one week)"),
            );
        }
        if let Err(e) = outbox_core::wire::check_source(&self.source) {
            return bad(e.key, e.reason);
        }
        if self.max_in_flight == 0 || self.max_in_flight > tokio::sync::Semaphore::MAX_PERMITS / 2 {
            return bad("max_in_flight", "must be at least 1 (and sanely bounded)");
        }
        if self.connect_timeout_secs == 0 {
            return bad("connect_timeout_secs", "must be positive");
        }
        if self.ack_timeout_secs == 0 {
            return bad("ack_timeout_secs", "must be positive");
        }
        if let Err(e) = self.security.validate() {
            return bad(e.key, e.message);
        }
        Ok(())
    }

    /// [`NatsConfig::duplicate_window_secs`] as a duration.
    pub fn duplicate_window(&self) -> Duration {
        Duration::from_secs(self.duplicate_window_secs)
    }

    /// [`NatsConfig::connect_timeout_secs`] as a duration.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs(self.connect_timeout_secs)
    }

    /// [`NatsConfig::ack_timeout_secs`] as a duration.
    pub fn ack_timeout(&self) -> Duration {
        Duration::from_secs(self.ack_timeout_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut NatsConfig)) -> Result<(), NatsConfigError> {
        let mut c = NatsConfig::default();
        f(&mut c);
        c.validate()
    }

    fn key_of(r: Result<(), NatsConfigError>) -> &'static str {
        r.expect_err("config must be refused").key
    }

    #[test]
    fn defaults_are_valid() {
        let c = NatsConfig::default();
        assert!(c.validate().is_ok());
        assert_eq!(c.stream, "OUTBOX");
        assert_eq!(c.stream_subjects, vec!["outbox.>"]);
        assert_eq!(c.subject_template, "outbox.{aggregate_type}.{event_type}");
        assert!(c.ensure_stream);
        assert_eq!(c.duplicate_window_secs, 120);
        assert_eq!(c.source, "/outbox");
        assert_eq!(c.max_in_flight, 1024);
        assert_eq!(c.connect_timeout_secs, 5);
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_eq!(key_of(with(|c| c.stream = "A.B".into())), "stream");
        assert_eq!(key_of(with(|c| c.stream = String::new())), "stream");
        assert_eq!(
            key_of(with(|c| c.stream_subjects.clear())),
            "stream_subjects"
        );
        assert_eq!(
            key_of(with(|c| c.stream_subjects = vec!["a..b".into()])),
            "stream_subjects"
        );
        assert_eq!(
            key_of(with(|c| c.subject_template = "a.{nope}".into())),
            "subject_template"
        );
        assert_eq!(
            key_of(with(|c| c.subject_template = "a.*.{event_type}".into())),
            "subject_template"
        );
        assert_eq!(
            key_of(with(|c| c.subject_template = "a..{event_type}".into())),
            "subject_template"
        );
        assert_eq!(
            key_of(with(|c| c.duplicate_window_secs = 0)),
            "duplicate_window_secs"
        );
        assert_eq!(key_of(with(|c| c.source = " ".into())), "source");
        assert_eq!(key_of(with(|c| c.source = "x".repeat(256))), "source");
        assert_eq!(key_of(with(|c| c.max_in_flight = 0)), "max_in_flight");
        assert_eq!(
            key_of(with(|c| c.connect_timeout_secs = 0)),
            "connect_timeout_secs"
        );
        assert_eq!(key_of(with(|c| c.ack_timeout_secs = 0)), "ack_timeout_secs");
        let e = with(|c| c.max_in_flight = 0).unwrap_err();
        assert!(e.to_string().contains("`max_in_flight`"), "{e}");
    }

    #[test]
    fn deserialises_with_defaults_and_refuses_unknown_keys() {
        let c: NatsConfig = toml::from_str("stream = \"S1\"").unwrap();
        assert_eq!(c.stream, "S1");
        assert_eq!(c.duplicate_window_secs, 120);
        let e = toml::from_str::<NatsConfig>("strem = \"S1\"").unwrap_err();
        assert!(e.to_string().contains("strem"), "{e}");
    }
}
