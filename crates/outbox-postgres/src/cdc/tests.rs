//! The unit tests of the CDC stream: slot names, the replication connection's settings and
//! errors, and the pgoutput row decoder.

use outbox_core::Fingerprint;
use pg_walstream::ColumnData;
use pgwire_replication::SslMode;

use super::connection::{classify, replication_config};
use super::decode::{Columns, decode_row};
use super::slot::check_slot_name;
use super::*;

#[test]
fn slot_names_follow_the_servers_rule() {
    assert!(check_slot_name("outbox").is_ok());
    assert!(check_slot_name("t_0123_abc").is_ok());
    for bad in ["", "Outbox", "a-b", "a b", &"x".repeat(64)] {
        assert!(check_slot_name(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_url_gives_the_replication_connection() {
    let (c, fallback) = replication_config(
        "postgres://relay:p%40ss@db.example:6543/shop?sslmode=verify-full&sslrootcert=/ca.pem",
        "outbox",
        "outbox",
    )
    .unwrap();
    assert_eq!(fallback, None, "never plain text where TLS was required");
    assert_eq!(c.host, "db.example");
    assert_eq!(c.port, 6543);
    assert_eq!(c.user, "relay");
    assert_eq!(c.password, "p@ss");
    assert_eq!(c.database, "shop");
    assert!(c.tls.mode.verifies_hostname());
    assert_eq!(
        c.tls.ca_pem_path.as_deref(),
        Some(std::path::Path::new("/ca.pem"))
    );
    assert!(c.binary);

    let e = replication_config("mysql://x/y", "s", "p").unwrap_err();
    assert!(e.to_string().contains("postgres://"), "{e}");
    let e = replication_config("postgres://x/y?sslmode=sometimes", "s", "p").unwrap_err();
    assert!(e.to_string().contains("sometimes"), "{e}");
}

#[test]
fn sslmode_gives_the_tries_libpq_makes() {
    let modes = |url: &str| {
        let (c, fallback) = replication_config(url, "s", "p").unwrap();
        (c.tls.mode, fallback.map(|t| t.mode))
    };
    for url in ["postgres://x/y", "postgres://x/y?sslmode=prefer"] {
        assert_eq!(
            modes(url),
            (SslMode::Prefer, Some(SslMode::Disable)),
            "{url}"
        );
    }
    assert_eq!(
        modes("postgres://x/y?sslmode=allow"),
        (SslMode::Disable, Some(SslMode::Require))
    );
    assert_eq!(
        modes("postgres://x/y?sslmode=disable"),
        (SslMode::Disable, None)
    );
    assert_eq!(
        modes("postgres://x/y?sslmode=require"),
        (SslMode::Require, None)
    );
    let (c, fallback) =
        replication_config("postgres://x/y?sslcert=/c.pem&sslkey=/k.pem", "s", "p").unwrap();
    assert!(c.tls.is_mtls() && fallback.is_some());
}

#[test]
fn slot_errors_are_told_apart() {
    let e = |s: &str| pgwire_replication::PgWireError::Server(s.to_owned());
    assert!(matches!(
        classify(
            "s",
            e("replication slot \"s\" does not exist (SQLSTATE 42704)")
        ),
        CdcError::SlotMissing { .. }
    ));
    assert!(matches!(
        classify(
            "s",
            e("replication slot \"s\" is active for PID 42 (SQLSTATE 55006)")
        ),
        CdcError::SlotBusy { .. }
    ));
    assert!(matches!(
        classify(
            "s",
            e("can no longer get changes from replication slot \"s\" (SQLSTATE 55000)")
        ),
        CdcError::SlotInvalidated { .. }
    ));
    assert!(classify("s", e("connection reset")).is_transient());
}

/// The pgoutput row decoder over generated tuples (outbox_testkit::fuzz): each column as
/// the log gives it, or NULL, an unchanged-TOAST marker, the text form, bytes of the wrong
/// length, hostile text, JSON that is not an object of strings, an `infinity` time. The
/// decoder returns; only a key column that cannot be read stops the stream; a row it
/// decodes is one the relay can publish, with the values it was given; a row it refuses
/// keeps its key and a reason without NUL, and its stored columns are what the log gave.
mod fuzz {
    use outbox_testkit::fuzz::proptest::prelude::*;
    use outbox_testkit::fuzz::{self, hostile_text};

    use super::*;

    const COLUMNS: Columns = Columns {
        id: 0,
        event_id: 1,
        aggregate_type: 2,
        aggregate_id: 3,
        aggregate_version: 4,
        event_type: 5,
        schema_version: 6,
        content_type: 7,
        payload: 8,
        headers: 9,
        destination: 10,
        partition_key: 11,
        created_at: 12,
    };
    const KEY: [usize; 4] = [0, 2, 3, 4];

    fn text(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    fn jsonb(s: &str) -> Vec<u8> {
        let mut v = vec![1];
        v.extend_from_slice(s.as_bytes());
        v
    }

    /// The binary value of each column of a valid row.
    fn valid() -> impl Strategy<Value = Vec<Vec<u8>>> {
        (
            any::<i64>(),
            any::<u128>(),
            1i64..1000,
            -1_000_000_000_000i64..1_000_000_000_000,
        )
            .prop_map(|(id, event_id, version, micros)| {
                vec![
                    id.to_be_bytes().to_vec(),
                    event_id.to_be_bytes().to_vec(),
                    text("payment"),
                    text("pay-1"),
                    version.to_be_bytes().to_vec(),
                    text("PaymentCreated"),
                    1i32.to_be_bytes().to_vec(),
                    text("application/json"),
                    br#"{"amount":1}"#.to_vec(),
                    jsonb(r#"{"traceparent": "00-ab"}"#),
                    text("payments.created"),
                    text("pay-1"),
                    micros.to_be_bytes().to_vec(),
                ]
            })
    }

    /// What one column turns into.
    #[derive(Debug, Clone)]
    enum Change {
        Null,
        Unchanged,
        /// The text form instead of the binary one.
        Text,
        /// One byte short.
        Short,
        /// These bytes as the binary value.
        Bytes(Vec<u8>),
    }

    impl Change {
        fn apply(&self, valid: &[u8]) -> ColumnData {
            match self {
                Self::Null => ColumnData::null(),
                Self::Unchanged => ColumnData::unchanged(),
                Self::Text => ColumnData::text(valid.to_vec()),
                Self::Short => ColumnData::binary(valid[..valid.len().saturating_sub(1)].to_vec()),
                Self::Bytes(b) => ColumnData::binary(b.clone()),
            }
        }
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            Just(Change::Null),
            Just(Change::Unchanged),
            Just(Change::Text),
            Just(Change::Short),
            hostile_text(12).prop_map(|t| Change::Bytes(t.into_bytes())),
            prop::sample::select(vec![
                r#"{"t": null}"#,
                r#"{"n": 1e999}"#,
                r#"{"ce-id": "x"}"#,
                "[1]",
                "{",
                "\"s\"",
                r#"{"x": "a\u0007"}"#,
            ])
            .prop_map(|j| Change::Bytes(jsonb(j))),
            Just(Change::Bytes(i64::MAX.to_be_bytes().to_vec())),
            prop::collection::vec(any::<u8>(), 0..10).prop_map(Change::Bytes),
        ]
    }

    /// A row that decodes but cannot be published (a reserved header) is given back exactly as
    /// stored: its values were moved into a message first, then back into the row.
    #[test]
    fn a_row_refused_after_decoding_is_given_back_as_stored() {
        let id: i64 = 41;
        let event_id = uuid::Uuid::now_v7();
        let micros: i64 = 812_345_678_901_234;
        let headers = r#"{"ce-id":  "x", "a": "b"}"#;
        let values = [
            id.to_be_bytes().to_vec(),
            event_id.as_bytes().to_vec(),
            text("payment"),
            text("pay-1"),
            7i64.to_be_bytes().to_vec(),
            text("PaymentCreated"),
            3i32.to_be_bytes().to_vec(),
            text("application/json"),
            br#"{"amount":1}"#.to_vec(),
            jsonb(headers),
            text("payments.created"),
            text("key-9"),
            micros.to_be_bytes().to_vec(),
        ];
        let tuple: Vec<ColumnData> = values.iter().cloned().map(ColumnData::binary).collect();
        let Ok(Err(u)) = decode_row(&COLUMNS, &tuple) else {
            panic!("a reserved header must be refused after decoding");
        };
        assert!(u.row.reason.contains("ce-id"), "{}", u.row.reason);
        let expected = super::super::decode::StoredRow {
            id,
            event_id: Some(event_id),
            aggregate_type: "payment".into(),
            aggregate_id: "pay-1".into(),
            aggregate_version: 7,
            event_type: Some("PaymentCreated".into()),
            schema_version: Some(3),
            content_type: Some("application/json".into()),
            payload: Some(br#"{"amount":1}"#.to_vec()),
            headers: Some(headers.into()),
            destination: Some("payments.created".into()),
            partition_key: Some("key-9".into()),
            created_at: Some(micros),
            attempts: 0,
        };
        assert_eq!(u.stored, expected);
    }

    #[test]
    fn any_tuple_of_the_log() {
        let strategy = (
            valid(),
            prop::collection::vec((0usize..13, change()), 0..3),
            0usize..14,
        );
        fuzz::runner()
            .run(&strategy, |(values, changes, cut)| {
                let mut tuple: Vec<ColumnData> =
                    values.iter().cloned().map(ColumnData::binary).collect();
                let mut touched = Vec::new();
                for (column, change) in &changes {
                    tuple[*column] = change.apply(&values[*column]);
                    touched.push(*column);
                }
                // Now and then a tuple shorter than the relation (a column missing).
                if cut < 13 && changes.len() == 2 {
                    tuple.truncate(cut);
                    touched.extend(cut..13);
                }
                let key_touched = touched.iter().any(|c| KEY.contains(c));
                match decode_row(&COLUMNS, &tuple) {
                    Err(e) => prop_assert!(
                        key_touched,
                        "the stream stopped on {e} for a row whose key was readable"
                    ),
                    Ok(Ok(m)) => {
                        prop_assert!(
                            m.check_publishable_reserving(&[crate::RESERVED_HEADERS])
                                .is_ok(),
                            "{m:?}"
                        );
                        if !touched.contains(&0) {
                            prop_assert_eq!(
                                m.id,
                                i64::from_be_bytes(values[0].clone().try_into().unwrap())
                            );
                        }
                        if !touched.contains(&8) {
                            prop_assert_eq!(m.payload.bytes.as_ref(), values[8].as_slice());
                        }
                        prop_assert_eq!(m.fingerprint, Fingerprint::of(&m.payload.bytes));
                    }
                    Ok(Err(u)) => {
                        prop_assert!(
                            !touched.is_empty(),
                            "a valid row was refused: {}",
                            u.row.reason
                        );
                        prop_assert!(!u.row.reason.contains('\0'), "{:?}", u.row.reason);
                        prop_assert!(u.row.reason.chars().count() < 4096);
                        prop_assert_eq!(u.stored.id, u.row.id);
                    }
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
