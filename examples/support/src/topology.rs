//! The broker objects and timings of one deployment of an example, shared by its processes.
//!
//! One name per deployment (a run uses one per run) keeps runs apart on a shared broker: for
//! the application `app`, NATS stream `<APP>_<NAME>` capturing `<app>_<name>.>`, RabbitMQ
//! exchange `<app>_<name>` with one queue per consumer, `<app>_<name>.<consumer>`. Subjects and
//! binding keys are `<aggregate type>.<event type>`.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use outbox::broker::{BoxSource, BrokerSettings, SourceOptions};
use serde_json::json;

/// The options that name a deployment and its broker, flattened into each example's options
/// of its service processes (`fintech run` and `igaming run` pass them to their children; see
/// [`crate::supervise::service_args`]). Flags only, like [`crate::run::RunServices`].
#[derive(clap::Args, Debug, Clone)]
pub struct Deployment {
    /// The broker, chosen by scheme: nats://, amqp://.
    #[arg(long, default_value = crate::run::DEFAULT_BROKER_URL)]
    pub broker_url: String,
    /// Names the broker objects of this deployment (for the application `app`: NATS stream
    /// `<APP>_<NAME>`, subjects `<app>_<name>.>`, RabbitMQ exchange `<app>_<name>`), so runs do
    /// not share them.
    #[arg(long, default_value = "demo")]
    pub name: String,
    /// Timings for a short demonstration (short leases, quick redelivery, and where the
    /// example asks for it a short NATS duplicate window).
    #[arg(long)]
    pub fast: bool,
}

/// Names and timings of one deployment.
#[derive(Debug, Clone)]
pub struct Topology {
    app: &'static str,
    aggregate: &'static str,
    name: String,
    fast: bool,
    duplicate_window_secs: Option<u64>,
}

impl Topology {
    /// The deployment `name` (lower-case letters, digits, `_`) of the application `app`, whose
    /// events are of the aggregate type `aggregate`; `fast` picks short leases and redelivery
    /// delays for a demonstration that kills processes.
    ///
    /// # Errors
    /// A name that cannot be part of a NATS subject, stream or RabbitMQ exchange name.
    pub fn new(app: &'static str, aggregate: &'static str, name: &str, fast: bool) -> Result<Self> {
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
            app,
            aggregate,
            name: name.to_owned(),
            fast,
            duplicate_window_secs: None,
        })
    }

    /// The NATS stream's `Nats-Msg-Id` duplicate window, for a stream the relay creates
    /// (default: the transport's, 120 s).
    #[must_use]
    pub fn with_duplicate_window(mut self, window: Duration) -> Self {
        self.duplicate_window_secs = Some(window.as_secs().max(1));
        self
    }

    /// The deployment's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The NATS stream.
    pub fn stream(&self) -> String {
        format!(
            "{}_{}",
            self.app.to_ascii_uppercase(),
            self.name.to_ascii_uppercase()
        )
    }

    /// The subject prefix (NATS) and exchange (RabbitMQ).
    pub fn prefix(&self) -> String {
        format!("{}_{}", self.app, self.name)
    }

    /// The RabbitMQ queue of `consumer`.
    pub fn queue(&self, consumer: &str) -> String {
        format!("{}.{consumer}", self.prefix())
    }

    /// The broker settings of the relay (transport sections).
    pub fn transport_settings(&self) -> BrokerSettings {
        let prefix = self.prefix();
        let mut nats = json!({
            "stream": self.stream(),
            "stream_subjects": [format!("{prefix}.>")],
            "subject_template": format!("{prefix}.{{aggregate_type}}.{{event_type}}"),
        });
        if let Some(secs) = self.duplicate_window_secs {
            nats["duplicate_window_secs"] = json!(secs);
        }
        BrokerSettings::new()
            .with_section("nats", nats)
            .with_section("rabbitmq", json!({ "exchange": prefix }))
    }

    /// The broker settings of `consumer`; `only` restricts it to one event type (a NATS filter
    /// subject, a RabbitMQ binding key).
    pub fn source_settings(&self, consumer: &str, only: Option<&str>) -> BrokerSettings {
        let prefix = self.prefix();
        let aggregate = self.aggregate;
        let filter = only.map_or(String::new(), |t| format!("{prefix}.{aggregate}.{t}"));
        let binding = only.map_or("#".to_owned(), |t| format!("{aggregate}.{t}"));
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

    /// Connects the delivery source of `consumer` on `broker_url` (the broker by scheme from
    /// `outbox::brokers()`), restricted to the event type `only` if given.
    ///
    /// # Errors
    /// The broker is unreachable or refused the settings.
    pub async fn connect_source(
        &self,
        broker_url: &str,
        consumer: &str,
        only: Option<&str>,
    ) -> Result<BoxSource> {
        outbox::brokers()
            .connect_source(
                broker_url,
                &self.source_settings(consumer, only),
                &SourceOptions {
                    consumer: consumer.into(),
                },
            )
            .await
            .with_context(|| format!("cannot connect the {consumer} consumer's source"))
    }

    /// How long a delivery may stay unacknowledged (a killed consumer's deliveries come back
    /// after this).
    pub fn ack_wait(&self) -> Duration {
        self.pick(Duration::from_secs(3), Duration::from_secs(30))
    }

    /// The relay's claim lease (a killed relay's rows are claimed again after it).
    pub fn relay_lease(&self) -> Duration {
        self.pick(Duration::from_secs(5), Duration::from_secs(30))
    }

    /// The relay's publish timeout.
    pub fn publish_timeout(&self) -> Duration {
        self.pick(Duration::from_secs(2), Duration::from_secs(10))
    }

    /// An executor's claim lease (a killed executor's calls turn unknown after it).
    pub fn executor_lease(&self) -> Duration {
        self.pick(Duration::from_secs(5), Duration::from_secs(30))
    }

    /// Timeout of one remote call: a slower answer is an unknown outcome.
    pub fn call_timeout(&self) -> Duration {
        self.pick(Duration::from_millis(1000), Duration::from_secs(10))
    }

    /// Age of an unknown outcome before its first lookup at the remote side.
    pub fn reconcile_after(&self) -> Duration {
        self.pick(Duration::from_millis(500), Duration::from_secs(2))
    }

    /// Whether the short timings are on.
    pub fn is_fast(&self) -> bool {
        self.fast
    }

    fn pick(&self, fast: Duration, normal: Duration) -> Duration {
        if self.fast { fast } else { normal }
    }

    /// Deletes the deployment's NATS stream (and with it its consumers), or the RabbitMQ
    /// queues of `consumers` and the exchange. `broker` is the registry entry's name.
    ///
    /// # Errors
    /// The broker is unreachable or refused a deletion.
    pub async fn delete_broker_objects(
        &self,
        broker: &str,
        url: &str,
        consumers: &[&str],
    ) -> Result<()> {
        match broker {
            "nats" => {
                use outbox::nats::async_nats;
                let client = async_nats::connect(url).await?;
                let js = async_nats::jetstream::new(client);
                js.delete_stream(self.stream()).await?;
            }
            "rabbitmq" => {
                let conn =
                    lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
                let ch = conn.create_channel().await?;
                for consumer in consumers {
                    ch.queue_delete(
                        self.queue(consumer).as_str().into(),
                        lapin::options::QueueDeleteOptions::default(),
                    )
                    .await?;
                }
                ch.exchange_delete(
                    self.prefix().as_str().into(),
                    lapin::options::ExchangeDeleteOptions::default(),
                )
                .await?;
                let _ = conn.close(200, "bye".into()).await;
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_derived() {
        assert!(Topology::new("fintech", "payment", "Bad-Name", false).is_err());
        assert!(Topology::new("fintech", "payment", "", false).is_err());
        let t = Topology::new("fintech", "payment", "r42", true).unwrap();
        assert_eq!(t.stream(), "FINTECH_R42");
        assert_eq!(t.prefix(), "fintech_r42");
        assert_eq!(t.name(), "r42");
        assert_eq!(t.queue("capture"), "fintech_r42.capture");
        let s = t.source_settings("capture", Some("PaymentCaptured"));
        assert_eq!(
            s.raw_section("nats_consumer").unwrap()["filter_subject"],
            "fintech_r42.payment.PaymentCaptured"
        );
        assert_eq!(
            s.raw_section("rabbitmq_consumer").unwrap()["binding_key"],
            "payment.PaymentCaptured"
        );
        assert!(
            t.transport_settings().raw_section("nats").unwrap()["duplicate_window_secs"].is_null()
        );
        let t = t.with_duplicate_window(Duration::from_secs(2));
        assert_eq!(
            t.transport_settings().raw_section("nats").unwrap()["duplicate_window_secs"],
            2
        );
    }
}
