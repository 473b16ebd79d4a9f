-- outbox schema, version 1. `{{schema}}` is replaced by the configured, validated schema name.
-- This layout is a public contract: services in any language may INSERT into {{schema}}.events
-- inside their own transactions (see the README, "Plain-SQL producers").

CREATE SEQUENCE {{schema}}.lease_token_seq;

CREATE TABLE {{schema}}.events (
    -- Storage handle only. Never an ordering promise: order is aggregate_version per aggregate.
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Producer-chosen identity, carried unchanged by every publish.
    event_id          uuid        NOT NULL,
    aggregate_type    text        NOT NULL CHECK (length(aggregate_type) BETWEEN 1 AND 255),
    aggregate_id      text        NOT NULL CHECK (length(aggregate_id) BETWEEN 1 AND 255),
    aggregate_version bigint      NOT NULL CHECK (aggregate_version >= 1),
    event_type        text        NOT NULL CHECK (length(event_type) BETWEEN 1 AND 255),
    schema_version    integer     NOT NULL DEFAULT 1 CHECK (schema_version >= 1),
    content_type      text        NOT NULL DEFAULT 'application/json',
    payload           bytea       NOT NULL,
    -- Fingerprint of the exact payload bytes, computed by the database for every producer.
    payload_sha256    bytea       GENERATED ALWAYS AS (sha256(payload)) STORED,
    headers           jsonb       NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(headers) = 'object'),
    destination       text,
    partition_key     text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    -- Delivery state, owned by the relay.
    state             text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'published', 'dead')),
    attempts          integer     NOT NULL DEFAULT 0,
    available_at      timestamptz NOT NULL DEFAULT now(),
    last_error        text,
    published_at      timestamptz,
    CONSTRAINT events_event_id_key UNIQUE (event_id),
    CONSTRAINT events_aggregate_version_key UNIQUE (aggregate_type, aggregate_id, aggregate_version)
);

-- No separate "pending" index: in the default delete mode every row is pending or dead, so the
-- claim walks the primary key; each extra index is paid on every producer insert (W1).

-- Relay leases, one row per aggregate under a claim. An aggregate is owned by at most one live
-- lease; every settle write joins on (aggregate, token), so a relay whose lease was taken over
-- changes nothing. Rows are deleted when a claim is settled; expired ones are taken over in
-- place or swept.
CREATE TABLE {{schema}}.leases (
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    token          bigint      NOT NULL,
    lease_until    timestamptz NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);
CREATE INDEX leases_token_idx ON {{schema}}.leases (token);

-- Atomic per-aggregate version allocation (next_aggregate_version). The row lock taken by the
-- allocation is held until the producer's transaction ends, so versions of one aggregate commit
-- in order.
CREATE TABLE {{schema}}.aggregate_versions (
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    last_version   bigint NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- Request idempotency for commands (CreatePayment with an idempotency key).
CREATE TABLE {{schema}}.idempotency_keys (
    scope          text        NOT NULL,
    key            text        NOT NULL,
    request_sha256 bytea       NOT NULL,
    response       jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    completed_at   timestamptz,
    PRIMARY KEY (scope, key)
);
