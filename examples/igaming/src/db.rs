//! The three databases, each owned by one service, and their tables.
//!
//! * **bets** (the bets service): `bets`, the aggregate, with its own `version` column, and the
//!   toolkit's schema `outbox` (the outbox and the request idempotency keys).
//! * **history** (the player-history projection): `bet_history`, one row per bet with its
//!   state, `player_totals`, one row per player, and the toolkit's schema for the inbox.
//! * **ledger** (the ledger's own database): `ledger_postings`, one posting per business key
//!   (`payout:<bet id>`, the **primary key**: the ledger's own dedup identity),
//!   `ledger_entries`, the two entries of each posting (debit the house, credit the player), and
//!   the toolkit's schema for the payout consumer's inbox.

use anyhow::Result;
use sqlx::PgPool;
pub use support::database::{connect, schema};

use crate::Common;

/// The house's ledger account: every payout is debited to it.
pub const HOUSE_ACCOUNT: &str = "house";

/// The ledger account of `player`.
pub fn player_account(player: &str) -> String {
    format!("player:{player}")
}

/// The bets database. `odds_x100` holds the decimal odds in hundredths (2.50 is 250); a won
/// bet pays `stake * odds_x100 / 100` minor units, rounded down.
///
/// # Errors
/// Any database error.
pub async fn migrate_bets(pool: &PgPool) -> Result<()> {
    support::database::migrate(
        pool,
        "bets",
        &["CREATE TABLE IF NOT EXISTS bets (
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
         )"],
    )
    .await
}

/// The history database.
///
/// # Errors
/// Any database error.
pub async fn migrate_history(pool: &PgPool) -> Result<()> {
    support::database::migrate(
        pool,
        "history",
        &[
            "CREATE TABLE IF NOT EXISTS bet_history (
                 bet_id     text        PRIMARY KEY,
                 player     text        NOT NULL,
                 market     text        NOT NULL,
                 stake      bigint      NOT NULL,
                 odds_x100  integer     NOT NULL,
                 state      text        NOT NULL,
                 payout     bigint      NOT NULL DEFAULT 0,
                 events     integer     NOT NULL,
                 updated_at timestamptz NOT NULL DEFAULT now()
             )",
            "CREATE TABLE IF NOT EXISTS player_totals (
                 player     text   PRIMARY KEY,
                 bets       bigint NOT NULL,
                 staked     bigint NOT NULL,
                 won        bigint NOT NULL,
                 paid_out   bigint NOT NULL
             )",
        ],
    )
    .await
}

/// The ledger database.
///
/// # Errors
/// Any database error.
pub async fn migrate_ledger(pool: &PgPool) -> Result<()> {
    support::database::migrate(
        pool,
        "ledger",
        &[
            // The business key is the posting's identity: a second posting of one bet's payout
            // is refused here, whatever event (or event id) carried it.
            "CREATE TABLE IF NOT EXISTS ledger_postings (
                 business_key text        PRIMARY KEY,
                 bet_id       text        NOT NULL,
                 amount       bigint      NOT NULL CHECK (amount > 0),
                 event_id     uuid        NOT NULL,
                 posted_at    timestamptz NOT NULL DEFAULT now()
             )",
            "CREATE TABLE IF NOT EXISTS ledger_entries (
                 id           bigserial   PRIMARY KEY,
                 business_key text        NOT NULL REFERENCES ledger_postings (business_key),
                 account      text        NOT NULL,
                 side         text        NOT NULL CHECK (side IN ('debit', 'credit')),
                 amount       bigint      NOT NULL CHECK (amount > 0),
                 UNIQUE (business_key, side)
             )",
        ],
    )
    .await
}

/// Migrates the three databases of `common`.
///
/// # Errors
/// Any database error.
pub async fn migrate_all(common: &Common) -> Result<()> {
    migrate_bets(&connect(&common.bets_url, 2).await?).await?;
    migrate_history(&connect(&common.history_url, 2).await?).await?;
    migrate_ledger(&connect(&common.ledger_url, 2).await?).await?;
    Ok(())
}

/// Refuses to start a process on a database that `igaming migrate` (or `run`) did not prepare.
///
/// # Errors
/// The toolkit's schema is missing or from another release, or `table` is missing.
pub async fn check(pool: &PgPool, table: &str) -> Result<()> {
    support::database::check(pool, table, "igaming migrate").await
}
