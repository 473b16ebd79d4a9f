//! Fault injection with librdkafka's mock cluster (in addition to the real broker of the other
//! tests, not instead): produce requests refused with retriable errors, a record the broker
//! calls invalid, and the only broker going down and coming back. The transport must report
//! success only for what is stored, keep one aggregate's versions in order and without
//! duplicates through librdkafka's own retries, and recover after a broker comes back.

use std::time::Duration;

use outbox_core::{PublishErrorKind, Transport as _};
use outbox_kafka::rdkafka::ClientConfig;
use outbox_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use outbox_kafka::rdkafka::message::{Headers as _, Message as _};
use outbox_kafka::rdkafka::mocking::MockCluster;
use outbox_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use outbox_kafka::rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use outbox_kafka::{KafkaConfig, KafkaTransport, Properties};
use outbox_testkit::message;

const TOPIC: &str = "outbox.payment";

/// The transport under test, on the mock cluster, with one produce request in flight at a
/// time (`max.in.flight.requests.per.connection = 1`).
///
/// Why one: the mock broker does not check an idempotent producer's sequence numbers unless
/// the producer is transactional, and librdkafka takes the success of a later produce request
/// as proof that the records of an earlier failed one were stored (its "implicit ack", sound
/// on a broker that checks sequences: there the later request fails too). With two requests in
/// flight and an error injected into the first, the mock stores the second alone and librdkafka
/// reports the first one's records stored: a loss that no broker enforcing sequences (Apache
/// Kafka, tansu) can produce, measured here on librdkafka 2.12.1 with five requests in flight.
/// The transport's own pipelining (whole runs queued at once, reports read in order, retries
/// sharing a queued record) is what these tests exercise, and one request at a time keeps it.
async fn transport(bootstrap: &str) -> KafkaTransport {
    let one_request_at_a_time = [(
        "max.in.flight.requests.per.connection".to_owned(),
        "1".to_owned(),
    )];
    KafkaTransport::connect(
        &format!("kafka://{bootstrap}"),
        KafkaConfig {
            create_topics: false,
            delivery_timeout_secs: 3,
            connect_timeout_secs: 5,
            properties: Properties(one_request_at_a_time.into_iter().collect()),
            ..KafkaConfig::default()
        },
    )
    .await
    .expect("transport on the mock cluster")
}

/// `(aggregate version, event id)` of every record of the one-partition topic, in offset order.
fn read_all(bootstrap: &str) -> Vec<(i64, String)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "mock-reader")
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader");
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(TOPIC, 0, Offset::Beginning)
        .expect("partition");
    consumer.assign(&list).expect("assign");
    let (_, high) = consumer
        .fetch_watermarks(TOPIC, 0, Duration::from_secs(10))
        .expect("watermarks");
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while (out.len() as i64) < high && std::time::Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m.expect("record");
            let header = |name: &str| {
                m.headers()
                    .and_then(|h| h.iter().find(|h| h.key == name))
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default()
            };
            out.push((
                header("ce_aggregateversion").parse().expect("version"),
                header("ce_id"),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_produce_errors_keep_order_and_store_each_event_once() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic(TOPIC, 1, 1).expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    let transport = transport(&bootstrap).await;

    // The relay's pattern: one aggregate's versions one after another, each acknowledged
    // before the next, while the broker refuses some produce requests with retriable errors
    // (librdkafka retries them itself, with the same producer id and sequence numbers).
    let mut sent = Vec::new();
    for v in 1..=30 {
        if v % 5 == 0 {
            cluster.request_errors(
                RDKafkaApiKey::Produce,
                &[
                    RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
                    RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                    RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
                ],
            );
        }
        let m = message::event("pay-1", v, &b"{}"[..]);
        transport
            .publish(&m)
            .await
            .unwrap_or_else(|e| panic!("v{v}: {e}"));
        sent.push((v, m.event_id.to_string()));
    }
    let stored = tokio::task::spawn_blocking(move || read_all(&bootstrap))
        .await
        .expect("reader");
    assert_eq!(stored, sent, "every version once, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_record_is_not_sent_and_a_broker_outage_is_survived() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic(TOPIC, 1, 1).expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    let transport = transport(&bootstrap).await;
    let first = message::event("pay-2", 1, &b"{}"[..]);
    transport.publish(&first).await.expect("first");

    // A record the broker refuses as invalid: an error the relay dead-letters, never sent.
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_RECORD],
    );
    let refused = message::event("pay-2", 2, &b"{}"[..]);
    let e = transport.publish(&refused).await.expect_err("refused");
    assert!(
        matches!(
            e.kind,
            PublishErrorKind::Invalid | PublishErrorKind::Unavailable
        ),
        "{e:?}"
    );
    cluster.clear_request_errors(RDKafkaApiKey::Produce);

    // The only broker down: the publish fails within the delivery timeout (retried later by
    // the relay), then goes through once it is back (the producer is replaced if the failure
    // was fatal to it).
    cluster.broker_down(1).expect("broker down");
    let during = message::event("pay-2", 2, &b"{}"[..]);
    let started = std::time::Instant::now();
    let e = transport.publish(&during).await.expect_err("broker down");
    assert!(e.is_retryable(), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    cluster.broker_up(1).expect("broker up");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let after = loop {
        let m = message::event("pay-2", 2, &b"{}"[..]);
        match transport.publish(&m).await {
            Ok(_) => break m,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("after the outage: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no publish within 30 s of the broker's return: {e}"),
        }
    };
    let stored = tokio::task::spawn_blocking(move || read_all(&bootstrap))
        .await
        .expect("reader");
    let ids: Vec<&str> = stored.iter().map(|(_, id)| id.as_str()).collect();
    assert!(
        !ids.contains(&refused.event_id.to_string().as_str()),
        "the refused record was stored: {stored:?}"
    );
    assert_eq!(
        ids.first().copied(),
        Some(first.event_id.to_string().as_str())
    );
    assert_eq!(
        ids.last().copied(),
        Some(after.event_id.to_string().as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_retried_through_an_outage_is_queued_once() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic(TOPIC, 1, 1).expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    let transport = transport(&bootstrap).await;
    transport
        .publish(&message::event("pay-3", 1, &b"{}"[..]))
        .await
        .expect("before the outage");

    // The relay's retries of one event while the broker is down: each times out waiting for
    // its report, and the record stays in the client's queue (no local timeout).
    cluster.broker_down(1).expect("broker down");
    let retried = message::event("pay-3", 2, &b"{}"[..]);
    for attempt in 1..=3 {
        let e = transport.publish(&retried).await.expect_err("broker down");
        assert!(e.is_retryable(), "attempt {attempt}: {e:?}");
    }
    cluster.broker_up(1).expect("broker up");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while let Err(e) = transport.publish(&retried).await {
        assert!(
            std::time::Instant::now() < deadline,
            "no publish within 30 s of the broker's return: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stored = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_secs(1));
        read_all(&bootstrap)
    })
    .await
    .expect("reader");
    let id = retried.event_id.to_string();
    let copies = stored.iter().filter(|(_, e)| *e == id).count();
    assert_eq!(
        copies, 1,
        "four publishes of one event while it sat in the queue: one record, not one per retry \
         ({stored:?})"
    );
}

/// The relay's pipelined pattern on Kafka: whole runs of versions handed over at once
/// ([`Transport::publish_run`]), the reports read in order up to the first failure, and the
/// rest of the run published again, as the relay does. Several aggregates at once, while the
/// broker refuses produce requests with retriable errors and then goes down and comes back.
/// What the broker stores must hold every acknowledged version, and each aggregate's versions
/// must first appear in order: never a version before the first copy of an earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_runs_keep_each_aggregate_in_order_through_errors_and_an_outage() {
    use futures::StreamExt as _;
    const AGGREGATES: usize = 6;
    const VERSIONS: i64 = 40;
    const RUN: usize = 5;

    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic(TOPIC, 1, 1).expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    let transport = std::sync::Arc::new(transport(&bootstrap).await);
    assert!(transport.ordered_pipelining());

    let mut tasks = Vec::new();
    for a in 0..AGGREGATES {
        let transport = std::sync::Arc::clone(&transport);
        tasks.push(tokio::spawn(async move {
            let aggregate = format!("pipe-{a}");
            let events: Vec<_> = (1..=VERSIONS)
                .map(|v| message::event(&aggregate, v, &b"{}"[..]))
                .collect();
            let mut next = 0usize; // first version not acknowledged yet
            let mut failures = 0u32;
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while next < events.len() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{aggregate}: stuck at v{}",
                    next + 1
                );
                let run = &events[next..(next + RUN).min(events.len())];
                // The relay's read: in order, up to the first error, cut after 3 s.
                let mut results = std::pin::pin!(transport.publish_run(run));
                let cut = tokio::time::Instant::now() + Duration::from_secs(3);
                while let Ok(Some(result)) = tokio::time::timeout_at(cut, results.next()).await {
                    match result {
                        Ok(_) => next += 1,
                        Err(e) => {
                            assert!(e.is_retryable(), "{aggregate}: {e}");
                            failures += 1;
                            break;
                        }
                    }
                }
                // The relay's pace between batches: the runs spread over the faults below.
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            (events, failures)
        }));
    }
    // The faults, while the aggregates publish (here: the mock cluster stays on this task):
    // bursts of retriable produce errors, then the only broker down for longer than the
    // delivery timeout (3 s), so that publishes in flight fail and are taken again.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        cluster.request_errors(
            RDKafkaApiKey::Produce,
            &[
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            ],
        );
    }
    cluster.broker_down(1).expect("broker down");
    tokio::time::sleep(Duration::from_secs(5)).await;
    cluster.broker_up(1).expect("broker up");

    let mut sent = Vec::new();
    let mut failures = 0;
    for t in tasks {
        let (events, f) = t.await.expect("aggregate task");
        failures += f;
        sent.push(events);
    }
    assert!(
        failures > 0,
        "the outage failed no publish: the test proves nothing"
    );

    // Everything the client may still hold is stored before the topic is read.
    let stored = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_secs(2));
        read_all(&bootstrap)
    })
    .await
    .expect("reader");
    let position: std::collections::HashMap<&str, usize> = stored
        .iter()
        .enumerate()
        .rev()
        .map(|(i, (_, id))| (id.as_str(), i))
        .collect();
    for events in &sent {
        let firsts: Vec<usize> = events
            .iter()
            .map(|m| {
                *position
                    .get(m.event_id.to_string().as_str())
                    .unwrap_or_else(|| panic!("acknowledged but not stored: {}", m.event_id))
            })
            .collect();
        assert!(
            firsts.windows(2).all(|w| w[0] < w[1]),
            "{}: a version first appears before an earlier one: {firsts:?}",
            events[0].aggregate_id
        );
    }
    eprintln!(
        "{} records stored for {} events ({failures} failed reads)",
        stored.len(),
        AGGREGATES * VERSIONS as usize
    );
}
