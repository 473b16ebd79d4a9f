//! Hostile input never stalls a consumer: through the real brokers into the in-process
//! `PgConsumer` on the real PostgreSQL, a message the database cannot record is dead-lettered
//! with its raw bytes and reason, and the valid message behind it is applied.
#![allow(missing_docs)]

mod common;
mod inbox_common;

use common::*;
use inbox_common::*;
use outbox_core::consumer::{ConsumerReport, OrderingGuard};
use outbox_core::{OutboxMessage, Payload};

on_both_brokers!(
    a_nul_in_the_content_type_is_dead_lettered_and_the_next_is_applied,
    an_aggregate_id_over_the_key_limit_is_dead_lettered_and_the_next_is_applied,
    a_key_the_database_refuses_after_decoding_is_dead_lettered_and_the_next_is_applied,
);

/// Runs `consumer` until one delivery was dead-lettered and one applied, then checks that the
/// valid message has its one effect, that nothing comes back, and returns the one dead letter.
async fn dead_letter_then_apply(
    env: &Env,
    consumer: &mut outbox_postgres::PgConsumer<Src, TestHandler>,
    valid: &OutboxMessage,
) -> StoredDeadLetter {
    let mut t = ConsumerReport::default();
    run_until(
        consumer,
        &mut t,
        T,
        "the hostile message dead-lettered, the valid one applied",
        |t| t.dead_lettered >= 1 && t.processed >= 1,
    )
    .await;
    assert_eq!((t.processed, t.dead_lettered), (1, 1), "{t:?}");
    let after = run_for(consumer, QUIET).await;
    assert_eq!(after.received, 0, "a settled delivery came back: {after:?}");
    assert_eq!(env.effects_of("ledger", valid.event_id).await, 1);
    assert_eq!(env.effects("ledger").await, 1, "only the valid message");
    let mut dead = stored_dead_letters(env, "ledger").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    dead.pop().expect("one dead letter")
}

/// A message whose content type holds a NUL byte decodes as malformed; PostgreSQL refuses NUL
/// in text, so the dead letter keeps it as bytes. Before, the refused dead-letter insert was a
/// database error, redelivered for ever, and nothing behind it was processed.
async fn a_nul_in_the_content_type_is_dead_lettered_and_the_next_is_applied(kind: Kind) {
    let env = Env::new(kind).await;
    let (mut c, log) = env.ledger(MIB, OrderingGuard::Off).await;
    let content_type = "application/json\0; charset=evil";
    let mut poison = fresh("PaymentCreated");
    poison.payload = Payload::bytes(content_type, poison.payload.bytes.clone());
    env.publish_raw(&poison, poison.payload.bytes.to_vec(), |_| {})
        .await;
    let valid = fresh("PaymentCreated");
    env.publish(&valid).await;

    let dead = dead_letter_then_apply(&env, &mut c, &valid).await;
    // Malformed, yet its identity was readable: an operator finds it by the producer's id.
    assert_eq!(dead.event_id, Some(poison.event_id));
    assert_eq!(
        (dead.aggregate_type.as_deref(), dead.aggregate_id.as_deref()),
        (Some("payment"), Some(poison.aggregate_id.as_str()))
    );
    assert_eq!(dead.aggregate_version, Some(1));
    assert!(
        dead.error.starts_with("malformed") && dead.error.contains("datacontenttype"),
        "{}",
        dead.error
    );
    assert!(!dead.error.contains('\0'), "the reason is printable");
    assert_eq!(dead.content_type.as_deref(), Some(content_type.as_bytes()));
    assert_eq!(dead.payload, poison.payload.bytes.to_vec());
    let id_header = match kind {
        Kind::Nats => "ce-id",
        Kind::Rabbit => "cloudEvents_id",
        Kind::Kafka => "ce_id",
    };
    assert_eq!(
        dead.header(id_header),
        Some(poison.event_id.to_string().as_bytes()),
        "every header is kept: {dead:?}"
    );
    let metadata = dead.metadata.to_string();
    match kind {
        Kind::Nats => assert!(metadata.contains("stream_sequence"), "{metadata}"),
        Kind::Rabbit => assert!(metadata.contains("routing_key"), "{metadata}"),
        Kind::Kafka => assert!(metadata.contains("partition"), "{metadata}"),
    }
    let log = log.lock().unwrap().clone();
    assert_eq!(log.acked.len(), 2, "both acknowledged once: {log:?}");
    assert!(log.nacked.is_empty(), "no redelivery: {log:?}");
    env.cleanup().await;
}

/// Random letters and digits: text PostgreSQL cannot compress below the index row limit.
fn incompressible(len: usize) -> String {
    std::iter::repeat_with(fastrand::alphanumeric)
        .take(len)
        .collect()
}

/// `len` random four-byte characters (CJK extension B): as incompressible, four bytes each.
fn incompressible_wide(len: usize) -> String {
    std::iter::repeat_with(|| char::from_u32(fastrand::u32(0x2_0000..0x2_A6D0)).expect("a char"))
        .take(len)
        .collect()
}

/// An aggregate id of 4,000 characters, longer than a btree key can hold (about 2.7 KB), in
/// front of a valid message, with the ordering guard on (its key is the aggregate). Decode
/// bounds every attribute, so it is dead-lettered as malformed. Before, it was decoded, the
/// guard's insert failed, and the delivery came back for ever.
async fn an_aggregate_id_over_the_key_limit_is_dead_lettered_and_the_next_is_applied(kind: Kind) {
    let env = Env::new(kind).await;
    let (mut c, _) = env.ledger(MIB, OrderingGuard::Wait).await;
    let poison = fresh("PaymentCreated");
    let long = incompressible(4000);
    env.publish_raw(&poison, poison.payload.bytes.to_vec(), |a| {
        a.insert("aggregateid".into(), long.clone());
    })
    .await;
    let valid = fresh("PaymentCreated");
    env.publish(&valid).await;

    let dead = dead_letter_then_apply(&env, &mut c, &valid).await;
    assert!(
        dead.error.starts_with("malformed") && dead.error.contains("aggregateid"),
        "{}",
        dead.error
    );
    assert!(
        dead.error.len() < 1024,
        "the reason is bounded: {}",
        dead.error
    );
    let header = match kind {
        Kind::Nats => "ce-aggregateid",
        Kind::Rabbit => "cloudEvents_aggregateid",
        Kind::Kafka => "ce_aggregateid",
    };
    assert_eq!(dead.header(header), Some(long.as_bytes()), "kept whole");
    // The attributes that were readable identify it; the one over its bound is left out.
    assert_eq!(dead.event_id, Some(poison.event_id));
    assert_eq!(dead.aggregate_id, None);
    assert_eq!(dead.aggregate_type.as_deref(), Some("payment"));
    env.cleanup().await;
}

/// The engine's own rule, behind decode: an event that decodes (every attribute within its
/// bound) but whose ordering-guard key PostgreSQL refuses (a consumer name, aggregate type and
/// aggregate id of 255 random four-byte characters each: 3 KB, over the btree limit) is dead-lettered
/// as refused, at once, with its event id; the valid message behind it is applied.
async fn a_key_the_database_refuses_after_decoding_is_dead_lettered_and_the_next_is_applied(
    kind: Kind,
) {
    let env = Env::new(kind).await;
    let src = env.source(&env.endpoint_name(), MIB).await;
    let consumer = incompressible_wide(255);
    let mut c = env.consumer(
        &consumer,
        src,
        TestHandler::new(&env, "ledger"),
        OrderingGuard::Wait,
    );
    let poison = fresh("PaymentCreated");
    let (aggregate_type, aggregate_id) = (incompressible_wide(255), incompressible_wide(255));
    let valid = fresh("PaymentCreated");
    env.publish_raw(&poison, poison.payload.bytes.to_vec(), |a| {
        a.insert("aggregatetype".into(), aggregate_type.clone());
        a.insert("aggregateid".into(), aggregate_id.clone());
    })
    .await;
    env.publish(&valid).await;

    let mut t = ConsumerReport::default();
    run_until(
        &mut c,
        &mut t,
        T,
        "the refused event dead-lettered, the valid one applied",
        |t| t.dead_lettered >= 1 && t.processed >= 1,
    )
    .await;
    assert_eq!((t.processed, t.dead_lettered, t.nacked), (1, 1, 0), "{t:?}");
    assert_eq!(env.effects_of("ledger", valid.event_id).await, 1);
    assert_eq!(env.effects_of("ledger", poison.event_id).await, 0);
    let dead = stored_dead_letters(&env, &consumer).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].event_id, Some(poison.event_id));
    assert_eq!(dead[0].attempts, 1, "dead-lettered at the first delivery");
    assert!(
        dead[0].error.starts_with("refused by the database"),
        "{}",
        dead[0].error
    );
    let after = run_for(&mut c, QUIET).await;
    assert_eq!(after.received, 0, "{after:?}");
    env.cleanup().await;
}

// ------------------------------------------------------------------------------------------
// The property: generated hostile messages in front of valid ones, through the real brokers
// ------------------------------------------------------------------------------------------

mod property {
    use std::sync::Arc;

    use lapin::BasicProperties;
    use lapin::types::{AMQPValue, FieldTable, LongString};
    use outbox_core::consumer::{ConsumerReport, Handler, HandlerError, OrderingGuard};
    use outbox_core::{IncomingEvent, OutboxMessage, Payload, wire};
    use outbox_nats::async_nats;
    use outbox_postgres::{PgConsumer, PgStore};
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    use sqlx::{AssertSqlSafe, PgConnection};

    use super::incompressible_wide;
    use crate::common::*;
    use crate::inbox_common::*;

    /// Cases per broker when `OUTBOX_PROPTEST_CASES` is not set: keeps the test within about a
    /// minute on a CI machine of two cores.
    const DEFAULT_CASES: u32 = 64;
    /// The source's body limit: a larger body is malformed (`TooLarge`).
    const MAX_BODY: usize = 64 * 1024;

    /// Required attributes: missing or empty, the message is malformed.
    const REQUIRED: [&str; 7] = [
        wire::attr::SPECVERSION,
        wire::attr::ID,
        wire::attr::TYPE,
        wire::attr::AGGREGATE_TYPE,
        wire::attr::AGGREGATE_ID,
        wire::attr::AGGREGATE_VERSION,
        wire::attr::SCHEMA_VERSION,
    ];
    /// Optional attributes: empty, they count as absent.
    const OPTIONAL: [&str; 3] = [
        wire::attr::SOURCE,
        wire::attr::PARTITION_KEY,
        wire::attr::SUBJECT,
    ];
    /// Attributes read as text (bounded, no control characters).
    const TEXT: [&str; 8] = [
        wire::attr::ID,
        wire::attr::TYPE,
        wire::attr::TIME,
        wire::attr::SOURCE,
        wire::attr::SUBJECT,
        wire::attr::AGGREGATE_TYPE,
        wire::attr::AGGREGATE_ID,
        wire::attr::PARTITION_KEY,
    ];
    /// Attributes whose value, sent twice and joined (NATS), no longer parses.
    const PARSED: [&str; 5] = [
        wire::attr::SPECVERSION,
        wire::attr::ID,
        wire::attr::TIME,
        wire::attr::AGGREGATE_VERSION,
        wire::attr::SCHEMA_VERSION,
    ];

    /// How one generated message departs from a valid event.
    #[derive(Debug, Clone)]
    enum Hostile {
        /// None: a valid event.
        Valid,
        /// No headers at all, just a body.
        Bare,
        /// A required attribute left out.
        Missing(&'static str),
        /// A required attribute sent empty.
        Empty(&'static str),
        /// An optional attribute sent empty (still valid).
        EmptyOptional(&'static str),
        /// Another spec version.
        SpecVersion(&'static str),
        /// A control character (NUL, ESC, CR, LF ...) inside an attribute.
        Control(&'static str, char),
        /// An attribute over the limit: `len` characters, four-byte ones when `wide`.
        TooLong(&'static str, usize, bool),
        /// The longest aggregate type and id a producer may write, in four-byte characters
        /// (valid: the ordering guard's key still fits its index).
        Widest,
        /// An attribute whose bytes are not UTF-8 (percent-encoded on NATS).
        NotUtf8(&'static str, Vec<u8>),
        /// An attribute header sent twice (NATS, Kafka); on RabbitMQ, whose header table holds
        /// one value per name, again under another spelling, which is a user header (valid).
        Duplicate(&'static str),
        /// A control character inside the content type.
        ContentType(char),
        /// A user header holding control characters (valid: not an attribute).
        UserHeader(char),
        /// A body over the source's limit, by this many bytes.
        Oversize(usize),
    }

    impl Hostile {
        fn is_valid(&self, kind: Kind) -> bool {
            match self {
                Self::Valid | Self::EmptyOptional(_) | Self::Widest | Self::UserHeader(_) => true,
                Self::Duplicate(_) => kind == Kind::Rabbit,
                _ => false,
            }
        }
    }

    /// One generated message: its departure from a valid event and the tail of its body.
    #[derive(Debug, Clone)]
    struct Probe {
        hostile: Hostile,
        tail: Vec<u8>,
    }

    fn control() -> impl Strategy<Value = char> {
        prop::sample::select(vec![
            '\0', '\u{1}', '\u{7}', '\t', '\r', '\n', '\u{1b}', '\u{7f}', '\u{85}',
        ])
    }

    /// Control characters a NATS header can carry unencoded (the protocol ends a header
    /// line at CR or LF).
    fn control_in_header() -> impl Strategy<Value = char> {
        prop::sample::select(vec![
            '\0', '\u{1}', '\u{7}', '\t', '\u{1b}', '\u{7f}', '\u{85}',
        ])
    }

    fn not_utf8() -> impl Strategy<Value = Vec<u8>> {
        (
            "[a-z0-9-]{0,8}",
            prop::sample::select(vec![
                vec![0xff],
                vec![0xc3, 0x28],
                vec![0xe2, 0x82],
                vec![0xed, 0xa0, 0x80],
                vec![0xf0, 0x28, 0x8c, 0xbc],
                vec![0xc0, 0xaf],
            ]),
        )
            .prop_map(|(prefix, bad)| [prefix.into_bytes(), bad].concat())
    }

    fn hostile() -> impl Strategy<Value = Hostile> {
        let name = |names: &'static [&'static str]| prop::sample::select(names.to_vec());
        prop_oneof![
            4 => Just(Hostile::Valid),
            1 => Just(Hostile::Bare),
            1 => name(&REQUIRED).prop_map(Hostile::Missing),
            1 => name(&REQUIRED).prop_map(Hostile::Empty),
            1 => name(&OPTIONAL).prop_map(Hostile::EmptyOptional),
            1 => prop::sample::select(vec!["0.3", "1.0 ", " 1.0", "1", "2.0", "1.0.0", "１.０"])
                .prop_map(Hostile::SpecVersion),
            2 => (name(&TEXT), control()).prop_map(|(a, c)| Hostile::Control(a, c)),
            2 => (
                name(&TEXT),
                prop_oneof![256usize..300, 2_700usize..4_500],
                any::<bool>()
            )
                .prop_map(|(a, len, wide)| Hostile::TooLong(a, len, wide)),
            1 => Just(Hostile::Widest),
            2 => (name(&TEXT), not_utf8()).prop_map(|(a, b)| Hostile::NotUtf8(a, b)),
            1 => name(&PARSED).prop_map(Hostile::Duplicate),
            1 => control_in_header().prop_map(Hostile::ContentType),
            1 => control_in_header().prop_map(Hostile::UserHeader),
            1 => (1usize..4096).prop_map(Hostile::Oversize),
        ]
    }

    fn probes() -> impl Strategy<Value = Vec<Probe>> {
        let probe = (hostile(), prop::collection::vec(any::<u8>(), 0..48))
            .prop_map(|(hostile, tail)| Probe { hostile, tail });
        // A valid event always comes last: nothing may hold it back.
        prop::collection::vec(probe, 1..=6).prop_map(|mut probes| {
            probes.push(Probe {
                hostile: Hostile::Valid,
                tail: Vec::new(),
            });
            probes
        })
    }

    /// A header value as sent: text, or bytes that are not UTF-8.
    #[derive(Debug, Clone)]
    enum Value {
        Text(String),
        Bytes(Vec<u8>),
    }

    impl Value {
        fn bytes(&self) -> &[u8] {
            match self {
                Self::Text(t) => t.as_bytes(),
                Self::Bytes(b) => b,
            }
        }
    }

    /// A message as it goes on the wire; attribute names are bare (`id`), the publisher adds
    /// the protocol's prefix.
    #[derive(Debug)]
    struct Wire {
        base: OutboxMessage,
        attributes: Vec<(String, Value)>,
        user_headers: Vec<(String, String)>,
        content_type: Option<String>,
        body: Vec<u8>,
        valid: bool,
    }

    fn set(attributes: &mut [(String, Value)], name: &str, value: Value) {
        for (n, v) in attributes.iter_mut() {
            if n == name {
                *v = value.clone();
            }
        }
    }

    fn text_of(attributes: &[(String, Value)], name: &str) -> String {
        attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| String::from_utf8_lossy(v.bytes()).into_owned())
            .unwrap_or_default()
    }

    impl Probe {
        fn wire(&self, kind: Kind) -> Wire {
            let mut body = format!("probe-{}-", uuid::Uuid::now_v7()).into_bytes();
            body.extend_from_slice(&self.tail);
            if let Hostile::Oversize(over) = self.hostile {
                body.resize(MAX_BODY + over, b'x');
            }
            let mut base = message(
                &format!("p-{}", uid()),
                1,
                "PaymentCreated",
                serde_json::json!({}),
            );
            base.payload = Payload::bytes("application/json", body.clone());
            base.fingerprint = base.payload.fingerprint();
            let mut attributes: Vec<(String, Value)> =
                wire::attributes(&base, wire::DEFAULT_SOURCE)
                    .into_iter()
                    .map(|(n, v)| (n.to_owned(), Value::Text(v)))
                    .collect();
            let mut user_headers = vec![("traceparent".to_owned(), TRACEPARENT.to_owned())];
            let mut content_type = Some("application/json".to_owned());
            match &self.hostile {
                Hostile::Valid => {}
                Hostile::Bare => {
                    attributes.clear();
                    user_headers.clear();
                    content_type = None;
                }
                Hostile::Missing(a) => attributes.retain(|(n, _)| n != a),
                Hostile::Empty(a) | Hostile::EmptyOptional(a) => {
                    set(&mut attributes, a, Value::Text(String::new()))
                }
                Hostile::SpecVersion(v) => set(
                    &mut attributes,
                    wire::attr::SPECVERSION,
                    Value::Text((*v).into()),
                ),
                Hostile::Control(a, c) => {
                    let mut v = text_of(&attributes, a);
                    v.insert(v.len() / 2, *c);
                    set(&mut attributes, a, Value::Text(v));
                }
                Hostile::TooLong(a, len, wide) => {
                    let v = if *wide {
                        incompressible_wide(*len)
                    } else {
                        super::incompressible(*len)
                    };
                    set(&mut attributes, a, Value::Text(v));
                }
                Hostile::Widest => {
                    set(
                        &mut attributes,
                        wire::attr::AGGREGATE_TYPE,
                        Value::Text(incompressible_wide(255)),
                    );
                    set(
                        &mut attributes,
                        wire::attr::AGGREGATE_ID,
                        Value::Text(incompressible_wide(255)),
                    );
                }
                Hostile::NotUtf8(a, bytes) => set(&mut attributes, a, Value::Bytes(bytes.clone())),
                Hostile::Duplicate(a) => {
                    let v = attributes
                        .iter()
                        .find(|(n, _)| n == a)
                        .map(|(_, v)| v.clone())
                        .expect("a published attribute");
                    let name = match kind {
                        Kind::Nats | Kind::Kafka => (*a).to_owned(),
                        Kind::Rabbit => a.to_uppercase(),
                    };
                    attributes.push((name, v));
                }
                Hostile::ContentType(c) => content_type = Some(format!("application/json{c}; x=1")),
                Hostile::UserHeader(c) => {
                    user_headers.push(("x-note".to_owned(), format!("a{c}b\0c")));
                }
                Hostile::Oversize(_) => {}
            }
            Wire {
                base,
                attributes,
                user_headers,
                content_type,
                body,
                valid: self.hostile.is_valid(kind),
            }
        }
    }

    /// Percent-encoding as the NATS binding prescribes for `ce-` values (any bytes).
    fn percent_encode(value: &[u8]) -> String {
        value
            .iter()
            .map(|&b| {
                if (0x21..=0x7E).contains(&b) && b != b'"' && b != b'%' {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    /// Publishes `w` as it is, waiting for the broker's acknowledgement.
    async fn publish(env: &Env, w: &Wire) {
        match (&env.nats_wire, &env.broker) {
            (Some(t), _) => {
                let subject = t.subject_for(&w.base).expect("subject");
                let mut headers = async_nats::HeaderMap::new();
                for (name, value) in &w.attributes {
                    headers.append(format!("ce-{name}").as_str(), percent_encode(value.bytes()));
                }
                for (name, value) in &w.user_headers {
                    headers.append(name.as_str(), value.as_str());
                }
                if let Some(c) = &w.content_type {
                    headers.insert("Content-Type", c.as_str());
                }
                jetstream_publish(t, subject, headers, w.body.clone().into()).await;
            }
            (None, BrokerEnv::Rabbit(r)) => {
                let mut table = FieldTable::default();
                for (name, value) in &w.attributes {
                    table.insert(
                        format!("cloudEvents_{name}").into(),
                        AMQPValue::LongString(LongString::from(value.bytes().to_vec())),
                    );
                }
                for (name, value) in &w.user_headers {
                    table.insert(
                        name.as_str().into(),
                        AMQPValue::LongString(LongString::from(value.as_str())),
                    );
                }
                let mut props = BasicProperties::default()
                    .with_headers(table)
                    .with_delivery_mode(2);
                if let Some(c) = &w.content_type {
                    props = props.with_content_type(c.as_str().into());
                }
                amqp_publish(r, "payment.probe", &w.body, props).await;
            }
            (None, BrokerEnv::Kafka(k)) => {
                use outbox_kafka::rdkafka::message::{Header, OwnedHeaders};
                let mut headers = OwnedHeaders::new();
                for (name, value) in &w.attributes {
                    headers = headers.insert(Header {
                        key: &format!("ce_{name}"),
                        value: Some(value.bytes()),
                    });
                }
                for (name, value) in &w.user_headers {
                    headers = headers.insert(Header {
                        key: name,
                        value: Some(value.as_bytes()),
                    });
                }
                if let Some(c) = &w.content_type {
                    headers = headers.insert(Header {
                        key: "content-type",
                        value: Some(c.as_bytes()),
                    });
                }
                kafka_produce(k, b"probe", headers, &w.body).await;
            }
            _ => unreachable!("a transport of the environment's broker"),
        }
    }

    /// Records each applied event with its body as bytes (whatever they are).
    struct ProbeHandler {
        insert: Arc<str>,
    }

    impl Handler<PgConnection> for ProbeHandler {
        async fn handle(
            &self,
            tx: &mut PgConnection,
            event: &IncomingEvent,
        ) -> Result<(), HandlerError> {
            sqlx::query(AssertSqlSafe(Arc::clone(&self.insert)))
                .bind(event.event_id)
                .bind(event.payload.bytes.as_ref())
                .execute(&mut *tx)
                .await?;
            Ok(())
        }
    }

    fn check(ok: bool, message: impl FnOnce() -> String) -> Result<(), TestCaseError> {
        if ok {
            Ok(())
        } else {
            Err(TestCaseError::fail(message()))
        }
    }

    /// Publishes the probes in order to a fresh stream / queue, runs one consumer (ordering
    /// guard on) until each was applied or dead-lettered, and checks: every valid one applied
    /// exactly once, every other one dead-lettered exactly once (its body kept, a printable
    /// reason), each delivered once and acknowledged, no retries, the consumer never failed.
    async fn run_case(kind: Kind, probes: &[Probe]) -> Result<(), TestCaseError> {
        let env = Env::new(kind).await;
        env.db
            .exec("CREATE TABLE {s}.probe_effects (event_id uuid NOT NULL, payload bytea NOT NULL)")
            .await;
        let source = env.source(&env.endpoint_name(), MAX_BODY).await;
        let log = source.tap();
        let handler = ProbeHandler {
            insert: env
                .db
                .sql("INSERT INTO {s}.probe_effects (event_id, payload) VALUES ($1, $2)")
                .into(),
        };
        let mut consumer = PgConsumer::new(
            PgStore::with_schema(env.db.pool.clone(), env.db.schema.clone()),
            source,
            handler,
            fast_config("probe", OrderingGuard::Wait),
        )
        .expect("valid consumer config");
        let wires: Vec<Wire> = probes.iter().map(|p| p.wire(kind)).collect();
        for w in &wires {
            publish(&env, w).await;
        }
        let n = wires.len();
        let mut t = ConsumerReport::default();
        // A stall times out here; a consumer error fails here.
        run_until(
            &mut consumer,
            &mut t,
            T,
            "every probe applied or dead-lettered",
            |t| t.processed + t.dead_lettered >= n,
        )
        .await;
        let log = log.lock().unwrap().clone();
        let result = verify(&env, &wires, &t, &log).await;
        env.cleanup().await;
        result
    }

    async fn verify(
        env: &Env,
        wires: &[Wire],
        t: &ConsumerReport,
        log: &Log,
    ) -> Result<(), TestCaseError> {
        let valid = wires.iter().filter(|w| w.valid).count();
        check(
            (t.processed, t.dead_lettered, t.nacked, t.duplicates)
                == (valid, wires.len() - valid, 0, 0),
            || format!("{valid} valid of {}: {t:?}", wires.len()),
        )?;
        check(
            log.delivered.len() == wires.len()
                && log.acked.len() == wires.len()
                && log.nacked.is_empty(),
            || format!("each delivered once and acknowledged: {log:?}"),
        )?;
        let count = |sql: &str, body: &[u8]| {
            let sql = env.db.sql(sql);
            let body = body.to_vec();
            async move {
                sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                    .bind(body)
                    .fetch_one(&env.db.pool)
                    .await
                    .expect("count")
            }
        };
        for (i, w) in wires.iter().enumerate() {
            let applied = count(
                "SELECT count(*) FROM {s}.probe_effects WHERE payload = $1",
                &w.body,
            )
            .await;
            let dead = count(
                "SELECT count(*) FROM {s}.consumer_dead_letters WHERE payload = $1",
                &w.body,
            )
            .await;
            let expected = if w.valid { (1, 0) } else { (0, 1) };
            check((applied, dead) == expected, || {
                format!(
                    "message {i} ({}): applied {applied}, dead-lettered {dead}, expected {expected:?}",
                    if w.valid { "valid" } else { "hostile" }
                )
            })?;
        }
        let reasons: Vec<String> = sqlx::query_scalar(AssertSqlSafe(
            env.db.sql("SELECT error FROM {s}.consumer_dead_letters"),
        ))
        .fetch_all(&env.db.pool)
        .await
        .expect("reasons");
        for r in &reasons {
            check(
                !r.is_empty() && r.chars().count() <= 1025 && !r.chars().any(char::is_control),
                || format!("a printable, bounded reason: {r:?}"),
            )?;
        }
        Ok(())
    }

    /// Runs the property for `kind`: `OUTBOX_PROPTEST_CASES` cases (default
    /// [`DEFAULT_CASES`]); a failure is shrunk to a minimal sequence and printed.
    fn property(kind: Kind) {
        let cases = std::env::var("OUTBOX_PROPTEST_CASES")
            .ok()
            .map(|v| v.parse().expect("OUTBOX_PROPTEST_CASES is a number"))
            .unwrap_or(DEFAULT_CASES);
        let config = Config {
            cases,
            max_shrink_iters: 64,
            failure_persistence: None,
            ..Config::default()
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let mut runner = TestRunner::new(config);
        let started = std::time::Instant::now();
        let result = runner.run(&probes(), |probes| {
            runtime.block_on(run_case(kind, &probes))
        });
        eprintln!(
            "hostile input property on {kind:?}: {cases} cases in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        if let Err(e) = result {
            panic!("{e}");
        }
    }

    #[test]
    fn every_message_is_applied_once_or_dead_lettered_and_none_blocks_nats() {
        property(Kind::Nats);
    }

    #[test]
    fn every_message_is_applied_once_or_dead_lettered_and_none_blocks_rabbitmq() {
        property(Kind::Rabbit);
    }

    #[test]
    fn every_message_is_applied_once_or_dead_lettered_and_none_blocks_kafka() {
        property(Kind::Kafka);
    }
}
