//! The operator conformance suite: one case per promise of the operator contract
//! ([`outbox_core::operator`]): the overview's counts, outbox and consumer dead letters
//! (filters, reason groups, detail, requeue, discard), page limits, conflicts, work items,
//! pauses (a paused route is not claimed), the audit, traces and replays, generic over a
//! [`StoreFixture`](crate::fixture::StoreFixture) whose store implements
//! [`OperatorStore`](outbox_core::operator::OperatorStore). A store crate runs it in one line:
//!
//! ```ignore
//! outbox_testkit::operator_suite!(MyFixture);
//! ```
//!
//! which expands to one `#[tokio::test]` per case. Every case seeds its data through the core's
//! store traits and the fixture only (a claim and a failure make a dead letter, the inbox
//! records conflicts and consumer dead letters), so it runs unchanged on every store; and every
//! case checks that each successful action wrote exactly one audit record and each refused one
//! none.
//!
//! One file per topic: the overview and routes (`overview.rs`), page limits (`limits.rs`),
//! outbox dead letters (`dead_letters.rs`), consumer dead letters
//! (`consumer_dead_letters.rs`), conflicts (`conflicts.rs`), work items (`work_items.rs`),
//! pauses (`pauses.rs`), the audit and traces (`audit.rs`), replays (`replay.rs`), and the
//! helpers they share (`steps.rs`).

mod audit;
mod conflicts;
mod consumer_dead_letters;
mod dead_letters;
mod limits;
mod overview;
mod pauses;
mod replay;
mod steps;
mod work_items;

pub use audit::{
    the_audit_lists_newest_first_and_pages_with_before,
    traces_show_an_event_and_an_aggregate_everywhere,
};
pub use conflicts::conflicts_are_listed_resolved_and_reopened;
pub use consumer_dead_letters::consumer_dead_letters_are_listed_grouped_requeued_and_discarded;
pub use dead_letters::{
    dead_letters_are_listed_filtered_grouped_and_read_whole,
    discarded_dead_letters_are_kept_as_discarded_and_unblock_their_aggregate,
    requeued_dead_letters_are_claimable_again_and_audited,
};
pub use limits::every_list_refuses_a_limit_out_of_range;
pub use overview::{
    overview_counts_what_waits_and_what_failed, routes_count_pending_and_dead_rows_per_route,
};
pub use pauses::{
    a_paused_route_is_not_claimed_and_holds_its_aggregates,
    pauses_are_checked_and_a_paused_consumer_shows_everywhere,
};
pub use replay::replays_follow_the_stores_publish_mode;
pub use steps::{actor, event};
pub use work_items::work_items_are_counted_listed_resolved_and_reconciled;

/// Expands to one `#[tokio::test]` per case of the operator conformance suite for the
/// [`StoreFixture`](crate::fixture::StoreFixture) `$fixture`, whose store implements
/// [`OperatorStore`](outbox_core::operator::OperatorStore).
#[macro_export]
macro_rules! operator_suite {
    ($fixture:ty) => {
        $crate::__fixture_cases!(operator, $fixture;
            overview_counts_what_waits_and_what_failed,
            dead_letters_are_listed_filtered_grouped_and_read_whole,
            requeued_dead_letters_are_claimable_again_and_audited,
            discarded_dead_letters_are_kept_as_discarded_and_unblock_their_aggregate,
            every_list_refuses_a_limit_out_of_range,
            consumer_dead_letters_are_listed_grouped_requeued_and_discarded,
            conflicts_are_listed_resolved_and_reopened,
            work_items_are_counted_listed_resolved_and_reconciled,
            pauses_are_checked_and_a_paused_consumer_shows_everywhere,
            the_audit_lists_newest_first_and_pages_with_before,
            traces_show_an_event_and_an_aggregate_everywhere,
            replays_follow_the_stores_publish_mode,
            routes_count_pending_and_dead_rows_per_route,
        );
    };
}
