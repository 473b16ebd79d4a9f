//! The inbox runner's decisions against the real PostgreSQL, fed by an in-memory fake broker
//! (`FakeSource`): the broker side of each transport is tested against the real brokers in the
//! transport crates and end to end in the CLI's suite.

mod common;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::TestDb;
use outbox_core::consumer::{ConsumerConfig, ConsumerReport, Handler, HandlerError};
use outbox_core::consumer::{Delivery, DeliverySource, RawMessage, SourceError};
use outbox_core::{DecodeError, Fingerprint, IncomingEvent, OutboxMessage, Payload, wire};
use outbox_postgres::{PgConsumer, PgStore, PgStoreConfig};
use sqlx::{AssertSqlSafe, PgConnection};
use uuid::Uuid;

#[derive(Default)]
struct FakeBroker {
    queue: VecDeque<(RawMessage, u32)>,
    acked: usize,
    nacked: usize,
}

/// In-memory fake of a broker queue: nack puts the message back with its count + 1.
struct FakeSource(Arc<Mutex<FakeBroker>>);

struct FakeDelivery {
    raw: RawMessage,
    event: Result<IncomingEvent, DecodeError>,
    count: u32,
    broker: Arc<Mutex<FakeBroker>>,
}

fn decode(raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
    wire::decode(
        |n| raw.headers.get(&format!("ce-{n}")).cloned(),
        raw.content_type.clone(),
        raw.payload.clone(),
        BTreeMap::new(),
        1 << 20,
    )
}

impl Delivery for FakeDelivery {
    fn event(&self) -> &Result<IncomingEvent, DecodeError> {
        &self.event
    }
    fn raw(&self) -> &RawMessage {
        &self.raw
    }
    fn delivery_count(&self) -> Option<u32> {
        Some(self.count)
    }
    async fn ack(self) -> Result<(), SourceError> {
        self.broker.lock().unwrap().acked += 1;
        Ok(())
    }
    async fn nack(self, _delay: Duration) -> Result<(), SourceError> {
        let mut b = self.broker.lock().unwrap();
        b.nacked += 1;
        b.queue.push_back((self.raw, self.count + 1));
        Ok(())
    }
}

impl DeliverySource for FakeSource {
    type Delivery = FakeDelivery;
    async fn next_batch(
        &mut self,
        max: usize,
        _wait: Duration,
    ) -> Result<Vec<FakeDelivery>, SourceError> {
        let mut b = self.0.lock().unwrap();
        let mut out = Vec::new();
        while out.len() < max {
            let Some((raw, count)) = b.queue.pop_front() else {
                break;
            };
            out.push(FakeDelivery {
                event: decode(&raw),
                raw,
                count,
                broker: Arc::clone(&self.0),
            });
        }
        Ok(out)
    }
    async fn lag(&mut self) -> Result<Option<u64>, SourceError> {
        Ok(Some(self.0.lock().unwrap().queue.len() as u64))
    }
    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
        decode(raw)
    }
}

fn raw(event_id: Uuid, agg: &str, version: i64, body: &str) -> RawMessage {
    let m = OutboxMessage {
        id: 0,
        event_id,
        aggregate_type: "payment".into(),
        aggregate_id: agg.into(),
        aggregate_version: version,
        event_type: "PaymentCreated".into(),
        schema_version: 1,
        payload: Payload::json(&serde_json::from_str::<serde_json::Value>(body).unwrap()).unwrap(),
        fingerprint: Fingerprint::of(body.as_bytes()),
        headers: BTreeMap::new(),
        destination: None,
        partition_key: None,
        created_at: chrono::Utc::now(),
        attempts: 0,
    };
    let mut headers: BTreeMap<String, String> = wire::attributes(&m, "/test")
        .into_iter()
        .map(|(k, v)| (format!("ce-{k}"), v))
        .collect();
    headers.insert(
        "ce-payloadsha256".into(),
        Fingerprint::of(body.as_bytes()).to_hex(),
    );
    RawMessage {
        payload: Bytes::from(body.to_owned()),
        headers,
        content_type: Some("application/json".into()),
    }
}

/// Inserts an effect row; fails as scripted per event id (then succeeds).
struct ScriptedHandler {
    table: String,
    script: Mutex<HashMap<Uuid, VecDeque<HandlerError>>>,
}

impl Handler<PgConnection> for ScriptedHandler {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} VALUES ($1)",
            self.table
        )))
        .bind(event.event_id)
        .execute(&mut *tx)
        .await?;
        let scripted = self
            .script
            .lock()
            .unwrap()
            .get_mut(&event.event_id)
            .and_then(|q| q.pop_front());
        if let Some(e) = scripted {
            if matches!(&e, HandlerError::Transient(m) if m == "PANIC") {
                panic!("scripted panic in the handler");
            }
            return Err(e);
        }
        Ok(())
    }
}

struct Rig {
    db: TestDb,
    broker: Arc<Mutex<FakeBroker>>,
    table: String,
    consumer: PgConsumer<FakeSource, ScriptedHandler>,
}

async fn rig(config: ConsumerConfig, script: Vec<(Uuid, Vec<HandlerError>)>) -> Rig {
    let db = TestDb::new().await;
    let table = format!("\"{}\".effects", db.schema);
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (event_id uuid)"
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    let broker = Arc::new(Mutex::new(FakeBroker::default()));
    let handler = ScriptedHandler {
        table: table.clone(),
        script: Mutex::new(script.into_iter().map(|(k, v)| (k, v.into())).collect()),
    };
    let store = PgStore::new(
        db.pool.clone(),
        PgStoreConfig {
            schema: db.schema.clone(),
            ..PgStoreConfig::default()
        },
    );
    let consumer = PgConsumer::new(store, FakeSource(Arc::clone(&broker)), handler, config);
    Rig {
        db,
        broker,
        table,
        consumer,
    }
}

impl Rig {
    fn push(&self, raw: RawMessage) {
        self.broker.lock().unwrap().queue.push_back((raw, 1));
    }
    async fn drain(&mut self) -> ConsumerReport {
        let mut total = ConsumerReport::default();
        for _ in 0..100 {
            let r = self.consumer.run_batch().await.unwrap();
            if r.received == 0 {
                break;
            }
            total.processed += r.processed;
            total.duplicates += r.duplicates;
            total.conflicts += r.conflicts;
            total.dead_lettered += r.dead_lettered;
            total.nacked += r.nacked;
        }
        total
    }
    async fn effects(&self, id: Uuid) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {} WHERE event_id = $1",
            self.table
        )))
        .bind(id)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }
    async fn dead(&self) -> Vec<(Option<Uuid>, String, String)> {
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT event_id, error, state FROM \"{}\".consumer_dead_letters ORDER BY id",
            self.db.schema
        )))
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }
}

#[tokio::test]
async fn n_deliveries_one_effect_n_minus_one_duplicates() {
    let mut r = rig(ConsumerConfig::new("reporting"), vec![]).await;
    let id = Uuid::now_v7();
    for _ in 0..5 {
        r.push(raw(id, "p1", 1, r#"{"amount":1}"#));
    }
    let t = r.drain().await;
    assert_eq!((t.processed, t.duplicates), (1, 4));
    assert_eq!(r.effects(id).await, 1);
    assert_eq!(r.broker.lock().unwrap().acked, 5);
    r.db.drop().await;
}

#[tokio::test]
async fn transient_errors_are_retried_without_a_second_effect() {
    let id = Uuid::now_v7();
    let errs = vec![
        HandlerError::Transient("lock timeout".into()),
        HandlerError::Transient("again".into()),
    ];
    let mut r = rig(ConsumerConfig::new("c"), vec![(id, errs)]).await;
    r.push(raw(id, "p1", 1, "{}"));
    let t = r.drain().await;
    assert_eq!((t.processed, t.nacked, t.dead_lettered), (1, 2, 0));
    assert_eq!(
        r.effects(id).await,
        1,
        "the failed attempts' writes were rolled back"
    );
    r.db.drop().await;
}

#[tokio::test]
async fn too_many_transient_errors_dead_letter() {
    let id = Uuid::now_v7();
    let errs = (0..5)
        .map(|_| HandlerError::Transient("down".into()))
        .collect();
    let mut r = rig(
        ConsumerConfig {
            max_attempts: 3,
            ..ConsumerConfig::new("c")
        },
        vec![(id, errs)],
    )
    .await;
    r.push(raw(id, "p1", 1, "{}"));
    let t = r.drain().await;
    assert_eq!((t.processed, t.nacked, t.dead_lettered), (0, 2, 1));
    assert_eq!(r.effects(id).await, 0);
    let dead = r.dead().await;
    assert_eq!(dead.len(), 1);
    assert!(dead[0].1.contains("after 3 deliveries"), "{}", dead[0].1);
    r.db.drop().await;
}

#[tokio::test]
async fn a_panicking_handler_is_a_transient_failure_then_a_dead_letter() {
    // One delivery per transaction, and the batch path (shared transaction, redo one by one).
    for batch_size in [1, 10] {
        let bad = Uuid::now_v7();
        let good = Uuid::now_v7();
        let panics = (0..5)
            .map(|_| HandlerError::Transient("PANIC".into()))
            .collect();
        let mut r = rig(
            ConsumerConfig {
                max_attempts: 3,
                batch_size,
                ..ConsumerConfig::new("c")
            },
            vec![(bad, panics)],
        )
        .await;
        r.push(raw(bad, "p1", 1, "{}"));
        r.push(raw(good, "p2", 1, "{}"));
        // The runner survives every panic: no error, the other event is applied once.
        let t = r.drain().await;
        assert_eq!(
            (t.processed, t.dead_lettered),
            (1, 1),
            "batch size {batch_size}"
        );
        assert_eq!(r.effects(good).await, 1, "batch size {batch_size}");
        assert_eq!(
            r.effects(bad).await,
            0,
            "the panicking attempts' writes rolled back (batch size {batch_size})"
        );
        let dead = r.dead().await;
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].0, Some(bad));
        assert!(
            dead[0]
                .1
                .contains("handler panicked: scripted panic in the handler"),
            "{}",
            dead[0].1
        );
        r.db.drop().await;
    }
}

#[tokio::test]
async fn a_permanent_error_is_dead_lettered_and_requeue_applies_it_once() {
    let id = Uuid::now_v7();
    let mut r = rig(
        ConsumerConfig::new("c"),
        vec![(
            id,
            vec![HandlerError::Permanent("unknown schema version 9".into())],
        )],
    )
    .await;
    r.push(raw(id, "p1", 1, "{}"));
    let t = r.drain().await;
    assert_eq!((t.processed, t.dead_lettered), (0, 1));
    assert_eq!(r.effects(id).await, 0);
    assert_eq!(
        r.broker.lock().unwrap().acked,
        1,
        "acked after the dead letter committed"
    );
    let dead = r.dead().await;
    assert_eq!((dead[0].0, dead[0].2.as_str()), (Some(id), "dead"));
    assert!(dead[0].1.contains("unknown schema version 9"));

    // Nothing happens until an operator requeues it.
    assert_eq!(r.consumer.process_requeued().await.unwrap(), 0);
    let requeue = format!(
        "UPDATE \"{}\".consumer_dead_letters SET state = 'requeued'",
        r.db.schema
    );
    sqlx::query(AssertSqlSafe(requeue.clone()))
        .execute(&r.db.pool)
        .await
        .unwrap();
    assert_eq!(r.consumer.process_requeued().await.unwrap(), 1);
    assert_eq!(r.effects(id).await, 1);
    assert_eq!(r.dead().await[0].2, "resolved");
    // Requeued again (operator error): the inbox absorbs it, still one effect.
    sqlx::query(AssertSqlSafe(requeue))
        .execute(&r.db.pool)
        .await
        .unwrap();
    r.consumer.process_requeued().await.unwrap();
    assert_eq!(r.effects(id).await, 1);
    r.db.drop().await;
}

#[tokio::test]
async fn malformed_and_conflicting_messages_are_recorded_not_applied() {
    let mut r = rig(ConsumerConfig::new("c"), vec![]).await;
    let mut bad = raw(Uuid::now_v7(), "p1", 1, "{}");
    bad.headers.remove("ce-aggregateversion");
    r.push(bad);
    let mut tampered = raw(Uuid::now_v7(), "p2", 1, r#"{"a":1}"#);
    tampered.payload = Bytes::from_static(br#"{"a":2}"#);
    r.push(tampered);
    let id = Uuid::now_v7();
    r.push(raw(id, "p3", 1, r#"{"amount":100}"#));
    r.push(raw(id, "p3", 1, r#"{"amount":999}"#));
    let t = r.drain().await;
    assert_eq!((t.processed, t.dead_lettered, t.conflicts), (1, 2, 1));
    let dead = r.dead().await;
    assert!(
        dead[0]
            .1
            .contains("missing CloudEvents attribute `aggregateversion`"),
        "{}",
        dead[0].1
    );
    assert!(dead[1].1.contains("fingerprint mismatch"), "{}", dead[1].1);
    assert_eq!(r.effects(id).await, 1);
    assert_eq!(r.broker.lock().unwrap().acked, 4);
    r.db.drop().await;
}

#[tokio::test]
async fn batches_share_a_transaction_and_a_failure_rolls_back_only_its_own_writes() {
    let bad = Uuid::now_v7();
    let mut r = rig(
        ConsumerConfig {
            batch_size: 50,
            ..ConsumerConfig::new("c")
        },
        // Fails in the batch's shared transaction and again when the batch is redone one
        // delivery at a time; succeeds on the redelivery.
        vec![(
            bad,
            vec![
                HandlerError::Transient("x".into()),
                HandlerError::Transient("x".into()),
            ],
        )],
    )
    .await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let id = if i == 7 { bad } else { Uuid::now_v7() };
        ids.push(id);
        r.push(raw(id, &format!("p{i}"), 1, "{}"));
    }
    r.push(raw(ids[3], "p3", 1, "{}")); // a duplicate inside the same batch
    let first = r.consumer.run_batch().await.unwrap();
    assert_eq!(
        (
            first.received,
            first.processed,
            first.duplicates,
            first.nacked
        ),
        (21, 19, 1, 1)
    );
    assert_eq!(r.effects(bad).await, 0);
    let t = r.drain().await;
    assert_eq!(t.processed, 1);
    for id in ids {
        assert_eq!(r.effects(id).await, 1);
    }
    r.db.drop().await;
}
