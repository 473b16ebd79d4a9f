//! [`HttpPayoutProvider`]: a [`RemoteEffect`] over HTTP, for payout services that speak this
//! small protocol (the stand-in provider of the test tools, `outbox demo-provider`, does), and
//! the worked example of writing a provider adapter.
//!
//! # The protocol
//!
//! * `POST {base}/payouts` with the header `Idempotency-Key: <work item key>` and a JSON body
//!   `{"amount": <integer, minor units>, "beneficiary": "<string>", "reference": "<string>"}`:
//!   200 or 201 with `{"payout_id": "<id>"}` when paid (or already paid for this key), 4xx
//!   when refused.
//! * `GET {base}/payouts/by-key/{key}`: 200 with `{"payout_id": …}` when a payout exists for
//!   the key; 404 with the body [`NO_PAYOUT_FOR_KEY`] when it does not.
//!
//! An adapter has one job: translate the provider's answers into the executor's vocabulary
//! without ever guessing. The rules this one follows, and any adapter should:
//!
//! - **Always send the work item's key** (`Idempotency-Key`), on every call. A provider that
//!   honours it turns a repeated call into a replay instead of a second payout.
//! - **`Succeeded` only on a definitive yes** (here 200/201 with a parsable payout id).
//! - **`Failed` only on a definitive no**: the provider answered and refused (4xx). Terminal.
//! - **`NotSent` only when the request provably never left**: the TCP connection could not be
//!   opened. Anything after the connection exists may have reached the provider.
//! - **`Unknown` for everything else**: 5xx, a reset after sending, an answer that cannot be
//!   parsed. The executor then reconciles through [`RemoteEffect::lookup`] instead of calling
//!   again.
//! - **No timeout and no retries inside.** The executor wraps every call in its own timeout
//!   (and treats the timeout as `Unknown`) and owns retries and reconciliation; an adapter that
//!   retried on its own would hide attempts from the record. Consequently a provider that
//!   accepts the TCP connection and never answers holds the call until the executor's timeout.
//! - **`NotFound` only when the provider says so.** A lookup 404 counts as "no payout for this
//!   key" only when the body says exactly that; a 404 from a wrong base URL is `Unknown`,
//!   because `NotFound` may allow a new call (and so a second payout).
//!
//! Transport: hyper's HTTP/1.1 client with a connection pool (keep-alive), over TLS (rustls)
//! for `https://` base URLs: the provider's certificate is verified against a CA file when given
//! (only those CAs) or else the system's trust store, its name against the URL's host, and a client certificate
//! can be presented ([`ProviderTls`]). An `https://` provider is never called in plain text,
//! and TLS files given with an `http://` URL are refused. A failed TLS handshake happens
//! before any request byte is sent, so it is `NotSent`.
//!
//! [`RemoteEffect`]: outbox_core::RemoteEffect
//! [`RemoteEffect::lookup`]: outbox_core::RemoteEffect::lookup

/// Why an adapter could not be built (bad URL, unreadable TLS files), or why a stand-in admin
/// request failed. The message names the option or the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProviderError(String);

type Result<T, E = ProviderError> = std::result::Result<T, E>;

macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(ProviderError(format!($($arg)*)))
    };
}

/// The body of the 404 that a lookup gets for a key without a payout. Only this exact body
/// means "no payout for this key"; any other 404 (a wrong base URL) is an unknown outcome.
pub const NO_PAYOUT_FOR_KEY: &str = "no payout for this key";

/// How an HTTP URL carries credentials, for redaction
/// ([`outbox_core::secrets::Redactor`]): `http(s)://user:password@host`, where a lone value
/// before `@` is a user name (shown). No query parameter is known to be harmless, so every
/// value is masked (a provider URL has none anyway: [`HttpPayoutProvider::with_tls`] refuses a
/// query).
pub const URL_RULES: outbox_core::secrets::UrlRules = outbox_core::secrets::UrlRules {
    schemes: &["http", "https"],
    lone_userinfo_is_user: true,
    shown_params: &[],
};

mod client;
mod effect;
mod outcome;
#[cfg(feature = "stand-in")]
mod stand_in;
#[cfg(test)]
mod tests;

pub use client::{HttpPayoutProvider, ProviderTls};
