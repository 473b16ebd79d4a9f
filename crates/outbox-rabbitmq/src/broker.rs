//! The RabbitMQ entry of the broker registry ([`outbox_core::broker`]): schemes `amqp://` and
//! `amqps://`, settings sections `rabbitmq` ([`RabbitConfig`], the transport) and
//! `rabbitmq_consumer` ([`RabbitConsumerConfig`], the delivery source). The source inherits the
//! transport section's `tls` unless its own section sets one, and consumes a queue named after
//! the consumer unless the section sets `queue`. File overrides (`ca_file`, `cert_file`,
//! `key_file`) replace the `tls` keys; any other file kind (another broker's credentials file)
//! is refused.
//!
//! The entry also declares the header names the transport sets itself
//! ([`RESERVED_HEADERS`](crate::RESERVED_HEADERS)) and how AMQP URIs carry credentials
//! ([`URL_RULES`]).

use outbox_core::broker::{
    self, Backend, BrokerEntry, BrokerError, BrokerSettings, SourceOptions, file,
};
use outbox_core::secrets::UrlRules;

use crate::connection::RabbitTls;
use crate::{
    RESERVED_HEADERS, RabbitConfig, RabbitConnectError, RabbitConsumerConfig, RabbitSource,
    RabbitTransport,
};

/// The registry entry of RabbitMQ.
pub static BROKER: BrokerEntry = BrokerEntry {
    name: Rabbit::NAME,
    title: Rabbit::TITLE,
    schemes: SCHEMES,
    sections: &[TRANSPORT_SECTION, SOURCE_SECTION],
    reserved_headers: RESERVED_HEADERS,
    url_rules: URL_RULES,
    check: broker::check::<Rabbit>,
    transport: broker::transport::<Rabbit>,
    source: broker::source::<Rabbit>,
};

/// `amqp://` and `amqps://` (AMQP over TLS).
const SCHEMES: &[&str] = &["amqp", "amqps"];

/// How an AMQP URI carries credentials: `amqp://user:password@host/vhost`, where a lone value
/// before `@` is the user name (shown; the password then defaults); the URI's query parameters
/// are connection settings that are never secret (`heartbeat`, `channel_max`, `frame_max`,
/// `connection_timeout`, `auth_mechanism`), shown. Any other parameter's value is masked.
pub const URL_RULES: UrlRules = UrlRules {
    schemes: SCHEMES,
    lone_userinfo_is_user: true,
    shown_params: &[
        "auth_mechanism",
        "channel_max",
        "connection_timeout",
        "frame_max",
        "heartbeat",
    ],
};

const TRANSPORT_SECTION: &str = "rabbitmq";
const SOURCE_SECTION: &str = "rabbitmq_consumer";

/// RabbitMQ as a registry backend.
struct Rabbit;

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

impl Backend for Rabbit {
    const NAME: &'static str = "rabbitmq";
    const TITLE: &'static str = "RabbitMQ";
    const FILES: &'static [&'static str] = &[file::CA, file::CERT, file::KEY];
    const URL_RULES: UrlRules = URL_RULES;
    type Transport = RabbitTransport;
    type Source = RabbitSource;

    fn transport_config(settings: &BrokerSettings) -> Result<RabbitConfig, BrokerError> {
        let mut config: RabbitConfig = settings.section(TRANSPORT_SECTION)?;
        apply_files(&mut config.tls, settings);
        broker::validated(TRANSPORT_SECTION, config, RabbitConfig::validate)
    }

    fn source_config(
        settings: &BrokerSettings,
        options: Option<&SourceOptions>,
    ) -> Result<RabbitConsumerConfig, BrokerError> {
        let inherit = |c: &mut RabbitConsumerConfig, t: RabbitConfig| c.tls = t.tls;
        let mut config =
            settings.source_section(SOURCE_SECTION, TRANSPORT_SECTION, "tls", inherit)?;
        if let Some(name) = settings.consumer_name(SOURCE_SECTION, "queue", options) {
            name.clone_into(&mut config.queue);
        }
        apply_files(&mut config.tls, settings);
        broker::validated(SOURCE_SECTION, config, RabbitConsumerConfig::validate)
    }
}

outbox_core::impl_connect! {
    RabbitTransport: RabbitConfig => RabbitConnectError,
    RabbitSource: RabbitConsumerConfig => RabbitConnectError,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_rabbitmq_has_no_use_for_is_refused_before_connecting() {
        let mut settings = BrokerSettings::new();
        // A kind another broker defines (a credentials file of its protocol).
        settings.set_file("credentials_file", "/secrets/x.creds".into());
        let opts = SourceOptions {
            consumer: "reporting".into(),
        };
        for e in [
            (BROKER.transport)("amqp://127.0.0.1:1/%2f", &settings)
                .await
                .unwrap_err(),
            (BROKER.source)("amqp://127.0.0.1:1/%2f", &settings, &opts)
                .await
                .unwrap_err(),
        ] {
            assert!(
                matches!(&e, BrokerError::Config { reason, .. } if reason.contains("rabbitmq does not use")),
                "{e:?}"
            );
        }
    }

    #[test]
    fn amqp_uris_show_the_user_and_the_connection_settings() {
        let r = outbox_core::broker::Registry::new(&[&BROKER]).redactor();
        assert_eq!(
            r.redact("amqps://guest:gu%40st@mq/%2f"),
            "amqps://guest:***@mq/%2f"
        );
        assert_eq!(r.redact("amqp://guest@mq/%2f"), "amqp://guest@mq/%2f");
        assert_eq!(
            r.redact("AMQP://u@h/%2f?heartbeat=10&password=pw&frame_max=8192"),
            "AMQP://u@h/%2f?heartbeat=10&password=***&frame_max=8192"
        );
        let secrets = r.secrets("amqp://u:p%40ss@h/%2f?password=q%20w&heartbeat=10");
        for want in ["p%40ss", "p@ss", "q%20w", "q w"] {
            assert!(secrets.contains(&want.to_owned()), "{want} missing");
        }
        assert!(!secrets.contains(&"10".to_owned()), "{secrets:?}");
        assert!(r.secrets("amqp://guest@mq/%2f").is_empty());
        // The same rules redact the registry's connect errors.
        assert_eq!(Rabbit::URL_RULES, BROKER.url_rules);
    }

    #[test]
    fn the_source_inherits_tls_and_takes_the_consumers_name_unless_set() {
        let opts = SourceOptions {
            consumer: "reporting".into(),
        };
        let mut settings = BrokerSettings::new()
            .with_section(
                TRANSPORT_SECTION,
                serde_json::json!({"tls": {"ca_file": "/ca.pem"}}),
            )
            .with_section(SOURCE_SECTION, serde_json::json!({}));
        let c = Rabbit::source_config(&settings, Some(&opts)).unwrap();
        assert_eq!(c.queue, "reporting");
        assert_eq!(c.tls.ca_file.as_deref(), Some("/ca.pem".as_ref()));
        settings.set_section(
            SOURCE_SECTION,
            serde_json::json!({"queue": "q1", "tls": {}}),
        );
        let c = Rabbit::source_config(&settings, Some(&opts)).unwrap();
        assert_eq!(c.queue, "q1");
        assert_eq!(c.tls.ca_file, None);
        // A file override replaces the section's key, and is validated with it.
        settings.set_file(file::CERT, "/client.pem".into());
        let e = (BROKER.check)(&settings).unwrap_err();
        assert!(
            e.to_string().contains("key_file"),
            "a cert without its key: {e}"
        );
        settings.set_file(file::KEY, "/client.key".into());
        let c = Rabbit::source_config(&settings, Some(&opts)).unwrap();
        assert_eq!(c.tls.cert_file.as_deref(), Some("/client.pem".as_ref()));
        assert_eq!(c.tls.key_file.as_deref(), Some("/client.key".as_ref()));
    }
}
