//! Inbox conflicts: listed, read with both payloads, resolved and reopened.

use outbox_core::consumer::{InboxOutcome, InboxStore, OrderingGuard};
use outbox_core::operator::prelude::*;
use outbox_core::operator::{ConflictFilter, ConflictView, OperatorErrorKind};
use outbox_core::{EventId, IncomingEvent};
use serde_json::json;
use uuid::Uuid;

use super::steps::*;
use crate::fixture::StoreFixture;
use crate::store::incoming;
use crate::support::record;

/// The first payload of event `id1`, and the conflicting one.
const BODIES: (&str, &str) = (r#"{"amount":1}"#, r#"{"amount":2}"#);

/// Conflicts: listed newest first (open only, or all; of one event); read with both payloads
/// where the store holds the first; resolved by ids (only open ones counted, the record written
/// even when all were resolved already); refused without ids, without a reason, or when no id
/// is a conflict; the conflicting payload arriving again reopens one.
pub async fn conflicts_are_listed_resolved_and_reopened<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let (id1, id2) = (Uuid::now_v7(), Uuid::now_v7());
    let (e1, e2) = two_conflicts(&f, &s, id1, id2).await;
    let (ca, cb) = they_are_listed_newest_first(&s, (id1, id2), &e1, &e2).await;
    let stranger = they_are_read_with_both_payloads(&s, &ca, &cb).await;
    let done = they_are_resolved_by_ids(&s, id1, &ca, &cb, stranger).await;
    the_conflicting_payload_again_reopens_one(&s, id1, &ca, &e2, done).await;
    f.cleanup().await;
}

/// Event `id1` (held in the outbox) seen by `c1` with its payload, then twice with another;
/// event `id2` seen by `c2` with two payloads. Returns `id1`'s two events.
async fn two_conflicts<F: StoreFixture>(
    f: &F,
    s: &F::Store,
    id1: EventId,
    id2: EventId,
) -> (IncomingEvent, IncomingEvent) {
    let (body1, body2) = BODIES;
    f.enqueue(vec![payment(id1, "a", 1, body1)]).await;
    let (e1, e2) = (incoming(id1, "a", 1, body1), incoming(id1, "a", 1, body2));
    assert_eq!(
        record(s, "c1", OrderingGuard::Off, &e1).await,
        InboxOutcome::New
    );
    for _ in 0..2 {
        assert!(matches!(
            record(s, "c1", OrderingGuard::Off, &e2).await,
            InboxOutcome::Conflict { .. }
        ));
    }
    for body in ["{}", r#"{"x":1}"#] {
        record(s, "c2", OrderingGuard::Off, &incoming(id2, "b", 1, body)).await;
    }
    (e1, e2)
}

/// Listed newest first, open ones or all, of one event, up to the limit, with the event's
/// fields, both fingerprints and the times. Returns `id1`'s conflict and `id2`'s.
async fn they_are_listed_newest_first<S: OperatorStore>(
    s: &S,
    (id1, id2): (EventId, EventId),
    e1: &IncomingEvent,
    e2: &IncomingEvent,
) -> (ConflictView, ConflictView) {
    let open = s.conflicts(ConflictFilter::OPEN, 100).await.unwrap();
    assert_eq!(open.len(), 2);
    assert!(open[0].id > open[1].id, "newest first");
    let (ca, cb) = (open[1].clone(), open[0].clone());
    assert_eq!((ca.event_id, cb.event_id), (id1, id2));
    assert_eq!(
        s.conflicts(ConflictFilter::of(id1), 100).await.unwrap(),
        vec![ca.clone()]
    );
    assert_eq!(
        s.conflicts(ConflictFilter::OPEN, 1).await.unwrap(),
        vec![cb.clone()]
    );
    assert_eq!(
        (
            ca.consumer_name.as_str(),
            ca.aggregate_id.as_str(),
            ca.aggregate_version
        ),
        ("c1", "a", 1)
    );
    assert_eq!(
        (ca.event_type.as_str(), ca.occurrences),
        ("PaymentCreated", 2)
    );
    assert_eq!(ca.stored_sha256, e1.fingerprint.to_hex());
    assert_eq!(ca.received_sha256, e2.fingerprint.to_hex());
    assert!(ca.first_seen <= ca.last_seen);
    assert_eq!((ca.resolved_at, ca.resolved_by.clone()), (None, None));
    (ca, cb)
}

/// Read with the received payload, and the first one while the producer's row is held;
/// `NotFound` for an id that is no conflict. Returns that id.
async fn they_are_read_with_both_payloads<S: OperatorStore>(
    s: &S,
    ca: &ConflictView,
    cb: &ConflictView,
) -> i64 {
    let (body1, body2) = BODIES;
    let detail = s.conflict(ca.id).await.unwrap();
    assert_eq!(&detail.conflict, ca);
    assert_eq!(detail.received_payload.text.as_deref(), Some(body2));
    assert_eq!(
        detail.first_payload.and_then(|p| p.text).as_deref(),
        Some(body1),
        "the producer's row is still held"
    );
    assert_eq!(s.conflict(cb.id).await.unwrap().first_payload, None);
    let stranger = ca.id.max(cb.id) + 1000;
    assert_eq!(
        kind(s.conflict(stranger).await),
        OperatorErrorKind::NotFound
    );
    stranger
}

/// Refused without ids, without a reason, or when no id is a conflict (nothing recorded);
/// resolved by ids, only open ones counted, audited; still listed among all, with who and why.
/// Returns the resolution's audit record.
async fn they_are_resolved_by_ids<S: OperatorStore>(
    s: &S,
    id1: EventId,
    ca: &ConflictView,
    cb: &ConflictView,
    stranger: i64,
) -> i64 {
    let me = actor();
    assert_eq!(
        kind(s.resolve_conflicts(&[], &me, "x").await),
        OperatorErrorKind::InvalidRequest
    );
    assert_eq!(
        kind(s.resolve_conflicts(&[ca.id], &me, " ").await),
        OperatorErrorKind::InvalidRequest
    );
    assert_eq!(
        kind(s.resolve_conflicts(&[stranger], &me, "x").await),
        OperatorErrorKind::NotFound
    );
    assert!(audit(s).await.is_empty(), "refusals record nothing");

    let done = s
        .resolve_conflicts(&[ca.id, stranger], &me, "producer fixed")
        .await
        .unwrap();
    assert_eq!(done.resolved, 1);
    let r = audited(s, done.audit_id).await;
    assert_eq!(
        (r.action.as_str(), r.affected, r.selection.clone()),
        (
            "resolve conflicts",
            1,
            json!({ "conflicts": [ca.id, stranger] })
        )
    );
    assert_eq!(
        s.conflicts(ConflictFilter::OPEN, 100).await.unwrap(),
        vec![cb.clone()]
    );
    let resolved = s.conflicts(ConflictFilter::of(id1), 100).await.unwrap();
    assert_eq!(resolved.len(), 1, "still listed among all");
    assert!(resolved[0].resolved_at.is_some());
    assert_eq!(resolved[0].resolved_by.as_deref(), Some("alice"));
    assert_eq!(
        resolved[0].resolution_reason.as_deref(),
        Some("producer fixed")
    );
    assert_eq!(
        s.overview().await.unwrap().inbox_conflicts,
        1,
        "open ones only"
    );
    done.audit_id
}

/// Resolving a resolved conflict again counts nothing but is recorded; the conflicting payload
/// arriving again reopens it; the consumers show their open conflicts.
async fn the_conflicting_payload_again_reopens_one<S: OperatorStore + InboxStore>(
    s: &S,
    id1: EventId,
    ca: &ConflictView,
    e2: &IncomingEvent,
    done: i64,
) {
    let me = actor();
    let again = s.resolve_conflicts(&[ca.id], &me, "again").await.unwrap();
    assert_eq!(again.resolved, 0, "already resolved: not counted");
    assert!(again.audit_id > done, "but recorded");
    assert_eq!(last_record(s).await.affected, 0);

    assert!(matches!(
        record(s, "c1", OrderingGuard::Off, e2).await,
        InboxOutcome::Conflict { .. }
    ));
    let reopened = s.conflicts(open_of(id1), 100).await.unwrap();
    assert_eq!(
        reopened.len(),
        1,
        "the conflicting payload again reopens it"
    );
    assert_eq!((reopened[0].id, reopened[0].occurrences), (ca.id, 3));
    assert_eq!(reopened[0].resolved_at, None);
    let views = s.consumers().await.unwrap();
    for name in ["c1", "c2"] {
        let v = views
            .iter()
            .find(|c| c.name == name)
            .expect("known by its conflict");
        assert_eq!(v.conflicts, 1, "{name}");
    }
}

/// The open conflicts of `event_id`.
fn open_of(event_id: Uuid) -> ConflictFilter {
    ConflictFilter {
        open_only: true,
        ..ConflictFilter::of(event_id)
    }
}
