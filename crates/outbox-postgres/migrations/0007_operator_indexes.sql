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
-- that time (about 2 s per 10 million rows on a two-core machine); run this migration when a
-- pause of that length is acceptable.
CREATE INDEX IF NOT EXISTS events_dead_idx ON {{schema}}.events (id) WHERE state = 'dead';
CREATE INDEX IF NOT EXISTS events_retrying_idx ON {{schema}}.events (id)
    WHERE state = 'pending' AND attempts > 0;
