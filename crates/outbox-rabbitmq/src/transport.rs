//! [`RabbitTransport`]: one connection, one confirm-mode channel, lazy reconnect; publisher
//! confirms paired with returned messages ([`confirms`]) and lapin's errors mapped to
//! [`PublishErrorKind`] ([`classify`]). The messages themselves are the binding's
//! ([`crate::binding`]).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use lapin::ErrorKind as LapinKind;
use lapin::message::BasicReturnMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Connection, ExchangeKind};
use outbox_core::{
    ConfigError, OutboxMessage, PublishError, PublishErrorKind, PublishReceipt, Transport,
};
use tokio::sync::{Mutex, Semaphore};
use tracing::{debug, error, info, warn};

use crate::binding::{self, Envelope};
use crate::config::RabbitConfig;
use crate::connection::{
    Connector, Link, RabbitConnectError, ReconnectState, Session, StepError, connection_level,
};

mod confirms;

use confirms::Verdict;

/// AMQP reply code `CONTENT_TOO_LARGE`.
const REPLY_CONTENT_TOO_LARGE: u16 = 311;

/// Publishes outbox messages to a RabbitMQ exchange with publisher confirms.
///
/// Cheap to share behind an `Arc`; every method takes `&self` and may be called concurrently.
/// See the [crate documentation](crate) for the wire format, error mapping and reconnect
/// behaviour.
pub struct RabbitTransport {
    shared: Arc<Shared>,
}

struct Shared {
    connector: Connector,
    config: RabbitConfig,
    exchange: ShortString,
    permits: Arc<Semaphore>,
    /// The link publishes use; read without waiting on the reconnect mutex.
    current: RwLock<Option<Arc<PublishLink>>>,
    /// Held while checking and replacing `current`: one reconnect at a time.
    reconnect: Mutex<ReconnectState>,
    /// `max_message_size` learned from a broker refusal; 0 while unknown.
    broker_max_message_bytes: AtomicUsize,
}

/// One connection and its confirm-mode channel.
type PublishLink = Link<Publisher>;

/// What a [`PublishLink`] keeps beside its connection and channel.
pub(crate) struct Publisher {
    /// The connection's negotiated `frame_max`.
    frame_max: usize,
    /// Decides every publish of the channel from all of its confirms (see [`confirms`]).
    confirms: confirms::Collector,
}

impl fmt::Debug for RabbitTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitTransport")
            .field("endpoint", &self.shared.connector.endpoint())
            .field("exchange", &self.shared.config.exchange)
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

fn exchange_kind(kind: &str) -> ExchangeKind {
    match kind {
        "direct" => ExchangeKind::Direct,
        "fanout" => ExchangeKind::Fanout,
        "headers" => ExchangeKind::Headers,
        "topic" => ExchangeKind::Topic,
        other => ExchangeKind::Custom(other.to_owned()),
    }
}

fn unavailable(message: impl Into<String>) -> PublishError {
    PublishError::new(PublishErrorKind::Unavailable, message)
}

impl RabbitTransport {
    /// Validates `config`, connects to the broker at `url`, opens a channel in publisher-confirm
    /// mode and (with `declare_exchange`) declares the exchange as durable.
    ///
    /// The whole sequence is bounded by `connect_timeout_secs` and tried once: an unreachable
    /// broker is an error here, not a retry loop. Once connected, a lost connection is
    /// re-established lazily by later publishes.
    ///
    /// # Errors
    /// * [`RabbitConnectError::Config`] for an invalid `config`, including TLS files that
    ///   cannot be read or are given with an `amqp://` URL ([`RabbitConfig::tls`]);
    /// * [`RabbitConnectError::InvalidUrl`] for a malformed `url`;
    /// * [`RabbitConnectError::Unreachable`] when the TCP connection or the AMQP handshake
    ///   (credentials, vhost) fails;
    /// * [`RabbitConnectError::TimedOut`] when it all took longer than `connect_timeout_secs`;
    /// * [`RabbitConnectError::Setup`] when the channel, publisher confirms or the exchange
    ///   declaration are refused (e.g. the exchange exists with another type).
    pub async fn connect(url: &str, config: RabbitConfig) -> Result<Self, RabbitConnectError> {
        config.validate()?;
        let connector = Connector::new(
            url,
            &config.tls,
            config.connection_name.clone(),
            config.connect_timeout(),
            config.reconnect_min_delay(),
        )?;
        let exchange = ShortString::try_new(config.exchange.clone())
            .map_err(|e| RabbitConnectError::Config(ConfigError::new("exchange", e.to_string())))?;
        let shared = Arc::new(Shared {
            connector,
            permits: Arc::new(Semaphore::new(config.max_in_flight)),
            exchange,
            config,
            current: RwLock::new(None),
            reconnect: Mutex::new(ReconnectState::default()),
            broker_max_message_bytes: AtomicUsize::new(0),
        });
        {
            let mut state = shared.reconnect.lock().await;
            let link = shared.connector.connect(&*shared, &mut state).await?;
            info!(
                endpoint = %shared.connector.endpoint(),
                exchange = %shared.config.exchange,
                "connected to RabbitMQ"
            );
            shared.set_current(Some(Arc::new(link)));
        }
        Ok(Self { shared })
    }

    /// True while the current connection and channel are open. A `false` is repaired by the
    /// next publish (after `reconnect_min_delay_ms`). Suitable for a readiness probe.
    pub fn is_connected(&self) -> bool {
        self.shared
            .current()
            .is_some_and(|link| link.usable() && !link.connection.status().blocked())
    }

    /// The settings this transport was built with.
    pub fn config(&self) -> &RabbitConfig {
        &self.shared.config
    }

    /// `host:port/vhost` of the broker, without credentials.
    pub fn endpoint(&self) -> &str {
        self.shared.connector.endpoint()
    }

    /// Graceful shutdown: waits for every publish in flight to get its confirm (each bounded by
    /// `confirm_timeout_secs`), then closes the connection. Later publishes fail with
    /// [`PublishErrorKind::Unavailable`].
    pub async fn close(&self) {
        let all = u32::try_from(self.shared.config.max_in_flight).unwrap_or(u32::MAX);
        let _drained = self.shared.permits.acquire_many(all).await;
        self.shared.permits.close();
        let _state = self.shared.reconnect.lock().await;
        if let Some(link) = self.shared.current() {
            self.shared.set_current(None);
            link.close().await;
        }
    }

    async fn publish_message(&self, msg: &OutboxMessage) -> Result<PublishReceipt, PublishError> {
        let shared = &self.shared;
        let body_len = msg.payload.bytes.len();
        if body_len > shared.config.max_message_bytes {
            return Err(PublishError::new(
                PublishErrorKind::TooLarge,
                format!(
                    "payload is {body_len} bytes, max_message_bytes is {}",
                    shared.config.max_message_bytes
                ),
            ));
        }
        let broker_max = shared.broker_max_message_bytes.load(Ordering::Relaxed);
        if broker_max > 0 && body_len > broker_max {
            return Err(PublishError::new(
                PublishErrorKind::TooLarge,
                format!(
                    "payload is {body_len} bytes, the broker's max_message_size is {broker_max}"
                ),
            ));
        }
        let envelope = binding::envelope(msg, &shared.config)?;

        let permit = shared
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| unavailable("the transport was closed"))?;
        let link = shared.link().await?;
        if link.connection.status().blocked() {
            return Err(unavailable(format!(
                "RabbitMQ at {} blocks publishing (memory or disk alarm)",
                shared.connector.endpoint()
            )));
        }
        if envelope.header_frame_bytes > link.parts.frame_max {
            return Err(PublishError::new(
                PublishErrorKind::TooLarge,
                format!(
                    "properties and headers need a {} byte content header frame, the connection's frame_max is {}",
                    envelope.header_frame_bytes, link.parts.frame_max
                ),
            ));
        }

        // The send and the confirm wait run in their own task: if the caller stops waiting
        // (the relay's publish timeout), the confirm is still collected and the in-flight
        // permit is released only when the broker answered, so the bound stays honest.
        let task_shared = Arc::clone(shared);
        let body = msg.payload.bytes.clone();
        let event_id = msg.event_id.hyphenated().to_string();
        let task = tokio::spawn(async move {
            let _permit = permit;
            task_shared.send(&link, envelope, body, &event_id).await
        });
        match task.await {
            Ok(result) => result,
            Err(e) => Err(unavailable(format!("publish task failed: {e}"))),
        }
    }
}

impl Session for Shared {
    type Parts = Publisher;

    fn describe(&self) -> String {
        format!("publisher to exchange `{}`", self.config.exchange)
    }

    /// Opens a channel in publisher-confirm mode and (with `declare_exchange`) declares the
    /// exchange.
    async fn open(&self, connection: &Connection) -> Result<(Channel, Publisher), StepError> {
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| ("channel.open", e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| ("confirm.select", e))?;
        if self.config.declare_exchange {
            channel
                .exchange_declare(
                    self.exchange.clone(),
                    exchange_kind(&self.config.exchange_kind),
                    ExchangeDeclareOptions {
                        durable: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(|e| ("exchange.declare", e))?;
        }
        let publisher = Publisher {
            frame_max: usize::try_from(connection.configuration().frame_max())
                .unwrap_or(usize::MAX),
            confirms: confirms::Collector::spawn(channel.clone()),
        };
        Ok((channel, publisher))
    }
}

impl Shared {
    fn current(&self) -> Option<Arc<PublishLink>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_current(&self, link: Option<Arc<PublishLink>>) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = link;
    }

    /// The link to publish on, repaired (see `connection.rs`) if the current one broke.
    async fn link(&self) -> Result<Arc<PublishLink>, PublishError> {
        if let Some(link) = self.current().filter(|l| l.usable()) {
            return Ok(link);
        }
        let mut state = self.reconnect.lock().await;
        let old = self.current();
        if let Some(link) = old.as_ref().filter(|l| l.usable()) {
            return Ok(Arc::clone(link));
        }
        if self.permits.is_closed() {
            return Err(unavailable("the transport was closed"));
        }
        self.set_current(None);
        let link = self
            .connector
            .repair(self, &mut state, old.as_deref())
            .await
            .map_err(|e| unavailable(e.message))?;
        let link = Arc::new(link);
        self.set_current(Some(Arc::clone(&link)));
        Ok(link)
    }

    /// Sends one message and waits for its confirm.
    async fn send(
        &self,
        link: &PublishLink,
        envelope: Envelope,
        body: Bytes,
        event_id: &str,
    ) -> Result<PublishReceipt, PublishError> {
        let Envelope {
            routing_key,
            properties,
            ..
        } = envelope;
        // `send` runs in the task spawned by `publish_message`, so a caller that gives up cannot
        // drop a confirm that may carry another publish's returned message: every publish that
        // took a ticket registers with the collector, with its confirm or with its failure.
        let len = body.len();
        let confirms = &link.parts.confirms;
        let ticket = confirms.ticket();
        let confirm = match link
            .channel
            .basic_publish(
                self.exchange.clone(),
                routing_key,
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                &body,
                properties,
            )
            .await
        {
            Ok(confirm) => confirm,
            Err(e) => {
                confirms.register_failure(ticket);
                return Err(self.failed(link, &e, len, "basic.publish", event_id));
            }
        };
        let verdict = confirms.register(ticket, event_id.to_owned(), confirm);
        let verdict = match tokio::time::timeout(self.config.confirm_timeout(), verdict).await {
            Ok(Ok(verdict)) => verdict,
            Ok(Err(_)) => Verdict::Stopped,
            Err(_) => {
                // A live channel that does not confirm within minutes is not trusted again.
                link.mark_broken();
                warn!(event_id, link = link.id, "no publisher confirm in time");
                return Err(PublishError::new(
                    PublishErrorKind::TimedOut,
                    format!(
                        "no publisher confirm within {}s",
                        self.config.confirm_timeout_secs
                    ),
                ));
            }
        };
        match verdict {
            Verdict::Routed => Ok(PublishReceipt { duplicate: false }),
            Verdict::Returned(returned) => Err(self.returned(&returned, event_id)),
            Verdict::Nacked => {
                warn!(event_id, "RabbitMQ nacked a message");
                Err(PublishError::new(
                    PublishErrorKind::Rejected,
                    "the broker negatively acknowledged the message (basic.nack)",
                ))
            }
            Verdict::Undecided(why) => {
                warn!(event_id, reason = %why, "confirmed, but not provably routed; retrying");
                Err(PublishError::new(
                    PublishErrorKind::Unavailable,
                    format!(
                        "confirmed, but whether it was returned cannot be told ({why}); retried with the same event id"
                    ),
                ))
            }
            Verdict::Failed(e) => Err(self.failed(link, &e, len, "confirm", event_id)),
            Verdict::Stopped => Err(unavailable("the confirm collector stopped")),
            Verdict::NotRequested => {
                link.mark_broken();
                error!(link = link.id, "channel is not in publisher-confirm mode");
                Err(unavailable(
                    "the channel is not in publisher-confirm mode; reconnecting",
                ))
            }
        }
    }

    /// The error for a publish the collector found returned (matched by its message id).
    fn returned(&self, returned: &BasicReturnMessage, event_id: &str) -> PublishError {
        let kind = if returned.reply_code == REPLY_CONTENT_TOO_LARGE {
            PublishErrorKind::TooLarge
        } else {
            PublishErrorKind::Rejected
        };
        debug!(
            event_id,
            code = returned.reply_code,
            text = %returned.reply_text,
            "message returned by RabbitMQ"
        );
        PublishError::new(
            kind,
            format!(
                "returned by the broker: {} {} (exchange `{}`, routing key `{}`): no queue is bound for this routing key",
                returned.reply_code,
                returned.reply_text,
                returned.delivery.exchange,
                returned.delivery.routing_key
            ),
        )
    }

    fn failed(
        &self,
        link: &PublishLink,
        err: &lapin::Error,
        body_len: usize,
        step: &str,
        event_id: &str,
    ) -> PublishError {
        let c = classify(err, body_len);
        if c.connection_broken {
            link.mark_broken();
        }
        if let Some(max) = c.broker_max_message_bytes {
            self.broker_max_message_bytes.store(max, Ordering::Relaxed);
        }
        debug!(event_id, link = link.id, step, kind = ?c.kind, error = %err, "publish failed");
        PublishError::new(
            c.kind,
            format!("{step} on {}: {err}", self.connector.endpoint()),
        )
    }
}

impl Transport for RabbitTransport {
    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<PublishReceipt, PublishError>> + Send {
        self.publish_message(message)
    }
}

/// How a lapin error affects one publish and the connection it was sent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Classified {
    pub(crate) kind: PublishErrorKind,
    /// The connection is no longer trusted: reconnect instead of only reopening the channel.
    pub(crate) connection_broken: bool,
    /// The broker's `max_message_size`, when its error message told it.
    pub(crate) broker_max_message_bytes: Option<usize>,
}

/// Parses RabbitMQ's "message size N is larger than configured max size M" (and the "max size M"
/// variant for its hard limit).
pub(crate) fn parse_broker_max_size(text: &str) -> Option<usize> {
    let rest = &text[text.find("max size")? + "max size".len()..];
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Maps an error of `basic.publish` or of its confirm for a message of `body_len` bytes.
///
/// A channel or connection error fails every publish in flight on it at once, so a "message too
/// large" channel close is only [`PublishErrorKind::TooLarge`] for a message actually above the
/// broker's limit; the others on the channel are innocent bystanders and get
/// [`PublishErrorKind::Unavailable`] (retried, never dead-lettered).
pub(crate) fn classify(err: &lapin::Error, body_len: usize) -> Classified {
    let mut c = Classified {
        kind: PublishErrorKind::Unavailable,
        connection_broken: connection_level(err),
        broker_max_message_bytes: None,
    };
    if let LapinKind::ProtocolError(amqp) = err.kind() {
        match amqp.kind() {
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) => {
                if let Some(max) = parse_broker_max_size(amqp.get_message().as_str()) {
                    if body_len > max {
                        c.kind = PublishErrorKind::TooLarge;
                    }
                    c.broker_max_message_bytes = Some(max);
                }
            }
            AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND | AMQPSoftError::ACCESSREFUSED) => {
                c.kind = PublishErrorKind::Rejected;
            }
            _ => {}
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use lapin::protocol::{AMQPError, AMQPHardError};

    use super::*;

    #[test]
    fn exchange_kinds() {
        assert_eq!(exchange_kind("topic"), ExchangeKind::Topic);
        assert_eq!(
            exchange_kind("x-consistent-hash"),
            ExchangeKind::Custom("x-consistent-hash".into())
        );
    }

    fn protocol(kind: AMQPErrorKind, text: &str) -> lapin::Error {
        LapinKind::ProtocolError(AMQPError::new(kind, text.into())).into()
    }

    #[test]
    fn size_error_blames_only_the_oversized_message() {
        let err = protocol(
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED),
            "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000",
        );
        let big = classify(&err, 2000);
        assert_eq!(big.kind, PublishErrorKind::TooLarge);
        assert_eq!(big.broker_max_message_bytes, Some(1000));
        assert!(!big.connection_broken);
        assert_eq!(classify(&err, 10).kind, PublishErrorKind::Unavailable);
    }

    #[test]
    fn other_errors() {
        let nf = protocol(
            AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND),
            "NOT_FOUND - no exchange 'x' in vhost '/'",
        );
        assert_eq!(classify(&nf, 1).kind, PublishErrorKind::Rejected);
        let forced = protocol(
            AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED),
            "CONNECTION_FORCED - closed via management plugin",
        );
        let c = classify(&forced, 1);
        assert_eq!(c.kind, PublishErrorKind::Unavailable);
        assert!(c.connection_broken);
        let io: lapin::Error = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
        assert_eq!(classify(&io, 1).kind, PublishErrorKind::Unavailable);
        let pf = protocol(
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED),
            "PRECONDITION_FAILED - unknown delivery tag 42",
        );
        assert_eq!(classify(&pf, 1).kind, PublishErrorKind::Unavailable);
    }

    #[test]
    fn parses_max_size() {
        assert_eq!(
            parse_broker_max_size("message size 5 is larger than max size 134217728"),
            Some(134_217_728)
        );
        assert_eq!(parse_broker_max_size("no numbers here"), None);
    }
}
