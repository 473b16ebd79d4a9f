//! The NATS entry of the broker registry ([`outbox_core::broker`]): schemes `nats://` and
//! `tls://` (NATS over TLS), settings sections `nats` ([`NatsConfig`], the transport) and
//! `nats_consumer` ([`NatsConsumerConfig`], the delivery source). The source inherits the
//! transport section's `security` unless its own section sets one, and uses the consumer's name
//! as its durable name unless the section sets `durable_name`. File overrides (`ca_file`,
//! `cert_file`, `key_file`, and NATS's own [`CREDENTIALS_FILE`] and [`NKEY_SEED_FILE`]) replace
//! the `security` keys. The entry also declares the header names the transport sets itself
//! ([`RESERVED_HEADERS`](crate::RESERVED_HEADERS)) and how NATS URLs carry credentials: a lone
//! value before `@` is a token (`nats://TOKEN@host`), which the generic redaction masks.

use outbox_core::broker::{
    self, Backend, BrokerEntry, BrokerError, BrokerSettings, SourceOptions, file,
};
use outbox_core::secrets::UrlRules;

use crate::{
    NatsConfig, NatsConnectError, NatsConsumerConfig, NatsConsumerError, NatsSecurity, NatsSource,
    NatsTransport, RESERVED_HEADERS,
};

/// The registry entry of NATS JetStream.
pub static BROKER: BrokerEntry = BrokerEntry {
    name: Nats::NAME,
    title: Nats::TITLE,
    schemes: SCHEMES,
    sections: &[TRANSPORT_SECTION, SOURCE_SECTION],
    reserved_headers: RESERVED_HEADERS,
    url_rules: Nats::URL_RULES,
    check: broker::check::<Nats>,
    transport: broker::transport::<Nats>,
    source: broker::source::<Nats>,
};

/// File override kind (`BrokerSettings::set_file`) of a NATS `.creds` file: the user JWT and
/// NKey seed (the section's `security.credentials_file`).
pub const CREDENTIALS_FILE: &str = "credentials_file";

/// File override kind of a NATS user NKey seed file (the section's
/// `security.nkey_seed_file`).
pub const NKEY_SEED_FILE: &str = "nkey_seed_file";

/// `nats://` and `tls://` (NATS over TLS).
const SCHEMES: &[&str] = &["nats", "tls"];

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
            CREDENTIALS_FILE => &mut security.credentials_file,
            NKEY_SEED_FILE => &mut security.nkey_seed_file,
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
        CREDENTIALS_FILE,
        NKEY_SEED_FILE,
    ];
    /// A lone value before `@` is a token, and NATS URLs have no harmless parameters: the
    /// generic rules, which mask both, are NATS's.
    const URL_RULES: UrlRules = UrlRules {
        schemes: SCHEMES,
        lone_userinfo_is_user: false,
        shown_params: &[],
    };
    type Transport = NatsTransport;
    type Source = NatsSource;

    fn transport_config(settings: &BrokerSettings) -> Result<NatsConfig, BrokerError> {
        let mut config: NatsConfig = settings.section(TRANSPORT_SECTION)?;
        apply_files(&mut config.security, settings);
        broker::validated(TRANSPORT_SECTION, config, NatsConfig::validate)
    }

    fn source_config(
        settings: &BrokerSettings,
        options: Option<&SourceOptions>,
    ) -> Result<NatsConsumerConfig, BrokerError> {
        let inherit = |c: &mut NatsConsumerConfig, t: NatsConfig| c.security = t.security;
        let mut config =
            settings.source_section(SOURCE_SECTION, TRANSPORT_SECTION, "security", inherit)?;
        if let Some(name) = settings.consumer_name(SOURCE_SECTION, "durable_name", options) {
            name.clone_into(&mut config.durable_name);
        }
        apply_files(&mut config.security, settings);
        broker::validated(SOURCE_SECTION, config, NatsConsumerConfig::validate)
    }
}

outbox_core::impl_connect! {
    NatsTransport: NatsConfig => NatsConnectError,
    NatsSource: NatsConsumerConfig => NatsConsumerError,
}

#[cfg(test)]
mod tests {
    use outbox_core::broker::Registry;

    use super::*;

    #[test]
    fn nats_urls_are_redacted_with_a_token_masked_whole() {
        let r = Registry::new(&[&BROKER]).redactor();
        assert_eq!(r.redact("nats://s3cr3t@nats:4222"), "nats://***@nats:4222");
        assert_eq!(r.redact("TLS://s3cr3t@nats:4222"), "TLS://***@nats:4222");
        assert_eq!(
            r.redact("nats://a:pw@h1:4222,nats://tok@h2:4222,nats://h3:4222"),
            "nats://a:***@h1:4222,nats://***@h2:4222,nats://h3:4222"
        );
        assert_eq!(r.redact("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(r.secrets("nats://s3cr3t@h"), vec!["s3cr3t".to_owned()]);
        assert!(r.secrets("nats://h:4222").is_empty());
    }

    #[test]
    fn the_source_inherits_security_and_takes_the_consumers_name_unless_set() {
        let opts = SourceOptions {
            consumer: "billing".into(),
        };
        let mut settings = BrokerSettings::new()
            .with_section(
                TRANSPORT_SECTION,
                serde_json::json!({"security": {"ca_file": "/ca.pem"}}),
            )
            .with_section(SOURCE_SECTION, serde_json::json!({}));
        let c = Nats::source_config(&settings, Some(&opts)).unwrap();
        assert_eq!(c.durable_name, "billing");
        assert_eq!(c.security.ca_file.as_deref(), Some("/ca.pem".as_ref()));
        // Only checking: no consumer, the section's own (default) name.
        let c = Nats::source_config(&settings, None).unwrap();
        assert_eq!(c.durable_name, "outbox-consumer");
        settings.set_section(
            SOURCE_SECTION,
            serde_json::json!({"durable_name": "d1", "security": {}}),
        );
        let c = Nats::source_config(&settings, Some(&opts)).unwrap();
        assert_eq!(c.durable_name, "d1");
        assert_eq!(c.security.ca_file, None);
        // A refusal names the section and the key.
        settings.set_section(SOURCE_SECTION, serde_json::json!({"durable_name": "a b"}));
        let e = (BROKER.check)(&settings).unwrap_err();
        assert!(
            matches!(&e, BrokerError::Config { key, .. } if key == "nats_consumer.durable_name"),
            "{e}"
        );
    }

    #[test]
    fn the_credential_files_are_nats_own() {
        for (kind, path) in [
            (CREDENTIALS_FILE, "/secrets/x.creds"),
            (NKEY_SEED_FILE, "/secrets/seed"),
        ] {
            let mut settings = BrokerSettings::new();
            settings.set_file(kind, path.into());
            assert!(settings.accept_files(Nats::NAME, Nats::FILES).is_ok());
            for security in [
                Nats::transport_config(&settings).unwrap().security,
                Nats::source_config(&settings, None).unwrap().security,
            ] {
                let set = if kind == CREDENTIALS_FILE {
                    security.credentials_file
                } else {
                    security.nkey_seed_file
                };
                assert_eq!(set.as_deref(), Some(std::path::Path::new(path)), "{kind}");
            }
        }
    }
}
