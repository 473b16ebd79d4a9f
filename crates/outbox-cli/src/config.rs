//! Configuration: command-line flags, then environment, then an optional TOML file, then
//! defaults. Every error names the key that is wrong.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use outbox_core::Backoff;
use outbox_core::relay::RelayConfig;
use outbox_nats::NatsConfig;
use outbox_postgres::{OnPublish, Schema};
use outbox_rabbitmq::RabbitConfig;
use serde::Deserialize;

/// The TOML file. Unknown keys are errors (a typo must not silently fall back to a default).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    /// PostgreSQL URL.
    pub database_url: Option<String>,
    /// `nats://…`, `tls://…` (NATS over TLS), `amqp://…` or `amqps://…`.
    pub broker_url: Option<String>,
    /// Schema of the outbox tables.
    pub schema: Option<String>,
    /// Prometheus listen address of `outbox relay`; keep it on loopback (see the README).
    pub metrics_addr: Option<String>,
    /// `[relay]` table.
    pub relay: RelayFile,
    /// `[nats]` table.
    pub nats: NatsConfig,
    /// `[rabbitmq]` table.
    pub rabbitmq: RabbitConfig,
}

/// `[relay]` settings; see [`RelayConfig`] for their meaning.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelayFile {
    pub batch_size: usize,
    pub max_per_aggregate: usize,
    pub lease_secs: f64,
    pub publish_timeout_secs: f64,
    pub lease_safety_margin_secs: f64,
    pub max_in_flight: usize,
    pub workers: usize,
    pub poll_interval_ms: u64,
    pub max_attempts: i32,
    pub backoff_base_ms: u64,
    pub backoff_max_secs: f64,
    pub stats_interval_secs: f64,
    pub on_publish: OnPublish,
}

impl Default for RelayFile {
    fn default() -> Self {
        let d = RelayConfig::default();
        Self {
            batch_size: d.batch_size,
            max_per_aggregate: d.max_per_aggregate,
            lease_secs: d.lease.as_secs_f64(),
            publish_timeout_secs: d.publish_timeout.as_secs_f64(),
            lease_safety_margin_secs: d.lease_safety_margin.as_secs_f64(),
            max_in_flight: d.max_in_flight,
            workers: d.workers,
            poll_interval_ms: d.poll_interval.as_millis() as u64,
            max_attempts: d.max_attempts,
            backoff_base_ms: d.backoff.base.as_millis() as u64,
            backoff_max_secs: d.backoff.max.as_secs_f64(),
            stats_interval_secs: d.stats_interval.as_secs_f64(),
            on_publish: OnPublish::Delete,
        }
    }
}

fn secs(key: &'static str, v: f64) -> Result<Duration> {
    if !(v.is_finite() && v >= 0.0) {
        bail!(
            "invalid configuration `relay.{key}`: must be a non-negative number of seconds, got {v}"
        );
    }
    Ok(Duration::from_secs_f64(v))
}

impl RelayFile {
    /// Converts to the engine's configuration and validates it.
    pub fn to_relay_config(&self) -> Result<RelayConfig> {
        let c = RelayConfig {
            batch_size: self.batch_size,
            max_per_aggregate: self.max_per_aggregate,
            lease: secs("lease_secs", self.lease_secs)?,
            publish_timeout: secs("publish_timeout_secs", self.publish_timeout_secs)?,
            lease_safety_margin: secs("lease_safety_margin_secs", self.lease_safety_margin_secs)?,
            max_in_flight: self.max_in_flight,
            workers: self.workers,
            poll_interval: Duration::from_millis(self.poll_interval_ms),
            max_attempts: self.max_attempts,
            backoff: Backoff {
                base: Duration::from_millis(self.backoff_base_ms),
                max: secs("backoff_max_secs", self.backoff_max_secs)?,
            },
            stats_interval: secs("stats_interval_secs", self.stats_interval_secs)?,
        };
        c.validate().map_err(|e| {
            let key = match e.key {
                "poll_interval" => "poll_interval_ms",
                "stats_interval" => "stats_interval_secs",
                "lease" => "lease_secs",
                "publish_timeout" => "publish_timeout_secs",
                "backoff" => "backoff_base_ms / relay.backoff_max_secs",
                other => other,
            };
            anyhow::anyhow!("invalid configuration `relay.{key}`: {}", e.reason)
        })?;
        Ok(c)
    }
}

impl FileConfig {
    /// Reads and parses a TOML file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("invalid config file {}", path.display()))
    }

    /// Parses TOML text.
    pub fn parse(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// Resolved connection settings.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub database_url: String,
    pub broker_url: Option<String>,
    pub schema: Schema,
}

/// Applies precedence: flag/`OUTBOX_*` env (clap), then `DATABASE_URL`, then the file.
pub fn resolve(
    flag_db: Option<String>,
    flag_broker: Option<String>,
    flag_schema: Option<String>,
    file: &FileConfig,
) -> Result<Resolved> {
    let database_url = flag_db
        .or_else(|| std::env::var("DATABASE_URL").ok().filter(|s| !s.is_empty()))
        .or_else(|| file.database_url.clone())
        .context(
            "invalid configuration `database_url`: not set (use --database-url, OUTBOX_DATABASE_URL, DATABASE_URL or the config file)",
        )?;
    if !(database_url.starts_with("postgres://") || database_url.starts_with("postgresql://")) {
        bail!("invalid configuration `database_url`: must start with postgres:// or postgresql://");
    }
    let broker_url = flag_broker.or_else(|| file.broker_url.clone());
    if let Some(b) = &broker_url
        && broker_kind(b).is_none()
    {
        bail!(
            "invalid configuration `broker_url`: scheme must be nats://, tls:// (NATS over TLS), amqp:// or amqps://, got `{}`",
            redact(b)
        );
    }
    let schema_name = flag_schema
        .or_else(|| file.schema.clone())
        .unwrap_or_else(|| outbox_postgres::DEFAULT_SCHEMA.to_owned());
    let schema = Schema::new(&schema_name)
        .map_err(|e| anyhow::anyhow!("invalid configuration `schema`: {e}"))?;
    Ok(Resolved {
        database_url,
        broker_url,
        schema,
    })
}

/// The broker a URL names, by its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    /// `nats://` or `tls://` (NATS over TLS).
    Nats,
    /// `amqp://` or `amqps://`.
    Rabbit,
}

/// The broker of `url`, or `None` for an unknown scheme.
pub fn broker_kind(url: &str) -> Option<BrokerKind> {
    let lower = url.trim_start().to_ascii_lowercase();
    if lower.starts_with("nats://") || lower.starts_with("tls://") {
        Some(BrokerKind::Nats)
    } else if lower.starts_with("amqp://") || lower.starts_with("amqps://") {
        Some(BrokerKind::Rabbit)
    } else {
        None
    }
}

/// A URL with every secret masked, for messages: the one redaction of the toolkit,
/// [`outbox_core::secrets::redact_url`].
pub fn redact(url: &str) -> String {
    outbox_core::secrets::redact_url(url)
}

/// TLS and authentication of the broker connection. Each flag (or its environment variable)
/// overrides the file's key: `[nats.security]` for NATS, `[rabbitmq.tls]` for RabbitMQ.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct BrokerSecurityArgs {
    /// PEM file of certificate authorities trusted for the broker's certificate, besides the
    /// system's (NATS `ca_file`, RabbitMQ `tls.ca_file`). Makes TLS required.
    #[arg(long, global = true, env = "OUTBOX_BROKER_CA_FILE")]
    pub broker_ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS with the broker (needs --broker-key-file).
    #[arg(long, global = true, env = "OUTBOX_BROKER_CERT_FILE")]
    pub broker_cert_file: Option<PathBuf>,
    /// PEM private key of --broker-cert-file.
    #[arg(long, global = true, env = "OUTBOX_BROKER_KEY_FILE")]
    pub broker_key_file: Option<PathBuf>,
    /// NATS `.creds` file (user JWT and NKey seed) for servers in operator mode.
    #[arg(long, global = true, env = "OUTBOX_NATS_CREDENTIALS_FILE")]
    pub nats_credentials_file: Option<PathBuf>,
    /// File holding a NATS user NKey seed (`SU…`).
    #[arg(long, global = true, env = "OUTBOX_NATS_NKEY_FILE")]
    pub nats_nkey_file: Option<PathBuf>,
}

impl BrokerSecurityArgs {
    /// Writes the given flags over the file's `[nats.security]` and `[rabbitmq.tls]` keys.
    pub fn apply(&self, file: &mut FileConfig) {
        let set = |target: &mut Option<PathBuf>, flag: &Option<PathBuf>| {
            if flag.is_some() {
                target.clone_from(flag);
            }
        };
        let nats = &mut file.nats.security;
        set(&mut nats.ca_file, &self.broker_ca_file);
        set(&mut nats.cert_file, &self.broker_cert_file);
        set(&mut nats.key_file, &self.broker_key_file);
        set(&mut nats.credentials_file, &self.nats_credentials_file);
        set(&mut nats.nkey_seed_file, &self.nats_nkey_file);
        let rabbit = &mut file.rabbitmq.tls;
        set(&mut rabbit.ca_file, &self.broker_ca_file);
        set(&mut rabbit.cert_file, &self.broker_cert_file);
        set(&mut rabbit.key_file, &self.broker_key_file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_bad_keys_are_named() {
        let e = FileConfig::parse("[relay]\nbatch_sise = 5\n").unwrap_err();
        assert!(e.to_string().contains("batch_sise"), "{e}");
        let e = FileConfig::parse("[relay]\nbatch_size = \"many\"\n").unwrap_err();
        assert!(e.to_string().contains("batch_size"), "{e}");
        let f = FileConfig::parse("[relay]\nbatch_size = 0\n").unwrap();
        let e = f.relay.to_relay_config().unwrap_err();
        assert!(e.to_string().contains("relay.batch_size"), "{e}");
        let f = FileConfig::parse("[relay]\nlease_secs = 1\n").unwrap();
        let e = f.relay.to_relay_config().unwrap_err();
        assert!(e.to_string().contains("relay.lease"), "{e}");
    }

    #[test]
    fn resolve_checks_urls_and_schema() {
        let f = FileConfig::default();
        let e = resolve(Some("mysql://x".into()), None, None, &f).unwrap_err();
        assert!(e.to_string().contains("database_url"));
        let e = resolve(
            Some("postgres://x".into()),
            Some("kafka://x".into()),
            None,
            &f,
        )
        .unwrap_err();
        assert!(e.to_string().contains("broker_url"));
        let e = resolve(
            Some("postgres://x".into()),
            None,
            Some("Bad-Name".into()),
            &f,
        )
        .unwrap_err();
        assert!(e.to_string().contains("schema"));
        let r = resolve(
            Some("postgres://x".into()),
            Some("nats://h".into()),
            None,
            &f,
        )
        .unwrap();
        assert_eq!(r.schema.as_str(), "outbox");
        assert_eq!(
            redact("amqp://guest:secret@h:5672/%2f"),
            "amqp://guest:***@h:5672/%2f"
        );
        let r = resolve(
            Some("postgres://x".into()),
            Some("tls://h:4222".into()),
            None,
            &f,
        )
        .unwrap();
        assert_eq!(r.broker_url.as_deref(), Some("tls://h:4222"));
        assert_eq!(broker_kind("tls://h"), Some(BrokerKind::Nats));
        assert_eq!(broker_kind("NATS://h"), Some(BrokerKind::Nats));
        assert_eq!(broker_kind("amqps://h"), Some(BrokerKind::Rabbit));
        assert_eq!(broker_kind("kafka://h"), None);
        // A refused URL is shown without its secrets.
        let e = resolve(
            Some("postgres://x".into()),
            Some("kafka://u:hunter2@h?token=t0k".into()),
            None,
            &f,
        )
        .unwrap_err();
        assert!(!format!("{e:#}").contains("hunter2") && !format!("{e:#}").contains("t0k"));
    }

    #[test]
    fn security_flags_override_the_file() {
        let mut f = FileConfig::parse(
            "[nats.security]\nca_file = \"/file/ca.pem\"\nnkey_seed_file = \"/file/seed\"\n\
             [rabbitmq.tls]\ncert_file = \"/file/c.pem\"\nkey_file = \"/file/k.pem\"\n",
        )
        .unwrap();
        BrokerSecurityArgs {
            broker_ca_file: Some("/flag/ca.pem".into()),
            ..Default::default()
        }
        .apply(&mut f);
        assert_eq!(f.nats.security.ca_file, Some("/flag/ca.pem".into()));
        assert_eq!(f.nats.security.nkey_seed_file, Some("/file/seed".into()));
        assert_eq!(f.rabbitmq.tls.ca_file, Some("/flag/ca.pem".into()));
        assert_eq!(f.rabbitmq.tls.cert_file, Some("/file/c.pem".into()));
        let e = FileConfig::parse("[nats.security]\nca_fle = \"x\"\n").unwrap_err();
        assert!(e.to_string().contains("ca_fle"), "{e}");
    }
}
