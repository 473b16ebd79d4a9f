-- outbox schema, version 13: leases tied to their holder's database session (G12). `{{schema}}`
-- is the configured schema name.
--
-- A relay running with a live session (`outbox_postgres::session`) takes a number from
-- `lease_owner_seq` (its owner), holds the advisory lock (class, owner) in shared mode on a
-- dedicated connection for as long as it runs, and registers the owner here. Each lease its
-- claims write names the owner. Every relay's session looks, several times a second, for owners
-- whose lock nobody holds any more (the session ended: the process died, its connection was cut
-- or terminated): it deletes such an owner's row and expires its live leases at once, so the
-- next claim takes them over, as it would after the lease's clock ran out.
CREATE SEQUENCE {{schema}}.lease_owner_seq AS integer MINVALUE 1 CYCLE;

CREATE TABLE {{schema}}.lease_owners (
    owner      integer     PRIMARY KEY,
    -- The backend of the owner's session (for an operator: `pg_stat_activity`).
    pid        integer     NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now()
);

-- `owner`: the lease_owners number of the claim's relay (NULL: a relay without a live session,
-- whose leases end by the clock only). `orphaned_at`: when a sweep found the owner gone and
-- expired the lease. `takeover_ms`: written by a takeover, how long the lease had been without a
-- live owner (since `orphaned_at`, or since it ran out), for the takeover metric.
ALTER TABLE {{schema}}.leases
    ADD COLUMN owner       integer,
    ADD COLUMN orphaned_at timestamptz,
    ADD COLUMN takeover_ms integer;
