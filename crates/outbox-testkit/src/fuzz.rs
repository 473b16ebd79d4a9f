//! Property harnesses for the decoders at the boundaries: generated hostile inputs, and what a
//! decoder must hold for every one of them.
//!
//! A decoder here is a function a transport applies to a [`RawMessage`] (its `decode_raw` and
//! `identify_raw`): [`check_decoder`] feeds it messages built around a valid event, with some
//! of the CloudEvents attributes under the transport's own header prefix changed into what a
//! hostile or broken producer sends (missing, empty, repeated in another case, control
//! characters, over-long, not a number, a negative or huge version, a wrong fingerprint, a
//! binary value), beside random other headers and content types. For each message it checks:
//!
//! * the decoder returns (a panic fails the case);
//! * a decoded event holds only what the inbox can store and index: every text attribute
//!   without control characters and at most [`wire::MAX_ATTRIBUTE_CHARS`] characters, versions
//!   at least 1, the payload as received and its SHA-256 as the fingerprint, no protocol
//!   header among the user headers;
//! * a refusal's reason is printable and bounded (it is stored as the dead letter's reason);
//! * the identity read of the message agrees with the decoded event, and is bounded and
//!   printable too (it is stored in the dead letter's columns).
//!
//! Cases per property: `OUTBOX_FUZZ_CASES`, [`DEFAULT_CASES`] when unset (the short run every
//! `cargo test` makes); the long mode is the same test with a large number, e.g.
//! `OUTBOX_FUZZ_CASES=200000 cargo test --release -p outbox-nats --lib fuzz`
//! (docs/guide/src/troubleshooting.md, "Fuzzing the decoders", has every command and the last
//! long run's result). A failing case is shrunk and printed; `PROPTEST_RNG_SEED` replays a run.

use std::collections::BTreeMap;

use bytes::Bytes;
use outbox_core::consumer::RawMessage;
use outbox_core::wire::{self, DecodeError, EventIdentity, IncomingEvent, attr};
use outbox_core::{EventId, Fingerprint};
pub use proptest;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Cases per property when `OUTBOX_FUZZ_CASES` is not set.
pub const DEFAULT_CASES: u32 = 512;

/// Cases per property: `OUTBOX_FUZZ_CASES`, or [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    std::env::var("OUTBOX_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// A runner of [`cases`] cases that does not persist failures to files (a failing case is
/// printed with its seed instead).
pub fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    })
}

/// Characters that tell the rules apart: letters, digits, separators, percent signs (the NATS
/// binding percent-encodes), control characters (C0, DEL, C1), non-ASCII.
fn hostile_char() -> impl Strategy<Value = char> {
    prop_oneof![
        6 => prop::sample::select("abcXYZ019-_.:/".chars().collect::<Vec<_>>()),
        2 => prop::sample::select(" %25%zz;=\"'\\{}".chars().collect::<Vec<_>>()),
        1 => prop::sample::select(vec!['\0', '\t', '\n', '\r', '\u{1b}', '\u{7f}', '\u{85}']),
        1 => prop::sample::select(vec!['é', '€', '\u{fffd}', '\u{2028}', '😀']),
    ]
}

/// Text of up to `max` hostile characters (`hostile_char`).
pub fn hostile_text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(hostile_char(), 0..max).prop_map(|v| v.into_iter().collect())
}

/// A change to one attribute of a valid event.
#[derive(Debug, Clone)]
enum Change {
    /// Left out.
    Remove,
    /// Sent with this value instead.
    Value(String),
    /// Its header name in upper case.
    Upper,
    /// Sent twice, under two cases of its name, with two values.
    Twice,
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        1 => Just(Change::Remove),
        1 => Just(Change::Value(String::new())),
        3 => hostile_text(12).prop_map(Change::Value),
        1 => (250usize..260).prop_map(|n| Change::Value("a".repeat(n))),
        1 => prop::sample::select(vec!["0", "-1", "1.5", "99999999999999999999", " 1", "1 "])
            .prop_map(|s| Change::Value(s.to_owned())),
        1 => Just(Change::Value("p-1\r\nce-id: forged".to_owned())),
        1 => Just(Change::Upper),
        1 => Just(Change::Twice),
    ]
}

/// A valid event's attributes, by bare name, and its body.
fn valid_event() -> impl Strategy<Value = (BTreeMap<&'static str, String>, Bytes)> {
    (
        any::<u128>(),
        "[a-z]{1,8}",
        "[a-z0-9-]{1,12}",
        1i64..1000,
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(id, aggregate_type, aggregate_id, version, body)| {
            let body = Bytes::from(body);
            let mut a = BTreeMap::new();
            a.insert(attr::SPECVERSION, wire::SPEC_VERSION.to_owned());
            a.insert(attr::ID, EventId::from_u128(id).hyphenated().to_string());
            a.insert(attr::SOURCE, "/outbox".to_owned());
            a.insert(attr::TYPE, "PaymentCreated".to_owned());
            a.insert(attr::SUBJECT, aggregate_id.clone());
            a.insert(attr::TIME, "2026-12-06T10:00:00.000001Z".to_owned());
            a.insert(attr::AGGREGATE_TYPE, aggregate_type);
            a.insert(attr::AGGREGATE_ID, aggregate_id.clone());
            a.insert(attr::AGGREGATE_VERSION, version.to_string());
            a.insert(attr::SCHEMA_VERSION, "1".to_owned());
            a.insert(attr::PARTITION_KEY, aggregate_id);
            a.insert(attr::PAYLOAD_SHA256, Fingerprint::of(&body).to_hex());
            (a, body)
        })
}

/// A message as a transport whose attribute headers are `<prefix><attribute>` hands it to its
/// decoder: a valid event with none, one or two attributes changed (see the module docs: left
/// out, another value, the header name in upper case, sent twice in two cases), random user
/// headers, binary headers (an attribute among them now and then), and a content type that may
/// be missing or hostile. `encode` turns an attribute's text into the header value the binding sends (the
/// NATS binding percent-encodes; others send it as it is).
pub fn raw_message(
    prefix: &'static str,
    encode: fn(&str) -> String,
) -> impl Strategy<Value = RawMessage> {
    (
        valid_event(),
        // Mostly none or one change, so that about a third of the messages are valid.
        prop::collection::vec((prop::sample::select(attr::ALL.to_vec()), change()), 0..3),
        prop::collection::btree_map(hostile_text(10), hostile_text(10), 0..3),
        prop::collection::btree_map(
            prop_oneof![
                3 => hostile_text(10),
                1 => prop::sample::select(attr::ALL.to_vec())
                    .prop_map(move |a| format!("{prefix}{a}")),
            ],
            prop::collection::vec(any::<u8>(), 0..8).prop_map(Bytes::from),
            0..2,
        ),
        prop_oneof![
            4 => Just(Some("application/json".to_owned())),
            1 => Just(None),
            2 => hostile_text(20).prop_map(Some),
        ],
    )
        .prop_map(
            move |((mut attributes, body), changes, user, binary, content_type)| {
                let mut upper = Vec::new();
                let mut twice = Vec::new();
                for (name, change) in changes {
                    match change {
                        Change::Remove => {
                            attributes.remove(name);
                        }
                        Change::Value(v) => {
                            attributes.insert(name, v);
                        }
                        Change::Upper => upper.push(name),
                        Change::Twice => twice.push(name),
                    }
                }
                let mut headers = user;
                for (name, value) in attributes {
                    let header = format!("{prefix}{name}");
                    let encoded = encode(&value);
                    if twice.contains(&name) {
                        // A decoder must not pick one of two values.
                        headers.insert(header.to_uppercase(), format!("{encoded}x"));
                        headers.insert(header, encoded);
                    } else if upper.contains(&name) {
                        headers.insert(header.to_uppercase(), encoded);
                    } else {
                        headers.insert(header, encoded);
                    }
                }
                let mut binary_headers = BTreeMap::new();
                for (name, value) in binary {
                    headers.remove(&name);
                    binary_headers.insert(name, value);
                }
                RawMessage {
                    payload: body,
                    headers,
                    content_type,
                    binary_headers,
                    metadata: BTreeMap::new(),
                }
            },
        )
}

/// Text a store can keep and an operator can read: no control character, at most `max`
/// characters.
fn storable(what: &str, value: &str, max: usize) -> Result<(), TestCaseError> {
    prop_assert!(
        !value.chars().any(char::is_control),
        "{what} holds a control character: {value:?}"
    );
    let len = value.chars().count();
    prop_assert!(len <= max, "{what} is {len} characters long: {value:?}");
    Ok(())
}

/// What must hold of a decoded event (see the module docs).
pub fn check_decoded(
    raw: &RawMessage,
    event: &IncomingEvent,
    prefix: &str,
) -> Result<(), TestCaseError> {
    let max = wire::MAX_ATTRIBUTE_CHARS;
    for (what, value) in [
        ("type", &event.event_type),
        ("source", &event.source),
        ("aggregatetype", &event.aggregate_type),
        ("aggregateid", &event.aggregate_id),
        ("partitionkey", &event.partition_key),
        ("datacontenttype", &event.payload.content_type.0),
    ] {
        storable(what, value, max)?;
        if what != "source" && what != "datacontenttype" {
            prop_assert!(!value.is_empty(), "{what} is empty");
        }
    }
    prop_assert!(event.aggregate_version >= 1);
    prop_assert!(event.schema_version >= 1);
    prop_assert_eq!(&event.payload.bytes, &raw.payload);
    prop_assert_eq!(event.fingerprint, Fingerprint::of(&raw.payload));
    let lower = prefix.to_ascii_lowercase();
    for name in event.headers.keys() {
        prop_assert!(
            !name.to_ascii_lowercase().starts_with(&lower),
            "the protocol header {name:?} is among the user headers"
        );
    }
    Ok(())
}

/// What must hold of a refusal's reason: printable and bounded.
pub fn check_refused(error: &DecodeError) -> Result<(), TestCaseError> {
    storable("the reason", &error.to_string(), 2048)
}

/// What must hold of an identity read of a message (see the module docs).
pub fn check_identity(
    identity: &EventIdentity,
    decoded: Option<&IncomingEvent>,
) -> Result<(), TestCaseError> {
    let max = wire::MAX_ATTRIBUTE_CHARS;
    for value in [
        &identity.aggregate_type,
        &identity.aggregate_id,
        &identity.event_type,
    ]
    .into_iter()
    .flatten()
    {
        storable("an identity field", value, max)?;
    }
    prop_assert!(identity.aggregate_version.is_none_or(|v| v >= 1));
    if let Some(event) = decoded {
        prop_assert_eq!(identity, &EventIdentity::of(event));
    }
    Ok(())
}

/// Runs the decoder property over [`cases`] generated messages (see the module docs):
/// `decode` and `identify` are the transport's, `prefix` and `encode` its attribute binding.
/// Returns how many decoded and how many were refused, so a caller can check the generator
/// reaches both.
///
/// # Panics
/// On the first case that breaks the property, after shrinking it, naming it.
pub fn check_decoder(
    prefix: &'static str,
    encode: fn(&str) -> String,
    decode: impl Fn(&RawMessage) -> Result<IncomingEvent, DecodeError>,
    identify: impl Fn(&RawMessage) -> EventIdentity,
) -> (u32, u32) {
    let counts = std::cell::Cell::new((0u32, 0u32));
    runner()
        .run(&raw_message(prefix, encode), |raw| {
            let decoded = decode(&raw);
            match &decoded {
                Ok(event) => check_decoded(&raw, event, prefix)?,
                Err(e) => check_refused(e)?,
            }
            check_identity(&identify(&raw), decoded.as_ref().ok())?;
            let (ok, refused) = counts.get();
            counts.set(match decoded {
                Ok(_) => (ok + 1, refused),
                Err(_) => (ok, refused + 1),
            });
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let (ok, refused) = counts.get();
    assert!(
        ok > 0 && refused > 0,
        "the generator reached one side only: {ok} decoded, {refused} refused"
    );
    (ok, refused)
}
