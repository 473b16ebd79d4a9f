//! [`NatsDelivery`]: one message of a [`NatsSource`](crate::NatsSource) and its
//! acknowledgement.

use std::time::Duration;

use async_nats::RequestErrorKind;
use async_nats::connection::State;
use async_nats::jetstream::{self, AckKind};
use bytes::Bytes;
use outbox_core::consumer::{Delivery, RawMessage, SourceError, SourceErrorKind};
use outbox_core::wire::{DecodeError, IncomingEvent};

use crate::binding::{decode_raw, raw_message};
use crate::config::NatsConsumerConfig;

/// One message from [`NatsSource`](crate::NatsSource).
#[derive(Debug)]
pub struct NatsDelivery {
    message: jetstream::Message,
    event: Result<IncomingEvent, DecodeError>,
    raw: RawMessage,
    ack_timeout: Duration,
}

impl NatsDelivery {
    pub(super) fn new(message: jetstream::Message, config: &NatsConsumerConfig) -> Self {
        let mut raw = raw_message(&message.message);
        raw.metadata
            .insert("subject".to_owned(), message.subject.to_string());
        if let Ok(info) = message.info() {
            for (key, value) in [
                ("stream", info.stream.to_owned()),
                ("consumer", info.consumer.to_owned()),
                ("stream_sequence", info.stream_sequence.to_string()),
                ("consumer_sequence", info.consumer_sequence.to_string()),
                ("delivered", info.delivered.to_string()),
                ("pending", info.pending.to_string()),
                ("published", info.published.to_string()),
            ] {
                raw.metadata.insert(key.to_owned(), value);
            }
        }
        let event = decode_raw(&raw, config.max_message_bytes);
        Self {
            message,
            event,
            raw,
            ack_timeout: config.ack_timeout(),
        }
    }

    /// The JetStream message (subject, reply subject, metadata).
    pub fn message(&self) -> &jetstream::Message {
        &self.message
    }

    /// The subject the event was published to.
    pub fn subject(&self) -> &str {
        self.message.subject.as_str()
    }

    /// The stream sequence number, when the message carries JetStream metadata.
    pub fn stream_sequence(&self) -> Option<u64> {
        self.message.info().ok().map(|i| i.stream_sequence)
    }

    fn ack_error(&self, what: &str, e: &dyn std::fmt::Display, timed_out: bool) -> SourceError {
        let connected = self.message.context.client().connection_state() == State::Connected;
        let kind = if timed_out || !connected {
            SourceErrorKind::Unavailable
        } else {
            SourceErrorKind::Other
        };
        SourceError::new(
            kind,
            format!(
                "{what} of message {} failed (it will be delivered again): {e}",
                self.stream_sequence()
                    .map_or_else(|| "?".to_owned(), |s| format!("#{s}"))
            ),
        )
    }
}

impl Delivery for NatsDelivery {
    fn event(&self) -> &Result<IncomingEvent, DecodeError> {
        &self.event
    }

    fn raw(&self) -> &RawMessage {
        &self.raw
    }

    fn delivery_count(&self) -> Option<u32> {
        self.message
            .info()
            .ok()
            .and_then(|i| u32::try_from(i.delivered).ok())
    }

    /// Sends `+ACK` and waits up to `ack_timeout_secs` for the server's confirmation (a
    /// "double ack").
    ///
    /// # Errors
    /// [`SourceErrorKind::Unavailable`] when no confirmation came (timeout, no responder,
    /// disconnected): the ack may or may not have been applied; [`SourceErrorKind::Other`] for
    /// a message without a JetStream reply subject.
    async fn ack(self) -> Result<(), SourceError> {
        let Some(reply) = self.message.reply.clone() else {
            return Err(self.ack_error("ack", &"no JetStream reply subject", false));
        };
        // `Message::double_ack` subscribes a fresh inbox per ack; a request over the client's
        // shared response inbox is the same protocol without the extra subscription.
        let request = async_nats::Request::new()
            .payload(Bytes::from(AckKind::Ack))
            .timeout(Some(self.ack_timeout));
        match self
            .message
            .context
            .client()
            .send_request(reply, request)
            .await
        {
            Ok(response) => match response.status {
                None | Some(async_nats::StatusCode::OK) => Ok(()),
                Some(status) => Err(self.ack_error(
                    "ack",
                    &format!("server answered {status} {:?}", response.description),
                    false,
                )),
            },
            Err(e) => {
                let timed_out = matches!(
                    e.kind(),
                    RequestErrorKind::TimedOut | RequestErrorKind::NoResponders
                );
                Err(self.ack_error("ack", &e, timed_out))
            }
        }
    }

    /// Sends `-NAK` with `delay`: the server delivers the message again after the delay.
    ///
    /// # Errors
    /// [`SourceError`] when it could not be sent; the message is then delivered again after
    /// the ack wait.
    async fn nack(self, delay: Duration) -> Result<(), SourceError> {
        self.message
            .ack_with(AckKind::Nak(Some(delay)))
            .await
            .map_err(|e| self.ack_error("nack", &e, false))
    }
}
