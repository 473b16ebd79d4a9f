//! Brokers chosen at runtime by URL scheme: the [`Registry`] of [`BrokerEntry`]s and the
//! type-erased transport and delivery source it hands out.
//!
//! Each transport crate exports one `BrokerEntry` (`outbox_<broker>::BROKER`, naming the URL
//! schemes it serves); the facade crate `outbox` lists the entries of the transports it was built
//! with (`outbox::brokers()`), and the CLI, the benchmarks and the tests connect through that
//! one registry. Adding a transport is one crate plus one registry line. An unknown scheme is
//! [`BrokerError::UnknownScheme`] and a URL without one [`BrokerError::NoScheme`], both naming
//! the supported ones.
//!
//! Settings travel as named sections ([`BrokerSettings`]): an entry reads its own sections
//! (typically one named after the broker for the transport and one for the delivery source)
//! and refuses unknown keys in them, so a typo in any section is reported at startup, whatever
//! broker the URL names. The source's section inherits the connection's security from the
//! transport's unless it sets its own, and names the source after the consumer unless it
//! names it itself ([`BrokerSettings::source_section`], [`BrokerSettings::consumer_name`]).
//! TLS and credential files given on the command line ([`BrokerSettings::set_file`]) override
//! the sections' own keys; an entry refuses a file kind it has no use for.
//!
//! What the rest of the toolkit must know of a broker without connecting to it comes from its
//! entry too, so that the core holds no broker's names: the header names its wire binding sets
//! itself ([`BrokerEntry::reserved_headers`], which producers must not use; their union over a
//! build is [`Registry::reserved_headers`]) and how its URLs carry credentials
//! ([`BrokerEntry::url_rules`], for redaction; [`Registry::redactor`]).
//!
//! The erased types ([`BoxTransport`], [`BoxSource`], [`BoxDelivery`]) implement the same
//! traits as the concrete ones, so the engines run on them unchanged; the cost is one boxed
//! future per publish or delivery operation.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;

use crate::consumer::DeliverySource;
use crate::error::ConfigError;
use crate::message::ReservedHeaders;
use crate::secrets::{Redactor, UrlRules};
use crate::transport::Transport;

mod erased;

pub use erased::{BoxDelivery, BoxFuture, BoxSource, BoxStream, BoxTransport};

/// Why a broker could not be chosen, configured or reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The URL has no `scheme://` (empty, or a typo such as `scheme//host`).
    #[error(
        "broker URL `{url}` has no scheme: write `<scheme>://host:port` with one of {supported}"
    )]
    NoScheme {
        /// The URL as given, redacted (empty when none was).
        url: String,
        /// The supported schemes, as [`Registry::supported`] lists them.
        supported: String,
    },
    /// No registered broker serves the URL's scheme.
    #[error("unsupported broker URL scheme `{scheme}`: this build supports {supported}")]
    UnknownScheme {
        /// The scheme found (`foo`), or the whole (redacted) URL when it has none.
        scheme: String,
        /// The supported schemes, as [`Registry::supported`] lists them.
        supported: String,
    },
    /// A settings section no registered broker owns (a typo, or a transport not in this build).
    #[error("unknown configuration section `{name}`: known broker sections are {known}")]
    UnknownSection {
        /// The section.
        name: String,
        /// The sections the registered brokers read.
        known: String,
    },
    /// A setting is invalid; `key` is `section.key`.
    #[error("invalid configuration `{key}`: {reason}")]
    Config {
        /// The key, e.g. `<section>.stream`.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The broker could not be reached or refused the set-up.
    #[error("cannot connect to {broker} at {address}: {reason}")]
    Connect {
        /// The broker's title ([`BrokerEntry::title`]).
        broker: &'static str,
        /// The URL, redacted.
        address: String,
        /// What went wrong.
        reason: String,
    },
}

impl BrokerError {
    /// A [`BrokerError::Config`] for `key` of `section`.
    pub fn config(section: &str, key: &str, reason: impl std::fmt::Display) -> Self {
        Self::Config {
            key: format!("{section}.{key}"),
            reason: reason.to_string(),
        }
    }

    /// A [`BrokerError::Config`] for a configuration's refusal, `error` naming the key in
    /// `section`.
    pub fn from_config(section: &str, error: ConfigError) -> Self {
        Self::config(section, error.key, error.reason)
    }

    /// A [`BrokerError::Connect`] for `broker` (its title) at `url`, redacted here by the
    /// generic rules ([`crate::secrets::redact_url`]).
    pub fn connect(broker: &'static str, url: &str, reason: impl std::fmt::Display) -> Self {
        Self::connect_redacted(broker, crate::secrets::redact_url(url), reason)
    }

    /// A [`BrokerError::Connect`] for `broker` (its title) at `address`, which the caller
    /// redacted (with its broker's [`UrlRules`]).
    pub fn connect_redacted(
        broker: &'static str,
        address: String,
        reason: impl std::fmt::Display,
    ) -> Self {
        Self::Connect {
            broker,
            address,
            reason: reason.to_string(),
        }
    }
}

/// The TLS files every TLS-speaking broker understands, which override a broker section's own
/// keys. A broker with files of its own (a credentials file its protocol defines) exports
/// their kinds as constants of its crate and lists them in its [`Backend::FILES`];
/// [`BrokerSettings::set_file`] takes any kind, and an entry refuses the kinds it does not
/// list.
pub mod file {
    /// PEM certificate authorities trusted for the broker's certificate.
    pub const CA: &str = "ca_file";
    /// PEM client certificate for mutual TLS.
    pub const CERT: &str = "cert_file";
    /// PEM private key of the client certificate.
    pub const KEY: &str = "key_file";
}

/// The settings brokers read: named sections (each a table of keys, as parsed from the
/// configuration file) and file overrides from the command line.
#[derive(Debug, Clone, Default)]
pub struct BrokerSettings {
    sections: BTreeMap<String, serde_json::Value>,
    files: BTreeMap<&'static str, PathBuf>,
}

impl BrokerSettings {
    /// No sections, no files: every broker's defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets section `name` (a JSON object of keys), replacing an earlier one.
    pub fn set_section(&mut self, name: impl Into<String>, value: serde_json::Value) {
        self.sections.insert(name.into(), value);
    }

    /// [`BrokerSettings::set_section`], by value.
    pub fn with_section(mut self, name: impl Into<String>, value: serde_json::Value) -> Self {
        self.set_section(name, value);
        self
    }

    /// Sets a file override: `kind` is one of [`mod@file`] or a kind a broker crate exports.
    pub fn set_file(&mut self, kind: &'static str, path: PathBuf) {
        self.files.insert(kind, path);
    }

    /// The section names present.
    pub fn section_names(&self) -> impl Iterator<Item = &str> {
        self.sections.keys().map(String::as_str)
    }

    /// The raw section `name`, if present.
    pub fn raw_section(&self, name: &str) -> Option<&serde_json::Value> {
        self.sections.get(name)
    }

    /// Section `name` as `T` (its defaults when the section is absent).
    ///
    /// # Errors
    /// [`BrokerError::Config`] naming `name.key` for an unknown key or a value of the wrong type
    /// (`T` should refuse unknown fields).
    pub fn section<T: serde::de::DeserializeOwned + Default>(
        &self,
        name: &str,
    ) -> Result<T, BrokerError> {
        match self.sections.get(name) {
            None => Ok(T::default()),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| BrokerError::Config {
                key: name.to_owned(),
                reason: e.to_string(),
            }),
        }
    }

    /// Whether section `section` sets `key` itself (for settings a delivery source inherits
    /// from the transport's section, or derives from the consumer's name, unless it sets them).
    pub fn sets(&self, section: &str, key: &str) -> bool {
        self.sections
            .get(section)
            .and_then(|s| s.get(key))
            .is_some()
    }

    /// A delivery source's section `source` as `S` (its defaults when absent), inheriting `key`
    /// from the transport's section `transport` unless `source` sets it itself: then `inherit`
    /// takes it from that section as `T`. What the source inherits is the connection's
    /// security (TLS, authentication), so that one setting serves both sides.
    ///
    /// # Errors
    /// [`BrokerError::Config`] naming the section that does not read as its type (`source`
    /// first), as [`BrokerSettings::section`].
    pub fn source_section<S, T>(
        &self,
        source: &str,
        transport: &str,
        key: &str,
        inherit: impl FnOnce(&mut S, T),
    ) -> Result<S, BrokerError>
    where
        S: serde::de::DeserializeOwned + Default,
        T: serde::de::DeserializeOwned + Default,
    {
        let mut config = self.section(source)?;
        if !self.sets(source, key) {
            inherit(&mut config, self.section(transport)?);
        }
        Ok(config)
    }

    /// The consumer's name, as the default of a delivery source's setting `key` (its durable
    /// consumer, group or queue): `Some` when connecting a consumer (`options` given, `None`
    /// when only checking) whose section `section` does not set `key` itself.
    pub fn consumer_name<'a>(
        &self,
        section: &str,
        key: &str,
        options: Option<&'a SourceOptions>,
    ) -> Option<&'a str> {
        options
            .filter(|_| !self.sets(section, key))
            .map(|o| o.consumer.as_str())
    }

    /// The file overrides, by kind.
    pub fn files(&self) -> &BTreeMap<&'static str, PathBuf> {
        &self.files
    }

    /// The override of `kind`, if given.
    pub fn file(&self, kind: &str) -> Option<&PathBuf> {
        self.files.get(kind)
    }

    /// Refuses file overrides other than `accepted` (a broker that has no use for them), naming
    /// the broker.
    ///
    /// # Errors
    /// [`BrokerError::Config`] for the first file kind `broker` does not accept.
    pub fn accept_files(&self, broker: &str, accepted: &[&str]) -> Result<(), BrokerError> {
        match self.files.keys().find(|k| !accepted.contains(k)) {
            None => Ok(()),
            Some(k) => Err(BrokerError::config(
                broker,
                k,
                format!("{broker} does not use a {k}"),
            )),
        }
    }
}

/// What a consumer asks of a delivery source besides the settings sections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceOptions {
    /// The consumer's name: the default durable consumer / queue name when the section does not
    /// set one.
    pub consumer: String,
}

/// `config` of `section`, once `validate` accepts it: the last step of
/// [`Backend::transport_config`] and [`Backend::source_config`].
///
/// # Errors
/// `validate`'s [`ConfigError`] as the [`BrokerError::Config`] of its key in `section`
/// ([`BrokerError::from_config`]).
pub fn validated<T>(
    section: &str,
    config: T,
    validate: impl FnOnce(&T) -> Result<(), ConfigError>,
) -> Result<T, BrokerError> {
    validate(&config).map_err(|e| BrokerError::from_config(section, e))?;
    Ok(config)
}

/// How a transport or a delivery source connects, from a URL and its configuration: what a
/// [`Backend`]'s connectors call ([`Backend::connect_transport`],
/// [`Backend::connect_source`]). A type that connects with an inherent `connect` of this
/// signature implements it with [`impl_connect!`](crate::impl_connect).
pub trait Connect: Sized {
    /// Its configuration, as [`Backend::transport_config`] or [`Backend::source_config`]
    /// builds it.
    type Config: Send;
    /// Why it could not connect (unreachable, refused, set-up failed), which the registry
    /// reports as [`BrokerError::Connect`].
    type Error: std::fmt::Display;

    /// Connects to `url` with `config`.
    ///
    /// # Errors
    /// [`Connect::Error`].
    fn connect(
        url: &str,
        config: Self::Config,
    ) -> impl Future<Output = Result<Self, Self::Error>> + Send;
}

/// Implements [`Connect`](crate::broker::Connect) for transports and delivery sources that
/// connect with an inherent `async fn connect(url: &str, config: Config) -> Result<Self, Error>`,
/// as the toolkit's own do: `Type: Config => Error`, one a line.
///
/// ```ignore
/// outbox_core::impl_connect! {
///     AcmeTransport: AcmeConfig => AcmeConnectError,
///     AcmeSource: AcmeConsumerConfig => AcmeConsumerError,
/// }
/// ```
#[macro_export]
macro_rules! impl_connect {
    ($($ty:ty: $config:ty => $error:ty),+ $(,)?) => {$(
        impl $crate::broker::Connect for $ty {
            type Config = $config;
            type Error = $error;

            async fn connect(url: &str, config: $config) -> Result<Self, $error> {
                // The inherent `connect`, which takes precedence over this one.
                <$ty>::connect(url, config).await
            }
        }
    )+};
}

/// Connects a transport: `(url, settings)`.
pub type TransportConnector =
    for<'a> fn(&'a str, &'a BrokerSettings) -> BoxFuture<'a, Result<BoxTransport, BrokerError>>;

/// Connects a delivery source: `(url, settings, options)`.
pub type SourceConnector = for<'a> fn(
    &'a str,
    &'a BrokerSettings,
    &'a SourceOptions,
) -> BoxFuture<'a, Result<BoxSource, BrokerError>>;

/// One broker of the registry, exported by its transport crate.
#[derive(Debug)]
pub struct BrokerEntry {
    /// The broker's short name, lower case ([`Backend::NAME`]).
    pub name: &'static str,
    /// The name in messages ([`Backend::TITLE`]).
    pub title: &'static str,
    /// URL schemes it serves, lower case, without `://`.
    pub schemes: &'static [&'static str],
    /// The settings sections it reads (and owns).
    pub sections: &'static [&'static str],
    /// The header names its wire binding sets itself (its attribute prefix, its own protocol
    /// headers): its transport refuses a message that carries one as a user header, and a
    /// producer that may publish to this broker refuses them at enqueue
    /// ([`Registry::reserved_headers`]).
    pub reserved_headers: ReservedHeaders,
    /// How its URLs carry credentials beyond the generic rules ([`Backend::URL_RULES`]).
    pub url_rules: UrlRules,
    /// Checks its sections and the file overrides without connecting.
    pub check: fn(&BrokerSettings) -> Result<(), BrokerError>,
    /// Connects its transport.
    pub transport: TransportConnector,
    /// Connects its delivery source.
    pub source: SourceConnector,
}

/// A transport crate's side of its [`BrokerEntry`]: its transport and its delivery source
/// (each [`Connect`]ing from its configuration), and how the settings become their two
/// configurations. The entry's functions are then [`check`], [`transport`] and [`source`]
/// instantiated for it, which do what every broker does the same way: refuse file overrides
/// outside [`Backend::FILES`], check both sections, connect, and report a connect error as
/// [`BrokerError::Connect`] with the URL redacted by [`Backend::URL_RULES`].
///
/// A backend builds each configuration the same way: its section (the source's with
/// [`BrokerSettings::source_section`], inheriting the connection's security, and
/// [`BrokerSettings::consumer_name`] for the name of its durable consumer, group or queue),
/// the file overrides applied to its own keys, then [`validated`].
///
/// The entry of a made-up broker, "Acme MQ", whose binding writes `acme-*` headers and whose
/// URLs may name a user alone:
///
/// ```ignore
/// pub static BROKER: BrokerEntry = BrokerEntry {
///     name: Acme::NAME,
///     title: Acme::TITLE,
///     schemes: &["acme", "acmes"],
///     sections: &["acme", "acme_consumer"],
///     reserved_headers: ReservedHeaders { prefixes: &["acme-"], names: &[] },
///     url_rules: Acme::URL_RULES,
///     check: broker::check::<Acme>,
///     transport: broker::transport::<Acme>,
///     source: broker::source::<Acme>,
/// };
///
/// impl Backend for Acme {
///     const NAME: &'static str = "acme";
///     const TITLE: &'static str = "Acme MQ";
///     const FILES: &'static [&'static str] = &[file::CA, CREDENTIALS_FILE];
///     const URL_RULES: UrlRules = UrlRules {
///         schemes: &["acme", "acmes"],
///         lone_userinfo_is_user: true,
///         shown_params: &["heartbeat"],
///     };
///     type Transport = AcmeTransport;
///     type Source = AcmeSource;
///
///     fn transport_config(settings: &BrokerSettings) -> Result<AcmeConfig, BrokerError> {
///         let mut config: AcmeConfig = settings.section("acme")?;
///         apply_files(&mut config.tls, settings);
///         broker::validated("acme", config, AcmeConfig::validate)
///     }
///
///     fn source_config(
///         settings: &BrokerSettings,
///         options: Option<&SourceOptions>,
///     ) -> Result<AcmeConsumerConfig, BrokerError> {
///         let inherit = |c: &mut AcmeConsumerConfig, t: AcmeConfig| c.tls = t.tls;
///         let mut config = settings.source_section("acme_consumer", "acme", "tls", inherit)?;
///         if let Some(name) = settings.consumer_name("acme_consumer", "queue", options) {
///             name.clone_into(&mut config.queue);
///         }
///         apply_files(&mut config.tls, settings);
///         broker::validated("acme_consumer", config, AcmeConsumerConfig::validate)
///     }
/// }
///
/// /// The file overrides, over the TLS keys of either side.
/// fn apply_files(tls: &mut AcmeTls, settings: &BrokerSettings) { /* ... */ }
///
/// // Both sides connect with their own `connect(url, config)`.
/// outbox_core::impl_connect! {
///     AcmeTransport: AcmeConfig => AcmeConnectError,
///     AcmeSource: AcmeConsumerConfig => AcmeConsumerError,
/// }
/// ```
pub trait Backend: 'static {
    /// The broker's short name, lower case, as [`BrokerEntry::name`].
    const NAME: &'static str;
    /// The broker's name in messages, as [`BrokerEntry::title`].
    const TITLE: &'static str;
    /// The file overrides it uses ([`mod@file`], and kinds of its own); any other is refused.
    const FILES: &'static [&'static str];
    /// How its URLs carry credentials, for the redaction of its connect errors; the generic
    /// rules ([`UrlRules::NONE`]) unless it says more. Its entry gives the same value as
    /// [`BrokerEntry::url_rules`].
    const URL_RULES: UrlRules = UrlRules::NONE;
    /// The transport, connecting from its configuration.
    type Transport: Transport + Connect;
    /// The delivery source, connecting from its configuration.
    type Source: DeliverySource + Sync + Connect;

    /// The transport's configuration from `settings`, file overrides applied, validated.
    ///
    /// # Errors
    /// [`BrokerError::Config`] naming the section and key.
    fn transport_config(
        settings: &BrokerSettings,
    ) -> Result<<Self::Transport as Connect>::Config, BrokerError>;

    /// The delivery source's configuration from `settings` and, when connecting, the
    /// consumer's `options` (`None` when only checking), file overrides applied, validated.
    ///
    /// # Errors
    /// [`BrokerError::Config`] naming the section and key.
    fn source_config(
        settings: &BrokerSettings,
        options: Option<&SourceOptions>,
    ) -> Result<<Self::Source as Connect>::Config, BrokerError>;

    /// Connects the transport; by default with its [`Connect::connect`].
    ///
    /// # Errors
    /// The transport's connect error (unreachable, refused, set-up failed), which the registry
    /// reports as [`BrokerError::Connect`].
    fn connect_transport(
        url: &str,
        config: <Self::Transport as Connect>::Config,
    ) -> impl Future<Output = Result<Self::Transport, <Self::Transport as Connect>::Error>> + Send
    {
        Self::Transport::connect(url, config)
    }

    /// Connects the delivery source; by default with its [`Connect::connect`].
    ///
    /// # Errors
    /// The source's connect error, which the registry reports as [`BrokerError::Connect`].
    fn connect_source(
        url: &str,
        config: <Self::Source as Connect>::Config,
    ) -> impl Future<Output = Result<Self::Source, <Self::Source as Connect>::Error>> + Send {
        Self::Source::connect(url, config)
    }
}

/// [`BrokerEntry::check`] of backend `B`: both configurations build from `settings`.
///
/// # Errors
/// The first section's [`BrokerError::Config`].
pub fn check<B: Backend>(settings: &BrokerSettings) -> Result<(), BrokerError> {
    B::transport_config(settings)?;
    B::source_config(settings, None).map(drop)
}

/// [`BrokerEntry::transport`] of backend `B`.
///
/// # Errors
/// A refused file override, an invalid section, or [`BrokerError::Connect`].
pub fn transport<'a, B: Backend>(
    url: &'a str,
    settings: &'a BrokerSettings,
) -> BoxFuture<'a, Result<BoxTransport, BrokerError>> {
    Box::pin(async move {
        settings.accept_files(B::NAME, B::FILES)?;
        let config = B::transport_config(settings)?;
        B::connect_transport(url, config)
            .await
            .map(BoxTransport::new)
            .map_err(|e| BrokerError::connect_redacted(B::TITLE, B::URL_RULES.redact(url), e))
    })
}

/// [`BrokerEntry::source`] of backend `B`.
///
/// # Errors
/// A refused file override, an invalid section, or [`BrokerError::Connect`].
pub fn source<'a, B: Backend>(
    url: &'a str,
    settings: &'a BrokerSettings,
    options: &'a SourceOptions,
) -> BoxFuture<'a, Result<BoxSource, BrokerError>> {
    Box::pin(async move {
        settings.accept_files(B::NAME, B::FILES)?;
        let config = B::source_config(settings, Some(options))?;
        B::connect_source(url, config)
            .await
            .map(BoxSource::new)
            .map_err(|e| BrokerError::connect_redacted(B::TITLE, B::URL_RULES.redact(url), e))
    })
}

/// The brokers of a build, chosen by URL scheme.
#[derive(Debug, Clone)]
pub struct Registry {
    entries: Vec<&'static BrokerEntry>,
}

/// The scheme of `url`, lower case, if it has one.
fn scheme_of(url: &str) -> Option<String> {
    let (scheme, _) = url.trim_start().split_once("://")?;
    let ok = !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    ok.then(|| scheme.to_ascii_lowercase())
}

impl Registry {
    /// A registry of `entries`.
    pub fn new(entries: &[&'static BrokerEntry]) -> Self {
        Self {
            entries: entries.to_vec(),
        }
    }

    /// The entries.
    pub fn entries(&self) -> &[&'static BrokerEntry] {
        &self.entries
    }

    /// The supported schemes as `a://, b://, …`, in the order of the entries.
    pub fn supported(&self) -> String {
        let all: Vec<String> = self
            .entries
            .iter()
            .flat_map(|e| e.schemes.iter().map(|s| format!("{s}://")))
            .collect();
        if all.is_empty() {
            "no broker (built without transports)".to_owned()
        } else {
            all.join(", ")
        }
    }

    /// The header names any registered broker reserves, one set per entry: what a producer
    /// that does not know which of them will carry its events refuses
    /// ([`NewMessage::validate_reserving`](crate::NewMessage::validate_reserving)).
    pub fn reserved_headers(&self) -> Vec<ReservedHeaders> {
        self.entries.iter().map(|e| e.reserved_headers).collect()
    }

    /// A [`Redactor`] with every registered broker's [`UrlRules`]. Add a store's or an
    /// adapter's rules with [`Redactor::with`].
    pub fn redactor(&self) -> Redactor {
        Redactor::new(self.entries.iter().map(|e| e.url_rules))
    }

    /// The entry serving `url`'s scheme.
    ///
    /// # Errors
    /// [`BrokerError::NoScheme`] or [`BrokerError::UnknownScheme`], naming the supported
    /// schemes.
    pub fn find(&self, url: &str) -> Result<&'static BrokerEntry, BrokerError> {
        let Some(scheme) = scheme_of(url) else {
            return Err(BrokerError::NoScheme {
                url: crate::secrets::redact_url(url.trim()),
                supported: self.supported(),
            });
        };
        self.entries
            .iter()
            .copied()
            .find(|e| e.schemes.contains(&scheme.as_str()))
            .ok_or_else(|| BrokerError::UnknownScheme {
                scheme,
                supported: self.supported(),
            })
    }

    /// Checks every section of `settings`: each must belong to a registered broker, and each
    /// broker must accept its own.
    ///
    /// # Errors
    /// [`BrokerError::UnknownSection`] or the first entry's [`BrokerError::Config`].
    pub fn check(&self, settings: &BrokerSettings) -> Result<(), BrokerError> {
        for name in settings.section_names() {
            if !self.entries.iter().any(|e| e.sections.contains(&name)) {
                let known: Vec<&str> = self
                    .entries
                    .iter()
                    .flat_map(|e| e.sections.iter().copied())
                    .collect();
                return Err(BrokerError::UnknownSection {
                    name: name.to_owned(),
                    known: known.join(", "),
                });
            }
        }
        for e in &self.entries {
            (e.check)(settings)?;
        }
        Ok(())
    }

    /// Connects the transport `url` names.
    ///
    /// # Errors
    /// [`BrokerError`]: unknown scheme, invalid settings, or the broker's connect error.
    pub async fn connect_transport(
        &self,
        url: &str,
        settings: &BrokerSettings,
    ) -> Result<BoxTransport, BrokerError> {
        let entry = self.find(url)?;
        (entry.transport)(url, settings).await
    }

    /// Connects the delivery source `url` names.
    ///
    /// # Errors
    /// [`BrokerError`]: unknown scheme, invalid settings, or the broker's connect error.
    pub async fn connect_source(
        &self,
        url: &str,
        settings: &BrokerSettings,
        options: &SourceOptions,
    ) -> Result<BoxSource, BrokerError> {
        let entry = self.find(url)?;
        (entry.source)(url, settings, options).await
    }
}

#[cfg(test)]
mod tests;
