//! The engine suites: the core's consumer engine and remote-effect executor, unchanged, over any
//! store that has a [`StoreFixture`](crate::fixture::StoreFixture), fed by the fakes of
//! [`crate::fakes`]. PostgreSQL runs them as integration tests, the in-memory store as unit
//! tests:
//!
//! ```ignore
//! outbox_testkit::engine_suite!(MyFixture);
//! ```
//!
//! One file per engine and topic: the consumer engine (`consumer.rs`), in batch mode
//! (`batches.rs`), through outages (`outages.rs`) and when the database refuses
//! (`refusals.rs`); the remote-effect executor (`executor.rs`); the maintainer
//! (`maintainer.rs`); and what they run on, the handlers and the rig (`rig.rs`).

mod batches;
mod consumer;
mod executor;
mod maintainer;
mod outages;
mod refusals;
mod rig;

pub use batches::{
    a_batch_failure_rolls_back_only_its_own_writes,
    a_batch_handler_gets_the_new_events_at_once_and_a_failure_is_redone_one_by_one,
    a_panicking_batch_handler_on_a_mixed_batch_is_redone_one_by_one,
    run_acks_beside_the_next_batch_and_settles_everything_before_it_returns,
};
pub use consumer::{
    a_conflict_is_recorded_not_applied, a_malformed_message_is_dead_lettered_and_does_not_block,
    a_paused_consumer_takes_nothing_until_resumed, a_permanent_error_is_dead_lettered_at_once,
    exhausted_retries_dead_letter_and_a_requeue_applies_once, redeliveries_have_one_effect,
    the_ordering_guard_holds_a_gap_until_the_missing_version,
    transient_errors_are_retried_without_a_second_effect, two_consumers_get_one_effect_each,
};
pub use executor::{
    a_call_succeeds_once_with_its_key, a_failed_call_is_terminal,
    an_executor_waits_out_a_store_outage,
    an_expired_lease_goes_unknown_and_the_stale_record_is_refused,
    an_unknown_outcome_is_reconciled_without_a_second_call,
    calls_of_a_batch_run_concurrently_and_record_independently,
    not_found_resends_with_the_same_key_or_parks, not_sent_is_retried_then_failed_at_the_limit,
    run_processes_items_and_stops_on_shutdown, work_items_are_written_with_the_inbox_transaction,
};
pub use maintainer::the_maintainer_cleans_up_on_one_elected_instance;
pub use outages::{
    a_store_outage_loses_nothing_and_acks_only_after_commit, a_stuck_consumer_says_why,
    run_releases_the_source_after_an_error,
};
pub use refusals::{
    a_delivery_the_database_refuses_is_dead_lettered_at_once,
    a_hostile_message_is_dead_lettered_byte_for_byte,
    a_refused_dead_letter_is_kept_with_the_raw_message_alone,
    a_requeued_letter_survives_a_deadlock,
    a_requeued_letter_the_database_refuses_does_not_block_the_others,
    an_outage_is_never_dead_lettered, other_database_errors_are_retried_then_dead_lettered,
    the_attempt_cap_holds_without_a_broker_count,
};
pub use rig::{Script, TestHandler, drain, fast_config};

/// Expands to one `#[tokio::test]` per case of the engine suites for the
/// [`StoreFixture`](crate::fixture::StoreFixture)
/// `$fixture`.
#[macro_export]
macro_rules! engine_suite {
    ($fixture:ty) => {
        $crate::__fixture_cases!(engines, $fixture;
            redeliveries_have_one_effect,
            a_paused_consumer_takes_nothing_until_resumed,
            transient_errors_are_retried_without_a_second_effect,
            exhausted_retries_dead_letter_and_a_requeue_applies_once,
            a_permanent_error_is_dead_lettered_at_once,
            a_malformed_message_is_dead_lettered_and_does_not_block,
            a_conflict_is_recorded_not_applied,
            a_batch_failure_rolls_back_only_its_own_writes,
            a_batch_handler_gets_the_new_events_at_once_and_a_failure_is_redone_one_by_one,
            a_panicking_batch_handler_on_a_mixed_batch_is_redone_one_by_one,
            run_acks_beside_the_next_batch_and_settles_everything_before_it_returns,
            the_ordering_guard_holds_a_gap_until_the_missing_version,
            two_consumers_get_one_effect_each,
            a_store_outage_loses_nothing_and_acks_only_after_commit,
            run_releases_the_source_after_an_error,
            a_stuck_consumer_says_why,
            a_delivery_the_database_refuses_is_dead_lettered_at_once,
            other_database_errors_are_retried_then_dead_lettered,
            an_outage_is_never_dead_lettered,
            the_attempt_cap_holds_without_a_broker_count,
            a_refused_dead_letter_is_kept_with_the_raw_message_alone,
            a_hostile_message_is_dead_lettered_byte_for_byte,
            a_requeued_letter_the_database_refuses_does_not_block_the_others,
            a_requeued_letter_survives_a_deadlock,
            work_items_are_written_with_the_inbox_transaction,
            a_call_succeeds_once_with_its_key,
            a_failed_call_is_terminal,
            an_unknown_outcome_is_reconciled_without_a_second_call,
            not_found_resends_with_the_same_key_or_parks,
            an_expired_lease_goes_unknown_and_the_stale_record_is_refused,
            not_sent_is_retried_then_failed_at_the_limit,
            an_executor_waits_out_a_store_outage,
            calls_of_a_batch_run_concurrently_and_record_independently,
            run_processes_items_and_stops_on_shutdown,
            the_maintainer_cleans_up_on_one_elected_instance,
        );
    };
}
