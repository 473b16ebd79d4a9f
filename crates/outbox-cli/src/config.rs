//! Configuration: command-line flags, then environment, then an optional TOML file, then
//! defaults. Every error names the key that is wrong.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use outbox::Backoff;
use outbox::broker::{BrokerSettings, Registry, file};
use outbox::relay::RelayConfig;
use outbox_postgres::{OnPublish, Schema};
use serde::Deserialize;

/// The TOML file. Unknown keys are errors (a typo must not silently fall back to a default):
/// `[relay]` and `[debezium]` refuse them themselves; every other table is a broker's settings section (`[nats]`,
/// `[nats_consumer]`, `[rabbitmq]`, `[rabbitmq_consumer]` ...), checked by the broker registry
/// when the file is loaded, whatever broker the URL names.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct FileConfig {
    /// PostgreSQL URL.
    pub database_url: Option<String>,
    /// `nats://…`, `tls://…` (NATS over TLS), `amqp://…`, `amqps://…` or `kafka://…`.
    pub broker_url: Option<String>,
    /// Schema of the outbox tables.
    pub schema: Option<String>,
    /// Prometheus listen address of `outbox relay`; keep it on loopback (docs/guide/src/operations.md).
    pub metrics_addr: Option<String>,
    /// `[relay]` table.
    pub relay: RelayFile,
    /// `[debezium]` table: the Debezium-layout outbox table `outbox debezium apply` bridges.
    pub debezium: Option<outbox_postgres::debezium::DebeziumTable>,
    /// `[console]` table of `outbox console`.
    pub console: Option<ConsoleFile>,
    /// Every other key: the brokers' settings sections, by name.
    #[serde(flatten)]
    pub brokers: BTreeMap<String, serde_json::Value>,
}

/// `[console]` settings of `outbox console`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleFile {
    /// A file whose first line is the console token. It must be readable by its owner only
    /// (mode 0600 or stricter): a token in a file others can read is refused at start.
    /// `OUTBOX_CONSOLE_TOKEN`, when set, takes precedence.
    pub token_file: Option<std::path::PathBuf>,
}

impl ConsoleFile {
    /// The token from `token_file`, if one is configured.
    ///
    /// # Errors
    /// The file cannot be read, is readable by others than its owner, or holds no token.
    pub fn token(&self) -> Result<Option<String>> {
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let meta = std::fs::metadata(path)
            .with_context(|| format!("console.token_file {}", path.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = meta.permissions().mode();
            if mode & 0o077 != 0 {
                anyhow::bail!(
                    "console.token_file {} can be read by others (mode {:o}): chmod 600 it",
                    path.display(),
                    mode & 0o777
                );
            }
        }
        #[cfg(not(unix))]
        let _ = meta;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("console.token_file {}", path.display()))?;
        match text.lines().next().map(str::trim) {
            Some(t) if !t.is_empty() => Ok(Some(t.to_owned())),
            _ => anyhow::bail!("console.token_file {} holds no token", path.display()),
        }
    }
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
    /// Dead-letter an aggregate's head after this many takeovers in a row without a settle
    /// (a row that crashes the relay); 0 turns the rule off. See docs/guide/src/relay.md, "Poison rows".
    pub poison_after_takeovers: u32,
    /// The claim window (`outbox_postgres::ClaimWindow`, off by default): after a claim slower
    /// than 100 ms the next claims start past the rows it could not take, and a claim walks
    /// from the table's start again within 1 to 10 s. For a table whose front stays blocked
    /// (a paused route's large backlog); a row that becomes claimable below the start then
    /// waits up to 10 s more, plus one walk from the start. See docs/guide/src/console.md,
    /// "Pause and resume".
    pub claim_window: bool,
    pub on_publish: OnPublish,
    /// How the relay finds pending events: `polling` (claims with leases, the default) or
    /// `cdc` (a logical replication slot; see docs/guide/src/relay.md, "CDC relay").
    pub mode: RelayMode,
    /// CDC: the replication slot (default: the schema's name).
    pub cdc_slot: Option<String>,
    /// CDC: the publication (default: the schema's name).
    pub cdc_publication: Option<String>,
    /// CDC: seconds between heartbeats written into the log, so an idle outbox on a busy
    /// database does not pin WAL. 0 turns them off.
    pub cdc_heartbeat_secs: f64,
    /// CDC: the producers delete their rows in their own transactions
    /// (`PgOutbox::delete_in_transaction`); the relay then writes what it leaves to the table
    /// (dead letters and the events behind them) back into it, which needs `INSERT` on the
    /// outbox table for its role. Default false.
    pub cdc_producers_delete_rows: bool,
    /// CDC: the most streamed events the relay holds in memory; a larger transaction is
    /// streamed in parts of a quarter of it (`CdcConfig::max_rows_in_memory`). Default 10,000.
    pub cdc_max_rows_in_memory: usize,
    /// Ties the relay's leases to a live database session (`outbox_postgres::session`):
    /// another relay takes them over as soon as this relay's session ends, not when they run
    /// out. Default true; false (behind a transaction-mode pooler, which cannot hold a
    /// session's lock) leaves leases to their clock only.
    pub live_session: bool,
    /// How often the session proves itself alive and looks for relays that are gone.
    pub session_interval_ms: u64,
    /// How long after a proof of life the relay may still start publishes without the next.
    pub session_window_ms: u64,
    /// TCP keepalive, user timeout and idle-in-transaction timeout asked of the server for the
    /// relay's connections: about how long the server takes to end the session of a relay cut
    /// off by the network.
    pub session_server_timeout_secs: f64,
}

/// `relay.mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RelayMode {
    /// Claims rows with leases (any number of relays).
    #[default]
    Polling,
    /// Streams the outbox table's log through a replication slot (one relay streams, others
    /// wait as standbys).
    Cdc,
}

impl Default for RelayFile {
    fn default() -> Self {
        let d = RelayConfig::default();
        let session = outbox_postgres::session::SessionConfig::default();
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
            poison_after_takeovers: d.poison_after_takeovers,
            claim_window: false,
            stats_interval_secs: d.stats_interval.as_secs_f64(),
            on_publish: OnPublish::Delete,
            mode: RelayMode::Polling,
            cdc_slot: None,
            cdc_publication: None,
            cdc_heartbeat_secs: 10.0,
            cdc_producers_delete_rows: false,
            cdc_max_rows_in_memory: outbox_postgres::cdc::CdcConfig::default().max_rows_in_memory,
            live_session: true,
            session_interval_ms: session.interval.as_millis() as u64,
            session_window_ms: session.window.as_millis() as u64,
            session_server_timeout_secs: session.server_timeout.as_secs_f64(),
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
    /// The CDC stream's settings.
    ///
    /// # Errors
    /// `relay.cdc_max_rows_in_memory` below 4 (a part of a transaction is a quarter of it).
    pub fn cdc_config(&self) -> Result<outbox_postgres::cdc::CdcConfig> {
        if self.cdc_max_rows_in_memory < 4 {
            bail!(
                "invalid configuration `relay.cdc_max_rows_in_memory`: must be at least 4, got {}",
                self.cdc_max_rows_in_memory
            );
        }
        Ok(outbox_postgres::cdc::CdcConfig {
            slot: self.cdc_slot.clone(),
            publication: self.cdc_publication.clone(),
            producers_delete_rows: self.cdc_producers_delete_rows,
            max_rows_in_memory: self.cdc_max_rows_in_memory,
            ..outbox_postgres::cdc::CdcConfig::default()
        })
    }

    /// The live session's settings, `None` when `relay.live_session` is off.
    ///
    /// # Errors
    /// An invalid `relay.session_*` value, naming the key.
    pub fn session_config(&self) -> Result<Option<outbox_postgres::session::SessionConfig>> {
        let c = outbox_postgres::session::SessionConfig {
            interval: Duration::from_millis(self.session_interval_ms),
            window: Duration::from_millis(self.session_window_ms),
            server_timeout: secs(
                "session_server_timeout_secs",
                self.session_server_timeout_secs,
            )?,
        };
        c.validate().map_err(|e| {
            let key = match e.key {
                "interval" => "session_interval_ms",
                "window" => "session_window_ms",
                _ => "session_server_timeout_secs",
            };
            anyhow::anyhow!("invalid configuration `relay.{key}`: {}", e.reason)
        })?;
        Ok(self.live_session.then_some(c))
    }

    /// The heartbeat interval, `None` when off.
    pub fn cdc_heartbeat(&self) -> Result<Option<Duration>> {
        let d = secs("cdc_heartbeat_secs", self.cdc_heartbeat_secs)?;
        Ok((!d.is_zero()).then_some(d))
    }

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
            poison_after_takeovers: self.poison_after_takeovers,
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
    /// Reads and parses a TOML file, and has `brokers` check its broker sections.
    pub fn load(path: &Path, brokers: &Registry) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::parse(&text, brokers)
            .with_context(|| format!("invalid config file {}", path.display()))
    }

    /// Parses TOML text and has `brokers` check its broker sections.
    pub fn parse(text: &str, brokers: &Registry) -> Result<Self> {
        let file: Self = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        brokers.check(&file.sections())?;
        Ok(file)
    }

    /// The broker sections, without file overrides.
    fn sections(&self) -> BrokerSettings {
        let mut s = BrokerSettings::new();
        for (name, value) in &self.brokers {
            s.set_section(name.clone(), value.clone());
        }
        s
    }

    /// The broker settings: the file's sections, with the command line's TLS and credential
    /// files over them.
    pub fn broker_settings(&self, flags: &BrokerSecurityArgs) -> BrokerSettings {
        let mut s = self.sections();
        for (kind, path) in [
            (file::CA, &flags.broker_ca_file),
            (file::CERT, &flags.broker_cert_file),
            (file::KEY, &flags.broker_key_file),
            (outbox::nats::CREDENTIALS_FILE, &flags.nats_credentials_file),
            (outbox::nats::NKEY_SEED_FILE, &flags.nats_nkey_file),
        ] {
            if let Some(p) = path {
                s.set_file(kind, p.clone());
            }
        }
        s
    }
}

/// Resolved connection settings.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub database_url: String,
    pub broker_url: Option<String>,
    pub schema: Schema,
}

/// Applies precedence: flag/`OUTBOX_*` env (clap), then `DATABASE_URL`, then the file. A
/// broker URL must name a scheme of `brokers`.
pub fn resolve(
    flag_db: Option<String>,
    flag_broker: Option<String>,
    flag_schema: Option<String>,
    file: &FileConfig,
    brokers: &Registry,
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
    if let Some(b) = &broker_url {
        brokers
            .find(b)
            .map_err(|e| anyhow::anyhow!("invalid configuration `broker_url`: {e}"))?;
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

/// A URL with every secret masked, for messages: the one redaction of the toolkit, with the URL
/// rules of every backend of the binary ([`outbox::secrets::redact_url`]).
pub fn redact(url: &str) -> String {
    outbox::secrets::redact_url(url)
}

/// TLS and authentication of the broker connection. Each flag (or its environment variable)
/// overrides the broker section's key (`[nats.security]` for NATS, `[rabbitmq.tls]` for
/// RabbitMQ); a broker that has no use for a file refuses it.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FileConfig> {
        FileConfig::parse(text, &outbox::brokers())
    }

    /// The guide's example of every setting (docs/guide/src/configuration.md) is a file this
    /// binary loads, and its relay settings make a valid relay configuration.
    #[test]
    fn the_guides_example_of_every_setting_loads() {
        let guide = include_str!("../../../docs/guide/src/configuration.md");
        let example = guide
            .split_once("```toml\n")
            .and_then(|(_, rest)| rest.split_once("```"))
            .map(|(toml, _)| toml)
            .expect("the guide's TOML example");
        let f = parse(example).unwrap_or_else(|e| panic!("the guide's example: {e:#}"));
        f.relay
            .to_relay_config()
            .expect("the example's relay settings");
        assert!(
            f.console.and_then(|c| c.token_file).is_some(),
            "the example's [console]"
        );
    }

    #[test]
    fn unknown_and_bad_keys_are_named() {
        for (text, key) in [
            ("[relay]\nbatch_sise = 5\n", "batch_sise"),
            ("[relay]\nbatch_size = \"many\"\n", "batch_size"),
            ("[nats]\nstreem = \"X\"\n", "streem"),
            ("[rabbitmq]\nexchnage = \"x\"\n", "exchnage"),
            ("[nats.security]\nca_fle = \"x\"\n", "ca_fle"),
            ("[natz]\nstream = \"X\"\n", "natz"),
            ("broker_ur = \"nats://h\"\n", "broker_ur"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(format!("{e:#}").contains(key), "{key}: {e:#}");
        }
        let f = parse("[relay]\nbatch_size = 0\n").unwrap();
        let e = f.relay.to_relay_config().unwrap_err();
        assert!(e.to_string().contains("relay.batch_size"), "{e}");
        let f = parse("[relay]\ncdc_max_rows_in_memory = 3\n").unwrap();
        let e = f.relay.cdc_config().unwrap_err();
        assert!(
            e.to_string().contains("relay.cdc_max_rows_in_memory"),
            "{e}"
        );
        let f = parse("[relay]\nlease_secs = 1\n").unwrap();
        let e = f.relay.to_relay_config().unwrap_err();
        assert!(e.to_string().contains("relay.lease"), "{e}");
    }

    #[test]
    fn resolve_checks_urls_and_schema() {
        let f = FileConfig::default();
        let b = outbox::brokers();
        let e = resolve(Some("mysql://x".into()), None, None, &f, &b).unwrap_err();
        assert!(e.to_string().contains("database_url"));
        let e = resolve(
            Some("postgres://x".into()),
            Some("foo://x".into()),
            None,
            &f,
            &b,
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("broker_url") && text.contains("foo"),
            "{text}"
        );
        for scheme in ["nats://", "tls://", "amqp://", "amqps://", "kafka://"] {
            assert!(text.contains(scheme), "{text}");
        }
        let e = resolve(
            Some("postgres://x".into()),
            None,
            Some("Bad-Name".into()),
            &f,
            &b,
        )
        .unwrap_err();
        assert!(e.to_string().contains("schema"));
        let r = resolve(
            Some("postgres://x".into()),
            Some("NATS://h".into()),
            None,
            &f,
            &b,
        )
        .unwrap();
        assert_eq!(r.schema.as_str(), "outbox");
        assert_eq!(
            redact("amqp://guest:secret@h:5672/%2f"),
            "amqp://guest:***@h:5672/%2f"
        );
        // A refused URL is shown without its secrets.
        let e = resolve(
            Some("postgres://x".into()),
            Some("pulsar://u:hunter2@h?token=t0k".into()),
            None,
            &f,
            &b,
        )
        .unwrap_err();
        assert!(!format!("{e:#}").contains("hunter2") && !format!("{e:#}").contains("t0k"));
    }

    #[test]
    fn security_flags_override_the_file() {
        let f = parse(
            "[nats.security]\nca_file = \"/file/ca.pem\"\nnkey_seed_file = \"/file/seed\"\n\
             [rabbitmq.tls]\ncert_file = \"/file/c.pem\"\nkey_file = \"/file/k.pem\"\n",
        )
        .unwrap();
        let settings = f.broker_settings(&BrokerSecurityArgs {
            broker_ca_file: Some("/flag/ca.pem".into()),
            ..Default::default()
        });
        assert_eq!(
            settings.file(file::CA),
            Some(&PathBuf::from("/flag/ca.pem"))
        );
        let nats: outbox_nats::NatsConfig = settings.section("nats").unwrap();
        assert_eq!(nats.security.nkey_seed_file, Some("/file/seed".into()));
        let rabbit: outbox_rabbitmq::RabbitConfig = settings.section("rabbitmq").unwrap();
        assert_eq!(rabbit.tls.cert_file, Some("/file/c.pem".into()));
    }
}
