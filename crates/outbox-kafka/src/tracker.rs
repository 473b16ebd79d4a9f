//! Which offsets of each assigned partition were delivered, which are done (their inbox
//! transaction committed), and so which offset may be committed: the bookkeeping behind
//! at-least-once offset commits, kept apart from librdkafka so it is tested on its own.
//!
//! The committable position of a partition is the lowest delivered offset not yet done, or,
//! when every delivered offset is done, one past the highest of them. It never passes an
//! offset that was delivered and not done, whatever order the acknowledgements come in, and
//! offsets that were never delivered (transaction markers, compacted records) do not hold it
//! back. A delivery that is to come again (a nack) stays not done, so it holds the position
//! until it is acknowledged.

use std::collections::{BTreeMap, HashMap};

/// A partition: topic and number.
pub(crate) type Tp = (String, i32);

#[derive(Debug, Default)]
struct Partition {
    /// Bumped by every assignment: a delivery from an earlier assignment no longer counts.
    generation: u64,
    /// Delivered offsets still tracked, and whether each is done.
    entries: BTreeMap<i64, bool>,
    /// One past the highest done offset that left `entries`.
    floor: Option<i64>,
    /// The position last committed by this source.
    committed: Option<i64>,
}

impl Partition {
    fn position(&self) -> Option<i64> {
        self.entries
            .iter()
            .find(|(_, done)| !**done)
            .map(|(offset, _)| *offset)
            .or_else(|| self.entries.keys().next_back().map(|o| o + 1))
            .or(self.floor)
    }

    /// Drops the done offsets at the front: they can no longer hold the position back.
    fn trim(&mut self) {
        while let Some(entry) = self.entries.first_entry() {
            if !*entry.get() {
                break;
            }
            let offset = *entry.key();
            entry.remove();
            self.floor = Some(offset + 1);
        }
    }
}

/// The bookkeeping of one source.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    partitions: HashMap<Tp, Partition>,
    next_generation: u64,
    closed: bool,
    /// The source paused its assigned partitions (too many deliveries held). Every assigned
    /// partition is paused while this is set, and none while it is not: a partition assigned
    /// meanwhile is paused or resumed to match.
    pub paused: bool,
}

/// What became of an acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Done {
    /// Recorded: the next commit covers it once every earlier delivery is done too.
    Recorded,
    /// The partition was revoked (or reassigned) since the delivery: its new owner reads it
    /// again from the last committed offset.
    Revoked,
    /// The source was closed.
    Closed,
}

impl Tracker {
    /// Deliveries handed out and not done yet (nacked ones waiting to come again included).
    pub fn held(&self) -> usize {
        self.partitions
            .values()
            .map(|p| p.entries.values().filter(|done| !**done).count())
            .sum()
    }

    /// The partitions in `tps` are now assigned to this source: each starts afresh.
    pub fn assign(&mut self, tps: impl IntoIterator<Item = Tp>) {
        for tp in tps {
            self.next_generation += 1;
            self.partitions.insert(
                tp,
                Partition {
                    generation: self.next_generation,
                    ..Partition::default()
                },
            );
        }
    }

    /// The partitions in `tps` are no longer assigned.
    pub fn revoke<'a>(&mut self, tps: impl IntoIterator<Item = &'a Tp>) {
        for tp in tps {
            self.partitions.remove(tp);
        }
    }

    /// Every partition is revoked and acknowledgements are refused from now on.
    pub fn close(&mut self) {
        self.closed = true;
        self.partitions.clear();
    }

    /// Whether [`Tracker::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// A message at `offset` of `tp` arrived from the broker. Returns the generation to
    /// deliver it with, or `None` when the partition is not assigned (any more).
    pub fn delivered(&mut self, tp: &Tp, offset: i64) -> Option<u64> {
        let p = self.partitions.get_mut(tp)?;
        // A redelivered offset keeps its state: done stays done (its transaction committed).
        p.entries.entry(offset).or_insert(false);
        Some(p.generation)
    }

    /// Whether a delivery of generation `generation` still belongs to an assigned partition
    /// (a redelivery from memory is dropped once its partition moved).
    pub fn is_current(&self, tp: &Tp, generation: u64) -> bool {
        !self.closed
            && self
                .partitions
                .get(tp)
                .is_some_and(|p| p.generation == generation)
    }

    /// The delivery of `offset` (generation `generation`) was applied.
    pub fn done(&mut self, tp: &Tp, generation: u64, offset: i64) -> Done {
        if self.closed {
            return Done::Closed;
        }
        let Some(p) = self
            .partitions
            .get_mut(tp)
            .filter(|p| p.generation == generation)
        else {
            return Done::Revoked;
        };
        if let Some(done) = p.entries.get_mut(&offset) {
            *done = true;
            p.trim();
        }
        Done::Recorded
    }

    /// The positions to commit: every partition whose committable position moved past what
    /// this source last committed.
    pub fn to_commit(&self) -> Vec<(Tp, i64)> {
        self.partitions
            .iter()
            .filter_map(|(tp, p)| {
                let position = p.position()?;
                (p.committed != Some(position)).then(|| (tp.clone(), position))
            })
            .collect()
    }

    /// The positions of the partitions in `tps` (for a commit before they are revoked).
    pub fn positions<'a>(&self, tps: impl IntoIterator<Item = &'a Tp>) -> Vec<(Tp, i64)> {
        tps.into_iter()
            .filter_map(|tp| {
                let p = self.partitions.get(tp)?;
                let position = p.position()?;
                (p.committed != Some(position)).then(|| (tp.clone(), position))
            })
            .collect()
    }

    /// `positions` were committed.
    pub fn committed(&mut self, positions: &[(Tp, i64)]) {
        for (tp, position) in positions {
            if let Some(p) = self.partitions.get_mut(tp) {
                p.committed = Some(*position);
            }
        }
    }

    /// The assigned partitions.
    pub fn assigned(&self) -> Vec<Tp> {
        self.partitions.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> Tp {
        ("t".to_owned(), 0)
    }

    fn tracker() -> (Tracker, u64) {
        let mut t = Tracker::default();
        t.assign([tp()]);
        let generation = t.delivered(&tp(), 10).unwrap();
        (t, generation)
    }

    #[test]
    fn the_position_never_passes_an_undone_delivery() {
        let (mut t, g) = tracker();
        for offset in 11..=13 {
            t.delivered(&tp(), offset);
        }
        assert_eq!(t.to_commit(), vec![(tp(), 10)]);
        // Acknowledged out of order: nothing moves until 10 is done.
        assert_eq!(t.done(&tp(), g, 12), Done::Recorded);
        assert_eq!(t.to_commit(), vec![(tp(), 10)]);
        t.done(&tp(), g, 10);
        assert_eq!(t.to_commit(), vec![(tp(), 11)]);
        t.committed(&[(tp(), 11)]);
        assert!(t.to_commit().is_empty());
        t.done(&tp(), g, 11);
        assert_eq!(t.to_commit(), vec![(tp(), 13)]);
        t.done(&tp(), g, 13);
        assert_eq!(t.to_commit(), vec![(tp(), 14)]);
    }

    #[test]
    fn gaps_in_offsets_do_not_hold_the_position_back() {
        let (mut t, g) = tracker();
        t.delivered(&tp(), 15); // 11..=14 were transaction markers or compacted away
        t.done(&tp(), g, 10);
        t.done(&tp(), g, 15);
        assert_eq!(t.to_commit(), vec![(tp(), 16)]);
    }

    #[test]
    fn a_revoked_or_reassigned_partition_refuses_old_acks() {
        let (mut t, g) = tracker();
        t.revoke([&tp()]);
        assert_eq!(t.done(&tp(), g, 10), Done::Revoked);
        t.assign([tp()]);
        assert_eq!(t.done(&tp(), g, 10), Done::Revoked);
        assert!(t.to_commit().is_empty());
        t.close();
        assert_eq!(t.done(&tp(), g, 10), Done::Closed);
    }

    #[test]
    fn a_delivery_to_come_again_holds_the_position_until_it_is_done() {
        let (mut t, g) = tracker();
        t.delivered(&tp(), 11);
        t.done(&tp(), g, 11);
        // 10 was nacked: it comes again from memory, 11 stays done.
        assert_eq!(t.to_commit(), vec![(tp(), 10)]);
        assert!(t.is_current(&tp(), g));
        assert_eq!(t.delivered(&tp(), 10), Some(g));
        t.done(&tp(), g, 10);
        assert_eq!(t.to_commit(), vec![(tp(), 12)]);
        t.revoke([&tp()]);
        assert!(!t.is_current(&tp(), g));
    }
}
