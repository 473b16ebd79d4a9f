//! Subject, stream-name and header-value rules of the NATS protocol.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Longest subject accepted. The server's protocol control line is 4 KiB by default and also
/// carries the reply inbox and sizes; subjects near that are a configuration mistake.
pub(crate) const MAX_SUBJECT_LEN: usize = 1024;

/// Longest stream name (JetStream stores streams as directories named after them).
const MAX_STREAM_NAME_LEN: usize = 255;

/// True for characters a subject token cannot hold: the separator, the wildcards, whitespace
/// and control characters.
fn is_forbidden_in_token(c: char) -> bool {
    c == '.' || c == '*' || c == '>' || c.is_whitespace() || c.is_control()
}

/// Makes `value` usable as ONE subject token: every forbidden character becomes `_`.
///
/// Distinct values may map to the same token (`a.b` and `a_b`); that only merges subjects,
/// never events (the event id and the `ce-` headers are unchanged).
pub(crate) fn sanitize_token(value: &str) -> String {
    value
        .chars()
        .map(|c| if is_forbidden_in_token(c) { '_' } else { c })
        .collect()
}

fn check_tokens(subject: &str, allow_wildcards: bool) -> Result<(), String> {
    if subject.is_empty() {
        return Err("subject is empty".to_owned());
    }
    if subject.len() > MAX_SUBJECT_LEN {
        return Err(format!(
            "subject is {} bytes long, more than {MAX_SUBJECT_LEN}",
            subject.len()
        ));
    }
    if let Some(c) = subject
        .chars()
        .find(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "subject `{}` contains whitespace or a control character ({c:?})",
            subject.escape_debug()
        ));
    }
    let tokens: Vec<&str> = subject.split('.').collect();
    for (i, token) in tokens.iter().enumerate() {
        if token.is_empty() {
            return Err(format!("subject `{subject}` has an empty token"));
        }
        let wildcard = *token == "*" || *token == ">";
        if wildcard && !allow_wildcards {
            return Err(format!(
                "subject `{subject}` has a wildcard token `{token}`; a publish subject must be literal"
            ));
        }
        if *token == ">" && i + 1 != tokens.len() {
            return Err(format!(
                "subject `{subject}`: `>` may only be the last token"
            ));
        }
    }
    Ok(())
}

/// Checks a subject a message is published to: non-empty, no empty token, no whitespace or
/// control character, no wildcard token.
pub(crate) fn check_publish_subject(subject: &str) -> Result<(), String> {
    check_tokens(subject, false)
}

/// Checks a stream subject filter (wildcards `*` and a final `>` allowed).
pub(crate) fn check_filter(subject: &str) -> Result<(), String> {
    check_tokens(subject, true)
}

/// Checks a JetStream stream name.
pub(crate) fn check_stream_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("stream name is empty".to_owned());
    }
    if name.len() > MAX_STREAM_NAME_LEN {
        return Err(format!(
            "stream name is longer than {MAX_STREAM_NAME_LEN} bytes"
        ));
    }
    if name
        .chars()
        .any(|c| is_forbidden_in_token(c) || c == '/' || c == '\\')
    {
        return Err(format!(
            "stream name `{}` must not contain whitespace, control characters, `.`, `*`, `>`, `/` or `\\`",
            name.escape_debug()
        ));
    }
    Ok(())
}

/// Checks a JetStream consumer (durable) name: the same rules as a stream name.
pub(crate) fn check_consumer_name(name: &str) -> Result<(), String> {
    check_stream_name(name).map_err(|why| why.replacen("stream name", "consumer name", 1))
}

/// Reverses [`percent_encode`]: every `%XX` (hex digits, either case) becomes the byte `XX`;
/// everything else is copied unchanged. The result must be UTF-8.
///
/// Strict on purpose: a `%` not followed by two hex digits, or bytes that are not UTF-8 once
/// decoded, are an error (the value was not encoded as the binding prescribes), never a
/// best-effort guess.
pub(crate) fn percent_decode(value: &str) -> Result<String, String> {
    if !value.contains('%') {
        return Ok(value.to_owned());
    }
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = |b: u8| char::from(b).to_digit(16);
            match (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            ) {
                (Some(hi), Some(lo)) => {
                    // Two hex digits are at most 0xFF.
                    out.push(u8::try_from(hi * 16 + lo).unwrap_or(u8::MAX));
                    i += 3;
                }
                _ => return Err(format!("`%` at byte {i} is not followed by two hex digits")),
            }
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the percent-decoded bytes are not UTF-8".to_owned())
}

/// Percent-encodes a CloudEvents attribute value as the NATS protocol binding prescribes:
/// every UTF-8 byte outside printable ASCII (0x21..=0x7E), plus space, `"` and `%`, becomes
/// `%XX` (upper-case hex). Everything else is copied unchanged. (The publish path uses
/// [`percent_encoded`]; this form serves the tests.)
#[cfg(test)]
pub(crate) fn percent_encode(value: &str) -> String {
    percent_encoded(Cow::Borrowed(value)).into_owned()
}

/// [`percent_encode`] without a copy when nothing needs escaping (ids, versions, times, most
/// names): `value` itself is returned then.
pub(crate) fn percent_encoded(value: Cow<'_, str>) -> Cow<'_, str> {
    let keeps = |b: u8| (0x21..=0x7E).contains(&b) && b != b'"' && b != b'%';
    if value.bytes().all(keeps) {
        return value;
    }
    let mut out = String::with_capacity(value.len() + 8);
    for b in value.bytes() {
        if keeps(b) {
            out.push(char::from(b));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_replaces_what_a_token_cannot_hold() {
        assert_eq!(sanitize_token("PaymentCreated"), "PaymentCreated");
        assert_eq!(sanitize_token("a.b*c>d e\tf\u{0}g"), "a_b_c_d_e_f_g");
        assert_eq!(sanitize_token("zahlung-ä"), "zahlung-ä");
        assert_eq!(sanitize_token("a\u{a0}b"), "a_b");
    }

    #[test]
    fn publish_subjects_are_checked() {
        assert!(check_publish_subject("outbox.payment.Created").is_ok());
        assert!(check_publish_subject("").is_err());
        assert!(check_publish_subject("a..b").is_err());
        assert!(check_publish_subject(".a").is_err());
        assert!(check_publish_subject("a.").is_err());
        assert!(check_publish_subject("a b").is_err());
        assert!(check_publish_subject("a.\r\n").is_err());
        assert!(check_publish_subject("a.*").is_err());
        assert!(check_publish_subject("a.>").is_err());
        assert!(check_publish_subject(&"a".repeat(MAX_SUBJECT_LEN + 1)).is_err());
    }

    #[test]
    fn filters_allow_wildcards() {
        assert!(check_filter("outbox.>").is_ok());
        assert!(check_filter("outbox.*.x").is_ok());
        assert!(check_filter(">").is_ok());
        assert!(check_filter("a.>.b").is_err());
        assert!(check_filter("a..>").is_err());
    }

    #[test]
    fn stream_names_are_checked() {
        assert!(check_stream_name("OUTBOX").is_ok());
        assert!(check_stream_name("outbox-test_1").is_ok());
        for bad in ["", "a.b", "a b", "a*", "a>", "a/b", "a\\b", "a\nb"] {
            assert!(check_stream_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn percent_decoding_reverses_the_encoding() {
        for v in [
            "",
            "/outbox",
            "a b",
            "100%",
            "say \"hi\"",
            "€ ä\t\u{7f}",
            "Zahlung.Erstellt-ü",
            "%41",
            "~!'(){}",
        ] {
            assert_eq!(
                percent_decode(&percent_encode(v)).as_deref(),
                Ok(v),
                "{v:?}"
            );
        }
        assert_eq!(percent_decode("a%2fb%2Fc").as_deref(), Ok("a/b/c"));
        // Unencoded non-ASCII is taken as it is.
        assert_eq!(percent_decode("ä%20b").as_deref(), Ok("ä b"));
        for bad in ["%", "%4", "%G1", "a%2", "%C3", "%FF%FE"] {
            assert!(percent_decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn consumer_names_are_checked() {
        assert!(check_consumer_name("outbox-consumer").is_ok());
        let why = check_consumer_name("a.b").unwrap_err();
        assert!(why.contains("consumer name"), "{why}");
        assert!(check_consumer_name("").is_err());
    }

    #[test]
    fn percent_encoding_follows_the_nats_binding() {
        assert_eq!(percent_encode("/outbox"), "/outbox");
        assert_eq!(
            percent_encode("2024-01-02T03:04:05.123456Z"),
            "2024-01-02T03:04:05.123456Z"
        );
        assert_eq!(percent_encode("a b"), "a%20b");
        assert_eq!(percent_encode("100%"), "100%25");
        assert_eq!(percent_encode("say \"hi\""), "say%20%22hi%22");
        assert_eq!(percent_encode("€"), "%E2%82%AC");
        assert_eq!(percent_encode("ä\t\u{7f}"), "%C3%A4%09%7F");
        assert_eq!(percent_encode("~!'(){}"), "~!'(){}");
    }
}
