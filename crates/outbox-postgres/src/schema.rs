//! The configurable schema name, validated as a plain SQL identifier.

use std::fmt;

/// Why a schema name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid schema name `{0}`: use 1 to 63 characters, lower-case ASCII letters, digits and `_`, not starting with a digit"
)]
pub struct InvalidSchema(pub String);

/// A validated schema name such as `outbox`. Only names that need no quoting are accepted, so
/// the name can be placed in SQL text safely and reads the same in `psql`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Schema(String);

/// The default schema, `outbox`.
pub const DEFAULT_SCHEMA: &str = "outbox";

impl Schema {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`InvalidSchema`] unless `name` matches `^[a-z_][a-z0-9_]{0,62}$` and is not a reserved
    /// `pg_` name.
    pub fn new(name: &str) -> Result<Self, InvalidSchema> {
        if plain_identifier(name) && !name.starts_with("pg_") {
            Ok(Self(name.to_owned()))
        } else {
            Err(InvalidSchema(name.to_owned()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as a quoted SQL identifier, `"outbox"`.
    pub fn quoted(&self) -> String {
        quote_ident(&self.0)
    }

    /// `template` with every `{s}` replaced by the quoted schema name: how every statement of
    /// this crate is rendered (values always travel as bind parameters).
    pub fn render(&self, template: &str) -> std::sync::Arc<str> {
        template.replace("{s}", &self.quoted()).into()
    }

    /// The NOTIFY channel producers use to wake relays of this schema.
    pub fn wakeup_channel(&self) -> String {
        format!("{}_wakeup", self.0)
    }
}

impl Default for Schema {
    fn default() -> Self {
        Self(DEFAULT_SCHEMA.to_owned())
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `name` is a plain SQL identifier: `^[a-z_][a-z0-9_]{0,62}$`, which needs no quoting
/// and reads the same in `psql`.
pub(crate) fn plain_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit()
}

/// `name` as a quoted SQL identifier: in double quotes, an embedded `"` doubled. The one
/// identifier quoting of this crate (schema and role names are also validated before they get
/// here, so the doubling is a second line of defence).
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The wake-up payload of an operator's action that made rows claimable wherever they lie
/// (a requeue, a replay, a resume), sent on [`Schema::wakeup_channel`]: the relays' next claims read from the table's start.
pub(crate) const RESCAN: &str = "rescan";

/// The wake-up payload of a sweep that expired the leases of relays whose sessions ended
/// (`crate::session`): relays claim at once, from the table's start.
pub(crate) const TAKEOVER: &str = "takeover";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted_with_embedded_quotes_doubled() {
        assert_eq!(Schema::new("outbox").unwrap().quoted(), "\"outbox\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn accepts_plain_identifiers_only() {
        assert!(Schema::new("outbox").is_ok());
        assert!(Schema::new("_svc_2").is_ok());
        for bad in [
            "",
            "Outbox",
            "1abc",
            "a-b",
            "a b",
            "a;drop",
            "pg_catalog",
            "a\"b",
            &"x".repeat(64),
        ] {
            assert!(Schema::new(bad).is_err(), "{bad:?} accepted");
        }
    }
}
