//! The settings of both sides and their validation: [`RabbitConfig`] (the transport: what it
//! publishes to and how much it keeps in flight) and [`RabbitConsumerConfig`] (the delivery
//! source: the queue it consumes). Every refusal is an [`outbox_core::ConfigError`] naming the
//! key.

use std::time::Duration;

use outbox_core::ConfigError;
use serde::Deserialize;

use crate::connection::RabbitTls;

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

/// Upper bound of [`RabbitConsumerConfig::requeue_delay_cap_ms`]: 15 minutes, half of
/// RabbitMQ's default `consumer_timeout` (30 minutes), after which the broker closes a channel
/// that holds an unacknowledged delivery.
pub const MAX_REQUEUE_DELAY_CAP_MS: u64 = 15 * 60 * 1000;

///
/// Deserialises from a configuration file; unknown keys are refused so a typo does not
/// silently fall back to a default.
///
/// ```
/// use outbox_rabbitmq::RabbitConsumerConfig;
/// let config = RabbitConsumerConfig {
///     queue: "ledger".into(),
///     ..RabbitConsumerConfig::default()
/// };
/// assert!(config.validate().is_ok());
/// assert_eq!(config.bind_exchange.as_deref(), Some("outbox"));
/// assert_eq!(config.prefetch, 256);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RabbitConsumerConfig {
    /// Queue consumed. Default `outbox-consumer`.
    pub queue: String,
    /// Declare the queue (durable, not exclusive, not auto-delete, no arguments) on every
    /// (re)connect. Default `true`. Set `false` for a queue declared elsewhere, e.g. a quorum
    /// queue or one with a dead-letter exchange: declaring an existing queue with other
    /// arguments is refused by the broker.
    pub declare_queue: bool,
    /// Exchange the queue is bound to on every (re)connect, with
    /// [`binding_key`](Self::binding_key). Default `outbox` (the publisher's default). `None`
    /// or the empty string: no binding. The exchange must exist (the relay declares it).
    pub bind_exchange: Option<String>,
    /// Binding key. Default `#` (everything, on a topic exchange).
    pub binding_key: String,
    /// Most unacknowledged deliveries the broker pushes to this consumer (`basic.qos`),
    /// 1..=65535. Default 256. Also the largest possible batch.
    pub prefetch: u32,
    /// Largest body accepted; larger ones decode as
    /// [`DecodeError::TooLarge`](outbox_core::wire::DecodeError::TooLarge) (and are
    /// dead-lettered by the runner). Default 8 MiB.
    pub max_message_bytes: usize,
    /// Longest wait of [`RabbitDelivery::nack`](crate::RabbitDelivery) before requeueing
    /// (RabbitMQ has no delayed requeue). Default 1000 ms; 0 requeues at once. At most [`MAX_REQUEUE_DELAY_CAP_MS`].
    pub requeue_delay_cap_ms: u64,
    /// Time allowed to connect, open the channel, declare and bind the queue and start
    /// consuming. Default 5 seconds.
    pub connect_timeout_secs: u64,
    /// Minimum pause between reconnect attempts, counted from the last attempt and from the
    /// moment a lost connection was noticed. Default 1000 ms.
    pub reconnect_min_delay_ms: u64,
    /// Custom CA and client certificate for `amqps://`. Default: the system's trust store, no
    /// client certificate.
    pub tls: RabbitTls,
}

impl Default for RabbitConsumerConfig {
    fn default() -> Self {
        Self {
            queue: "outbox-consumer".to_owned(),
            declare_queue: true,
            bind_exchange: Some("outbox".to_owned()),
            binding_key: "#".to_owned(),
            prefetch: 256,
            max_message_bytes: 8 * 1024 * 1024,
            requeue_delay_cap_ms: 1000,
            connect_timeout_secs: 5,
            reconnect_min_delay_ms: 1000,
            tls: RabbitTls::default(),
        }
    }
}

fn bad(key: &'static str, reason: impl Into<String>) -> Result<(), ConfigError> {
    Err(ConfigError::new(key, reason))
}

/// The timings of the link both sides keep (see `connection.rs`): `connect_timeout_secs` and
/// `reconnect_min_delay_ms`.
fn check_link_timing(
    connect_timeout_secs: u64,
    reconnect_min_delay_ms: u64,
) -> Result<(), ConfigError> {
    if connect_timeout_secs == 0 {
        return bad("connect_timeout_secs", "must be at least 1");
    }
    if reconnect_min_delay_ms == 0 {
        return bad(
            "reconnect_min_delay_ms",
            "must be at least 1, or an outage becomes a reconnect loop",
        );
    }
    Ok(())
}

impl RabbitConfig {
    /// Checks every setting.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first offending key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_exchange()?;
        self.validate_template()?;
        outbox_core::wire::check_source(&self.source)?;
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
        check_link_timing(self.connect_timeout_secs, self.reconnect_min_delay_ms)?;
        self.tls.validate()?;
        if self.confirm_timeout_secs == 0 {
            return bad("confirm_timeout_secs", "must be at least 1");
        }
        Ok(())
    }

    fn validate_exchange(&self) -> Result<(), ConfigError> {
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

    fn validate_template(&self) -> Result<(), ConfigError> {
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

impl RabbitConsumerConfig {
    /// Checks every setting.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first offending key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let queue = &self.queue;
        if queue.is_empty() || queue.len() > MAX_SHORT_STRING {
            return bad("queue", "must be 1..=255 bytes");
        }
        if queue.chars().any(char::is_control) {
            return bad("queue", "must not contain control characters");
        }
        if self.declare_queue && queue.starts_with("amq.") {
            return bad(
                "queue",
                "names starting with `amq.` are reserved by the broker: set declare_queue = false to consume one",
            );
        }
        if let Some(exchange) = self.exchange() {
            if exchange.len() > MAX_SHORT_STRING {
                return bad("bind_exchange", "must be at most 255 bytes");
            }
            if exchange.chars().any(char::is_control) {
                return bad("bind_exchange", "must not contain control characters");
            }
        }
        if self.binding_key.len() > MAX_SHORT_STRING {
            return bad("binding_key", "must be at most 255 bytes");
        }
        if self.prefetch == 0 || self.prefetch > u32::from(u16::MAX) {
            return bad(
                "prefetch",
                format!(
                    "must be 1..=65535 (0 would mean unlimited), got {}",
                    self.prefetch
                ),
            );
        }
        if self.max_message_bytes == 0 || self.max_message_bytes > RABBITMQ_MAX_MESSAGE_BYTES {
            return bad(
                "max_message_bytes",
                format!(
                    "must be 1..={RABBITMQ_MAX_MESSAGE_BYTES}, got {}",
                    self.max_message_bytes
                ),
            );
        }
        if self.requeue_delay_cap_ms > MAX_REQUEUE_DELAY_CAP_MS {
            return bad(
                "requeue_delay_cap_ms",
                format!(
                    "must be at most {MAX_REQUEUE_DELAY_CAP_MS} (the broker closes channels holding a delivery for too long), got {}",
                    self.requeue_delay_cap_ms
                ),
            );
        }
        check_link_timing(self.connect_timeout_secs, self.reconnect_min_delay_ms)?;
        self.tls.validate()
    }

    /// The exchange to bind to, if any (`None` and `""` both mean no binding).
    pub(crate) fn exchange(&self) -> Option<&str> {
        self.bind_exchange.as_deref().filter(|x| !x.is_empty())
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_secs(self.connect_timeout_secs)
    }

    pub(crate) fn reconnect_min_delay(&self) -> Duration {
        Duration::from_millis(self.reconnect_min_delay_ms)
    }

    pub(crate) fn requeue_delay_cap(&self) -> Duration {
        Duration::from_millis(self.requeue_delay_cap_ms)
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

    /// The key `validate` names for the config `edit` makes of the default, checking that the
    /// message names it too.
    fn refused<C: Default>(
        edit: impl FnOnce(&mut C),
        validate: impl FnOnce(&C) -> Result<(), ConfigError>,
    ) -> &'static str {
        let mut config = C::default();
        edit(&mut config);
        let err = validate(&config).expect_err("config must be refused");
        assert!(err.to_string().contains(err.key), "{err}");
        err.key
    }

    fn transport_key(edit: impl FnOnce(&mut RabbitConfig)) -> &'static str {
        refused(edit, RabbitConfig::validate)
    }

    fn source_key(edit: impl FnOnce(&mut RabbitConsumerConfig)) -> &'static str {
        refused(edit, RabbitConsumerConfig::validate)
    }

    #[test]
    fn errors_name_the_key() {
        assert_eq!(
            transport_key(|c| c.exchange = "bad name".into()),
            "exchange"
        );
        assert_eq!(transport_key(|c| c.exchange = String::new()), "exchange");
        assert_eq!(
            transport_key(|c| c.exchange = "amq.topic".into()),
            "exchange"
        );
        assert_eq!(
            transport_key(|c| c.exchange_kind = "tpoic".into()),
            "exchange_kind"
        );
        assert_eq!(
            transport_key(|c| c.routing_key_template = "{aggregate}.{event_type}".into()),
            "routing_key_template"
        );
        assert_eq!(transport_key(|c| c.source = String::new()), "source");
        assert_eq!(transport_key(|c| c.source = "/".repeat(256)), "source");
        assert_eq!(transport_key(|c| c.max_in_flight = 0), "max_in_flight");
        assert_eq!(
            transport_key(|c| c.max_message_bytes = 0),
            "max_message_bytes"
        );
        assert_eq!(
            transport_key(|c| c.max_message_bytes = RABBITMQ_MAX_MESSAGE_BYTES + 1),
            "max_message_bytes"
        );
        assert_eq!(
            transport_key(|c| c.connect_timeout_secs = 0),
            "connect_timeout_secs"
        );
        assert_eq!(
            transport_key(|c| c.reconnect_min_delay_ms = 0),
            "reconnect_min_delay_ms"
        );
        assert_eq!(transport_key(|c| c.app_id = Some(String::new())), "app_id");
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

    #[test]
    fn defaults_and_unknown_keys() {
        let c: RabbitConsumerConfig = serde_json::from_str(r#"{"queue":"ledger"}"#).unwrap();
        assert_eq!(c.queue, "ledger");
        assert_eq!(c.prefetch, 256);
        assert_eq!(c.max_message_bytes, 8 * 1024 * 1024);
        assert_eq!(c.requeue_delay_cap_ms, 1000);
        assert_eq!(c.connect_timeout_secs, 5);
        assert!(c.declare_queue);
        assert_eq!(c.bind_exchange.as_deref(), Some("outbox"));
        assert_eq!(c.binding_key, "#");
        c.validate().unwrap();
        let err = serde_json::from_str::<RabbitConsumerConfig>(r#"{"prefech":1}"#).unwrap_err();
        assert!(err.to_string().contains("prefech"), "{err}");
        let none: RabbitConsumerConfig = serde_json::from_str(r#"{"bind_exchange":null}"#).unwrap();
        assert_eq!(none.exchange(), None);
        let empty = RabbitConsumerConfig {
            bind_exchange: Some(String::new()),
            ..Default::default()
        };
        empty.validate().unwrap();
        assert_eq!(empty.exchange(), None);
    }

    #[test]
    fn validate_names_the_key() {
        assert_eq!(source_key(|c| c.queue = String::new()), "queue");
        assert_eq!(source_key(|c| c.queue = "q".repeat(256)), "queue");
        assert_eq!(source_key(|c| c.queue = "amq.gen-1".into()), "queue");
        assert_eq!(
            source_key(|c| c.bind_exchange = Some("x".repeat(256))),
            "bind_exchange"
        );
        assert_eq!(
            source_key(|c| c.binding_key = "k".repeat(256)),
            "binding_key"
        );
        assert_eq!(source_key(|c| c.prefetch = 0), "prefetch");
        assert_eq!(source_key(|c| c.prefetch = 65_536), "prefetch");
        assert_eq!(source_key(|c| c.max_message_bytes = 0), "max_message_bytes");
        assert_eq!(
            source_key(|c| c.requeue_delay_cap_ms = MAX_REQUEUE_DELAY_CAP_MS + 1),
            "requeue_delay_cap_ms"
        );
        assert_eq!(
            source_key(|c| c.connect_timeout_secs = 0),
            "connect_timeout_secs"
        );
        assert_eq!(
            source_key(|c| c.reconnect_min_delay_ms = 0),
            "reconnect_min_delay_ms"
        );
        RabbitConsumerConfig {
            queue: "amq.direct-consumer".into(),
            declare_queue: false,
            requeue_delay_cap_ms: 0,
            ..Default::default()
        }
        .validate()
        .unwrap();
    }
}
