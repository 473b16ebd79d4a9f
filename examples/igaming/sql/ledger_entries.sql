CREATE TABLE IF NOT EXISTS ledger_entries (
    id           bigserial   PRIMARY KEY,
    business_key text        NOT NULL REFERENCES ledger_postings (business_key),
    account      text        NOT NULL,
    side         text        NOT NULL CHECK (side IN ('debit', 'credit')),
    amount       bigint      NOT NULL CHECK (amount > 0),
    UNIQUE (business_key, side)
)
