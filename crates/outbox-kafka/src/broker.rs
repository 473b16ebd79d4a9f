//! The Kafka entry of the broker registry ([`outbox_core::broker`]): scheme `kafka://`,
//! settings sections `kafka` ([`KafkaConfig`], the transport) and `kafka_consumer`
//! ([`KafkaConsumerConfig`], the delivery source).
//!
//! The source uses the consumer's name as its group unless its section sets `group_id`, and
//! inherits the transport section's connection security (every `security.*`, `ssl.*` and
//! `sasl.*` property) unless its own section sets it. File overrides (`ca_file`, `cert_file`,
//! `key_file`) become `ssl.ca.location`, `ssl.certificate.location` and `ssl.key.location` in
//! both, and make TLS required (`security.protocol = ssl` unless it says `sasl_ssl`).
//!
//! The entry declares the header names the CloudEvents format sets itself
//! ([`RESERVED_HEADERS`](crate::RESERVED_HEADERS)). A `kafka://` URL carries no credentials
//! (SASL is configured in the properties, and [`bootstrap_servers`](crate::bootstrap_servers)
//! refuses user info), so the generic URL redaction is Kafka's.

use outbox_core::broker::{
    self, Backend, BrokerEntry, BrokerError, BrokerSettings, SourceOptions, file,
};

use crate::config::Properties;
use crate::{
    KafkaConfig, KafkaConnectError, KafkaConsumerConfig, KafkaConsumerError, KafkaSource,
    KafkaTransport, RESERVED_HEADERS,
};

/// The registry entry of Kafka.
pub static BROKER: BrokerEntry = BrokerEntry {
    name: Kafka::NAME,
    title: Kafka::TITLE,
    schemes: &["kafka"],
    sections: &[TRANSPORT_SECTION, SOURCE_SECTION],
    reserved_headers: RESERVED_HEADERS,
    url_rules: Kafka::URL_RULES,
    check: broker::check::<Kafka>,
    transport: broker::transport::<Kafka>,
    source: broker::source::<Kafka>,
};

const TRANSPORT_SECTION: &str = "kafka";
const SOURCE_SECTION: &str = "kafka_consumer";

/// Kafka as a registry backend.
struct Kafka;

/// Whether a librdkafka property is about the connection's security (shared by the producer
/// and the consumer).
fn is_security_property(name: &str) -> bool {
    name.starts_with("security.") || name.starts_with("ssl.") || name.starts_with("sasl.")
}

/// Applies the file overrides. Like on the other brokers, a TLS file makes TLS required:
/// `security.protocol` becomes `ssl` when unset, and a plain-text protocol is refused.
fn apply_files(
    properties: &mut Properties,
    settings: &BrokerSettings,
    section: &str,
) -> Result<(), BrokerError> {
    let mut tls = false;
    for (kind, path) in settings.files() {
        let name = match *kind {
            file::CA => "ssl.ca.location",
            file::CERT => "ssl.certificate.location",
            file::KEY => "ssl.key.location",
            _ => continue,
        };
        tls = true;
        properties
            .0
            .insert(name.to_owned(), path.display().to_string());
    }
    if tls {
        match properties
            .0
            .get("security.protocol")
            .map(|p| p.to_ascii_lowercase())
        {
            None => {
                properties
                    .0
                    .insert("security.protocol".to_owned(), "ssl".to_owned());
            }
            Some(p) if p == "ssl" || p == "sasl_ssl" => {}
            Some(p) => {
                return Err(BrokerError::config(
                    section,
                    "properties",
                    format!(
                        "a CA, certificate or key file makes TLS required, but                          `security.protocol` is `{p}` (use `ssl` or `sasl_ssl`)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

impl Backend for Kafka {
    const NAME: &'static str = "kafka";
    const TITLE: &'static str = "Kafka";
    const FILES: &'static [&'static str] = &[file::CA, file::CERT, file::KEY];
    type Transport = KafkaTransport;
    type Source = KafkaSource;

    fn transport_config(settings: &BrokerSettings) -> Result<KafkaConfig, BrokerError> {
        let mut config: KafkaConfig = settings.section(TRANSPORT_SECTION)?;
        apply_files(&mut config.properties, settings, TRANSPORT_SECTION)?;
        broker::validated(TRANSPORT_SECTION, config, KafkaConfig::validate)
    }

    fn source_config(
        settings: &BrokerSettings,
        options: Option<&SourceOptions>,
    ) -> Result<KafkaConsumerConfig, BrokerError> {
        let inherit = |c: &mut KafkaConsumerConfig, t: KafkaConfig| {
            let security = t
                .properties
                .0
                .into_iter()
                .filter(|(name, _)| is_security_property(name));
            c.properties.0.extend(security);
        };
        let mut config =
            settings.source_section(SOURCE_SECTION, TRANSPORT_SECTION, "properties", inherit)?;
        if let Some(name) = settings.consumer_name(SOURCE_SECTION, "group_id", options) {
            name.clone_into(&mut config.group_id);
        }
        apply_files(&mut config.properties, settings, SOURCE_SECTION)?;
        // The registry's check runs without a consumer name: a placeholder group then stands
        // for the one the consumer will give.
        if options.is_none() && config.group_id.is_empty() {
            config.group_id = "outbox-consumer".to_owned();
        }
        broker::validated(SOURCE_SECTION, config, KafkaConsumerConfig::validate)
    }
}

outbox_core::impl_connect! {
    KafkaTransport: KafkaConfig => KafkaConnectError,
    KafkaSource: KafkaConsumerConfig => KafkaConsumerError,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> BrokerSettings {
        let value: toml::Value = toml::from_str(text).unwrap();
        let mut settings = BrokerSettings::new();
        for (name, section) in value.as_table().unwrap() {
            settings.set_section(name.clone(), serde_json::to_value(section).unwrap());
        }
        settings
    }

    #[test]
    fn the_source_takes_the_group_and_the_transports_security() {
        let s = settings(
            r#"
            [kafka.properties]
            "security.protocol" = "sasl_ssl"
            "sasl.username" = "u"
            "linger.ms" = "20"
            "#,
        );
        let options = SourceOptions {
            consumer: "reporting".into(),
        };
        let config = Kafka::source_config(&s, Some(&options)).unwrap();
        assert_eq!(config.group_id, "reporting");
        assert_eq!(config.properties.0.get("sasl.username").unwrap(), "u");
        assert!(
            !config.properties.0.contains_key("linger.ms"),
            "producer-only"
        );
        assert!(broker::check::<Kafka>(&s).is_ok());
    }

    #[test]
    fn tls_files_make_tls_required() {
        let mut s = settings("[kafka]\n");
        s.set_file(file::CA, "/ca.pem".into());
        let config = Kafka::transport_config(&s).unwrap();
        assert_eq!(config.properties.0.get("security.protocol").unwrap(), "ssl");
        assert_eq!(
            config.properties.0.get("ssl.ca.location").unwrap(),
            "/ca.pem"
        );

        let mut s = settings("[kafka.properties]\n\"security.protocol\" = \"plaintext\"\n");
        s.set_file(file::CA, "/ca.pem".into());
        let e = Kafka::transport_config(&s).unwrap_err();
        assert!(e.to_string().contains("TLS required"), "{e}");
    }

    #[test]
    fn every_header_the_cloudevents_format_sets_is_reserved() {
        let payload = outbox_core::Payload::json(&1).unwrap();
        let mut m = outbox_core::NewMessage::new("payment", "p-1", 1, "PaymentCreated", payload)
            .stored(1, chrono::Utc::now());
        let headers = crate::wire_headers(&m, "/outbox").unwrap();
        assert!(!headers.is_empty());
        for (name, _) in headers {
            assert!(BROKER.reserved_headers.reserves(&name), "{name}");
        }
        for name in ["ce_id", "CE-Type", "Content-Type"] {
            m.headers = [(name.to_owned(), "x".to_owned())].into();
            let e = crate::wire_headers(&m, "/outbox").unwrap_err();
            assert_eq!(e.kind, outbox_core::PublishErrorKind::Invalid, "{name}");
        }
        for name in ["traceparent", "id", "cex"] {
            assert!(!BROKER.reserved_headers.reserves(name), "{name}");
        }
    }
}
