//! The settings of both sides and their validation: [`KafkaConfig`] (the transport) and
//! [`KafkaConsumerConfig`] (the delivery source), what the toolkit decides itself, and the
//! librdkafka properties passed through. Every refusal is an [`outbox_core::ConfigError`]
//! naming the key.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use outbox_core::ConfigError;
use serde::Deserialize;

use crate::debezium::{DebeziumPayload, WireFormat};
use crate::topic;

/// Topic template of the CloudEvents format.
pub const DEFAULT_TOPIC_TEMPLATE: &str = "outbox.{aggregate_type}";

/// librdkafka properties the toolkit sets itself, because its guarantees rest on them. Setting
/// one in [`KafkaConfig::properties`] or [`KafkaConsumerConfig::properties`] is refused with
/// the reason, never silently overridden either way.
const OWNED: &[(&str, &str)] = &[
    (
        "bootstrap.servers",
        "the brokers come from the URL (`kafka://host:port,host:port`)",
    ),
    (
        "metadata.broker.list",
        "the brokers come from the URL (`kafka://host:port,host:port`)",
    ),
    (
        "enable.idempotence",
        "always true: a retried produce must never be stored twice or out of order",
    ),
    (
        "acks",
        "always `all`: an event is sent once every in-sync replica has it",
    ),
    (
        "request.required.acks",
        "always `all`: an event is sent once every in-sync replica has it",
    ),
    (
        "message.timeout.ms",
        "always 0 (none): a record timed out in the client's queue while a later one of its \
         partition is stored breaks per-aggregate order; `delivery_timeout_secs` bounds the wait \
         for a delivery report instead",
    ),
    (
        "delivery.timeout.ms",
        "always 0 (none): a record timed out in the client's queue while a later one of its \
         partition is stored breaks per-aggregate order; `delivery_timeout_secs` bounds the wait \
         for a delivery report instead",
    ),
    (
        "enable.gapless.guarantee",
        "always true: a record refused for good must stop the producer (it is replaced), never \
         leave a gap before a later version of its aggregate",
    ),
    (
        "allow.auto.create.topics",
        "set create_topics: the transport creates topics itself or not at all",
    ),
    (
        "transactional.id",
        "the relay's own claim and fencing order the publishes; Kafka transactions are not used",
    ),
    (
        "group.id",
        "set it with `group_id` (default: the consumer's name)",
    ),
    (
        "enable.auto.commit",
        "always false: offsets are committed only after the inbox transaction committed",
    ),
    (
        "enable.auto.offset.store",
        "always false: offsets are committed only after the inbox transaction committed",
    ),
    (
        "auto.offset.reset",
        "set it with `start_from` (default earliest: no event published before the first start is skipped)",
    ),
    (
        "enable.partition.eof",
        "the source does not use end-of-partition events",
    ),
];

/// Property names whose values are secrets: never shown by `Debug` or in errors.
fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.contains("password")
        || name.contains("secret")
        || name.ends_with(".key.pem")
        || name == "sasl.oauthbearer.config"
}

/// Extra librdkafka properties (`[kafka.properties]`), e.g. `security.protocol`,
/// `ssl.ca.location`, `sasl.mechanism`, `sasl.username`, `sasl.password`, `linger.ms`,
/// `compression.type`. Values of secret properties (names with `password` or `secret`) are
/// never shown by `Debug`.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Properties(pub BTreeMap<String, String>);

impl fmt::Debug for Properties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| {
                let shown = if is_secret(k) { "***" } else { v.as_str() };
                (k, shown)
            }))
            .finish()
    }
}

impl Properties {
    fn check(&self, key: &'static str) -> Result<(), ConfigError> {
        for name in self.0.keys() {
            if let Some((_, why)) = OWNED.iter().find(|(owned, _)| owned == name) {
                return bad(key, format!("`{name}` cannot be set here: {why}"));
            }
            if name.trim().is_empty() || name.chars().any(char::is_control) {
                return bad(
                    key,
                    format!("`{}` is not a property name", name.escape_debug()),
                );
            }
        }
        Ok(())
    }
}

/// Configuration of the Kafka transport (`[kafka]`).
///
/// Every key has a default and unknown keys are refused (a typo must not silently fall back to
/// a default); [`KafkaConfig::validate`] names the offending key.
///
/// ```
/// let config: outbox_kafka::KafkaConfig = toml::from_str(r#"
///     topic_template = "payments.{aggregate_type}"
///     [properties]
///     "security.protocol" = "sasl_ssl"
///     "sasl.mechanism" = "SCRAM-SHA-512"
///     "sasl.username" = "relay"
///     "sasl.password" = "s3cret"
/// "#).unwrap();
/// assert!(config.validate().is_ok());
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// Topic of each event; `{aggregate_type}`, `{aggregate_id}` and `{event_type}` are replaced
    /// by the message's values. In the CloudEvents format every character a topic name cannot
    /// hold (anything but ASCII letters, digits, `.`, `_` and `-`) is turned into `_`; in the
    /// Debezium format the values are inserted as they are (as the router does), and a name
    /// Kafka refuses is an `Invalid` publish. A message's own destination override wins.
    /// Default (`None`): `outbox.{aggregate_type}`, or `outbox.event.{aggregate_type}` in the
    /// Debezium format.
    pub topic_template: Option<String>,
    /// How records are shaped: `cloudevents` (default; what this toolkit's consumers read) or
    /// `debezium` (as Debezium's Outbox Event Router emits them, for consumers built for it;
    /// see [`crate::debezium`]).
    pub format: WireFormat,
    /// The record value in the Debezium format: `as-is` (default), `json-string` or
    /// `expanded-json` (see [`DebeziumPayload`]). Refused with the CloudEvents format.
    pub debezium_payload: Option<DebeziumPayload>,
    /// Create a topic on its first use when it does not exist (with [`KafkaConfig::topic_partitions`]
    /// and [`KafkaConfig::topic_replication_factor`]). Without it, or when creating fails, a
    /// publish to a missing topic fails as `Rejected` with the reason and is retried. Default
    /// `true`.
    pub create_topics: bool,
    /// Partitions of a topic this transport creates; `-1` lets the broker decide
    /// (`num.partitions`). Default `-1`.
    pub topic_partitions: i32,
    /// Replication factor of a topic this transport creates; `-1` lets the broker decide
    /// (`default.replication.factor`). Default `-1`.
    pub topic_replication_factor: i32,
    /// CloudEvents `source` attribute. Default [`outbox_core::wire::DEFAULT_SOURCE`].
    pub source: String,
    /// Most publishes awaiting their delivery report at once; further calls wait. Default 1024.
    pub max_in_flight: usize,
    /// How long a publish waits for its delivery report, in seconds; an event not acknowledged
    /// by then fails as `TimedOut` and is republished by the relay (the relay's own
    /// `publish_timeout` cuts it earlier when it is shorter). The record itself stays in
    /// librdkafka's queue, which has no local timeout (`message.timeout.ms = 0`, see the
    /// crate's docs, "Ordered pipelining"), and may still be stored later: a copy with the same
    /// event id, never out of order. Default 5.
    pub delivery_timeout_secs: u64,
    /// How long startup waits for the cluster's metadata, in seconds. Default 5.
    pub connect_timeout_secs: u64,
    /// Extra librdkafka producer properties (`[kafka.properties]`): TLS, SASL, batching,
    /// compression. The properties the guarantees rest on (idempotence, acks, timeouts,
    /// brokers) are refused here. `linger.ms` is 0 unless set here (librdkafka's default is
    /// 5 ms, which every awaited publish of an aggregate's run would wait).
    pub properties: Properties,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            topic_template: None,
            format: WireFormat::Cloudevents,
            debezium_payload: None,
            create_topics: true,
            topic_partitions: -1,
            topic_replication_factor: -1,
            source: outbox_core::wire::DEFAULT_SOURCE.to_owned(),
            max_in_flight: 1024,
            delivery_timeout_secs: 5,
            connect_timeout_secs: 5,
            properties: Properties::default(),
        }
    }
}

fn bad(key: &'static str, reason: impl Into<String>) -> Result<(), ConfigError> {
    Err(ConfigError::new(key, reason))
}

fn seconds(key: &'static str, value: u64, max: u64) -> Result<(), ConfigError> {
    if value == 0 || value > max {
        return bad(
            key,
            format!("must be between 1 and {max} seconds (got {value})"),
        );
    }
    Ok(())
}

impl KafkaConfig {
    /// Checks every key.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first bad key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Err(why) = topic::check_template(self.topic_template()) {
            return bad("topic_template", why);
        }
        if self.debezium_payload.is_some() && self.format != WireFormat::Debezium {
            return bad(
                "debezium_payload",
                "applies to the Debezium format only; set `format = \"debezium\"` or remove it",
            );
        }
        if self.topic_partitions == 0 || self.topic_partitions < -1 {
            return bad(
                "topic_partitions",
                "must be -1 (the broker's default) or at least 1",
            );
        }
        if self.topic_replication_factor == 0 || self.topic_replication_factor < -1 {
            return bad(
                "topic_replication_factor",
                "must be -1 (the broker's default) or at least 1",
            );
        }
        outbox_core::wire::check_source(&self.source)?;
        if self.max_in_flight == 0 {
            return bad("max_in_flight", "must be at least 1");
        }
        seconds("delivery_timeout_secs", self.delivery_timeout_secs, 3600)?;
        seconds("connect_timeout_secs", self.connect_timeout_secs, 3600)?;
        self.properties.check("properties")
    }

    /// The topic template in force: [`KafkaConfig::topic_template`], or the format's default.
    pub fn topic_template(&self) -> &str {
        match (&self.topic_template, self.format) {
            (Some(t), _) => t,
            (None, WireFormat::Cloudevents) => DEFAULT_TOPIC_TEMPLATE,
            (None, WireFormat::Debezium) => crate::debezium::DEFAULT_TOPIC_TEMPLATE,
        }
    }

    /// [`KafkaConfig::delivery_timeout_secs`] as a duration.
    pub fn delivery_timeout(&self) -> Duration {
        Duration::from_secs(self.delivery_timeout_secs)
    }

    /// [`KafkaConfig::connect_timeout_secs`] as a duration.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs(self.connect_timeout_secs)
    }
}

/// Where a consumer group without a committed offset starts reading a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// The oldest event the topic still holds (`auto.offset.reset=earliest`): a consumer
    /// deployed after the producer misses nothing.
    Earliest,
    /// Only events published after the group first joined (`auto.offset.reset=latest`).
    Latest,
}

/// Configuration of the Kafka delivery source (`[kafka_consumer]`).
///
/// ```
/// let config: outbox_kafka::KafkaConsumerConfig = toml::from_str(r#"
///     topics = ["payments.payment"]
///     group_id = "reporting"
/// "#).unwrap();
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConsumerConfig {
    /// Topics to consume; a name starting with `^` is a regular expression (new matching
    /// topics are picked up at the next metadata refresh). Default `["^outbox\\..*"]`, every
    /// topic of the transport's default template.
    pub topics: Vec<String>,
    /// Consumer group. The registry sets it to the consumer's name unless the section sets it.
    /// Required.
    pub group_id: String,
    /// Where a group without a committed offset starts. Default `earliest`.
    pub start_from: StartFrom,
    /// Largest message value the consumer decodes; a larger one is dead-lettered as too large
    /// (and librdkafka's `fetch.message.max.bytes` is raised to fetch it). Default 1 MiB.
    pub max_message_bytes: usize,
    /// Most deliveries held at once: handed out and not acknowledged yet, nacked ones waiting
    /// in memory to come again included. At the limit the source pauses its partitions (it
    /// stays in the group) until a quarter of them settled, so a consumer whose handler fails
    /// on everything does not read the whole topic into memory. A delivery nacked while paused
    /// is let go of and read again from the broker when due (up to
    /// [`SPILL_PER_UNACKED`](crate::SPILL_PER_UNACKED) times this many), so events
    /// waiting under the ordering guard never fill the window ([`crate::source`], flow
    /// control). Default 1000.
    pub max_unacked: usize,
    /// How long a commit or lag query may take, in seconds, before it fails as `Unavailable`.
    /// Default 10.
    pub request_timeout_secs: u64,
    /// Extra librdkafka consumer properties (`[kafka_consumer.properties]`): TLS, SASL,
    /// `session.timeout.ms`, `max.poll.interval.ms`. Offsets, group and reset policy are
    /// refused here.
    pub properties: Properties,
}

impl Default for KafkaConsumerConfig {
    fn default() -> Self {
        Self {
            topics: vec![r"^outbox\..*".to_owned()],
            group_id: String::new(),
            start_from: StartFrom::Earliest,
            max_message_bytes: 1024 * 1024,
            max_unacked: 1000,
            request_timeout_secs: 10,
            properties: Properties::default(),
        }
    }
}

impl KafkaConsumerConfig {
    /// Checks every key.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first bad key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.topics.is_empty() {
            return bad("topics", "must list at least one topic");
        }
        for t in &self.topics {
            if t.starts_with('^') {
                if t.len() == 1 {
                    return bad("topics", "`^` alone is not a pattern");
                }
            } else if let Err(why) = topic::check_name(t) {
                return bad("topics", format!("`{}`: {why}", t.escape_debug()));
            }
        }
        outbox_core::wire::check_configured("group_id", &self.group_id)?;
        if self.max_message_bytes == 0 || self.max_message_bytes > 1_000_000_000 {
            return bad("max_message_bytes", "must be between 1 and 1000000000");
        }
        if self.max_unacked == 0 {
            return bad("max_unacked", "must be at least 1");
        }
        seconds("request_timeout_secs", self.request_timeout_secs, 3600)?;
        self.properties.check("properties")
    }

    /// [`KafkaConsumerConfig::request_timeout_secs`] as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_properties_are_refused_with_the_reason() {
        let mut config = KafkaConfig::default();
        config
            .properties
            .0
            .insert("enable.idempotence".into(), "false".into());
        let e = config.validate().unwrap_err();
        assert_eq!(e.key, "properties");
        assert!(e.reason.contains("never be stored twice"), "{e}");

        let mut consumer = KafkaConsumerConfig {
            group_id: "g".into(),
            ..KafkaConsumerConfig::default()
        };
        assert!(consumer.validate().is_ok());
        consumer
            .properties
            .0
            .insert("enable.auto.commit".into(), "true".into());
        assert!(
            consumer
                .validate()
                .unwrap_err()
                .reason
                .contains("after the inbox")
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases: [(KafkaConfig, &str); 5] = [
            (
                KafkaConfig {
                    debezium_payload: Some(crate::DebeziumPayload::JsonString),
                    ..KafkaConfig::default()
                },
                "debezium_payload",
            ),
            (
                KafkaConfig {
                    topic_template: Some("a/{aggregate_type}".into()),
                    ..KafkaConfig::default()
                },
                "topic_template",
            ),
            (
                KafkaConfig {
                    topic_template: Some("{tenant}".into()),
                    ..KafkaConfig::default()
                },
                "topic_template",
            ),
            (
                KafkaConfig {
                    topic_partitions: 0,
                    ..KafkaConfig::default()
                },
                "topic_partitions",
            ),
            (
                KafkaConfig {
                    delivery_timeout_secs: 0,
                    ..KafkaConfig::default()
                },
                "delivery_timeout_secs",
            ),
        ];
        for (config, key) in cases {
            assert_eq!(config.validate().unwrap_err().key, key, "{config:?}");
        }
        let no_group = KafkaConsumerConfig::default();
        assert_eq!(no_group.validate().unwrap_err().key, "group_id");
    }

    #[test]
    fn secrets_are_not_shown() {
        let config: KafkaConfig = toml::from_str(
            r#"
            [properties]
            "sasl.password" = "hunter2"
            "ssl.key.password" = "hunter3"
            "sasl.username" = "relay"
            "#,
        )
        .unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter"), "{shown}");
        assert!(shown.contains("relay"), "{shown}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = toml::from_str::<KafkaConfig>("topic_templat = \"x\"").unwrap_err();
        assert!(e.to_string().contains("topic_templat"), "{e}");
    }
}
