-- outbox schema, version 11: an operator's resolution of an inbox conflict, and the retention
-- mark that is the replay horizon of a time range. `{{schema}}` is
-- the configured schema name.
--
-- A conflict (the same event id arrived at a consumer with another payload) is never applied:
-- the consumer's effect is the first payload's. Resolving it records that an operator looked
-- at it and dealt with the cause (a producer fixed, a compensation booked by hand): it leaves
-- the list of open conflicts, with who, when and why in the audit record `resolved_audit_id`
-- (`Admin::resolve_conflicts`). The same conflicting payload arriving again reopens it (the
-- consumer's upsert clears both columns), so a resolution never hides a producer that goes on
-- sending it.
ALTER TABLE {{schema}}.inbox_conflicts
    ADD COLUMN resolved_at       timestamptz,
    ADD COLUMN resolved_audit_id bigint;

-- The open conflicts, newest first (the console's list and count).
CREATE INDEX inbox_conflicts_open_idx ON {{schema}}.inbox_conflicts (id)
    WHERE resolved_at IS NULL;

-- How far retention has deleted (the replay horizon of a time range): `published` is the
-- newest `created_at` among the published rows that `outbox cleanup --published-keep-secs`
-- deleted (mark mode). A row written after it is still held, so a replay of a time range that
-- starts after it replays everything published in the range (`Admin::replay_range`); one that
-- starts at or before it is refused. Raised by the purge's own statement, never lowered.
-- It starts at this migration's time: what was deleted before (an earlier purge, a relay in
-- delete mode) left no trace, so nothing older is vouched for.
CREATE TABLE {{schema}}.retention_marks (
    what    text        PRIMARY KEY CHECK (what IN ('published')),
    through timestamptz NOT NULL
);
INSERT INTO {{schema}}.retention_marks (what, through) VALUES ('published', now());
