-- outbox schema, version 7: the operator's reads at any backlog size. `{{schema}}` is the
-- configured schema name.
--
-- Dead letters and rows that failed at least once are few, but without an index of their own
-- the dead-letter list and the console's counts walked every pending row to find them: 1.0 s
-- for the list and 2.0 s for the overview at 10 million pending rows. These partial indexes
-- hold only such rows. A producer's insert (pending, no attempt yet) matches neither predicate
-- and writes no entry; a relay adds one only when a publish fails or a row is dead-lettered.
--
-- Building them reads the events table once, under a lock that holds back writes to it for
-- that time (3.3 s for this migration at 10 million rows on a two-core machine); run it when a
-- pause of that length is acceptable. The lock is waited for at most 5 s: behind a long write
-- transaction the migration fails (retry it later) instead of queueing every producer behind
-- it for as long as that transaction lasts.
SET LOCAL lock_timeout = '5s';
CREATE INDEX IF NOT EXISTS events_dead_idx ON {{schema}}.events (id) WHERE state = 'dead';
CREATE INDEX IF NOT EXISTS events_retrying_idx ON {{schema}}.events (id)
    WHERE state = 'pending' AND attempts > 0;
