//! Reading a NATS header block that the client library could not parse.
//!
//! async-nats hands such a message over with its header block as received
//! (`async_nats::Message::invalid_headers`, a fix this workspace carries, see
//! `vendor/README.md`) instead of dropping the connection. [`read`] takes from it what can be
//! read, line by line, the way the client reads a valid block (lines end at `\n`, a trailing
//! `\r` is dropped, a line starting with a space or tab continues the value before it, values
//! are trimmed, a repeated name keeps its values joined by `, `), and says what makes the
//! block invalid.

use std::collections::BTreeMap;

use bytes::Bytes;
use outbox_core::consumer::RawMessage;
use outbox_core::wire;

/// The name under which [`RawMessage`] keeps, byte for
/// byte, a header block that is not valid NATS headers (a line without `:`, a name that is not
/// printable ASCII, no `NATS/1.0` version line): in `headers` when the block is UTF-8 text,
/// else in `binary_headers`. It holds spaces, which no header name can, so it never collides
/// with a header.
pub const RAW_HEADER_BLOCK: &str = "NATS header block";

/// The header block `raw` keeps under [`RAW_HEADER_BLOCK`] (as text or as bytes), if any: what
/// a dead letter of a message whose headers were not valid NATS headers holds byte for byte.
pub fn raw_header_block(raw: &RawMessage) -> Option<&[u8]> {
    raw.binary_headers
        .get(RAW_HEADER_BLOCK)
        .map(AsRef::as_ref)
        .or_else(|| raw.headers.get(RAW_HEADER_BLOCK).map(String::as_bytes))
}

/// What [`read`] found in a header block.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Read {
    /// Every header of a readable line whose value is UTF-8 text.
    pub headers: BTreeMap<String, String>,
    /// Every header of a readable line whose value is not UTF-8, byte for byte.
    pub binary: BTreeMap<String, Bytes>,
    /// Why the block is not valid NATS headers (the first problem, printable), if it is not. A
    /// value that is not UTF-8 is not such a problem: its header is in `binary`.
    pub problem: Option<String>,
}

/// The version line every header block starts with.
const VERSION: &[u8] = b"NATS/1.0";

/// Reads `block` (from the version line to the blank line after the headers); see the module
/// docs.
pub(crate) fn read(block: &[u8]) -> Read {
    let mut read = Read::default();
    let mut lines = block
        .split(|b| *b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .enumerate()
        .map(|(i, line)| (i + 1, line));
    match lines.next() {
        Some((_, version)) if version == VERSION => {}
        Some((_, version)) => problem(
            &mut read,
            format!("the version line is `{}`, not `NATS/1.0`", shown(version)),
        ),
        None => problem(&mut read, "no version line".to_owned()),
    }
    // (name, value) of each readable line, continuation lines appended.
    let mut fields: Vec<(String, Vec<u8>)> = Vec::new();
    let mut last_readable = false;
    for (number, line) in lines {
        if line.is_empty() {
            continue;
        }
        if line[0] == b' ' || line[0] == b'\t' {
            if last_readable && let Some((_, value)) = fields.last_mut() {
                value.extend_from_slice(line);
            }
            continue;
        }
        last_readable = false;
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            problem(
                &mut read,
                format!("line {number} has no `:`: `{}`", shown(line)),
            );
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let Some(name) = std::str::from_utf8(name)
            .ok()
            .filter(|n| n.bytes().all(|b| b.is_ascii_graphic()))
        else {
            problem(
                &mut read,
                format!(
                    "line {number}: the header name `{}` is not printable ASCII",
                    shown(name)
                ),
            );
            continue;
        };
        fields.push((name.to_owned(), trim_start(value).to_vec()));
        last_readable = true;
    }
    let mut joined: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for (name, value) in fields {
        joined
            .entry(name)
            .or_default()
            .push(trim_end(&value).to_vec());
    }
    for (name, values) in joined {
        let value = values.join(&b", "[..]);
        match String::from_utf8(value) {
            Ok(text) => {
                read.headers.insert(name, text);
            }
            Err(e) => {
                read.binary.insert(name, Bytes::from(e.into_bytes()));
            }
        }
    }
    read
}

/// Keeps `why` unless a problem was found before.
fn problem(read: &mut Read, why: String) {
    if read.problem.is_none() {
        read.problem = Some(why);
    }
}

/// `bytes` as a reason may show them: lossy UTF-8, cut and with control characters replaced
/// as [`wire::excerpt`] does.
fn shown(bytes: &[u8]) -> String {
    wire::excerpt(&String::from_utf8_lossy(bytes))
}

/// Leading whitespace removed as the client removes it: Unicode whitespace from UTF-8 text,
/// ASCII whitespace otherwise.
fn trim_start(value: &[u8]) -> &[u8] {
    match std::str::from_utf8(value) {
        Ok(text) => text.trim_start().as_bytes(),
        Err(_) => value.trim_ascii_start(),
    }
}

/// Trailing whitespace removed, as [`trim_start`].
fn trim_end(value: &[u8]) -> &[u8] {
    match std::str::from_utf8(value) {
        Ok(text) => text.trim_end().as_bytes(),
        Err(_) => value.trim_ascii_end(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_valid_block_reads_as_the_client_reads_it() {
        let read = read(
            b"NATS/1.0\r\nce-id:  abc \r\nX-Multi: a\r\nX-Multi: b\r\nX-Folded: one\r\n two\r\n\r\n",
        );
        assert_eq!(read.problem, None);
        assert_eq!(
            read.headers,
            text(&[
                ("ce-id", "abc"),
                ("X-Multi", "a, b"),
                ("X-Folded", "one two")
            ])
        );
        assert!(read.binary.is_empty());
    }

    #[test]
    fn a_value_that_is_not_utf8_is_kept_as_bytes_and_is_no_problem() {
        let read = read(b"NATS/1.0\r\nce-id: 1\r\nce-type: caf\xe9 \r\n\r\n");
        assert_eq!(read.problem, None);
        assert_eq!(read.headers, text(&[("ce-id", "1")]));
        assert_eq!(read.binary["ce-type"].as_ref(), b"caf\xe9");
    }

    #[test]
    fn a_line_without_a_colon_is_a_problem_and_the_rest_is_read() {
        let read = read(b"NATS/1.0\r\nce-id: 1\r\nno colon\r\n  folded\r\nce-type: t\r\n\r\n");
        assert_eq!(
            read.problem.as_deref(),
            Some("line 3 has no `:`: `no colon`")
        );
        assert_eq!(read.headers, text(&[("ce-id", "1"), ("ce-type", "t")]));
    }

    #[test]
    fn a_name_that_is_not_printable_ascii_is_a_problem() {
        let read = read(b"NATS/1.0\r\n\xff\xfe: v\r\nce-id: 1\r\n\r\n");
        assert_eq!(
            read.problem.as_deref(),
            Some("line 2: the header name `\u{fffd}\u{fffd}` is not printable ASCII")
        );
        assert_eq!(read.headers, text(&[("ce-id", "1")]));
        let read = super::read(b"NATS/1.0\r\nbad name: v\r\n\r\n");
        assert!(read.problem.unwrap().contains("`bad name`"));
        let read = super::read(b"NATS/1.0\r\nnul\0: v\r\n\r\n");
        assert!(
            read.problem.unwrap().contains("`nul?`"),
            "control characters shown as ?"
        );
    }

    #[test]
    fn the_version_line_must_be_nats_1_0_alone() {
        for (block, shown) in [
            (&b"NATS/1.1\r\nce-id: 1\r\n\r\n"[..], "NATS/1.1"),
            (b"NATS/1.0 x\r\n\r\n", "NATS/1.0 x"),
            (b"ce-id: 1\r\n\r\n", "ce-id: 1"),
        ] {
            assert_eq!(
                read(block).problem,
                Some(format!("the version line is `{shown}`, not `NATS/1.0`"))
            );
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;

        /// A header name the client accepts: printable ASCII without `:`.
        fn name() -> impl Strategy<Value = String> {
            "[!-9;-~]{1,12}"
        }

        /// A value as a transport writes one: any text without line breaks, trimmed.
        fn value() -> impl Strategy<Value = String> {
            "[^\r\n]{0,24}".prop_map(|v| v.trim().to_owned())
        }

        proptest! {
            /// Any bytes: read never panics, and a block it finds no problem in holds only
            /// what its lines said.
            #[test]
            fn any_block_is_read_without_panicking(block in proptest::collection::vec(any::<u8>(), 0..256)) {
                let read = read(&block);
                if read.problem.is_none() {
                    prop_assert!(block.starts_with(VERSION));
                }
            }

            /// Headers written as the transport writes them, with one value made bytes that
            /// are not UTF-8: every other header reads back as written, the bytes as sent.
            #[test]
            fn written_headers_read_back(
                headers in proptest::collection::btree_map(name(), value(), 1..8),
                bad in proptest::collection::vec(0x80u8..=0xFF, 1..4),
            ) {
                let mut block = b"NATS/1.0\r\n".to_vec();
                for (n, v) in &headers {
                    block.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
                }
                let binary_name = "X-Binary-Value";
                let mut binary = b"a".to_vec();
                binary.extend_from_slice(&bad);
                let utf8 = std::str::from_utf8(&binary).is_ok();
                block.extend_from_slice(format!("{binary_name}: ").as_bytes());
                block.extend_from_slice(&binary);
                block.extend_from_slice(b"\r\n\r\n");
                let read = read(&block);
                prop_assert_eq!(read.problem, None);
                let mut expected = headers.clone();
                if utf8 {
                    // Bytes that happen to be UTF-8 (`\u{85}`, NEL, is `C2 85`) are text, trimmed
                    // as the client trims a value of a block it parses itself.
                    let text = String::from_utf8(binary.clone()).unwrap();
                    expected.insert(binary_name.to_owned(), text.trim().to_owned());
                } else {
                    prop_assert_eq!(read.binary.get(binary_name).map(|b| b.to_vec()), Some(binary));
                }
                prop_assert_eq!(read.headers, expected);
            }
        }
    }
}
