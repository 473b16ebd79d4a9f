//! [`RabbitConfig`]: what the transport publishes to and how much it keeps in flight.

use std::time::Duration;

use serde::Deserialize;

use crate::tls::RabbitTls;

/// The largest message RabbitMQ can ever accept (its hard `max_message_size` ceiling).
pub const RABBITMQ_MAX_MESSAGE_BYTES: usize = 512 * 1024 * 1024;

/// Longest AMQP short string (exchange names, routing keys, property values).
pub(crate) const MAX_SHORT_STRING: usize = 255;

/// Upper bound of [`RabbitConfig::max_in_flight`].
pub const MAX_IN_FLIGHT: usize = 1_000_000;

/// The placeholders a routing-key template may use.
pub const TEMPLATE_PLACEHOLDERS: [&str; 3] = ["{aggregate_type}", "{aggregate_id}", "{event_type}"];

/// Settings of a [`crate::RabbitTransport`].
///
/// Deserialises from the relay's configuration file; unknown keys are refused so a typo does not
/// silently fall back to a default.
///
/// ```
/// use outbox_rabbitmq::RabbitConfig;
/// let config = RabbitConfig {
///     exchange: "payments".into(),
///     ..RabbitConfig::default()
/// };
/// assert!(config.validate().is_ok());
/// assert_eq!(config.routing_key_template, "{aggregate_type}.{event_type}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RabbitConfig {
    /// Exchange every message is published to. Default `outbox`. The empty string is the AMQP
    /// default exchange (routing key = queue name) and needs `declare_exchange = false`.
    pub exchange: String,
    /// Exchange type used when declaring it: `topic` (default), `direct`, `fanout`, `headers`
    /// or a plugin type starting with `x-`.
    pub exchange_kind: String,
    /// Declare the exchange (durable, not auto-delete) on every (re)connect. Default `true`.
    /// With `false` the exchange must exist; a missing one makes publishes fail with
    /// [`outbox_core::PublishErrorKind::Rejected`].
    pub declare_exchange: bool,
    /// Routing key template; see [`outbox_core::wire::destination`]. Default
    /// `{aggregate_type}.{event_type}`. A message's own destination override wins.
    pub routing_key_template: String,
    /// CloudEvents `source` attribute. Default [`outbox_core::wire::DEFAULT_SOURCE`].
    pub source: String,
    /// Optional AMQP `app_id` property set on every message.
    pub app_id: Option<String>,
    /// Connection name shown by the broker (`rabbitmqctl list_connections client_properties`,
    /// management UI). Default `outbox-rabbitmq`.
    pub connection_name: String,
    /// Most publishes awaiting a broker confirm at once (1..=[`MAX_IN_FLIGHT`]). Default 1024.
    pub max_in_flight: usize,
    /// Largest payload published, checked before sending. Default 16 MiB. Keep it at or below
    /// the broker's `max_message_size`.
    pub max_message_bytes: usize,
    /// Time allowed to open the TCP connection, handshake, open the channel and declare the
    /// exchange. Default 5 seconds.
    pub connect_timeout_secs: u64,
    /// Minimum pause between reconnect attempts, counted from the last attempt and from the
    /// moment a lost connection was noticed, so an outage never turns into a reconnect loop.
    /// Default 1000 ms.
    pub reconnect_min_delay_ms: u64,
    /// How long a publish waits for the broker's confirm before giving up with
    /// [`outbox_core::PublishErrorKind::TimedOut`] and abandoning the connection. Normally the
    /// relay's own `publish_timeout` fires first; this bounds confirms the relay stopped
    /// waiting for. Default 60 seconds.
    pub confirm_timeout_secs: u64,
    /// Custom CA and client certificate for `amqps://` (`[rabbitmq.tls]`). Default: the
    /// system's trust store, no client certificate.
    pub tls: RabbitTls,
}

impl Default for RabbitConfig {
    fn default() -> Self {
        Self {
            exchange: "outbox".to_owned(),
            exchange_kind: "topic".to_owned(),
            declare_exchange: true,
            routing_key_template: "{aggregate_type}.{event_type}".to_owned(),
            source: outbox_core::wire::DEFAULT_SOURCE.to_owned(),
            app_id: None,
            connection_name: "outbox-rabbitmq".to_owned(),
            max_in_flight: 1024,
            max_message_bytes: 16 * 1024 * 1024,
            connect_timeout_secs: 5,
            reconnect_min_delay_ms: 1000,
            confirm_timeout_secs: 60,
            tls: RabbitTls::default(),
        }
    }
}

/// Why a [`RabbitConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid rabbitmq configuration `{key}`: {reason}")]
pub struct RabbitConfigError {
    /// The offending key, as spelled in the configuration file.
    pub key: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

fn bad(key: &'static str, reason: impl Into<String>) -> Result<(), RabbitConfigError> {
    Err(RabbitConfigError {
        key,
        reason: reason.into(),
    })
}

impl RabbitConfig {
    /// Checks every setting.
    ///
    /// # Errors
    /// A [`RabbitConfigError`] naming the first offending key.
    pub fn validate(&self) -> Result<(), RabbitConfigError> {
        self.validate_exchange()?;
        self.validate_template()?;
        if let Err(e) = outbox_core::wire::check_source(&self.source) {
            return bad(e.key, e.reason);
        }
        if let Some(app_id) = &self.app_id {
            if app_id.is_empty() || app_id.len() > MAX_SHORT_STRING {
                return bad("app_id", "must be 1..=255 bytes when set");
            }
            if app_id.chars().any(char::is_control) {
                return bad("app_id", "must not contain control characters");
            }
        }
        if self.connection_name.len() > MAX_SHORT_STRING {
            return bad("connection_name", "must be at most 255 bytes");
        }
        if self.max_in_flight == 0 {
            return bad("max_in_flight", "must be at least 1");
        }
        if self.max_in_flight > MAX_IN_FLIGHT {
            return bad(
                "max_in_flight",
                format!(
                    "must be at most {MAX_IN_FLIGHT}, got {}",
                    self.max_in_flight
                ),
            );
        }
        if self.max_message_bytes == 0 || self.max_message_bytes > RABBITMQ_MAX_MESSAGE_BYTES {
            return bad(
                "max_message_bytes",
                format!(
                    "must be 1..={RABBITMQ_MAX_MESSAGE_BYTES} (RabbitMQ's hard limit), got {}",
                    self.max_message_bytes
                ),
            );
        }
        if self.connect_timeout_secs == 0 {
            return bad("connect_timeout_secs", "must be at least 1");
        }
        if self.reconnect_min_delay_ms == 0 {
            return bad(
                "reconnect_min_delay_ms",
                "must be at least 1, or an outage becomes a reconnect loop",
            );
        }
        self.tls.validate()?;
        if self.confirm_timeout_secs == 0 {
            return bad("confirm_timeout_secs", "must be at least 1");
        }
        Ok(())
    }

    fn validate_exchange(&self) -> Result<(), RabbitConfigError> {
        let name = &self.exchange;
        if name.len() > MAX_SHORT_STRING {
            return bad("exchange", "must be at most 255 bytes");
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
        {
            return bad(
                "exchange",
                format!("`{name}` may only use ASCII letters, digits and - _ . :"),
            );
        }
        if self.declare_exchange {
            if name.is_empty() {
                return bad(
                    "exchange",
                    "the default exchange (empty name) cannot be declared: set declare_exchange = false",
                );
            }
            if name.starts_with("amq.") {
                return bad(
                    "exchange",
                    "names starting with `amq.` are reserved by the broker: set declare_exchange = false to publish to one",
                );
            }
        }
        let kind = self.exchange_kind.as_str();
        let known = matches!(kind, "direct" | "fanout" | "topic" | "headers");
        let plugin = kind.len() > 2
            && kind.len() <= MAX_SHORT_STRING
            && kind.starts_with("x-")
            && kind
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !known && !plugin {
            return bad(
                "exchange_kind",
                format!("`{kind}` is not direct, fanout, topic, headers or an x- plugin type"),
            );
        }
        Ok(())
    }

    fn validate_template(&self) -> Result<(), RabbitConfigError> {
        let template = &self.routing_key_template;
        if template.len() > MAX_SHORT_STRING {
            return bad("routing_key_template", "must be at most 255 bytes");
        }
        if template.chars().any(char::is_control) {
            return bad(
                "routing_key_template",
                "must not contain control characters",
            );
        }
        let stripped = TEMPLATE_PLACEHOLDERS
            .iter()
            .fold(template.clone(), |acc, p| acc.replace(p, ""));
        if stripped.contains(['{', '}']) {
            return bad(
                "routing_key_template",
                format!(
                    "`{template}` has an unknown placeholder; use {}",
                    TEMPLATE_PLACEHOLDERS.join(", ")
                ),
            );
        }
        Ok(())
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_secs(self.connect_timeout_secs)
    }

    pub(crate) fn reconnect_min_delay(&self) -> Duration {
        Duration::from_millis(self.reconnect_min_delay_ms)
    }

    pub(crate) fn confirm_timeout(&self) -> Duration {
        Duration::from_secs(self.confirm_timeout_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_documented_values() {
        let c = RabbitConfig::default();
        c.validate().unwrap();
        assert_eq!(c.exchange, "outbox");
        assert_eq!(c.exchange_kind, "topic");
        assert!(c.declare_exchange);
        assert_eq!(c.source, "/outbox");
        assert_eq!(c.max_in_flight, 1024);
        assert_eq!(c.max_message_bytes, 16 * 1024 * 1024);
        assert_eq!(c.connect_timeout_secs, 5);
    }

    #[test]
    fn errors_name_the_key() {
        let cases: Vec<(RabbitConfig, &str)> = vec![
            (
                RabbitConfig {
                    exchange: "bad name".into(),
                    ..Default::default()
                },
                "exchange",
            ),
            (
                RabbitConfig {
                    exchange: String::new(),
                    ..Default::default()
                },
                "exchange",
            ),
            (
                RabbitConfig {
                    exchange: "amq.topic".into(),
                    ..Default::default()
                },
                "exchange",
            ),
            (
                RabbitConfig {
                    exchange_kind: "tpoic".into(),
                    ..Default::default()
                },
                "exchange_kind",
            ),
            (
                RabbitConfig {
                    routing_key_template: "{aggregate}.{event_type}".into(),
                    ..Default::default()
                },
                "routing_key_template",
            ),
            (
                RabbitConfig {
                    source: String::new(),
                    ..Default::default()
                },
                "source",
            ),
            (
                RabbitConfig {
                    source: "/".repeat(256),
                    ..Default::default()
                },
                "source",
            ),
            (
                RabbitConfig {
                    max_in_flight: 0,
                    ..Default::default()
                },
                "max_in_flight",
            ),
            (
                RabbitConfig {
                    max_message_bytes: 0,
                    ..Default::default()
                },
                "max_message_bytes",
            ),
            (
                RabbitConfig {
                    max_message_bytes: RABBITMQ_MAX_MESSAGE_BYTES + 1,
                    ..Default::default()
                },
                "max_message_bytes",
            ),
            (
                RabbitConfig {
                    connect_timeout_secs: 0,
                    ..Default::default()
                },
                "connect_timeout_secs",
            ),
            (
                RabbitConfig {
                    reconnect_min_delay_ms: 0,
                    ..Default::default()
                },
                "reconnect_min_delay_ms",
            ),
            (
                RabbitConfig {
                    app_id: Some(String::new()),
                    ..Default::default()
                },
                "app_id",
            ),
        ];
        for (config, key) in cases {
            let err = config.validate().unwrap_err();
            assert_eq!(err.key, key, "{err}");
            assert!(err.to_string().contains(key));
        }
    }

    #[test]
    fn unknown_keys_are_refused_and_missing_keys_default() {
        let c: RabbitConfig = serde_json::from_str(r#"{"exchange":"payments"}"#).unwrap();
        assert_eq!(c.exchange, "payments");
        assert_eq!(c.max_in_flight, 1024);
        let err = serde_json::from_str::<RabbitConfig>(r#"{"exchnage":"payments"}"#).unwrap_err();
        assert!(err.to_string().contains("exchnage"), "{err}");
    }

    #[test]
    fn amq_exchange_allowed_without_declaring() {
        RabbitConfig {
            exchange: "amq.topic".into(),
            declare_exchange: false,
            ..Default::default()
        }
        .validate()
        .unwrap();
        RabbitConfig {
            exchange: String::new(),
            declare_exchange: false,
            routing_key_template: "events".into(),
            ..Default::default()
        }
        .validate()
        .unwrap();
    }
}
