//! Keeping credentials out of logs, error messages and command output.
//!
//! Connection URLs carry secrets in several forms: a password (`scheme://user:PASSWORD@host`), a
//! bare token (`scheme://TOKEN@host`), a query parameter (`scheme://host/db?password=…`).
//! [`redact_url`] (and [`Redactor::redact`]) is what every crate of the toolkit applies before a
//! URL goes into a log line, a span field, an error or a printed line: it keeps what an operator
//! needs to tell endpoints apart (scheme, host, port, path) and masks everything else.
//!
//! The rules here know no scheme. For any URL they mask the password of `user:password@`, a
//! lone value before `@` (it may be a token), every query parameter's value and any fragment.
//! What a protocol says beyond that comes from the crate that speaks it, as [`UrlRules`]: that
//! its lone user-info value is a user name (shown), and which query parameters are harmless
//! settings (shown). A broker gives its rules in its registry entry
//! ([`BrokerEntry::url_rules`](crate::broker::BrokerEntry::url_rules)), a store or an adapter
//! crate exports its own; a [`Redactor`] applies the rules it was given, each to its own
//! schemes.
//!
//! ```
//! use outbox_core::secrets::{Redactor, UrlRules, redact_url};
//! // The generic rules: the token, the password and every query value are masked.
//! assert_eq!(redact_url("acme://T0KEN@mq:7000"), "acme://***@mq:7000");
//! assert_eq!(redact_url("acme://app:s3cret@mq/x?timeout=5"), "acme://app:***@mq/x?timeout=***");
//! // A made-up protocol whose lone user-info value is a user name and whose `timeout` is a
//! // harmless setting.
//! const ACME: UrlRules = UrlRules {
//!     schemes: &["acme", "acmes"],
//!     lone_userinfo_is_user: true,
//!     shown_params: &["timeout"],
//! };
//! let r = Redactor::new([ACME]);
//! assert_eq!(r.redact("acme://app@mq/x?timeout=5&password=s3cret"),
//!            "acme://app@mq/x?timeout=5&password=***");
//! // Other schemes keep the generic rules.
//! assert_eq!(r.redact("other://T0KEN@h?timeout=5"), "other://***@h?timeout=***");
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

/// How the URLs of some schemes carry credentials, where that differs from the generic rules:
/// given by the crate that speaks the protocol, never known to the core.
///
/// Both relaxations only ever show more; without them a value is masked. A parameter the list
/// does not know (a new driver option, a typo of `password`) can therefore never leak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UrlRules {
    /// The schemes these rules are for, lower case, without `://`.
    pub schemes: &'static [&'static str],
    /// A lone user-info value (`scheme://NAME@host`, no `:`) is a user name and shown. Without
    /// this it is masked whole, as a protocol that reads it as a token needs.
    pub lone_userinfo_is_user: bool,
    /// Query parameters whose values are never secret (connection settings), shown unmasked;
    /// lower case, compared with the parameter's percent-decoded, lower-cased name. Every
    /// other parameter's value is masked.
    pub shown_params: &'static [&'static str],
}

impl UrlRules {
    /// No rule: the generic redaction.
    pub const NONE: Self = Self {
        schemes: &[],
        lone_userinfo_is_user: false,
        shown_params: &[],
    };

    /// `url` redacted with these rules (and the generic ones for any other scheme).
    pub fn redact(&self, url: &str) -> String {
        Redactor::new([*self]).redact(url)
    }
}

/// URL redaction with the [`UrlRules`] of the protocols at hand, each applied to its own
/// schemes; a URL of any other scheme gets the generic rules. The default has no rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    rules: Vec<UrlRules>,
}

impl Redactor {
    /// A redactor applying `rules`. When two rules name the same scheme, the first wins.
    pub fn new(rules: impl IntoIterator<Item = UrlRules>) -> Self {
        Self {
            rules: rules.into_iter().collect(),
        }
    }

    /// Adds `rules` after the ones already given.
    pub fn with(mut self, rules: UrlRules) -> Self {
        self.rules.push(rules);
        self
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[UrlRules] {
        &self.rules
    }

    /// The rules for `scheme` (as written in the URL, with its `://`), if any.
    fn rules_for(&self, scheme: &str) -> UrlRules {
        let name = scheme.trim_end_matches("://").to_ascii_lowercase();
        self.rules
            .iter()
            .find(|r| r.schemes.contains(&name.as_str()))
            .copied()
            .unwrap_or(UrlRules::NONE)
    }

    /// A URL (or a comma-separated list of URLs) with every secret masked: the password of
    /// `user:password@`, a lone value before `@` unless the scheme's rules say it is a user
    /// name, the value of every query parameter that the scheme's rules do not list as harmless,
    /// and any fragment. Text that is not a URL comes back unchanged unless it contains an `@`,
    /// before which everything is masked.
    pub fn redact(&self, url: &str) -> String {
        items(url)
            .into_iter()
            .map(|item| self.redact_item(item))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn redact_item(&self, item: &str) -> String {
        let p = parts(item);
        let rules = self.rules_for(p.scheme);
        let mut out = String::with_capacity(item.len());
        out.push_str(p.scheme);
        if let Some(userinfo) = p.userinfo {
            match userinfo.split_once(':') {
                Some((user, _password)) => {
                    out.push_str(user);
                    out.push(':');
                    out.push_str(MASK);
                }
                None if rules.lone_userinfo_is_user => out.push_str(userinfo),
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
                    Some((k, _)) if param_shown(&rules, k) => pair.to_owned(),
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

    /// Every secret [`Redactor::redact`] would mask in `url`, each in the forms it may be
    /// printed in (as written, percent-decoded): input for a [`Scrubber`].
    pub fn secrets(&self, url: &str) -> Vec<String> {
        let mut out = Vec::new();
        for item in items(url) {
            let p = parts(item);
            let rules = self.rules_for(p.scheme);
            if let Some(userinfo) = p.userinfo {
                match userinfo.split_once(':') {
                    Some((_, password)) => out.push(password.to_owned()),
                    None if rules.lone_userinfo_is_user => {}
                    None => out.push(userinfo.to_owned()),
                }
            }
            if let Some(query) = p.query {
                for pair in query.split('&') {
                    match pair.split_once('=') {
                        Some((k, v)) if !param_shown(&rules, k) => out.push(v.to_owned()),
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
}

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
/// (`mq://a:4222,mq://b:4222`); a comma elsewhere (inside a password) stays in its item, so
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

fn param_shown(rules: &UrlRules, key: &str) -> bool {
    let key = percent_decode(key).to_ascii_lowercase();
    rules.shown_params.contains(&key.as_str())
}

/// A URL (or a comma-separated list of URLs) with every secret masked by the generic rules
/// alone ([`Redactor::redact`] with no [`UrlRules`]): the password of `user:password@`, a lone
/// value before `@`, every query parameter's value, and any fragment. A binary that knows its
/// backends uses a [`Redactor`] with their rules instead, so that user names and harmless
/// settings stay readable.
pub fn redact_url(url: &str) -> String {
    Redactor::default().redact(url)
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
    /// A single value before `@`, without `:`: a token (`scheme://TOKEN@host`) for protocols
    /// that read it so, or a user name alone for the others.
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
/// let (url, creds) = split_credentials("acmes://relay:p%40ss@mq:7000");
/// assert_eq!(url, "acmes://mq:7000");
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

/// Every secret [`redact_url`] would mask in `url` (the generic rules), each in the forms it
/// may be printed in (as written, percent-decoded): input for a [`Scrubber`].
pub fn url_secrets(url: &str) -> Vec<String> {
    Redactor::default().secrets(url)
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
/// Which parts of a URL are secrets is its [`Redactor`]'s to say: give the scrubber the one
/// with the rules of the binary's backends ([`Scrubber::new`]), so that a user name its
/// protocol shows is not masked wherever it occurs. The default applies the generic rules.
///
/// ```
/// use outbox_core::secrets::Scrubber;
/// let mut s = Scrubber::default();
/// s.add_url("acme://app:s3cret@db/pay");
/// assert_eq!(s.scrub("connecting with s3cret"), "connecting with ***");
/// ```
#[derive(Clone, Default)]
pub struct Scrubber {
    /// Longest first.
    secrets: Vec<String>,
    /// Says what the secrets of a URL are.
    redactor: Redactor,
}

impl fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scrubber")
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

impl Scrubber {
    /// An empty scrubber that finds the secrets of a URL with `redactor`.
    pub fn new(redactor: Redactor) -> Self {
        Self {
            secrets: Vec::new(),
            redactor,
        }
    }

    /// Adds every secret of `url` (see [`Redactor::secrets`]).
    pub fn add_url(&mut self, url: &str) {
        for s in self.redactor.secrets(url) {
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

    /// A made-up database protocol: a lone user-info value is a user name, and a few
    /// connection settings are harmless.
    const DB: UrlRules = UrlRules {
        schemes: &["db", "dbs"],
        lone_userinfo_is_user: true,
        shown_params: &["sslmode", "sslrootcert", "application_name"],
    };

    fn db() -> Redactor {
        Redactor::new([DB])
    }

    #[test]
    fn user_and_password_keeps_the_user() {
        for r in [Redactor::default(), db()] {
            assert_eq!(
                r.redact("db://app:pw@db:5432/pay"),
                "db://app:***@db:5432/pay"
            );
            assert_eq!(
                r.redact("mq://guest:gu%40st@mq/%2f"),
                "mq://guest:***@mq/%2f"
            );
            assert_eq!(r.redact("db://app:@db/pay"), "db://app:***@db/pay");
        }
    }

    #[test]
    fn a_bare_token_is_masked_whole_unless_the_scheme_reads_a_user() {
        assert_eq!(redact_url("mq://s3cr3t@mq:4222"), "mq://***@mq:4222");
        assert_eq!(redact_url("s3cr3t@mq:4222"), "***@mq:4222");
        assert_eq!(redact_url("foo://s3cr3t@h"), "foo://***@h");
        // The generic rules mask a lone value of any scheme ...
        assert_eq!(redact_url("db://app@db/pay"), "db://***@db/pay");
        assert_eq!(url_secrets("db://app@db/pay"), vec!["app".to_owned()]);
        // ... a scheme's rules may say it is a user name, for that scheme (any case) only.
        assert_eq!(db().redact("db://app@db/pay"), "db://app@db/pay");
        assert_eq!(db().redact("DBS://app@db/pay"), "DBS://app@db/pay");
        assert!(db().secrets("db://app@db/pay").is_empty());
        assert_eq!(db().redact("mq://s3cr3t@h"), "mq://***@h");
        assert_eq!(db().redact("s3cr3t@h"), "***@h");
        assert_eq!(db().secrets("mq://s3cr3t@h"), vec!["s3cr3t".to_owned()]);
        assert_eq!(DB.redact("db://app@db/pay"), "db://app@db/pay");
    }

    #[test]
    fn query_values_are_masked_unless_harmless() {
        assert_eq!(
            db().redact("db://db/pay?password=pw&sslmode=require&SSLPASSWORD=x&flag"),
            "db://db/pay?password=***&sslmode=require&SSLPASSWORD=***&***"
        );
        assert_eq!(
            db().redact("db://db/pay?pass%77ord=pw"),
            "db://db/pay?pass%77ord=***"
        );
        assert_eq!(
            db().redact("db://db/pay?sslrootcert=/etc/ca.pem&SSL%6dode=x&application_name=relay"),
            "db://db/pay?sslrootcert=/etc/ca.pem&SSL%6dode=x&application_name=relay"
        );
        // A harmless setting of one scheme is masked on another, and by the generic rules.
        assert_eq!(db().redact("mq://h?sslmode=x"), "mq://h?sslmode=***");
        assert_eq!(redact_url("db://h?sslmode=x"), "db://h?sslmode=***");
        assert_eq!(db().redact("http://h/x#tok"), "http://h/x#***");
    }

    #[test]
    fn the_first_rules_for_a_scheme_win() {
        let token = UrlRules {
            schemes: &["db"],
            ..UrlRules::NONE
        };
        assert_eq!(
            Redactor::new([token, DB]).redact("db://app@h"),
            "db://***@h"
        );
        let r = Redactor::default().with(DB).with(token);
        assert_eq!(r.redact("db://app@h"), "db://app@h");
        assert_eq!(r.rules(), &[DB, token]);
    }

    #[test]
    fn lists_are_redacted_item_by_item_and_commas_in_secrets_stay_masked() {
        assert_eq!(
            redact_url("mq://a:pw@h1:4222,mq://tok@h2:4222,mq://h3:4222"),
            "mq://a:***@h1:4222,mq://***@h2:4222,mq://h3:4222"
        );
        assert_eq!(redact_url("mq://u:p,w@h"), "mq://u:***@h");
        assert_eq!(redact_url("h1:4222,h2:4222"), "h1:4222,h2:4222");
        // Each item by its own scheme's rules.
        assert_eq!(
            db().redact("db://app@h1,mq://tok@h2"),
            "db://app@h1,mq://***@h2"
        );
    }

    #[test]
    fn reserved_characters_in_passwords_never_leak_a_part() {
        for (url, secret) in [
            ("db://u:qq/zz@db/pay", "qq/zz"),
            ("db://u:qq?zz@db/pay", "qq?zz"),
            ("db://u:qq#zz@db/pay", "qq#zz"),
            ("db://u:qq@zz@db/pay", "qq@zz"),
        ] {
            for r in [Redactor::default(), db()] {
                let shown = r.redact(url);
                assert_eq!(shown, "db://u:***@db/pay", "{url}");
                assert!(!shown.contains("qq") && !shown.contains("zz"), "{shown}");
                assert!(r.secrets(url).contains(&secret.to_owned()), "{url}");
            }
        }
    }

    #[test]
    fn plain_text_is_unchanged() {
        assert_eq!(redact_url("mq://127.0.0.1:4222"), "mq://127.0.0.1:4222");
        assert_eq!(redact_url("127.0.0.1:9090"), "127.0.0.1:9090");
        assert_eq!(redact_url(""), "");
    }

    #[test]
    fn credentials_are_split_off_and_decoded() {
        assert_eq!(
            split_credentials("mq://tok%2Fen@h:4222"),
            (
                "mq://h:4222".to_owned(),
                Some(Credentials::Token("tok/en".into()))
            )
        );
        assert_eq!(
            split_credentials("mq://h1:4222,mq://u:p@h2:4222?x=1"),
            (
                "mq://h1:4222,mq://h2:4222?x=1".to_owned(),
                Some(Credentials::UserPassword {
                    user: "u".into(),
                    password: "p".into()
                })
            )
        );
        assert_eq!(
            split_credentials("mq://h:4222"),
            ("mq://h:4222".to_owned(), None)
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
        let shown = UrlRules {
            schemes: &["mq"],
            lone_userinfo_is_user: true,
            shown_params: &["heartbeat"],
        };
        let s = Redactor::new([shown]).secrets("mq://u:p%40ss@h/%2f?password=q%20w&heartbeat=10");
        for want in ["p%40ss", "p@ss", "q%20w", "q w"] {
            assert!(s.contains(&want.to_owned()), "{want} missing from {s:?}");
        }
        assert!(!s.contains(&"10".to_owned()), "{s:?}");
        assert!(url_secrets("mq://h:4222?heartbeat=10").contains(&"10".to_owned()));
        assert!(url_secrets("mq://h:4222").is_empty());
    }

    #[test]
    fn scrubber_masks_every_form() {
        let mut s = Scrubber::default();
        s.add_url("db://u:p%40ss\"w@db/pay?password=abc");
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
    fn a_scrubber_takes_the_secrets_its_redactor_finds() {
        // The generic rules count a lone user name as a possible token ...
        let mut generic = Scrubber::default();
        generic.add_url("db://app@db/pay");
        assert_eq!(generic.scrub("user app"), "user ***");
        // ... the protocol's rules say it is a user name, which stays readable everywhere.
        let mut s = Scrubber::new(db());
        s.add_url("db://app@db/pay?sslmode=require");
        assert!(s.is_empty());
        s.add_url("mq://t0ken@h");
        assert_eq!(s.scrub("user app, token t0ken"), "user app, token ***");
    }

    #[test]
    fn percent_decoding_keeps_malformed_escapes() {
        assert_eq!(percent_decode("a%2Fb%zz%4"), "a/b%zz%4");
    }
}
