-- outbox schema, version 9: the running processes as the operator sees them. `{{schema}}` is
-- the configured schema name.
--
-- Each relay, consumer or executor process that runs a heartbeat (`outbox relay` and `outbox
-- effects run` do; a service embedding a consumer starts one, see
-- `outbox_postgres::heartbeat`) upserts its row every interval: up, late or gone is read from
-- the age of `heartbeat_at` against the interval it announced. A clean stop sets `stopped_at`.
-- Rows whose heartbeat is a day old are deleted by the heartbeats of the others.
CREATE TABLE {{schema}}.instances (
    instance_id  uuid        PRIMARY KEY,
    kind         text        NOT NULL CHECK (kind IN ('relay', 'consumer', 'executor')),
    -- The relay's name, the consumer's name, the executor's work-item kind.
    name         text        NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    version      text        NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    interval_ms  integer     NOT NULL CHECK (interval_ms > 0),
    -- The process's own numbers (published, lag, ...), as it reports them.
    stats        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    stopped_at   timestamptz
);

-- Work done per minute, per route (a relay's publishes: `kind = 'publish'`, `name` is
-- `destination:` and the row's destination, or `type:` and its aggregate type when it has
-- none), summed over every process that reported it: the console's publish rates. Written by heartbeats (one upsert per route
-- and beat); rows older than two hours are deleted by them.
CREATE TABLE {{schema}}.activity (
    minute timestamptz NOT NULL,
    kind   text        NOT NULL,
    name   text        NOT NULL,
    count  bigint      NOT NULL,
    PRIMARY KEY (minute, kind, name)
);
