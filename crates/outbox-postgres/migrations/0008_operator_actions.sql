-- outbox schema, version 8: the operator's actions on record. `{{schema}}` is the configured
-- schema name.
--
-- Every action of `outbox_postgres::admin::Admin` (the CLI's and the console's requeues,
-- discards and resolutions) writes one row here in the transaction that does it: the action
-- and its record commit together or not at all. Rows are never updated; deleting old ones is
-- the operator's own retention decision.
CREATE TABLE {{schema}}.audit (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    -- Who, as the tool knew them: the CLI's OS user (or --actor), the console's named operator.
    actor      text        NOT NULL CHECK (length(actor) BETWEEN 1 AND 255),
    -- Through what: 'cli', 'console', or a service's own name when it calls the admin module.
    via        text        NOT NULL CHECK (length(via) BETWEEN 1 AND 64),
    -- How the actor proved it (the console token's fingerprint), when the tool checked that.
    credential text,
    -- The database role that did it: what the grants allowed.
    db_role    text        NOT NULL DEFAULT current_user,
    action     text        NOT NULL CHECK (length(action) BETWEEN 1 AND 128),
    -- What it selected: ids, a filter, "all".
    selection  jsonb       NOT NULL,
    reason     text        NOT NULL DEFAULT '',
    -- Rows it changed.
    affected   bigint      NOT NULL
);

-- Outbox dead letters an operator discarded (never to be published), whole, with the audit
-- record of the discard: what was given up stays readable, and can be inserted again by hand
-- (and, should it die again, be discarded again: one row per discard).
CREATE TABLE {{schema}}.discarded_events (
    event_id          uuid        NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    event_type        text        NOT NULL,
    schema_version    integer     NOT NULL,
    content_type      text        NOT NULL,
    payload           bytea       NOT NULL,
    headers           jsonb       NOT NULL,
    destination       text,
    partition_key     text,
    created_at        timestamptz NOT NULL,
    attempts          integer     NOT NULL,
    last_error        text,
    discarded_at      timestamptz NOT NULL DEFAULT now(),
    audit_id          bigint      NOT NULL REFERENCES {{schema}}.audit (id),
    PRIMARY KEY (event_id, audit_id)
);
-- Tracing an aggregate.
CREATE INDEX discarded_events_aggregate_idx
    ON {{schema}}.discarded_events (aggregate_type, aggregate_id, aggregate_version);
-- Tracing an event to the records that name it (`selection -> 'event_ids' ? id`).
CREATE INDEX audit_event_ids_idx ON {{schema}}.audit USING gin ((selection -> 'event_ids'));

-- Tracing an event to the remote effects, conflicts and consumer dead letters it caused. Each
-- of these tables is written once per effect or failure, far less often than events are; the
-- indexes are paid there. Building them holds back writes to these tables only, for as long
-- as a read of each takes; the lock is waited for at most 5 s (then the migration fails:
-- retry it later).
SET LOCAL lock_timeout = '5s';
CREATE INDEX IF NOT EXISTS work_items_event_id_idx ON {{schema}}.work_items (event_id)
    WHERE event_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS inbox_conflicts_event_id_idx ON {{schema}}.inbox_conflicts (event_id);
CREATE INDEX IF NOT EXISTS consumer_dead_letters_event_id_idx
    ON {{schema}}.consumer_dead_letters (event_id) WHERE event_id IS NOT NULL;
