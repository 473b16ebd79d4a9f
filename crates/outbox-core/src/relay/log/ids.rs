//! [`IdSet`]: row ids kept as ranges.

/// Ids of the rows a log feed's catch-up published or dead-lettered: the stream skips them
/// (they were committed before the catch-up's end, so the log may bring them again). Kept as
/// ranges: a backlog's ids are mostly contiguous.
#[derive(Debug, Default)]
pub(super) struct IdSet {
    /// Disjoint, sorted, inclusive.
    ranges: Vec<(i64, i64)>,
    /// Added since the last [`IdSet::compact`].
    recent: Vec<i64>,
}

impl IdSet {
    pub(super) fn insert(&mut self, id: i64) {
        self.recent.push(id);
        if self.recent.len() >= 65_536 {
            self.compact();
        }
    }

    pub(super) fn contains(&self, id: i64) -> bool {
        let i = self.ranges.partition_point(|r| r.1 < id);
        self.ranges.get(i).is_some_and(|r| r.0 <= id) || self.recent.contains(&id)
    }

    /// Merges the recent ids into the ranges.
    pub(super) fn compact(&mut self) {
        if self.recent.is_empty() {
            return;
        }
        let mut all: Vec<(i64, i64)> = std::mem::take(&mut self.ranges);
        all.extend(self.recent.drain(..).map(|id| (id, id)));
        all.sort_unstable();
        for (start, end) in all {
            match self.ranges.last_mut() {
                Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
                _ => self.ranges.push((start, end)),
            }
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.recent.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::IdSet;

    #[test]
    fn ids_are_found_before_and_after_they_are_merged_into_ranges() {
        let mut set = IdSet::default();
        assert!(set.is_empty());
        for id in [5, 3, 4, 10, 12] {
            set.insert(id);
        }
        assert!(set.contains(4) && set.contains(12) && !set.contains(11));
        set.compact();
        assert_eq!(set.ranges, vec![(3, 5), (10, 10), (12, 12)]);
        assert!(set.contains(3) && set.contains(5) && set.contains(10));
        assert!(!set.contains(2) && !set.contains(6) && !set.contains(11) && !set.contains(13));
        set.insert(11);
        set.compact();
        assert_eq!(set.ranges, vec![(3, 5), (10, 12)]);
    }
}
