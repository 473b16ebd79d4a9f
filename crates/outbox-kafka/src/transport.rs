//! [`KafkaTransport`]: the idempotent producer, topic checks and the [`Transport`]
//! implementation (the records themselves are the binding's, [`crate::binding`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};

use outbox_core::secrets::redact_url;
use outbox_core::{
    ConfigError, EventId, OutboxMessage, PublishError, PublishErrorKind, PublishReceipt, Transport,
};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::util::Timeout;
use tokio::sync::Semaphore;

use crate::binding::{Record, record_of, topic_of, wire_headers};
use crate::config::KafkaConfig;
use crate::connection::{KafkaUrlError, LogContext, bootstrap_servers, client_config};

/// librdkafka's default `message.max.bytes`, the client's limit on one record.
const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000;

/// Records queued in the current producer past their report's wait, kept (to be awaited by a
/// republish instead of queueing another copy) before completed ones are swept out.
const QUEUED_SWEEP_AT: usize = 4096;

/// A delivery report, cloneable: `Ok((partition, offset))`, the client's error, or `None` when
/// the producer was closed before it reported.
type Report = Result<(i32, i64), Option<KafkaError>>;

/// The report of a record still in a producer's queue, shared by every publish of its event.
type PendingReport = Shared<BoxFuture<'static, Report>>;

/// A record in librdkafka's queue: which producer holds it, and its report.
struct InQueue {
    producer: Arc<FutureProducer<LogContext>>,
    report: PendingReport,
}

/// Why [`KafkaTransport`] could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaConnectError {
    /// The configuration is invalid.
    #[error("invalid Kafka config `{}`: {}", .0.key, .0.reason)]
    Config(#[from] ConfigError),
    /// The URL is not a `kafka://` broker list.
    #[error(transparent)]
    Url(#[from] KafkaUrlError),
    /// librdkafka refused the configuration (an unknown property or a bad value).
    #[error("librdkafka refused the configuration: {0}")]
    Client(String),
    /// No broker answered within `connect_timeout_secs` (address, TLS, authentication).
    #[error("cannot reach the Kafka cluster at `{url}` within {timeout_secs}s: {reason}")]
    Connect {
        /// The address tried.
        url: String,
        /// The configured timeout.
        timeout_secs: u64,
        /// librdkafka's error.
        reason: String,
    },
}

/// What the transport shares between its clones.
struct Inner {
    /// Replaced after a fatal error (see [`KafkaTransport::replace_after_fatal`]).
    producer: RwLock<Arc<FutureProducer<LogContext>>>,
    /// The producer's configuration, to make a new one.
    client: ClientConfig,
    admin: AdminClient<LogContext>,
    config: KafkaConfig,
    /// Topics seen in the cluster's metadata (or created here): not checked again.
    known_topics: Mutex<HashSet<String>>,
    /// Records handed to the current producer whose report nobody has read yet, by event id:
    /// a republish of one of them awaits it instead of queueing a copy (see
    /// [`KafkaTransport::enqueue`]).
    queued: Mutex<HashMap<EventId, InQueue>>,
    in_flight: Semaphore,
    message_max_bytes: usize,
}

/// The Kafka [`Transport`]: an idempotent producer (`enable.idempotence=true`, `acks=all`)
/// whose `publish` returns `Ok` only on the record's delivery report, i.e. once every in-sync
/// replica stored it.
///
/// Cheap to clone: clones share the producer and the in-flight bound.
#[derive(Clone)]
pub struct KafkaTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KafkaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaTransport")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl KafkaTransport {
    /// Connects to the cluster at `url` (`kafka://host:port,host:port`) and waits for its
    /// metadata, so an unreachable cluster is an error after at most
    /// [`KafkaConfig::connect_timeout_secs`], never an endless retry. Once started, the client
    /// reconnects by itself during outages; publishes meanwhile fail as `TimedOut` or
    /// `Unavailable` and the relay retries them.
    ///
    /// # Errors
    /// [`KafkaConnectError::Config`] or [`KafkaConnectError::Url`] for a bad configuration,
    /// [`KafkaConnectError::Client`] when librdkafka refuses a property,
    /// [`KafkaConnectError::Connect`] when no broker answers.
    #[tracing::instrument(level = "info", skip_all, fields(brokers = %redact_url(url)))]
    pub async fn connect(url: &str, config: KafkaConfig) -> Result<Self, KafkaConnectError> {
        config.validate()?;
        let bootstrap = bootstrap_servers(url)?;
        let mut client = client_config(&bootstrap, &config.properties);
        // The relay awaits each delivery report before it sends an aggregate's next version,
        // so time a record waits in librdkafka's queue for company is added to every step of
        // an aggregate's run: no linger unless configured (concurrent publishes still share
        // requests, as they queue while one is in flight). W2 on Kafka: 13.6k ev/s with
        // librdkafka's default of 5 ms, 22k with 0.
        if !["linger.ms", "queue.buffering.max.ms"]
            .iter()
            .any(|p| config.properties.0.contains_key(*p))
        {
            client.set("linger.ms", "0");
        }
        client
            .set("enable.idempotence", "true")
            .set("acks", "all")
            // Topics are created by this transport (create_topics) or not at all: the metadata
            // lookup of a missing topic must not create it behind the configuration's back.
            .set("allow.auto.create.topics", "false")
            // Ordered pipelining rests on these two (see the crate's docs): a record is never
            // dropped by the client while a later record of its partition is stored. librdkafka
            // drops a record that times out in its queue and sends the later ones (a gap), so
            // there is no local timeout; `delivery_timeout_secs` bounds the wait for a report
            // instead. A record the broker refuses for good stops the producer (a fatal error:
            // it is replaced) instead of leaving a gap.
            .set("message.timeout.ms", "0")
            .set("enable.gapless.guarantee", "true");
        let producer: FutureProducer<LogContext> = client
            .create_with_context(LogContext)
            .map_err(|e| KafkaConnectError::Client(e.to_string()))?;
        let producer = RwLock::new(Arc::new(producer));
        let admin: AdminClient<LogContext> = client
            .create_with_context(LogContext)
            .map_err(|e| KafkaConnectError::Client(e.to_string()))?;
        let message_max_bytes = config
            .properties
            .0
            .get("message.max.bytes")
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_MESSAGE_MAX_BYTES);
        let transport = Self {
            inner: Arc::new(Inner {
                producer,
                client,
                admin,
                in_flight: Semaphore::new(config.max_in_flight),
                known_topics: Mutex::new(HashSet::new()),
                queued: Mutex::new(HashMap::new()),
                message_max_bytes,
                config,
            }),
        };
        let timeout = transport.inner.config.connect_timeout();
        let producer = transport.producer();
        let metadata = tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, Timeout::After(timeout))
                .map(|m| m.brokers().len())
        })
        .await
        .map_err(|e| KafkaConnectError::Client(format!("metadata task failed: {e}")))?;
        match metadata {
            Ok(brokers) => {
                tracing::info!(brokers, "connected to the Kafka cluster");
                Ok(transport)
            }
            Err(e) => Err(KafkaConnectError::Connect {
                url: redact_url(url),
                timeout_secs: transport.inner.config.connect_timeout_secs,
                reason: e.to_string(),
            }),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &KafkaConfig {
        &self.inner.config
    }

    /// The topic `message` is published to: its destination override, or
    /// [`KafkaConfig::topic_template`] with legal placeholder values.
    ///
    /// # Errors
    /// [`PublishErrorKind::Invalid`] when the result is not a legal topic name.
    pub fn topic_for(&self, message: &OutboxMessage) -> Result<String, PublishError> {
        topic_of(message, &self.inner.config)
    }

    /// The headers `message` is published with: see [`wire_headers`].
    ///
    /// # Errors
    /// As [`wire_headers`].
    pub fn headers_for(
        &self,
        message: &OutboxMessage,
    ) -> Result<Vec<(String, String)>, PublishError> {
        wire_headers(message, &self.inner.config.source)
    }

    /// Makes sure `topic` exists: known, found in the cluster's metadata, or created.
    async fn ensure_topic(&self, topic: &str, event: &OutboxMessage) -> Result<(), PublishError> {
        if self.known(topic) {
            return Ok(());
        }
        let timeout = self.inner.config.connect_timeout();
        let producer = self.producer();
        let name = topic.to_owned();
        let found = tokio::task::spawn_blocking(move || {
            let metadata = producer
                .client()
                .fetch_metadata(Some(&name), Timeout::After(timeout))?;
            Ok::<_, KafkaError>(
                metadata
                    .topics()
                    .iter()
                    .any(|t| t.name() == name && t.error().is_none() && !t.partitions().is_empty()),
            )
        })
        .await
        .map_err(|e| PublishError::new(PublishErrorKind::Unavailable, e.to_string()))?
        .map_err(|e| {
            PublishError::new(
                classify(&e),
                format!("event {}: metadata of topic `{topic}`: {e}", event.event_id),
            )
        })?;
        if found {
            self.remember(topic);
            return Ok(());
        }
        let missing = |why: String| {
            PublishError::new(
                PublishErrorKind::Rejected,
                format!(
                    "event {}: topic `{topic}` does not exist and {why}; the event stays \
                     pending and is retried",
                    event.event_id
                ),
            )
        };
        if !self.inner.config.create_topics {
            return Err(missing("create_topics is off".into()));
        }
        let config = &self.inner.config;
        let new = NewTopic::new(
            topic,
            config.topic_partitions,
            TopicReplication::Fixed(config.topic_replication_factor),
        );
        let options = AdminOptions::new().operation_timeout(Some(timeout));
        let results = self
            .inner
            .admin
            .create_topics([&new], &options)
            .await
            .map_err(|e| missing(format!("cannot be created: {e}")))?;
        for result in results {
            match result {
                Ok(_) => tracing::info!(topic, "created Kafka topic"),
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(missing(format!("cannot be created: {code}"))),
            }
        }
        self.remember(topic);
        Ok(())
    }

    fn producer(&self) -> Arc<FutureProducer<LogContext>> {
        Arc::clone(
            &self
                .inner
                .producer
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// An idempotent producer that hit a fatal error (the broker lost acknowledged data of a
    /// sequence), or whose producer id or epoch the broker no longer accepts, refuses every
    /// later record. Replaces it with a new one, once per failed producer: the events it failed
    /// are republished with the same ids by the relay (`Unavailable`, retried).
    fn replace_after_fatal(&self, failed: &Arc<FutureProducer<LogContext>>, error: &KafkaError) {
        let (code, reason) = match failed.client().fatal_error() {
            Some(fatal) => fatal,
            // The broker no longer accepts this producer id or epoch (a broker that cannot bump
            // an idempotent producer's epoch after timed-out records answers so): only a new
            // producer id gets records stored again.
            None => match error.rdkafka_error_code() {
                Some(
                    code @ (RDKafkaErrorCode::ProducerFenced
                    | RDKafkaErrorCode::InvalidProducerEpoch
                    | RDKafkaErrorCode::UnknownProducerId
                    | RDKafkaErrorCode::InvalidProducerIdMapping),
                ) => (code, error.to_string()),
                _ => return,
            },
        };
        let mut slot = self
            .inner
            .producer
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !Arc::ptr_eq(&slot, failed) {
            return;
        }
        match self.inner.client.create_with_context(LogContext) {
            Ok(producer) => {
                tracing::warn!(
                    %code, %reason,
                    "the Kafka producer can no longer publish; replaced it with a new one (the \
                     events it failed are retried with the same ids)"
                );
                *slot = Arc::new(producer);
            }
            Err(e) => tracing::error!(
                %code, %reason, error = %e,
                "the Kafka producer hit a fatal error and a new one cannot be made"
            ),
        }
    }

    fn known(&self, topic: &str) -> bool {
        self.inner
            .known_topics
            .lock()
            .is_ok_and(|known| known.contains(topic))
    }

    fn remember(&self, topic: &str) {
        if let Ok(mut known) = self.inner.known_topics.lock() {
            known.insert(topic.to_owned());
        }
    }

    fn forget(&self, topic: &str) {
        if let Ok(mut known) = self.inner.known_topics.lock() {
            known.remove(topic);
        }
    }

    /// The record of `message` ([`record_of`]), checked against this producer's
    /// `message.max.bytes`.
    fn record<'m>(&'m self, message: &'m OutboxMessage) -> Result<Record<'m>, PublishError> {
        record_of(message, &self.inner.config, self.inner.message_max_bytes)
    }

    /// Hands `record` to `producer` (librdkafka copies it into its queue) and returns its
    /// report.
    ///
    /// A record of the same event still in this producer's queue (an earlier publish whose
    /// report was not awaited to its end: the relay timed it out, or the lease moved) is not
    /// queued again: its report is shared. With no local timeout in librdkafka (see the
    /// crate's docs), a retried event would otherwise add a copy to the queue on every retry
    /// of an outage, all stored once the cluster is back. Skipping a later copy of a record
    /// that is queued ahead of it cannot reorder anything: the first copy is the one stored
    /// first.
    fn enqueue(
        &self,
        producer: &Arc<FutureProducer<LogContext>>,
        message: &OutboxMessage,
        record: &Record<'_>,
    ) -> Result<PendingReport, PublishError> {
        let mut queued = lock(&self.inner.queued);
        if let Some(q) = queued.get(&message.event_id)
            && Arc::ptr_eq(&q.producer, producer)
            // A report that already came back as a failure is not shared: the record is gone
            // from the queue, and this publish queues a new one.
            && !matches!(q.report.clone().now_or_never(), Some(Err(_)))
        {
            return Ok(q.report.clone());
        }
        let mut headers = OwnedHeaders::new_with_capacity(record.parts.headers.len());
        for (name, value) in &record.parts.headers {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_bytes()),
            });
        }
        let mut future = FutureRecord::to(&record.topic)
            .key(record.parts.key.as_bytes())
            .headers(headers)
            .timestamp(message.created_at.timestamp_millis());
        if let Some(value) = &record.parts.value {
            future = future.payload(value.as_ref());
        }
        let delivery = producer.send_result(future).map_err(|(e, _)| {
            self.replace_after_fatal(producer, &e);
            failed(message, "queueing", &record.topic, &e)
        })?;
        let report = delivery
            .map(|r| match r {
                Ok(Ok(d)) => Ok((d.partition, d.offset)),
                Ok(Err((e, _))) => Err(Some(e)),
                Err(_canceled) => Err(None),
            })
            .boxed()
            .shared();
        if queued.len() >= QUEUED_SWEEP_AT {
            // Reports nobody came back for: drop the settled ones and the replaced producers'.
            queued.retain(|_, q| {
                Arc::ptr_eq(&q.producer, producer) && q.report.clone().now_or_never().is_none()
            });
        }
        queued.insert(
            message.event_id,
            InQueue {
                producer: Arc::clone(producer),
                report: report.clone(),
            },
        );
        Ok(report)
    }

    /// Waits for the delivery report of a record of `message` to `topic`, at most
    /// [`KafkaConfig::delivery_timeout_secs`].
    async fn report(
        &self,
        producer: &Arc<FutureProducer<LogContext>>,
        message: &OutboxMessage,
        topic: &str,
        delivery: PendingReport,
    ) -> Result<PublishReceipt, PublishError> {
        let bound = self.inner.config.delivery_timeout();
        let Ok(report) = tokio::time::timeout(bound, delivery.clone()).await else {
            // The topic may have been deleted since it was seen: look it up again.
            self.forget(topic);
            return Err(PublishError::new(
                PublishErrorKind::TimedOut,
                format!(
                    "event {}: no delivery report within {bound:?} (the record stays in the \
                     client's queue and may still be stored: a copy with the same id)",
                    message.event_id
                ),
            ));
        };
        {
            let mut queued = lock(&self.inner.queued);
            if queued
                .get(&message.event_id)
                .is_some_and(|q| q.report.ptr_eq(&delivery))
            {
                queued.remove(&message.event_id);
            }
        }
        match report {
            Ok((partition, offset)) => {
                tracing::trace!(
                    event_id = %message.event_id,
                    %topic,
                    partition,
                    offset,
                    "published"
                );
                Ok(PublishReceipt { duplicate: false })
            }
            Err(None) => Err(PublishError::new(
                PublishErrorKind::Unavailable,
                "the producer was closed before the delivery report",
            )),
            Err(Some(e)) => {
                // The topic may have been deleted since it was seen: look it up again on the
                // next publish, and create it if so set.
                if matches!(
                    e.rdkafka_error_code(),
                    Some(
                        RDKafkaErrorCode::UnknownTopicOrPartition
                            | RDKafkaErrorCode::UnknownTopic
                            | RDKafkaErrorCode::UnknownPartition
                    )
                ) {
                    self.forget(topic);
                }
                self.replace_after_fatal(producer, &e);
                Err(failed(message, "delivery", topic, &e))
            }
        }
    }

    /// Hands as much of `run` to librdkafka as goes out in one piece: in order, the messages
    /// that share the first one's topic and key (so one partition, whose order the idempotent
    /// producer keeps), at most `max_in_flight`, stopping at the first that cannot be queued
    /// (its error is the last item). Holds the in-flight permits for all of them.
    async fn enqueue_run<'m>(&self, run: &'m [OutboxMessage]) -> Queued<'_, 'm> {
        let mut items: Vec<QueuedItem<'m>> = Vec::new();
        let mut records = Vec::new();
        let mut error = None;
        for message in run.iter().take(self.inner.config.max_in_flight) {
            match self.record(message) {
                Ok(record) => {
                    if let Some((_, first)) = records.first()
                        && !same_partition(first, &record)
                    {
                        break;
                    }
                    records.push((message, record));
                }
                Err(e) => {
                    error = Some((message, e));
                    break;
                }
            }
        }
        if let Some(&(message, ref record)) = records.first()
            && let Err(e) = self.ensure_topic(&record.topic, message).await
        {
            // No record goes out: the first one's error stands for the run.
            records.clear();
            error = Some((message, e));
        }
        let permit = match self
            .inner
            .in_flight
            .acquire_many(records.len() as u32)
            .await
        {
            Ok(permit) => Some(permit),
            Err(_) => {
                let e =
                    PublishError::new(PublishErrorKind::Unavailable, "the transport was closed");
                return Queued {
                    producer: self.producer(),
                    items: vec![QueuedItem::Failed(e)],
                    _permit: None,
                };
            }
        };
        let producer = self.producer();
        for (message, record) in records {
            match self.enqueue(&producer, message, &record) {
                Ok(delivery) => items.push(QueuedItem::Sent {
                    message,
                    topic: record.topic,
                    delivery,
                }),
                Err(e) => {
                    items.push(QueuedItem::Failed(e));
                    error = None;
                    break;
                }
            }
        }
        if let Some((_, e)) = error {
            items.push(QueuedItem::Failed(e));
        }
        Queued {
            producer,
            items,
            _permit: permit,
        }
    }
}

/// What [`KafkaTransport::enqueue_run`] handed over.
struct Queued<'t, 'm> {
    producer: Arc<FutureProducer<LogContext>>,
    items: Vec<QueuedItem<'m>>,
    /// Released once every report was read (or the stream dropped).
    _permit: Option<tokio::sync::SemaphorePermit<'t>>,
}

enum QueuedItem<'m> {
    Sent {
        message: &'m OutboxMessage,
        topic: String,
        delivery: PendingReport,
    },
    Failed(PublishError),
}

/// Whether two records go to one partition: one topic and one key.
fn same_partition(a: &Record<'_>, b: &Record<'_>) -> bool {
    a.topic == b.topic && a.parts.key == b.parts.key
}

fn failed(message: &OutboxMessage, stage: &str, topic: &str, e: &KafkaError) -> PublishError {
    PublishError::new(
        classify(e),
        format!("event {}: {stage} to `{topic}`: {e}", message.event_id),
    )
}

impl Transport for KafkaTransport {
    fn name(&self) -> &'static str {
        "kafka"
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<PublishReceipt, PublishError> {
        let record = self.record(message)?;
        self.ensure_topic(&record.topic, message).await?;
        let _permit = self.inner.in_flight.acquire().await.map_err(|_| {
            PublishError::new(PublishErrorKind::Unavailable, "the transport was closed")
        })?;
        let producer = self.producer();
        let delivery = self.enqueue(&producer, message, &record)?;
        self.report(&producer, message, &record.topic, delivery)
            .await
    }

    /// `true`: the idempotent producer keeps one partition's records in order across its
    /// retries, and `message.timeout.ms` is infinite with `enable.gapless.guarantee`, so no
    /// record is ever dropped while a later one of its partition is stored (see the crate's
    /// docs, "Ordered pipelining").
    fn ordered_pipelining(&self) -> bool {
        true
    }

    fn publish_run<'a>(
        &'a self,
        run: &'a [OutboxMessage],
    ) -> impl futures::Stream<Item = Result<PublishReceipt, PublishError>> + Send + 'a {
        use futures::StreamExt as _;
        futures::stream::once(self.enqueue_run(run)).flat_map(move |queued| {
            let Queued {
                producer,
                items,
                _permit,
            } = queued;
            futures::stream::iter(items).then(move |item| {
                // The permits live as long as the reports are read.
                let _held = &_permit;
                let producer = Arc::clone(&producer);
                async move {
                    match item {
                        QueuedItem::Sent {
                            message,
                            topic,
                            delivery,
                        } => self.report(&producer, message, &topic, delivery).await,
                        QueuedItem::Failed(e) => Err(e),
                    }
                }
            })
        })
    }
}

/// The kind of a librdkafka error: what the relay does with the event.
pub(crate) fn classify(e: &KafkaError) -> PublishErrorKind {
    use RDKafkaErrorCode as C;
    let Some(code) = e.rdkafka_error_code() else {
        return match e {
            KafkaError::Canceled => PublishErrorKind::Unavailable,
            _ => PublishErrorKind::Rejected,
        };
    };
    match code {
        C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge => {
            PublishErrorKind::TooLarge
        }
        C::InvalidTopic | C::InvalidRecord | C::InvalidTimestamp | C::InvalidMessage => {
            PublishErrorKind::Invalid
        }
        C::MessageTimedOut | C::RequestTimedOut | C::OperationTimedOut | C::TimedOutQueue => {
            PublishErrorKind::TimedOut
        }
        C::BrokerTransportFailure
        | C::AllBrokersDown
        | C::Resolve
        | C::QueueFull
        | C::NetworkException
        | C::LeaderNotAvailable
        | C::NotLeaderForPartition
        | C::BrokerNotAvailable
        | C::NotEnoughReplicas
        | C::NotEnoughReplicasAfterAppend
        | C::KafkaStorageError
        | C::PurgeQueue
        | C::PurgeInflight
        | C::Fatal
        | C::ProducerFenced
        | C::InvalidProducerEpoch
        | C::UnknownProducerId
        | C::InvalidProducerIdMapping
        | C::BrokerDestroy
        | C::DestroyBroker => PublishErrorKind::Unavailable,
        _ => PublishErrorKind::Rejected,
    }
}

/// The lock's data, poisoned or not (every critical section here leaves it consistent).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
