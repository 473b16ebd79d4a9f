//! RabbitMQ-specific tests of [`RabbitSource`] against the real broker at
//! `OUTBOX_TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`): the quorum-queue
//! delivery count, the nack delay cap, no reconnect loop after a lost connection, a connection
//! closed by the broker, a queue deleted under the consumer, binding an existing queue, startup
//! errors. What every delivery source must do is in the conformance suite (`conformance.rs`).
//! A missing broker fails the tests.

mod common;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use common::{
    Fixture, ROUTED, amqp_url, close_connection, connection_pid, long, unique, wire_headers,
};
use lapin::BasicProperties;
use lapin::types::FieldTable;
use outbox_core::consumer::RawMessage;
use outbox_core::consumer::{Delivery, DeliverySource, SourceError, SourceErrorKind};
use outbox_core::{DecodeError, OutboxMessage, Transport};
use outbox_rabbitmq::{RabbitConsumerConfig, RabbitConsumerError, RabbitDelivery, RabbitSource};
use outbox_testkit::amqp::{Properties, RawPublisher, Table, Value, nested_tables};
use outbox_testkit::harness::{Harness as _, run};
use outbox_testkit::message;
use outbox_testkit::net::Proxy;
use outbox_testkit::source::{
    SourceSettings, ack_all, event_of, expect_nothing, receive, receive_one,
};
use outbox_testkit::wait;
use tokio::net::TcpListener;

const WITHIN: Duration = Duration::from_secs(10);

/// Consumer settings for `fx`'s source queue, declared by the test itself.
fn existing_queue(fx: &Fixture) -> RabbitConsumerConfig {
    RabbitConsumerConfig {
        declare_queue: false,
        bind_exchange: None,
        ..fx.consumer_config(&SourceSettings::default())
    }
}

async fn connect(url: &str, config: RabbitConsumerConfig) -> Result<RabbitSource> {
    Ok(RabbitSource::connect(url, config).await?)
}

/// Declares `fx`'s source queue (durable, no arguments), then consumes it from `url`.
async fn on_declared_queue(
    fx: &Fixture,
    url: &str,
    config: RabbitConsumerConfig,
) -> Result<RabbitSource> {
    fx.admin
        .queue(&fx.source_queue, FieldTable::default())
        .await?;
    connect(url, config).await
}

/// Publishes `msg` as the transport would, straight into `fx`'s source queue.
async fn publish_to_source_queue(fx: &Fixture, msg: &OutboxMessage) -> Result<()> {
    let headers = common::table(&wire_headers(msg));
    fx.admin
        .publish(
            &fx.source_queue,
            &msg.payload.bytes,
            BasicProperties::default().with_headers(headers),
        )
        .await
}

/// Calls `next_batch` until the source reports `what`, which must be `Unavailable`; a delivery
/// meanwhile is an error.
async fn reported_unavailable(source: &mut RabbitSource, what: &str) -> Result<SourceError> {
    let err = wait::until(what, WITHIN, async || {
        match source.next_batch(10, Duration::from_millis(200)).await {
            Ok(batch) if batch.is_empty() => Ok(None),
            Ok(_) => bail!("a delivery while waiting until {what}"),
            Err(e) => Ok(Some(e)),
        }
    })
    .await?;
    ensure!(err.kind == SourceErrorKind::Unavailable, "{what}: {err}");
    ensure!(!source.is_connected(), "{what}: still connected");
    Ok(err)
}

/// One `next_batch` call, which must fail at once with `kind`.
async fn fails_at_once(source: &mut RabbitSource, kind: SourceErrorKind) -> Result<SourceError> {
    let t = Instant::now();
    match source.next_batch(10, Duration::from_secs(5)).await {
        Err(e) if e.kind == kind && t.elapsed() < Duration::from_secs(1) => Ok(e),
        Err(e) => bail!("expected {kind:?} at once, got {e} after {:?}", t.elapsed()),
        Ok(batch) => bail!("expected {kind:?}, got {} deliveries", batch.len()),
    }
}

/// Calls `next_batch` until `msg` is delivered, accepting `Unavailable` while the source
/// reconnects (any other error fails); acknowledges it, checks that the source is connected,
/// and returns the delivery count.
async fn consumed_after_outage(source: &mut RabbitSource, msg: &OutboxMessage) -> Result<u32> {
    let d: RabbitDelivery = wait::until(
        "a delivery once the source is back",
        Duration::from_secs(15),
        async || match source.next_batch(1, Duration::from_millis(200)).await {
            Ok(mut batch) => Ok(batch.pop()),
            Err(e) if e.kind == SourceErrorKind::Unavailable => Ok(None),
            Err(e) => bail!("while the source reconnects: {e}"),
        },
    )
    .await?;
    ensure!(event_of(&d)?.event_id == msg.event_id);
    let count = d.delivery_count().context("a delivery count")?;
    d.ack().await?;
    ensure!(source.is_connected());
    Ok(count)
}

/// On a quorum queue the count comes from the broker's `x-delivery-count`, so it holds for a
/// message this source cannot track (no event id).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_queue_delivery_count_comes_from_the_broker() {
    run(Fixture::start(), async |fx: &Fixture| {
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), long("quorum"));
        fx.admin.queue(&fx.source_queue, args).await?;
        let mut source = connect(&amqp_url(), existing_queue(fx)).await?;
        fx.admin
            .publish(&fx.source_queue, b"no id", BasicProperties::default())
            .await?;
        let d = receive_one(&mut source, WITHIN).await?;
        ensure!(d.delivery_count() == Some(1));
        d.nack(Duration::ZERO).await?;
        let d = receive_one(&mut source, WITHIN).await?;
        ensure!(d.delivery_count() == Some(2));
        d.nack(Duration::ZERO).await?;
        let d = receive_one(&mut source, WITHIN).await?;
        ensure!(
            d.raw().headers.get("x-delivery-count").map(String::as_str) == Some("2"),
            "{:?}",
            d.raw().headers
        );
        ensure!(d.delivery_count() == Some(3), "x-delivery-count + 1");
        ensure!(d.event().is_err());
        d.ack().await?;
        source.close().await;
        ensure!(fx.admin.count(&fx.source_queue).await? == 0);
        Ok(())
    })
    .await;
}

/// RabbitMQ has no delayed requeue: `nack` waits, holding the delivery, at most
/// `requeue_delay_cap_ms` of the delay asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nack_waits_at_most_the_requeue_delay_cap() {
    run(Fixture::start(), async |fx: &Fixture| {
        let mut source = on_declared_queue(
            fx,
            &amqp_url(),
            RabbitConsumerConfig {
                requeue_delay_cap_ms: 300,
                ..existing_queue(fx)
            },
        )
        .await?;
        let msg = message::event("pay-3", 1, "{}");
        publish_to_source_queue(fx, &msg).await?;
        let d = receive_one(&mut source, WITHIN).await?;
        let t = Instant::now();
        d.nack(Duration::from_secs(30)).await?;
        let took = t.elapsed();
        ensure!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "nack waited {took:?}"
        );
        let d = receive_one(&mut source, WITHIN).await?;
        ensure!(event_of(&d)?.event_id == msg.event_id);
        ensure!(d.delivery_count() == Some(2));
        d.ack().await?;
        Ok(())
    })
    .await;
}

/// After a lost connection, calls within `reconnect_min_delay_ms` fail fast as `Unavailable`
/// instead of reconnecting in a loop; after the delay the source reconnects by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_reconnect_loop_within_the_reconnect_delay() {
    run(Fixture::start(), async |fx: &Fixture| {
        let proxy = Proxy::start(fx.broker_addr()?).await?;
        let mut source = on_declared_queue(
            fx,
            &proxy.url(&amqp_url())?,
            RabbitConsumerConfig {
                reconnect_min_delay_ms: 2000,
                ..existing_queue(fx)
            },
        )
        .await?;
        ensure!(source.is_connected());
        proxy.cut();
        reported_unavailable(&mut source, "the source reports the lost connection").await?;
        proxy.restore();
        // Within the reconnect delay.
        fails_at_once(&mut source, SourceErrorKind::Unavailable).await?;

        wait::until(
            "the source reconnects",
            Duration::from_secs(15),
            async || {
                if let Err(e) = source.next_batch(10, Duration::from_millis(200)).await {
                    ensure!(e.kind == SourceErrorKind::Unavailable, "{e}");
                }
                Ok(source.is_connected().then_some(()))
            },
        )
        .await?;
        source.close().await;
        Ok(())
    })
    .await;
}

/// The broker closes the source's connection (`CONNECTION_FORCED`) while it holds a delivery:
/// the loss is reported as `Unavailable`, acknowledging the held delivery fails as
/// `Unavailable` instead of pretending, and the same source reconnects by itself and gets the
/// delivery again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_closed_by_the_broker_reconnects_and_redelivers() {
    run(Fixture::start(), async |fx: &Fixture| {
        let msg = message::event("pay-6", 1, "{}");
        let mut source = on_declared_queue(fx, &amqp_url(), existing_queue(fx)).await?;
        publish_to_source_queue(fx, &msg).await?;
        let held = receive_one(&mut source, WITHIN).await?;

        // The source names its connection after the queue, cut to 63 characters.
        let name: String = format!("outbox-consumer {}", fx.source_queue)
            .chars()
            .take(63)
            .collect();
        tokio::task::spawn_blocking({
            let name = name.clone();
            move || close_connection(&name)
        })
        .await??;
        reported_unavailable(&mut source, "the source reports the closed connection").await?;
        let err = held.ack().await.expect_err("its channel is gone");
        ensure!(err.kind == SourceErrorKind::Unavailable, "{err}");

        let count = consumed_after_outage(&mut source, &msg).await?;
        ensure!(count >= 2, "redelivered, counted {count}");
        let pid = tokio::task::spawn_blocking(move || connection_pid(&name)).await??;
        ensure!(pid.is_some(), "a new connection with the same name exists");
        Ok(())
    })
    .await;
}

/// The queue is deleted under a running consumer that does not declare it: the broker cancels
/// the consumer, which is reported as `Unavailable`; consuming again on the same connection is
/// refused, reported as `Other` naming the queue, and the call after it waits out the reconnect
/// delay instead of looping. Once the queue is declared again, the same source consumes it by
/// itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleted_queue_is_reported_then_consumed_once_declared_again() {
    run(Fixture::start(), async |fx: &Fixture| {
        let mut source = on_declared_queue(fx, &amqp_url(), existing_queue(fx)).await?;
        fx.admin.delete_queue(&fx.source_queue).await?;
        reported_unavailable(&mut source, "the source reports the cancelled consumer").await?;
        let refused = fails_at_once(&mut source, SourceErrorKind::Other).await?;
        ensure!(
            refused.message.contains("basic.consume") && refused.message.contains(&fx.source_queue),
            "{refused}"
        );
        let waiting = fails_at_once(&mut source, SourceErrorKind::Unavailable).await?;
        ensure!(
            waiting.message.contains("next reconnect attempt"),
            "{waiting}"
        );

        fx.admin
            .queue(&fx.source_queue, FieldTable::default())
            .await?;
        let msg = message::event("pay-7", 1, "{}");
        publish_to_source_queue(fx, &msg).await?;
        consumed_after_outage(&mut source, &msg).await?;
        Ok(())
    })
    .await;
}

/// The queue is deleted under a running consumer that declares it: after reporting the
/// cancelled consumer, the source declares the queue again and consumes it on the same
/// connection at once, without waiting for the (here very long) reconnect delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleted_queue_is_declared_again_on_the_same_connection() {
    run(Fixture::start(), async |fx: &Fixture| {
        // A reconnect would have to wait a minute: only reopening the channel is fast enough.
        let slow_reconnect = RabbitConsumerConfig {
            declare_queue: true,
            reconnect_min_delay_ms: 60_000,
            ..existing_queue(fx)
        };
        let mut source = connect(&amqp_url(), slow_reconnect).await?;
        fx.admin.delete_queue(&fx.source_queue).await?;
        reported_unavailable(&mut source, "the source reports the cancelled consumer").await?;
        ensure!(source.next_batch(10, Duration::ZERO).await?.is_empty());
        ensure!(
            source.is_connected(),
            "consuming again without a new connection"
        );
        let msg = message::event("pay-8", 1, "{}");
        publish_to_source_queue(fx, &msg).await?;
        ensure!(consumed_after_outage(&mut source, &msg).await? == 1);
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connect_fails_fast_and_clearly() {
    run(Fixture::start(), async |fx: &Fixture| {
        let quick = |queue: &str| RabbitConsumerConfig {
            queue: queue.to_owned(),
            connect_timeout_secs: 1,
            ..existing_queue(fx)
        };
        // Nothing listens on port 1.
        let t = Instant::now();
        let err = RabbitSource::connect("amqp://guest:s3cret@127.0.0.1:1/%2f", quick("q"))
            .await
            .expect_err("unreachable");
        ensure!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        ensure!(
            matches!(&err, RabbitConsumerError::Unreachable { endpoint, .. } if endpoint == "127.0.0.1:1//"),
            "{err:?}"
        );
        ensure!(!err.to_string().contains("s3cret"), "{err}");
        ensure!(err.to_string().contains("127.0.0.1:1"), "{err}");

        // A peer that accepts TCP and never speaks AMQP: bounded by connect_timeout_secs.
        let silent = TcpListener::bind("127.0.0.1:0").await?;
        let port = silent.local_addr()?.port();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        let t = Instant::now();
        let err = RabbitSource::connect(&format!("amqp://127.0.0.1:{port}/%2f"), quick("q"))
            .await
            .expect_err("silent peer");
        hold.abort();
        ensure!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        ensure!(
            matches!(err, RabbitConsumerError::TimedOut { .. }),
            "{err:?}"
        );

        // Wrong credentials.
        let host_port = outbox_testkit::env::host_port(&amqp_url())?;
        let err = RabbitSource::connect(&format!("amqp://nobody:wrong@{host_port}/%2f"), quick("q"))
            .await
            .expect_err("bad credentials");
        ensure!(
            matches!(
                err,
                RabbitConsumerError::Unreachable { .. } | RabbitConsumerError::TimedOut { .. }
            ),
            "{err:?}"
        );

        // Bad input never reaches the network.
        let err = RabbitSource::connect("http://nope", quick("q"))
            .await
            .expect_err("bad url");
        ensure!(matches!(err, RabbitConsumerError::InvalidUrl(_)), "{err:?}");
        let err = RabbitSource::connect(
            &amqp_url(),
            RabbitConsumerConfig {
                prefetch: 0,
                ..quick("q")
            },
        )
        .await
        .expect_err("bad config");
        ensure!(
            matches!(&err, RabbitConsumerError::Config(c) if c.key == "prefetch"),
            "{err:?}"
        );

        // The broker refuses setup steps: a missing queue, a missing exchange to bind to.
        let missing = unique("outbox-test-missing");
        let err = RabbitSource::connect(&amqp_url(), quick(&missing))
            .await
            .expect_err("missing queue");
        match &err {
            RabbitConsumerError::Setup { step, message, .. } => {
                ensure!(*step == "basic.consume", "{err}");
                ensure!(message.contains(&missing), "{err}");
            }
            other => bail!("expected a setup error, got {other:?}"),
        }
        fx.admin
            .queue(&fx.source_queue, FieldTable::default())
            .await?;
        let no_exchange = unique("outbox-test-nox");
        let err = RabbitSource::connect(
            &amqp_url(),
            RabbitConsumerConfig {
                bind_exchange: Some(no_exchange.clone()),
                ..quick(&fx.source_queue)
            },
        )
        .await
        .expect_err("missing exchange");
        ensure!(
            matches!(&err, RabbitConsumerError::Setup { step: "queue.bind", message, .. } if message.contains(&no_exchange)),
            "{err:?}"
        );
        Ok(())
    })
    .await;
}

/// `declare_queue = false` with a binding: the source binds the existing queue itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn binding_routes_the_exchange_into_an_existing_queue() {
    run(Fixture::start(), async |fx: &Fixture| {
        let transport = fx.transport_with(fx.config()).await?;
        let mut source = on_declared_queue(
            fx,
            &amqp_url(),
            RabbitConsumerConfig {
                bind_exchange: Some(fx.exchange.clone()),
                ..existing_queue(fx)
            },
        )
        .await?;
        let msg = message::event("pay-5", 1, "{}");
        transport.publish(&msg).await?;
        let d = receive_one(&mut source, WITHIN).await?;
        ensure!(event_of(&d)?.event_id == msg.event_id);
        d.ack().await?;
        source.close().await;
        transport.close().await;
        Ok(())
    })
    .await;
}

/// Messages lapin's codec could not read are deliveries like any other, malformed with the
/// place named, and the connection stays up: a short string that is not UTF-8 (lapin dropped
/// the connection on it, and the broker delivered the message again on the next one, for
/// ever) and a header table nested 10,000 levels deep (it overflowed the stack of lapin's I/O
/// thread and aborted the process). The message behind them is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_lapin_could_not_read_are_deliveries_and_the_connection_stays() {
    run(Fixture::start(), async |fx: &Fixture| {
        fx.reader().await?;
        let mut source =
            connect(&amqp_url(), fx.consumer_config(&SourceSettings::default())).await?;
        let mut publisher = RawPublisher::connect(&amqp_url()).await?;
        let msg = message::event("p-1", 1, &b"{}"[..]);
        let headers =
            wire_headers(&msg)
                .into_iter()
                .fold(Table::default(), |table, (name, value)| {
                    table.entry(name.as_bytes(), Value::LongString(value.into_bytes()))
                });
        let properties = |headers: &Table| {
            Properties::default()
                .content_type(msg.payload.content_type.0.as_bytes())
                .headers(headers)
        };
        let key = format!("{ROUTED}.p-1").into_bytes();
        let hostile = [
            (
                key.clone(),
                properties(&headers).content_type(b"application/\xff"),
                "the content type `application/\u{fffd}` is not UTF-8 text",
            ),
            (
                key.clone(),
                properties(&headers.clone().entry(b"trace\xfe", Value::Void)),
                "the header name `trace\u{fffd}` is not UTF-8 text",
            ),
            (
                [ROUTED.as_bytes(), b".\xc3\x28"].concat(),
                properties(&headers),
                "the routing key `routed.\u{fffd}(` is not UTF-8 text",
            ),
            (
                key.clone(),
                properties(&headers.clone().entry(b"abyss", nested_tables(10_000))),
                "the header `abyss` nests tables or arrays deeper than 16 levels",
            ),
        ];
        for (routing_key, properties, _) in &hostile {
            publisher
                .publish(fx.exchange.as_bytes(), routing_key, properties, b"{}")
                .await?;
        }
        publisher
            .publish(fx.exchange.as_bytes(), &key, &properties(&headers), b"{}")
            .await?;
        let deliveries = receive(&mut source, hostile.len() + 1, WITHIN).await?;
        for (d, (_, _, reason)) in deliveries.iter().zip(&hostile) {
            ensure!(
                d.event() == &Err(DecodeError::Protocol((*reason).to_owned())),
                "{:?}",
                d.event()
            );
            ensure!(d.raw().payload.as_ref() == b"{}");
            ensure!(
                d.raw().headers.get("cloudEvents_id") == Some(&msg.event_id.to_string()),
                "the headers are kept: {:?}",
                d.raw().headers
            );
            let stored = RawMessage {
                metadata: d.raw().metadata.clone(),
                ..RawMessage::default()
            };
            ensure!(source.decode(&stored) == Err(DecodeError::Protocol((*reason).to_owned())));
        }
        let last = deliveries.last().context("the valid message")?;
        ensure!(event_of(last)?.event_id == msg.event_id);
        ensure!(source.is_connected(), "the connection was dropped");
        ack_all(deliveries).await?;
        expect_nothing(&mut source, Duration::from_millis(500)).await?;
        ensure!(source.is_connected(), "the connection was dropped");
        publisher.close().await?;
        source.close().await;
        Ok(())
    })
    .await;
}
