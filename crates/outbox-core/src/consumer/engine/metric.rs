/// Counter: events whose effect was committed.
pub const PROCESSED: &str = "outbox_consumer_processed_total";
/// Counter: redeliveries absorbed by the inbox.
pub const DUPLICATES: &str = "outbox_consumer_duplicates_total";
/// Counter: older versions absorbed by the ordering guard.
pub const STALE: &str = "outbox_consumer_stale_total";
/// Counter: same id, different payload.
pub const CONFLICTS: &str = "outbox_consumer_conflicts_total";
/// Counter: deliveries dead-lettered (label `reason`: `malformed`, `permanent`, `attempts`
/// (transient handler errors), `refused` (the database refused the values), `database`
/// (other database errors, after `max_attempts` deliveries)).
pub const DEAD_LETTERED: &str = "outbox_consumer_dead_lettered_total";
/// Counter: negative acknowledgements (transient errors, gaps, database errors).
pub const RETRIES: &str = "outbox_consumer_retries_total";
/// Histogram: seconds per handler call: one event's [`Handler::handle`], or one batch's
/// [`Handler::handle_many`] on the batch path (so it grows with the batch size).
///
/// [`Handler::handle`]: super::Handler::handle
/// [`Handler::handle_many`]: super::Handler::handle_many
pub const HANDLER_SECONDS: &str = "outbox_consumer_handler_seconds";
/// Gauge: messages waiting for this consumer (broker's view).
pub const LAG: &str = "outbox_consumer_lag";
/// Gauge: open consumer dead letters.
pub const DEAD_LETTERS: &str = "outbox_consumer_dead_letters";
/// Gauge: 1 while an operator paused the consumer, else 0.
pub const PAUSED: &str = "outbox_consumer_paused";
/// Counter: the consumer's errors by kind (label `kind`: `source`, `store`, `handler`,
/// `dead_letter`; [`crate::health::TroubleKind`]).
pub const ERRORS: &str = "outbox_consumer_errors_total";
/// Gauge: unix time, seconds, of the consumer's last progress (deliveries settled for
/// good); its start until the first. With [`LAG`] above 0, a value that stops moving means
/// the consumer is stuck: its heartbeat says why.
pub const LAST_PROGRESS: &str = "outbox_consumer_last_progress_timestamp_seconds";
