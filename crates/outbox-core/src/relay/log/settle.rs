//! What a settlement and the table's answers do to a [`LogScheduler`].

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use tracing::info;

use super::{Aggregate, BEHIND_PATIENCE, BEHIND_RECHECK, Late, Leave, LogBatch, LogRow};
use super::{LogScheduler, Map, Set, Waiting};
use crate::relay::{SettleReport, Settlement};

/// What [`LogScheduler::hold_behind`] decided for a batch's events.
#[derive(Debug)]
pub enum Behind<R> {
    /// Hand these out now (aggregates behind the table held back or parked).
    Go(Vec<Waiting<R>>),
    /// This aggregate has waited longer than [`BEHIND_PATIENCE`] for an older version pending
    /// in the table: the feed ends the session, and the next one's catch-up publishes the
    /// table's rows first.
    Restart(Aggregate),
}

impl<R: LogRow> LogScheduler<R> {
    /// The heads among `taken` of aggregates not checked against the table in this session,
    /// with their versions: the feed asks the table which of them have an older version
    /// pending or dead there, then calls [`LogScheduler::hold_behind`].
    pub fn unverified_heads(&self, taken: &[Waiting<R>]) -> Vec<(Aggregate, i64)> {
        // Each aggregate looked at once, by its borrowed key (a batch holds up to a thousand
        // rows of a few hundred aggregates: no owned key per row, no scan of the heads).
        let mut seen: Set<(&str, &str)> = Set::default();
        let mut heads: Vec<(Aggregate, i64)> = Vec::new();
        for w in taken {
            if !seen.insert(w.row.key()) {
                continue;
            }
            let aggregate = w.row.aggregate();
            if !self.verified.contains(&aggregate) {
                heads.push((aggregate, w.row.version()));
            }
        }
        heads
    }

    /// Sorts out `taken` by the table's answer for `heads`: `behind` holds the aggregates with
    /// an older version pending or dead in the table, each with whether it is *blocked* (the
    /// older row is dead, or on a paused route: only a requeue or a resume moves it). A
    /// blocked aggregate is parked; one that waits for another relay to publish the older rows
    /// is held, and looked at again every [`BEHIND_RECHECK`], for up to [`BEHIND_PATIENCE`];
    /// the others are verified for the rest of the session.
    pub fn hold_behind(
        &mut self,
        heads: Vec<(Aggregate, i64)>,
        mut taken: Vec<Waiting<R>>,
        behind: &HashMap<Aggregate, bool>,
    ) -> Behind<R> {
        for (aggregate, _) in heads {
            let Some(&blocked) = behind.get(&aggregate) else {
                self.behind.remove(&aggregate);
                self.verified.insert(aggregate);
                continue;
            };
            let (out, kept): (Vec<Waiting<R>>, Vec<Waiting<R>>) =
                taken.into_iter().partition(|w| w.row.is_of(&aggregate));
            taken = kept;
            if blocked {
                // Behind a dead letter or a paused route's row: its events wait in the table
                // until a requeue or a resume starts a new catch-up.
                info!(
                    aggregate_type = %aggregate.0,
                    aggregate_id = %aggregate.1,
                    "an older version of this aggregate is a dead letter or on a paused route: \
                     its events wait in the table for a requeue or a resume"
                );
                self.behind.remove(&aggregate);
                self.park(&aggregate, out);
                continue;
            }
            let since = *self
                .behind
                .entry(aggregate.clone())
                .or_insert_with(Instant::now);
            if since.elapsed() < BEHIND_PATIENCE {
                // Most likely a polling relay is publishing the older rows right now (a switch
                // of modes): wait for it, and look at the table again.
                let due = Instant::now() + BEHIND_RECHECK;
                let events = out
                    .into_iter()
                    .map(|w| Waiting {
                        due: Some(due),
                        ..w
                    })
                    .collect();
                self.busy.remove(&aggregate);
                self.put_back(&aggregate, events);
                continue;
            }
            info!(
                aggregate_type = %aggregate.0,
                aggregate_id = %aggregate.1,
                "an older version of this aggregate has been pending in the table for {:?}: \
                 the stream starts again and its catch-up publishes the table's rows first",
                BEHIND_PATIENCE
            );
            return Behind::Restart(aggregate);
        }
        Behind::Go(taken)
    }

    /// Applies `settlement` of `batch`, whose published rows the store has deleted (or
    /// marked) but those in `late` (their transactions not visible yet: settled by a later
    /// snapshot, [`LogScheduler::late_rows`]). A retry goes back to the head of its aggregate
    /// with its due time; a dead letter is left to the table with its error and parks its
    /// aggregate (its not-attempted events with it); a not-attempted event goes back, due at
    /// once. A batch of an older session changes nothing: its rows come again from the log.
    ///
    /// The store then records what is left to the table ([`LogScheduler::restore_list`])
    /// before those events count as settled.
    pub fn settle_batch(
        &mut self,
        batch: &LogBatch<R>,
        settlement: &Settlement,
        late: &HashSet<i64>,
    ) -> SettleReport {
        let mut report = SettleReport::default();
        if batch.session != self.session {
            // The stream was started again since: these rows come again from the log (no
            // other relay owns them, so not "lease lost").
            report.released = batch.rows.len();
            return report;
        }
        let by_id: Map<i64, &R> = batch.events.iter().map(|r| (r.id(), r)).collect();
        let of: Map<i64, (u64, u64)> = batch
            .rows
            .iter()
            .map(|&(id, tx, source_tx)| (id, (tx, source_tx)))
            .collect();
        let mut settled_per_tx: Map<u64, usize> = Map::default();
        for id in &settlement.published {
            if let Some(&(tx, source_tx)) = of.get(id) {
                if late.contains(id) {
                    // Its row is settled once a snapshot sees its transaction.
                    self.late.push(Late {
                        id: *id,
                        tx,
                        source_tx,
                    });
                    continue;
                }
                *settled_per_tx.entry(tx).or_default() += 1;
            }
        }
        report.marked = settlement.published.len();
        let waiting = |id: i64, row: R, due| {
            of.get(&id).map(|&(tx, source_tx)| Waiting {
                row,
                tx,
                source_tx,
                due,
            })
        };
        // Per aggregate, what goes back to the head of its queue, in version order.
        let mut back: Map<Aggregate, Vec<Waiting<R>>> = Map::default();
        // Aggregates with a dead letter in this batch.
        let mut dead: Set<Aggregate> = Set::default();
        for failed in &settlement.failed {
            let Some(&row) = by_id.get(&failed.id) else {
                continue;
            };
            let due = failed.retry_after.map(|delay| Instant::now() + delay);
            let Some(event) = waiting(failed.id, row.attempted(), due) else {
                continue;
            };
            let aggregate = row.aggregate();
            if failed.retry_after.is_some() {
                report.retried += 1;
                back.entry(aggregate).or_default().push(event);
            } else {
                // Recorded in the table (by the store) before it counts as settled.
                report.dead_lettered += 1;
                self.restore.push(Leave {
                    event,
                    dead: Some(failed.error.clone()),
                });
                dead.insert(aggregate);
            }
        }
        let mut behind_dead: Vec<Waiting<R>> = Vec::new();
        for id in &settlement.not_attempted {
            let Some(&row) = by_id.get(id) else {
                continue;
            };
            let Some(event) = waiting(*id, row.clone(), None) else {
                continue;
            };
            let aggregate = row.aggregate();
            if dead.contains(&aggregate) {
                // Behind a dead letter: left pending in the table.
                behind_dead.push(event);
                continue;
            }
            report.released += 1;
            back.entry(aggregate).or_default().push(event);
        }
        for (tx, n) in settled_per_tx {
            self.settled(tx, n);
        }
        for aggregate in &dead {
            // Everything of it still waiting is left to the table too.
            self.park(aggregate, Vec::new());
        }
        self.leave_to_table(behind_dead);
        for (aggregate, mut events) in back {
            events.sort_by_key(|w| w.row.version());
            self.put_back(&aggregate, events);
        }
        let keys: Set<(&str, &str)> = batch.events.iter().map(LogRow::key).collect();
        self.busy
            .retain(|(t, i)| !keys.contains(&(t.as_str(), i.as_str())));
        report
    }
}
