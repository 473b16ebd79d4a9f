//! The settings of both sides and their validation: [`NatsConfig`] (the transport) and
//! [`NatsConsumerConfig`] (the delivery source). Every refusal is an
//! [`outbox_core::ConfigError`] naming the key.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use outbox_core::ConfigError;
use serde::Deserialize;

use crate::connection::NatsSecurity;
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

fn bad(key: &'static str, reason: impl Into<String>) -> Result<(), ConfigError> {
    Err(ConfigError::new(key, reason))
}

/// A side's configuration as the connect path reads it
/// ([`connect_side`](crate::transport::connect_side)).
pub(crate) trait ClientConfig {
    /// Checks every key (the configuration's own `validate`).
    fn check(&self) -> Result<(), ConfigError>;
    /// TLS and authentication of the connection (its `security`).
    fn client_security(&self) -> &NatsSecurity;
    /// How long connecting may take (its `connect_timeout`).
    fn client_connect_timeout(&self) -> Duration;
}

/// Checks the keys of the client connection both sides hold: each timeout (`(key, seconds)`)
/// positive and, when `max_secs` is given, at most that; then the security settings.
fn check_client_keys(
    timeouts: [(&'static str, u64); 2],
    max_secs: Option<u64>,
    security: &NatsSecurity,
) -> Result<(), ConfigError> {
    for (key, secs) in timeouts {
        match max_secs {
            None if secs == 0 => return bad(key, "must be positive"),
            Some(max) if secs == 0 || secs > max => {
                return bad(key, format!("must be between 1 and {max}"));
            }
            _ => {}
        }
    }
    security.validate()
}

/// What both sides' configurations do alike with the keys of their client connection
/// (`connect_timeout_secs`, `ack_timeout_secs`, `security`): the timeouts as durations, their
/// check ([`check_client_keys`], timeouts of at most `max_timeout_secs`, if given) and
/// [`ClientConfig`].
macro_rules! client_keys {
    ($config:ident, max_timeout_secs: $max:expr) => {
        impl $config {
            #[doc = concat!("[`", stringify!($config), "::connect_timeout_secs`] as a duration.")]
            pub fn connect_timeout(&self) -> Duration {
                Duration::from_secs(self.connect_timeout_secs)
            }

            #[doc = concat!("[`", stringify!($config), "::ack_timeout_secs`] as a duration.")]
            pub fn ack_timeout(&self) -> Duration {
                Duration::from_secs(self.ack_timeout_secs)
            }

            /// Checks the keys of the client connection ([`check_client_keys`]).
            fn check_client(&self) -> Result<(), ConfigError> {
                let timeouts = [
                    ("connect_timeout_secs", self.connect_timeout_secs),
                    ("ack_timeout_secs", self.ack_timeout_secs),
                ];
                check_client_keys(timeouts, $max, &self.security)
            }
        }

        impl ClientConfig for $config {
            fn check(&self) -> Result<(), ConfigError> {
                self.validate()
            }

            fn client_security(&self) -> &NatsSecurity {
                &self.security
            }

            fn client_connect_timeout(&self) -> Duration {
                self.connect_timeout()
            }
        }
    };
}

client_keys!(NatsConfig, max_timeout_secs: None);
client_keys!(NatsConsumerConfig, max_timeout_secs: Some(MAX_TIMEOUT_SECS));

/// Placeholders [`NatsConfig::subject_template`] may contain.
const PLACEHOLDERS: [&str; 3] = ["{aggregate_type}", "{aggregate_id}", "{event_type}"];

/// JetStream refuses larger duplicate windows than this in practice (and a window is kept in
/// server memory); one week is far above any sane relay retry horizon.
const MAX_DUPLICATE_WINDOW_SECS: u64 = 7 * 24 * 3600;

impl NatsConfig {
    /// Checks every key.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first bad key.
    pub fn validate(&self) -> Result<(), ConfigError> {
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
        outbox_core::wire::check_source(&self.source)?;
        if self.max_in_flight == 0 || self.max_in_flight > tokio::sync::Semaphore::MAX_PERMITS / 2 {
            return bad("max_in_flight", "must be at least 1 (and sanely bounded)");
        }
        self.check_client()
    }

    /// [`NatsConfig::duplicate_window_secs`] as a duration.
    pub fn duplicate_window(&self) -> Duration {
        Duration::from_secs(self.duplicate_window_secs)
    }
}

/// Longest connect or ack timeout accepted, in seconds.
const MAX_TIMEOUT_SECS: u64 = 300;
/// Longest ack wait accepted (a sanity bound: a redelivery a week later is a mistake).
const MAX_ACK_WAIT_SECS: u64 = 7 * 24 * 3600;
/// Largest `max_ack_pending` accepted.
const MAX_ACK_PENDING: u64 = 1_000_000_000;
/// Largest [`NatsConsumerConfig::prefetch`] accepted.
pub const MAX_PREFETCH: usize = 10_000;

/// Configuration of the NATS JetStream consumer.
///
/// Every key has a default, unknown keys are refused, and [`NatsConsumerConfig::validate`]
/// names the offending key.
///
/// ```
/// let config: outbox_nats::NatsConsumerConfig = toml::from_str(r#"
///     stream = "PAYMENTS"
///     durable_name = "billing"
///     filter_subject = "payments.>"
///     ack_wait_secs = 60
/// "#).unwrap();
/// assert!(config.validate().is_ok());
/// assert_eq!(config.max_ack_pending, 10_000);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConsumerConfig {
    /// The JetStream stream to consume. It must exist. Default `OUTBOX`.
    pub stream: String,
    /// Name of the durable consumer: the server keeps its acknowledgement state under this
    /// name, and instances with the same name share the work. Give each consuming service its
    /// own name. Default `outbox-consumer`.
    pub durable_name: String,
    /// Only messages whose subject matches this filter (wildcards allowed) are delivered; empty
    /// = every message of the stream. Default empty.
    pub filter_subject: String,
    /// Seconds a delivered message may stay unacknowledged before it is delivered again.
    /// Default 30.
    pub ack_wait_secs: u64,
    /// Most messages delivered and not yet acknowledged at once; the server delivers no more
    /// until some are acknowledged. Default 10 000.
    pub max_ack_pending: u64,
    /// Largest body accepted; a larger one is delivered with
    /// [`DecodeError::TooLarge`](outbox_core::wire::DecodeError::TooLarge) (and dead-lettered
    /// by the runner). Default 8 MiB.
    pub max_message_bytes: usize,
    /// How long startup waits for the connection, in seconds. Default 5.
    pub connect_timeout_secs: u64,
    /// How long a JetStream API request (stream and consumer lookup, consumer info for the lag)
    /// and an acknowledgement's confirmation may take, in seconds. Default 5.
    pub ack_timeout_secs: u64,
    /// TLS and authentication of the connection. Default: none beyond what the URL says.
    pub security: NatsSecurity,
    /// Messages the source asks the server for ahead of the batches it hands out; 0 asks for
    /// each batch when it is wanted. See "Prefetch" in [`crate::source`]. At most
    /// `max_ack_pending` and [`MAX_PREFETCH`]. Default 0.
    pub prefetch: usize,
}

impl Default for NatsConsumerConfig {
    fn default() -> Self {
        Self {
            stream: "OUTBOX".to_owned(),
            durable_name: "outbox-consumer".to_owned(),
            filter_subject: String::new(),
            ack_wait_secs: 30,
            max_ack_pending: 10_000,
            max_message_bytes: 8 * 1024 * 1024,
            connect_timeout_secs: 5,
            ack_timeout_secs: 5,
            security: NatsSecurity::default(),
            prefetch: 0,
        }
    }
}

impl NatsConsumerConfig {
    /// Checks every key.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first bad key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Err(why) = subject::check_stream_name(&self.stream) {
            return bad("stream", why);
        }
        if let Err(why) = subject::check_consumer_name(&self.durable_name) {
            return bad("durable_name", why);
        }
        if !self.filter_subject.is_empty()
            && let Err(why) = subject::check_filter(&self.filter_subject)
        {
            return bad("filter_subject", why);
        }
        if self.ack_wait_secs == 0 || self.ack_wait_secs > MAX_ACK_WAIT_SECS {
            return bad(
                "ack_wait_secs",
                format!("must be between 1 and {MAX_ACK_WAIT_SECS}"),
            );
        }
        if self.max_ack_pending == 0 || self.max_ack_pending > MAX_ACK_PENDING {
            return bad(
                "max_ack_pending",
                format!("must be between 1 and {MAX_ACK_PENDING}"),
            );
        }
        if self.max_message_bytes == 0 {
            return bad("max_message_bytes", "must be positive");
        }
        if self.prefetch > MAX_PREFETCH
            || u64::try_from(self.prefetch).unwrap_or(u64::MAX) > self.max_ack_pending
        {
            return bad(
                "prefetch",
                format!(
                    "must be at most max_ack_pending ({}) and {MAX_PREFETCH}",
                    self.max_ack_pending
                ),
            );
        }
        self.check_client()
    }

    /// [`NatsConsumerConfig::ack_wait_secs`] as a duration.
    pub fn ack_wait(&self) -> Duration {
        Duration::from_secs(self.ack_wait_secs)
    }

    /// The pull consumer configuration this config asks for.
    pub(crate) fn consumer_config(&self) -> pull::Config {
        pull::Config {
            durable_name: Some(self.durable_name.clone()),
            description: Some("outbox inbox consumer".to_owned()),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait(),
            filter_subject: self.filter_subject.clone(),
            // Validated to be at most MAX_ACK_PENDING.
            max_ack_pending: i64::try_from(self.max_ack_pending).unwrap_or(i64::MAX),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut NatsConfig)) -> Result<(), ConfigError> {
        let mut c = NatsConfig::default();
        f(&mut c);
        c.validate()
    }

    fn consumer_with(f: impl FnOnce(&mut NatsConsumerConfig)) -> Result<(), ConfigError> {
        let mut c = NatsConsumerConfig::default();
        f(&mut c);
        c.validate()
    }

    fn key_of(r: Result<(), ConfigError>) -> &'static str {
        r.expect_err("config must be refused").key
    }

    /// Changes a configuration must refuse, each with the key it must name.
    type Refused<'a, C> = &'a [(&'static str, fn(&mut C))];

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
        let refused: Refused<NatsConfig> = &[
            ("stream", |c| c.stream = "A.B".into()),
            ("stream", |c| c.stream = String::new()),
            ("stream_subjects", |c| c.stream_subjects.clear()),
            ("stream_subjects", |c| {
                c.stream_subjects = vec!["a..b".into()]
            }),
            ("subject_template", |c| {
                c.subject_template = "a.{nope}".into()
            }),
            ("subject_template", |c| {
                c.subject_template = "a.*.{event_type}".into();
            }),
            ("subject_template", |c| {
                c.subject_template = "a..{event_type}".into();
            }),
            ("duplicate_window_secs", |c| c.duplicate_window_secs = 0),
            ("source", |c| c.source = " ".into()),
            ("source", |c| c.source = "x".repeat(256)),
            ("max_in_flight", |c| c.max_in_flight = 0),
            ("connect_timeout_secs", |c| c.connect_timeout_secs = 0),
            ("ack_timeout_secs", |c| c.ack_timeout_secs = 0),
        ];
        for (i, &(key, change)) in refused.iter().enumerate() {
            assert_eq!(key_of(with(change)), key, "case {i}");
        }
        let e = with(|c| c.max_in_flight = 0).unwrap_err();
        assert!(e.to_string().contains("`max_in_flight`"), "{e}");
        // The transport's timeouts are only bounded below.
        let e = with(|c| c.ack_timeout_secs = 0).unwrap_err();
        assert_eq!(e.reason, "must be positive");
        assert!(with(|c| c.connect_timeout_secs = 301).is_ok());
    }

    #[test]
    fn deserialises_with_defaults_and_refuses_unknown_keys() {
        let c: NatsConfig = toml::from_str("stream = \"S1\"").unwrap();
        assert_eq!(c.stream, "S1");
        assert_eq!(c.duplicate_window_secs, 120);
        let e = toml::from_str::<NatsConfig>("strem = \"S1\"").unwrap_err();
        assert!(e.to_string().contains("strem"), "{e}");
    }

    #[test]
    fn consumer_defaults_are_valid() {
        let c = NatsConsumerConfig::default();
        assert!(c.validate().is_ok());
        assert_eq!(c.stream, "OUTBOX");
        assert_eq!(c.durable_name, "outbox-consumer");
        assert_eq!(c.filter_subject, "");
        assert_eq!(c.ack_wait_secs, 30);
        assert_eq!(c.max_ack_pending, 10_000);
        assert_eq!(c.max_message_bytes, 8 << 20);
        let pc = c.consumer_config();
        assert_eq!(pc.ack_policy, AckPolicy::Explicit);
        assert_eq!(pc.deliver_policy, DeliverPolicy::All);
        assert_eq!(pc.durable_name.as_deref(), Some("outbox-consumer"));
    }

    #[test]
    fn bad_consumer_values_name_their_key() {
        let refused: Refused<NatsConsumerConfig> = &[
            ("stream", |c| c.stream = "A.B".into()),
            ("durable_name", |c| c.durable_name = String::new()),
            ("durable_name", |c| c.durable_name = "a b".into()),
            ("filter_subject", |c| c.filter_subject = "a..b".into()),
            ("ack_wait_secs", |c| c.ack_wait_secs = 0),
            ("max_ack_pending", |c| c.max_ack_pending = 0),
            ("max_message_bytes", |c| c.max_message_bytes = 0),
            ("connect_timeout_secs", |c| c.connect_timeout_secs = 0),
            ("ack_timeout_secs", |c| c.ack_timeout_secs = 301),
            ("prefetch", |c| c.prefetch = MAX_PREFETCH + 1),
            ("prefetch", |c| {
                c.max_ack_pending = 10;
                c.prefetch = 11;
            }),
        ];
        for (i, &(key, change)) in refused.iter().enumerate() {
            assert_eq!(key_of(consumer_with(change)), key, "case {i}");
        }
        let e = consumer_with(|c| c.connect_timeout_secs = 0).unwrap_err();
        assert_eq!(
            e.reason,
            format!("must be between 1 and {MAX_TIMEOUT_SECS}")
        );
        assert!(consumer_with(|c| c.filter_subject = "outbox.*.x".into()).is_ok());
        assert!(
            consumer_with(|c| {
                c.max_ack_pending = 10;
                c.prefetch = 10;
            })
            .is_ok()
        );
        let c = NatsConsumerConfig {
            connect_timeout_secs: 2,
            ack_timeout_secs: 7,
            ..NatsConsumerConfig::default()
        };
        assert_eq!(
            (c.connect_timeout(), c.ack_timeout()),
            (Duration::from_secs(2), Duration::from_secs(7))
        );
    }

    #[test]
    fn unknown_consumer_keys_are_refused() {
        let e = toml::from_str::<NatsConsumerConfig>("ack_wait = 3").unwrap_err();
        assert!(e.to_string().contains("ack_wait"), "{e}");
    }
}
