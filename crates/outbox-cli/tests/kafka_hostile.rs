//! The Kafka source against records written through librdkafka itself, around the crate's
//! encoder: header names and values of any bytes (librdkafka checks neither), a NUL in the
//! content type. Into the in-process `PgConsumer` on the real PostgreSQL, each hostile record
//! is one consumer dead letter with its raw bytes and a reason, the valid event behind it is
//! applied within 5 s, the consumer never fails, and the group's committed offset reaches the
//! end of the partition; the dead letter keeps the event id and aggregate, readable in the
//! record. Before, a header name that was not UTF-8 panicked the poll (rdkafka 0.39 unwrapped
//! the name's UTF-8 check): no dead letter, and the offset stuck before it.
//!
//! Also the source's flow control under the ordering guard: an aggregate whose versions sit on
//! two partitions is applied in order with a window of two deliveries, where the window used
//! to fill with versions waiting for one that was never fetched.
#![allow(missing_docs)]

mod common;
mod inbox_common;

use std::time::Duration;

use common::*;
use inbox_common::*;
use outbox_core::OutboxMessage;
use outbox_core::consumer::{ConsumerReport, OrderingGuard};
use outbox_kafka::rdkafka::message::{OwnedHeaders, RawHeader};
use outbox_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use outbox_kafka::{CONTENT_TYPE_HEADER, KafkaConsumerConfig, KafkaSource};
use serde_json::json;
use uuid::Uuid;

/// How soon the valid event behind a hostile record must be applied.
const APPLIED_WITHIN: Duration = Duration::from_secs(5);

/// A record's headers, names and values as bytes.
type Headers = Vec<(Vec<u8>, Vec<u8>)>;

/// The headers the transport writes for `msg`, as bytes.
fn wire(msg: &OutboxMessage) -> Headers {
    outbox_kafka::wire_headers(msg, outbox_core::wire::DEFAULT_SOURCE)
        .expect("wire headers")
        .into_iter()
        .map(|(n, v)| (n.into_bytes(), v.into_bytes()))
        .collect()
}

/// Writes one record to `partition` of `topic` through librdkafka, headers byte for byte.
async fn produce(topic: &str, partition: i32, headers: &Headers, body: &[u8]) {
    let producer: FutureProducer = kafka_client().create().expect("producer");
    let mut owned = OwnedHeaders::new();
    for (name, value) in headers {
        owned = owned.insert_raw(RawHeader {
            key: name,
            value: Some(value),
        });
    }
    let record = FutureRecord::to(topic)
        .partition(partition)
        .key("hostile")
        .payload(body)
        .headers(owned);
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

fn topic(env: &Env) -> String {
    match &env.broker {
        BrokerEnv::Kafka(k) => k.topic.clone(),
        _ => unreachable!("a Kafka environment"),
    }
}

/// A fresh `payment` aggregate's first event (a body of its own).
fn fresh() -> OutboxMessage {
    let aggregate = format!("pay-{}", uid());
    message(&aggregate, 1, "PaymentCreated", json!({ "of": aggregate }))
}

/// The group's lag on the environment's topic falls to zero: its committed offsets reached the
/// end of every partition (bounded wait: the last commit follows the last ack).
async fn wait_for_no_lag(env: &Env, group: &str) {
    let BrokerEnv::Kafka(k) = &env.broker else {
        unreachable!("a Kafka environment")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let lag = k.group_lag(group).await;
        if lag == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the group's committed offsets stay {lag} short of the end"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One hostile record: what is written and what its dead letter must say.
struct Case {
    what: &'static str,
    headers: Headers,
    /// In the reason.
    reason: &'static [&'static str],
    /// A header (name, value) the dead letter keeps byte for byte.
    kept: (Vec<u8>, Vec<u8>),
    /// The event's id and aggregate, readable in the record.
    event_id: Uuid,
    aggregate_id: String,
    /// The record's value: the event's payload (so only the headers are hostile).
    body: Vec<u8>,
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    // A header named \xff\xfe: the poll used to panic on it.
    let msg = fresh();
    let mut headers = wire(&msg);
    headers.push((b"\xff\xfe".to_vec(), b"x".to_vec()));
    cases.push(Case {
        what: "a header name that is not UTF-8",
        headers,
        reason: &["header name", "%FF%FE", "not UTF-8"],
        kept: (b"\xff\xfe".to_vec(), b"x".to_vec()),
        event_id: msg.event_id,
        aggregate_id: msg.aggregate_id.clone(),
        body: msg.payload.bytes.to_vec(),
    });
    // A name and a value that are not UTF-8, the name starting like an attribute.
    let msg = fresh();
    let mut headers = wire(&msg);
    headers.push((b"ce_\xc3(id".to_vec(), b"\xff\x00\xfe".to_vec()));
    cases.push(Case {
        what: "an attribute-like name and its value, neither UTF-8",
        headers,
        reason: &["header name", "ce_%C3(id"],
        kept: (b"ce_\xc3(id".to_vec(), b"\xff\x00\xfe".to_vec()),
        event_id: msg.event_id,
        aggregate_id: msg.aggregate_id.clone(),
        body: msg.payload.bytes.to_vec(),
    });
    // An attribute whose value is not UTF-8.
    let msg = fresh();
    let mut headers = wire(&msg);
    for (name, value) in &mut headers {
        if name == b"ce_type" {
            value.extend_from_slice(b"\xff\xfe");
        }
    }
    cases.push(Case {
        what: "an attribute value that is not UTF-8",
        headers,
        reason: &["malformed", "`type`", "not UTF-8 text"],
        kept: (b"ce_type".to_vec(), b"PaymentCreated\xff\xfe".to_vec()),
        event_id: msg.event_id,
        aggregate_id: msg.aggregate_id.clone(),
        body: msg.payload.bytes.to_vec(),
    });
    // A NUL in the content type.
    let msg = fresh();
    let mut headers = wire(&msg);
    let content_type = b"application/json\0; charset=evil".to_vec();
    for (name, value) in &mut headers {
        if name == CONTENT_TYPE_HEADER.as_bytes() {
            value.clone_from(&content_type);
        }
    }
    cases.push(Case {
        what: "a NUL in the content type",
        headers,
        reason: &["malformed", "datacontenttype"],
        kept: (CONTENT_TYPE_HEADER.as_bytes().to_vec(), content_type),
        event_id: msg.event_id,
        aggregate_id: msg.aggregate_id.clone(),
        body: msg.payload.bytes.to_vec(),
    });
    cases
}

/// Each hostile record, followed by a valid event, on one partition: the valid event is applied
/// within 5 s, the hostile one is exactly one dead letter with its bytes and a reason, nothing
/// is delivered twice or nacked, and the group's offset reaches the end. A user header whose
/// value is not UTF-8 is no reason to refuse an event: it is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_hostile_record_is_one_dead_letter_and_the_next_event_is_applied() {
    let env = Env::new(Kind::Kafka).await;
    let topic = topic(&env);
    let group = env.endpoint_name();
    let (mut c, log) = env
        .ledger_on(
            &group,
            MIB,
            TestHandler::new(&env, "ledger"),
            OrderingGuard::Wait,
        )
        .await;
    // The member joined and holds the partition: a first event is applied.
    let first = fresh();
    produce(&topic, 0, &wire(&first), &first.payload.bytes).await;
    let mut t = ConsumerReport::default();
    run_until(
        &mut c,
        &mut t,
        Duration::from_secs(30),
        "a first event",
        |t| t.processed >= 1,
    )
    .await;
    // A user header with bytes that are not UTF-8: applied.
    let binary_user = fresh();
    let mut headers = wire(&binary_user);
    headers.push((b"x-trace".to_vec(), b"a\xffb".to_vec()));
    produce(&topic, 0, &headers, &binary_user.payload.bytes).await;
    run_until(
        &mut c,
        &mut t,
        APPLIED_WITHIN,
        "a binary user header",
        |t| t.processed >= 2,
    )
    .await;
    assert_eq!(env.effects_of("ledger", binary_user.event_id).await, 1);

    let cases = cases();
    for case in &cases {
        produce(&topic, 0, &case.headers, &case.body).await;
        let valid = fresh();
        produce(&topic, 0, &wire(&valid), &valid.payload.bytes).await;
        let (processed, dead) = (t.processed, t.dead_lettered);
        run_until(&mut c, &mut t, APPLIED_WITHIN, case.what, |t| {
            t.processed > processed && t.dead_lettered > dead
        })
        .await;
        assert_eq!(
            (t.processed, t.dead_lettered),
            (processed + 1, dead + 1),
            "{}: {t:?}",
            case.what
        );
        assert_eq!(
            env.effects_of("ledger", valid.event_id).await,
            1,
            "{}",
            case.what
        );
    }
    let quiet = run_for(&mut c, QUIET).await;
    assert_eq!(quiet.received, 0, "a settled delivery came back: {quiet:?}");

    let letters = stored_dead_letters(&env, "ledger").await;
    assert_eq!(
        letters.len(),
        cases.len(),
        "one dead letter each: {letters:#?}"
    );
    for (case, letter) in cases.iter().zip(&letters) {
        let what = case.what;
        assert_eq!(letter.payload, case.body, "{what}: the body");
        for part in case.reason {
            assert!(
                letter.error.contains(part),
                "{what}: reason {:?}",
                letter.error
            );
        }
        assert!(
            !letter.error.chars().any(char::is_control),
            "{what}: a printable reason {:?}",
            letter.error
        );
        assert_eq!(
            letter.header(&case.kept.0),
            Some(case.kept.1.as_slice()),
            "{what}: the header kept byte for byte: {letter:?}"
        );
        if case.kept.0 == CONTENT_TYPE_HEADER.as_bytes() {
            assert_eq!(letter.content_type.as_ref(), Some(&case.kept.1), "{what}");
        }
        // Malformed, yet its id and aggregate were readable: the dead letter is found by them.
        assert_eq!(letter.event_id, Some(case.event_id), "{what}");
        assert_eq!(
            letter.aggregate_id.as_ref(),
            Some(&case.aggregate_id),
            "{what}"
        );
        // Every other header is kept too, the id among them.
        assert_eq!(
            letter.header(b"ce_id"),
            Some(case.event_id.to_string().as_bytes()),
            "{what}"
        );
        assert_eq!(
            letter.header_names.as_ref().map(Vec::len),
            Some(case.headers.len()),
            "{what}"
        );
    }
    let log = log.lock().unwrap().clone();
    let total = 2 + 2 * cases.len();
    assert_eq!(log.delivered.len(), total, "each delivered once: {log:?}");
    assert_eq!(log.acked.len(), total, "each acknowledged: {log:?}");
    assert!(log.nacked.is_empty(), "no redelivery: {log:?}");
    wait_for_no_lag(&env, &group).await;
    env.cleanup().await;
}

/// One aggregate's versions on two partitions of a topic (a partition key that changed between
/// versions, or partitions added to the topic, put them there): versions 2 to 12 on partition
/// 0, version 1 on partition 1, written once the consumer's window of two deliveries is full of
/// versions waiting for it. With the ordering guard on, all twelve are applied in order and the
/// group's offsets reach the end. Before, the waiting versions held the window, the source
/// paused every partition for good, and version 1 was never fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn versions_on_two_partitions_are_applied_in_order_through_a_small_window() {
    let env = Env::new(Kind::Kafka).await;
    let topic = topic(&env);
    let group = env.endpoint_name();
    let source = KafkaSource::connect(
        &kafka_url(),
        KafkaConsumerConfig {
            max_unacked: 2,
            ..kafka_source_config(&topic, &group, MIB)
        },
    )
    .await
    .expect("Kafka source");
    let mut c = env.ledger_consumer(src(source), OrderingGuard::Wait);
    let aggregate = format!("pay-{}", uid());
    let versions: Vec<OutboxMessage> = (1..=12)
        .map(|v| message(&aggregate, v, "PaymentChanged", json!({"v": v})))
        .collect();
    for msg in &versions[1..] {
        produce(&topic, 0, &wire(msg), &msg.payload.bytes).await;
    }
    let mut t = ConsumerReport::default();
    run_until(
        &mut c,
        &mut t,
        Duration::from_secs(30),
        "the window full of versions waiting for version 1",
        |t| t.nacked >= 2,
    )
    .await;
    assert_eq!(
        t.processed, 0,
        "nothing can be applied before version 1: {t:?}"
    );
    produce(&topic, 1, &wire(&versions[0]), &versions[0].payload.bytes).await;
    run_until(
        &mut c,
        &mut t,
        Duration::from_secs(30),
        "every version applied",
        |t| t.processed >= versions.len(),
    )
    .await;
    assert_eq!(
        env.applied_versions("ledger").await,
        (1..=12).collect::<Vec<i64>>(),
        "in order, once each"
    );
    assert!(env.dead_letters("ledger").await.is_empty());
    wait_for_no_lag(&env, &group).await;
    env.cleanup().await;
}
