//! Starting the system under test: the stand-in provider, the consumer, the relays, the
//! executor and the producer, one of them armed with the cell's crash point.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::CONSUMER;
use super::cells::{Action, Role};
use super::env::Env;
use super::process::Proc;

/// The running system: every process (the provider first) and the provider's address.
pub(super) struct Processes {
    pub(super) procs: Vec<Proc>,
    pub(super) provider_url: String,
}

/// What [`start_system`] starts.
pub(super) struct SystemSpec<'a> {
    /// Where the processes' logs go.
    pub(super) logs: &'a Path,
    pub(super) payments: u64,
    pub(super) producer_extra: &'a [&'a str],
    pub(super) relays: usize,
    pub(super) provider_idempotent: bool,
    pub(super) provider_delay_ms: u64,
    pub(super) executor_timeout_ms: u64,
    pub(super) arm: Option<(Role, &'a str, u64, Action)>,
}

pub(super) async fn start_system(env: &Env, spec: SystemSpec<'_>) -> Result<Processes> {
    let SystemSpec {
        logs,
        payments,
        producer_extra,
        relays,
        provider_idempotent,
        provider_delay_ms,
        executor_timeout_ms,
        arm,
    } = spec;
    // The provider first: the executor needs its address.
    let (provider, provider_url) =
        start_provider(env, logs, provider_idempotent, provider_delay_ms).await?;
    let mut procs = vec![provider];
    procs.push(Proc::new(
        logs,
        Role::Consumer,
        "consumer",
        consumer_args(env),
    ));
    for i in 0..relays {
        procs.push(Proc::new(
            logs,
            Role::Relay,
            &format!("relay-{i}"),
            vec!["relay".into()],
        ));
    }
    procs.push(Proc::new(
        logs,
        Role::Executor,
        "executor",
        executor_args(&provider_url, executor_timeout_ms),
    ));
    let mut producer_args = vec!["demo-producer".to_owned(), format!("--payments={payments}")];
    producer_args.extend(producer_extra.iter().map(|s| (*s).to_owned()));
    procs.push(Proc::new(logs, Role::Producer, "producer", producer_args));
    if let Some((role, point, skip, action)) = arm
        && let Some(p) = procs.iter_mut().find(|p| p.role == role)
    {
        p.crash = Some((point.to_owned(), skip, action));
    }
    start_in_order(env, &mut procs, relays).await?;
    Ok(Processes {
        procs,
        provider_url,
    })
}

/// Starts the stand-in provider and waits for the address it reports.
async fn start_provider(
    env: &Env,
    logs: &Path,
    provider_idempotent: bool,
    provider_delay_ms: u64,
) -> Result<(Proc, String)> {
    let mut provider_args = vec!["demo-provider".to_owned()];
    if !provider_idempotent {
        provider_args.push("--no-idempotency".into());
    }
    provider_args.push(format!("--delay-ms={provider_delay_ms}"));
    let mut provider = Proc::new(logs, Role::Provider, "provider", provider_args);
    provider.start(env).await?;
    let provider_url = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(url) = provider
                .lines
                .lock()
                .unwrap()
                .iter()
                .find_map(|l| l.strip_prefix("listening on ").map(str::to_owned))
            {
                break url;
            }
            if Instant::now() > deadline {
                bail!("the provider did not report its address within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    Ok((provider, provider_url))
}

/// The consumer's command line: inbox + report + payouts, on the cell's stream / queue / topic.
fn consumer_args(env: &Env) -> Vec<String> {
    let mut consumer_args: Vec<String> = [
        "demo-consumer",
        "--name",
        CONSUMER,
        "--ack-wait-secs",
        "2",
        "--batch-size",
        "10",
        "--ordering",
        "wait",
        "--payouts",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    consumer_args.extend([
        "--nats-stream".into(),
        env.stream(),
        "--rabbit-queue".into(),
        env.queue(),
        "--rabbit-exchange".into(),
        env.prefix.clone(),
        "--kafka-topic".into(),
        env.kafka_topic(),
        "--kafka-group".into(),
        env.kafka_group(),
    ]);
    consumer_args
}

/// The executor's command line: payouts at the provider, with its call timeout.
fn executor_args(provider_url: &str, executor_timeout_ms: u64) -> Vec<String> {
    vec![
        "effects".into(),
        "run".into(),
        "--kind".into(),
        crate::demo::PAYOUT_KIND.into(),
        "--provider-url".into(),
        provider_url.to_owned(),
        format!("--call-timeout-ms={executor_timeout_ms}"),
        "--lease-secs=3.5".into(),
        "--batch-size=8".into(),
        "--concurrency=8".into(),
        "--reconcile-after-ms=300".into(),
    ]
}

/// Starts every process but the provider (already running), in order; in CDC mode each relay
/// is streaming or waiting as a standby before the next process starts.
async fn start_in_order(env: &Env, procs: &mut [Proc], relays: usize) -> Result<()> {
    let mut relays_started = 0;
    for p in procs.iter_mut().skip(1) {
        p.start(env).await?;
        if p.role == Role::Relay {
            relays_started += 1;
        }
        if env.cdc && p.role == Role::Relay && relays_started < relays {
            // The first relay takes the slot before the next one starts as its standby: the
            // armed relay is the one that streams.
            p.wait_for_log("streaming the replication slot", Duration::from_secs(20))
                .await?;
        } else if env.cdc && p.role == Role::Relay && relays > 1 {
            // And the standby waits on the slot before the producer writes: started after the
            // producer, a slow standby could find the slot already free (the armed relay
            // crashed on the first batch) and stream it without any takeover.
            p.wait_for_log(
                "waiting as a standby until the slot is free",
                Duration::from_secs(20),
            )
            .await?;
        }
    }
    Ok(())
}
