//! Least privilege against the real server. Each component runs under a login role holding
//! exactly its grants (`outbox_postgres::roles`) and does its work; statements outside its
//! grants fail with SQLSTATE 42501, and the library reports them as permission errors naming the
//! role and the grants it needs. Also: the grant decisions cover every object of the schema, the
//! grants converge when re-applied, the bootstrap hands a schema to its migrator, and the SQL in
//! docs/security.md is the generator's.

mod common;
#[path = "support/login_roles.rs"]
mod login_roles;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{database_url, msg};
use login_roles::LoginRoles;
use outbox_core::consumer::{ConsumerConfig, Handler, HandlerError, InboxStore, OrderingGuard};
use outbox_core::effect::{Executor, ExecutorConfig, WorkItemStore as _};
use outbox_core::maintenance::{Maintainer, MaintenanceConfig};
use outbox_core::operator::prelude::*;
use outbox_core::operator::{
    ActivityKind, Actor, ConflictFilter, ConsumerSelection, DeadLetterSelection, OperatorErrorKind,
};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::{
    ClaimParams, Fingerprint, IncomingEvent, OutboxStore, PublishErrorKind, StoreErrorKind,
};
use outbox_postgres::roles::{Component, RoleName, RolePlan, RolesError, check_privileges};
use outbox_postgres::{
    EffectsError, EnqueueError, EnqueueOutcome, IdempotencyBegin, MigrateError, NewWorkItem,
    PgConsumer, PgEffects, PgOutbox, PgStore, PgStoreConfig, Resolution, Schema, migrate,
};
use outbox_testkit::fakes::{CallMode, FakeProvider, FakeSource, FakeTransport, event_message};
use outbox_testkit::wait;
use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WITHIN: Duration = Duration::from_secs(60);

/// The components that get grants (the migrator owns instead).
const GRANTEES: [Component; 7] = [
    Component::Producer,
    Component::Relay,
    Component::Consumer,
    Component::Executor,
    Component::Maintainer,
    Component::Reader,
    Component::Operator,
];

/// One test's world: a schema migrated by the superuser with a login role per component
/// holding its grants, a second migrated schema no role has grants on, and a schema for the
/// business tables. Everything, roles included, is dropped at the end, also after a panic.
struct Env {
    admin: PgPool,
    id: String,
    schema: Schema,
    other: Schema,
    business: String,
    roles: LoginRoles,
}

impl Env {
    async fn new() -> Env {
        let mut roles = LoginRoles::new(&database_url()).await;
        let id = roles.id.clone();
        let schema = Schema::new(&format!("t_{id}")).unwrap();
        let other = Schema::new(&format!("u_{id}")).unwrap();
        let business = format!("b_{id}");
        for s in [schema.as_str(), other.as_str(), &business] {
            roles.first(format!("DROP SCHEMA IF EXISTS \"{s}\" CASCADE"));
        }
        let mut env = Env {
            admin: roles.admin().clone(),
            id,
            schema,
            other,
            business,
            roles,
        };
        migrate(&env.admin, &env.schema).await.expect("migrate");
        migrate(&env.admin, &env.other).await.expect("migrate");
        env.exec(&format!("CREATE SCHEMA \"{}\"", env.business))
            .await;
        let mut plan = RolePlan::new(env.schema.clone());
        for c in GRANTEES {
            let role = env.login(c.as_str()).await;
            plan = plan.with_role(c, role);
        }
        plan.apply_grants(&env.admin).await.expect("grants");
        env
    }

    /// The role of `component` in this test.
    fn role(&self, component: Component) -> String {
        self.roles.name(component.as_str())
    }

    /// Creates the login role `r_<id>_<suffix>` (dropped at the end).
    async fn login(&mut self, suffix: &str) -> RoleName {
        RoleName::new(&self.roles.create(suffix).await).unwrap()
    }

    /// A pool logged in as `role`.
    async fn pool_as(&mut self, role: &str) -> PgPool {
        self.roles.pool_as(role).await
    }

    async fn pool(&mut self, component: Component) -> PgPool {
        self.pool_as(&self.role(component)).await
    }

    /// Creates the business table `{b}.<table>` (`columns`) and lets `component`'s role insert
    /// into it; returns a pool logged in as that role.
    async fn business_table(&mut self, component: Component, table: &str, columns: &str) -> PgPool {
        let role = self.role(component);
        self.exec(&format!(
            "CREATE TABLE {{b}}.{table} ({columns}); \
             GRANT USAGE ON SCHEMA {{b}} TO \"{role}\"; \
             GRANT INSERT ON {{b}}.{table} TO \"{role}\""
        ))
        .await;
        self.pool(component).await
    }

    /// A heartbeat of a process of `kind` named `name` on the test's schema, through `pool`,
    /// every 100 ms.
    fn heartbeat(
        &self,
        pool: &PgPool,
        kind: outbox_postgres::heartbeat::InstanceKind,
        name: &str,
    ) -> outbox_postgres::heartbeat::Heartbeat {
        let store = outbox_postgres::PgStore::with_schema(pool.clone(), self.schema.clone());
        outbox_postgres::heartbeat::Heartbeat::new(store, kind, name)
            .unwrap()
            .with_interval(Duration::from_millis(100))
    }

    /// `sql` as the superuser; `{s}` is the schema, `{b}` the business schema.
    async fn exec(&self, sql: &str) {
        sqlx::raw_sql(AssertSqlSafe(self.render(sql)))
            .execute(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(self.render(sql)))
            .fetch_one(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    fn render(&self, sql: &str) -> String {
        sql.replace("{s}", &format!("\"{}\"", self.schema))
            .replace("{b}", &format!("\"{}\"", self.business))
    }

    /// Asserts that `sql`, run by `pool`, fails for lack of a privilege.
    async fn denied(&self, pool: &PgPool, sql: &str) {
        let sql = self.render(sql);
        let e = sqlx::raw_sql(AssertSqlSafe(sql.clone()))
            .execute(pool)
            .await
            .expect_err(&sql);
        let db = e
            .as_database_error()
            .unwrap_or_else(|| panic!("{sql}: {e}"));
        assert_eq!(db.code().as_deref(), Some("42501"), "{sql}: {e}");
        assert!(db.message().starts_with("permission denied"), "{sql}: {e}");
    }

    async fn cleanup(self) {
        self.roles.cleanup().await;
    }
}

fn store(pool: &PgPool, schema: &Schema) -> PgStore {
    PgStore::new(
        pool.clone(),
        PgStoreConfig {
            schema: schema.clone(),
            ..PgStoreConfig::default()
        },
    )
}

// ---------------------------------------------------------------------------------------------
// The decisions and the scripts

/// The text between `<!-- {name} -->` and `<!-- /{name} -->` in docs/security.md, without the
/// code fence.
fn doc_block(name: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/security.md");
    let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let start = format!("<!-- {name} -->\n```sql\n");
    let end = format!("```\n<!-- /{name} -->");
    let from = doc
        .find(&start)
        .unwrap_or_else(|| panic!("{path} has no `{start}`"))
        + start.len();
    let to = doc[from..]
        .find(&end)
        .unwrap_or_else(|| panic!("{path} has no `{end}`"));
    doc[from..from + to].to_owned()
}

#[test]
fn the_sql_in_the_docs_is_the_generators() {
    let plan = RolePlan::with_defaults(Schema::default()).unwrap();
    for (name, generated) in [
        ("roles:grants", plan.grant_script()),
        ("roles:bootstrap", plan.bootstrap_script().unwrap()),
    ] {
        assert!(
            doc_block(name) == generated,
            "docs/security.md, block `{name}`, is out of date; replace it with the output of \
             `outbox roles print{}`:\n{generated}",
            if name == "roles:bootstrap" {
                " --bootstrap"
            } else {
                ""
            }
        );
    }
}

#[tokio::test]
async fn every_object_in_the_schema_has_a_grant_decision() {
    let env = Env::new().await;
    let mut in_schema: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') \
         AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d \
             WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid \
             AND d.deptype IN ('a', 'i')) ORDER BY 1",
    )
    .bind(env.schema.as_str())
    .fetch_all(&env.admin)
    .await
    .unwrap();
    let mut decided: Vec<String> = outbox_postgres::roles::covered_objects()
        .map(str::to_owned)
        .collect();
    decided.sort();
    in_schema.sort();
    assert_eq!(
        in_schema, decided,
        "every table and sequence the migrations create needs a decision for every component \
         in OBJECTS (crates/outbox-postgres/src/roles.rs), and every decision a table"
    );
    env.cleanup().await;
}

/// Every privilege in the schema: the schema's ACL, each object's, each column's.
async fn acl_snapshot(env: &Env) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT n.nspname::text, coalesce(n.nspacl::text, '') FROM pg_catalog.pg_namespace n \
         WHERE n.nspname = $1 \
         UNION ALL \
         SELECT c.relname::text, coalesce(c.relacl::text, '') FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 \
         UNION ALL \
         SELECT c.relname::text || '.' || a.attname::text, a.attacl::text \
         FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND coalesce(cardinality(a.attacl), 0) > 0 ORDER BY 1",
    )
    .bind(env.schema.as_str())
    .fetch_all(&env.admin)
    .await
    .unwrap()
}

#[tokio::test]
async fn grants_converge_when_reapplied_and_refuse_what_cannot_be_limited() {
    let mut env = Env::new().await;
    let plan = GRANTEES
        .iter()
        .fold(RolePlan::new(env.schema.clone()), |p, c| {
            p.with_role(*c, RoleName::new(&env.role(*c)).unwrap())
        });
    for c in GRANTEES {
        let pool = env.pool(c).await;
        check_privileges(&pool, &env.schema, c)
            .await
            .unwrap_or_else(|e| panic!("{c}: {e}"));
    }
    let first = acl_snapshot(&env).await;
    plan.apply_grants(&env.admin).await.unwrap();
    assert_eq!(
        acl_snapshot(&env).await,
        first,
        "a second run changed grants"
    );

    // Privileges beyond the decisions (granted by hand) are taken away by the next run.
    let relay = env.role(Component::Relay);
    let reader = env.role(Component::Reader);
    env.exec(&format!(
        "GRANT INSERT ON {{s}}.events TO \"{relay}\"; GRANT SELECT ON {{s}}.inbox TO \"{relay}\"; \
         GRANT SELECT (payload) ON {{s}}.events TO \"{reader}\""
    ))
    .await;
    assert_ne!(acl_snapshot(&env).await, first);
    plan.apply_grants(&env.admin).await.unwrap();
    assert_eq!(acl_snapshot(&env).await, first, "hand-made grants survived");

    // Run by a role that does not own the objects: refused (its GRANTs would only warn).
    let reader_pool = env.pool(Component::Reader).await;
    let e = plan.apply_grants(&reader_pool).await.unwrap_err();
    assert!(
        matches!(&e, RolesError::NotOwner { role, .. } if *role == reader),
        "{e}"
    );
    // A role that does not exist, and a superuser (no grant limits it), are refused.
    let ghost = RoleName::new(&format!("r_{}_ghost", env.id)).unwrap();
    let e = RolePlan::new(env.schema.clone())
        .with_role(Component::Relay, ghost)
        .apply_grants(&env.admin)
        .await
        .unwrap_err();
    assert!(matches!(e, RolesError::UnknownRoles { .. }), "{e}");
    let e = RolePlan::new(env.schema.clone())
        .with_role(Component::Relay, RoleName::new("postgres").unwrap())
        .apply_grants(&env.admin)
        .await
        .unwrap_err();
    assert!(matches!(e, RolesError::OwnerAsComponent { .. }), "{e}");
    assert_eq!(
        acl_snapshot(&env).await,
        first,
        "a refused run changed grants"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn the_migrator_owns_migrates_and_grants_and_nothing_else() {
    let mut env = Env::new().await;
    let migrator = env.login("migrator").await;
    let fresh = Schema::new(&format!("v_{}", env.id)).unwrap();
    let newcomer = env.roles.name("new");
    env.roles.adopt(&newcomer);
    let plan = RolePlan::new(fresh.clone())
        .with_role(Component::Migrator, migrator.clone())
        .with_role(
            Component::Relay,
            RoleName::new(&env.role(Component::Relay)).unwrap(),
        )
        .with_role(Component::Reader, RoleName::new(&newcomer).unwrap());

    // The superuser's one-time set-up: the missing role is created NOLOGIN, the schema
    // belongs to the migrator. A second run changes nothing.
    let report = plan.apply_bootstrap(&env.admin).await.unwrap();
    assert_eq!(report.created, vec![newcomer.clone()]);
    let can_login: bool =
        sqlx::query_scalar("SELECT rolcanlogin FROM pg_catalog.pg_roles WHERE rolname = $1")
            .bind(&newcomer)
            .fetch_one(&env.admin)
            .await
            .unwrap();
    assert!(!can_login);
    assert!(
        plan.apply_bootstrap(&env.admin)
            .await
            .unwrap()
            .created
            .is_empty()
    );

    // The migrator migrates its schema and grants the others.
    let m = env.pool_as(migrator.as_str()).await;
    let report = migrate(&m, &fresh).await.unwrap();
    let every: Vec<i32> = outbox_postgres::migrate::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(report.applied, every);
    assert!(migrate(&m, &fresh).await.unwrap().applied.is_empty());
    plan.apply_grants(&m).await.unwrap();
    let relay = env.pool(Component::Relay).await;
    check_privileges(&relay, &fresh, Component::Relay)
        .await
        .unwrap();
    check_privileges(&m, &fresh, Component::Migrator)
        .await
        .unwrap();
    let e = check_privileges(&relay, &fresh, Component::Migrator)
        .await
        .unwrap_err();
    assert!(matches!(e, RolesError::NotOwner { .. }), "{e}");
    // The bootstrap is a superuser's: anyone else is refused, and told so.
    let e = plan.apply_bootstrap(&relay).await.unwrap_err();
    assert!(matches!(e, RolesError::BootstrapDenied { .. }), "{e}");
    assert!(e.to_string().contains("as a superuser"), "{e}");
    let owners: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT pg_catalog.pg_get_userbyid(c.relowner)::text FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1",
    )
    .bind(fresh.as_str())
    .fetch_all(&env.admin)
    .await
    .unwrap();
    assert_eq!(owners, vec![migrator.to_string()]);

    // Forbidden: a schema it does not own. Reported as a permission error naming the role,
    // not as a schema to migrate.
    let e = migrate(&m, &env.schema).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, MigrateError::PermissionDenied(_)), "{text}");
    assert!(
        text.starts_with("permission denied")
            && text.contains(&format!("role `{migrator}`"))
            && text.contains("not the migrator")
            && !text.contains("run `outbox migrate`"),
        "{text}"
    );

    // Adopting a schema a superuser migrated: the bootstrap hands every object over, and the
    // migrator can then grant there (and migrate, with nothing to do).
    RolePlan::new(env.other.clone())
        .with_role(Component::Migrator, migrator.clone())
        .apply_bootstrap(&env.admin)
        .await
        .unwrap();
    assert!(migrate(&m, &env.other).await.unwrap().applied.is_empty());
    RolePlan::new(env.other.clone())
        .with_role(
            Component::Relay,
            RoleName::new(&env.role(Component::Relay)).unwrap(),
        )
        .apply_grants(&m)
        .await
        .unwrap();
    check_privileges(&relay, &env.other, Component::Relay)
        .await
        .unwrap();

    env.exec(&format!("DROP SCHEMA \"{fresh}\" CASCADE")).await;
    env.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// The components under their roles

#[tokio::test]
async fn the_producer_enqueues_allocates_versions_and_replays_requests() {
    let mut env = Env::new().await;
    let pool = env
        .business_table(
            Component::Producer,
            "payments",
            "id text PRIMARY KEY, amount bigint NOT NULL",
        )
        .await;
    let producer = env.role(Component::Producer);
    outbox_postgres::check_schema(&pool, &env.schema)
        .await
        .unwrap();
    let outbox = PgOutbox::new(env.schema.clone());
    let request = Fingerprint::of(b"CreatePayment pay-1 250");

    let mut tx = pool.begin().await.unwrap();
    let begin = outbox
        .idempotency_begin(&mut tx, "payments", "key-1", request)
        .await
        .unwrap();
    assert_eq!(begin, IdempotencyBegin::New);
    sqlx::query(AssertSqlSafe(
        env.render("INSERT INTO {b}.payments VALUES ('pay-1', 250)"),
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    let v = outbox
        .next_aggregate_version(&mut *tx, "payment", "pay-1")
        .await
        .unwrap();
    assert_eq!(v, 1);
    outbox.enqueue(&mut *tx, &msg("pay-1", v)).await.unwrap();
    outbox
        .enqueue_batch(&mut *tx, &[msg("pay-2", 1), msg("pay-2", 2)])
        .await
        .unwrap();
    outbox
        .idempotency_complete(
            &mut tx,
            "payments",
            "key-1",
            &serde_json::json!({"id": "pay-1"}),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    outbox.notify_relays(&pool).await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    let again = outbox
        .idempotency_begin(&mut tx, "payments", "key-1", request)
        .await
        .unwrap();
    assert_eq!(
        again,
        IdempotencyBegin::Replay(serde_json::json!({"id": "pay-1"}))
    );
    assert_eq!(
        outbox
            .next_aggregate_version(&mut *tx, "payment", "pay-1")
            .await
            .unwrap(),
        2
    );
    tx.rollback().await.unwrap();
    assert_eq!(env.count("SELECT count(*) FROM {s}.events").await, 3);

    // Forbidden: reading intents, writing the relay's columns, changing or deleting intents,
    // anything of the consumer side.
    for sql in [
        "SELECT payload FROM {s}.events",
        "INSERT INTO {s}.events (event_id, aggregate_type, aggregate_id, aggregate_version, \
         event_type, payload, state) VALUES (gen_random_uuid(), 'payment', 'x', 1, 'T', '\\x00', 'published')",
        "UPDATE {s}.events SET payload = '\\x00'",
        "DELETE FROM {s}.events",
        "SELECT count(*) FROM {s}.inbox",
        "INSERT INTO {s}.leases VALUES ('payment', 'x', 1, now())",
    ] {
        env.denied(&pool, sql).await;
    }
    // Reported as such: where the role has no grants, enqueue says which grants it needs.
    let mut tx = pool.begin().await.unwrap();
    let e = PgOutbox::new(env.other.clone())
        .enqueue(&mut *tx, &msg("pay-3", 1))
        .await
        .unwrap_err();
    assert!(matches!(e, EnqueueError::PermissionDenied(_)), "{e}");
    assert!(
        e.to_string().starts_with("permission denied")
            && e.to_string().contains("needs the producer grants"),
        "{e}"
    );
    tx.rollback().await.unwrap();

    // Deleting the rows in the transaction (CDC relay) needs what docs/security.md names on
    // top of the generated grants: refused without, written (and gone) with.
    let deleting = PgOutbox::new(env.schema.clone()).delete_in_transaction(true);
    let mut tx = pool.begin().await.unwrap();
    let e = deleting
        .enqueue(&mut *tx, &msg("pay-4", 1))
        .await
        .unwrap_err();
    assert!(matches!(e, EnqueueError::PermissionDenied(_)), "{e}");
    tx.rollback().await.unwrap();
    env.exec(&format!(
        "GRANT DELETE, SELECT (event_id) ON {{s}}.events TO \"{producer}\""
    ))
    .await;
    let mut tx = pool.begin().await.unwrap();
    deleting.enqueue(&mut *tx, &msg("pay-4", 1)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(env.count("SELECT count(*) FROM {s}.events").await, 3);
    env.cleanup().await;
}

#[tokio::test]
async fn the_relay_publishes_wakes_on_notify_and_reaps_leases() {
    let mut env = Env::new().await;
    let admin_outbox = PgOutbox::new(env.schema.clone());
    admin_outbox
        .enqueue_batch(
            &env.admin,
            &[msg("a", 1), msg("a", 2), msg("b", 1), msg("poison", 1)],
        )
        .await
        .unwrap();
    let pool = env.pool(Component::Relay).await;
    let relay_store = Arc::new(store(&pool, &env.schema));
    relay_store.check().await.unwrap();
    let transport = Arc::new(FakeTransport::new().fail("poison", 1, PublishErrorKind::TooLarge, 1));
    let relay = Arc::new(
        Relay::new(
            Arc::clone(&relay_store),
            Arc::clone(&transport),
            RelayConfig {
                workers: 1,
                lease: Duration::from_secs(30),
                publish_timeout: Duration::from_secs(5),
                // Only a NOTIFY can wake it within the test's waits.
                poll_interval: Duration::from_secs(600),
                stats_interval: Duration::from_millis(200),
                ..RelayConfig::default()
            },
        )
        .unwrap(),
    );
    let stop = CancellationToken::new();
    let running = tokio::spawn(Arc::clone(&relay).run(stop.clone()));

    wait::until(
        "the backlog published and the poison dead",
        WITHIN,
        async || {
            let dead = env
                .count("SELECT count(*) FROM {s}.events WHERE state = 'dead'")
                .await;
            Ok((transport.acked().len() == 3 && dead == 1).then_some(()))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        env.count("SELECT count(*) FROM {s}.events").await,
        1,
        "published rows are deleted, the dead letter stays"
    );

    // LISTEN under the relay's role: once its listener is up, a producer's NOTIFY is the only
    // thing that can bring the next event out before the 10-minute poll.
    let relay_role = env.role(Component::Relay);
    wait::until("the relay listens", WITHIN, async || {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity \
             WHERE usename = $1 AND query ILIKE 'LISTEN%'",
        )
        .bind(&relay_role)
        .fetch_one(&env.admin)
        .await?;
        Ok((n > 0).then_some(()))
    })
    .await
    .unwrap();
    let producer = env.pool(Component::Producer).await;
    let outbox = PgOutbox::new(env.schema.clone());
    outbox.enqueue(&producer, &msg("c", 1)).await.unwrap();
    outbox.notify_relays(&producer).await.unwrap();
    wait::until("the woken relay published c", WITHIN, async || {
        Ok((transport.acked_for("c") == vec![1]).then_some(()))
    })
    .await
    .unwrap();
    stop.cancel();
    running.await.unwrap();

    // Lease reaping, as `outbox relay` runs it: by the relay's own role.
    env.exec("INSERT INTO {s}.leases VALUES ('payment', 'crashed', 7, now() - interval '1 hour')")
        .await;
    let reaper = Maintainer::<PgStore>::new(
        Arc::clone(&relay_store),
        MaintenanceConfig {
            lease_reap_after: Some(Duration::from_secs(600)),
            ..MaintenanceConfig::default()
        },
    )
    .unwrap();
    let report = reaper.round_once().await.unwrap().expect("elected");
    assert_eq!(report.leases, 1);

    // Forbidden: writing intents or payloads, business data, the consumer side.
    env.exec(&format!(
        "CREATE TABLE {{b}}.payments (id text); GRANT USAGE ON SCHEMA {{b}} TO \"{}\"",
        env.role(Component::Producer)
    ))
    .await;
    for sql in [
        "INSERT INTO {s}.events (event_id, aggregate_type, aggregate_id, aggregate_version, \
         event_type, payload) VALUES (gen_random_uuid(), 'payment', 'x', 9, 'T', '\\x00')",
        "UPDATE {s}.events SET payload = '\\x00'",
        "SELECT count(*) FROM {s}.inbox",
        "SELECT count(*) FROM {s}.work_items",
        "INSERT INTO {s}.aggregate_versions VALUES ('payment', 'x', 1)",
        "INSERT INTO {b}.payments VALUES ('x')",
    ] {
        env.denied(&pool, sql).await;
    }
    // Reported as such, naming the role and its grants.
    let e = store(&pool, &env.other)
        .claim_batch(ClaimParams {
            max_rows: 10,
            max_per_aggregate: 10,
            lease: Duration::from_secs(30),
            scope: Default::default(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::PermissionDenied, "{e}");
    assert!(
        e.to_string()
            .contains(&format!("role `{relay_role}` needs the relay grants")),
        "{e}"
    );

    // Its heartbeat writes, under the relay's own grants, and records its stop.
    beat_briefly(env.heartbeat(
        &pool,
        outbox_postgres::heartbeat::InstanceKind::Relay,
        "polling",
    ))
    .await;
    // And the levels its gauges read.
    record_level(&pool, &env.schema, ActivityKind::DeadLetters, "outbox", 2).await;
    record_level(&pool, &env.schema, ActivityKind::DeadLetters, "outbox", 1).await;
    assert_eq!(
        env.count("SELECT max(count) FROM {s}.activity WHERE kind = 'dead_letters'")
            .await,
        2
    );
    assert_eq!(
        env.count(
            "SELECT count(*) FROM {s}.instances WHERE stopped_at IS NOT NULL AND kind = 'relay'"
        )
        .await,
        1
    );
    env.cleanup().await;
}

/// Records one level reading as a heartbeat does, on `pool` (a component's role).
async fn record_level(pool: &PgPool, schema: &Schema, kind: ActivityKind, name: &str, value: i64) {
    use outbox_core::heartbeat::{ActivityEntry, HeartbeatStore};
    let level = ActivityEntry {
        kind,
        name: name.to_owned(),
        value,
    };
    store(pool, schema)
        .add_activity(vec![level])
        .await
        .expect("a level recorded under the role's grants");
}

/// Runs `beat` for 350 ms (a few beats), then stops it, which records the stop.
async fn beat_briefly(beat: outbox_postgres::heartbeat::Heartbeat) {
    let stop = CancellationToken::new();
    let task = tokio::spawn(beat.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(350)).await;
    stop.cancel();
    task.await.unwrap();
}

/// Writes one ledger row per event (a business table the test grants), and a payout work item
/// for `pay-*` aggregates; `poison` fails permanently until `heal` is set.
struct Ledger {
    business: String,
    effects: PgEffects,
    heal: Arc<AtomicBool>,
}

impl Handler<sqlx::PgConnection> for Ledger {
    async fn handle(
        &self,
        tx: &mut sqlx::PgConnection,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        if event.aggregate_id == "poison" && !self.heal.load(Ordering::SeqCst) {
            return Err(HandlerError::permanent("poison"));
        }
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{}\".ledger (event_id, aggregate_id) VALUES ($1, $2)",
            self.business
        )))
        .bind(event.event_id)
        .bind(&event.aggregate_id)
        .execute(&mut *tx)
        .await
        .map_err(HandlerError::transient)?;
        if event.aggregate_id.starts_with("pay-") {
            let item = NewWorkItem::for_event(
                "payout",
                "ledger",
                event.event_id,
                serde_json::json!({"to": event.aggregate_id}),
            );
            self.effects
                .enqueue(tx, &item)
                .await
                .map_err(HandlerError::transient)?;
        }
        Ok(())
    }
}

#[tokio::test]
async fn the_consumer_applies_dedups_records_conflicts_and_dead_letters() {
    let mut env = Env::new().await;
    let pool = env
        .business_table(
            Component::Consumer,
            "ledger",
            "event_id uuid PRIMARY KEY, aggregate_id text NOT NULL",
        )
        .await;
    let consumer_role = env.role(Component::Consumer);
    let source = FakeSource::new();
    let (p1, p2, poison) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    source.push_message(&event_message(p1, "pay-1", 1, r#"{"n":1}"#));
    source.push_message(&event_message(p2, "pay-2", 1, r#"{"n":2}"#));
    source.push_message(&event_message(poison, "poison", 1, r#"{"n":3}"#));
    source.push_message(&event_message(p1, "pay-1", 1, r#"{"n":1}"#)); // redelivery
    source.push_message(&event_message(p2, "pay-2", 1, r#"{"n":99}"#)); // same id, other payload
    let heal = Arc::new(AtomicBool::new(false));
    let mut consumer = PgConsumer::new(
        store(&pool, &env.schema),
        source.clone(),
        Ledger {
            business: env.business.clone(),
            effects: PgEffects::new(env.schema.clone()),
            heal: Arc::clone(&heal),
        },
        ConsumerConfig {
            ordering: OrderingGuard::Wait,
            batch_wait: Duration::from_millis(10),
            ..ConsumerConfig::new("ledger")
        },
    )
    .expect("valid consumer config");
    wait::until("five deliveries settled", WITHIN, async || {
        consumer.run_batch().await?;
        Ok((source.acked() == 5).then_some(()))
    })
    .await
    .unwrap();
    assert_eq!(env.count("SELECT count(*) FROM {b}.ledger").await, 2);
    assert_eq!(env.count("SELECT count(*) FROM {s}.work_items").await, 2);
    assert_eq!(
        env.count("SELECT count(*) FROM {s}.inbox_conflicts").await,
        1
    );
    assert_eq!(
        env.count("SELECT count(*) FROM {s}.consumer_dead_letters WHERE state = 'dead'")
            .await,
        1
    );
    // Whether it is paused, and its heartbeat with its own numbers, under its own grants.
    assert!(
        !store(&pool, &env.schema)
            .consumer_paused("ledger")
            .await
            .unwrap()
    );
    beat_briefly(
        env.heartbeat(
            &pool,
            outbox_postgres::heartbeat::InstanceKind::Consumer,
            "ledger",
        )
        .with_consumer(consumer.stats()),
    )
    .await;
    assert_eq!(
        env.count(
            "SELECT count(*) FROM {s}.activity WHERE kind = 'consume' AND name = 'ledger' \
             AND count = 2"
        )
        .await,
        1,
        "its two effects, in this minute's row"
    );
    // Its lag, a level: this minute's row keeps the highest reading, under its own grants (a
    // minute turning between two readings splits them over two rows: the highest is still 9).
    for lag in [3, 9, 4] {
        record_level(&pool, &env.schema, ActivityKind::Lag, "ledger", lag).await;
    }
    assert_eq!(
        env.count("SELECT max(count) FROM {s}.activity WHERE kind = 'lag' AND name = 'ledger'")
            .await,
        9
    );
    assert_eq!(
        env.count(
            "SELECT count(*) FROM {s}.instances WHERE name = 'ledger' \
             AND stats ->> 'processed' = '2' AND stopped_at IS NOT NULL"
        )
        .await,
        1
    );

    // The operator requeues the dead letter; the consumer applies it under its own role.
    let operator = env.pool(Component::Operator).await;
    let n = store(&operator, &env.schema)
        .requeue_consumer_dead_letters(
            &ConsumerSelection {
                consumer: Some("ledger".into()),
                ..Default::default()
            },
            &Actor::new("alice", "test").unwrap(),
            "healed",
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    heal.store(true, Ordering::SeqCst);
    assert_eq!(consumer.process_requeued().await.unwrap(), 1);
    assert_eq!(env.count("SELECT count(*) FROM {b}.ledger").await, 3);
    assert_eq!(
        env.count("SELECT count(*) FROM {s}.consumer_dead_letters WHERE state = 'resolved'")
            .await,
        1
    );

    // Forbidden: the outbox's relay columns and intents, other items' payloads, retention.
    for sql in [
        "UPDATE {s}.events SET state = 'published'",
        "SELECT count(*) FROM {s}.events",
        "SELECT payload FROM {s}.work_items",
        "UPDATE {s}.work_items SET state = 'succeeded'",
        "DELETE FROM {s}.inbox",
        "DELETE FROM {s}.work_items",
    ] {
        env.denied(&pool, sql).await;
    }
    // Reported as such: the relay's grants are not the consumer's.
    let e = check_privileges(&pool, &env.schema, Component::Relay)
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("permission denied: role `{consumer_role}` lacks"))
            && text.contains("UPDATE (state, attempts, available_at, last_error, published_at)")
            && text.contains("needs the relay grants"),
        "{text}"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn the_executor_calls_and_records_work_items() {
    let mut env = Env::new().await;
    let consumer = env.pool(Component::Consumer).await;
    let effects = PgEffects::new(env.schema.clone());
    let mut tx = consumer.begin().await.unwrap();
    for n in 0..2 {
        let item = NewWorkItem::for_event(
            "payout",
            "ledger",
            Uuid::now_v7(),
            serde_json::json!({ "n": n }),
        );
        let out = effects.enqueue(&mut tx, &item).await.unwrap();
        assert!(matches!(out, EnqueueOutcome::Inserted { .. }));
        // A redelivery finds it by key without reading its payload.
        let again = effects.enqueue(&mut tx, &item).await.unwrap();
        assert!(matches!(again, EnqueueOutcome::AlreadyPresent { .. }));
    }
    tx.commit().await.unwrap();

    let pool = env.pool(Component::Executor).await;
    let executor = Executor::new(
        store(&pool, &env.schema),
        FakeProvider::new(CallMode::Succeed),
        ExecutorConfig::new("payout"),
    )
    .unwrap();
    wait::until("both items succeeded", WITHIN, async || {
        executor.run_once().await?;
        let done = env
            .count("SELECT count(*) FROM {s}.work_items WHERE state = 'succeeded'")
            .await;
        Ok((done == 2).then_some(()))
    })
    .await
    .unwrap();

    // Forbidden: creating, deleting or rewriting work, reading the inbox.
    for sql in [
        "INSERT INTO {s}.work_items (kind, idempotency_key, payload) VALUES ('payout', 'k', '{}')",
        "DELETE FROM {s}.work_items",
        "UPDATE {s}.work_items SET payload = '{}'",
        "UPDATE {s}.work_items SET idempotency_key = 'other'",
        "SELECT count(*) FROM {s}.inbox",
    ] {
        env.denied(&pool, sql).await;
    }
    let e = store(&pool, &env.other)
        .work_item_backlog(None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("needs the executor grants"), "{e}");
    env.cleanup().await;
}

#[tokio::test]
async fn the_maintainer_purges_without_reading() {
    let mut env = Env::new().await;
    env.exec(
        "INSERT INTO {s}.inbox (consumer_name, event_id, payload_sha256, aggregate_type, \
         aggregate_id, aggregate_version, event_type, received_at) VALUES \
         ('c', gen_random_uuid(), '\\x00', 'payment', 'a', 1, 'T', now() - interval '30 days'), \
         ('c', gen_random_uuid(), '\\x00', 'payment', 'b', 1, 'T', now()); \
         INSERT INTO {s}.work_items (kind, idempotency_key, payload, state, resolved_at) VALUES \
         ('payout', 'old', '{}', 'succeeded', now() - interval '30 days'), \
         ('payout', 'new', '{}', 'succeeded', now()); \
         INSERT INTO {s}.leases VALUES ('payment', 'crashed', 1, now() - interval '1 hour'); \
         INSERT INTO {s}.events (event_id, aggregate_type, aggregate_id, aggregate_version, \
           event_type, payload, state, published_at) VALUES \
         (gen_random_uuid(), 'payment', 'p', 1, 'T', '\\x7b7d', 'published', now() - interval '30 days'), \
         (gen_random_uuid(), 'payment', 'p', 2, 'T', '\\x7b7d', 'published', now()), \
         (gen_random_uuid(), 'payment', 'p', 3, 'T', '\\x7b7d', 'pending', NULL); \
         UPDATE {s}.retention_marks SET through = now() - interval '40 days'",
    )
    .await;
    let pool = env.pool(Component::Maintainer).await;
    let maintainer = Maintainer::<PgStore>::new(
        store(&pool, &env.schema),
        MaintenanceConfig {
            inbox: Some(outbox_core::maintenance::InboxRetention {
                keep: Duration::from_secs(7 * 86_400),
                horizon: outbox_core::maintenance::ReplayHorizon {
                    broker_retention: Duration::from_secs(86_400),
                    outbox_retention: Duration::from_secs(86_400),
                    dead_letter_requeue_window: Duration::ZERO,
                },
            }),
            work_items_keep: Some(Duration::from_secs(86_400)),
            published_keep: Some(Duration::from_secs(86_400)),
            lease_reap_after: Some(Duration::from_secs(600)),
            ..MaintenanceConfig::default()
        },
    )
    .unwrap();
    let r = maintainer.round_once().await.unwrap().expect("elected");
    assert_eq!((r.inbox, r.work_items, r.published, r.leases), (1, 1, 1, 1));
    assert_eq!(
        env.count("SELECT count(*) FROM {s}.events WHERE aggregate_version > 1")
            .await,
        2,
        "the young published row and the pending one stay"
    );
    assert_eq!(
        env.count(
            "SELECT count(*) FROM {s}.retention_marks WHERE what = 'published' \
             AND through > now() - interval '1 hour'"
        )
        .await,
        1,
        "the purge raised the replay horizon (set back 40 days) to the write time it deleted"
    );

    // Mark mode's retention deletes events by ctid; it reads no event beyond its state and
    // publication time, and changes none.
    for sql in [
        "SELECT event_id FROM {s}.inbox",
        "SELECT payload FROM {s}.work_items",
        "UPDATE {s}.work_items SET state = 'pending'",
        "SELECT payload FROM {s}.events",
        "SELECT event_id FROM {s}.events",
        "UPDATE {s}.events SET state = 'pending'",
        "INSERT INTO {s}.events (event_id) VALUES (gen_random_uuid())",
        "DELETE FROM {s}.consumer_dead_letters",
    ] {
        env.denied(&pool, sql).await;
    }
    env.cleanup().await;
}

#[tokio::test]
async fn the_reader_reads_and_only_the_operator_writes() {
    let mut env = Env::new().await;
    PgOutbox::new(env.schema.clone())
        .enqueue(&env.admin, &msg("a", 1))
        .await
        .unwrap();
    env.exec(
        "UPDATE {s}.events SET state = 'dead', last_error = 'test'; \
         INSERT INTO {s}.work_items (kind, idempotency_key, payload, state, unknown_since) \
         VALUES ('payout', 'k', '{}', 'unknown', now())",
    )
    .await;
    let reader = env.pool(Component::Reader).await;
    let reader_store = store(&reader, &env.schema);
    reader_store.check().await.unwrap();
    assert_eq!(reader_store.stats().await.unwrap().dead, 1);
    let effects = PgEffects::new(env.schema.clone());
    assert_eq!(effects.stats(&reader, None).await.unwrap().unknown, 1);
    let id = effects.list(&reader, None, 10).await.unwrap()[0].id;
    for sql in [
        "SELECT payload FROM {s}.events",
        "SELECT headers FROM {s}.events",
    ] {
        env.denied(&reader, sql).await;
    }

    // The reader's writes are refused, each saying which grants it needs.
    let reader_role = env.role(Component::Reader);
    let e = reader_store
        .requeue_dead_letters(
            &DeadLetterSelection::All,
            &Actor::new("reader", "test").unwrap(),
            "test",
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::PermissionDenied, "{e}");
    assert!(
        e.to_string()
            .contains(&format!("role `{reader_role}` needs the operator grants")),
        "{e}"
    );
    let e = effects
        .resolve(&reader, id, Resolution::Resend)
        .await
        .unwrap_err();
    assert!(matches!(e, EffectsError::PermissionDenied(_)), "{e}");
    assert!(e.to_string().contains("needs the operator grants"), "{e}");

    // The operator's are not.
    let operator = env.pool(Component::Operator).await;
    let n = store(&operator, &env.schema)
        .requeue_dead_letters(
            &DeadLetterSelection::All,
            &Actor::new("operator", "test").unwrap(),
            "test",
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    let item = effects
        .resolve(&operator, id, Resolution::Resend)
        .await
        .unwrap();
    assert_eq!(item.state, "pending");

    // Through the admin module (the CLI's and the console's): the reader traces and reads the
    // audit, but reads no payload and discards nothing; the operator does both, and its
    // record names the operator's database role.
    PgOutbox::new(env.schema.clone())
        .enqueue(&env.admin, &msg("b", 1))
        .await
        .unwrap();
    env.exec("UPDATE {s}.events SET state = 'dead', last_error = 'test' WHERE aggregate_id = 'b'")
        .await;
    let dead: Uuid = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT event_id FROM {}.events WHERE aggregate_id = 'b'",
        env.schema.as_str()
    )))
    .fetch_one(&env.admin)
    .await
    .unwrap();
    let who = Actor::new("tester", "roles test").unwrap();
    let as_reader = store(&reader, &env.schema);
    assert_eq!(
        as_reader
            .trace_event(dead)
            .await
            .unwrap()
            .outbox
            .unwrap()
            .state,
        "dead"
    );
    // The reader reads the audit: one record, the operator's requeue above.
    let audit = as_reader.audit(None, 10).await.unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(audit[0].action, "requeue dead letters");
    let e = as_reader.dead_letter(dead).await.unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::PermissionDenied, "{e}");
    assert!(e.message.contains("needs the operator grants"), "{e}");
    let e = as_reader
        .discard_dead_letters(&DeadLetterSelection::All, &who, "test")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::PermissionDenied, "{e}");
    let as_operator = store(&operator, &env.schema);
    let detail = as_operator.dead_letter(dead).await.unwrap();
    assert!(detail.payload.text.unwrap().contains(r#""agg":"b""#));
    let d = as_operator
        .discard_dead_letters(&DeadLetterSelection::Ids(vec![dead]), &who, "test")
        .await
        .unwrap();
    assert_eq!(d.discarded, 1);
    let audit = as_reader.audit(None, 10).await.unwrap();
    assert_eq!(audit.len(), 2, "the requeue and the discard");
    assert_eq!(audit[0].action, "discard dead letters");
    assert_eq!(audit[0].db_role, env.role(Component::Operator).as_str());
    assert_eq!(
        (audit[0].actor.as_str(), audit[0].via.as_str()),
        ("tester", "roles test")
    );

    // Every other action under the operator's grants (PostgreSQL checks what each statement
    // touches even when no row matches), each with its record.
    let by_reason = DeadLetterSelection::Matching(outbox_core::operator::DeadLetterFilter {
        reason_group: Some("test".into()),
        ..Default::default()
    });
    as_operator
        .requeue_dead_letters(&by_reason, &who, "t")
        .await
        .unwrap();
    let all_consumers = outbox_core::operator::ConsumerSelection::default();
    as_operator
        .requeue_consumer_dead_letters(&all_consumers, &who, "t")
        .await
        .unwrap();
    as_operator
        .discard_consumer_dead_letters(&all_consumers, &who, "t")
        .await
        .unwrap();
    let e = as_operator
        .reconcile_work_item(id, &who, "t")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::Refused, "{e}");
    // A replay (mark mode): locks, reads leases and heartbeats, updates the delivery columns.
    PgOutbox::new(env.schema.clone())
        .enqueue(&env.admin, &msg("c", 1))
        .await
        .unwrap();
    env.exec(
        "UPDATE {s}.events SET state = 'published', published_at = now() - interval '1 hour' \
         WHERE aggregate_id = 'c'",
    )
    .await;
    let mark = PgStore::new(
        operator.clone(),
        PgStoreConfig {
            schema: env.schema.clone(),
            on_publish: outbox_postgres::OnPublish::Mark,
        },
    );
    let replayed = mark
        .replay(
            &outbox_core::operator::ReplaySelection {
                aggregate_type: "payment".into(),
                aggregate_id: "c".into(),
                from_version: None,
            },
            false,
            Some(1),
            &who,
            "t",
        )
        .await
        .unwrap();
    assert_eq!(replayed.events, 1);
    assert_eq!(
        env.count(
            "SELECT count(*) FROM {s}.events WHERE aggregate_id = 'c' AND state = 'pending' \
             AND published_at < now() - interval '59 minutes'"
        )
        .await,
        1,
        "pending again, its first publish time kept"
    );
    // Pause and resume: the reader may list pauses but not pause; the operator may.
    let route = outbox_core::operator::PauseTarget::destination("audit");
    let e = as_reader.pause(&route, &who, "t").await.unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::PermissionDenied, "{e}");
    as_operator.pause(&route, &who, "t").await.unwrap();
    assert_eq!(as_reader.pauses().await.unwrap().len(), 1);
    as_operator.resume(&route, &who, "t").await.unwrap();
    // Resolving a conflict: the reader may list conflicts but not resolve them.
    env.exec(
        "INSERT INTO {s}.inbox_conflicts (consumer_name, event_id, stored_sha256, \
         received_sha256, aggregate_type, aggregate_id, aggregate_version, event_type, payload) \
         VALUES ('ledger', gen_random_uuid(), sha256('a'), sha256('b'), 'payment', 'd', 1, \
         'PaymentCaptured', '\\x00')",
    )
    .await;
    let conflict = as_reader.conflicts(ConflictFilter::OPEN, 10).await.unwrap()[0].id;
    let e = as_reader
        .resolve_conflicts(&[conflict], &who, "t")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::PermissionDenied, "{e}");
    let r = as_operator
        .resolve_conflicts(&[conflict], &who, "t")
        .await
        .unwrap();
    assert_eq!(r.resolved, 1);
    assert!(
        as_reader
            .conflicts(ConflictFilter::OPEN, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(as_reader.audit(None, 10).await.unwrap().len(), 9);
    env.cleanup().await;
}

#[tokio::test]
async fn a_role_without_grants_is_told_so_not_to_migrate() {
    let mut env = Env::new().await;
    let nobody = env.login("nobody").await;
    let pool = env.pool_as(nobody.as_str()).await;
    let e = outbox_postgres::check_schema(&pool, &env.schema)
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, MigrateError::PermissionDenied(_)), "{text}");
    assert!(
        text.starts_with("permission denied for schema")
            && text.contains(&format!("role `{nobody}`"))
            && text.contains("run `outbox roles apply` as the migrator")
            && !text.contains("outbox migrate"),
        "{text}"
    );
    let e = store(&pool, &env.schema).check().await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::PermissionDenied, "{e}");
    // The consumer engine's statements name the consumer's grants.
    let e = outbox_core::consumer::InboxStore::consumer_dead_letter_count(
        &store(&pool, &env.schema),
        "c",
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::PermissionDenied, "{e}");
    assert!(
        e.to_string()
            .contains(&format!("role `{nobody}` needs the consumer grants")),
        "{e}"
    );
    // The check lists exactly what the role lacks.
    let e = check_privileges(&pool, &env.schema, Component::Maintainer)
        .await
        .unwrap_err();
    match e {
        RolesError::Missing { missing, .. } => assert_eq!(
            missing,
            vec![
                format!("USAGE ON SCHEMA \"{}\"", env.schema),
                format!("SELECT ON TABLE \"{}\".\"schema_migrations\"", env.schema),
                format!(
                    "SELECT (ctid, state, published_at, created_at) ON TABLE \"{}\".\"events\"",
                    env.schema
                ),
                format!("DELETE ON TABLE \"{}\".\"events\"", env.schema),
                format!(
                    "SELECT (ctid, lease_until, takeovers) ON TABLE \"{}\".\"leases\"",
                    env.schema
                ),
                format!("DELETE ON TABLE \"{}\".\"leases\"", env.schema),
                format!(
                    "SELECT (ctid, received_at) ON TABLE \"{}\".\"inbox\"",
                    env.schema
                ),
                format!("DELETE ON TABLE \"{}\".\"inbox\"", env.schema),
                format!(
                    "SELECT (id, state, resolved_at) ON TABLE \"{}\".\"work_items\"",
                    env.schema
                ),
                format!(
                    "UPDATE (updated_at) ON TABLE \"{}\".\"work_items\"",
                    env.schema
                ),
                format!("DELETE ON TABLE \"{}\".\"work_items\"", env.schema),
                format!("SELECT ON TABLE \"{}\".\"retention_marks\"", env.schema),
                format!("INSERT ON TABLE \"{}\".\"retention_marks\"", env.schema),
                format!(
                    "UPDATE (through) ON TABLE \"{}\".\"retention_marks\"",
                    env.schema
                ),
            ]
        ),
        other => panic!("{other}"),
    }
    env.cleanup().await;
}

/// The library's relay makes the binary's start-up check of its grants: under a role that may
/// only read, `PgRelay` refuses to start, naming the relay's missing grants, before it claims
/// anything.
#[tokio::test]
async fn a_relay_under_a_role_without_its_grants_refuses_to_start() {
    use outbox_core::relay::RelayConfig;
    use outbox_postgres::relay::{PgRelay, RelayError, RelayMode};
    let mut env = Env::new().await;
    let reader = env.pool(Component::Reader).await;
    let relay = PgRelay::new(
        store(&reader, &env.schema),
        RelayConfig::default(),
        RelayMode::Polling,
    );
    let e = relay.check().await.unwrap_err();
    let RelayError::Privileges(RolesError::Missing {
        role,
        component,
        missing,
    }) = &e
    else {
        panic!("not the missing grants: {e:?}");
    };
    assert_eq!(role, &env.role(Component::Reader));
    assert_eq!(*component, Component::Relay);
    assert!(
        missing.iter().any(|m| m.contains("leases")),
        "the relay's lease grants are named: {missing:?}"
    );
    env.cleanup().await;
}
