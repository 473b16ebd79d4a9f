CREATE TABLE IF NOT EXISTS ledger_postings (
    business_key text        PRIMARY KEY,
    bet_id       text        NOT NULL,
    amount       bigint      NOT NULL CHECK (amount > 0),
    event_id     uuid        NOT NULL,
    posted_at    timestamptz NOT NULL DEFAULT now()
)
