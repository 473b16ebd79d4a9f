CREATE TABLE IF NOT EXISTS player_totals (
    player     text   PRIMARY KEY,
    bets       bigint NOT NULL,
    staked     bigint NOT NULL,
    won        bigint NOT NULL,
    paid_out   bigint NOT NULL
)
