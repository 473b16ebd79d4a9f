//! The consumer-group member behind a [`KafkaSource`](crate::KafkaSource): the rebalance hooks
//! that keep the books ([`super::tracker`]), polling with flow control and spilled deliveries
//! read again, the offset commits (one committer task, commits never overlapping), the group's
//! lag, and leaving the group.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use outbox_core::consumer::{SourceError, SourceErrorKind};
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message as _};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::util::Timeout;
use tokio::sync::mpsc;

use super::tracker::{Arrival, Done, Tp, Tracker};
use super::{Ack, Held, KafkaDelivery, Links};
use crate::binding::{decode_raw, raw_of};
use crate::connection::LogContext;

/// Longest one `poll` call blocks, so due redeliveries are handed out on time.
const POLL_SLICE: Duration = Duration::from_millis(100);

/// How long a failed seek back waits before it is tried again.
const RESEEK_DELAY: Duration = Duration::from_secs(1);

/// The consumer's context: librdkafka's logs, and the rebalance hooks that keep the books.
pub(super) struct SourceContext {
    log: LogContext,
    tracker: Arc<Mutex<Tracker>>,
    /// Held across every offset commit, so commits never overlap and a later one never lands
    /// before an earlier one (a committed offset never moves back).
    commit_lock: Arc<Mutex<()>>,
    timeout: Duration,
}

/// Takes `lock`, waiting at most `timeout` (a commit stuck in an outage must not block a
/// rebalance for ever).
fn lock_within(lock: &Mutex<()>, timeout: Duration) -> Option<MutexGuard<'_, ()>> {
    let until = Instant::now() + timeout;
    loop {
        match lock.try_lock() {
            Ok(guard) => return Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

pub(super) fn lock(tracker: &Mutex<Tracker>) -> MutexGuard<'_, Tracker> {
    // The books stay consistent whatever panicked while holding them: every method leaves
    // them whole.
    tracker
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn tps_of(list: &TopicPartitionList) -> Vec<Tp> {
    list.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

fn list_of(positions: &[(Tp, i64)]) -> Result<TopicPartitionList, KafkaError> {
    let mut list = TopicPartitionList::new();
    for ((topic, partition), offset) in positions {
        list.add_partition_offset(topic, *partition, Offset::Offset(*offset))?;
    }
    Ok(list)
}

impl ClientContext for SourceContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.log.log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.log.error(error, reason);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        self.log.stats_raw(statistics);
    }
}

impl ConsumerContext for SourceContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(list) = rebalance else {
            return;
        };
        let tps = tps_of(list);
        // Commit what this member applied before the partitions go: the next owner starts
        // right after it. A failure only means the next owner reads a little more again.
        let guard = lock_within(&self.commit_lock, self.timeout);
        let positions = lock(&self.tracker).positions(&tps);
        if guard.is_none() {
            tracing::warn!(
                ?positions,
                "an earlier offset commit is still stuck; not committing before the revocation: \
                 the next owner reads these events again and its inbox absorbs them"
            );
        } else if !positions.is_empty() {
            match list_of(&positions).and_then(|l| consumer.commit(&l, CommitMode::Sync)) {
                Ok(()) => tracing::debug!(?positions, "committed before the revocation"),
                Err(e) => tracing::warn!(
                    error = %e,
                    ?positions,
                    "cannot commit before the revocation: the next owner reads these events \
                     again and its inbox absorbs them"
                ),
            }
        }
        lock(&self.tracker).revoke(&tps);
        drop(guard);
        tracing::info!(partitions = ?tps, "partitions revoked");
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(list) => {
                let tps = tps_of(list);
                tracing::info!(partitions = ?tps, "partitions assigned");
                // The assigned partitions take the source's flow-control state. librdkafka
                // keeps an application's pause of a partition across revocation and
                // assignment, so a partition paused before is resumed unless the source is
                // paused. And with `cooperative-sticky` an assignment only adds partitions to
                // those held (paused or not): the source's state stays as it is, and the new
                // partitions follow it, so the next resume reaches all of them.
                let mut tracker = lock(&self.tracker);
                let result = if tracker.paused {
                    consumer.pause(list)
                } else {
                    consumer.resume(list)
                };
                if let Err(e) = result {
                    tracing::warn!(
                        error = %e,
                        paused = tracker.paused,
                        "cannot pause or resume the assigned partitions"
                    );
                }
                tracker.assign(tps);
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => {
                // After a failed rebalance rdkafka drops the assignment (all of it, or, with
                // `cooperative-sticky`, the partitions of that rebalance): the books keep only
                // what the consumer still holds (the next assignment reads from the committed
                // offsets).
                let still: std::collections::HashSet<Tp> = consumer
                    .assignment()
                    .map(|list| tps_of(&list).into_iter().collect())
                    .unwrap_or_default();
                let mut tracker = lock(&self.tracker);
                let gone: Vec<Tp> = tracker
                    .assigned()
                    .into_iter()
                    .filter(|tp| !still.contains(tp))
                    .collect();
                tracker.revoke(&gone);
                tracing::warn!(error = %e, dropped = ?gone, "rebalance failed; its partitions are dropped");
            }
        }
    }
}

/// What the source, its deliveries and its committer share.
pub(super) struct Shared {
    pub(super) consumer: BaseConsumer<SourceContext>,
    pub(super) tracker: Arc<Mutex<Tracker>>,
    commit_lock: Arc<Mutex<()>>,
    /// One thread polls at a time: a rebalance seen by one poll is in the books before another
    /// poll can return a message of the new assignment (a `next_batch` whose future was
    /// dropped leaves its blocking poll running).
    poll_lock: Mutex<()>,
    pub(super) timeout: Duration,
}

impl Shared {
    /// A consumer made from `client`, whose rebalance hooks keep the books; `timeout` bounds
    /// its commits and queries.
    pub(super) fn new(client: &ClientConfig, timeout: Duration) -> KafkaResult<Self> {
        let tracker = Arc::new(Mutex::new(Tracker::default()));
        let commit_lock = Arc::new(Mutex::new(()));
        let consumer: BaseConsumer<SourceContext> = client.create_with_context(SourceContext {
            log: LogContext,
            tracker: Arc::clone(&tracker),
            commit_lock: Arc::clone(&commit_lock),
            timeout,
        })?;
        Ok(Self {
            consumer,
            tracker,
            commit_lock,
            poll_lock: Mutex::new(()),
            timeout,
        })
    }

    /// Commits what is done and leaves the group at once (blocking thread), so the partitions
    /// go to the other members without waiting for the session timeout.
    pub(super) fn leave(&self) {
        if let Err(e) = self.commit() {
            tracing::warn!(error = %e, "cannot commit the last offsets while closing");
        }
        let _polling = self
            .poll_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        lock(&self.tracker).close();
        self.consumer.unsubscribe();
        let until = Instant::now() + self.timeout;
        while Instant::now() < until && self.consumer.assignment().is_ok_and(|a| a.count() > 0) {
            let _ = self.consumer.poll(Timeout::After(POLL_SLICE));
        }
        let _ = self.consumer.poll(Timeout::After(Duration::ZERO));
    }

    /// Commits the books' committable positions, synchronously (call from a blocking thread).
    pub(super) fn commit(&self) -> Result<(), KafkaError> {
        let _guard = self
            .commit_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let positions = lock(&self.tracker).to_commit();
        if positions.is_empty() {
            return Ok(());
        }
        self.consumer
            .commit(&list_of(&positions)?, CommitMode::Sync)?;
        lock(&self.tracker).committed(&positions);
        tracing::trace!(?positions, "offsets committed");
        Ok(())
    }

    /// Pauses every assigned partition once `max` deliveries are held, and resumes them once
    /// a quarter of them (at least one) settled (blocking thread). Paused, the consumer is still polled:
    /// it stays in its group and serves rebalances.
    fn flow_control(&self, max: usize) {
        let (held, paused, assigned) = {
            let tracker = lock(&self.tracker);
            (tracker.held(), tracker.paused, tracker.assigned())
        };
        let pause = if !paused && held >= max {
            true
        } else if paused && held <= max - max.div_ceil(4) {
            false
        } else {
            return;
        };
        let list = list_of(&assigned.into_iter().map(|tp| (tp, 0)).collect::<Vec<_>>());
        let result = list.and_then(|l| {
            if pause {
                self.consumer.pause(&l)
            } else {
                self.consumer.resume(&l)
            }
        });
        match result {
            Ok(()) => {
                lock(&self.tracker).paused = pause;
                if pause {
                    tracing::warn!(
                        held,
                        max,
                        "the Kafka source holds its limit of unacknowledged deliveries: \
                         partitions paused until some are settled"
                    );
                } else {
                    tracing::info!(held, "partitions resumed");
                }
            }
            Err(e) => tracing::warn!(error = %e, pause, "cannot pause or resume the partitions"),
        }
    }

    /// Seeks each partition with a spilled delivery that is due back to the lowest such
    /// offset, so the broker hands them out again (blocking thread). What was held or done
    /// meanwhile is skipped when it comes by again.
    fn reread_spilled(&self) {
        let due = lock(&self.tracker).rereads_due(Instant::now());
        for ((topic, partition), offset) in due {
            match self.consumer.seek(
                &topic,
                partition,
                Offset::Offset(offset),
                Timeout::After(self.timeout),
            ) {
                Ok(()) => tracing::debug!(
                    topic,
                    partition,
                    offset,
                    "reading spilled deliveries again from the broker"
                ),
                Err(e) => {
                    tracing::warn!(
                        error = %e, topic, partition, offset,
                        "cannot seek back to spilled deliveries; trying again shortly"
                    );
                    lock(&self.tracker)
                        .reread_failed(&(topic, partition), Instant::now() + RESEEK_DELAY);
                }
            }
        }
    }

    /// Up to `max` deliveries, waiting at most `wait` for the first (blocking thread).
    pub(super) fn poll_batch(
        self: &Arc<Self>,
        max: usize,
        wait: Duration,
        links: &Links,
    ) -> Result<Vec<KafkaDelivery>, SourceError> {
        let _polling = self
            .poll_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let deadline = Instant::now() + wait;
        let mut batch = Vec::new();
        while batch.len() < max {
            self.flow_control(links.max_unacked);
            self.reread_spilled();
            let next_retry = links.take_due_retries(max - batch.len(), &mut batch);
            if batch.len() >= max {
                break;
            }
            let now = Instant::now();
            let slice = if batch.is_empty() {
                let mut slice = deadline.saturating_duration_since(now).min(POLL_SLICE);
                if let Some(at) = next_retry {
                    slice = slice.min(at.saturating_duration_since(now));
                }
                slice
            } else {
                Duration::ZERO
            };
            match self.consumer.poll(Timeout::After(slice)) {
                None => {
                    if !batch.is_empty() || Instant::now() >= deadline {
                        break;
                    }
                }
                Some(Ok(message)) => {
                    if let Some(d) = self.deliver(&message, links) {
                        batch.push(d);
                    }
                }
                Some(Err(e)) => match consumer_error(&e) {
                    ErrorKind::Ignore => {
                        tracing::warn!(error = %e, "Kafka consumer error");
                    }
                    kind => {
                        if !batch.is_empty() {
                            // Hand over what came; the error shows again on the next call.
                            tracing::warn!(error = %e, "Kafka consumer error");
                            break;
                        }
                        let kind = if kind == ErrorKind::Unavailable {
                            SourceErrorKind::Unavailable
                        } else {
                            SourceErrorKind::Other
                        };
                        return Err(SourceError::new(kind, format!("Kafka consumer: {e}")));
                    }
                },
            }
        }
        Ok(batch)
    }

    fn deliver(
        self: &Arc<Self>,
        message: &BorrowedMessage<'_>,
        links: &Links,
    ) -> Option<KafkaDelivery> {
        let tp = (message.topic().to_owned(), message.partition());
        let offset = message.offset();
        let generation = match lock(&self.tracker).arrived(&tp, offset) {
            Arrival::Deliver(generation) => generation,
            // Read again by a seek back: held or done already.
            Arrival::Skip => return None,
            Arrival::Unknown => {
                // librdkafka hands out messages of assigned partitions only, and the books
                // learn of an assignment in the same poll, before any of its messages: this
                // is a bug. Not delivered, the message is not committed past either while the
                // partition stays unknown; a later assignment reads it again.
                tracing::error!(
                    topic = %tp.0, partition = tp.1, offset,
                    "a message of a partition this source does not know it holds; not delivered"
                );
                return None;
            }
        };
        let raw = raw_of(message);
        let event = decode_raw(&raw, links.max_message_bytes);
        Some(KafkaDelivery {
            held: Some(Held {
                event,
                raw,
                tp,
                offset,
                generation,
            }),
            link: links.clone(),
        })
    }

    /// Group lag on this member's partitions (blocking thread).
    pub(super) fn lag(&self) -> Result<u64, KafkaError> {
        let assigned = lock(&self.tracker).assigned();
        if assigned.is_empty() {
            return Ok(0);
        }
        let list = list_of(
            &assigned
                .iter()
                .map(|tp| (tp.clone(), 0))
                .collect::<Vec<_>>(),
        )?;
        let committed = self
            .consumer
            .committed_offsets(list, Timeout::After(self.timeout))?;
        let mut lag = 0u64;
        for element in committed.elements() {
            let (low, high) = self.consumer.fetch_watermarks(
                element.topic(),
                element.partition(),
                Timeout::After(self.timeout),
            )?;
            let from = match element.offset() {
                Offset::Offset(o) => o,
                _ => low,
            };
            lag += u64::try_from(high.saturating_sub(from)).unwrap_or(0);
        }
        Ok(lag)
    }
}

/// What a consumer error means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ErrorKind {
    /// Logged; consuming goes on (a subscribed topic that does not exist yet, for instance).
    Ignore,
    /// The cluster cannot be reached.
    Unavailable,
    /// Anything else the caller must see.
    Other,
}

pub(super) fn consumer_error(e: &KafkaError) -> ErrorKind {
    use RDKafkaErrorCode as C;
    if matches!(e, KafkaError::MessageConsumptionFatal(_)) {
        return ErrorKind::Other;
    }
    match e.rdkafka_error_code() {
        Some(
            C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::Resolve
            | C::NetworkException
            | C::RequestTimedOut
            | C::OperationTimedOut
            | C::CoordinatorNotAvailable
            | C::NotCoordinator
            | C::WaitingForCoordinator,
        ) => ErrorKind::Unavailable,
        Some(
            C::TopicAuthorizationFailed
            | C::GroupAuthorizationFailed
            | C::SaslAuthenticationFailed
            | C::Authentication
            | C::SSL,
        ) => ErrorKind::Other,
        _ => ErrorKind::Ignore,
    }
}

/// Serves acknowledgements: records them, then commits once for all that came together.
/// Retries a failed commit every second while nothing new comes. Ends when the source and
/// every delivery are gone.
pub(super) async fn committer(shared: Arc<Shared>, mut requests: mpsc::UnboundedReceiver<Ack>) {
    let mut retry_pending = false;
    // A commit that outlived its timeout (librdkafka waits for the connection to come back):
    // no new one starts before it ended, so commits land in order.
    let mut stuck: Option<tokio::task::JoinHandle<Result<(), KafkaError>>> = None;
    loop {
        let first = if retry_pending {
            match tokio::time::timeout(Duration::from_secs(1), requests.recv()).await {
                Ok(None) => break,
                Ok(Some(ack)) => Some(ack),
                Err(_) => None,
            }
        } else {
            match requests.recv().await {
                None => break,
                Some(ack) => Some(ack),
            }
        };
        let mut waiting = Vec::new();
        let mut pending = first.into_iter().collect::<Vec<_>>();
        while let Ok(ack) = requests.try_recv() {
            pending.push(ack);
        }
        {
            let mut tracker = lock(&shared.tracker);
            for ack in pending {
                match tracker.done(&ack.tp, ack.generation, ack.offset) {
                    Done::Recorded => waiting.push(ack.reply),
                    Done::Revoked => {
                        let _ = ack.reply.send(Err(SourceError::new(
                            SourceErrorKind::Other,
                            format!(
                                "partition {}[{}] was revoked before the ack of offset {}: \
                                 its new owner reads the event again and the inbox absorbs it",
                                ack.tp.0, ack.tp.1, ack.offset
                            ),
                        )));
                    }
                    Done::Closed => {
                        let _ = ack.reply.send(Err(SourceError::new(
                            SourceErrorKind::Other,
                            "the Kafka source was closed before the ack: the event is read \
                             again and the inbox absorbs it",
                        )));
                    }
                }
            }
        }
        if let Some(earlier) = stuck.as_mut()
            && tokio::time::timeout(shared.timeout, earlier).await.is_ok()
        {
            stuck = None;
        }
        let result = if stuck.is_some() {
            Err(())
        } else {
            let committing = Arc::clone(&shared);
            let mut task = tokio::task::spawn_blocking(move || committing.commit());
            match tokio::time::timeout(shared.timeout, &mut task).await {
                Ok(done) => Ok(done),
                Err(_) => {
                    stuck = Some(task);
                    Err(())
                }
            }
        };
        let outcome = match result {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(SourceError::new(
                match consumer_error(&e) {
                    ErrorKind::Other => SourceErrorKind::Other,
                    _ => SourceErrorKind::Unavailable,
                },
                format!("offset commit failed: {e}"),
            )),
            Ok(Err(e)) => Err(SourceError::new(
                SourceErrorKind::Other,
                format!("offset commit task failed: {e}"),
            )),
            Err(()) => Err(SourceError::new(
                SourceErrorKind::Unavailable,
                format!("offset commit did not complete within {:?}", shared.timeout),
            )),
        };
        retry_pending = outcome.is_err() && !lock(&shared.tracker).is_closed();
        for reply in waiting {
            let _ = reply.send(outcome.clone());
        }
    }
    // Everything is gone: librdkafka's close (leave the group, destroy) blocks, so it runs on
    // a blocking thread.
    let _ = tokio::task::spawn_blocking(move || drop(shared)).await;
}
