//! Header blocks the NATS client library cannot parse, through the real JetStream stream into
//! the in-process `PgConsumer` on the real PostgreSQL: each form published raw (an `HPUB`
//! written by hand on a TCP socket: a header value that is not UTF-8, a line without `:`, a
//! name that is not UTF-8), each followed by a valid event published normally. The valid event
//! is applied within 5 s, each hostile message is exactly one consumer dead letter with its raw
//! bytes, a reason and the event id read beside the defect, and the consumer's connection is
//! never reset. (With async-nats 0.51 as published, each of them dropped the consumer's
//! connection after every ack wait, for ever.) Fetch and prefetch modes.
#![allow(missing_docs)]

mod common;
mod inbox_common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use inbox_common::*;
use outbox_core::consumer::{ConsumerReport, OrderingGuard};
use outbox_nats::async_nats::{self, connection::State};
use outbox_nats::{NatsConsumerConfig, NatsSource, RAW_HEADER_BLOCK};
use outbox_testkit::nats_wire::{Hostile, RawNats};
use serde_json::json;

/// The acceptance's bound: the valid event behind a hostile one is applied within this.
const WITHIN: Duration = Duration::from_secs(5);
/// An ack wait far above [`WITHIN`]: a delivery lost with a dropped connection would come back
/// only after it, so the bound could not be met by a redelivery.
const ACK_WAIT_SECS: u64 = 30;

mod fetch {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn each_hostile_header_block_is_one_dead_letter_and_the_next_is_applied() {
        super::hostile_then_valid(0).await;
    }
}

mod prefetch {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn each_hostile_header_block_is_one_dead_letter_and_the_next_is_applied() {
        super::hostile_then_valid(64).await;
    }
}

/// A NATS source on a fresh durable with a long ack wait, and its client.
async fn source(env: &Env, prefetch: usize) -> (Src, async_nats::Client) {
    let BrokerEnv::Nats(nats) = &env.broker else {
        unreachable!("a NATS environment")
    };
    let source = NatsSource::connect(
        &nats_url(),
        NatsConsumerConfig {
            stream: nats.stream.clone(),
            durable_name: env.endpoint_name(),
            ack_wait_secs: ACK_WAIT_SECS,
            prefetch,
            ..NatsConsumerConfig::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("NatsSource: {e}"));
    let client = source.client().clone();
    (src(source), client)
}

async fn hostile_then_valid(prefetch: usize) {
    let env = Env::new(Kind::Nats).await;
    let wire = env.nats_wire.as_ref().expect("the NATS transport");
    let (src, client) = source(&env, prefetch).await;
    let mut c = env.ledger_consumer(src, OrderingGuard::Off);
    let mut raw = RawNats::connect(&nats_url())
        .await
        .expect("raw NATS connection");
    let mut sent = Vec::new();
    let mut totals = ConsumerReport::default();
    for (i, form) in Hostile::ALL.into_iter().enumerate() {
        let poison = message(
            &format!("pay-{}", uid()),
            1,
            "PaymentCreated",
            json!({"form": format!("{form:?}")}),
        );
        let headers = wire.headers_for(&poison).expect("headers");
        let block = form.block(&headers);
        raw.publish_stored(
            &wire.subject_for(&poison).expect("subject"),
            &block,
            &poison.payload.bytes,
        )
        .await
        .unwrap_or_else(|e| panic!("{form:?}: {e:#}"));
        let valid = message(&format!("pay-{}", uid()), 1, "PaymentCreated", json!({}));
        env.publish(&valid).await;

        let n = i + 1;
        run_until(
            &mut c,
            &mut totals,
            WITHIN,
            &format!("{form:?} dead-lettered and the valid event behind it applied"),
            |t| t.dead_lettered >= n && t.processed >= n,
        )
        .await;
        assert_eq!(
            (totals.processed, totals.dead_lettered),
            (n, n),
            "{totals:?}"
        );
        assert_eq!(
            env.effects_of("ledger", valid.event_id).await,
            1,
            "{form:?}"
        );
        sent.push((form, poison, headers, block));
    }
    let after = run_for(&mut c, QUIET).await;
    assert_eq!(after.received, 0, "a settled delivery came back: {after:?}");
    assert_eq!(env.effects("ledger").await, 3, "the valid events only");

    let dead = stored_dead_letters(&env, "ledger").await;
    assert_eq!(
        dead.len(),
        3,
        "one dead letter per hostile message: {dead:#?}"
    );
    for (dead, (form, poison, headers, block)) in dead.iter().zip(&sent) {
        assert_eq!(
            dead.payload,
            poison.payload.bytes.to_vec(),
            "{form:?}: the body"
        );
        assert_eq!(dead.attempts, 1, "{form:?}: at the first delivery");
        assert_eq!(
            dead.header("ce-id"),
            Some(poison.event_id.to_string().as_bytes()),
            "{form:?}: the readable headers are kept by name"
        );
        // Malformed, yet identified by what was readable beside the defect.
        assert_eq!(dead.event_id, Some(poison.event_id), "{form:?}");
        assert_eq!(
            (
                dead.aggregate_type.as_deref(),
                dead.aggregate_id.as_deref(),
                dead.aggregate_version
            ),
            (Some("payment"), Some(poison.aggregate_id.as_str()), Some(1)),
            "{form:?}"
        );
        match form {
            Hostile::ValueNotUtf8 => {
                let ce_type = Hostile::invalid_value(headers);
                assert_eq!(
                    dead.header("ce-type").map(<[u8]>::to_vec),
                    ce_type,
                    "{form:?}: the value byte for byte"
                );
                assert!(
                    dead.error
                        .starts_with("malformed: CloudEvents attribute `type`")
                        && dead.error.contains("not UTF-8"),
                    "{form:?}: {}",
                    dead.error
                );
            }
            Hostile::LineWithoutColon | Hostile::NameNotUtf8 => {
                assert_eq!(
                    dead.header(RAW_HEADER_BLOCK),
                    Some(block.as_slice()),
                    "{form:?}: the header block byte for byte"
                );
                let why = match form {
                    Hostile::LineWithoutColon => "has no `:`",
                    _ => "is not printable ASCII",
                };
                assert!(
                    dead.error
                        .starts_with("malformed: unreadable headers: line 3")
                        && dead.error.contains(why),
                    "{form:?}: {}",
                    dead.error
                );
            }
        }
        assert!(
            dead.metadata.to_string().contains("stream_sequence"),
            "{form:?}: {}",
            dead.metadata
        );
    }
    assert_eq!(
        client.statistics().connects.load(Ordering::SeqCst),
        1,
        "the consumer's connection was reset"
    );
    assert_eq!(client.connection_state(), State::Connected);
    env.cleanup().await;
}
