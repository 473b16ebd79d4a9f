//! RabbitMQ-specific tests of [`RabbitSource`] against the real broker at
//! `OUTBOX_TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`): the quorum-queue
//! delivery count, the nack delay cap, no reconnect loop after a lost connection, binding an
//! existing queue, startup errors. What every delivery source must do is in the conformance
//! suite (`conformance.rs`). A missing broker fails the tests.

mod common;

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use common::{Fixture, amqp_url, long, unique, wire_headers};
use lapin::BasicProperties;
use lapin::types::FieldTable;
use outbox_core::Transport;
use outbox_core::consumer::{Delivery, DeliverySource, SourceErrorKind};
use outbox_rabbitmq::{RabbitConsumerConfig, RabbitConsumerError, RabbitSource};
use outbox_testkit::harness::{Harness as _, run};
use outbox_testkit::message;
use outbox_testkit::net::Proxy;
use outbox_testkit::source::{SourceSettings, event_of, receive_one};
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
        let headers = common::table(&wire_headers(&msg));
        fx.admin
            .publish(
                &fx.source_queue,
                &msg.payload.bytes,
                BasicProperties::default().with_headers(headers),
            )
            .await?;
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
        let err = wait::until(
            "the source reports the lost connection",
            WITHIN,
            async || match source.next_batch(10, Duration::from_millis(200)).await {
                Ok(batch) if batch.is_empty() => Ok(None),
                Ok(_) => bail!("a delivery on a cut link"),
                Err(e) => Ok(Some(e)),
            },
        )
        .await?;
        ensure!(err.kind == SourceErrorKind::Unavailable, "{err}");
        ensure!(!source.is_connected());
        proxy.restore();
        let t = Instant::now();
        let err = source
            .next_batch(10, Duration::from_secs(5))
            .await
            .expect_err("within the reconnect delay");
        ensure!(err.kind == SourceErrorKind::Unavailable, "{err}");
        ensure!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());

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
