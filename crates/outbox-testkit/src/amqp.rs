//! Raw AMQP 0-9-1 frames on a socket, for hostile-input tests: [`RawPublisher`] writes the
//! frames of a publish itself (method, content header, body), so a test can put on the wire
//! what no client library sends: a short string that is not UTF-8, a header named twice, a
//! header name with a NUL, a table nested thousands of levels deep, any field type.
//!
//! It is not a client. It knows the handshake (PLAIN, no TLS), one channel in
//! publisher-confirm mode and `basic.publish`, and fails loudly on anything else, with the
//! broker's reply text when the broker closes the channel or the connection.
//!
//! ```ignore
//! use outbox_testkit::amqp::{Properties, RawPublisher, Table, Value};
//! let mut publisher = RawPublisher::connect(&RABBITMQ.url()).await?;
//! let headers = Table::default()
//!     .entry(b"cloudEvents_id", Value::LongInt(5))
//!     .entry(b"\xff\xfe", Value::LongString(b"x".to_vec()));
//! let properties = Properties::default().content_type(b"application/\xff").headers(&headers);
//! publisher.publish(b"outbox", b"payment.p-1", &properties, b"{}").await?;
//! ```

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::env::host_port;

const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xce;
const CHANNEL: u16 = 1;
/// How long a reply of the broker may take.
const REPLY_WITHIN: Duration = Duration::from_secs(10);

/// A field value, encoded with RabbitMQ's type letters (the ones it accepts and delivers).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `t`
    Bool(bool),
    /// `b`
    ShortShortInt(i8),
    /// `B`
    ShortShortUInt(u8),
    /// `s` (RabbitMQ's letter; the specification's `U` is refused by the broker)
    ShortInt(i16),
    /// `u`
    ShortUInt(u16),
    /// `I`
    LongInt(i32),
    /// `i`
    LongUInt(u32),
    /// `l`
    LongLongInt(i64),
    /// `f`
    Float(f32),
    /// `d`
    Double(f64),
    /// `D`: scale, then value.
    Decimal(u8, u32),
    /// `S`: any bytes.
    LongString(Vec<u8>),
    /// `A`
    Array(Vec<Value>),
    /// `T`
    Timestamp(u64),
    /// `F`
    Table(Table),
    /// `V`
    Void,
    /// `x`: any bytes.
    Bytes(Vec<u8>),
    /// A type letter and the value's encoding as given (for example from [`nested_tables`]).
    Raw(u8, Vec<u8>),
}

impl Value {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Bool(b) => out.extend([b't', u8::from(*b)]),
            Self::ShortShortInt(n) => out.extend([b'b', n.to_be_bytes()[0]]),
            Self::ShortShortUInt(n) => out.extend([b'B', *n]),
            Self::ShortInt(n) => tagged(out, b's', &n.to_be_bytes()),
            Self::ShortUInt(n) => tagged(out, b'u', &n.to_be_bytes()),
            Self::LongInt(n) => tagged(out, b'I', &n.to_be_bytes()),
            Self::LongUInt(n) => tagged(out, b'i', &n.to_be_bytes()),
            Self::LongLongInt(n) => tagged(out, b'l', &n.to_be_bytes()),
            Self::Float(n) => tagged(out, b'f', &n.to_be_bytes()),
            Self::Double(n) => tagged(out, b'd', &n.to_be_bytes()),
            Self::Decimal(scale, n) => {
                out.extend([b'D', *scale]);
                out.extend(n.to_be_bytes());
            }
            Self::LongString(b) => {
                out.push(b'S');
                long_bytes(out, b);
            }
            Self::Array(values) => {
                let mut body = Vec::new();
                for v in values {
                    v.encode(&mut body);
                }
                out.push(b'A');
                long_bytes(out, &body);
            }
            Self::Timestamp(n) => tagged(out, b'T', &n.to_be_bytes()),
            Self::Table(t) => {
                out.push(b'F');
                out.extend(t.encode());
            }
            Self::Void => out.push(b'V'),
            Self::Bytes(b) => {
                out.push(b'x');
                long_bytes(out, b);
            }
            Self::Raw(kind, bytes) => tagged(out, *kind, bytes),
        }
    }
}

fn tagged(out: &mut Vec<u8>, kind: u8, bytes: &[u8]) {
    out.push(kind);
    out.extend_from_slice(bytes);
}

fn long_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend(
        u32::try_from(bytes.len())
            .expect("under 4 GiB")
            .to_be_bytes(),
    );
    out.extend_from_slice(bytes);
}

fn short_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(u8::try_from(bytes.len()).expect("a short string is at most 255 bytes"));
    out.extend_from_slice(bytes);
}

/// A field table as it goes on the wire: entries in the order added, any name bytes, the same
/// name as often as given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    entries: Vec<u8>,
}

impl Table {
    /// Adds the entry `name` = `value`.
    #[must_use]
    pub fn entry(mut self, name: &[u8], value: Value) -> Self {
        short_bytes(&mut self.entries, name);
        value.encode(&mut self.entries);
        self
    }

    /// The table's encoding (a long length, then the entries).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() + 4);
        long_bytes(&mut out, &self.entries);
        out
    }
}

/// A table value of `levels` tables, each the only entry (named `n`) of the one around it,
/// built without recursion.
pub fn nested_tables(levels: usize) -> Value {
    let levels = levels.max(1);
    let mut bytes = Vec::with_capacity(levels * 7);
    for inner in (1..levels).rev() {
        bytes.extend((u32::try_from(inner * 7).expect("under 4 GiB")).to_be_bytes());
        bytes.extend([1, b'n', b'F']);
    }
    bytes.extend([0, 0, 0, 0]);
    Value::Raw(b'F', bytes)
}

/// The property list of a content header: each property by its bytes, any bytes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Properties {
    /// Indexed by the property's position (0 = content type ... 13 = cluster id).
    fields: [Option<Vec<u8>>; 14],
}

macro_rules! short_string_properties {
    ($($(#[$doc:meta])* $name:ident = $index:expr;)*) => {$(
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, value: &[u8]) -> Self {
            let mut bytes = Vec::new();
            short_bytes(&mut bytes, value);
            self.fields[$index] = Some(bytes);
            self
        }
    )*};
}

impl Properties {
    short_string_properties! {
        /// `content-type`
        content_type = 0;
        /// `content-encoding`
        content_encoding = 1;
        /// `correlation-id`
        correlation_id = 5;
        /// `reply-to`
        reply_to = 6;
        /// `expiration` (RabbitMQ refuses one that is not a number)
        expiration = 7;
        /// `message-id`
        message_id = 8;
        /// `type`
        kind = 10;
        /// `user-id` (RabbitMQ refuses one other than the publisher's user)
        user_id = 11;
        /// `app-id`
        app_id = 12;
        /// `cluster-id`
        cluster_id = 13;
    }

    /// `headers`
    #[must_use]
    pub fn headers(mut self, table: &Table) -> Self {
        self.fields[2] = Some(table.encode());
        self
    }

    /// `delivery-mode` (2 = persistent)
    #[must_use]
    pub fn delivery_mode(mut self, mode: u8) -> Self {
        self.fields[3] = Some(vec![mode]);
        self
    }

    /// `priority`
    #[must_use]
    pub fn priority(mut self, priority: u8) -> Self {
        self.fields[4] = Some(vec![priority]);
        self
    }

    /// `timestamp`
    #[must_use]
    pub fn timestamp(mut self, seconds: u64) -> Self {
        self.fields[9] = Some(seconds.to_be_bytes().to_vec());
        self
    }

    /// The property flags and the values present, in order.
    pub fn encode(&self) -> Vec<u8> {
        let mut flags: u16 = 0;
        let mut values = Vec::new();
        for (index, field) in self.fields.iter().enumerate() {
            if let Some(bytes) = field {
                flags |= 1 << (15 - index);
                values.extend_from_slice(bytes);
            }
        }
        let mut out = flags.to_be_bytes().to_vec();
        out.extend(values);
        out
    }
}

/// One connection with one channel in publisher-confirm mode, written frame by frame.
#[derive(Debug)]
pub struct RawPublisher {
    stream: TcpStream,
    received: Vec<u8>,
    frame_max: u32,
    published: u64,
}

fn method(class: u16, method: u16, arguments: &[u8]) -> Vec<u8> {
    let mut out = class.to_be_bytes().to_vec();
    out.extend(method.to_be_bytes());
    out.extend_from_slice(arguments);
    out
}

fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend(channel.to_be_bytes());
    long_bytes(&mut out, payload);
    out.push(FRAME_END);
    out
}

/// `%XX` sequences of a URL part decoded.
fn percent_decoded(part: &str) -> anyhow::Result<Vec<u8>> {
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = part
                .get(i + 1..i + 3)
                .with_context(|| format!("a cut `%` escape in `{part}`"))?;
            out.push(u8::from_str_radix(hex, 16).with_context(|| format!("`%{hex}`"))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(out)
}

impl RawPublisher {
    /// Connects to `url` (`amqp://user:password@host:port/vhost`), logs in with PLAIN, opens
    /// channel 1 and puts it in confirm mode.
    ///
    /// # Errors
    /// When the broker cannot be reached or refuses a step.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        let address = host_port(url)?;
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        let (authority, vhost) = rest.split_once('/').unwrap_or((rest, ""));
        let vhost = vhost.split('?').next().unwrap_or_default();
        let vhost = if vhost.is_empty() {
            b"/".to_vec()
        } else {
            percent_decoded(vhost)?
        };
        let (user, password) = match authority.rsplit_once('@') {
            Some((credentials, _)) => {
                let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
                (percent_decoded(user)?, percent_decoded(password)?)
            }
            None => (b"guest".to_vec(), b"guest".to_vec()),
        };
        let stream = TcpStream::connect(&address)
            .await
            .with_context(|| format!("connecting to {address}"))?;
        let mut this = Self {
            stream,
            received: Vec::new(),
            frame_max: 4096,
            published: 0,
        };
        this.stream.write_all(b"AMQP\x00\x00\x09\x01").await?;
        this.expect(0, 10, 10, "connection.start").await?;
        let mut start_ok = Vec::new();
        long_bytes(&mut start_ok, &[]);
        short_bytes(&mut start_ok, b"PLAIN");
        long_bytes(
            &mut start_ok,
            &[b"\0".as_slice(), &user, b"\0", &password].concat(),
        );
        short_bytes(&mut start_ok, b"en_US");
        this.send_method(0, method(10, 11, &start_ok)).await?;
        let tune = this.expect(0, 10, 30, "connection.tune").await?;
        ensure!(tune.len() >= 12, "connection.tune too short");
        let channel_max = u16::from_be_bytes([tune[4], tune[5]]);
        let frame_max = u32::from_be_bytes([tune[6], tune[7], tune[8], tune[9]]);
        this.frame_max = if frame_max == 0 { 131_072 } else { frame_max };
        let mut tune_ok = channel_max.to_be_bytes().to_vec();
        tune_ok.extend(this.frame_max.to_be_bytes());
        tune_ok.extend(0u16.to_be_bytes());
        this.send_method(0, method(10, 31, &tune_ok)).await?;
        let mut open = Vec::new();
        short_bytes(&mut open, &vhost);
        short_bytes(&mut open, b"");
        open.push(0);
        this.send_method(0, method(10, 40, &open)).await?;
        this.expect(0, 10, 41, "connection.open-ok").await?;
        this.send_method(CHANNEL, method(20, 10, &[0])).await?;
        this.expect(CHANNEL, 20, 11, "channel.open-ok").await?;
        this.send_method(CHANNEL, method(85, 10, &[0])).await?;
        this.expect(CHANNEL, 85, 11, "confirm.select-ok").await?;
        Ok(this)
    }

    /// The largest frame the broker accepts, as tuned.
    pub fn frame_max(&self) -> u32 {
        self.frame_max
    }

    /// Publishes `body` to `exchange` with `routing_key` and `properties`, all as given, and
    /// waits for the broker's confirm.
    ///
    /// # Errors
    /// When the broker refuses the message (`basic.nack`) or closes the channel or the
    /// connection (the error has its reply text), or the socket fails.
    pub async fn publish(
        &mut self,
        exchange: &[u8],
        routing_key: &[u8],
        properties: &Properties,
        body: &[u8],
    ) -> anyhow::Result<()> {
        let mut arguments = 0u16.to_be_bytes().to_vec();
        short_bytes(&mut arguments, exchange);
        short_bytes(&mut arguments, routing_key);
        arguments.push(0);
        let mut out = frame(FRAME_METHOD, CHANNEL, &method(60, 40, &arguments));
        let mut header = 60u16.to_be_bytes().to_vec();
        header.extend(0u16.to_be_bytes());
        header.extend((body.len() as u64).to_be_bytes());
        header.extend(properties.encode());
        out.extend(frame(FRAME_HEADER, CHANNEL, &header));
        let chunk = usize::try_from(self.frame_max).unwrap_or(usize::MAX) - 8;
        for part in body.chunks(chunk) {
            out.extend(frame(FRAME_BODY, CHANNEL, part));
        }
        self.stream.write_all(&out).await?;
        self.published += 1;
        loop {
            let (channel, payload) = self.next_method("basic.ack").await?;
            match (channel, class_method(&payload)) {
                (CHANNEL, (60, 80)) => {
                    let tag = delivery_tag(&payload)?;
                    let multiple = payload.get(12).is_some_and(|b| b & 1 == 1);
                    if tag == self.published || (multiple && tag >= self.published) {
                        return Ok(());
                    }
                }
                (CHANNEL, (60, 120)) => bail!("the broker refused the message (basic.nack)"),
                _ => {}
            }
        }
    }

    /// Closes the connection (`connection.close`, then waits for `close-ok`).
    ///
    /// # Errors
    /// When the socket fails.
    pub async fn close(mut self) -> anyhow::Result<()> {
        let mut close = 200u16.to_be_bytes().to_vec();
        short_bytes(&mut close, b"done");
        close.extend([0, 0, 0, 0]);
        self.send_method(0, method(10, 50, &close)).await?;
        self.expect(0, 10, 51, "connection.close-ok")
            .await
            .map(drop)
    }

    async fn send_method(&mut self, channel: u16, payload: Vec<u8>) -> anyhow::Result<()> {
        self.stream
            .write_all(&frame(FRAME_METHOD, channel, &payload))
            .await?;
        Ok(())
    }

    /// Waits for the method `class.id` on `channel`, skipping others.
    async fn expect(
        &mut self,
        channel: u16,
        class: u16,
        id: u16,
        what: &str,
    ) -> anyhow::Result<Vec<u8>> {
        loop {
            let (on, payload) = self.next_method(what).await?;
            if on == channel && class_method(&payload) == (class, id) {
                return Ok(payload);
            }
        }
    }

    /// The next method frame (channel, payload); an error when the broker closes the channel
    /// or the connection.
    async fn next_method(&mut self, waiting_for: &str) -> anyhow::Result<(u16, Vec<u8>)> {
        loop {
            let (kind, channel, payload) = tokio::time::timeout(REPLY_WITHIN, self.next_frame())
                .await
                .with_context(|| format!("no {waiting_for} within {REPLY_WITHIN:?}"))??;
            match kind {
                FRAME_METHOD => {}
                FRAME_HEARTBEAT => continue,
                other => bail!("unexpected frame of type {other} waiting for {waiting_for}"),
            }
            let (class, id) = class_method(&payload);
            if (class, id) == (10, 50) || (class, id) == (20, 40) {
                let code = payload
                    .get(4..6)
                    .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
                let text = payload
                    .get(6)
                    .and_then(|len| payload.get(7..7 + usize::from(*len)))
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default();
                let what = if class == 10 { "connection" } else { "channel" };
                bail!("the broker closed the {what} waiting for {waiting_for}: {code} {text}");
            }
            return Ok((channel, payload));
        }
    }

    async fn next_frame(&mut self) -> anyhow::Result<(u8, u16, Vec<u8>)> {
        loop {
            if self.received.len() >= 7 {
                let size = u32::from_be_bytes([
                    self.received[3],
                    self.received[4],
                    self.received[5],
                    self.received[6],
                ]) as usize;
                if self.received.len() >= size + 8 {
                    let frame: Vec<u8> = self.received.drain(..size + 8).collect();
                    ensure!(frame[size + 7] == FRAME_END, "a frame without its end byte");
                    let channel = u16::from_be_bytes([frame[1], frame[2]]);
                    return Ok((frame[0], channel, frame[7..7 + size].to_vec()));
                }
            }
            let mut chunk = [0u8; 8192];
            let n = self.stream.read(&mut chunk).await?;
            ensure!(n > 0, "the broker closed the socket");
            self.received.extend_from_slice(&chunk[..n]);
        }
    }
}

fn class_method(payload: &[u8]) -> (u16, u16) {
    match payload {
        [a, b, c, d, ..] => (u16::from_be_bytes([*a, *b]), u16::from_be_bytes([*c, *d])),
        _ => (0, 0),
    }
}

fn delivery_tag(payload: &[u8]) -> anyhow::Result<u64> {
    let bytes: [u8; 8] = payload
        .get(4..12)
        .context("basic.ack too short")?
        .try_into()?;
    Ok(u64::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings() {
        let t = Table::default()
            .entry(b"a", Value::Bool(true))
            .entry(b"a", Value::LongString(vec![0xff]));
        assert_eq!(
            t.encode(),
            [
                0, 0, 0, 12, 1, b'a', b't', 1, 1, b'a', b'S', 0, 0, 0, 1, 0xff
            ]
        );
        let p = Properties::default()
            .content_type(b"x")
            .headers(&Table::default())
            .message_id(b"\xc3");
        assert_eq!(p.encode(), [0xa0, 0x80, 1, b'x', 0, 0, 0, 0, 1, 0xc3]);
        let Value::Raw(b'F', deep) = nested_tables(3) else {
            panic!("a table");
        };
        assert_eq!(
            deep,
            [
                0, 0, 0, 14, 1, b'n', b'F', 0, 0, 0, 7, 1, b'n', b'F', 0, 0, 0, 0
            ]
        );
        assert_eq!(percent_decoded("%2f").unwrap(), b"/");
    }
}
