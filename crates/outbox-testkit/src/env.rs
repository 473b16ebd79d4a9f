//! Where the real services of the tests run, and the loud failure when one does not.
//!
//! Tests never skip a missing service: connecting fails the test with a message naming the
//! address tried and the variable that overrides it.

use std::fmt;

/// A service the tests need, with its default address and the variable that overrides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Service {
    /// Human name, e.g. `NATS (JetStream)`.
    pub name: &'static str,
    /// Environment variable overriding the address, e.g. `OUTBOX_TEST_NATS_URL`.
    pub env: &'static str,
    /// Address used when the variable is not set.
    pub default_url: &'static str,
}

/// NATS with JetStream enabled.
pub const NATS: Service = Service {
    name: "NATS (JetStream)",
    env: "OUTBOX_TEST_NATS_URL",
    default_url: "nats://127.0.0.1:4222",
};

/// RabbitMQ.
pub const RABBITMQ: Service = Service {
    name: "RabbitMQ",
    env: "OUTBOX_TEST_AMQP_URL",
    default_url: "amqp://guest:guest@127.0.0.1:5672/%2f",
};

/// A Kafka-protocol broker (tansu, started by `scripts/kafka-broker`).
pub const KAFKA: Service = Service {
    name: "Kafka (tansu)",
    env: "OUTBOX_TEST_KAFKA_URL",
    default_url: "kafka://127.0.0.1:9092",
};

impl Service {
    /// The address: the variable's value, or the default.
    pub fn url(&self) -> String {
        std::env::var(self.env).unwrap_or_else(|_| self.default_url.to_owned())
    }

    /// The error for a service that could not be reached: names the service, the address
    /// (without credentials), the variable and how to start the services, then `cause`.
    pub fn unreachable(&self, cause: impl fmt::Display) -> anyhow::Error {
        anyhow::anyhow!(
            "{} must run at {} (set {} to use another address; `bash scripts/services` starts the \
             test services): {cause}",
            self.name,
            redact(&self.url()),
            self.env
        )
    }
}

/// `url` with every credential hidden (the toolkit's one redaction function).
pub fn redact(url: &str) -> String {
    outbox_core::secrets::redact_url(url)
}

/// `host:port` of a URL such as `amqp://user:pass@host:5672/%2f` or `nats://host:4222`.
///
/// # Errors
/// When the URL has no `scheme://` or no port.
pub fn host_port(url: &str) -> anyhow::Result<String> {
    let (_, rest) = url
        .split_once("://")
        .ok_or_else(|| anyhow::anyhow!("`{}` has no scheme", redact(url)))?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    anyhow::ensure!(
        host_port
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()),
        "`{}` does not name a host and port",
        redact(url)
    );
    Ok(host_port.to_owned())
}

/// `url` with its `host:port` replaced by `host_port` (user info, path and query kept).
///
/// # Errors
/// As [`host_port`].
pub fn with_host_port(url: &str, host_port_new: &str) -> anyhow::Result<String> {
    let old = host_port(url)?;
    let (scheme, rest) = url.split_once("://").unwrap_or_default();
    Ok(format!(
        "{scheme}://{}",
        rest.replacen(&old, host_port_new, 1)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_parsed_and_replaced() {
        let url = "amqp://guest:secret@10.0.0.1:5672/%2f?heartbeat=5";
        assert_eq!(host_port(url).unwrap(), "10.0.0.1:5672");
        assert_eq!(
            with_host_port(url, "127.0.0.1:9").unwrap(),
            "amqp://guest:secret@127.0.0.1:9/%2f?heartbeat=5"
        );
        assert_eq!(
            host_port("nats://127.0.0.1:4222").unwrap(),
            "127.0.0.1:4222"
        );
        assert!(host_port("nats://127.0.0.1").is_err());
        assert!(host_port("127.0.0.1:4222").is_err());
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            redact("amqp://guest:secret@h:5672/%2f"),
            "amqp://guest:***@h:5672/%2f"
        );
        assert_eq!(redact("nats://h:4222"), "nats://h:4222");
        let e = RABBITMQ.unreachable("refused").to_string();
        assert!(
            e.contains("OUTBOX_TEST_AMQP_URL") && e.contains("refused"),
            "{e}"
        );
    }
}
