//! [`connect`]: a pool for the toolkit's engines and commands, failing fast with the cause.

use std::time::Duration;

use outbox_core::secrets::UrlRules;
use sqlx::postgres::{PgPool, PgPoolOptions};

/// How a PostgreSQL URL carries credentials, for redaction
/// ([`outbox_core::secrets::Redactor`]): `postgres://user:password@host/db`, where a lone value
/// before `@` is the user name (shown: libpq then takes the password from elsewhere), and the
/// connection parameters of libpq and sqlx that are never secret (`sslmode`, `sslrootcert`,
/// `application_name`, `target_session_attrs` …) are shown. Any other parameter's value
/// (`password`, `sslpassword`, one this list does not know) is masked.
pub const URL_RULES: UrlRules = UrlRules {
    schemes: &["postgres", "postgresql"],
    lone_userinfo_is_user: true,
    shown_params: &[
        "application_name",
        "connect_timeout",
        "dbname",
        "host",
        "hostaddr",
        "port",
        "sslcert",
        "sslkey",
        "sslmode",
        "sslnegotiation",
        "sslrootcert",
        "statement-cache-capacity",
        "target_session_attrs",
        "user",
    ],
};

/// Why [`connect`] failed. The address is redacted (no password, no secret query value).
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to PostgreSQL at {address}: {reason}")]
pub struct ConnectError {
    /// The database URL with its secrets masked.
    pub address: String,
    /// The cause: refused, unknown database, authentication failed, TLS required but not
    /// offered, no answer within the timeout ...
    pub reason: String,
}

/// A pool of at most `max_connections` to `url` (a `postgres://` URL; `sslmode`,
/// `sslrootcert`, `sslcert` and `sslkey` are honoured). One direct connection is made first, so
/// an unreachable or misconfigured server is reported with its cause within `timeout` rather than
/// as a pool timeout later; the pool then waits at most `timeout` for a free connection.
///
/// # Errors
/// [`ConnectError`] naming the (redacted) address and the cause.
pub async fn connect(
    url: &str,
    max_connections: u32,
    timeout: Duration,
) -> Result<PgPool, ConnectError> {
    use sqlx::Connection;
    let fail = |reason: String| ConnectError {
        address: URL_RULES.redact(url),
        reason,
    };
    let probe = tokio::time::timeout(timeout, sqlx::PgConnection::connect(url))
        .await
        .map_err(|_| fail(format!("no answer within {timeout:?}")))?
        .map_err(|e| fail(e.to_string()))?;
    let _ = probe.close().await;
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(timeout)
        .connect(url)
        .await
        .map_err(|e| fail(e.to_string()))
}
