//! Bounded inputs at enqueue: every size limit and content rule is a clear
//! `EnqueueError::Invalid` before any SQL runs, the caller's transaction stays usable, and
//! nothing of a refused batch is written. Against the real PostgreSQL.
#![allow(missing_docs)]

mod common;

use common::{TestDb, msg};
use outbox_core::limits::MessageLimits;
use outbox_core::{ContentType, MessageError, NewMessage, Payload};
use outbox_postgres::{EnqueueError, PgOutbox};

fn limits() -> MessageLimits {
    MessageLimits {
        max_payload_bytes: 64,
        max_headers: 3,
        max_header_value_bytes: 16,
        max_headers_bytes: 40,
    }
}

fn bytes_msg(agg: &str, content_type: &str, body: &[u8]) -> NewMessage {
    NewMessage::new(
        "payment",
        agg,
        1,
        "PaymentCreated",
        Payload::bytes(content_type, body.to_vec()),
    )
}

/// Enqueues `bad` in a transaction, expects a refusal, then enqueues a good message in the
/// same transaction (proving it was not aborted) and commits. Returns the refusal.
async fn refused(db: &TestDb, outbox: &PgOutbox, bad: &NewMessage) -> MessageError {
    let mut tx = db.pool.begin().await.unwrap();
    let err = outbox
        .enqueue(&mut *tx, bad)
        .await
        .expect_err("the message must be refused");
    let good = msg(&format!("ok-{}", bad.event_id), 1);
    outbox
        .enqueue(&mut *tx, &good)
        .await
        .expect("the transaction is still usable after a refusal");
    tx.commit().await.unwrap();
    assert_eq!(
        db.count(&format!("event_id = '{}'", bad.event_id)).await,
        0,
        "nothing of the refused message is stored"
    );
    assert_eq!(
        db.count(&format!("event_id = '{}'", good.event_id)).await,
        1
    );
    match err {
        EnqueueError::Invalid(e) => e,
        other => panic!("expected EnqueueError::Invalid, got {other:?}"),
    }
}

#[tokio::test]
async fn payload_over_the_limit_is_refused() {
    let db = TestDb::new().await;
    let outbox = db.outbox.clone().with_limits(limits());
    let exact = bytes_msg("p-exact", "application/octet-stream", &[b'x'; 64]);
    outbox.enqueue(&db.pool, &exact).await.unwrap();
    let big = bytes_msg("p-big", "application/octet-stream", &[b'x'; 65]);
    let e = refused(&db, &outbox, &big).await;
    assert_eq!(e, MessageError::PayloadTooLarge { size: 65, max: 64 });
    let text = EnqueueError::Invalid(e).to_string();
    assert!(
        text.contains("65") && text.contains("64") && text.contains("max_payload_bytes"),
        "{text}"
    );
    db.drop().await;
}

#[tokio::test]
async fn default_payload_limit_is_four_mebibytes() {
    let db = TestDb::new().await;
    let max = MessageLimits::default().max_payload_bytes;
    assert_eq!(max, 4 * 1024 * 1024);
    let big = bytes_msg("p-huge", "application/octet-stream", &vec![0u8; max + 1]);
    let e = refused(&db, &db.outbox, &big).await;
    assert_eq!(e, MessageError::PayloadTooLarge { size: max + 1, max });
    db.drop().await;
}

#[tokio::test]
async fn header_count_and_sizes_are_bounded() {
    let db = TestDb::new().await;
    let outbox = db.outbox.clone().with_limits(limits());
    let four = msg("h-count", 1)
        .with_header("a", "1")
        .with_header("b", "2")
        .with_header("c", "3")
        .with_header("d", "4");
    assert_eq!(
        refused(&db, &outbox, &four).await,
        MessageError::TooManyHeaders { count: 4, max: 3 }
    );
    let long = msg("h-long", 1).with_header("tenant", "x".repeat(17));
    assert_eq!(
        refused(&db, &outbox, &long).await,
        MessageError::HeaderValueTooLong {
            name: "tenant".into(),
            len: 17,
            max: 16
        }
    );
    let total = msg("h-total", 1)
        .with_header("aaaaaa", "x".repeat(16))
        .with_header("bbbbbb", "y".repeat(16));
    assert_eq!(
        refused(&db, &outbox, &total).await,
        MessageError::HeadersTooLarge { size: 44, max: 40 }
    );
    db.drop().await;
}

#[tokio::test]
async fn header_values_with_control_characters_are_refused() {
    let db = TestDb::new().await;
    let injected = msg("h-crlf", 1).with_header("tenant", "acme\r\nX-Evil: 1");
    assert_eq!(
        refused(&db, &db.outbox, &injected).await,
        MessageError::BadHeaderValue("tenant".into())
    );
    db.drop().await;
}

#[tokio::test]
async fn content_type_is_checked() {
    let db = TestDb::new().await;
    for bad in ["application/json\r\nX-Evil: 1", "text/plain\u{7f}", "plain"] {
        let mut m = bytes_msg("ct", "application/octet-stream", b"x");
        m.payload.content_type = ContentType(bad.to_owned());
        match refused(&db, &db.outbox, &m).await {
            MessageError::BadContentType { content_type, .. } => {
                assert!(
                    !content_type.contains(['\r', '\n', '\u{7f}']),
                    "{content_type}"
                )
            }
            other => panic!("{bad:?}: expected BadContentType, got {other:?}"),
        }
    }
    db.drop().await;
}

#[tokio::test]
async fn json_content_type_requires_valid_json() {
    let db = TestDb::new().await;
    let bad = bytes_msg("j-bad", "application/json", br#"{"amount": 10"#);
    match refused(&db, &db.outbox, &bad).await {
        MessageError::PayloadNotJson {
            content_type,
            error,
        } => {
            assert_eq!(content_type, "application/json");
            assert!(error.contains("line 1"), "{error}");
        }
        other => panic!("expected PayloadNotJson, got {other:?}"),
    }
    let vendor = bytes_msg("j-vendor", "application/vnd.acme+json", b"not json");
    assert!(matches!(
        refused(&db, &db.outbox, &vendor).await,
        MessageError::PayloadNotJson { .. }
    ));
    // The same bytes under a non-JSON type are the producer's business.
    let opaque = bytes_msg("j-opaque", "application/octet-stream", b"not json");
    db.outbox.enqueue(&db.pool, &opaque).await.unwrap();
    db.drop().await;
}

#[tokio::test]
async fn a_batch_with_one_refused_message_writes_nothing() {
    let db = TestDb::new().await;
    let outbox = db.outbox.clone().with_limits(limits());
    let batch = vec![
        msg("b-1", 1),
        bytes_msg("b-2", "application/octet-stream", &[0u8; 65]),
        msg("b-3", 1),
    ];
    let err = outbox
        .enqueue_batch(&db.pool, &batch)
        .await
        .expect_err("one message is over the limit");
    assert!(
        matches!(
            err,
            EnqueueError::Invalid(MessageError::PayloadTooLarge { size: 65, max: 64 })
        ),
        "{err}"
    );
    assert_eq!(db.count("true").await, 0);
    db.drop().await;
}
