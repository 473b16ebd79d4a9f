//! Kafka-specific behaviour of the transport and the source against the real broker: missing
//! topics, start-up against an unreachable cluster, keys and timestamps, and two members of
//! one group through a rebalance, and a member resuming inside a batch.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context as _;
use common::Fixture;
use outbox_core::consumer::{Delivery as _, DeliverySource as _};
use outbox_core::{PublishErrorKind, Transport as _};
use outbox_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use outbox_kafka::rdkafka::message::Message as _;
use outbox_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use outbox_kafka::{KafkaConfig, KafkaConnectError, KafkaSource, KafkaTransport};
use outbox_testkit::harness::run;
use outbox_testkit::message;
use outbox_testkit::source::{SourceSettings, event_of};
use outbox_testkit::transport::PROMPT;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_is_a_prompt_rejection_then_publishes_once_it_exists() {
    run(Fixture::start(), async |fx: &Fixture| {
        let topic = format!("outboxmissing{}", Uuid::now_v7().simple());
        let transport = fx
            .transport_with(KafkaConfig {
                topic_template: Some(topic.clone()),
                create_topics: false,
                ..fx.config()
            })
            .await?;
        let msg = message::event("missing", 1, &b"{}"[..]);
        let started = tokio::time::Instant::now();
        let err = transport
            .publish(&msg)
            .await
            .expect_err("a publish to a missing topic must fail");
        anyhow::ensure!(
            err.kind == PublishErrorKind::Rejected && err.is_retryable(),
            "a missing topic failed as {err}"
        );
        anyhow::ensure!(
            err.message.contains(&topic) && err.message.contains("does not exist"),
            "the reason does not name the topic: {err}"
        );
        anyhow::ensure!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());

        common::create_topic(&fx.url(), &topic).await?;
        transport
            .publish(&msg)
            .await
            .context("the same event once the topic exists")?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_is_created_on_first_use_with_the_configured_partitions() {
    run(Fixture::start(), async |fx: &Fixture| {
        let prefix = format!("outboxcreated{}", Uuid::now_v7().simple());
        let transport = fx
            .transport_with(KafkaConfig {
                topic_template: Some(format!("{prefix}.{{aggregate_type}}")),
                topic_partitions: 3,
                ..fx.config()
            })
            .await?;
        let mut msg = message::event("created", 1, &b"{}"[..]);
        msg.aggregate_type = "Pay ment/EU".into();
        transport.publish(&msg).await.context("first publish")?;
        let topic = format!("{prefix}.Pay_ment_EU");
        let url = fx.url();
        let check = topic.clone();
        let partitions = tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = common::client(&url)?.create()?;
            let metadata = consumer.fetch_metadata(Some(&check), Duration::from_secs(10))?;
            let t = metadata
                .topics()
                .iter()
                .find(|t| t.name() == check)
                .context("the topic is not in the metadata")?;
            anyhow::Ok(t.partitions().len())
        })
        .await??;
        anyhow::ensure!(partitions == 3, "created with {partitions} partitions");
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_cluster_fails_start_up_within_the_timeout() {
    let started = tokio::time::Instant::now();
    let err = KafkaTransport::connect(
        "kafka://127.0.0.1:1",
        KafkaConfig {
            connect_timeout_secs: 2,
            ..KafkaConfig::default()
        },
    )
    .await
    .expect_err("nothing listens on port 1");
    assert!(matches!(err, KafkaConnectError::Connect { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let err = KafkaTransport::connect(
        "kafka://user:hunter2@127.0.0.1:9092",
        KafkaConfig::default(),
    )
    .await
    .expect_err("credentials in the URL are refused");
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_is_the_partition_key_and_the_timestamp_the_creation_time() {
    run(Fixture::start(), async |fx: &Fixture| {
        let transport = fx.transport_with(fx.config()).await?;
        let plain = message::event("keyed", 1, &b"{}"[..]);
        let mut overridden = message::event("keyed", 2, &b"{}"[..]);
        overridden.partition_key = Some("tenant-7".into());
        transport.publish(&plain).await?;
        transport.publish(&overridden).await?;
        let url = fx.url();
        let topic = fx.topic.clone();
        let got = tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = common::client(&url)?
                .set("group.id", format!("reader-{}", Uuid::now_v7().simple()))
                .create()?;
            let mut list = TopicPartitionList::new();
            list.add_partition_offset(&topic, 0, Offset::Beginning)?;
            consumer.assign(&list)?;
            let mut got = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while got.len() < 2 && std::time::Instant::now() < deadline {
                if let Some(m) = consumer.poll(Duration::from_millis(200)) {
                    let m = m?;
                    got.push((
                        m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                        m.timestamp().to_millis(),
                    ));
                }
            }
            anyhow::Ok(got)
        })
        .await??;
        anyhow::ensure!(
            got == vec![
                (
                    Some(plain.aggregate_id.clone()),
                    Some(plain.created_at.timestamp_millis())
                ),
                (
                    Some("tenant-7".to_owned()),
                    Some(overridden.created_at.timestamp_millis())
                ),
            ],
            "keys and timestamps: {got:?}"
        );
        Ok(())
    })
    .await;
}

/// A transport to a fresh topic `<prefix><id>` of four partitions (created by its first publish).
async fn four_partitions(fx: &Fixture, prefix: &str) -> anyhow::Result<(String, KafkaTransport)> {
    let topic = format!("{prefix}{}", Uuid::now_v7().simple());
    let transport = fx
        .transport_with(KafkaConfig {
            topic_template: Some(topic.clone()),
            topic_partitions: 4,
            ..fx.config()
        })
        .await?;
    Ok((topic, transport))
}

/// Publishes `versions` of aggregates `agg-0` to `agg-{aggregates - 1}`, version by version.
async fn publish_versions(
    transport: &KafkaTransport,
    aggregates: usize,
    versions: std::ops::RangeInclusive<i64>,
) -> anyhow::Result<()> {
    for v in versions {
        for a in 0..aggregates {
            transport
                .publish(&message::event(&format!("agg-{a}"), v, &b"{}"[..]))
                .await?;
        }
    }
    Ok(())
}

/// Two members of one group on a topic of four partitions: the second joins halfway (a
/// rebalance moves partitions away from the first, which commits before it lets them go).
/// Every event is delivered at least once, every event after its predecessors of the same
/// aggregate (per-partition order), and after both acknowledged everything, a third member
/// gets nothing: nothing was committed past an unacknowledged event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_members_through_a_rebalance_miss_nothing_and_keep_each_aggregates_order() {
    run(Fixture::start(), async |fx: &Fixture| {
        let (topic, transport) = four_partitions(fx, "outboxgroup").await?;
        let config = outbox_kafka::KafkaConsumerConfig {
            topics: vec![topic.clone()],
            ..fx.consumer_config(&SourceSettings::default())
        };
        const AGGREGATES: usize = 8;
        const VERSIONS: i64 = 25;
        publish_versions(&transport, AGGREGATES, 1..=10).await?;

        let mut first = KafkaSource::connect(&fx.url(), config.clone()).await?;
        // (aggregate, version) -> deliveries; per aggregate, the versions in delivery order.
        let mut seen: BTreeMap<(String, i64), usize> = BTreeMap::new();
        let mut acked: BTreeSet<(String, i64)> = BTreeSet::new();
        let mut order: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        let record = |seen: &mut BTreeMap<(String, i64), usize>,
                      order: &mut BTreeMap<String, Vec<i64>>,
                      d: &outbox_kafka::KafkaDelivery|
         -> anyhow::Result<()> {
            let e = event_of(d)?;
            *seen
                .entry((e.aggregate_id.clone(), e.aggregate_version))
                .or_default() += 1;
            order
                .entry(e.aggregate_id.clone())
                .or_default()
                .push(e.aggregate_version);
            Ok(())
        };
        // The first member alone takes some events.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut taken = 0;
        while taken < 30 {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "only {taken} delivered"
            );
            for d in first.next_batch(10, Duration::from_millis(500)).await? {
                record(&mut seen, &mut order, &d)?;
                let e = event_of(&d)?;
                let key = (e.aggregate_id.clone(), e.aggregate_version);
                d.ack().await?;
                acked.insert(key);
                taken += 1;
            }
        }
        // The second member joins; both consume while the rest is published.
        let mut second = KafkaSource::connect(&fx.url(), config.clone()).await?;
        publish_versions(&transport, AGGREGATES, 11..=VERSIONS).await?;
        let total = AGGREGATES * usize::try_from(VERSIONS)?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        while acked.len() < total {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{} of {total} events acknowledged ({} delivered)",
                acked.len(),
                seen.len()
            );
            for source in [&mut first, &mut second] {
                for d in source.next_batch(20, Duration::from_millis(200)).await? {
                    record(&mut seen, &mut order, &d)?;
                    // An ack of a partition revoked meanwhile fails; its new owner reads the
                    // event again (and the inbox would absorb it). Only a successful ack
                    // counts as applied.
                    let e = event_of(&d)?;
                    let key = (e.aggregate_id.clone(), e.aggregate_version);
                    if d.ack().await.is_ok() {
                        acked.insert(key);
                    }
                }
            }
        }
        for (aggregate, versions) in &order {
            // Redeliveries start again from a committed offset, so a version may repeat, but
            // never comes before one it follows for the first time.
            let mut highest = 0;
            for v in versions {
                anyhow::ensure!(
                    *v <= highest + 1,
                    "{aggregate}: version {v} delivered before {} ({versions:?})",
                    highest + 1
                );
                highest = highest.max(*v);
            }
        }
        let again: BTreeSet<_> = seen
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, _)| k)
            .collect();
        eprintln!("{} of {total} events delivered more than once", again.len());
        drop(first);
        drop(second);
        let mut third = KafkaSource::connect(&fx.url(), config).await?;
        let quiet =
            outbox_testkit::source::expect_nothing(&mut third, Duration::from_secs(8)).await;
        anyhow::ensure!(
            third.lag().await? == Some(0),
            "lag after everything was acknowledged"
        );
        quiet.context("a third member after both acknowledged everything")?;
        Ok(())
    })
    .await;
}

/// A member that resumes from a committed offset inside a batch of several records gets the
/// rest of that batch, and the cluster's end offset counts every record. This is what a
/// consumer killed mid-batch relies on: before `scripts/kafka-broker` patched the test broker
/// (tansu 0.6.0 fetched only batches starting at or after the offset), the records after the
/// committed offset were never delivered while the group's offset equalled the partition's
/// reported end, and the crash matrix lost an event in two of four Kafka runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_resuming_inside_a_batch_gets_the_rest_of_it() {
    run(Fixture::start(), async |fx: &Fixture| {
        // Ten publishes under way at once, lingered into one produce request: one batch.
        let mut config = fx.config();
        config
            .properties
            .0
            .insert("linger.ms".to_owned(), "300".to_owned());
        let transport = fx.transport_with(config).await?;
        let events: Vec<_> = (1..=10)
            .map(|v| message::event("agg-batch", v, &b"{}"[..]))
            .collect();
        futures::future::try_join_all(events.iter().map(|e| transport.publish(e))).await?;

        let consumer_config = fx.consumer_config(&SourceSettings::default());
        let mut first = KafkaSource::connect(&fx.url(), consumer_config.clone()).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut batch = Vec::new();
        while batch.len() < 10 {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{} of 10 delivered",
                batch.len()
            );
            batch.extend(first.next_batch(10, Duration::from_millis(500)).await?);
        }
        let mut versions = Vec::new();
        for d in &batch {
            versions.push(event_of(d)?.aggregate_version);
        }
        // In offset order (the publishes raced, so not in version order): one of each.
        let mut sorted = versions.clone();
        sorted.sort_unstable();
        anyhow::ensure!(sorted == (1..=10).collect::<Vec<_>>(), "{versions:?}");
        // The first four are applied; the member dies with the rest in hand (closing commits
        // what is done: offset 4, inside the batch).
        let rest = batch.split_off(4);
        for d in batch {
            d.ack().await?;
        }
        drop(rest);
        drop(first);

        let (low, high) = {
            let reader: BaseConsumer = common::client(&fx.url())?
                .set("group.id", format!("probe-{}", Uuid::now_v7().simple()))
                .create()?;
            let topic = fx.topic.clone();
            tokio::task::spawn_blocking(move || {
                reader.fetch_watermarks(&topic, 0, Duration::from_secs(10))
            })
            .await??
        };
        anyhow::ensure!(
            (low, high) == (0, 10),
            "watermarks ({low}, {high}), not (0, 10)"
        );

        let mut second = KafkaSource::connect(&fx.url(), consumer_config).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut again = Vec::new();
        while again.len() < 6 {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "after resuming at offset 4 of {versions:?} only {again:?} came"
            );
            for d in second.next_batch(10, Duration::from_millis(500)).await? {
                again.push(event_of(&d)?.aggregate_version);
                d.ack().await?;
            }
        }
        anyhow::ensure!(
            again == versions[4..],
            "after resuming at offset 4 of {versions:?} came {again:?}"
        );
        Ok(())
    })
    .await;
}

/// With the `cooperative-sticky` assignor, a member whose partitions are paused (it holds its
/// limit of unacknowledged deliveries) while a second member joins keeps the partitions it
/// still holds in step with its flow control: once it settled what it held, it reads on, and
/// every event of the topic is acknowledged by one member or the other. Before, the
/// incremental assignment that follows the join (librdkafka calls it, with no partitions, after
/// the revocation) counted the member as resumed while librdkafka kept its partitions paused,
/// so nothing was read from them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_member_reads_on_after_a_cooperative_rebalance() {
    run(Fixture::start(), async |fx: &Fixture| {
        let (topic, transport) = four_partitions(fx, "outboxcoop").await?;
        const AGGREGATES: usize = 8;
        publish_versions(&transport, AGGREGATES, 1..=5).await?;
        // Paused at 8 held, resumed at 6 or fewer.
        const MAX: usize = 8;
        let mut config = outbox_kafka::KafkaConsumerConfig {
            topics: vec![topic.clone()],
            max_unacked: MAX,
            ..fx.consumer_config(&SourceSettings::default())
        };
        config.properties.0.insert(
            "partition.assignment.strategy".to_owned(),
            "cooperative-sticky".to_owned(),
        );
        let mut acked: BTreeSet<(String, i64)> = BTreeSet::new();
        let key = |d: &outbox_kafka::KafkaDelivery| -> anyhow::Result<(String, i64)> {
            let e = event_of(d)?;
            Ok((e.aggregate_id.clone(), e.aggregate_version))
        };

        // The first member takes its limit and holds it: its partitions are paused.
        let mut first = KafkaSource::connect(&fx.url(), config.clone()).await?;
        let mut held = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while held.len() < MAX {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "only {} delivered",
                held.len()
            );
            held.extend(first.next_batch(MAX, Duration::from_millis(500)).await?);
        }
        // The next poll finds the limit reached and pauses the partitions (it may still hand
        // out what librdkafka had fetched).
        held.extend(first.next_batch(MAX, Duration::from_millis(200)).await?);
        // One settled: 7 or more held, still paused.
        let one = held.pop().context("a delivery")?;
        let one_key = key(&one)?;
        one.ack().await?;
        acked.insert(one_key);

        // A second member joins; the first keeps polling (it serves the rebalance) while it
        // still holds what it took.
        let mut second = KafkaSource::connect(&fx.url(), config.clone()).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while second.assigned_partitions() == 0 || first.assigned_partitions() == 4 {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "no rebalance: the first holds {} partitions, the second {}",
                first.assigned_partitions(),
                second.assigned_partitions()
            );
            held.extend(first.next_batch(10, Duration::from_millis(200)).await?);
            for d in second.next_batch(10, Duration::from_millis(200)).await? {
                let k = key(&d)?;
                d.ack().await?;
                acked.insert(k);
            }
        }
        anyhow::ensure!(
            first.assigned_partitions() > 0,
            "the first member kept no partition"
        );
        // The first settles everything it held (an ack of a partition that moved fails: its
        // new owner reads the event again).
        for d in held {
            let k = key(&d)?;
            if d.ack().await.is_ok() {
                acked.insert(k);
            }
        }
        publish_versions(&transport, AGGREGATES, 6..=10).await?;
        let total = AGGREGATES * 10;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while acked.len() < total {
            let missing: Vec<_> = (0..AGGREGATES)
                .flat_map(|a| (1..=10).map(move |v| (format!("agg-{a}"), v)))
                .filter(|k| !acked.contains(k))
                .take(5)
                .collect();
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{} of {total} events acknowledged; missing {missing:?}... (partitions: first {}, \
                 second {})",
                acked.len(),
                first.assigned_partitions(),
                second.assigned_partitions()
            );
            for source in [&mut first, &mut second] {
                for d in source.next_batch(20, Duration::from_millis(200)).await? {
                    let k = key(&d)?;
                    if d.ack().await.is_ok() {
                        acked.insert(k);
                    }
                }
            }
        }
        Ok(())
    })
    .await;
}
