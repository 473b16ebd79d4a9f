CREATE TABLE IF NOT EXISTS bet_history (
    bet_id     text        PRIMARY KEY,
    player     text        NOT NULL,
    market     text        NOT NULL,
    stake      bigint      NOT NULL,
    odds_x100  integer     NOT NULL,
    state      text        NOT NULL,
    payout     bigint      NOT NULL DEFAULT 0,
    events     integer     NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)
