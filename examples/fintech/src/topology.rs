//! The broker objects and timings of one deployment, shared by every process.
//!
//! One name per deployment (`fintech run` uses one per run) keeps runs apart on a shared
//! broker: NATS stream `FINTECH_<NAME>` capturing `fintech_<name>.>`, RabbitMQ exchange
//! `fintech_<name>` with one queue per consumer.

use std::time::Duration;

use anyhow::{Result, bail};
use outbox::broker::BrokerSettings;
use serde_json::json;

/// The aggregate type of every event of the service.
pub const AGGREGATE: &str = "payment";
/// Event type of a created payment (version 1).
pub const PAYMENT_CREATED: &str = "PaymentCreated";
/// Event type of a captured payment (version 2).
pub const PAYMENT_CAPTURED: &str = "PaymentCaptured";
/// The schema of the outbox tables (outbox, inbox, work items) in both databases.
pub const OUTBOX_SCHEMA: &str = "outbox";
/// The reporting service's consumer name (its inbox key is `(name, event_id)`).
pub const REPORTING_CONSUMER: &str = "reporting";
/// The capture worker's consumer name.
pub const CAPTURE_CONSUMER: &str = "capture";
/// The work-item kind of a capture at the provider.
pub const CAPTURE_KIND: &str = "provider-capture";

/// Names and timings of one deployment.
#[derive(Debug, Clone)]
pub struct Topology {
    name: String,
    fast: bool,
}

impl Topology {
    /// The deployment `name` (lower-case letters, digits, `_`); `fast` picks short leases and
    /// redelivery delays for a demonstration that kills processes.
    ///
    /// # Errors
    /// A name that cannot be part of a NATS subject, stream or RabbitMQ exchange name.
    pub fn new(name: &str, fast: bool) -> Result<Self> {
        if name.is_empty()
            || name.len() > 40
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            bail!(
                "invalid option `--name`: `{name}` must be 1 to 40 lower-case letters, digits or `_`"
            );
        }
        Ok(Self {
            name: name.to_owned(),
            fast,
        })
    }

    /// The NATS stream.
    pub fn stream(&self) -> String {
        format!("FINTECH_{}", self.name.to_ascii_uppercase())
    }

    /// The subject prefix (NATS) and exchange (RabbitMQ).
    pub fn prefix(&self) -> String {
        format!("fintech_{}", self.name)
    }

    /// The RabbitMQ queue of `consumer`.
    pub fn queue(&self, consumer: &str) -> String {
        format!("{}.{consumer}", self.prefix())
    }

    /// The broker settings of the relay (transport sections).
    pub fn transport_settings(&self) -> BrokerSettings {
        let prefix = self.prefix();
        BrokerSettings::new()
            .with_section(
                "nats",
                json!({
                    "stream": self.stream(),
                    "stream_subjects": [format!("{prefix}.>")],
                    "subject_template": format!("{prefix}.{{aggregate_type}}.{{event_type}}"),
                }),
            )
            .with_section("rabbitmq", json!({ "exchange": prefix }))
    }

    /// The broker settings of `consumer`; `only` restricts it to one event type (a NATS filter
    /// subject, a RabbitMQ binding key).
    pub fn source_settings(&self, consumer: &str, only: Option<&str>) -> BrokerSettings {
        let prefix = self.prefix();
        let filter = only.map_or(String::new(), |t| format!("{prefix}.{AGGREGATE}.{t}"));
        let binding = only.map_or("#".to_owned(), |t| format!("{AGGREGATE}.{t}"));
        BrokerSettings::new()
            .with_section(
                "nats_consumer",
                json!({
                    "stream": self.stream(),
                    "durable_name": consumer,
                    "filter_subject": filter,
                    "ack_wait_secs": self.ack_wait().as_secs(),
                }),
            )
            .with_section(
                "rabbitmq_consumer",
                json!({
                    "queue": self.queue(consumer),
                    "bind_exchange": prefix,
                    "binding_key": binding,
                }),
            )
    }

    /// How long a delivery may stay unacknowledged (a killed consumer's deliveries come back
    /// after this).
    pub fn ack_wait(&self) -> Duration {
        if self.fast {
            Duration::from_secs(3)
        } else {
            Duration::from_secs(30)
        }
    }

    /// The relay's claim lease (a killed relay's rows are claimed again after it).
    pub fn relay_lease(&self) -> Duration {
        if self.fast {
            Duration::from_secs(5)
        } else {
            Duration::from_secs(30)
        }
    }

    /// The relay's publish timeout.
    pub fn publish_timeout(&self) -> Duration {
        if self.fast {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(10)
        }
    }

    /// The executor's claim lease (a killed executor's calls turn unknown after it).
    pub fn executor_lease(&self) -> Duration {
        if self.fast {
            Duration::from_secs(5)
        } else {
            Duration::from_secs(30)
        }
    }

    /// Timeout of one provider call: a slower answer is an unknown outcome.
    pub fn call_timeout(&self) -> Duration {
        if self.fast {
            Duration::from_millis(1000)
        } else {
            Duration::from_secs(10)
        }
    }

    /// Age of an unknown outcome before its first lookup at the provider.
    pub fn reconcile_after(&self) -> Duration {
        if self.fast {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(2)
        }
    }

    /// Whether the short timings are on.
    pub fn is_fast(&self) -> bool {
        self.fast
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_derived() {
        assert!(Topology::new("Bad-Name", false).is_err());
        assert!(Topology::new("", false).is_err());
        let t = Topology::new("r42", true).unwrap();
        assert_eq!(t.stream(), "FINTECH_R42");
        assert_eq!(t.prefix(), "fintech_r42");
        assert_eq!(t.queue("capture"), "fintech_r42.capture");
        let s = t.source_settings("capture", Some(PAYMENT_CAPTURED));
        assert_eq!(
            s.raw_section("nats_consumer").unwrap()["filter_subject"],
            "fintech_r42.payment.PaymentCaptured"
        );
        assert_eq!(
            s.raw_section("rabbitmq_consumer").unwrap()["binding_key"],
            "payment.PaymentCaptured"
        );
    }
}
