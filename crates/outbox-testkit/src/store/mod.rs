//! The store conformance suite: one case per promise of the store traits (claim, lease,
//! fencing, late commits, order, dead letters, inbox, conflicts, consumer dead letters, work
//! items, maintenance), generic over a [`StoreFixture`]. A store crate runs it in one line:
//!
//! ```ignore
//! outbox_testkit::store_suite!(MyFixture);
//! ```
//!
//! which expands to one `#[tokio::test]` per case (so each is reported and runs in parallel).
//!
//! One file per topic: claims and leases (`claims.rs`), what claims hand out of the rows
//! (`rows.rs`), the inbox (`inbox.rs`), consumer dead letters (`consumer_dead_letters.rs`), work
//! items (`work_items.rs`) and maintenance (`maintenance.rs`).
//!
//! [`StoreFixture`]: crate::fixture::StoreFixture

use std::time::Duration;

use outbox_core::{ClaimParams, IncomingEvent, NewMessage, Payload};
use uuid::Uuid;

use crate::fakes::{decode_wire, event_message, wire_message};

mod claims;
mod consumer_dead_letters;
mod inbox;
mod maintenance;
mod rows;
mod work_items;

/// A paused route holds its rows and their aggregates back from claims (the claim contract's
/// pause rule), and a resume hands them out again; paused by the operator contract.
pub use crate::operator::a_paused_route_is_not_claimed_and_holds_its_aggregates;
pub use claims::{
    a_stale_worker_cannot_settle_after_another_took_over,
    claims_hand_out_each_aggregate_in_version_order_to_one_claim_at_a_time,
    solo_takeovers_hand_out_one_expired_head_at_a_time,
    takeovers_are_counted_per_head_and_end_with_a_settled_claim,
};
pub use consumer_dead_letters::{
    consumer_dead_letters_are_kept_requeued_and_settled,
    consumer_dead_letters_keep_the_message_byte_for_byte,
};
pub use inbox::{
    concurrent_records_of_one_event_give_one_new, inbox_absorbs_duplicates_and_records_conflicts,
    ordering_guard_absorbs_stale_versions_and_reports_gaps,
    record_many_decides_as_record_one_by_one,
};
pub use maintenance::maintenance_is_elected_and_deletes_only_old_rows;
pub use rows::{
    a_claimed_row_is_what_the_producer_wrote, a_late_commit_is_claimed_after_later_ones,
    dead_letters_and_backoff_park_only_their_aggregate,
};
pub use work_items::work_items_are_claimed_once_and_recorded_under_their_lease;

/// A `payment` event of aggregate `agg` at `version` with an empty JSON object.
pub fn msg(agg: &str, version: i64) -> NewMessage {
    NewMessage::new(
        "payment",
        agg,
        version,
        "PaymentCreated",
        Payload::json(&serde_json::json!({"agg": agg, "v": version})).expect("json"),
    )
}

/// Claim parameters: at most `max_rows`, 100 per aggregate, a lease of `lease_ms`.
pub fn claim(max_rows: usize, lease_ms: u64) -> ClaimParams {
    ClaimParams {
        max_rows,
        max_per_aggregate: 100,
        lease: Duration::from_millis(lease_ms),
        scope: Default::default(),
    }
}

/// The event a consumer would decode for `event_id` of `agg` at `version` with `body`.
pub fn incoming(event_id: Uuid, agg: &str, version: i64, body: &str) -> IncomingEvent {
    decode_wire(&wire_message(&event_message(event_id, agg, version, body))).expect("decodes")
}

/// Expands to one `#[tokio::test]` per case of the store conformance suite for the
/// [`StoreFixture`] `$fixture`.
///
/// [`StoreFixture`]: crate::fixture::StoreFixture
#[macro_export]
macro_rules! store_suite {
    ($fixture:ty) => {
        $crate::__fixture_cases!(store, $fixture;
            claims_hand_out_each_aggregate_in_version_order_to_one_claim_at_a_time,
            a_stale_worker_cannot_settle_after_another_took_over,
            takeovers_are_counted_per_head_and_end_with_a_settled_claim,
            solo_takeovers_hand_out_one_expired_head_at_a_time,
            dead_letters_and_backoff_park_only_their_aggregate,
            a_paused_route_is_not_claimed_and_holds_its_aggregates,
            a_late_commit_is_claimed_after_later_ones,
            a_claimed_row_is_what_the_producer_wrote,
            inbox_absorbs_duplicates_and_records_conflicts,
            concurrent_records_of_one_event_give_one_new,
            ordering_guard_absorbs_stale_versions_and_reports_gaps,
            record_many_decides_as_record_one_by_one,
            consumer_dead_letters_are_kept_requeued_and_settled,
            consumer_dead_letters_keep_the_message_byte_for_byte,
            work_items_are_claimed_once_and_recorded_under_their_lease,
            maintenance_is_elected_and_deletes_only_old_rows,
        );
    };
}
