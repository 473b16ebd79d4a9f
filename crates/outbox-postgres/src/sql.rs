//! Every SQL statement of this crate, as templates over the schema name (`{s}`), rendered once
//! per schema. Values always travel as bind parameters.

use std::sync::Arc;

use crate::schema::Schema;

/// Columns returned for a claimed row, in the order `row_to_message` reads them.
const MESSAGE_COLUMNS: &str = "e.id, e.event_id, e.aggregate_type, e.aggregate_id, \
    e.aggregate_version, e.event_type, e.schema_version, e.content_type, e.payload, \
    e.payload_sha256, e.headers, e.destination, e.partition_key, e.created_at, e.attempts";

pub(crate) const INSERT_EVENT: &str = "INSERT INTO {s}.events (event_id, aggregate_type, \
    aggregate_id, aggregate_version, event_type, schema_version, content_type, payload, headers, \
    destination, partition_key) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11)";

pub(crate) const INSERT_EVENTS: &str = "INSERT INTO {s}.events (event_id, aggregate_type, \
    aggregate_id, aggregate_version, event_type, schema_version, content_type, payload, headers, \
    destination, partition_key) \
    SELECT u.event_id, u.aggregate_type, u.aggregate_id, u.aggregate_version, u.event_type, \
    u.schema_version, u.content_type, u.payload, u.headers::jsonb, u.destination, u.partition_key \
    FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::int8[], $5::text[], $6::int4[], \
    $7::text[], $8::bytea[], $9::text[], $10::text[], $11::text[]) WITH ORDINALITY AS \
    u(event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, \
    content_type, payload, headers, destination, partition_key, ord) ORDER BY u.ord";

/// The producer's delete-in-transaction write (migration 0005), with `INSERT_EVENTS`'s binds.
pub(crate) const ENQUEUE_DELETED: &str = "SELECT {s}.enqueue_deleted($1::uuid[], $2::text[], \
    $3::text[], $4::int8[], $5::text[], $6::int4[], $7::text[], $8::bytea[], $9::text[], \
    $10::text[], $11::text[])";

pub(crate) const NEXT_VERSION: &str = "INSERT INTO {s}.aggregate_versions AS v (aggregate_type, \
    aggregate_id, last_version) VALUES ($1, $2, 1) ON CONFLICT (aggregate_type, aggregate_id) \
    DO UPDATE SET last_version = v.last_version + 1 RETURNING v.last_version";

pub(crate) const IDEM_INSERT: &str = "INSERT INTO {s}.idempotency_keys (scope, key, \
    request_sha256) VALUES ($1, $2, $3) ON CONFLICT (scope, key) DO NOTHING";

pub(crate) const IDEM_SELECT: &str =
    "SELECT request_sha256, response FROM {s}.idempotency_keys WHERE scope = $1 AND key = $2";

pub(crate) const IDEM_COMPLETE: &str = "UPDATE {s}.idempotency_keys SET response = $3, \
    completed_at = now() WHERE scope = $1 AND key = $2 AND response IS NULL";

/// The part both claims share, after their `heads` CTE: one fresh token, the lease upsert of
/// every head (taking over only an expired lease, counting the takeover: +1 while the head is
/// the one the old lease was taken with, else 1) and the start of the result, each row with
/// whether its route is paused (`route_paused`, [`ROUTE_PAUSED`]) and the lowest head of the
/// claim (`first_head`, for `outbox_core::claim_window`). `{lease}` is the lease length parameter in
/// milliseconds; `{owner}` the claiming relay's owner number (`crate::session`), or NULL for
/// a relay without a live session. With an owner, nothing is leased unless the owner is still
/// registered: the claim's transaction holds its lock in shared mode (`crate::session`), so no
/// sweep can remove it meanwhile, and a claim after the sweep leases nothing. A takeover
/// records how long the lease had been without a live owner (`takeover_ms`: since a sweep
/// found its owner gone, or since it ran out).
const ACQUIRE: &str = "), token AS MATERIALIZED ( \
      SELECT nextval('{s}.lease_token_seq') AS t \
      WHERE {owner}::int4 IS NULL \
        OR EXISTS (SELECT 1 FROM {s}.lease_owners o WHERE o.owner = {owner}::int4) \
    ), acquired AS ( \
      INSERT INTO {s}.leases AS l (aggregate_type, aggregate_id, token, lease_until, head_id, \
        owner) \
      SELECT h.aggregate_type, h.aggregate_id, token.t, now() + {lease} * interval '1 millisecond', \
        h.id, {owner}::int4 \
      FROM heads h, token \
      ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE \
        SET token = EXCLUDED.token, lease_until = EXCLUDED.lease_until, \
          takeovers = CASE WHEN l.head_id = EXCLUDED.head_id THEN l.takeovers + 1 ELSE 1 END, \
          head_id = EXCLUDED.head_id, owner = EXCLUDED.owner, \
          takeover_ms = least(extract(epoch FROM now() - coalesce(l.orphaned_at, l.lease_until)) \
            * 1000, 2147483647)::int4, \
          orphaned_at = NULL \
        WHERE l.lease_until <= now() \
      RETURNING l.aggregate_type, l.aggregate_id, l.token, l.takeovers, l.takeover_ms \
    ) \
    SELECT a.token, a.takeovers AS lease_takeovers, a.takeover_ms AS lease_orphaned_ms, \
      h.id AS lease_head, \
      (SELECT min(id) FROM heads) AS first_head, {paused_e} AS route_paused, {cols} \
    FROM heads h \
    JOIN acquired a ON a.aggregate_type = h.aggregate_type AND a.aggregate_id = h.aggregate_id";

/// The claim, in one statement:
/// * `heads`: the lowest unpublished version of each aggregate that is pending, due, without a
///   live lease, and not locked by a concurrent claim (SKIP LOCKED), oldest first;
/// * `acquired`: one lease row per head's aggregate under a fresh token. The upsert only takes
///   over an *expired* lease, and it always sees the latest committed lease row, so two claims
///   racing for one aggregate cannot both acquire it, whatever their snapshots. A takeover
///   counts itself (`takeovers`: +1 while the head is the one the old lease was taken with,
///   else 1), which is how the relay recognises a poison row (migration 6);
/// * the result: each acquired aggregate's pending versions from its head on, stopping before a
///   dead letter, capped per aggregate and in total. The nested loop over `heads` stops at the
///   total cap, so each aggregate's rows are a prefix of its run; aggregates cut off entirely
///   stay leased until the claim is settled (release deletes every lease of the token).
///
/// A head whose route an operator paused (migration 10, [`ROUTE_PAUSED`]) is not taken: its
/// aggregate waits. A later row of a taken run may go to a paused route; the store cuts the run
/// before it (`route_paused`), so nothing of the aggregate passes it.
///
/// With the claim window on (`outbox_core::claim_window`), heads are looked for from id `$6` on (`{from}`;
/// empty when the window is off, so the statement is the one without a window); a head still
/// needs every earlier version of its aggregate published, wherever it
/// lies, so where the walk starts never reorders anything.
///
/// Event rows are only read and row-locked here, never rewritten: a claim writes one small
/// lease row per aggregate, not one fat tuple per event.
const CLAIM: &str = "WITH heads AS ( \
      SELECT e.id, e.aggregate_type, e.aggregate_id, e.aggregate_version \
      FROM {s}.events e \
      WHERE e.state = 'pending' AND e.available_at <= now() \
        AND NOT EXISTS (SELECT 1 FROM {s}.leases l \
            WHERE l.aggregate_type = e.aggregate_type AND l.aggregate_id = e.aggregate_id \
              {live_only}) \
        AND NOT EXISTS (SELECT 1 FROM {s}.events p \
            WHERE p.aggregate_type = e.aggregate_type AND p.aggregate_id = e.aggregate_id \
              AND p.aggregate_version < e.aggregate_version AND p.state <> 'published') \
        AND NOT {paused_e} {from} \
      ORDER BY e.id LIMIT $4 \
      FOR UPDATE OF e SKIP LOCKED \
    {acquire} \
    CROSS JOIN LATERAL ( \
      SELECT * FROM {s}.events e \
      WHERE e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id \
        AND e.aggregate_version >= h.aggregate_version AND e.state = 'pending' \
        AND NOT EXISTS (SELECT 1 FROM {s}.events d \
            WHERE d.aggregate_type = h.aggregate_type AND d.aggregate_id = h.aggregate_id \
              AND d.state = 'dead' AND d.aggregate_version < e.aggregate_version) \
      ORDER BY e.aggregate_version LIMIT $2 \
    ) e \
    LIMIT $1";

/// How a claim's transaction starts: sequential scans and JIT compilation off.
///
/// The claim walks an index in id order and stops after a batch; how many rows the table holds
/// says nothing about where the pending ones are. The planner does not know that: once a large
/// backlog was drained and VACUUM recorded the table as nearly empty but as large as at its peak
/// (VACUUM does not give pages back), the claim's own estimate made a scan of every page plus a
/// sort look cheaper than the index, and each claim read the whole table (1.0-1.6 s per claim
/// after a 10-million-event drain, W6 in docs/benchmarks-history.md; 50 ms at 1 million).
/// Turning the scan off for the claim's transaction (`SET LOCAL`, sent with the `BEGIN`; with
/// the `COMMIT` the claim costs two round trips more than a statement of its own) leaves the
/// planner the index paths only; nothing else the connection runs is affected. (A transaction
/// per claim also means a pooler in front of PostgreSQL must pool by transaction, not by
/// statement.)
///
/// JIT compilation is off for the same transaction: on such a table the claim's estimated
/// cost passes PostgreSQL's JIT thresholds, and each claim then compiled itself for about
/// 500 ms to run for 15 ms (a reproduction at 10 million drained rows). A claim is a short
/// OLTP statement, never worth compiling.
///
/// Only for statements with an index path to every table they read ([`CLAIM`]'s): where a
/// table must be scanned anyway, the scan is planned at a penalty cost of 10^10 (PostgreSQL
/// 17 and earlier), next to which the rest of the plan's costs no longer count (costs are
/// compared within 1 %).
/// [`CLAIM_TAKEOVER`] reads the small `leases` table, which has no index on expiry, and runs
/// without this start. (Under it, with JIT still on, the penalty also passed the JIT
/// thresholds: a takeover claim took 450 ms on a schema of 40 rows, 0.35 ms without JIT, and
/// a relay makes two as it starts.)
pub(crate) const CLAIM_BEGIN: &str = "BEGIN; SET LOCAL enable_seqscan = off; SET LOCAL jit = off";

/// The claim of [`outbox_core::ClaimScope::TakeOver`]: one aggregate whose lease, itself a
/// takeover, expired unsettled again, its head row alone (the poison-row rule). It looks at
/// the 32 such leases that expired first (a sort of the small `leases` table, no lateral per
/// lease beyond those):
/// * `expired`: each one's aggregate with its lowest unpublished row;
/// * `cleared`: those with nothing to take over are deleted: no unpublished row left, a dead
///   head (its aggregate waits for a requeue, not for a lease), a head in backoff (its
///   failure was recorded, so it is no crash victim) or a head whose route is paused (it waits
///   for a resume; its count starts again after it). The `Free` claim, which stays off every
///   leased aggregate, then gets them back when they are due;
/// * `heads`: the pending, due head whose lease expired first, locked (SKIP LOCKED);
/// * `acquired`: the lease taken over as in [`CLAIM`], counting the takeover.
const CLAIM_TAKEOVER: &str = "WITH expired AS ( \
      SELECT l.aggregate_type, l.aggregate_id, l.lease_until, h.id, h.state, h.available_at, \
        h.paused \
      FROM (SELECT aggregate_type, aggregate_id, lease_until FROM {s}.leases \
            WHERE lease_until <= now() AND takeovers > 0 ORDER BY lease_until LIMIT 32) l \
      LEFT JOIN LATERAL ( \
        SELECT e.id, e.state, e.available_at, {paused_e} AS paused FROM {s}.events e \
        WHERE e.aggregate_type = l.aggregate_type AND e.aggregate_id = l.aggregate_id \
          AND e.state <> 'published' \
        ORDER BY e.aggregate_version LIMIT 1 \
      ) h ON true \
    ), cleared AS ( \
      DELETE FROM {s}.leases o USING expired x \
      WHERE o.aggregate_type = x.aggregate_type AND o.aggregate_id = x.aggregate_id \
        AND o.lease_until <= now() \
        AND (x.id IS NULL OR x.state <> 'pending' OR x.available_at > now() OR x.paused) \
    ), heads AS ( \
      SELECT e.id, e.aggregate_type, e.aggregate_id, e.aggregate_version \
      FROM {s}.events e JOIN expired x ON x.id = e.id \
      WHERE x.state = 'pending' AND x.available_at <= now() AND e.state = 'pending' \
        AND NOT x.paused \
      ORDER BY x.lease_until, e.id LIMIT 1 \
      FOR UPDATE OF e SKIP LOCKED \
    {acquire} \
    JOIN {s}.events e ON e.id = h.id";

/// Whether a [`CLAIM_TAKEOVER`] claim may find something: a lease that was itself a takeover
/// and ran out (or was expired by a sweep, `crate::session`). A scan of the small `leases`
/// table.
pub(crate) const TAKEOVERS_WAITING: &str =
    "SELECT EXISTS (SELECT 1 FROM {s}.leases WHERE takeovers > 0 AND lease_until <= now())";

const MARK_DELETE: &str = "DELETE FROM {s}.events e USING {s}.leases l \
    WHERE e.id = ANY($1) AND l.token = $2 \
      AND l.aggregate_type = e.aggregate_type AND l.aggregate_id = e.aggregate_id";

const MARK_UPDATE: &str = "UPDATE {s}.events e SET state = 'published', \
    published_at = coalesce(e.published_at, now()) \
    FROM {s}.leases l \
    WHERE e.id = ANY($1) AND l.token = $2 \
      AND l.aggregate_type = e.aggregate_type AND l.aggregate_id = e.aggregate_id";

pub(crate) const FAIL: &str = "UPDATE {s}.events e SET attempts = e.attempts + 1, last_error = $3, \
    state = CASE WHEN $4::int8 IS NULL THEN 'dead' ELSE 'pending' END, \
    available_at = CASE WHEN $4::int8 IS NULL THEN e.available_at \
                        ELSE now() + $4::int8 * interval '1 millisecond' END \
    FROM {s}.leases l \
    WHERE e.id = $1 AND l.token = $2 \
      AND l.aggregate_type = e.aggregate_type AND l.aggregate_id = e.aggregate_id";

/// Ends a claim: drops its leases. Leases of crashed relays are reaped by the maintainer
/// ([`LEASE_REAP`]).
pub(crate) const RELEASE: &str = "DELETE FROM {s}.leases WHERE token = $1";

/// Deletes leases that expired more than `$1` ms ago, at most `$2`. Not those counting
/// takeovers (a row suspected of crashing its relays): deleting one would reset its count,
/// and the solo takeover claim clears them when there is nothing left to take over.
pub(crate) const LEASE_REAP: &str = "DELETE FROM {s}.leases WHERE ctid = ANY(ARRAY( \
    SELECT ctid FROM {s}.leases WHERE lease_until < now() - $1 * interval '1 millisecond' \
      AND takeovers = 0 \
    LIMIT $2))";

/// Deletes inbox identities received more than `$1` ms ago, at most `$2`.
pub(crate) const INBOX_PURGE: &str = "DELETE FROM {s}.inbox WHERE ctid = ANY(ARRAY( \
    SELECT ctid FROM {s}.inbox WHERE received_at < now() - $1 * interval '1 millisecond' \
    LIMIT $2))";

/// Deletes `succeeded` work items resolved more than `$1` ms ago, at most `$2`, oldest first.
pub(crate) const WORK_ITEM_PURGE: &str = "DELETE FROM {s}.work_items WHERE id IN ( \
    SELECT id FROM {s}.work_items WHERE state = 'succeeded' \
    AND resolved_at < now() - $1 * interval '1 millisecond' \
    ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// Deletes published rows (mark mode) published more than `$1` ms ago, at most `$2`. Picked by
/// ctid and checked again on delete, state and age: a replay may turn a picked row back to
/// pending, or pending and published again, while the delete waits for its row lock (the relay
/// never locks a published row; a replay's update does). With the mark-mode index on
/// `published_at` ([`MARK_MODE_INDEXES`]) the pick reads only old published rows.
///
/// The state check on delete is written `(state || '') = 'published'` on purpose. A replay may turn
/// a picked row back to pending meanwhile; the delete then follows the row to its new version
/// and checks its filter again (PostgreSQL does not compare the ctid again there), so the state
/// must be checked. But written as `state = 'published'`, the check lets the planner read the
/// delete's rows from the partial `published_at` index instead of by ctid, and with statistics
/// taken before the drain (no published row yet) it does: a scan of every published row per
/// batch, each compared with the 10,000 picked ctids. W6 met exactly that: one batch ran for
/// minutes at 10 million published rows, where the ctid scan takes 20 ms. The expression keeps
/// the check and leaves the planner the ctid scan only.
///
/// The same statement raises the `published` retention mark (schema 11) to the newest
/// `created_at` it deleted: the replay horizon of a time range (`ReplayOps::replay` of a
/// `RangeSelection`); every row written after the mark is still held, by construction. It
/// answers how many rows it deleted.
pub(crate) const PUBLISHED_PURGE: &str = "WITH d AS (DELETE FROM {s}.events WHERE ctid = ANY(ARRAY( \
    SELECT ctid FROM {s}.events WHERE state = 'published' \
      AND published_at < now() - $1 * interval '1 millisecond' \
    LIMIT $2)) AND (state || '') = 'published' \
    AND published_at < now() - $1 * interval '1 millisecond' RETURNING created_at), \
  m AS (INSERT INTO {s}.retention_marks AS r (what, through) \
    SELECT 'published', max(created_at) FROM d HAVING count(*) > 0 \
    ON CONFLICT (what) DO UPDATE SET through = greatest(r.through, excluded.through)) \
  SELECT count(*) FROM d";

/// The indexes mark mode needs (`outbox migrate` with `relay.on_publish = "mark"`,
/// [`crate::migrate_mark_mode`]), as `(name, columns and predicate)`. Published rows stay in
/// the table, so without them every claim walks past them: the claim's scan of pending heads,
/// its check for an unpublished earlier version and its per-aggregate run all read published
/// rows (1.2 s per claim at 1.9M published rows, 31 ms with these, on the development
/// machine). Delete mode does without: every index is paid on each producer insert (W1).
pub(crate) const MARK_MODE_INDEXES: &[(&str, &str)] = &[
    ("events_pending_idx", "(id) WHERE state = 'pending'"),
    (
        "events_unpublished_idx",
        "(aggregate_type, aggregate_id, aggregate_version) WHERE state <> 'published'",
    ),
    (
        "events_published_at_idx",
        "(published_at) WHERE state = 'published'",
    ),
];

/// The outbox's numbers: pending, oldest pending age, in flight, retrying, dead, published.
/// `{published}` counts the published rows kept and `{scope}` ends the statement; see
/// [`stats`].
const STATS: &str = "SELECT \
      count(*) FILTER (WHERE state = 'pending'), \
      EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE state = 'pending'))::float8, \
      (SELECT count(*) FROM {s}.events f JOIN {s}.leases l \
         ON l.aggregate_type = f.aggregate_type AND l.aggregate_id = f.aggregate_id \
       WHERE f.state = 'pending' AND l.lease_until > now()), \
      count(*) FILTER (WHERE state = 'pending' AND attempts > 0), \
      count(*) FILTER (WHERE state = 'dead'), \
      {published} \
    FROM {s}.events{scope}";

/// [`STATS`] for delete mode (one pass over the table, which holds no published rows), or
/// for mark mode (`mark`): the other numbers from the unpublished rows only (the mark-mode
/// index on them, [`MARK_MODE_INDEXES`]) and the published rows counted on their own index.
/// One pass would read every published row kept on each call, and the relay calls it every
/// `stats_interval`.
fn stats(mark: bool) -> String {
    let (published, scope) = if mark {
        (
            "(SELECT count(*) FROM {s}.events p WHERE p.state = 'published')",
            " WHERE state <> 'published'",
        )
    } else {
        ("count(*) FILTER (WHERE state = 'published')", "")
    };
    STATS
        .replace("{published}", published)
        .replace("{scope}", scope)
}

/// A consumer dead letter, with the message as received (`crate::consumer`).
const INSERT_DEAD: &str = "INSERT INTO {s}.consumer_dead_letters (consumer_name, \
    event_id, aggregate_type, aggregate_id, aggregate_version, event_type, content_type, payload, \
    headers, error, attempts, header_names, header_values, content_type_bytes, broker_metadata) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12, $13, $14, $15::jsonb)";
/// Requeued consumer dead letters of consumer `$1`, for its engine to apply again.
const TAKE_REQUEUED: &str = "SELECT id, payload, headers::text, content_type, attempts, \
    header_names, header_values, content_type_bytes, broker_metadata::text \
    FROM {s}.consumer_dead_letters WHERE consumer_name = $1 AND state = 'requeued' \
    ORDER BY updated_at, id LIMIT $2 FOR UPDATE SKIP LOCKED";
/// A requeued consumer dead letter settled (`$2`: its new state).
const SETTLE_REQUEUED: &str = "UPDATE {s}.consumer_dead_letters SET state = $2, \
    error = coalesce($3, error), attempts = attempts + 1, updated_at = now() \
    WHERE id = $1 AND state = 'requeued'";
/// Open consumer dead letters of consumer `$1`.
const COUNT_DEAD: &str = "SELECT count(*) FROM {s}.consumer_dead_letters \
    WHERE consumer_name = $1 AND state <> 'resolved'";

/// Whether the consumer `$1` is paused (what its engine asks, `crate::consumer`; paused through the operator contract, `crate::admin`).
const CONSUMER_PAUSED: &str =
    "SELECT EXISTS (SELECT 1 FROM {s}.pauses WHERE kind = 'consumer' AND name = $1)";

/// Whether the route of the events row `e` is paused (migration 10): the route's key as the
/// `pauses` and `activity` tables write it, looked up by the primary key of `pauses` (one
/// index probe per row; the table holds a handful of rows).
const ROUTE_PAUSED: &str =
    "EXISTS (SELECT 1 FROM {s}.pauses z WHERE z.kind = 'route' AND z.name = {key})";

/// The route key of a row (`destination:` and its destination, or `type:` and its aggregate
/// type when it has none), as `crate::heartbeat` writes it into `activity` and the admin into
/// `pauses`; `alias` qualifies the columns (`"e."`, or `""`).
pub(crate) fn route_key(alias: &str) -> String {
    format!(
        "CASE WHEN {alias}destination IS NOT NULL THEN 'destination:' || {alias}destination \
         ELSE 'type:' || {alias}aggregate_type END"
    )
}

/// [`ROUTE_PAUSED`] for the events row `e`.
fn route_paused() -> String {
    ROUTE_PAUSED.replace("{key}", &route_key("e."))
}

/// The leases a `ClaimScope::All` claim stays off: live ones.
const LIVE: &str = "AND l.lease_until > now()";
/// The leases a `ClaimScope::Free` claim stays off: live ones, and expired takeovers.
const LIVE_OR_COUNTED: &str = "AND (l.lease_until > now() OR l.takeovers > 0)";

/// [`CLAIM`] with its shared part, skipping aggregates with a lease matching `live_only`;
/// `from`: a bound on the heads' ids (`"AND e.id >= $6"` for the claim window,
/// `outbox_core::claim_window`; `"AND e.id <= $6"` for a ceiling, [`PgStore::with_claim_ceiling`]), or
/// empty. `$5` is the owner (see [`ACQUIRE`]).
///
/// [`PgStore::with_claim_ceiling`]: crate::PgStore::with_claim_ceiling
fn claim(live_only: &str, from: &str) -> String {
    CLAIM
        .replace(
            "{acquire}",
            &ACQUIRE.replace("{lease}", "$3").replace("{owner}", "$5"),
        )
        .replace("{live_only}", live_only)
        .replace("{paused_e}", &route_paused())
        .replace("{from}", from)
}

/// [`CLAIM_TAKEOVER`] with its shared part.
fn claim_takeover() -> String {
    CLAIM_TAKEOVER
        .replace(
            "{acquire}",
            &ACQUIRE.replace("{lease}", "$1").replace("{owner}", "$2"),
        )
        .replace("{paused_e}", &route_paused())
}

/// Rendered statements for one schema.
#[derive(Debug)]
pub(crate) struct Sql {
    pub insert_event: Arc<str>,
    pub insert_events: Arc<str>,
    pub enqueue_deleted: Arc<str>,
    pub next_version: Arc<str>,
    pub idem_insert: Arc<str>,
    pub idem_select: Arc<str>,
    pub idem_complete: Arc<str>,
    /// The claim of `ClaimScope::All` (takes expired leases over with the rest).
    pub claim: Arc<str>,
    /// The claim of `ClaimScope::Free` (stays off every leased aggregate).
    pub claim_free: Arc<str>,
    /// [`Sql::claim`] from id `$6` on (the claim window).
    pub claim_from: Arc<str>,
    /// [`Sql::claim_free`] from id `$6` on (the claim window).
    pub claim_free_from: Arc<str>,
    /// [`Sql::claim`] of heads with ids up to `$6` (a claim ceiling).
    pub claim_below: Arc<str>,
    /// The claim of `ClaimScope::TakeOver`.
    pub claim_takeover: Arc<str>,
    /// [`TAKEOVERS_WAITING`].
    pub takeovers_waiting: Arc<str>,
    pub mark_delete: Arc<str>,
    pub mark_update: Arc<str>,
    pub fail: Arc<str>,
    pub release: Arc<str>,
    pub stats: Arc<str>,
    pub stats_mark: Arc<str>,
    pub lease_reap: Arc<str>,
    pub inbox_purge: Arc<str>,
    pub work_item_purge: Arc<str>,
    pub published_purge: Arc<str>,
    pub insert_dead: Arc<str>,
    pub take_requeued: Arc<str>,
    pub settle_requeued: Arc<str>,
    pub count_dead: Arc<str>,
    pub consumer_paused: Arc<str>,
    /// The id after the table's last row (`outbox_core::claim_window`).
    pub next_id: Arc<str>,
}

impl Sql {
    pub(crate) fn new(schema: &Schema) -> Self {
        let r = |t: &str| schema.render(&t.replace("{cols}", MESSAGE_COLUMNS));
        Self {
            insert_event: r(INSERT_EVENT),
            insert_events: r(INSERT_EVENTS),
            enqueue_deleted: r(ENQUEUE_DELETED),
            next_version: r(NEXT_VERSION),
            idem_insert: r(IDEM_INSERT),
            idem_select: r(IDEM_SELECT),
            idem_complete: r(IDEM_COMPLETE),
            claim: r(&claim(LIVE, "")),
            claim_free: r(&claim(LIVE_OR_COUNTED, "")),
            claim_from: r(&claim(LIVE, "AND e.id >= $6")),
            claim_free_from: r(&claim(LIVE_OR_COUNTED, "AND e.id >= $6")),
            claim_below: r(&claim(LIVE, "AND e.id <= $6")),
            claim_takeover: r(&claim_takeover()),
            takeovers_waiting: r(TAKEOVERS_WAITING),
            mark_delete: r(MARK_DELETE),
            mark_update: r(MARK_UPDATE),
            fail: r(FAIL),
            release: r(RELEASE),
            stats: r(&stats(false)),
            stats_mark: r(&stats(true)),
            lease_reap: r(LEASE_REAP),
            inbox_purge: r(INBOX_PURGE),
            work_item_purge: r(WORK_ITEM_PURGE),
            published_purge: r(PUBLISHED_PURGE),
            insert_dead: r(INSERT_DEAD),
            take_requeued: r(TAKE_REQUEUED),
            settle_requeued: r(SETTLE_REQUEUED),
            count_dead: r(COUNT_DEAD),
            consumer_paused: r(CONSUMER_PAUSED),
            next_id: r("SELECT coalesce(max(id), 0) + 1 FROM {s}.events"),
        }
    }
}
