CREATE TABLE IF NOT EXISTS bets (
    id          text        PRIMARY KEY,
    player      text        NOT NULL,
    market      text        NOT NULL,
    stake       bigint      NOT NULL CHECK (stake > 0),
    odds_x100   integer     NOT NULL CHECK (odds_x100 > 100),
    status      text        NOT NULL CHECK (status IN ('accepted', 'won', 'lost')),
    payout      bigint,
    version     bigint      NOT NULL,
    accepted_at timestamptz NOT NULL DEFAULT now(),
    settled_at  timestamptz
)
