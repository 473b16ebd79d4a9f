-- outbox schema, version 11: an operator's resolution of an inbox conflict. `{{schema}}` is
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
