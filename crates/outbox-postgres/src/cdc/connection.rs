//! The replication connection: its settings from the database URL (TLS as libpq reads
//! `sslmode`), and the server's errors about the slot told apart from connection failures.

use std::collections::HashMap;

use pgwire_replication::{ReplicationConfig, SslMode, TlsConfig};

use super::CdcError;

/// The replication connection's settings from a `postgres://` URL, and the TLS settings of a
/// second try when `sslmode` asks for one (see [`tls_of`]).
pub(super) fn replication_config(
    url: &str,
    slot: &str,
    publication: &str,
) -> Result<(ReplicationConfig, Option<TlsConfig>), CdcError> {
    let parsed = url::Url::parse(url)
        .map_err(|e| CdcError::Config(format!("the database URL is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "postgres" | "postgresql") {
        return Err(CdcError::Config(format!(
            "the database URL's scheme is `{}`, postgres:// expected",
            parsed.scheme()
        )));
    }
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|e| CdcError::Config(format!("the database URL: {e}")))
    };
    let host = parsed.host_str().unwrap_or("localhost").to_owned();
    let user = match parsed.username() {
        "" => std::env::var("PGUSER").unwrap_or_else(|_| "postgres".to_owned()),
        u => decode(u)?,
    };
    let password = match parsed.password() {
        Some(p) => decode(p)?,
        None => std::env::var("PGPASSWORD").unwrap_or_default(),
    };
    let database = match parsed.path().trim_start_matches('/') {
        "" => user.clone(),
        d => decode(d)?,
    };
    let query: HashMap<String, String> = parsed.query_pairs().into_owned().collect();
    let (tls, fallback) = tls_of(&query)?;
    Ok((
        ReplicationConfig::new(host, user, password, database, slot, publication)
            .with_port(parsed.port().unwrap_or(5432))
            .with_tls(tls)
            .with_binary(true)
            .with_application_name("outbox-cdc"),
        fallback,
    ))
}

/// The replication connection's TLS from the URL's `sslmode`, `sslrootcert`, `sslcert` and
/// `sslkey`, as libpq (and the pool on the same URL) reads them, and the TLS of a second try:
///
/// * `prefer`, and no `sslmode` (libpq's default): TLS when the server offers it, without
///   verifying its certificate; plain text when the server answers that it has no TLS, or, on a
///   second try, when the TLS connection fails (a failed handshake, a `pg_hba.conf` that only
///   lets this client in without TLS).
/// * `allow`: plain text first; TLS (unverified) on a second try when that fails (a server that
///   only lets this client in with TLS).
/// * `disable`, `require`, `verify-ca`, `verify-full`: one try, as named; `require` and the
///   verify modes never fall back to plain text.
fn tls_of(query: &HashMap<String, String>) -> Result<(TlsConfig, Option<TlsConfig>), CdcError> {
    let ca = query.get("sslrootcert").map(std::path::PathBuf::from);
    let client_cert = |tls: TlsConfig| match (query.get("sslcert"), query.get("sslkey")) {
        (Some(cert), Some(key)) => tls.with_client_cert(cert, key),
        _ => tls,
    };
    let prefer = || {
        client_cert(TlsConfig {
            mode: SslMode::Prefer,
            ..TlsConfig::default()
        })
    };
    Ok(match query.get("sslmode").map(String::as_str) {
        None | Some("prefer") => (prefer(), Some(TlsConfig::disabled())),
        Some("allow") => (
            TlsConfig::disabled(),
            Some(client_cert(TlsConfig::require())),
        ),
        Some("disable") => (TlsConfig::disabled(), None),
        Some("require") => (client_cert(TlsConfig::require()), None),
        Some("verify-ca") => (client_cert(TlsConfig::verify_ca(ca)), None),
        Some("verify-full") => (client_cert(TlsConfig::verify_full(ca)), None),
        Some(other) => {
            return Err(CdcError::Config(format!(
                "the database URL's sslmode `{other}` is not one of disable, allow, prefer, \
                 require, verify-ca, verify-full"
            )));
        }
    })
}

/// The server's errors about the slot, told apart from connection failures.
pub(super) fn classify(slot: &str, e: pgwire_replication::PgWireError) -> CdcError {
    let text = e.to_string();
    if text.contains("42704") || text.contains("does not exist") {
        CdcError::SlotMissing {
            slot: slot.to_owned(),
        }
    } else if text.contains("55006") || text.contains("is active for PID") {
        CdcError::SlotBusy {
            slot: slot.to_owned(),
            reason: text,
        }
    } else if text.contains("can no longer get changes")
        || text.contains("has been invalidated")
        || text.contains("55000")
    {
        CdcError::SlotInvalidated {
            slot: slot.to_owned(),
            reason: text,
        }
    } else {
        CdcError::Stream(text)
    }
}
