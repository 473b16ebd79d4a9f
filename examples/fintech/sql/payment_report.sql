CREATE TABLE IF NOT EXISTS payment_report (
    payment_id  text        PRIMARY KEY,
    account     text        NOT NULL,
    amount      bigint      NOT NULL,
    status      text        NOT NULL,
    events      integer     NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
)
