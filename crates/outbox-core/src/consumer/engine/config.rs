//! The settings of a [`Consumer`](super::Consumer): [`ConsumerConfig`], and the
//! [`ConflictPolicy`] it holds.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::consumer::store::OrderingGuard;
use crate::error::ConfigError;

/// What to do with a delivery whose id is known with a different payload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConflictPolicy {
    /// Record the conflict (table, metric, CLI), then acknowledge (default): the conflict is
    /// kept for the contract's owner and the stream moves on.
    #[default]
    AckAfterRecording,
    /// Record it, then negatively acknowledge with `conflict_hold_delay`: the message keeps
    /// coming back (and `occurrences` grows) until an operator deals with it.
    Hold,
}

/// Settings of a [`Consumer`](super::Consumer).
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The consumer's name: the inbox key is `(name, event_id)`.
    pub name: String,
    /// Ordering guard.
    pub ordering: OrderingGuard,
    /// Deliveries per transaction (1 = one transaction per delivery).
    pub batch_size: usize,
    /// Longest wait for the first delivery of a batch.
    pub batch_wait: Duration,
    /// Deliveries of one message before a transient handler error or a database error (other
    /// than an outage) dead-letters it.
    pub max_attempts: u32,
    /// Redelivery delay after a transient error, by attempt.
    pub backoff: Backoff,
    /// Redelivery delay while the ordering guard waits for a missing version.
    pub gap_delay: Duration,
    /// Conflict handling.
    pub conflict_policy: ConflictPolicy,
    /// Redelivery delay of a held conflict.
    pub conflict_hold_delay: Duration,
    /// How often, at least, requeued dead letters are looked for under load (always when
    /// idle), and how often the lag and dead-letter gauges are refreshed.
    pub housekeeping_interval: Duration,
}

impl ConsumerConfig {
    /// Defaults for a consumer called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ordering: OrderingGuard::Off,
            batch_size: 1,
            batch_wait: Duration::from_millis(500),
            max_attempts: 10,
            backoff: Backoff {
                base: Duration::from_millis(200),
                max: Duration::from_secs(60),
            },
            gap_delay: Duration::from_secs(1),
            conflict_policy: ConflictPolicy::AckAfterRecording,
            conflict_hold_delay: Duration::from_secs(60),
            housekeeping_interval: Duration::from_secs(5),
        }
    }

    /// Checks every setting. The name is bounded like an event attribute (1 to
    /// [`MAX_ATTRIBUTE_CHARS`](crate::wire::MAX_ATTRIBUTE_CHARS) characters, no control
    /// characters): it is part of every inbox key, and a name the database cannot index would
    /// make every delivery a dead letter.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first offending field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        crate::wire::check_configured("name", &self.name)?;
        if self.batch_size == 0 {
            return Err(ConfigError::new("batch_size", "must be at least 1"));
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::new("max_attempts", "must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumer_config_is_checked_field_by_field() {
        assert_eq!(ConsumerConfig::new("billing").validate(), Ok(()));
        let widest = "𠀀".repeat(crate::wire::MAX_ATTRIBUTE_CHARS);
        assert_eq!(ConsumerConfig::new(widest).validate(), Ok(()));
        let refused = |c: ConsumerConfig| c.validate().unwrap_err().key;
        assert_eq!(refused(ConsumerConfig::new("")), "name");
        assert_eq!(refused(ConsumerConfig::new("  ")), "name");
        assert_eq!(refused(ConsumerConfig::new("a\0b")), "name");
        assert_eq!(
            refused(ConsumerConfig::new(
                "x".repeat(crate::wire::MAX_ATTRIBUTE_CHARS + 1)
            )),
            "name"
        );
        assert_eq!(
            refused(ConsumerConfig {
                batch_size: 0,
                ..ConsumerConfig::new("c")
            }),
            "batch_size"
        );
        assert_eq!(
            refused(ConsumerConfig {
                max_attempts: 0,
                ..ConsumerConfig::new("c")
            }),
            "max_attempts"
        );
    }
}
