//! [`RawNats`]: the NATS client protocol written by hand on a plain TCP socket, to put into a
//! JetStream stream what no client library sends: a header block with a value or a name that
//! is not UTF-8, a header line without `:`. The server stores such a message as it came, and
//! every consumer of the stream then receives it.
//!
//! ```ignore
//! let mut raw = RawNats::connect(&NATS.url()).await?;
//! let block = header_block(&[b"ce-id: 1", b"ce-type: caf\xe9"]);
//! let sequence = raw.publish_stored("outbox.payment.Created", &block, b"{}").await?;
//! ```

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::env::host_port;

/// How long [`RawNats`] waits for any answer of the server.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// A header block: the `NATS/1.0` version line, each of `lines` (written as given, each
/// followed by CRLF), and the blank line that ends the block.
pub fn header_block(lines: &[&[u8]]) -> Vec<u8> {
    let mut block = b"NATS/1.0\r\n".to_vec();
    for line in lines {
        block.extend_from_slice(line);
        block.extend_from_slice(b"\r\n");
    }
    block.extend_from_slice(b"\r\n");
    block
}

/// One connection speaking the NATS protocol by hand (`CONNECT` with headers, `SUB`, `HPUB`);
/// see the module docs.
#[derive(Debug)]
pub struct RawNats {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    inbox: String,
}

impl RawNats {
    /// Connects to the server of `url` (`nats://host:port`, no TLS, no credentials), says it
    /// sends headers, and subscribes to an inbox of its own for JetStream's answers.
    ///
    /// # Errors
    /// When the server cannot be reached or refuses the connection.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        let socket = TcpStream::connect(host_port(url)?)
            .await
            .with_context(|| format!("raw NATS connection to {url}"))?;
        let (read, writer) = socket.into_split();
        let mut raw = Self {
            reader: BufReader::new(read),
            writer,
            inbox: format!("_INBOX.raw.{}", uuid::Uuid::now_v7().simple()),
        };
        let info = raw.line().await?;
        ensure!(info.starts_with("INFO "), "expected INFO, got `{info}`");
        let subscribe = format!(
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true,\"protocol\":1,\"name\":\"outbox-raw-test\",\"lang\":\"raw\",\"version\":\"0\"}}\r\nSUB {} 1\r\nPING\r\n",
            raw.inbox
        );
        raw.writer.write_all(subscribe.as_bytes()).await?;
        loop {
            match raw.line().await?.as_str() {
                "PONG" => return Ok(raw),
                "PING" => raw.writer.write_all(b"PONG\r\n").await?,
                line if line.starts_with("-ERR") => bail!("the server refused: {line}"),
                _ => {}
            }
        }
    }

    /// Publishes `payload` with `header_block` (see [`header_block`]) to `subject` as one
    /// `HPUB`, and waits for the stream's acknowledgement.
    ///
    /// # Errors
    /// When the server refuses the message or no stream stores it (JetStream's error or no
    /// responders), or nothing comes back in time. Returns the stream sequence.
    pub async fn publish_stored(
        &mut self,
        subject: &str,
        header_block: &[u8],
        payload: &[u8],
    ) -> anyhow::Result<u64> {
        let mut frame = format!(
            "HPUB {subject} {} {} {}\r\n",
            self.inbox,
            header_block.len(),
            header_block.len() + payload.len()
        )
        .into_bytes();
        frame.extend_from_slice(header_block);
        frame.extend_from_slice(payload);
        frame.extend_from_slice(b"\r\n");
        self.writer.write_all(&frame).await?;
        let answer = self.answer().await?;
        let ack: serde_json::Value = serde_json::from_slice(&answer).with_context(|| {
            format!(
                "JetStream's answer to HPUB {subject}: {}",
                String::from_utf8_lossy(&answer)
            )
        })?;
        ack.get("seq")
            .and_then(serde_json::Value::as_u64)
            .with_context(|| format!("JetStream did not store the message on {subject}: {ack}"))
    }

    /// The payload of the next message on the inbox (a `MSG`, or an `HMSG` whose header is a
    /// status such as `503` no responders, which is an error).
    async fn answer(&mut self) -> anyhow::Result<Vec<u8>> {
        loop {
            let line = self.line().await?;
            let args: Vec<&str> = line.split_ascii_whitespace().collect();
            match args.first().copied() {
                Some("PING") => self.writer.write_all(b"PONG\r\n").await?,
                Some("-ERR") => bail!("the server refused: {line}"),
                Some("MSG") => {
                    let size: usize = args.last().context("MSG without size")?.parse()?;
                    return self.body(size).await;
                }
                Some("HMSG") => {
                    let size: usize = args.last().context("HMSG without size")?.parse()?;
                    let frame = self.body(size).await?;
                    bail!(
                        "an answer with headers: {}",
                        String::from_utf8_lossy(&frame)
                    );
                }
                _ => {}
            }
        }
    }

    /// `size` bytes and the CRLF after them.
    async fn body(&mut self, size: usize) -> anyhow::Result<Vec<u8>> {
        let mut body = vec![0; size + 2];
        tokio::time::timeout(ANSWER_WITHIN, self.reader.read_exact(&mut body))
            .await
            .context("no message body from the server in time")??;
        body.truncate(size);
        Ok(body)
    }

    /// The next protocol line, without its CRLF.
    async fn line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        let read = tokio::time::timeout(ANSWER_WITHIN, self.reader.read_line(&mut line))
            .await
            .context("no answer from the server in time")??;
        ensure!(read > 0, "the server closed the connection");
        Ok(line.trim_end().to_owned())
    }
}

/// The header blocks async-nats 0.51 refuses (it dropped the connection on each), each built
/// from a valid message's headers so that every other header, `ce-id` among them, stays
/// readable beside the defect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hostile {
    /// The value of `ce-type` followed by the byte `0xFF`: a value that is not UTF-8.
    ValueNotUtf8,
    /// A line `this line has no colon` after the first header.
    LineWithoutColon,
    /// A line `\xFF\xFE-name: value` after the first header: a name that is not UTF-8.
    NameNotUtf8,
}

impl Hostile {
    /// Every form.
    pub const ALL: [Hostile; 3] = [
        Hostile::ValueNotUtf8,
        Hostile::LineWithoutColon,
        Hostile::NameNotUtf8,
    ];

    /// The value [`Hostile::ValueNotUtf8`] sends as `ce-type`: the one in `headers` followed by
    /// `0xFF`; `None` without a `ce-type`.
    pub fn invalid_value(headers: &[(String, String)]) -> Option<Vec<u8>> {
        headers
            .iter()
            .find(|(name, _)| name == "ce-type")
            .map(|(_, value)| [value.as_bytes(), b"\xFF"].concat())
    }

    /// The header block of `headers` (name and value, as a transport writes them) with this
    /// defect.
    ///
    /// # Panics
    /// For [`Hostile::ValueNotUtf8`] when `headers` has no `ce-type`.
    pub fn block(self, headers: &[(String, String)]) -> Vec<u8> {
        let mut lines: Vec<Vec<u8>> = headers
            .iter()
            .map(|(name, value)| format!("{name}: {value}").into_bytes())
            .collect();
        match self {
            Hostile::ValueNotUtf8 => {
                let value = Self::invalid_value(headers).expect("a ce-type header");
                let line = lines
                    .iter_mut()
                    .find(|l| l.starts_with(b"ce-type:"))
                    .expect("a ce-type header");
                *line = [&b"ce-type: "[..], &value].concat();
            }
            Hostile::LineWithoutColon => {
                lines.insert(1.min(lines.len()), b"this line has no colon".to_vec());
            }
            Hostile::NameNotUtf8 => {
                lines.insert(1.min(lines.len()), b"\xFF\xFE-name: value".to_vec());
            }
        }
        let lines: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
        header_block(&lines)
    }
}
