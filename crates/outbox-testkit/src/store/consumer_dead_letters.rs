//! Consumer dead letters: kept, requeued and settled; kept byte for byte.

use outbox_core::EventIdentity;
use outbox_core::consumer::{ConsumerDeadLetterState, InboxStore, RawMessage};
use uuid::Uuid;

use super::incoming;
use crate::fakes::{event_message, wire_message};
use crate::fixture::StoreFixture;
use crate::support::{take_requeued, write_consumer_dead_letters};

/// Consumer dead letters: written with the transaction, counted until resolved, handed back by
/// a requeue least recently updated first, settled only while requeued.
pub async fn consumer_dead_letters_are_kept_requeued_and_settled<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let raw = |n: i64| wire_message(&event_message(Uuid::now_v7(), "a", n, "{}"));
    let (r1, r2) = (raw(1), raw(2));
    let none = EventIdentity::default();
    let write = async || {
        let letters = [(&r1, &none), (&r2, &none)];
        write_consumer_dead_letters(&store, "c", &letters, "malformed: test", 3)
            .await
            .unwrap()
    };
    drop(write().await);
    assert_eq!(
        store.consumer_dead_letter_count("c").await.unwrap(),
        0,
        "dropping the transaction rolled it back"
    );
    store.commit(write().await).await.unwrap();
    assert_eq!(store.consumer_dead_letter_count("c").await.unwrap(), 2);
    assert_eq!(store.consumer_dead_letter_count("other").await.unwrap(), 0);
    let letters = f.consumer_dead_letters("c").await;
    assert_eq!(letters.len(), 2);
    assert!(letters.iter().all(|d| d.state == "dead" && d.attempts == 3));

    // Nothing is requeued yet.
    assert!(take_requeued(&store, "c", 10).await.is_empty());
    assert_eq!(f.requeue_consumer_dead_letters("c").await, 2);

    // The first one taken is tried and is still waiting: it goes to the back.
    let mut tx = store.begin().await.unwrap();
    let first = store
        .consumer_dead_letter_take_requeued(&mut tx, "c", 1)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].raw, r1, "the raw message is kept as received");
    store
        .consumer_dead_letter_settle(
            &mut tx,
            first[0].id,
            ConsumerDeadLetterState::Requeued,
            None,
        )
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    let next = store
        .consumer_dead_letter_take_requeued(&mut tx, "c", 1)
        .await
        .unwrap();
    assert_eq!(next[0].raw, r2, "least recently updated first");
    store
        .consumer_dead_letter_settle(&mut tx, next[0].id, ConsumerDeadLetterState::Resolved, None)
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    // A settle of a letter that is no longer requeued changes nothing.
    let mut tx = store.begin().await.unwrap();
    store
        .consumer_dead_letter_settle(
            &mut tx,
            next[0].id,
            ConsumerDeadLetterState::Dead,
            Some("late"),
        )
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    assert_eq!(store.consumer_dead_letter_count("c").await.unwrap(), 1);
    let letters = f.consumer_dead_letters("c").await;
    let resolved = letters.iter().find(|d| d.id == next[0].id).unwrap();
    assert_eq!(
        (resolved.state.as_str(), resolved.attempts),
        ("resolved", 4)
    );
    f.cleanup().await;
}

/// A consumer dead letter keeps the message byte for byte, whatever it holds (NUL and control
/// characters in the content type, a header name and a value, a header value that is not
/// UTF-8, header names that are not UTF-8 (kept under [`RawMessage::header_key`]), a body that
/// is not text, broker metadata), with the decoded event's fields when given. Metadata holding NUL is accepted too (a store may show it otherwise: it is for the
/// operator, never decoded).
pub async fn consumer_dead_letters_keep_the_message_byte_for_byte<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let id = Uuid::now_v7();
    let mut raw = wire_message(&event_message(id, "a", 1, "{}"));
    raw.content_type = Some("text/plain\0\u{7}; x=\u{1b}".into());
    raw.headers
        .insert("x-\0name".into(), "\0\r\n\u{1b}[0m".into());
    raw.binary_headers.insert(
        "x-binary".into(),
        bytes::Bytes::from_static(&[0, 0xff, 0xc3]),
    );
    for (name, value) in [(&b"\xff\xfe"[..], &b"text"[..]), (b"x-%\xc3", b"\xff")] {
        raw.binary_headers.insert(
            RawMessage::header_key(name).into_owned(),
            bytes::Bytes::copy_from_slice(value),
        );
    }
    raw.payload = bytes::Bytes::from_static(&[0, 0xff, 0xfe, b'\n']);
    raw.metadata.insert("subject".into(), "payments.a".into());
    let mut nul_metadata = raw.clone();
    nul_metadata
        .metadata
        .insert("routing_key".into(), "a\0b".into());
    let identity = EventIdentity::of(&incoming(id, "a", 1, "{}"));
    let letters = [
        (&raw, &identity),
        (&nul_metadata, &EventIdentity::default()),
    ];
    let tx = write_consumer_dead_letters(&store, "c", &letters, "malformed: test", 1)
        .await
        .expect("a dead letter is never refused for what the message holds");
    store.commit(tx).await.unwrap();
    let letters = f.consumer_dead_letters("c").await;
    assert_eq!(letters.len(), 2);
    assert_eq!(letters[0].event_id, Some(id));
    assert_eq!(letters[0].aggregate_id.as_deref(), Some("a"));
    assert_eq!(letters[1].event_id, None);

    assert_eq!(f.requeue_consumer_dead_letters("c").await, 2);
    let taken = take_requeued(&store, "c", 10).await;
    assert_eq!(taken.len(), 2);
    assert_eq!(taken[0].raw, raw, "kept byte for byte");
    let mut second = taken[1].raw.clone();
    assert!(second.metadata.remove("routing_key").is_some());
    assert_eq!(second, raw, "kept byte for byte, metadata aside");
    f.cleanup().await;
}
