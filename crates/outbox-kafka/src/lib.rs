//! Kafka transport and delivery source for the outbox toolkit, on librdkafka (`rdkafka`).
//!
//! [`KafkaTransport`] implements [`outbox_core::Transport`] with an idempotent producer
//! (`enable.idempotence=true`, `acks=all`): a publish returns `Ok` only on the record's
//! delivery report, once every in-sync replica stored it, so the relay marks a row sent only
//! after the broker confirmed it (G3). The idempotent producer keeps each partition in order
//! across its own retries, and the record key is the partition key (the aggregate id by
//! default), so one aggregate's events stay in one partition, in order.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_kafka::{KafkaConfig, KafkaTransport};
//! let transport = KafkaTransport::connect("kafka://127.0.0.1:9092", KafkaConfig::default()).await?;
//! // hand `transport` to outbox_core::relay::Relay
//! # Ok(()) }
//! ```
//!
//! The consumer side, [`KafkaSource`] (a consumer-group member implementing
//! [`outbox_core::consumer::DeliverySource`], committing offsets only after the inbox
//! transaction), is described in [`source`].
//!
//! # Wire format
//!
//! CloudEvents 1.0 in binary content mode, following the CloudEvents Kafka protocol binding:
//!
//! The default format (`format = "cloudevents"`) is below; `format = "debezium"` shapes the
//! records as Debezium's Outbox Event Router does instead, for consumers built for a Debezium
//! outbox ([`debezium`]).
//!
//! * **topic**: the message's destination override, or [`KafkaConfig::topic_template`]
//!   (default `outbox.{aggregate_type}`) with each placeholder's value made legal in a topic
//!   name (every character but ASCII letters, digits, `.`, `_` and `-` becomes `_`).
//! * **key**: the partition key (the message's override, or the aggregate id), UTF-8.
//! * **value**: the payload bytes, unchanged.
//! * **timestamp**: created_at, milliseconds (`CreateTime`).
//! * **headers**, values as UTF-8 text (the binding does not percent-encode):
//!
//! | header                | value                                                       |
//! |-----------------------|-------------------------------------------------------------|
//! | `ce_specversion`      | `1.0`                                                       |
//! | `ce_id`               | event id, hyphenated UUID                                   |
//! | `ce_source`           | [`KafkaConfig::source`], default `/outbox`                  |
//! | `ce_type`             | event type                                                  |
//! | `ce_subject`          | aggregate id                                                |
//! | `ce_time`             | created_at, RFC 3339, microseconds, UTC                     |
//! | `ce_aggregatetype`    | aggregate type                                              |
//! | `ce_aggregateid`      | aggregate id                                                |
//! | `ce_aggregateversion` | aggregate version, decimal                                  |
//! | `ce_schemaversion`    | payload schema version, decimal                             |
//! | `ce_partitionkey`     | partition key (override or aggregate id)                    |
//! | `ce_payloadsha256`    | SHA-256 of the payload, lower-case hex                      |
//! | `content-type`        | payload content type                                        |
//! | user headers          | each of the message's headers, name and value unchanged     |
//!
//! User header names that collide with the binding (`ce_*`, `ce-*`, `content-type`, any case:
//! [`RESERVED_HEADERS`]) are refused as [`PublishErrorKind::Invalid`](outbox_core::PublishErrorKind::Invalid).
//! The registry entry [`BROKER`] declares them, so a producer that reserves the registry's
//! names refuses them already at enqueue time.
//!
//! # Duplicates
//!
//! Kafka has no dedup window by event id. The idempotent producer drops its own retries of a
//! record, but a relay that crashed after the broker stored an event and before it marked the
//! row republishes it (same event id, byte-identical): a wire duplicate the consumer inbox
//! absorbs. [`PublishReceipt::duplicate`](outbox_core::PublishReceipt::duplicate) is always
//! `false`.
//!
//! # Ordered pipelining
//!
//! The transport declares [`ordered_pipelining`](outbox_core::Transport::ordered_pipelining):
//! the relay hands it an aggregate's whole run of versions at once
//! ([`publish_run`](outbox_core::Transport::publish_run)) and reads the delivery reports in
//! order, instead of waiting for each version's report before sending the next (W2 in
//! docs/benchmarks-history.md: the sequential path reached 0.31x of the raw producer). The run
//! goes out in one piece while its records share one topic and key, i.e. one partition; a row
//! whose `destination` sends it elsewhere ends the piece and goes out in the next claim.
//!
//! What makes this safe is that **the broker never stores a version of an aggregate unless it
//! stored every earlier version before it**:
//!
//! * the idempotent producer numbers each partition's records and the broker stores a producer
//!   session's records only in that sequence, without holes; librdkafka's own retries keep it.
//!   This is the broker's part, and the transport needs it: Apache Kafka (1.0 and later, with
//!   up to five requests in flight) and tansu check the sequence and refuse a request that
//!   would leave a hole. librdkafka relies
//!   on it too: when a produce request fails and a later one in flight succeeds, it reports
//!   the earlier records stored (on such a broker the later one could not have been). A broker
//!   that stored the later request alone would make a record reported stored that is not;
//!   librdkafka's mock cluster is one for producers without a `transactional.id`, which is why
//!   `tests/mock_cluster.rs` keeps one request in flight;
//! * librdkafka skips a record only when it times out in its queue (`message.timeout.ms`) or
//!   the broker refuses it for good. The first cannot happen: the local timeout is off (`0`);
//!   the second stops the producer (`enable.gapless.guarantee`: a fatal error, the transport
//!   replaces the producer) instead of sending the later records;
//! * the relay marks only the versions whose reports said stored, up to the first that did not;
//!   the rest of the run is published again later, with the same event ids. A record still in
//!   the old queue, or in flight from a replaced producer, may then be stored twice: copies,
//!   absorbed by the consumer's inbox, never a later version before an earlier one.
//!
//! The cost of no local timeout is that a record stays in librdkafka's queue until the cluster
//! takes it, however long an outage lasts (bounded by `queue.buffering.max.messages` and
//! `queue.buffering.max.kbytes`, after which publishes fail as `Unavailable` at once). A
//! republish of an event whose record is still queued in the current producer does not queue
//! another copy: it awaits the queued record's report, so an outage of many retries stores each
//! event once when the cluster is back. `tests/mock_cluster.rs` checks the transport's part of
//! this under injected produce errors and an outage with whole runs queued (one produce
//! request in flight, see there), and the single copy per retried event. The broker's part,
//! and librdkafka's retries with several requests in flight, are argued above, not tested: the
//! tests against a real broker inject no produce errors.
//!
//! # Error mapping
//!
//! | situation                                                         | kind          |
//! |-------------------------------------------------------------------|---------------|
//! | topic name not legal (override or expanded template)              | `Invalid`     |
//! | user header reserved                                              | `Invalid`     |
//! | broker refused the record as invalid (`INVALID_RECORD`, `INVALID_TIMESTAMP`, `INVALID_TOPIC_EXCEPTION`) | `Invalid` |
//! | record over `message.max.bytes` (checked before sending), or the broker's `MESSAGE_TOO_LARGE` | `TooLarge` |
//! | topic missing and not created (`create_topics` off, creation refused), unknown topic or partition, authorization | `Rejected` |
//! | no delivery report within `delivery_timeout_secs`                 | `TimedOut`    |
//! | brokers down, connection broken, not enough replicas, leader moving, local queue full, producer fenced or its epoch refused, a fatal error (the producer is replaced) | `Unavailable` |
//! | anything else                                                     | `Rejected`    |
//!
//! `TooLarge` and `Invalid` are dead-lettered by the relay at once; the other kinds are retried
//! with the same event id.
//!
//! # Topics
//!
//! With [`KafkaConfig::create_topics`] (default), the first publish to a topic that the
//! cluster's metadata does not list creates it ([`KafkaConfig::topic_partitions`],
//! [`KafkaConfig::topic_replication_factor`]; the broker's defaults unless set). Production
//! clusters usually create their topics themselves (partitions, replication, retention) and
//! may turn it off; a missing topic is then a `Rejected` publish, retried, with the reason.
//!
//! # Security
//!
//! TLS and SASL (PLAIN, SCRAM, OAUTHBEARER) are librdkafka properties in `[kafka.properties]`
//! (`security.protocol`, `ssl.ca.location`, `sasl.mechanism`, `sasl.username`,
//! `sasl.password` ...), passed through as they are; their values are never logged. The URL
//! carries no credentials. Kerberos (GSSAPI) is not built in.
//!
//! # Crate layout
//!
//! The same file roles as every transport crate: `config.rs` (both sides' settings and their
//! validation, refused as [`outbox_core::ConfigError`]), `connection.rs` (reaching the cluster:
//! the `kafka://` URL, the librdkafka client configuration and its logs), `binding.rs` (the
//! wire binding both ways and its header rules), `transport.rs` (the relay's
//! [`outbox_core::Transport`]), [`source`] (the consumer's delivery source, with its
//! consumer-group machinery and offset bookkeeping) and `broker.rs` (the registry entry); Kafka's
//! own `topic.rs` (topic names) and [`debezium`] (the Debezium record format) beside them.
#![forbid(unsafe_code)]

mod binding;
mod broker;
mod config;
mod connection;
pub mod debezium;
pub mod source;
mod topic;
mod transport;

pub use binding::{
    CE_PREFIX, CONTENT_TYPE_HEADER, RESERVED_HEADERS, decode_raw, identify_raw, wire_headers,
};
pub use broker::BROKER;
pub use config::{DEFAULT_TOPIC_TEMPLATE, KafkaConfig, KafkaConsumerConfig, Properties, StartFrom};
pub use connection::{DEFAULT_PORT, KafkaUrlError, LogContext, bootstrap_servers};
pub use debezium::{DebeziumPayload, WireFormat};
pub use source::{KafkaConsumerError, KafkaDelivery, KafkaSource, SPILL_PER_UNACKED};
pub use topic::{MAX_TOPIC_CHARS, check_name as check_topic_name, sanitize_token};
pub use transport::{KafkaConnectError, KafkaTransport};

/// The librdkafka binding this crate is built on, re-exported so callers (and tests) can use
/// its admin and consumer types of the matching version.
pub use rdkafka;

/// Former name of the configuration error, now [`outbox_core::ConfigError`] (its `message` is
/// `reason`).
#[deprecated(note = "use outbox_core::ConfigError (the field `message` is now `reason`)")]
pub type KafkaConfigError = outbox_core::ConfigError;

/// The delivery source under its former module name: see [`source`].
#[deprecated(note = "the module is now `outbox_kafka::source`; its items are at the crate root")]
pub mod consumer {
    pub use crate::binding::{decode_raw, identify_raw};
    pub use crate::source::{KafkaConsumerError, KafkaDelivery, KafkaSource, SPILL_PER_UNACKED};
}
