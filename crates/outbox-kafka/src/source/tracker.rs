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
//!
//! A delivery to come again is either held in the source's memory or, when the source is at
//! its limit of deliveries held, *spilled*: its message is let go of and read again from the
//! broker later (a seek back to it), so that waiting deliveries never fill the source's memory
//! and stop it from reading further (see [`crate::source`], "Flow control"). A message that
//! arrives again is handed out only when it was spilled: one held or done is not delivered
//! twice.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// A partition: topic and number.
pub(crate) type Tp = (String, i32);

/// Where a delivered offset stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Handed out, or in the source's memory waiting to come again.
    Held,
    /// Its inbox transaction committed.
    Done,
    /// To come again, read from the broker once `due`: the source let go of its message.
    Spilled { due: Instant },
}

#[derive(Debug, Default)]
struct Partition {
    /// Bumped by every assignment: a delivery from an earlier assignment no longer counts.
    generation: u64,
    /// Delivered offsets still tracked, and where each stands.
    entries: BTreeMap<i64, State>,
    /// One past the highest done offset that left `entries`.
    floor: Option<i64>,
    /// The position last committed by this source.
    committed: Option<i64>,
    /// A seek back for spilled offsets is under way: the partition is read again up to this
    /// offset (the highest delivered when it started).
    rereading: Option<i64>,
    /// How many entries are spilled.
    spilled: usize,
}

impl Partition {
    fn position(&self) -> Option<i64> {
        self.entries
            .iter()
            .find(|(_, state)| **state != State::Done)
            .map(|(offset, _)| *offset)
            .or_else(|| self.entries.keys().next_back().map(|o| o + 1))
            .or(self.floor)
    }

    /// Drops the done offsets at the front: they can no longer hold the position back.
    fn trim(&mut self) {
        while let Some(entry) = self.entries.first_entry() {
            if *entry.get() != State::Done {
                break;
            }
            let offset = *entry.key();
            entry.remove();
            self.floor = Some(offset + 1);
        }
    }

    fn count(&self, f: impl Fn(&State) -> bool) -> usize {
        self.entries.values().filter(|s| f(s)).count()
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

/// What to do with a message that arrived from the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// Hand it out, with this generation.
    Deliver(u64),
    /// Already held or done (read again after a seek back): not delivered twice.
    Skip,
    /// Its partition is not assigned (any more).
    Unknown,
}

impl Tracker {
    /// Deliveries handed out and not done yet, nacked ones waiting in memory included; spilled
    /// ones are not held.
    pub fn held(&self) -> usize {
        self.partitions
            .values()
            .map(|p| p.count(|s| *s == State::Held))
            .sum()
    }

    /// Deliveries spilled: to come again, read from the broker.
    pub fn spilled(&self) -> usize {
        self.partitions.values().map(|p| p.spilled).sum()
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

    /// A message at `offset` of `tp` arrived from the broker: whether to hand it out.
    pub fn arrived(&mut self, tp: &Tp, offset: i64) -> Arrival {
        let Some(p) = self.partitions.get_mut(tp) else {
            return Arrival::Unknown;
        };
        if p.rereading.is_some_and(|until| offset >= until) {
            p.rereading = None;
        }
        if p.floor.is_some_and(|floor| offset < floor) {
            return Arrival::Skip;
        }
        match p.entries.insert(offset, State::Held) {
            Some(state @ (State::Held | State::Done)) => {
                p.entries.insert(offset, state);
                Arrival::Skip
            }
            Some(State::Spilled { .. }) => {
                p.spilled -= 1;
                Arrival::Deliver(p.generation)
            }
            None => Arrival::Deliver(p.generation),
        }
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

    /// The delivery of `offset` (generation `generation`) is to come again once `due`, read
    /// from the broker: the source lets go of it. False when it no longer belongs to an
    /// assigned partition.
    pub fn spill(&mut self, tp: &Tp, generation: u64, offset: i64, due: Instant) -> bool {
        if self.closed {
            return false;
        }
        let Some(p) = self
            .partitions
            .get_mut(tp)
            .filter(|p| p.generation == generation)
        else {
            return false;
        };
        match p.entries.get_mut(&offset) {
            Some(state @ State::Held) => {
                *state = State::Spilled { due };
                p.spilled += 1;
                true
            }
            _ => false,
        }
    }

    /// The partitions to read again from an offset (a seek back), because a spilled delivery
    /// of theirs is due at `now`: each with the lowest due spilled offset. Each is marked as
    /// being read again until its highest delivered offset comes by, so it is not sought twice.
    pub fn rereads_due(&mut self, now: Instant) -> Vec<(Tp, i64)> {
        let mut due = Vec::new();
        for (tp, p) in &mut self.partitions {
            if p.rereading.is_some() || p.spilled == 0 {
                continue;
            }
            let lowest = p.entries.iter().find_map(|(offset, state)| match state {
                State::Spilled { due } if *due <= now => Some(*offset),
                _ => None,
            });
            if let Some(from) = lowest {
                p.rereading = p.entries.keys().next_back().copied();
                due.push((tp.clone(), from));
            }
        }
        due
    }

    /// The seek back of `tp` failed: it is tried again once `again` (its spilled deliveries
    /// come due then).
    pub fn reread_failed(&mut self, tp: &Tp, again: Instant) {
        if let Some(p) = self.partitions.get_mut(tp) {
            p.rereading = None;
            for state in p.entries.values_mut() {
                if let State::Spilled { due } = state {
                    *due = (*due).max(again);
                }
            }
        }
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
        if let Some(state) = p.entries.get_mut(&offset) {
            if matches!(state, State::Spilled { .. }) {
                p.spilled -= 1;
            }
            *state = State::Done;
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
        let Arrival::Deliver(generation) = t.arrived(&tp(), 10) else {
            panic!("an assigned partition")
        };
        (t, generation)
    }

    #[test]
    fn the_position_never_passes_an_undone_delivery() {
        let (mut t, g) = tracker();
        for offset in 11..=13 {
            t.arrived(&tp(), offset);
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
        t.arrived(&tp(), 15); // 11..=14 were transaction markers or compacted away
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
        t.arrived(&tp(), 11);
        t.done(&tp(), g, 11);
        // 10 was nacked: it comes again from memory, 11 stays done.
        assert_eq!(t.to_commit(), vec![(tp(), 10)]);
        assert!(t.is_current(&tp(), g));
        // Read again from the broker (a seek back), neither is handed out twice.
        assert_eq!(t.arrived(&tp(), 10), Arrival::Skip);
        assert_eq!(t.arrived(&tp(), 11), Arrival::Skip);
        t.done(&tp(), g, 10);
        assert_eq!(t.to_commit(), vec![(tp(), 12)]);
        t.revoke([&tp()]);
        assert!(!t.is_current(&tp(), g));
    }

    #[test]
    fn a_spilled_delivery_holds_the_position_and_is_read_again_once_due() {
        let (mut t, g) = tracker();
        for offset in 11..=13 {
            t.arrived(&tp(), offset);
        }
        assert_eq!(t.held(), 4);
        let now = Instant::now();
        let later = now + std::time::Duration::from_secs(1);
        // 10 and 12 wait for an earlier version elsewhere; the source lets go of them.
        assert!(t.spill(&tp(), g, 10, now));
        assert!(t.spill(&tp(), g, 12, later));
        assert!(!t.spill(&tp(), g, 12, later), "spilled once");
        assert!(!t.spill(&tp(), g + 1, 11, now), "another assignment's");
        assert_eq!((t.held(), t.spilled()), (2, 2));
        t.done(&tp(), g, 11);
        t.done(&tp(), g, 13);
        assert_eq!(t.to_commit(), vec![(tp(), 10)], "a spilled one is not done");
        // Due: read again from 10, up to 13, the highest delivered.
        assert_eq!(t.rereads_due(now), vec![(tp(), 10)]);
        assert!(t.rereads_due(later).is_empty(), "sought once");
        assert_eq!(t.arrived(&tp(), 10), Arrival::Deliver(g));
        assert_eq!(t.arrived(&tp(), 11), Arrival::Skip, "done");
        assert_eq!(t.arrived(&tp(), 12), Arrival::Deliver(g), "spilled, early");
        assert_eq!(t.arrived(&tp(), 13), Arrival::Skip, "done");
        assert_eq!(t.arrived(&tp(), 14), Arrival::Deliver(g), "new");
        assert_eq!((t.held(), t.spilled()), (3, 0));
        t.done(&tp(), g, 10);
        t.done(&tp(), g, 12);
        t.done(&tp(), g, 14);
        assert_eq!(t.to_commit(), vec![(tp(), 15)]);
        assert_eq!(t.arrived(&tp(), 12), Arrival::Skip, "below the floor");
    }

    #[test]
    fn a_failed_seek_back_is_tried_again_later() {
        let (mut t, g) = tracker();
        let now = Instant::now();
        assert!(t.spill(&tp(), g, 10, now));
        assert_eq!(t.rereads_due(now), vec![(tp(), 10)]);
        let again = now + std::time::Duration::from_secs(1);
        t.reread_failed(&tp(), again);
        assert!(t.rereads_due(now).is_empty());
        assert_eq!(t.rereads_due(again), vec![(tp(), 10)]);
        assert_eq!(t.arrived(&("u".to_owned(), 0), 1), Arrival::Unknown);
    }
}
