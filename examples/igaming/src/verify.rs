//! The end state of a run, read from where each service keeps it (the bets database, the
//! history database, the ledger database), and the checks of the verification table.

use std::collections::HashMap;

use anyhow::{Context, Result};
use outbox::operator::prelude::*;
use outbox::operator::{ConflictFilter, ConsumerSelection, Overview};
use outbox::postgres::PgStore;
use sqlx::PgPool;
use support::table::{Check, eq};

use crate::bets::payout_of;
use crate::conflict::Injected;
use crate::db::HOUSE_ACCOUNT;
use crate::load::LoadReport;
use crate::payouts::payout_key;
use crate::topology::{HISTORY_CONSUMER, PAYOUTS_CONSUMER};

/// The ledger's sums.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// Postings.
    pub postings: i64,
    /// Distinct bets paid.
    pub bets_paid: i64,
    /// Bets with more than one posting.
    pub bets_paid_twice: i64,
    /// Postings without exactly one debit and one credit entry.
    pub unbalanced_postings: i64,
    /// Sum of debit entries.
    pub debits: i64,
    /// Sum of credit entries.
    pub credits: i64,
    /// The house account's balance (credits - debits).
    pub house: i64,
    /// The sum of the players' balances.
    pub players: i64,
}

impl Ledger {
    /// The ledger database's numbers.
    async fn read(ledger: &PgPool) -> Result<Self> {
        let (postings, bets_paid, bets_paid_twice): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*), count(DISTINCT bet_id), \
         (SELECT count(*) FROM (SELECT bet_id FROM ledger_postings GROUP BY bet_id \
                                HAVING count(*) > 1) twice) \
         FROM ledger_postings",
        )
        .fetch_one(ledger)
        .await?;
        let unbalanced_postings: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM ledger_postings p WHERE \
         (SELECT count(*) FILTER (WHERE side = 'debit') || '/' || \
                 count(*) FILTER (WHERE side = 'credit') \
          FROM ledger_entries e WHERE e.business_key = p.business_key) <> '1/1'",
        )
        .fetch_one(ledger)
        .await?;
        let (debits, credits, house, players): (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT coalesce(sum(amount) FILTER (WHERE side = 'debit'), 0)::bigint, \
                coalesce(sum(amount) FILTER (WHERE side = 'credit'), 0)::bigint, \
                coalesce(sum(CASE side WHEN 'credit' THEN amount ELSE -amount END) \
                         FILTER (WHERE account = $1), 0)::bigint, \
                coalesce(sum(CASE side WHEN 'credit' THEN amount ELSE -amount END) \
                         FILTER (WHERE account <> $1), 0)::bigint \
         FROM ledger_entries",
        )
        .bind(HOUSE_ACCOUNT)
        .fetch_one(ledger)
        .await?;
        Ok(Self {
            postings,
            bets_paid,
            bets_paid_twice,
            unbalanced_postings,
            debits,
            credits,
            house,
            players,
        })
    }
}

/// Everything counted at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Bets rows, all states.
    pub bets: i64,
    /// Bets settled won.
    pub bets_won: i64,
    /// Bets settled lost.
    pub bets_lost: i64,
    /// Sum of the won bets' payouts (bets DB).
    pub won_payouts: i64,
    /// Won bets: id → (stake, odds_x100); empty in a quick snapshot.
    pub won: HashMap<String, (i64, i64)>,
    /// History rows.
    pub history_rows: i64,
    /// History rows settled (won or lost).
    pub history_settled: i64,
    /// History rows whose event count is not their state's (1 accepted, 2 settled).
    pub history_wrong_events: i64,
    /// Players whose totals differ from their bets' history rows.
    pub totals_wrong: i64,
    /// The ledger's sums.
    pub ledger: Ledger,
    /// Posted payouts: bet id → amount; empty in a quick snapshot.
    pub payouts: HashMap<String, i64>,
    /// The bets database's outbox.
    pub bets_db: Overview,
    /// The history database's inbox.
    pub history_db: Overview,
    /// The ledger database's inbox.
    pub ledger_db: Overview,
    /// Conflicts recorded for the re-sent event at the payout consumer.
    pub conflict_at_payouts: i64,
    /// Conflicts recorded for the re-sent event at the history projection.
    pub conflict_at_history: i64,
    /// Consumer dead letters of the re-emitted event (new id) at the payout consumer whose
    /// error names the ledger's business key.
    pub reemitted_refused_by_key: i64,
    /// Consumer dead letters of the re-emitted event at the history projection (it absorbs
    /// the old version instead).
    pub reemitted_dead_at_history: i64,
    /// Whether the history projection's inbox holds the re-emitted event as absorbed by the
    /// ordering guard (`stale`): it reached history and changed nothing.
    pub reemitted_stale_at_history: bool,
}

fn overview(pool: &PgPool) -> PgStore {
    PgStore::with_schema(pool.clone(), crate::db::schema())
}

/// Open dead letters of `event_id` at `consumer` in `db` whose error contains `reason`.
async fn dead_letters_of(
    db: &PgPool,
    event_id: outbox::EventId,
    consumer: &str,
    reason: &str,
) -> Result<i64> {
    let which = ConsumerSelection {
        consumer: Some(consumer.to_owned()),
        ..ConsumerSelection::default()
    };
    let list = overview(db)
        .consumer_dead_letters(&which, 1000)
        .await
        .context("cannot list the consumer dead letters")?;
    Ok(list
        .iter()
        .filter(|d| {
            d.dead_letter.event_id == Some(event_id) && d.dead_letter.error.contains(reason)
        })
        .count() as i64)
}

/// Whether `consumer`'s inbox in `db` holds `event_id` as absorbed by the ordering guard.
async fn absorbed_as_stale(db: &PgPool, event_id: outbox::EventId, consumer: &str) -> Result<bool> {
    let trace = overview(db)
        .trace_event(event_id)
        .await
        .context("cannot trace the re-emitted event")?;
    Ok(trace
        .inbox
        .iter()
        .any(|i| i.consumer_name == consumer && i.outcome == "stale"))
}

/// Conflicts of `event_id` recorded by `consumer` in `db`.
async fn conflicts_of(db: &PgPool, event_id: outbox::EventId, consumer: &str) -> Result<i64> {
    let list = overview(db)
        .conflicts(ConflictFilter::of(event_id), 100)
        .await
        .context("cannot list the inbox conflicts")?;
    Ok(list.iter().filter(|c| c.consumer_name == consumer).count() as i64)
}

impl Snapshot {
    /// Reads the three databases. `full`: also every won bet and posted payout, and the
    /// business-key probe (for the table); otherwise counts only (for the drain's progress).
    ///
    /// # Errors
    /// A database cannot be read.
    pub async fn take(
        bets: &PgPool,
        history: &PgPool,
        ledger: &PgPool,
        injected: Option<&Injected>,
        full: bool,
    ) -> Result<Self> {
        let (n_bets, bets_won, bets_lost, won_payouts): (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE status = 'won'), \
             count(*) FILTER (WHERE status = 'lost'), \
             coalesce(sum(payout) FILTER (WHERE status = 'won'), 0)::bigint FROM bets",
        )
        .fetch_one(bets)
        .await?;
        let (history_rows, history_settled, history_wrong_events): (i64, i64, i64) =
            sqlx::query_as(
                "SELECT count(*), count(*) FILTER (WHERE state <> 'accepted'), \
                 count(*) FILTER (WHERE events <> CASE state WHEN 'accepted' THEN 1 ELSE 2 END) \
                 FROM bet_history",
            )
            .fetch_one(history)
            .await?;
        let totals_wrong: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM player_totals t FULL JOIN ( \
                 SELECT player, count(*) AS bets, sum(stake) AS staked, \
                        count(*) FILTER (WHERE state = 'won') AS won, sum(payout) AS paid_out \
                 FROM bet_history GROUP BY player) h USING (player) \
             WHERE t.bets IS DISTINCT FROM h.bets OR t.staked IS DISTINCT FROM h.staked \
                OR t.won IS DISTINCT FROM h.won OR t.paid_out IS DISTINCT FROM h.paid_out",
        )
        .fetch_one(history)
        .await?;
        let ledger_numbers = Ledger::read(ledger).await?;
        let (mut won, mut payouts) = (HashMap::new(), HashMap::new());
        if full {
            let rows: Vec<(String, i64, i32)> =
                sqlx::query_as("SELECT id, stake, odds_x100 FROM bets WHERE status = 'won'")
                    .fetch_all(bets)
                    .await?;
            won = rows
                .into_iter()
                .map(|(id, stake, odds)| (id, (stake, i64::from(odds))))
                .collect();
            payouts = sqlx::query_as("SELECT bet_id, amount FROM ledger_postings")
                .fetch_all(ledger)
                .await?
                .into_iter()
                .collect();
        }
        let (conflict_at_payouts, conflict_at_history) = match injected {
            Some(i) => (
                conflicts_of(ledger, i.event_id, PAYOUTS_CONSUMER).await?,
                conflicts_of(history, i.event_id, HISTORY_CONSUMER).await?,
            ),
            None => (0, 0),
        };
        let (reemitted_refused_by_key, reemitted_dead_at_history) = match injected {
            Some(i) => (
                dead_letters_of(
                    ledger,
                    i.reemitted_event_id,
                    PAYOUTS_CONSUMER,
                    &format!("already holds the posting `{}`", payout_key(&i.bet_id)),
                )
                .await?,
                dead_letters_of(history, i.reemitted_event_id, HISTORY_CONSUMER, "").await?,
            ),
            None => (0, 0),
        };
        let reemitted_stale_at_history = match injected {
            Some(i) => absorbed_as_stale(history, i.reemitted_event_id, HISTORY_CONSUMER).await?,
            None => false,
        };
        Ok(Self {
            bets: n_bets,
            bets_won,
            bets_lost,
            won_payouts,
            won,
            history_rows,
            history_settled,
            history_wrong_events,
            totals_wrong,
            ledger: ledger_numbers,
            payouts,
            bets_db: overview(bets).overview().await?,
            history_db: overview(history).overview().await?,
            ledger_db: overview(ledger).overview().await?,
            conflict_at_payouts,
            conflict_at_history,
            reemitted_refused_by_key,
            reemitted_dead_at_history,
            reemitted_stale_at_history,
        })
    }

    /// What is still in flight, one phrase each; empty when everything drained.
    pub fn pending(&self, injected: Option<&Injected>) -> Vec<String> {
        let mut out = Vec::new();
        if self.bets_db.pending > 0 {
            out.push(format!(
                "{} outbox rows not yet published",
                self.bets_db.pending
            ));
        }
        if self.history_rows < self.bets {
            out.push(format!(
                "history has {} of {} bets",
                self.history_rows, self.bets
            ));
        }
        let settled = self.bets_won + self.bets_lost;
        if self.history_settled < settled {
            out.push(format!(
                "history has {} of {} settlements",
                self.history_settled, settled
            ));
        }
        if self.ledger.bets_paid < self.bets_won {
            out.push(format!(
                "ledger has {} of {} payouts",
                self.ledger.bets_paid, self.bets_won
            ));
        }
        if injected.is_some() && self.conflict_at_payouts < 1 {
            out.push("the re-sent event has not reached the payout consumer".into());
        }
        if injected.is_some() && self.conflict_at_history < 1 {
            out.push("the re-sent event has not reached the history projection".into());
        }
        if injected.is_some() && self.reemitted_refused_by_key < 1 {
            out.push("the re-emitted event has not been refused by the ledger yet".into());
        }
        if injected.is_some() && !self.reemitted_stale_at_history {
            out.push("the re-emitted event has not reached the history projection".into());
        }
        out
    }
}

/// The checks of the table of the story's end state, in order (the run adds those of the
/// load's requests and of the kills).
pub fn checks(s: &Snapshot, load: &LoadReport, injected: &Injected) -> Vec<Check> {
    let mut all = bets_and_history(s, load);
    all.extend(ledger_checks(s));
    all.extend(resent_and_left(s, injected));
    all
}

/// The bets and the history projection against the load's answers.
fn bets_and_history(s: &Snapshot, load: &LoadReport) -> Vec<Check> {
    vec![
        eq(
            "bets accepted (bets DB) = accepted answers",
            load.placed.len() as i64,
            s.bets,
        ),
        eq(
            "bets settled won (bets DB) = won answers",
            load.won.len() as i64,
            s.bets_won,
        ),
        eq(
            "bets settled lost (bets DB) = lost answers",
            load.lost.len() as i64,
            s.bets_lost,
        ),
        eq(
            "history rows (history DB) = bets accepted",
            s.bets,
            s.history_rows,
        ),
        eq(
            "history rows settled (history DB) = bets settled",
            s.bets_won + s.bets_lost,
            s.history_settled,
        ),
        eq(
            "history rows with an event applied twice or missing",
            0,
            s.history_wrong_events,
        ),
        eq(
            "players whose totals disagree with their bets",
            0,
            s.totals_wrong,
        ),
    ]
}

/// The ledger: one balanced posting per won bet, of the right amount.
fn ledger_checks(s: &Snapshot) -> Vec<Check> {
    let l = &s.ledger;
    let matching = s
        .won
        .iter()
        .filter(|(id, (stake, odds))| s.payouts.get(*id) == Some(&payout_of(*stake, *odds)))
        .count() as i64;
    vec![
        eq(
            "ledger payouts (distinct bet ids) = bets won",
            s.bets_won,
            l.bets_paid,
        ),
        eq(
            "ledger postings (one per business key)",
            s.bets_won,
            l.postings,
        ),
        eq(
            "bets paid more than once (per business key)",
            0,
            l.bets_paid_twice,
        ),
        eq(
            "postings without one debit and one credit",
            0,
            l.unbalanced_postings,
        ),
        eq(
            "ledger: sum of debits - sum of credits",
            0,
            l.debits - l.credits,
        ),
        eq(
            "ledger: house balance + player balances",
            0,
            l.house + l.players,
        ),
        eq(
            "ledger: house balance = -(won payouts, bets DB)",
            -s.won_payouts,
            l.house,
        ),
        eq(
            "payouts equal to stake * odds of the accepted bet",
            s.bets_won,
            matching,
        ),
    ]
}

/// The re-sent and re-emitted events, and what is left in the outboxes and dead letters.
fn resent_and_left(s: &Snapshot, injected: &Injected) -> Vec<Check> {
    let resent_payout = s.payouts.get(&injected.bet_id).copied().unwrap_or(0);
    let conflicts_total = s.ledger_db.inbox_conflicts + s.history_db.inbox_conflicts;
    vec![
        eq(
            "re-sent event: conflict recorded at payouts (ledger DB)",
            1,
            s.conflict_at_payouts,
        ),
        eq(
            "re-sent event: conflict recorded at history (history DB)",
            1,
            s.conflict_at_history,
        ),
        eq(
            "inbox conflicts of any other event",
            0,
            conflicts_total - s.conflict_at_payouts - s.conflict_at_history,
        ),
        eq(
            "re-sent bet's payout in the ledger (original amount)",
            injected.original_payout,
            resent_payout,
        ),
        // At least once: a payout consumer killed between the dead letter's commit and the
        // broker's ack records it again on redelivery (still never a second payout).
        eq(
            "re-emitted settlement (new event id): refused by the ledger's business key",
            1,
            s.reemitted_refused_by_key.min(1),
        ),
        eq(
            "re-emitted settlement: absorbed at history as an old version",
            1,
            i64::from(s.reemitted_stale_at_history),
        ),
        eq(
            "re-emitted settlement: dead letters at history",
            0,
            s.reemitted_dead_at_history,
        ),
        eq("outbox pending (bets DB)", 0, s.bets_db.pending),
        eq("outbox dead letters (bets DB)", 0, s.bets_db.dead_letters),
        eq(
            "consumer dead letters of any other event (history + ledger DB)",
            0,
            s.history_db.consumer_dead_letters + s.ledger_db.consumer_dead_letters
                - s.reemitted_refused_by_key,
        ),
    ]
}
