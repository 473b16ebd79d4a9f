//! The NATS entry of the broker registry ([`outbox_core::broker`]): schemes `nats://` and
//! `tls://` (NATS over TLS), settings sections `nats` ([`NatsConfig`], the transport) and
//! `nats_consumer` ([`NatsConsumerConfig`], the delivery source). The source inherits the
//! transport section's `security` unless its own section sets one, and uses the consumer's name
//! as its durable name unless the section sets `durable_name`. File overrides (`ca_file`,
//! `cert_file`, `key_file`, `credentials_file`, `nkey_seed_file`) replace the `security` keys.

use outbox_core::broker::{
    self, Backend, BrokerEntry, BrokerError, BrokerSettings, SourceOptions, file,
};

use crate::{
    NatsConfig, NatsConnectError, NatsConsumerConfig, NatsConsumerError, NatsSecurity, NatsSource,
    NatsTransport, RESERVED_HEADERS,
};

/// The registry entry of NATS JetStream.
pub static BROKER: BrokerEntry = BrokerEntry {
    name: Nats::NAME,
    title: Nats::TITLE,
    schemes: &["nats", "tls"],
    sections: &[TRANSPORT_SECTION, SOURCE_SECTION],
    reserved_headers: RESERVED_HEADERS,
    check: broker::check::<Nats>,
    transport: broker::transport::<Nats>,
    source: broker::source::<Nats>,
};

const TRANSPORT_SECTION: &str = "nats";
const SOURCE_SECTION: &str = "nats_consumer";

/// NATS JetStream as a registry backend.
struct Nats;

fn apply_files(security: &mut NatsSecurity, settings: &BrokerSettings) {
    for (kind, path) in settings.files() {
        let target = match *kind {
            file::CA => &mut security.ca_file,
            file::CERT => &mut security.cert_file,
            file::KEY => &mut security.key_file,
            file::NATS_CREDENTIALS => &mut security.credentials_file,
            file::NATS_NKEY_SEED => &mut security.nkey_seed_file,
            _ => continue,
        };
        *target = Some(path.clone());
    }
}

impl Backend for Nats {
    const NAME: &'static str = "nats";
    const TITLE: &'static str = "NATS";
    const FILES: &'static [&'static str] = &[
        file::CA,
        file::CERT,
        file::KEY,
        file::NATS_CREDENTIALS,
        file::NATS_NKEY_SEED,
    ];
    type TransportConfig = NatsConfig;
    type SourceConfig = NatsConsumerConfig;
    type Transport = NatsTransport;
    type Source = NatsSource;
    type TransportError = NatsConnectError;
    type SourceError = NatsConsumerError;

    fn transport_config(settings: &BrokerSettings) -> Result<NatsConfig, BrokerError> {
        let mut config: NatsConfig = settings.section(TRANSPORT_SECTION)?;
        apply_files(&mut config.security, settings);
        config
            .validate()
            .map_err(|e| BrokerError::config(TRANSPORT_SECTION, e.key, e.message))?;
        Ok(config)
    }

    fn source_config(
        settings: &BrokerSettings,
        options: Option<&SourceOptions>,
    ) -> Result<NatsConsumerConfig, BrokerError> {
        let mut config: NatsConsumerConfig = settings.section(SOURCE_SECTION)?;
        if !settings.sets(SOURCE_SECTION, "security") {
            config.security = settings.section::<NatsConfig>(TRANSPORT_SECTION)?.security;
        }
        if let Some(o) = options
            && !settings.sets(SOURCE_SECTION, "durable_name")
        {
            config.durable_name.clone_from(&o.consumer);
        }
        apply_files(&mut config.security, settings);
        config
            .validate()
            .map_err(|e| BrokerError::config(SOURCE_SECTION, e.key, e.message))?;
        Ok(config)
    }

    async fn connect_transport(
        url: &str,
        config: NatsConfig,
    ) -> Result<NatsTransport, NatsConnectError> {
        NatsTransport::connect(url, config).await
    }

    async fn connect_source(
        url: &str,
        config: NatsConsumerConfig,
    ) -> Result<NatsSource, NatsConsumerError> {
        NatsSource::connect(url, config).await
    }
}
