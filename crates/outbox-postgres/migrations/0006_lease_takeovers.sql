-- outbox schema, version 6: poison rows. `{{schema}}` is the configured schema name.
--
-- A relay lease remembers its aggregate's head row when it was taken (`head_id`) and how many
-- times in a row it was taken over, unsettled, with that same head (`takeovers`). A settled
-- claim deletes its leases, so the count only grows while every relay holding the aggregate
-- ends without settling it (crashed, froze, lost the database). The relay dead-letters such
-- a head after `relay.poison_after_takeovers` takeovers. Both columns are written only when a
-- lease is created or taken over, never on the hot path of a settled claim.
ALTER TABLE {{schema}}.leases
    ADD COLUMN head_id   bigint,
    ADD COLUMN takeovers integer NOT NULL DEFAULT 0;
