//! The NATS entry of the broker registry ([`outbox_core::broker`]): schemes `nats://` and
//! `tls://` (NATS over TLS), settings sections `nats` ([`NatsConfig`], the transport) and
//! `nats_consumer` ([`NatsConsumerConfig`], the delivery source). The source inherits the
//! transport section's `security` unless its own section sets one, and uses the consumer's name
//! as its durable name unless the section sets `durable_name`. File overrides (`ca_file`,
//! `cert_file`, `key_file`, `credentials_file`, `nkey_seed_file`) replace the `security` keys.

use outbox_core::broker::{
    BoxFuture, BoxSource, BoxTransport, BrokerEntry, BrokerError, BrokerSettings, SourceOptions,
    file,
};

use crate::{NatsConfig, NatsConsumerConfig, NatsSecurity, NatsSource, NatsTransport};

/// The registry entry of NATS JetStream.
pub static BROKER: BrokerEntry = BrokerEntry {
    name: "nats",
    title: "NATS",
    schemes: &["nats", "tls"],
    sections: &[TRANSPORT_SECTION, SOURCE_SECTION],
    check,
    transport,
    source,
};

const TRANSPORT_SECTION: &str = "nats";
const SOURCE_SECTION: &str = "nats_consumer";
const FILES: &[&str] = &[
    file::CA,
    file::CERT,
    file::KEY,
    file::NATS_CREDENTIALS,
    file::NATS_NKEY_SEED,
];

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
    let raw = settings.raw_section(SOURCE_SECTION);
    let has = |key: &str| raw.and_then(|r| r.get(key)).is_some();
    if !has("security") {
        config.security = settings.section::<NatsConfig>(TRANSPORT_SECTION)?.security;
    }
    if let Some(o) = options
        && !has("durable_name")
    {
        config.durable_name.clone_from(&o.consumer);
    }
    apply_files(&mut config.security, settings);
    config
        .validate()
        .map_err(|e| BrokerError::config(SOURCE_SECTION, e.key, e.message))?;
    Ok(config)
}

fn check(settings: &BrokerSettings) -> Result<(), BrokerError> {
    transport_config(settings)?;
    source_config(settings, None).map(|_| ())
}

fn transport<'a>(
    url: &'a str,
    settings: &'a BrokerSettings,
) -> BoxFuture<'a, Result<BoxTransport, BrokerError>> {
    Box::pin(async move {
        settings.accept_files(BROKER.name, FILES)?;
        let config = transport_config(settings)?;
        NatsTransport::connect(url, config)
            .await
            .map(BoxTransport::new)
            .map_err(|e| BrokerError::connect(BROKER.title, url, e))
    })
}

fn source<'a>(
    url: &'a str,
    settings: &'a BrokerSettings,
    options: &'a SourceOptions,
) -> BoxFuture<'a, Result<BoxSource, BrokerError>> {
    Box::pin(async move {
        settings.accept_files(BROKER.name, FILES)?;
        let config = source_config(settings, Some(options))?;
        NatsSource::connect(url, config)
            .await
            .map(BoxSource::new)
            .map_err(|e| BrokerError::connect(BROKER.title, url, e))
    })
}
