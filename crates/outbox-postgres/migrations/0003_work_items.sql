-- outbox schema, version 3: remote effects. `{{schema}}` is the configured schema name.

-- One row per remote effect (an HTTP payout ...), written by a consumer in the same transaction
-- as its inbox row, then driven by an executor (`outbox_postgres::effects`):
--   pending -> in_progress -> succeeded | failed | pending (not sent) | unknown
--   unknown -> (lookup by idempotency key) -> succeeded | failed | pending (resend) | unknown
-- An 'in_progress' row whose lease expired goes to 'unknown', never back to 'pending': its
-- executor may have died after the provider acted.
CREATE TABLE {{schema}}.work_items (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind            text        NOT NULL CHECK (length(kind) BETWEEN 1 AND 255),
    -- Sent to the provider with every call and lookup; never regenerated.
    idempotency_key text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 1024),
    payload         jsonb       NOT NULL,
    -- Fingerprint of the canonical jsonb form: a second enqueue with the same key and a
    -- different payload is a conflict, with the same payload a no-op.
    payload_sha256  bytea       GENERATED ALWAYS AS (sha256(jsonb_send(payload))) STORED,
    event_id        uuid,
    consumer_name   text,
    state           text        NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'in_progress', 'succeeded', 'failed', 'unknown')),
    attempts        integer     NOT NULL DEFAULT 0,
    lookups         integer     NOT NULL DEFAULT 0,
    -- Fencing: every write of an executor names the token it claimed with.
    lease_token     bigint,
    lease_until     timestamptz,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    unknown_since   timestamptz,
    reference       text,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz,
    CONSTRAINT work_items_idempotency_key_key UNIQUE (idempotency_key)
);
-- Claims: due pending items (calls) and due unknown items (lookups) of one kind.
CREATE INDEX work_items_due_idx ON {{schema}}.work_items (kind, state, next_attempt_at)
    WHERE state IN ('pending', 'unknown');
-- Expired leases of one kind.
CREATE INDEX work_items_in_progress_idx ON {{schema}}.work_items (kind, lease_until)
    WHERE state = 'in_progress';
-- The reconciliation backlog and its oldest age.
CREATE INDEX work_items_unknown_idx ON {{schema}}.work_items (kind, unknown_since)
    WHERE state = 'unknown';
