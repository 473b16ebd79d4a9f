//! `igaming bets`: the bets HTTP API (axum) on the bets database.
//!
//! ```text
//! POST /bets               Idempotency-Key: K   {"player":"p-1","market":"m-1","stake":500,"odds":2.5}
//!      201 {"id","player","market","stake","odds":2.5,"status":"accepted","version":1}
//! POST /bets/{id}/settle   Idempotency-Key: K   {"outcome":"won"}  (or "lost")
//!      200 {"id",…,"status":"won","payout":1250,"version":2}
//!      404 no such bet, 409 already settled, 422 unknown outcome
//! GET  /bets/{id}          200 the bet, 404
//! GET  /health             200
//! ```
//!
//! Each command is **one** transaction, the service's own: the request's idempotency record
//! (`PgOutbox::idempotency_begin`), the bet row, the intent (`PgOutbox::enqueue(&mut *tx, …)`:
//! `BetAccepted` or `BetSettled`) and the stored answer (`idempotency_complete`) commit together
//! or not at all; `support::api::OutboxApi` begins and finishes that transaction, each handler
//! writes the bet row in between. A handler's last argument, `support::api::Command`, is the
//! request's `Idempotency-Key` and JSON body (400 when either is missing or malformed). A retry
//! with the same key replays the first answer (`Idempotent-Replayed: true`); the same key with
//! another request is 422.
//!
//! The settlement's version comes from the bet's own row: `UPDATE bets SET status = …,
//! version = version + 1 … WHERE status = 'accepted' RETURNING version`. The row lock orders a
//! bet's commits, and the `WHERE` makes a bet settle once: a second settlement (another key)
//! is 409 and enqueues nothing. Odds are decimal with at most two places (1.01 to 1000); a won
//! bet pays `stake * odds`, in minor units rounded down.

use std::net::SocketAddr;

use anyhow::Result;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use outbox::consumer::HandlerError;
use outbox::{IncomingEvent, NewMessage, Payload};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use support::api::{ApiError, Begun, Command, OutboxApi, error, internal, stored, unavailable};
use tokio_util::sync::CancellationToken;

use crate::Common;
use crate::topology::{AGGREGATE, BET_ACCEPTED, BET_SETTLED};

/// Idempotency scope of `POST /bets`.
const SCOPE_PLACE: &str = "place-bet";
/// Idempotency scope of `POST /bets/{id}/settle`.
const SCOPE_SETTLE: &str = "settle-bet";
/// Longest accepted player or market name.
const MAX_NAME_LEN: usize = 64;

/// The payload of both bet events (`outcome` and `payout` only in `BetSettled`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BetEvent {
    /// The bet id (also the aggregate id).
    pub id: String,
    /// The player.
    pub player: String,
    /// The market the bet is on.
    pub market: String,
    /// Minor units.
    pub stake: i64,
    /// Decimal odds in hundredths.
    pub odds_x100: i64,
    /// `won` or `lost` (settled only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// What the bet pays, minor units: `stake * odds_x100 / 100` when won, 0 when lost
    /// (settled only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payout: Option<i64>,
}

impl BetEvent {
    /// Decodes a bet event's payload; one that does not decode never will (permanent).
    ///
    /// # Errors
    /// [`HandlerError::Permanent`] for an unknown schema version or a malformed payload.
    pub fn decode(event: &IncomingEvent) -> Result<Self, HandlerError> {
        support::consumer::decode(event, "bet event")
    }

    /// `query` with the bet's id, player, market, stake and odds bound as `$1` to `$5`: the
    /// columns a new bet writes, in the bets database and in the history.
    pub fn bind<'q>(
        &'q self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        query
            .bind(&self.id)
            .bind(&self.player)
            .bind(&self.market)
            .bind(self.stake)
            .bind(self.odds_x100 as i32)
    }

    /// The integration event of this bet at `version`.
    ///
    /// # Errors
    /// The payload cannot be serialised (it always can).
    pub fn message(&self, version: i64, event_type: &str) -> Result<NewMessage> {
        Ok(NewMessage::new(
            AGGREGATE,
            &self.id,
            version,
            event_type,
            Payload::json(self)?,
        ))
    }
}

/// What a won bet of `stake` at `odds_x100` pays, in minor units (rounded down).
pub fn payout_of(stake: i64, odds_x100: i64) -> i64 {
    stake * odds_x100 / 100
}

/// Serves the API on `listen` until `shutdown`.
///
/// # Errors
/// The database is unreachable or not migrated, or the address cannot be bound.
pub async fn serve(common: &Common, listen: SocketAddr, shutdown: CancellationToken) -> Result<()> {
    let pool = crate::db::open(&crate::db::BETS, &common.bets_url, 16).await?;
    let router = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/bets", post(place_bet))
        .route("/bets/{id}", get(get_bet))
        .route("/bets/{id}/settle", post(settle_bet))
        // The outbox on the bets database, and wake-ups for the relays after each commit.
        .with_state(OutboxApi::new(pool));
    support::api::serve(router, listen, "bets API", shutdown).await
}

/// Body of `POST /bets`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlaceBet {
    player: String,
    market: String,
    /// Minor units, positive.
    stake: i64,
    /// Decimal odds, at most two decimal places.
    odds: f64,
}

/// Body of `POST /bets/{id}/settle`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleBet {
    outcome: String,
}

/// `odds` in hundredths, or `None` when out of range or with more than two decimals.
fn odds_x100(odds: f64) -> Option<i64> {
    let hundredths = (odds * 100.0).round();
    let exact = (odds * 100.0 - hundredths).abs() < 1e-6;
    (exact && (101.0..=100_000.0).contains(&hundredths)).then_some(hundredths as i64)
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME_LEN && !s.chars().any(char::is_control)
}

fn unprocessable(message: String) -> ApiError {
    error(StatusCode::UNPROCESSABLE_ENTITY, message)
}

/// The body answered for a bet (also what the idempotency record stores).
fn bet_body(bet: &BetEvent, status: &str, version: i64) -> Value {
    let mut body = json!({
        "id": bet.id, "player": bet.player, "market": bet.market, "stake": bet.stake,
        "odds": bet.odds_x100 as f64 / 100.0, "status": status, "version": version,
    });
    if let Some(payout) = bet.payout {
        body["payout"] = json!(payout);
    }
    body
}

/// `POST /bets`: the bet row and `BetAccepted` (version 1) in one transaction.
async fn place_bet(
    State(app): State<OutboxApi>,
    Command { key, body: req }: Command<PlaceBet>,
) -> Result<Response, ApiError> {
    if req.stake <= 0 {
        return Err(unprocessable(format!(
            "stake must be a positive number of minor units, got {}",
            req.stake
        )));
    }
    let Some(odds_x100) = odds_x100(req.odds) else {
        return Err(unprocessable(format!(
            "odds must be 1.01 to 1000 with at most two decimals, got {}",
            req.odds
        )));
    };
    if !valid_name(&req.player) || !valid_name(&req.market) {
        return Err(unprocessable(format!(
            "player and market must be 1 to {MAX_NAME_LEN} printable characters"
        )));
    }
    let request = json!({
        "player": req.player, "market": req.market, "stake": req.stake, "odds_x100": odds_x100,
    });
    let mut tx = match app.begin(SCOPE_PLACE, &key, &request).await? {
        Begun::New(tx) => tx,
        Begun::Replay(first) => return Ok(first),
    };
    let bet = BetEvent {
        id: format!("bet_{}", uuid::Uuid::now_v7().simple()),
        player: req.player,
        market: req.market,
        stake: req.stake,
        odds_x100,
        outcome: None,
        payout: None,
    };
    bet.bind(sqlx::query(
        "INSERT INTO bets (id, player, market, stake, odds_x100, status, version) \
         VALUES ($1, $2, $3, $4, $5, 'accepted', 1)",
    ))
    .execute(&mut *tx)
    .await
    .map_err(unavailable)?;
    let intent = bet.message(1, BET_ACCEPTED).map_err(internal)?;
    let response = stored(StatusCode::CREATED, bet_body(&bet, "accepted", 1));
    app.finish(tx, &intent, response).await
}

/// `POST /bets/{id}/settle`: the bet's state and `BetSettled` (the row's next version) in one
/// transaction.
async fn settle_bet(
    State(app): State<OutboxApi>,
    Path(id): Path<String>,
    Command { key, body: req }: Command<SettleBet>,
) -> Result<Response, ApiError> {
    if req.outcome != "won" && req.outcome != "lost" {
        return Err(unprocessable(format!(
            "outcome must be `won` or `lost`, got `{}`",
            req.outcome
        )));
    }
    let request = json!({ "settle": id, "outcome": req.outcome });
    let mut tx = match app.begin(SCOPE_SETTLE, &key, &request).await? {
        Begun::New(tx) => tx,
        Begun::Replay(first) => return Ok(first),
    };
    // The bet's own row gives the version and settles it once; the payout is computed by the
    // database from the accepted stake and odds.
    let row: Option<(i64, String, String, i64, i32, i64)> = sqlx::query_as(
        "UPDATE bets SET status = $2, version = version + 1, settled_at = now(), \
         payout = CASE WHEN $2 = 'won' THEN stake * odds_x100 / 100 ELSE 0 END \
         WHERE id = $1 AND status = 'accepted' \
         RETURNING version, player, market, stake, odds_x100, payout",
    )
    .bind(&id)
    .bind(&req.outcome)
    .fetch_optional(&mut *tx)
    .await
    .map_err(unavailable)?;
    let Some((version, player, market, stake, odds_x100, payout)) = row else {
        // Rolled back with `tx`: nothing is stored under the key.
        let status: Option<String> = sqlx::query_scalar("SELECT status FROM bets WHERE id = $1")
            .bind(&id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(unavailable)?;
        return Err(match status {
            None => error(StatusCode::NOT_FOUND, format!("no bet `{id}`")),
            Some(s) => error(
                StatusCode::CONFLICT,
                format!("bet `{id}` is already settled ({s})"),
            ),
        });
    };
    let bet = BetEvent {
        id,
        player,
        market,
        stake,
        odds_x100: i64::from(odds_x100),
        outcome: Some(req.outcome.clone()),
        payout: Some(payout),
    };
    let intent = bet.message(version, BET_SETTLED).map_err(internal)?;
    let response = stored(StatusCode::OK, bet_body(&bet, &req.outcome, version));
    app.finish(tx, &intent, response).await
}

/// A bet as `GET /bets/{id}` reads it.
#[derive(sqlx::FromRow)]
struct BetRow {
    player: String,
    market: String,
    stake: i64,
    odds_x100: i32,
    status: String,
    payout: Option<i64>,
    version: i64,
}

/// `GET /bets/{id}`.
async fn get_bet(
    State(app): State<OutboxApi>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let row: Option<BetRow> = sqlx::query_as(
        "SELECT player, market, stake, odds_x100, status, payout, version FROM bets WHERE id = $1",
    )
    .bind(&id)
    .fetch_optional(&app.pool)
    .await
    .map_err(unavailable)?;
    let Some(r) = row else {
        return Err(error(StatusCode::NOT_FOUND, format!("no bet `{id}`")));
    };
    let bet = BetEvent {
        id,
        player: r.player,
        market: r.market,
        stake: r.stake,
        odds_x100: i64::from(r.odds_x100),
        outcome: None,
        payout: r.payout,
    };
    Ok(axum::Json(bet_body(&bet, &r.status, r.version)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odds_have_two_decimals_and_pay_rounded_down() {
        assert_eq!(odds_x100(2.5), Some(250));
        assert_eq!(odds_x100(1.01), Some(101));
        assert_eq!(odds_x100(1.0), None);
        assert_eq!(odds_x100(2.555), None);
        assert_eq!(odds_x100(f64::NAN), None);
        assert_eq!(payout_of(333, 250), 832);
    }
}
