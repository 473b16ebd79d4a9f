use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use outbox_core::{CallOutcome, LookupOutcome, RemoteEffect, WorkItem};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::effect::encode_segment;
use crate::outcome::{call_outcome, lookup_outcome};
use outbox_stand_in::{ProviderArgs, ProviderServer};

#[test]
fn provider_urls_keep_the_user_and_mask_the_rest() {
    assert_eq!(
        URL_RULES.redact("https://ops:pw@pay.example/x#frag"),
        "https://ops:***@pay.example/x#***"
    );
    assert_eq!(
        URL_RULES.redact("http://ops@pay:8080"),
        "http://ops@pay:8080"
    );
    assert_eq!(
        URL_RULES.redact("HTTPS://h/x?token=t"),
        "HTTPS://h/x?token=***"
    );
    let e = HttpPayoutProvider::with_tls("https://ops:hunter2@h/x?k=t0k", &ProviderTls::default())
        .unwrap_err()
        .to_string();
    assert!(!e.contains("hunter2") && !e.contains("t0k"), "{e}");
}

/// A provider serving in this process on a free port.
struct Running {
    base: String,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    async fn start(no_idempotency: bool) -> Self {
        let args = ProviderArgs {
            listen: "127.0.0.1:0".parse().unwrap(),
            no_idempotency,
            delay_ms: 0,
        };
        let server = ProviderServer::bind(&args).await.unwrap();
        let base = format!("http://{}", server.local_addr());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server.serve(shutdown.clone()));
        Self {
            base,
            shutdown,
            task,
        }
    }

    fn adapter(&self) -> HttpPayoutProvider {
        HttpPayoutProvider::new(&self.base).unwrap()
    }

    /// Sends a raw request; answers status and JSON body (`Null` when not JSON).
    async fn raw(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: impl Into<Bytes>,
    ) -> (StatusCode, Value) {
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        // Plain HTTP straight to the in-process provider, never through a TLS proxy.
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        let resp = client
            .request(req.body(Full::new(body.into())).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn payouts(&self) -> Vec<Value> {
        let (status, v) = self.raw(Method::GET, "/payouts", None, "").await;
        assert_eq!(status, StatusCode::OK);
        v.as_array().unwrap().clone()
    }

    async fn stats(&self) -> Value {
        let (status, v) = self.raw(Method::GET, "/admin/stats", None, "").await;
        assert_eq!(status, StatusCode::OK);
        v
    }

    async fn set_delay(&self, ms: u64) {
        let body = json!({ "ms": ms }).to_string();
        let (status, _) = self.raw(Method::POST, "/admin/delay", None, body).await;
        assert_eq!(status, StatusCode::OK);
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the provider stops promptly")
            .unwrap();
    }
}

fn item(key: &str, payload: Value) -> WorkItem {
    WorkItem {
        id: 1,
        kind: "payout".to_owned(),
        idempotency_key: key.to_owned(),
        payload,
        event_id: None,
        attempts: 1,
        created_at: chrono::Utc::now(),
    }
}

fn payout(reference: &str, amount: i64) -> Value {
    json!({ "reference": reference, "amount": amount, "beneficiary": "acct-42" })
}

fn succeeded(outcome: CallOutcome) -> String {
    match outcome {
        CallOutcome::Succeeded { reference } => reference,
        other => panic!("expected Succeeded, got {other:?}"),
    }
}

#[tokio::test]
async fn repeated_call_with_the_same_key_is_one_payout() {
    let p = Running::start(false).await;
    let a = p.adapter();
    let it = item("payments:evt-1", payout("pay-1", 1500));

    let first = succeeded(a.call(&it).await);
    let second = succeeded(a.call(&it).await);
    assert_eq!(first, "po_1");
    assert_eq!(second, first, "the replay returns the same payout");

    let all = p.payouts().await;
    assert_eq!(all.len(), 1, "one payout: {all:?}");
    assert_eq!(all[0]["reference"], "pay-1");
    assert_eq!(all[0]["amount"], 1500);
    assert_eq!(all[0]["idempotency_key"], "payments:evt-1");
    let stats = p.stats().await;
    assert_eq!(stats["payouts"], 1);
    assert_eq!(stats["replays"], 1);
    assert_eq!(stats["idempotency"], true);

    assert_eq!(
        a.lookup(&it).await,
        LookupOutcome::Succeeded {
            reference: first.clone()
        }
    );
    p.stop().await;
}

#[tokio::test]
async fn same_key_with_a_different_body_is_failed() {
    let p = Running::start(false).await;
    let a = p.adapter();
    succeeded(a.call(&item("k-1", payout("pay-1", 100))).await);
    match a.call(&item("k-1", payout("pay-1", 200))).await {
        CallOutcome::Failed { reason } => {
            assert!(reason.contains("422"), "{reason}");
            assert!(reason.contains("different request"), "{reason}");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    assert_eq!(p.payouts().await.len(), 1);
    p.stop().await;
}

#[tokio::test]
async fn without_idempotency_the_same_key_pays_twice_and_lookup_finds_nothing() {
    let p = Running::start(true).await;
    let a = p.adapter();
    let it = item("payments:evt-2", payout("pay-2", 700));

    let first = succeeded(a.call(&it).await);
    let second = succeeded(a.call(&it).await);
    assert_ne!(first, second, "a second payout");

    let all = p.payouts().await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all.iter().all(|x| x["reference"] == "pay-2"));
    assert!(all.iter().all(|x| x["idempotency_key"] == "payments:evt-2"));
    assert_eq!(a.lookup(&it).await, LookupOutcome::NotFound);
    let stats = p.stats().await;
    assert_eq!(stats["idempotency"], false);
    assert_eq!(stats["replays"], 0);
    p.stop().await;
}

#[tokio::test]
async fn a_call_that_times_out_leaves_a_payout_that_lookup_finds() {
    let p = Running::start(false).await;
    let a = p.adapter();
    let it = item("payments:evt-3", payout("pay-3", 900));
    p.set_delay(3_000).await;

    // The executor's timeout, as it would wrap the call.
    let timed_out = tokio::time::timeout(Duration::from_millis(200), a.call(&it)).await;
    assert!(
        timed_out.is_err(),
        "the call outlives the client's patience"
    );

    // Recorded before the delay; lookups are not delayed.
    let all = p.payouts().await;
    assert_eq!(all.len(), 1, "{all:?}");
    let reference = all[0]["payout_id"].as_str().unwrap().to_owned();
    assert_eq!(
        a.lookup(&it).await,
        LookupOutcome::Succeeded {
            reference: reference.clone()
        }
    );

    p.set_delay(0).await;
    assert_eq!(
        succeeded(a.call(&it).await),
        reference,
        "a replay, not a second payout"
    );
    assert_eq!(p.payouts().await.len(), 1);
    assert_eq!(p.stats().await["delay_ms"], 0);
    p.stop().await;
}

#[tokio::test]
async fn connection_refused_is_not_sent() {
    let unused: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let a = HttpPayoutProvider::new(&format!("http://{unused}")).unwrap();
    let it = item("k-refused", payout("pay-r", 1));
    match a.call(&it).await {
        CallOutcome::NotSent { reason } => assert!(reason.contains("connect"), "{reason}"),
        other => panic!("expected NotSent, got {other:?}"),
    }
    assert!(matches!(a.lookup(&it).await, LookupOutcome::Unknown { .. }));
}

#[tokio::test]
async fn a_stopped_provider_refuses_connections() {
    let p = Running::start(false).await;
    let a = p.adapter();
    succeeded(a.call(&item("k-a", payout("pay-a", 5))).await);
    p.stop().await;
    let outcome = a.call(&item("k-b", payout("pay-b", 5))).await;
    assert!(
        matches!(outcome, CallOutcome::NotSent { .. }),
        "got {outcome:?}"
    );
}

#[tokio::test]
async fn zero_amount_is_failed_and_records_nothing() {
    let p = Running::start(false).await;
    let a = p.adapter();
    let it = item("k-zero", payout("pay-0", 0));
    match a.call(&it).await {
        CallOutcome::Failed { reason } => {
            assert!(reason.contains("422"), "{reason}");
            assert!(reason.contains("amount must be positive"), "{reason}");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    assert!(p.payouts().await.is_empty());
    assert_eq!(a.lookup(&it).await, LookupOutcome::NotFound);
    p.stop().await;
}

#[tokio::test]
async fn listing_shows_every_payout_and_keys_with_reserved_characters_work() {
    let p = Running::start(false).await;
    let a = p.adapter();
    let odd = item(
        "pay/ments? #1 100%",
        json!({ "amount": 3, "beneficiary": "b" }),
    );
    let plain = item("payments:evt-9", payout("pay-9", 4));
    let odd_id = succeeded(a.call(&odd).await);
    let plain_id = succeeded(a.call(&plain).await);
    assert_eq!(
        a.lookup(&odd).await,
        LookupOutcome::Succeeded { reference: odd_id }
    );
    assert_eq!(
        a.lookup(&plain).await,
        LookupOutcome::Succeeded {
            reference: plain_id
        }
    );

    let all = p.payouts().await;
    assert_eq!(all.len(), 2);
    // `reference` defaults to the idempotency key.
    assert_eq!(all[0]["reference"], "pay/ments? #1 100%");
    assert_eq!(all[1]["reference"], "pay-9");
    for x in &all {
        for field in [
            "payout_id",
            "reference",
            "amount",
            "beneficiary",
            "idempotency_key",
        ] {
            assert!(!x[field].is_null(), "{field} missing in {x}");
        }
        assert!(x["created_at_ms"].as_i64().unwrap() > 0);
    }
    p.stop().await;
}

#[tokio::test]
async fn raw_api_status_codes() {
    let p = Running::start(false).await;
    let body = payout("pay-x", 10).to_string();

    let (s, v) = p
        .raw(Method::POST, "/payouts", Some("k-x"), body.clone())
        .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(v["replayed"], false);
    let (s, v) = p
        .raw(Method::POST, "/payouts", Some("k-x"), body.clone())
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["replayed"], true);
    assert_eq!(v["payout_id"], "po_1");

    let (s, v) = p.raw(Method::POST, "/payouts", None, body.clone()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("Idempotency-Key"));

    let (s, v) = p
        .raw(Method::POST, "/payouts", Some("k-y"), "{not json")
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("JSON"), "{v}");

    let big = vec![b' '; outbox_stand_in::MAX_BODY_BYTES + 1];
    let (s, _) = p.raw(Method::POST, "/payouts", Some("k-z"), big).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);

    let (s, _) = p.raw(Method::GET, "/nowhere", None, "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, v) = p.raw(Method::GET, "/payouts/by-key/k-x", None, "").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["payout_id"], "po_1");
    assert!(v.get("replayed").is_none());
    let (s, v) = p.raw(Method::GET, "/payouts/by-key/k-q", None, "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["error"], NO_PAYOUT_FOR_KEY);
    let (s, _) = p.raw(Method::DELETE, "/payouts", None, "").await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    let (s, _) = p.raw(Method::POST, "/admin/delay", None, "{}").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    assert_eq!(p.payouts().await.len(), 1);
    p.stop().await;
}

#[tokio::test]
async fn a_wrong_base_path_is_not_read_as_not_found() {
    let p = Running::start(false).await;
    let a = HttpPayoutProvider::new(&format!("{}/wrong-prefix", p.base)).unwrap();
    let it = item("k-w", payout("pay-w", 1));
    assert!(matches!(a.lookup(&it).await, LookupOutcome::Unknown { .. }));
    // POST to a missing route is a 404: the provider answered and did nothing.
    assert!(matches!(a.call(&it).await, CallOutcome::Failed { .. }));
    assert!(p.payouts().await.is_empty());
    p.stop().await;
}

#[tokio::test]
async fn a_payload_without_amount_is_failed_without_a_request() {
    let p = Running::start(false).await;
    let a = p.adapter();
    let outcome = a.call(&item("k-p", json!({ "beneficiary": "b" }))).await;
    match outcome {
        CallOutcome::Failed { reason } => assert!(reason.contains("amount"), "{reason}"),
        other => panic!("expected Failed, got {other:?}"),
    }
    let outcome = a
        .call(&item(
            "k-p",
            json!({ "amount": 1, "beneficiary": "b", "reference": 7 }),
        ))
        .await;
    assert!(matches!(outcome, CallOutcome::Failed { .. }), "{outcome:?}");
    assert!(p.payouts().await.is_empty());
    assert_eq!(p.stats().await["payouts"], 0);
    p.stop().await;
}

#[test]
fn answers_map_to_outcomes() {
    let ok = br#"{"payout_id":"po_7","replayed":true}"#;
    assert_eq!(
        call_outcome(StatusCode::OK, ok),
        CallOutcome::Succeeded {
            reference: "po_7".to_owned()
        }
    );
    assert!(matches!(
        call_outcome(StatusCode::CREATED, b"<html>"),
        CallOutcome::Unknown { .. }
    ));
    for s in [400, 404, 422] {
        let status = StatusCode::from_u16(s).unwrap();
        assert!(matches!(
            call_outcome(status, b"{}"),
            CallOutcome::Failed { .. }
        ));
    }
    for s in [202, 204, 301, 408, 409, 429, 500, 502, 503] {
        let status = StatusCode::from_u16(s).unwrap();
        assert!(
            matches!(call_outcome(status, b"{}"), CallOutcome::Unknown { .. }),
            "{s}"
        );
    }
    let not_found = format!(r#"{{"error":"{NO_PAYOUT_FOR_KEY}"}}"#);
    assert_eq!(
        lookup_outcome(StatusCode::NOT_FOUND, not_found.as_bytes()),
        LookupOutcome::NotFound
    );
    assert!(matches!(
        lookup_outcome(StatusCode::NOT_FOUND, b"not found"),
        LookupOutcome::Unknown { .. }
    ));
    assert!(matches!(
        lookup_outcome(StatusCode::INTERNAL_SERVER_ERROR, b""),
        LookupOutcome::Unknown { .. }
    ));
    assert_eq!(
        lookup_outcome(StatusCode::OK, ok),
        LookupOutcome::Succeeded {
            reference: "po_7".to_owned()
        }
    );
}

#[test]
fn key_segments_are_encoded_minimally() {
    assert_eq!(encode_segment("payments:evt-1"), "payments:evt-1");
    assert_eq!(encode_segment("a/b?c#d%e f"), "a%2Fb%3Fc%23d%25e%20f");
    assert_eq!(encode_segment("é"), "%C3%A9");
    assert_eq!(encode_segment(".."), "%2E%2E");
    assert_eq!(encode_segment("a.b"), "a.b");
}

#[test]
fn base_urls_are_validated() {
    for good in [
        "http://127.0.0.1:8080",
        "http://127.0.0.1:8080/",
        "http://localhost:1/prefix/",
        "https://127.0.0.1:8443",
        "https://payouts.example/v1/",
    ] {
        let a = HttpPayoutProvider::new(good).unwrap_or_else(|e| panic!("{good}: {e:#}"));
        assert!(!a.base.ends_with('/'), "{}", a.base);
    }
    assert_eq!(
        HttpPayoutProvider::new("http://localhost:1/prefix/")
            .unwrap()
            .base,
        "http://localhost:1/prefix"
    );
    for (bad, why) in [
        ("ftp://127.0.0.1:21", "scheme"),
        ("127.0.0.1:8080", "https://host"),
        ("/payouts", "https://host"),
        ("http://u:hunter2@127.0.0.1:1", "user info"),
        ("https://127.0.0.1:1/?token=hunter2", "query"),
        ("http://127.0.0.1:1/#hunter2", "fragment"),
        ("not a url", "https://host"),
    ] {
        let e = HttpPayoutProvider::new(bad).expect_err(bad);
        let msg = format!("{e:#}");
        assert!(msg.contains(why), "{bad}: {msg}");
        assert!(
            !msg.contains("hunter2"),
            "{bad}: the secret is shown: {msg}"
        );
    }
}

#[test]
fn tls_settings_are_checked_before_any_call() {
    let pki = outbox_testkit::tls::TestPki::new("provider-settings");
    let with_ca = ProviderTls {
        ca_file: Some(pki.ca_file()),
        ..ProviderTls::default()
    };
    let e = HttpPayoutProvider::with_tls("http://127.0.0.1:1", &with_ca).unwrap_err();
    assert!(format!("{e:#}").contains("https://"), "{e:#}");
    assert!(HttpPayoutProvider::with_tls("https://127.0.0.1:1", &with_ca).is_ok());
    let missing = ProviderTls {
        ca_file: Some("/nonexistent/outbox/ca.pem".into()),
        ..ProviderTls::default()
    };
    let e = HttpPayoutProvider::with_tls("https://127.0.0.1:1", &missing).unwrap_err();
    assert!(format!("{e:#}").contains("--provider-ca-file"), "{e:#}");
    let half = ProviderTls {
        cert_file: Some(pki.client("c").cert),
        ..ProviderTls::default()
    };
    let e = HttpPayoutProvider::with_tls("https://127.0.0.1:1", &half).unwrap_err();
    assert!(format!("{e:#}").contains("--provider-key-file"), "{e:#}");
}

/// The stand-in provider behind a TLS terminator with a certificate from a test CA (and,
/// with `mutual`, requiring a client certificate from that CA).
async fn behind_tls(
    pki: &outbox_testkit::tls::TestPki,
    mutual: bool,
) -> (Running, outbox_testkit::tls::TlsProxy) {
    let p = Running::start(false).await;
    let upstream: SocketAddr = p.base.trim_start_matches("http://").parse().unwrap();
    let server = pki.server("provider", &["localhost", "127.0.0.1"]);
    let ca = pki.ca_file();
    let config =
        outbox_testkit::tls::TestPki::server_config(&server, mutual.then_some(ca.as_path()));
    let proxy = outbox_testkit::tls::TlsProxy::start(upstream, config).await;
    (p, proxy)
}

#[tokio::test]
async fn https_provider_is_called_over_verified_tls() {
    let pki = outbox_testkit::tls::TestPki::new("provider-https");
    let (p, proxy) = behind_tls(&pki, false).await;
    let tls = ProviderTls {
        ca_file: Some(pki.ca_file()),
        ..ProviderTls::default()
    };
    let a =
        HttpPayoutProvider::with_tls(&format!("https://localhost:{}", proxy.port()), &tls).unwrap();
    let it = item("k-tls", payout("pay-tls", 42));
    let reference = succeeded(a.call(&it).await);
    assert_eq!(a.lookup(&it).await, LookupOutcome::Succeeded { reference });
    assert!(proxy.handshakes_ok() >= 1);
    assert_eq!(p.payouts().await.len(), 1);

    // The system's trust store alone does not know the test CA: refused before sending.
    let untrusted =
        HttpPayoutProvider::new(&format!("https://localhost:{}", proxy.port())).unwrap();
    match untrusted
        .call(&item("k-untrusted", payout("pay-u", 1)))
        .await
    {
        CallOutcome::NotSent { reason } => {
            assert!(reason.to_lowercase().contains("certificate"), "{reason}")
        }
        other => panic!("expected NotSent for an unknown CA, got {other:?}"),
    }
    // A name the certificate does not carry is refused too.
    let other_name = pki.server("other", &["payouts.example"]);
    let config = outbox_testkit::tls::TestPki::server_config(&other_name, None);
    let upstream: SocketAddr = p.base.trim_start_matches("http://").parse().unwrap();
    let wrong = outbox_testkit::tls::TlsProxy::start(upstream, config).await;
    let a =
        HttpPayoutProvider::with_tls(&format!("https://localhost:{}", wrong.port()), &tls).unwrap();
    assert!(matches!(
        a.call(&item("k-name", payout("pay-n", 1))).await,
        CallOutcome::NotSent { .. }
    ));
    // Plain HTTP to a provider that speaks TLS never succeeds.
    let plain = HttpPayoutProvider::new(&format!("http://localhost:{}", proxy.port())).unwrap();
    assert!(!matches!(
        plain.call(&item("k-plain", payout("pay-p", 1))).await,
        CallOutcome::Succeeded { .. }
    ));
    assert_eq!(
        p.payouts().await.len(),
        1,
        "no refused call reached the provider"
    );
    p.stop().await;
}

#[tokio::test]
async fn a_client_certificate_is_presented_when_the_provider_requires_one() {
    let pki = outbox_testkit::tls::TestPki::new("provider-mtls");
    let (p, proxy) = behind_tls(&pki, true).await;
    let base = format!("https://localhost:{}", proxy.port());
    let ca_only = ProviderTls {
        ca_file: Some(pki.ca_file()),
        ..ProviderTls::default()
    };
    let a = HttpPayoutProvider::with_tls(&base, &ca_only).unwrap();
    assert!(!matches!(
        a.call(&item("k-nocert", payout("pay-x", 1))).await,
        CallOutcome::Succeeded { .. }
    ));
    let client = pki.client("executor");
    let mtls = ProviderTls {
        ca_file: Some(pki.ca_file()),
        cert_file: Some(client.cert),
        key_file: Some(client.key),
    };
    let a = HttpPayoutProvider::with_tls(&base, &mtls).unwrap();
    succeeded(a.call(&item("k-cert", payout("pay-c", 2))).await);
    assert_eq!(p.payouts().await.len(), 1);
    p.stop().await;
}
