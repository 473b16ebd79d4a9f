//! `outbox status --relay-metrics ADDR`: reads a running relay's Prometheus endpoint, so the
//! human view shows the same counters as the dashboards (published, failed, dead-lettered,
//! broker duplicates, lost leases, publish latency).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// Counters summed over labels, and the latency histogram's cumulative buckets.
#[derive(Debug, Default, PartialEq)]
pub struct RelayCounters {
    /// `metric name -> value`, labels summed.
    pub totals: BTreeMap<String, f64>,
    /// `(le, cumulative count)` of `outbox_publish_latency_seconds`, summed over labels.
    pub latency_buckets: Vec<(f64, f64)>,
}

impl RelayCounters {
    /// The `q` quantile (0..1) of publish latency, as the upper bound of the bucket holding it.
    pub fn latency_quantile(&self, q: f64) -> Option<f64> {
        let total = self.latency_buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        self.latency_buckets
            .iter()
            .find(|(_, c)| *c >= q * total)
            .map(|(le, _)| *le)
    }
}

/// Parses Prometheus text exposition.
pub fn parse(text: &str) -> RelayCounters {
    let mut out = RelayCounters::default();
    let mut buckets: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || !line.starts_with("outbox_") {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series);
        if name == "outbox_publish_latency_seconds_bucket" {
            if let Some(le) = series
                .split("le=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
            {
                let bound = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::NAN)
                };
                let e = buckets.entry(le.to_owned()).or_insert((bound, 0.0));
                e.1 += value;
            }
            continue;
        }
        *out.totals.entry(name.to_owned()).or_insert(0.0) += value;
    }
    let mut b: Vec<(f64, f64)> = buckets
        .into_values()
        .filter(|(le, _)| !le.is_nan())
        .collect();
    b.sort_by(|x, y| x.0.total_cmp(&y.0));
    out.latency_buckets = b;
    out
}

/// Largest answer read from a relay's metrics endpoint. A relay's exposition is a few
/// kilobytes; anything near this is not a relay, and reading it whole would cost memory.
pub const MAX_ANSWER_BYTES: u64 = 4 * 1024 * 1024;

/// How long connecting, and then the answer, may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(3);

/// `GET http://{addr}{path}` (hyper's HTTP/1 client over one connection): the status code and
/// the body, at most [`MAX_ANSWER_BYTES`] of UTF-8 text.
///
/// # Errors
/// The address cannot be reached within 3 s, the answer takes longer than 3 s, is not HTTP,
/// is larger than [`MAX_ANSWER_BYTES`] or is not UTF-8.
pub async fn get(addr: &str, path: &str) -> Result<(u16, String)> {
    use http_body_util::{BodyExt, Empty, Limited};
    use hyper::body::Bytes;
    let stream = tokio::time::timeout(HTTP_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .with_context(|| format!("{addr}: connect timed out"))?
        .with_context(|| format!("cannot reach {addr}"))?;
    let exchange = async {
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, addr)
            .body(Empty::<Bytes>::new())?;
        let answer = sender.send_request(request).await?;
        let status = answer.status().as_u16();
        let body = Limited::new(answer.into_body(), MAX_ANSWER_BYTES as usize)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    anyhow::anyhow!(
                        "the answer is larger than {MAX_ANSWER_BYTES} bytes; is this a relay's metrics address?"
                    )
                } else {
                    anyhow::anyhow!("reading the answer: {e}")
                }
            })?
            .to_bytes();
        anyhow::Ok((status, body))
    };
    let (status, body) = tokio::time::timeout(HTTP_TIMEOUT, exchange)
        .await
        .with_context(|| format!("{addr}: the answer timed out"))?
        .with_context(|| format!("GET http://{addr}{path}"))?;
    let body = String::from_utf8(body.to_vec())
        .map_err(|_| anyhow::anyhow!("{addr}: the answer is not UTF-8 text"))?;
    Ok((status, body))
}

/// Fetches `http://{addr}/metrics` ([`get`]) and parses it.
///
/// # Errors
/// As [`get`], and an answer that is not a 200.
pub async fn fetch(addr: &str) -> Result<RelayCounters> {
    let addr = addr
        .trim_start_matches("http://")
        .trim_end_matches("/metrics");
    let (status, body) = get(addr, "/metrics")
        .await
        .with_context(|| format!("relay metrics at {addr}"))?;
    if status != 200 {
        bail!(
            "relay metrics at {addr}: unexpected answer {status} `{}`",
            body.lines().next().unwrap_or("")
        );
    }
    Ok(parse(&body))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A one-shot server that answers `answer` to whatever it is asked.
    async fn serve_once(answer: Vec<u8>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            if let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(&answer).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn an_oversized_answer_is_refused() {
        let mut answer = b"HTTP/1.0 200 OK\r\n\r\n".to_vec();
        answer.extend(std::iter::repeat_n(b'#', MAX_ANSWER_BYTES as usize + 1));
        let addr = serve_once(answer).await;
        let e = fetch(&addr).await.unwrap_err();
        assert!(format!("{e:#}").contains("larger than"), "{e:#}");
    }

    #[tokio::test]
    async fn a_normal_answer_is_parsed() {
        let answer =
            b"HTTP/1.0 200 OK\r\n\r\noutbox_published_total{transport=\"nats\"} 3\n".to_vec();
        let addr = serve_once(answer).await;
        let c = fetch(&addr).await.unwrap();
        assert_eq!(c.totals["outbox_published_total"], 3.0);
    }

    #[test]
    fn sums_labels_and_reads_latency_buckets() {
        let text = "# HELP x\n\
            outbox_published_total{transport=\"nats\"} 10\n\
            outbox_published_total{transport=\"rabbitmq\"} 5\n\
            outbox_publish_failures_total{transport=\"nats\",kind=\"TimedOut\"} 2\n\
            outbox_publish_latency_seconds_bucket{transport=\"nats\",le=\"0.001\"} 4\n\
            outbox_publish_latency_seconds_bucket{transport=\"nats\",le=\"0.01\"} 9\n\
            outbox_publish_latency_seconds_bucket{transport=\"nats\",le=\"+Inf\"} 10\n\
            other_metric 3\n";
        let c = parse(text);
        assert_eq!(c.totals["outbox_published_total"], 15.0);
        assert_eq!(c.totals["outbox_publish_failures_total"], 2.0);
        assert!(!c.totals.contains_key("other_metric"));
        assert_eq!(c.latency_quantile(0.5), Some(0.01));
        assert_eq!(c.latency_quantile(0.3), Some(0.001));
        assert_eq!(c.latency_quantile(0.99), Some(f64::INFINITY));
    }
}
