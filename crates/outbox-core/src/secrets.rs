//! Keeping credentials out of logs, error messages and command output.
//!
//! Connection URLs carry secrets in several forms: a password (`postgres://user:PASSWORD@host`),
//! a bare token (`nats://TOKEN@host`), a query parameter (`postgres://host/db?password=…`).
//! [`redact_url`] is the one function every crate of the toolkit uses before a URL goes into a
//! log line, a span field, an error or a printed line: it keeps what an operator needs to tell
//! endpoints apart (scheme, user name, host, port, path, harmless parameters such as `sslmode`)
//! and masks everything else.
//!
//! ```
//! use outbox_core::secrets::redact_url;
//! assert_eq!(redact_url("amqp://guest:s3cret@mq:5672/%2f"), "amqp://guest:***@mq:5672/%2f");
//! assert_eq!(redact_url("nats://T0KEN@nats:4222"), "nats://***@nats:4222");
//! assert_eq!(
//!     redact_url("postgres://app@db/pay?sslmode=verify-full&password=s3cret"),
//!     "postgres://app@db/pay?sslmode=verify-full&password=***"
//! );
//! ```
//!
//! [`split_credentials`] takes the credentials out of a URL so they can be handed to a client
//! library through its own options, never as part of an address the library may log.
//! [`Scrubber`] is the last line of defence of a binary: it masks known secrets in any text,
//! such as a third-party library's log line.

use std::borrow::Cow;
use std::fmt;

/// What a masked secret is replaced with.
pub const MASK: &str = "***";

/// Query parameters whose values are shown unmasked: connection settings that are never
/// secret. Every other parameter's value is masked, so a parameter this list does not know
/// (a new driver option, a typo of `password`) can never leak.
const SHOWN_PARAMS: &[&str] = &[
    "application_name",
    "auth_mechanism",
    "channel_max",
    "connect_timeout",
    "connection_timeout",
    "dbname",
    "frame_max",
    "heartbeat",
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
];

/// The parts of one URL (one item of a comma-separated list).
struct Parts<'a> {
    /// `scheme://`, or empty.
    scheme: &'a str,
    /// What stood before the last `@`, if there was one.
    userinfo: Option<&'a str>,
    /// Host, port and path.
    location: &'a str,
    /// After `?`, without it.
    query: Option<&'a str>,
    /// After `#`, without it.
    fragment: Option<&'a str>,
}

/// Splits a URL list into items. A comma starts a new item only when a scheme follows it
/// (`nats://a:4222,nats://b:4222`); a comma elsewhere (inside a password) stays in its item, so
/// a secret is never cut in two and half of it shown.
fn items(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, _) in text.match_indices(',') {
        let next = &text[i + 1..];
        let scheme_follows = next.find("://").is_some_and(|p| {
            p > 0
                && next[..p]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        });
        if scheme_follows {
            out.push(&text[start..i]);
            start = i + 1;
        }
    }
    out.push(&text[start..]);
    out
}

fn parts(item: &str) -> Parts<'_> {
    let (scheme, rest) = match item.find("://") {
        Some(p) => (&item[..p + 3], &item[p + 3..]),
        None => ("", item),
    };
    // The *last* `@`: a password may hold an unencoded `@`, `/`, `?` or `#`. When an `@` sits
    // in a path or query instead, more is masked than needed, never less.
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let (rest, fragment) = match rest.split_once('#') {
        Some((r, f)) => (r, Some(f)),
        None => (rest, None),
    };
    let (location, query) = match rest.split_once('?') {
        Some((l, q)) => (l, Some(q)),
        None => (rest, None),
    };
    Parts {
        scheme,
        userinfo,
        location,
        query,
        fragment,
    }
}

/// Whether a lone user-info value (no `:`) of this scheme is a user name, shown, rather than a
/// token, masked. Only schemes known to read it as a user name qualify; NATS (`nats`, `tls`,
/// `ws`, `wss`), no scheme and unknown schemes mask it.
fn lone_userinfo_is_user(scheme: &str) -> bool {
    let name = scheme.trim_end_matches("://").to_ascii_lowercase();
    matches!(
        name.as_str(),
        "postgres" | "postgresql" | "amqp" | "amqps" | "http" | "https"
    )
}

fn param_shown(key: &str) -> bool {
    let key = percent_decode(key).to_ascii_lowercase();
    SHOWN_PARAMS.contains(&key.as_str())
}

/// A URL (or a comma-separated list of URLs) with every secret masked: the password of
/// `user:password@`, a bare token before `@` (a lone value is kept as a user name only for
/// `postgres`, `amqp(s)` and `http(s)` URLs), and the value of every
/// query parameter that is not a known harmless setting (see the module docs), as well as any
/// fragment. Text that is not a URL comes back unchanged unless it contains an `@`, before
/// which everything is masked.
pub fn redact_url(url: &str) -> String {
    items(url)
        .into_iter()
        .map(redact_item)
        .collect::<Vec<_>>()
        .join(",")
}

fn redact_item(item: &str) -> String {
    let p = parts(item);
    let mut out = String::with_capacity(item.len());
    out.push_str(p.scheme);
    if let Some(userinfo) = p.userinfo {
        match userinfo.split_once(':') {
            Some((user, _password)) => {
                out.push_str(user);
                out.push(':');
                out.push_str(MASK);
            }
            None if lone_userinfo_is_user(p.scheme) => out.push_str(userinfo),
            None => out.push_str(MASK),
        }
        out.push('@');
    }
    out.push_str(p.location);
    if let Some(query) = p.query {
        out.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if param_shown(k) => pair.to_owned(),
                Some((k, _)) => format!("{k}={MASK}"),
                None if pair.is_empty() => String::new(),
                None => MASK.to_owned(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    if p.fragment.is_some() {
        out.push('#');
        out.push_str(MASK);
    }
    out
}

/// Credentials taken out of a URL's user-info part, percent-decoded.
///
/// Its `Debug` output masks the secret.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Credentials {
    /// `user:password@` (the password may be empty).
    UserPassword {
        /// The user name.
        user: String,
        /// The password.
        password: String,
    },
    /// A single value before `@`, without `:`: a token (NATS `nats://TOKEN@host`), or a user
    /// name alone for protocols that read it so.
    Token(String),
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UserPassword { user, .. } => f
                .debug_struct("UserPassword")
                .field("user", user)
                .field("password", &MASK)
                .finish(),
            Self::Token(_) => f.debug_tuple("Token").field(&MASK).finish(),
        }
    }
}

/// Takes the user-info part out of every URL of a (comma-separated) list: the list without
/// it, and the credentials of the first URL that had any (percent-decoded).
///
/// ```
/// use outbox_core::secrets::{Credentials, split_credentials};
/// let (url, creds) = split_credentials("tls://relay:p%40ss@nats:4222");
/// assert_eq!(url, "tls://nats:4222");
/// assert_eq!(creds, Some(Credentials::UserPassword { user: "relay".into(), password: "p@ss".into() }));
/// ```
pub fn split_credentials(url: &str) -> (String, Option<Credentials>) {
    let mut creds = None;
    let stripped = items(url)
        .into_iter()
        .map(|item| {
            let p = parts(item);
            if let Some(userinfo) = p.userinfo
                && creds.is_none()
            {
                creds = Some(match userinfo.split_once(':') {
                    Some((user, password)) => Credentials::UserPassword {
                        user: percent_decode(user),
                        password: percent_decode(password),
                    },
                    None => Credentials::Token(percent_decode(userinfo)),
                });
            }
            let mut out = format!("{}{}", p.scheme, p.location);
            if let Some(q) = p.query {
                out.push('?');
                out.push_str(q);
            }
            if let Some(f) = p.fragment {
                out.push('#');
                out.push_str(f);
            }
            out
        })
        .collect::<Vec<_>>()
        .join(",");
    (stripped, creds)
}

/// Every secret [`redact_url`] would mask in `url`, each in the forms it may be printed in
/// (as written, percent-decoded): input for a [`Scrubber`].
pub fn url_secrets(url: &str) -> Vec<String> {
    let mut out = Vec::new();
    for item in items(url) {
        let p = parts(item);
        if let Some(userinfo) = p.userinfo {
            match userinfo.split_once(':') {
                Some((_, password)) => out.push(password.to_owned()),
                None if lone_userinfo_is_user(p.scheme) => {}
                None => out.push(userinfo.to_owned()),
            }
        }
        if let Some(query) = p.query {
            for pair in query.split('&') {
                match pair.split_once('=') {
                    Some((k, v)) if !param_shown(k) => out.push(v.to_owned()),
                    None => out.push(pair.to_owned()),
                    _ => {}
                }
            }
        }
        if let Some(f) = p.fragment {
            out.push(f.to_owned());
        }
    }
    let decoded: Vec<String> = out.iter().map(|s| percent_decode(s)).collect();
    out.extend(decoded);
    out.retain(|s| !s.is_empty());
    out.sort();
    out.dedup();
    out
}

/// Decodes `%XX` escapes (and leaves malformed ones as they are).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Masks known secrets wherever they occur in a text: the safety net of a binary's log output
/// and error messages, for text the toolkit does not format itself (a client library's debug
/// line, an error message quoting its input).
///
/// Each secret is matched as given, percent-decoded and as `Debug` would escape it; longer
/// secrets are masked first, so one that contains another is masked whole.
///
/// ```
/// use outbox_core::secrets::Scrubber;
/// let mut s = Scrubber::default();
/// s.add_url("postgres://app:s3cret@db/pay");
/// assert_eq!(s.scrub("connecting with s3cret"), "connecting with ***");
/// ```
#[derive(Clone, Default)]
pub struct Scrubber {
    /// Longest first.
    secrets: Vec<String>,
}

impl fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scrubber")
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

impl Scrubber {
    /// Adds every secret of `url` (see [`url_secrets`]).
    pub fn add_url(&mut self, url: &str) {
        for s in url_secrets(url) {
            self.add_secret(&s);
        }
    }

    /// Adds one secret (ignored when empty).
    pub fn add_secret(&mut self, secret: &str) {
        if secret.is_empty() {
            return;
        }
        // As given and percent-decoded; each also as Rust's `Debug` escapes it (a `?` field),
        // as JSON escapes it (a JSON log line), and as JSON escapes its `Debug` form.
        let debug = |s: &str| {
            let d = format!("{s:?}");
            d[1..d.len() - 1].to_owned()
        };
        let json = |s: &str| {
            let j = serde_json::to_string(s).unwrap_or_default();
            j.get(1..j.len().saturating_sub(1))
                .unwrap_or_default()
                .to_owned()
        };
        let mut forms = Vec::new();
        for base in [secret.to_owned(), percent_decode(secret)] {
            forms.push(json(&debug(&base)));
            forms.push(debug(&base));
            forms.push(json(&base));
            forms.push(base);
        }
        for form in forms {
            if !form.is_empty() && !self.secrets.contains(&form) {
                self.secrets.push(form);
            }
        }
        self.secrets
            .sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    }

    /// True when no secret was added.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `text` with every known secret replaced by [`MASK`].
    pub fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = Cow::Owned(out.replace(s.as_str(), MASK));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_and_password_keeps_the_user() {
        assert_eq!(
            redact_url("postgres://app:pw@db:5432/pay"),
            "postgres://app:***@db:5432/pay"
        );
        assert_eq!(
            redact_url("amqps://guest:gu%40st@mq/%2f"),
            "amqps://guest:***@mq/%2f"
        );
        assert_eq!(
            redact_url("postgres://app:@db/pay"),
            "postgres://app:***@db/pay"
        );
    }

    #[test]
    fn a_bare_token_is_masked_whole() {
        assert_eq!(
            redact_url("nats://s3cr3t@nats:4222"),
            "nats://***@nats:4222"
        );
        assert_eq!(redact_url("tls://s3cr3t@nats:4222"), "tls://***@nats:4222");
        assert_eq!(redact_url("s3cr3t@nats:4222"), "***@nats:4222");
        assert_eq!(redact_url("foo://s3cr3t@h"), "foo://***@h");
        // A lone value is a user name where the protocol reads it so.
        assert_eq!(redact_url("postgres://app@db/pay"), "postgres://app@db/pay");
        assert_eq!(redact_url("amqp://guest@mq/%2f"), "amqp://guest@mq/%2f");
        assert!(url_secrets("postgres://app@db/pay").is_empty());
        assert_eq!(url_secrets("nats://s3cr3t@h"), vec!["s3cr3t".to_owned()]);
    }

    #[test]
    fn query_values_are_masked_unless_harmless() {
        assert_eq!(
            redact_url("postgres://db/pay?password=pw&sslmode=require&SSLPASSWORD=x&flag"),
            "postgres://db/pay?password=***&sslmode=require&SSLPASSWORD=***&***"
        );
        assert_eq!(
            redact_url("postgres://db/pay?pass%77ord=pw"),
            "postgres://db/pay?pass%77ord=***"
        );
        assert_eq!(
            redact_url("postgres://db/pay?sslrootcert=/etc/ca.pem&application_name=relay"),
            "postgres://db/pay?sslrootcert=/etc/ca.pem&application_name=relay"
        );
        assert_eq!(redact_url("http://h/x#tok"), "http://h/x#***");
    }

    #[test]
    fn lists_are_redacted_item_by_item_and_commas_in_secrets_stay_masked() {
        assert_eq!(
            redact_url("nats://a:pw@h1:4222,nats://tok@h2:4222,nats://h3:4222"),
            "nats://a:***@h1:4222,nats://***@h2:4222,nats://h3:4222"
        );
        assert_eq!(redact_url("nats://u:p,w@h"), "nats://u:***@h");
        assert_eq!(redact_url("h1:4222,h2:4222"), "h1:4222,h2:4222");
    }

    #[test]
    fn reserved_characters_in_passwords_never_leak_a_part() {
        for (url, secret) in [
            ("postgres://u:qq/zz@db/pay", "qq/zz"),
            ("postgres://u:qq?zz@db/pay", "qq?zz"),
            ("postgres://u:qq#zz@db/pay", "qq#zz"),
            ("postgres://u:qq@zz@db/pay", "qq@zz"),
        ] {
            let r = redact_url(url);
            assert_eq!(r, "postgres://u:***@db/pay", "{url}");
            assert!(!r.contains("qq") && !r.contains("zz"), "{r}");
            assert!(url_secrets(url).contains(&secret.to_owned()), "{url}");
        }
    }

    #[test]
    fn plain_text_is_unchanged() {
        assert_eq!(redact_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(redact_url("127.0.0.1:9090"), "127.0.0.1:9090");
        assert_eq!(redact_url(""), "");
    }

    #[test]
    fn credentials_are_split_off_and_decoded() {
        assert_eq!(
            split_credentials("nats://tok%2Fen@h:4222"),
            (
                "nats://h:4222".to_owned(),
                Some(Credentials::Token("tok/en".into()))
            )
        );
        assert_eq!(
            split_credentials("nats://h1:4222,nats://u:p@h2:4222?x=1"),
            (
                "nats://h1:4222,nats://h2:4222?x=1".to_owned(),
                Some(Credentials::UserPassword {
                    user: "u".into(),
                    password: "p".into()
                })
            )
        );
        assert_eq!(
            split_credentials("nats://h:4222"),
            ("nats://h:4222".to_owned(), None)
        );
        let debug = format!(
            "{:?}",
            Credentials::UserPassword {
                user: "u".into(),
                password: "hunter2".into()
            }
        );
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(!format!("{:?}", Credentials::Token("t0k".into())).contains("t0k"));
    }

    #[test]
    fn secrets_are_listed_raw_and_decoded() {
        let s = url_secrets("amqp://u:p%40ss@h/%2f?password=q%20w&heartbeat=10");
        for want in ["p%40ss", "p@ss", "q%20w", "q w"] {
            assert!(s.contains(&want.to_owned()), "{want} missing from {s:?}");
        }
        assert!(!s.contains(&"10".to_owned()), "{s:?}");
        assert!(url_secrets("nats://h:4222").is_empty());
    }

    #[test]
    fn scrubber_masks_every_form() {
        let mut s = Scrubber::default();
        s.add_url("postgres://u:p%40ss\"w@db/pay?password=abc");
        s.add_secret("");
        assert!(!s.is_empty());
        assert_eq!(s.scrub("a p%40ss\"w b"), "a *** b");
        assert_eq!(s.scrub("a p@ss\"w b"), "a *** b");
        assert_eq!(s.scrub(r#"pass: "p@ss\"w""#), r#"pass: "***""#);
        assert_eq!(s.scrub("x=abc"), "x=***");
        // In JSON log lines: the decoded secret as a string field, and its Debug form.
        let field = serde_json::json!({ "error": "p@ss\"w" }).to_string();
        assert_eq!(s.scrub(&field), r#"{"error":"***"}"#);
        let debug_field = serde_json::json!({ "error": format!("{:?}", "p@ss\"w") }).to_string();
        assert!(
            !s.scrub(&debug_field).contains("ss"),
            "{}",
            s.scrub(&debug_field)
        );
        assert!(matches!(s.scrub("nothing here"), Cow::Borrowed(_)));
        assert!(!format!("{s:?}").contains("abc"));
    }

    #[test]
    fn percent_decoding_keeps_malformed_escapes() {
        assert_eq!(percent_decode("a%2Fb%zz%4"), "a/b%zz%4");
    }
}
