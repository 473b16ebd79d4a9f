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
//!
//! Each is migrated with the toolkit's migrations (library API) first, then the service's own
//! tables, whose statements are in `examples/igaming/sql/` (`ServiceDatabase::migrate`).

use anyhow::Result;
use sqlx::PgPool;
use support::database::ServiceDatabase;

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
pub const BETS: ServiceDatabase = ServiceDatabase {
    name: "bets",
    tables: &[("bets", include_str!("../sql/bets.sql"))],
};

/// The history database.
pub const HISTORY: ServiceDatabase = ServiceDatabase {
    name: "history",
    tables: &[
        ("bet_history", include_str!("../sql/bet_history.sql")),
        ("player_totals", include_str!("../sql/player_totals.sql")),
    ],
};

/// The ledger database. The business key is the posting's identity: a second posting of one
/// bet's payout is refused here, whatever event (or event id) carried it.
pub const LEDGER: ServiceDatabase = ServiceDatabase {
    name: "ledger",
    tables: &[
        (
            "ledger_postings",
            include_str!("../sql/ledger_postings.sql"),
        ),
        ("ledger_entries", include_str!("../sql/ledger_entries.sql")),
    ],
};

/// The three databases, in the order of `Common`'s URLs (bets, history, ledger).
pub const ALL: [ServiceDatabase; 3] = [BETS, HISTORY, LEDGER];

/// Migrates the three databases of `common`.
///
/// # Errors
/// Any database error.
pub async fn migrate_all(common: &Common) -> Result<()> {
    let urls = [&common.bets_url, &common.history_url, &common.ledger_url];
    for (db, url) in ALL.iter().zip(urls) {
        db.migrate(&connect(url, 2).await?).await?;
    }
    Ok(())
}

/// A pool of at most `max` connections to `db` at `url`, refusing a database that
/// `igaming migrate` (or `run`) did not prepare.
///
/// # Errors
/// The database is unreachable, or the toolkit's schema or the service's table is missing.
pub async fn open(db: &ServiceDatabase, url: &str, max: u32) -> Result<PgPool> {
    db.open(url, max, "igaming migrate").await
}
