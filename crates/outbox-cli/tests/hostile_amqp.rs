//! Hostile AMQP input never stalls the RabbitMQ consumer. Messages are written on the wire
//! frame by frame (`outbox_testkit::amqp`, not a client library, which would refuse to send
//! them), each breaking AMQP's rules or the wire format's types in one way, each followed by
//! a valid event, through the real RabbitMQ into the in-process `PgConsumer` on the real
//! PostgreSQL. Each hostile message is one dead letter with its body, its headers and a
//! reason; the valid event behind it is applied within 5 s; the consumer's connection is never
//! reset (lapin dropped it for every short string that is not UTF-8, and a deeply nested header
//! table aborted the process).
#![allow(missing_docs)]

mod common;
mod inbox_common;

use std::time::{Duration, Instant};

use common::*;
use inbox_common::*;
use outbox_core::consumer::{ConsumerReport, OrderingGuard};
use outbox_core::{OutboxMessage, wire};
use outbox_testkit::amqp::{Properties, RawPublisher, Table, Value, nested_tables};

/// The acceptance bound: the valid event behind a hostile message is applied within this.
const APPLIED_WITHIN: Duration = Duration::from_secs(5);

/// A message as the test writes it on the wire.
struct Hostile {
    routing_key: Vec<u8>,
    properties: Properties,
    body: Vec<u8>,
}

/// What one case sends and what its dead letter must say.
struct Case {
    name: String,
    /// Builds the hostile message from an event (whose id it carries).
    build: Box<dyn Fn(&OutboxMessage) -> Hostile>,
    /// Every one of these is in the dead letter's reason.
    reason: Vec<String>,
    /// The event's id is readable: the dead letter keeps it, and its `cloudEvents_id` header.
    id_kept: bool,
    /// The aggregate id is readable: the dead letter keeps it.
    aggregate_kept: bool,
}

fn case(
    name: impl Into<String>,
    reason: &[&str],
    build: impl Fn(&OutboxMessage) -> Hostile + 'static,
) -> Case {
    Case {
        name: name.into(),
        build: Box::new(build),
        reason: reason.iter().map(|r| (*r).to_owned()).collect(),
        id_kept: true,
        aggregate_kept: true,
    }
}

/// The wire attributes of `msg` as long strings (the transport's header table), in order,
/// then `extra` entries; `skip` names attributes (bare) left out.
fn headers(msg: &OutboxMessage, skip: &[&str], extra: Vec<(&[u8], Value)>) -> Table {
    let mut table = Table::default();
    for (name, value) in wire::attributes(msg, wire::DEFAULT_SOURCE) {
        if !skip.contains(&name) {
            table = table.entry(
                format!("cloudEvents_{name}").as_bytes(),
                Value::LongString(value.into_bytes()),
            );
        }
    }
    for (name, value) in extra {
        table = table.entry(name, value);
    }
    table
}

/// The properties the transport sets, with `table` as headers.
fn properties(msg: &OutboxMessage, table: &Table) -> Properties {
    Properties::default()
        .content_type(msg.payload.content_type.0.as_bytes())
        .headers(table)
        .delivery_mode(2)
        .message_id(msg.event_id.to_string().as_bytes())
        .kind(msg.event_type.as_bytes())
        .timestamp(1_700_000_000)
}

fn routing_key(msg: &OutboxMessage) -> Vec<u8> {
    format!("payment.{}", msg.aggregate_id).into_bytes()
}

/// `msg` as the transport sends it, then `edit` applied to its properties.
fn with_properties(msg: &OutboxMessage, edit: impl Fn(Properties) -> Properties) -> Hostile {
    Hostile {
        routing_key: routing_key(msg),
        properties: edit(properties(msg, &headers(msg, &[], vec![]))),
        body: msg.payload.bytes.to_vec(),
    }
}

/// `msg` as the transport sends it, without the attributes `skip` and with `extra` headers.
fn with_headers(msg: &OutboxMessage, skip: &[&str], extra: Vec<(&[u8], Value)>) -> Hostile {
    Hostile {
        routing_key: routing_key(msg),
        properties: properties(msg, &headers(msg, skip, extra)),
        body: msg.payload.bytes.to_vec(),
    }
}

/// A header of every field type RabbitMQ delivers, none of them hostile.
fn every_type() -> Vec<(&'static [u8], Value)> {
    vec![
        (b"t-bool", Value::Bool(true)),
        (b"t-i8", Value::ShortShortInt(-8)),
        (b"t-u8", Value::ShortShortUInt(8)),
        (b"t-i16", Value::ShortInt(-16)),
        (b"t-u16", Value::ShortUInt(16)),
        (b"t-i32", Value::LongInt(-32)),
        (b"t-u32", Value::LongUInt(32)),
        (b"t-i64", Value::LongLongInt(-64)),
        (b"t-f32", Value::Float(1.5)),
        (b"t-f64", Value::Double(-2.25)),
        (b"t-decimal", Value::Decimal(2, 12345)),
        (b"t-string", Value::LongString(b"text".to_vec())),
        (b"t-string-bytes", Value::LongString(vec![b'a', 0xff, 0])),
        (
            b"t-array",
            Value::Array(vec![Value::Void, Value::LongString(b"x".to_vec())]),
        ),
        (b"t-timestamp", Value::Timestamp(1_700_000_000)),
        (
            b"t-table",
            Value::Table(Table::default().entry(b"inner", Value::Bool(false))),
        ),
        (b"t-void", Value::Void),
        (b"t-bytes", Value::Bytes(vec![0, 0xfe, 0xff])),
    ]
}

/// Every attribute type that is not a string, for an attribute that must be one.
fn not_strings() -> Vec<(&'static str, Value)> {
    vec![
        ("boolean", Value::Bool(true)),
        ("short-short-int", Value::ShortShortInt(1)),
        ("short-short-uint", Value::ShortShortUInt(1)),
        ("short-int", Value::ShortInt(1)),
        ("short-uint", Value::ShortUInt(1)),
        ("long-int", Value::LongInt(1)),
        ("long-uint", Value::LongUInt(1)),
        ("long-long-int", Value::LongLongInt(1)),
        ("float", Value::Float(1.0)),
        ("double", Value::Double(1.0)),
        ("decimal", Value::Decimal(0, 1)),
        ("field array", Value::Array(vec![])),
        ("timestamp", Value::Timestamp(1)),
        ("field table", Value::Table(Table::default())),
        ("void", Value::Void),
    ]
}

/// The cases on the message's properties and delivery.
fn property_cases() -> Vec<Case> {
    vec![
        case(
            "content type not UTF-8",
            &["content type", "not UTF-8"],
            |m| with_properties(m, |p| p.content_type(b"application/\xff\xfejson")),
        ),
        case("content type with a NUL", &["datacontenttype"], |m| {
            with_properties(m, |p| p.content_type(b"application/json\0"))
        }),
        case(
            "message_id not UTF-8",
            &["`message_id`", "not UTF-8"],
            |m| with_properties(m, |p| p.message_id(b"\xc3\x28")),
        ),
        case("message_id with a NUL", &["`message_id`", "NUL"], |m| {
            with_properties(m, |p| p.message_id(b"id\0"))
        }),
        case("type not UTF-8", &["`type`", "not UTF-8"], |m| {
            with_properties(m, |p| p.kind(b"Payment\xe2\x82"))
        }),
        case(
            "correlation_id not UTF-8",
            &["`correlation_id`", "not UTF-8"],
            |m| with_properties(m, |p| p.correlation_id(b"\xed\xa0\x80")),
        ),
        case("reply_to with a NUL", &["`reply_to`", "NUL"], |m| {
            with_properties(m, |p| p.reply_to(b"\0"))
        }),
        case("app_id not UTF-8", &["`app_id`", "not UTF-8"], |m| {
            with_properties(m, |p| {
                p.app_id(
                    &[b'a'; 254]
                        .iter()
                        .chain(&[0xff])
                        .copied()
                        .collect::<Vec<_>>(),
                )
            })
        }),
        case(
            "content_encoding not UTF-8",
            &["`content_encoding`", "not UTF-8"],
            |m| with_properties(m, |p| p.content_encoding(b"\xc0\xaf")),
        ),
        case(
            "cluster_id not UTF-8",
            &["`cluster_id`", "not UTF-8"],
            |m| with_properties(m, |p| p.cluster_id(b"\xf0\x28\x8c\xbc")),
        ),
        case(
            "routing key not UTF-8",
            &["routing key", "not UTF-8"],
            |m| Hostile {
                routing_key: b"payment.\xff".to_vec(),
                ..with_properties(m, |p| p)
            },
        ),
        case("routing key with a NUL", &["routing key", "NUL"], |m| {
            Hostile {
                routing_key: b"payment.\0".to_vec(),
                ..with_properties(m, |p| p)
            }
        }),
    ]
}

/// The cases on the header table: names, nesting, duplicates, sizes.
fn header_cases() -> Vec<Case> {
    vec![
        case(
            "header name not UTF-8",
            &["header name", "not UTF-8"],
            |m| {
                with_headers(
                    m,
                    &[],
                    vec![(b"trace\xff", Value::LongString(b"x".to_vec()))],
                )
            },
        ),
        case("header name with a NUL", &["header name", "NUL"], |m| {
            with_headers(m, &[], vec![(b"a\0b", Value::Bool(true))])
        }),
        case("empty header name", &["empty name"], |m| {
            with_headers(m, &[], vec![(b"", Value::LongString(b"x".to_vec()))])
        }),
        case(
            "name not UTF-8 inside a nested table",
            &["header name", "not UTF-8"],
            |m| {
                let inner = Table::default().entry(b"\xc3\x28", Value::Bool(true));
                with_headers(
                    m,
                    &[],
                    vec![(b"meta", Value::Array(vec![Value::Table(inner)]))],
                )
            },
        ),
        case(
            "header nested 17 levels",
            &["`deep`", "deeper than 16"],
            |m| with_headers(m, &[], vec![(b"deep", nested_tables(17))]),
        ),
        case(
            "header nested 10,000 levels (aborted the process)",
            &["`abyss`", "deeper than 16"],
            |m| with_headers(m, &[], vec![(b"abyss", nested_tables(10_000))]),
        ),
        // lapin keeps one value per name, the last: the first, valid, id is not seen.
        Case {
            id_kept: false,
            ..case(
                "cloudEvents_id twice, the last not a UUID",
                &["`id`", "not-a-uuid"],
                |m| {
                    with_headers(
                        m,
                        &[],
                        vec![(b"cloudEvents_id", Value::LongString(b"not-a-uuid".to_vec()))],
                    )
                },
            )
        },
        Case {
            aggregate_kept: false,
            ..case(
                "cloudEvents_aggregateid of 100,000 bytes",
                &["`aggregateid`", "100000 characters"],
                |m| {
                    with_headers(
                        m,
                        &["aggregateid"],
                        vec![(
                            b"cloudEvents_aggregateid",
                            Value::LongString(vec![b'a'; 100_000]),
                        )],
                    )
                },
            )
        },
        Case {
            aggregate_kept: false,
            ..case(
                "cloudEvents_aggregateid as bytes that are not UTF-8",
                &["`aggregateid`", "not UTF-8"],
                |m| {
                    with_headers(
                        m,
                        &["aggregateid"],
                        vec![(b"cloudEvents_aggregateid", Value::Bytes(vec![b'p', 0xfe]))],
                    )
                },
            )
        },
    ]
}

/// The cases on attribute types: every field type as a header beside an attribute of each type
/// that is not a string.
fn attribute_type_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = not_strings()
        .into_iter()
        .map(|(type_name, value)| Case {
            aggregate_kept: false,
            ..case(
                format!("cloudEvents_aggregateid as a {type_name}"),
                &[
                    "`aggregateid`",
                    &format!("is an AMQP {type_name}, not a string"),
                ],
                move |m| {
                    let mut extra = every_type();
                    extra.push((b"cloudEvents_aggregateid", value.clone()));
                    with_headers(m, &["aggregateid"], extra)
                },
            )
        })
        .collect();
    cases.push(Case {
        id_kept: false,
        ..case("cloudEvents_id as a long-int", &["`id`", "long-int"], |m| {
            with_headers(m, &["id"], vec![(b"cloudEvents_id", Value::LongInt(5))])
        })
    });
    cases
}

/// Runs `cases` in order through one consumer: for each, the hostile message then a valid
/// event; checks the dead letter and the valid event's effect, and that the connection was
/// never reset.
async fn run_cases(cases: Vec<Case>) {
    let env = Env::new(Kind::Rabbit).await;
    let BrokerEnv::Rabbit(rabbit) = &env.broker else {
        unreachable!("a RabbitMQ environment");
    };
    let exchange = rabbit.exchange.clone();
    let (mut consumer, log) = env.ledger(MIB, OrderingGuard::Off).await;
    let mut publisher = RawPublisher::connect(&amqp_url())
        .await
        .expect("raw AMQP publisher");
    let mut totals = ConsumerReport::default();
    let mut source_errors = Vec::new();
    for (n, case) in cases.iter().enumerate() {
        let hostile_event = fresh("PaymentCreated");
        let hostile = (case.build)(&hostile_event);
        publisher
            .publish(
                exchange.as_bytes(),
                &hostile.routing_key,
                &hostile.properties,
                &hostile.body,
            )
            .await
            .unwrap_or_else(|e| panic!("{}: RabbitMQ refused the message: {e}", case.name));
        let valid = fresh("PaymentCreated");
        env.publish(&valid).await;
        let published = Instant::now();
        while env.effects_of("ledger", valid.event_id).await == 0
            || stored_dead_letters(&env, "ledger").await.len() <= n
        {
            assert!(
                published.elapsed() < APPLIED_WITHIN,
                "{}: the valid event applied and the hostile message dead-lettered within \
                 {APPLIED_WITHIN:?}; totals {totals:?}, source errors {source_errors:?}",
                case.name
            );
            match consumer.run_batch().await {
                Ok(r) => add(&mut totals, &r),
                Err(e) => source_errors.push(format!("{}: {e}", case.name)),
            }
        }
        let dead = stored_dead_letters(&env, "ledger").await;
        assert_eq!(
            dead.len(),
            n + 1,
            "{}: one dead letter: {dead:?}",
            case.name
        );
        let letter = &dead[n];
        assert!(
            letter.error.starts_with("malformed: ")
                && case.reason.iter().all(|r| letter.error.contains(r)),
            "{}: the reason names the place: {}",
            case.name,
            letter.error
        );
        assert!(
            !letter.error.contains('\0') && letter.error.len() < 1024,
            "{}: the reason is printable and bounded: {:?}",
            case.name,
            letter.error
        );
        assert_eq!(
            letter.payload, hostile.body,
            "{}: the body as sent",
            case.name
        );
        assert_eq!(letter.attempts, 1, "{}: dead-lettered at once", case.name);
        assert_eq!(
            letter.event_id,
            case.id_kept.then_some(hostile_event.event_id),
            "{}: the event id, when it was readable",
            case.name
        );
        assert_eq!(
            letter.aggregate_id,
            case.aggregate_kept
                .then(|| hostile_event.aggregate_id.clone()),
            "{}: the aggregate id, when it was readable",
            case.name
        );
        if case.id_kept {
            assert_eq!(
                letter.header("cloudEvents_id"),
                Some(hostile_event.event_id.to_string().as_bytes()),
                "{}: the headers are kept",
                case.name
            );
        }
        assert_eq!(env.effects_of("ledger", valid.event_id).await, 1);
    }
    assert!(
        source_errors.is_empty(),
        "the source lost its connection: {source_errors:?}"
    );
    assert_eq!(
        (totals.processed, totals.dead_lettered, totals.nacked),
        (cases.len(), cases.len(), 0),
        "{totals:?}"
    );
    let after = run_for(&mut consumer, QUIET).await;
    assert_eq!(after.received, 0, "a settled delivery came back: {after:?}");
    assert_eq!(env.effects("ledger").await, cases.len() as i64);
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log.acked.len(),
        2 * cases.len(),
        "each acknowledged once: {log:?}"
    );
    publisher.close().await.expect("close the raw publisher");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_properties_and_routing_keys_are_dead_lettered_and_the_next_is_applied() {
    run_cases(property_cases()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_header_tables_are_dead_lettered_and_the_next_is_applied() {
    run_cases(header_cases()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn attributes_of_every_other_type_are_dead_lettered_and_the_next_is_applied() {
    run_cases(attribute_type_cases()).await;
}

/// What RabbitMQ itself refuses at publish never reaches a consumer: the broker closes the
/// publisher's channel or connection, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_rabbitmq_refuses_never_reaches_the_consumer() {
    let env = Env::new(Kind::Rabbit).await;
    let BrokerEnv::Rabbit(rabbit) = &env.broker else {
        unreachable!("a RabbitMQ environment");
    };
    let exchange = rabbit.exchange.clone();
    let queue = env.endpoint_name();
    let mut consumer = env.ledger_consumer(env.source(&queue, MIB).await, OrderingGuard::Off);
    let msg = fresh("PaymentCreated");
    let refused: Vec<(&str, Properties, &str)> = vec![
        (
            "an unknown field type",
            properties(
                &msg,
                &headers(&msg, &[], vec![(b"z", Value::Raw(b'Z', vec![0]))]),
            ),
            "INTERNAL_ERROR",
        ),
        (
            "the specification's `U` short int",
            properties(
                &msg,
                &headers(&msg, &[], vec![(b"u", Value::Raw(b'U', vec![0, 1]))]),
            ),
            "INTERNAL_ERROR",
        ),
        (
            "an expiration that is not a number",
            properties(&msg, &headers(&msg, &[], vec![])).expiration(b"\xff"),
            "PRECONDITION_FAILED",
        ),
        (
            "another user's user_id",
            properties(&msg, &headers(&msg, &[], vec![])).user_id(b"someone-else"),
            "PRECONDITION_FAILED",
        ),
    ];
    for (what, properties, code) in refused {
        let mut publisher = RawPublisher::connect(&amqp_url())
            .await
            .expect("raw AMQP publisher");
        let err = publisher
            .publish(exchange.as_bytes(), &routing_key(&msg), &properties, b"{}")
            .await
            .expect_err(what);
        assert!(err.to_string().contains(code), "{what}: {err:#}");
    }
    let valid = fresh("PaymentCreated");
    env.publish(&valid).await;
    let mut t = ConsumerReport::default();
    run_until(
        &mut consumer,
        &mut t,
        APPLIED_WITHIN,
        "the valid event",
        |t| t.processed >= 1,
    )
    .await;
    let after = run_for(&mut consumer, QUIET).await;
    assert_eq!(
        (t.received + after.received, t.dead_lettered),
        (1, 0),
        "only the valid event arrived: {t:?} {after:?}"
    );
    env.cleanup().await;
}
