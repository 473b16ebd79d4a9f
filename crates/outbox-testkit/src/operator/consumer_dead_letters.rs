//! Consumer dead letters: listed while open, grouped, read whole, requeued and discarded.

use outbox_core::EventId;
use outbox_core::consumer::InboxStore;
use outbox_core::operator::prelude::*;
use outbox_core::operator::{
    ConsumerDeadLetterView, ConsumerSelection, MINUTES, OperatorErrorKind,
};
use serde_json::json;
use uuid::Uuid;

use super::steps::*;
use crate::fixture::StoreFixture;
use crate::support::take_requeued;

/// Consumer dead letters: listed while open (dead or requeued), by consumer, ids and reason
/// group; grouped by (consumer, reason); read whole in any state; a requeue and a discard take
/// only `dead` ones (a discard needs a reason), each audited; the consumer takes the requeued
/// ones back.
pub async fn consumer_dead_letters_are_listed_grouped_requeued_and_discarded<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let e0 = Uuid::now_v7();
    let body0 = r#"{"amount":17}"#;
    four_dead_letters(&s, e0, body0).await;
    let listed = they_are_listed_while_open(&s, e0).await;
    let ids: Vec<i64> = listed.iter().map(|l| l.dead_letter.id).collect();
    they_are_grouped_by_consumer_and_reason(&s).await;
    they_are_read_whole(&s, &listed, e0, body0).await;
    a_requeue_hands_dead_ones_back_to_their_consumer(&s, &ids).await;
    a_discard_resolves_dead_ones(&s, &ids, listed[3].dead_letter.id).await;
    f.cleanup().await;
}

/// Selects the consumer dead letter `id` alone.
fn only(id: i64) -> ConsumerSelection {
    ConsumerSelection {
        ids: Some(vec![id]),
        ..ConsumerSelection::default()
    }
}

/// Selects the consumer dead letters of `mail`.
fn mail_only() -> ConsumerSelection {
    ConsumerSelection {
        consumer: Some("mail".into()),
        ..ConsumerSelection::default()
    }
}

/// Three dead letters of `ledger` (the first of event `e0` with `body0`, the second without an
/// identity), then one of `mail`.
async fn four_dead_letters<S: OperatorStore + InboxStore>(s: &S, e0: EventId, body0: &str) {
    // (consumer, event, aggregate, body, identified, error), oldest first.
    for (consumer, event_id, agg, body, identified, error) in [
        ("ledger", e0, "l0", body0, true, "decode failed at byte 17"),
        (
            "ledger",
            Uuid::now_v7(),
            "l1",
            "{}",
            false,
            "decode failed at byte 42",
        ),
        (
            "ledger",
            Uuid::now_v7(),
            "l2",
            "{}",
            true,
            "handler panicked: boom",
        ),
        ("mail", Uuid::now_v7(), "m0", "{}", true, "template missing"),
    ] {
        consumer_dead(s, consumer, event_id, agg, body, identified, error).await;
    }
}

/// Listed oldest first while open, each `dead` with its reason; by consumer, by reason group,
/// up to the limit.
async fn they_are_listed_while_open<S: OperatorStore>(
    s: &S,
    e0: EventId,
) -> Vec<ConsumerDeadLetterView> {
    let all = ConsumerSelection::default();
    let listed = s.consumer_dead_letters(&all, 100).await.unwrap();
    assert_eq!(listed.len(), 4);
    assert!(
        listed
            .windows(2)
            .all(|w| w[0].dead_letter.id < w[1].dead_letter.id),
        "oldest first"
    );
    assert!(listed.iter().all(|l| l.dead_letter.state == "dead"));
    let ids: Vec<i64> = listed.iter().map(|l| l.dead_letter.id).collect();
    let first = &listed[0];
    assert_eq!(first.dead_letter.consumer_name, "ledger");
    assert_eq!(first.dead_letter.event_id, Some(e0));
    assert_eq!(first.reason, "decode failed at byte #");
    assert_eq!(listed[1].dead_letter.event_id, None, "no identity given");

    let ledger = ConsumerSelection {
        consumer: Some("ledger".into()),
        ..all.clone()
    };
    assert_eq!(
        s.consumer_dead_letters(&ledger, 100).await.unwrap().len(),
        3
    );
    let decode = ConsumerSelection {
        reason_group: Some("decode failed at byte #".into()),
        ..all.clone()
    };
    assert_eq!(
        s.consumer_dead_letters(&decode, 100)
            .await
            .unwrap()
            .iter()
            .map(|l| l.dead_letter.id)
            .collect::<Vec<_>>(),
        ids[..2].to_vec()
    );
    assert_eq!(s.consumer_dead_letters(&all, 1).await.unwrap().len(), 1);
    listed
}

/// Grouped by (consumer, reason), largest first, with the oldest one's error; of one consumer.
async fn they_are_grouped_by_consumer_and_reason<S: OperatorStore>(s: &S) {
    let all = ConsumerSelection::default();
    let groups = s.consumer_dead_letter_groups(&all).await.unwrap();
    assert!(groups.complete);
    assert_eq!(groups.groups.len(), 3, "{groups:?}");
    let g = &groups.groups[0];
    assert_eq!(
        (g.consumer_name.as_str(), g.reason.as_str(), g.count),
        ("ledger", "decode failed at byte #", 2)
    );
    assert_eq!(g.example_error, "decode failed at byte 17");
    assert!(g.first_at <= g.last_at);
    assert_eq!(
        s.consumer_dead_letter_groups(&mail_only())
            .await
            .unwrap()
            .groups
            .len(),
        1
    );
}

/// Read whole: payload, headers, content type; `NotFound` for an unknown id.
async fn they_are_read_whole<S: OperatorStore>(
    s: &S,
    listed: &[ConsumerDeadLetterView],
    e0: EventId,
    body0: &str,
) {
    let ids: Vec<i64> = listed.iter().map(|l| l.dead_letter.id).collect();
    let detail = s.consumer_dead_letter(ids[0]).await.unwrap();
    assert_eq!(detail.dead_letter, listed[0]);
    assert_eq!(detail.payload.text.as_deref(), Some(body0));
    assert_eq!(detail.headers["ce-id"], json!(e0.to_string()));
    assert_eq!(detail.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        kind(s.consumer_dead_letter(ids[3] + 1000).await),
        OperatorErrorKind::NotFound
    );
}

/// A requeue takes only `dead` letters, audited; a requeued letter is still open, and its
/// consumer takes it back.
async fn a_requeue_hands_dead_ones_back_to_their_consumer<S: OperatorStore + InboxStore>(
    s: &S,
    ids: &[i64],
) {
    let all = ConsumerSelection::default();
    let me = actor();
    assert_eq!(
        s.requeue_consumer_dead_letters(&only(ids[0]), &me, "decoder fixed")
            .await
            .unwrap(),
        1
    );
    let r = last_record(s).await;
    assert_eq!(
        (r.action.as_str(), r.affected, r.selection.clone()),
        (
            "requeue consumer dead letters",
            1,
            json!({ "ids": [ids[0]] })
        )
    );
    let after = s.consumer_dead_letters(&all, 100).await.unwrap();
    assert_eq!(after.len(), 4, "a requeued letter is still open");
    assert_eq!(after[0].dead_letter.state, "requeued");
    assert_eq!(
        s.requeue_consumer_dead_letters(&only(ids[0]), &me, "again")
            .await
            .unwrap(),
        0,
        "only dead letters are requeued"
    );
    let taken = take_requeued(s, "ledger", 10).await;
    assert_eq!(taken.iter().map(|t| t.id).collect::<Vec<_>>(), vec![ids[0]]);
}

/// A discard needs a reason and takes only `dead` letters, audited; a resolved letter is not
/// listed but still readable whole; the consumers show what is open.
async fn a_discard_resolves_dead_ones<S: OperatorStore>(s: &S, ids: &[i64], mail: i64) {
    let all = ConsumerSelection::default();
    let mail_only = mail_only();
    let me = actor();
    let records = audit(s).await.len();
    assert_eq!(
        kind(s.discard_consumer_dead_letters(&mail_only, &me, " ").await),
        OperatorErrorKind::InvalidRequest
    );
    assert_eq!(
        audit(s).await.len(),
        records,
        "a refused action records nothing"
    );
    assert_eq!(
        s.discard_consumer_dead_letters(&mail_only, &me, "template fixed by hand")
            .await
            .unwrap(),
        1
    );
    assert_eq!(last_record(s).await.action, "discard consumer dead letters");
    let open = s.consumer_dead_letters(&all, 100).await.unwrap();
    assert_eq!(open.len(), 3, "a resolved letter is not listed");
    assert!(open.iter().all(|l| l.dead_letter.id != mail));
    assert_eq!(
        s.consumer_dead_letter(mail)
            .await
            .unwrap()
            .dead_letter
            .dead_letter
            .state,
        "resolved",
        "still readable whole"
    );
    assert_eq!(
        s.discard_consumer_dead_letters(&only(ids[0]), &me, "x")
            .await
            .unwrap(),
        0,
        "a requeued letter is the consumer's again"
    );
    assert_eq!(s.overview().await.unwrap().consumer_dead_letters, 3);
    let views = s.consumers().await.unwrap();
    let ledger_view = views
        .iter()
        .find(|c| c.name == "ledger")
        .expect("ledger is known");
    assert_eq!((ledger_view.dead_letters, ledger_view.paused), (3, false));
    assert_eq!(ledger_view.processed_per_minute.len(), MINUTES);
    assert!(
        views.iter().all(|c| c.name != "mail"),
        "nothing open of mail: {views:?}"
    );
    assert_eq!(audit(s).await.len(), records + 2, "the two discards");
}
