CREATE TABLE IF NOT EXISTS payments (
    id          text        PRIMARY KEY,
    account     text        NOT NULL,
    amount      bigint      NOT NULL CHECK (amount > 0),
    status      text        NOT NULL CHECK (status IN ('created', 'captured')),
    version     bigint      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    captured_at timestamptz
)
