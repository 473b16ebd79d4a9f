//! RabbitMQ-specific transport tests against the real broker at `OUTBOX_TEST_AMQP_URL`
//! (default `amqp://guest:guest@127.0.0.1:5672/%2f`): the AMQP properties of the binding, a
//! route bound after a refusal, return pairing under load, a connection killed by the broker,
//! the broker's own size limit, startup errors. What every transport must do is in the
//! conformance suite (`conformance.rs`). A missing broker fails the tests.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use chrono::{TimeZone, Utc};
use common::{Fixture, amqp_url, close_connection, connection_pid, long, unique, wire_headers};
use lapin::types::FieldTable;
use outbox_core::{OutboxMessage, PublishErrorKind, Transport};
use outbox_rabbitmq::{RabbitConfig, RabbitConnectError, RabbitTransport};
use outbox_testkit::harness::run;
use outbox_testkit::message::{self, TRACEPARENT};
use outbox_testkit::wait;
use uuid::Uuid;

/// `fx`'s read queue, bound to its exchange (which `transport` declared) with `binding`.
async fn read_queue(fx: &Fixture, binding: &str) -> Result<String> {
    fx.admin
        .queue(&fx.read_queue, FieldTable::default())
        .await?;
    fx.admin.bind(&fx.read_queue, &fx.exchange, binding).await?;
    Ok(fx.read_queue.clone())
}

/// Every message id in `queue`, taking the messages off.
async fn drain_ids(fx: &Fixture, queue: &str) -> Result<HashSet<Uuid>> {
    let mut ids = HashSet::new();
    while let Some(m) = fx.admin.get(queue).await? {
        let id = m
            .delivery
            .properties
            .message_id()
            .as_ref()
            .context("no message id")?
            .to_string();
        ids.insert(Uuid::parse_str(&id)?);
    }
    Ok(ids)
}

/// The AMQP side of the binding: the default routing key template, exchange, persistent
/// delivery mode, `type`, `timestamp`, `app_id`, and exactly the CloudEvents and user headers,
/// as long strings; a republish has identical properties.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_properties_follow_the_binding() {
    run(Fixture::start(), async |fx: &Fixture| {
        let transport = fx
            .transport_with(RabbitConfig {
                exchange: fx.exchange.clone(),
                app_id: Some("outbox-tests".into()),
                ..RabbitConfig::default()
            })
            .await?;
        ensure!(transport.name() == "rabbitmq");
        let queue = read_queue(fx, "payment.*").await?;
        let mut msg = message::event("pay-1", 1, &b"{\"amount\": 100}"[..]);
        msg.created_at = Utc.with_ymd_and_hms(2025, 3, 4, 5, 6, 7).unwrap()
            + chrono::Duration::microseconds(123_456);
        msg.headers
            .insert("traceparent".to_owned(), TRACEPARENT.to_owned());
        transport.publish(&msg).await?;

        let got = fx
            .admin
            .get(&queue)
            .await?
            .context("message not in queue")?;
        let d = &got.delivery;
        assert_eq!(d.routing_key.as_str(), "payment.PaymentCreated");
        assert_eq!(d.exchange.as_str(), fx.exchange);
        let p = &d.properties;
        assert_eq!(*p.delivery_mode(), Some(2), "persistent");
        assert_eq!(
            p.kind().as_ref().map(|s| s.as_str()),
            Some("PaymentCreated")
        );
        assert_eq!(*p.timestamp(), Some(1_741_064_767));
        assert_eq!(
            p.app_id().as_ref().map(|s| s.as_str()),
            Some("outbox-tests")
        );
        let headers = p.headers().as_ref().context("no headers")?.inner();
        let expected = wire_headers(&msg);
        assert_eq!(expected.len(), 12 + 1);
        for (name, value) in &expected {
            assert_eq!(
                headers.get(name.as_str()),
                Some(&long(value)),
                "header {name}"
            );
        }
        assert_eq!(
            headers.get("cloudEvents_time"),
            Some(&long("2025-03-04T05:06:07.123456Z"))
        );
        assert_eq!(headers.len(), expected.len(), "no other header");

        transport.publish(&msg).await?;
        let again = fx
            .admin
            .get(&queue)
            .await?
            .context("republish not in queue")?;
        assert_eq!(again.delivery.properties, d.properties);
        assert_eq!(again.delivery.data, d.data);
        Ok(())
    })
    .await;
}

/// A message no queue receives is returned and `Rejected`, never counted as sent; once a queue
/// is bound, the retry goes through on the same, still working channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unroutable_message_is_rejected_until_a_queue_is_bound() {
    run(Fixture::start(), async |fx: &Fixture| {
        let transport = fx.transport_with(fx.config()).await?;
        let msg = message::event("pay-2", 1, "{}");
        let err = transport
            .publish(&msg)
            .await
            .expect_err("a message no queue receives must not be Ok");
        assert_eq!(err.kind, PublishErrorKind::Rejected, "{err}");
        assert!(err.message.contains("NO_ROUTE"), "{err}");

        let queue = read_queue(fx, "#").await?;
        transport.publish(&msg).await?;
        assert_eq!(fx.admin.count(&queue).await?, 1);
        assert!(transport.is_connected());
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connect_to_dead_address_fails_fast() -> Result<()> {
    let started = Instant::now();
    let err = RabbitTransport::connect(
        "amqp://guest:guest@127.0.0.1:1/%2f",
        RabbitConfig::default(),
    )
    .await
    .expect_err("nothing listens on port 1");
    assert!(
        matches!(
            err,
            RabbitConnectError::Unreachable { .. } | RabbitConnectError::TimedOut { .. }
        ),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(6), "{err}");
    let text = err.to_string();
    assert!(text.contains("127.0.0.1:1"), "{text}");
    assert!(!text.contains("guest:guest"), "credentials leaked: {text}");

    let err = RabbitTransport::connect(
        &amqp_url(),
        RabbitConfig {
            max_in_flight: 0,
            ..RabbitConfig::default()
        },
    )
    .await
    .expect_err("invalid config");
    assert!(
        matches!(&err, RabbitConnectError::Config(c) if c.key == "max_in_flight"),
        "{err:?}"
    );

    let err = RabbitTransport::connect("not a url", RabbitConfig::default())
        .await
        .expect_err("invalid url");
    assert!(matches!(err, RabbitConnectError::InvalidUrl(_)), "{err:?}");

    let err = RabbitTransport::connect(
        "amqp://guest:wrong-password@127.0.0.1:5672/%2f",
        RabbitConfig {
            exchange: unique("outbox-test-x"),
            ..RabbitConfig::default()
        },
    )
    .await
    .expect_err("bad credentials");
    assert!(!err.to_string().contains("wrong-password"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exchange_declared_with_another_type_is_a_setup_error() {
    run(Fixture::start(), async |fx: &Fixture| {
        let _first = fx.transport_with(fx.config()).await?;
        let err = RabbitTransport::connect(
            &amqp_url(),
            RabbitConfig {
                exchange_kind: "fanout".into(),
                ..fx.config()
            },
        )
        .await
        .expect_err("inequivalent exchange type");
        assert!(
            matches!(&err, RabbitConnectError::Setup { step, .. } if *step == "exchange.declare"),
            "{err:?}"
        );
        Ok(())
    })
    .await;
}

/// Returned (unroutable) publishes mixed with routed ones, 1,500 at once on one channel: an
/// unroutable publish is never reported as sent, a routed one never as returned. lapin attaches
/// a `basic.return` to whichever confirm it resolves next and RabbitMQ may deliver it after the
/// covering ack; taken at face value that misreported 150-250 of these 1,500 publishes. The
/// transport pairs returns by message id and decides in probe-closed cohorts
/// (`transport/confirms.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_routed_and_unroutable_publishes_are_never_confused() {
    run(Fixture::start(), async |fx: &Fixture| {
        let transport = Arc::new(fx.transport_with(fx.config()).await?);
        // Only `payment` events have a queue; `refund` events route nowhere.
        let queue = read_queue(fx, "routed.payment.#").await?;

        let n: usize = 1500;
        let publishes = (0..n).map(|i| {
            let transport = Arc::clone(&transport);
            tokio::spawn(async move {
                let mut msg = message::event(&format!("agg-{i}"), 1, format!("{{\"n\":{i}}}"));
                let routed = i % 3 != 0;
                if !routed {
                    msg.aggregate_type = "refund".into();
                }
                (routed, msg.event_id, transport.publish(&msg).await)
            })
        });
        let mut routed_ok = HashSet::new();
        let mut wrong = Vec::new();
        for r in futures::future::join_all(publishes).await {
            let (routed, id, result) = r?;
            match (routed, result) {
                (true, Ok(_)) => {
                    routed_ok.insert(id);
                }
                (false, Err(e)) if e.kind == PublishErrorKind::Rejected => {}
                (routed, other) => wrong.push(format!("routed={routed} {id}: {other:?}")),
            }
        }
        ensure!(
            wrong.is_empty(),
            "{} publishes got the wrong outcome, first: {:?}",
            wrong.len(),
            wrong.first()
        );
        ensure!(routed_ok.len() == n - n.div_ceil(3), "{}", routed_ok.len());
        let in_queue = drain_ids(fx, &queue).await?;
        ensure!(
            in_queue == routed_ok,
            "queue holds {} of {}",
            in_queue.len(),
            routed_ok.len()
        );
        Ok(())
    })
    .await;
}

/// The broker closes the connection under 20 concurrent publishers: publishes in flight fail
/// as `Unavailable` (never another kind), publishes right after the loss fail fast instead of
/// reconnecting in a loop, the same transport reconnects by itself after its minimum delay,
/// every publish that returned `Ok` is in the queue, and a closed transport refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broken_connection_fails_unavailable_then_reconnects_transparently() {
    run(Fixture::start(), async |fx: &Fixture| {
        let connection_name = unique("outbox-test-conn");
        let transport = Arc::new(
            fx.transport_with(RabbitConfig {
                connection_name: connection_name.clone(),
                reconnect_min_delay_ms: 1000,
                ..fx.config()
            })
            .await?,
        );
        let queue = read_queue(fx, "#").await?;
        transport.publish(&message::event("pay-f", 1, "{}")).await?;

        // Publishers keep going while the broker kills the connection.
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..20)
            .map(|w| {
                let transport = Arc::clone(&transport);
                let stop = Arc::clone(&stop);
                tokio::spawn(async move {
                    let mut results = Vec::new();
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let msg = message::event(&format!("pay-w{w}"), n, format!("{{\"n\":{n}}}"));
                        let result = transport.publish(&msg).await;
                        results.push((msg.event_id, result));
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    results
                })
            })
            .collect();

        tokio::task::spawn_blocking({
            let name = connection_name.clone();
            move || close_connection(&name)
        })
        .await??;
        wait::until(
            "the transport notices the closed connection",
            Duration::from_secs(10),
            async || Ok((!transport.is_connected()).then_some(())),
        )
        .await?;
        // Right after the loss, publishes fail fast instead of reconnecting in a loop.
        let err = transport
            .publish(&message::event("pay-f", 2, "{}"))
            .await
            .expect_err("must not be Ok right after the connection was lost");
        assert_eq!(err.kind, PublishErrorKind::Unavailable, "{err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.store(true, Ordering::Relaxed);

        let mut confirmed: HashSet<Uuid> = HashSet::new();
        let mut unavailable = 0;
        for worker in workers {
            for (event_id, result) in worker.await? {
                match result {
                    Ok(_) => {
                        confirmed.insert(event_id);
                    }
                    Err(e) if e.kind == PublishErrorKind::Unavailable => unavailable += 1,
                    Err(e) => bail!("unexpected error during the outage: {e}"),
                }
            }
        }
        assert!(unavailable > 0, "the outage must surface as Unavailable");

        // The same transport reconnects by itself once the minimum delay passed.
        let after: OutboxMessage = message::event("pay-f", 3, "{}");
        wait::until(
            "the transport reconnects",
            Duration::from_secs(15),
            async || match transport.publish(&after).await {
                Ok(_) => Ok(Some(())),
                Err(e) if e.kind == PublishErrorKind::Unavailable => Ok(None),
                Err(e) => bail!("unexpected error while reconnecting: {e}"),
            },
        )
        .await?;
        assert!(transport.is_connected());
        let new_pid =
            tokio::task::spawn_blocking(move || connection_pid(&connection_name)).await??;
        assert!(
            new_pid.is_some(),
            "a new connection with the same name exists"
        );

        // Every publish that returned Ok is in the queue (Unavailable ones may or may not be).
        let seen = drain_ids(fx, &queue).await?;
        let lost: Vec<_> = confirmed.difference(&seen).collect();
        ensure!(lost.is_empty(), "confirmed but not in the queue: {lost:?}");
        assert!(seen.contains(&after.event_id));
        eprintln!(
            "outage: {} confirmed, {unavailable} unavailable, {} in queue",
            confirmed.len(),
            seen.len()
        );

        transport.close().await;
        let err = transport
            .publish(&message::event("pay-f", 4, "{}"))
            .await
            .expect_err("closed");
        assert_eq!(err.kind, PublishErrorKind::Unavailable);
        Ok(())
    })
    .await;
}

/// RabbitMQ's own `max_message_size` (128 MiB by default) refuses the message by closing the
/// channel; only the oversized publish is `TooLarge`, the limit is then known before sending,
/// and the channel is reopened for the next publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_size_limit_is_too_large_only_for_the_big_message() {
    run(Fixture::start(), async |fx: &Fixture| {
        let transport = fx
            .transport_with(RabbitConfig {
                max_message_bytes: 256 * 1024 * 1024,
                ..fx.config()
            })
            .await?;
        let queue = read_queue(fx, "#").await?;

        let big = message::sized("pay-big", 1, 129 * 1024 * 1024);
        let err = transport
            .publish(&big)
            .await
            .expect_err("above broker limit");
        assert_eq!(err.kind, PublishErrorKind::TooLarge, "{err}");
        let err = transport.publish(&big).await.expect_err("still too large");
        assert_eq!(err.kind, PublishErrorKind::TooLarge, "{err}");

        transport
            .publish(&message::event("pay-big", 2, "{}"))
            .await?;
        assert_eq!(fx.admin.count(&queue).await?, 1);
        Ok(())
    })
    .await;
}
