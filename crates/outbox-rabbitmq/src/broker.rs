//! The RabbitMQ entry of the broker registry ([`outbox_core::broker`]): schemes `amqp://` and
//! `amqps://`, settings sections `rabbitmq` ([`RabbitConfig`], the transport) and
//! `rabbitmq_consumer` ([`RabbitConsumerConfig`], the delivery source). The source inherits the
//! transport section's `tls` unless its own section sets one, and consumes a queue named after
//! the consumer unless the section sets `queue`. File overrides (`ca_file`, `cert_file`,
//! `key_file`) replace the `tls` keys; NATS credential files are refused.

use outbox_core::broker::{
    BoxFuture, BoxSource, BoxTransport, BrokerEntry, BrokerError, BrokerSettings, SourceOptions,
    file,
};

use crate::tls::RabbitTls;
use crate::{RabbitConfig, RabbitConsumerConfig, RabbitSource, RabbitTransport};

/// The registry entry of RabbitMQ.
pub static BROKER: BrokerEntry = BrokerEntry {
    name: "rabbitmq",
    title: "RabbitMQ",
    schemes: &["amqp", "amqps"],
    sections: &[TRANSPORT_SECTION, SOURCE_SECTION],
    check,
    transport,
    source,
};

const TRANSPORT_SECTION: &str = "rabbitmq";
const SOURCE_SECTION: &str = "rabbitmq_consumer";
const FILES: &[&str] = &[file::CA, file::CERT, file::KEY];

fn apply_files(tls: &mut RabbitTls, settings: &BrokerSettings) {
    for (kind, path) in settings.files() {
        let target = match *kind {
            file::CA => &mut tls.ca_file,
            file::CERT => &mut tls.cert_file,
            file::KEY => &mut tls.key_file,
            _ => continue,
        };
        *target = Some(path.clone());
    }
}

fn transport_config(settings: &BrokerSettings) -> Result<RabbitConfig, BrokerError> {
    let mut config: RabbitConfig = settings.section(TRANSPORT_SECTION)?;
    apply_files(&mut config.tls, settings);
    config
        .validate()
        .map_err(|e| BrokerError::config(TRANSPORT_SECTION, e.key, e.reason))?;
    Ok(config)
}

fn source_config(
    settings: &BrokerSettings,
    options: Option<&SourceOptions>,
) -> Result<RabbitConsumerConfig, BrokerError> {
    let mut config: RabbitConsumerConfig = settings.section(SOURCE_SECTION)?;
    let raw = settings.raw_section(SOURCE_SECTION);
    let has = |key: &str| raw.and_then(|r| r.get(key)).is_some();
    if !has("tls") {
        config.tls = settings.section::<RabbitConfig>(TRANSPORT_SECTION)?.tls;
    }
    if let Some(o) = options
        && !has("queue")
    {
        config.queue.clone_from(&o.consumer);
    }
    apply_files(&mut config.tls, settings);
    config
        .validate()
        .map_err(|e| BrokerError::config(SOURCE_SECTION, e.key, e.reason))?;
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
        RabbitTransport::connect(url, config)
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
        RabbitSource::connect(url, config)
            .await
            .map(BoxSource::new)
            .map_err(|e| BrokerError::connect(BROKER.title, url, e))
    })
}
