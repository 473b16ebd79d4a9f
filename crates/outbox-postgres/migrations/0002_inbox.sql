-- outbox schema, version 2: the consumer side. `{{schema}}` is the configured schema name.

-- One row per (consumer, event): the dedup identity, with the payload fingerprint that tells a
-- redelivery (same fingerprint) from a conflicting reuse of the id (different fingerprint).
-- Written in the consumer's own transaction, together with the business effect.
CREATE TABLE {{schema}}.inbox (
    consumer_name     text        NOT NULL CHECK (length(consumer_name) BETWEEN 1 AND 255),
    event_id          uuid        NOT NULL,
    payload_sha256    bytea       NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    event_type        text        NOT NULL,
    -- 'applied': the effect ran; 'stale': absorbed by the ordering guard without effect.
    outcome           text        NOT NULL DEFAULT 'applied' CHECK (outcome IN ('applied', 'stale')),
    received_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, event_id)
);
-- Retention sweeps by age.
CREATE INDEX inbox_received_at_idx ON {{schema}}.inbox (received_at);

-- Same event id, different payload: recorded (never applied), counted, listed by the CLI.
CREATE TABLE {{schema}}.inbox_conflicts (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_name     text        NOT NULL,
    event_id          uuid        NOT NULL,
    stored_sha256     bytea       NOT NULL,
    received_sha256   bytea       NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    event_type        text        NOT NULL,
    payload           bytea       NOT NULL,
    occurrences       integer     NOT NULL DEFAULT 1,
    first_seen        timestamptz NOT NULL DEFAULT now(),
    last_seen         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT inbox_conflicts_key UNIQUE (consumer_name, event_id, received_sha256)
);

-- Ordering guard: the last applied version per (consumer, aggregate). Its row lock also
-- serialises two instances of one consumer working on the same aggregate.
CREATE TABLE {{schema}}.inbox_aggregates (
    consumer_name  text   NOT NULL,
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    last_version   bigint NOT NULL,
    PRIMARY KEY (consumer_name, aggregate_type, aggregate_id)
);

-- Deliveries a consumer could not apply: malformed messages, permanent handler errors, or too
-- many transient ones. Never counted as success; requeue hands them back to the consumer.
CREATE TABLE {{schema}}.consumer_dead_letters (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_name     text        NOT NULL,
    event_id          uuid,                        -- NULL when the message had no valid id
    aggregate_type    text,
    aggregate_id      text,
    aggregate_version bigint,
    event_type        text,
    content_type      text,
    payload           bytea       NOT NULL,
    headers           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    error             text        NOT NULL,
    attempts          integer     NOT NULL DEFAULT 1,
    state             text        NOT NULL DEFAULT 'dead' CHECK (state IN ('dead', 'requeued', 'resolved')),
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX consumer_dead_letters_open_idx ON {{schema}}.consumer_dead_letters (consumer_name, id)
    WHERE state <> 'resolved';
