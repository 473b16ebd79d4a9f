//! The demo's end: the replay step (a crashed relay's republish) and the verdict.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::{Result, bail};
use outbox_core::NewMessage;
use outbox_core::broker::BoxTransport;
use outbox_core::consumer::ConsumerReport;
use outbox_nats::NatsTransport;
use outbox_postgres::Schema;
use sqlx::{AssertSqlSafe, PgPool};

use super::{CONSUMER, Ledger};
use crate::observer::Seen;

/// What the replay step sent and what should reach the consumer.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Replay {
    pub(super) sent: usize,
    pub(super) broker_deduplicated: usize,
    pub(super) expected_at_consumer: usize,
}

/// Republishes up to 50 delivered events with the relay's transport (same event ids, same
/// bytes). On NATS the stream's duplicate window drops them, so the demo also sends 20 copies
/// without a `Nats-Msg-Id`, as a republish after the window would arrive.
pub(super) async fn replay(
    transport: &BoxTransport,
    nats: Option<&NatsTransport>,
    ledger: &Ledger,
) -> Result<Replay> {
    use outbox_core::Transport;
    let messages: Vec<NewMessage> = ledger
        .messages
        .lock()
        .unwrap()
        .iter()
        .take(50)
        .cloned()
        .collect();
    let mut r = Replay::default();
    let mut out = Vec::new();
    for (i, m) in messages.into_iter().enumerate() {
        let msg = m.stored(i as i64, chrono::Utc::now());
        let receipt = transport.publish(&msg).await?;
        r.sent += 1;
        if receipt.duplicate {
            r.broker_deduplicated += 1;
        } else {
            r.expected_at_consumer += 1;
        }
        out.push(msg);
    }
    if let Some(t) = nats {
        for msg in out.iter().take(20) {
            let subject = t.subject_for(msg)?;
            let mut headers = async_nats::HeaderMap::new();
            for (k, v) in t.headers_for(msg)? {
                if !k.eq_ignore_ascii_case("Nats-Msg-Id") {
                    headers.insert(k.as_str(), v.as_str());
                }
            }
            let js = async_nats::jetstream::new(t.client().clone());
            js.publish_with_headers(subject, headers, msg.payload.bytes.clone())
                .await?
                .await?;
            r.sent += 1;
            r.expected_at_consumer += 1;
        }
    }
    Ok(r)
}

pub(super) async fn verdict(
    pool: &PgPool,
    ledger: &Ledger,
    seen: &[Seen],
    consumed: &ConsumerReport,
    replayed: Replay,
    schema: &Schema,
    elapsed: Duration,
) -> Result<std::process::ExitCode> {
    let committed = ledger.committed.lock().unwrap().clone();
    let rolled_back = ledger.rolled_back.lock().unwrap().clone();
    let mut first: Vec<&Seen> = Vec::new();
    let mut ids = HashSet::new();
    for s in seen {
        if ids.insert(s.event_id) {
            first.push(s);
        }
    }
    let duplicates = seen.len() - first.len();
    let missing = committed.keys().filter(|id| !ids.contains(id)).count();
    let leaked = rolled_back.iter().filter(|id| ids.contains(id)).count();
    let mut last: HashMap<&str, i64> = HashMap::new();
    let mut out_of_order = 0;
    for s in &first {
        let l = last.entry(&s.aggregate_id).or_insert(0);
        if s.version <= *l {
            out_of_order += 1;
        }
        *l = s.version;
    }
    let s = schema.as_str();
    let one = |sql: String| async move {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
            .fetch_one(pool)
            .await
    };
    let rows = one(format!("SELECT count(*) FROM {s}.payments")).await?;
    let pending = one(format!("SELECT count(*) FROM {s}.events")).await?;
    let inbox_rows = one(format!(
        "SELECT count(*) FROM {s}.inbox WHERE consumer_name = '{CONSUMER}' AND outcome = 'applied'"
    ))
    .await?;
    let report_rows = one(format!("SELECT count(*) FROM {s}.payment_report")).await?;
    let effects = one(format!(
        "SELECT coalesce(sum(events_applied), 0)::int8 FROM {s}.payment_report"
    ))
    .await?;
    let orphan_effects = one(format!(
        "SELECT count(*) FROM {s}.payment_report r WHERE NOT EXISTS \
         (SELECT 1 FROM {s}.payments p WHERE p.id = r.payment_id)"
    ))
    .await?;
    let dead = one(format!("SELECT count(*) FROM {s}.consumer_dead_letters")).await?;
    let committed_n = committed.len() as i64;
    println!();
    println!("committed payments (business rows)      {rows}");
    println!("committed events                        {committed_n}");
    println!(
        "rolled-back transactions                {}",
        rolled_back.len()
    );
    println!("events on the broker (distinct)         {}", first.len());
    println!("wire duplicates seen by the subscriber  {duplicates}");
    println!("missing committed events                {missing}");
    println!("rolled-back events that leaked          {leaked}");
    println!("per-payment order violations            {out_of_order}");
    println!("rows left in the outbox                 {pending}");
    println!("consumer: events applied (inbox)        {inbox_rows}");
    println!("consumer: effects in payment_report     {effects} over {report_rows} payments");
    println!("consumer: effects without a payment     {orphan_effects}");
    println!(
        "consumer: replayed {} -> broker dedup {}, inbox absorbed {} (expected {})",
        replayed.sent,
        replayed.broker_deduplicated,
        consumed.duplicates,
        replayed.expected_at_consumer
    );
    println!(
        "consumer: dead letters / conflicts      {dead} / {}",
        consumed.conflicts
    );
    println!(
        "consumer: stale / retried / requeued    {} / {} / {}",
        consumed.stale, consumed.nacked, consumed.requeued_resolved
    );
    println!(
        "elapsed                                 {:.1}s",
        elapsed.as_secs_f64()
    );
    let ok = missing == 0
        && leaked == 0
        && out_of_order == 0
        && pending == 0
        && committed_n > 0
        && inbox_rows == committed_n
        && effects == committed_n
        && report_rows == rows
        && orphan_effects == 0
        && dead == 0
        && consumed.duplicates >= replayed.expected_at_consumer;
    if ok {
        println!(
            "VERDICT: PASS: every committed payment event reached the broker in order and had exactly one effect at the consumer; nothing rolled back leaked; every replay was absorbed"
        );
        Ok(std::process::ExitCode::SUCCESS)
    } else {
        println!("VERDICT: FAIL");
        if committed.is_empty() {
            bail!("no event was committed");
        }
        Ok(std::process::ExitCode::from(1))
    }
}
