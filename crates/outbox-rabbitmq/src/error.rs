//! Errors: [`RabbitConnectError`] at startup (of the transport and of the delivery source), and
//! the mapping of lapin / broker errors to [`PublishErrorKind`].

use std::time::Duration;

use lapin::ErrorKind as LapinKind;
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use outbox_core::PublishErrorKind;

use crate::config::RabbitConfigError;
use crate::link::connection_level;

/// Why [`crate::RabbitTransport::connect`] or [`crate::RabbitSource::connect`] failed (the
/// source's name for it is [`crate::RabbitConsumerError`]). Nothing is retried at startup: a
/// relay or consumer that cannot reach its broker should say so and let its supervisor decide.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RabbitConnectError {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] RabbitConfigError),
    /// The URL is not a valid `amqp://` / `amqps://` URL.
    #[error("invalid AMQP URL: {0}")]
    InvalidUrl(String),
    /// The broker could not be reached, or refused the connection or the credentials.
    #[error("cannot connect to RabbitMQ at {endpoint}: {message}")]
    Unreachable {
        /// `host:port/vhost` (never the credentials).
        endpoint: String,
        /// The client library's explanation.
        message: String,
    },
    /// Connecting and setting up the channel (declaring the transport's exchange; declaring,
    /// binding and consuming the source's queue) took longer than `connect_timeout_secs`.
    #[error("connecting to RabbitMQ at {endpoint} timed out after {after:?}")]
    TimedOut {
        /// `host:port/vhost`.
        endpoint: String,
        /// The configured timeout.
        after: Duration,
    },
    /// The connection opened but a setup step was refused: for the transport opening the
    /// channel, enabling publisher confirms or declaring the exchange (e.g. it exists with
    /// another type); for the source a missing exchange or queue, a queue declared with other
    /// arguments, permissions.
    #[error("RabbitMQ at {endpoint} refused {step}: {message}")]
    Setup {
        /// `host:port/vhost`.
        endpoint: String,
        /// `channel.open`, then `confirm.select` or `exchange.declare` (transport), or
        /// `queue.declare`, `queue.bind`, `basic.qos` or `basic.consume` (source).
        step: &'static str,
        /// The broker's or client library's explanation.
        message: String,
    },
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
