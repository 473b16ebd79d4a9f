//! Least privilege: one database role per component, each with exactly the grants the SQL of
//! that component needs, and nothing on the tables it has no business with.
//!
//! | component | runs | may |
//! |---|---|---|
//! | [`Component::Migrator`] | `outbox migrate`, the grants below | owns the schema and every table in it |
//! | [`Component::Producer`] | [`crate::PgOutbox`] (and plain-SQL producers) | insert producer columns of `events`; versions; request idempotency |
//! | [`Component::Relay`] | `outbox relay`, [`crate::PgStore`] as the relay's store | read `events`, write its delivery columns, delete published rows; leases |
//! | [`Component::Consumer`] | [`crate::PgConsumer`], [`crate::PgInbox`], [`crate::PgEffects::enqueue`] | inbox tables, consumer dead letters, insert work items; read pauses; its heartbeat and effects per minute |
//! | [`Component::Executor`] | `outbox effects run`, [`crate::PgExecutor`] | read work items, write their execution columns |
//! | [`Component::Maintainer`] | `outbox cleanup` | delete old inbox identities, settled work items, old published rows (mark mode, raising the replay horizon in `retention_marks`), expired leases |
//! | [`Component::Reader`] | `outbox status`, `… list`, `trace`, `audit`, the console's reads | read everything the CLI shows; no payloads of events, conflicts or consumer dead letters |
//! | [`Component::Operator`] | `dead-letters requeue|discard`, `consumer-dead-letters requeue|discard`, `replay`, `pause|resume`, `conflicts resolve`, `effects resolve`, the console's actions | the reader's reads plus those changes, each with its `audit` row; the payloads and headers of dead letters and conflicts, to judge them |
//!
//! Every table and sequence the migrations create has one entry in `OBJECTS` (`decisions.rs`):
//! what each component may do on it, a component not named getting nothing. A table a later
//! migration adds is one more entry; the integration test
//! `every_object_in_the_schema_has_a_grant_decision` fails until it exists.
//!
//! Two scripts come out of a [`RolePlan`]:
//!
//! * the **grants** ([`RolePlan::grant_script`], [`RolePlan::apply_grants`]), run by the
//!   migrator after every `outbox migrate`: each named role first loses every privilege in the
//!   schema, then gets exactly its components' grants, in one transaction. Re-running is
//!   harmless, and a release that narrows a grant takes it away.
//! * the **bootstrap** ([`RolePlan::bootstrap_script`], [`RolePlan::apply_bootstrap`]), run once
//!   by a superuser: missing roles are created `NOLOGIN`, the schema is created for (or handed
//!   to) the migrator together with every object already in it, and every role may `CONNECT`.
//!
//! A role that lacks a grant is told so ([`PermissionDenied`]), naming the role and the
//! component whose grants it needs; [`check_privileges`] lists exactly what is missing.

use std::collections::BTreeMap;
use std::fmt;

use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use crate::error::MigrateError;
use crate::migrate::{check_schema, current_version};
pub use crate::permission::{Component, PermissionDenied, pool_role};
use crate::schema::Schema;

mod check;
mod decisions;
mod plan;

pub use check::check_privileges;
use check::*;
pub use decisions::covered_objects;
use decisions::*;
pub use plan::{ApplyReport, BootstrapReport, RoleName, RolePlan};

/// Why a role operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RolesError {
    /// A role name was refused.
    #[error("invalid role name `{name}`: {reason}")]
    InvalidRole {
        /// The name.
        name: String,
        /// The rule it breaks.
        reason: String,
    },
    /// The bootstrap needs a migrator role.
    #[error("the bootstrap needs the migrator's role (--migrator)")]
    NoMigrator,
    /// A component's role owns objects in the schema (or is the migrator, or a superuser): its
    /// privileges cannot be limited.
    #[error(
        "role `{role}` cannot be the {component} role: it owns the schema's objects or is a superuser, and no grant limits an owner; use a role of its own"
    )]
    OwnerAsComponent {
        /// The role.
        role: String,
        /// The component it was named for.
        component: Component,
    },
    /// Named roles do not exist.
    #[error(
        "role(s) not found: {}; create them (`outbox roles apply --bootstrap` as a superuser creates them NOLOGIN) or name existing ones",
        .roles.iter().map(|(c, r)| format!("`{r}` ({c})")).collect::<Vec<_>>().join(", ")
    )]
    UnknownRoles {
        /// Component and role name of each missing role.
        roles: Vec<(Component, String)>,
    },
    /// The connected role does not own the schema's objects, so its GRANTs would not take.
    #[error(
        "role `{role}` does not own {} in schema `{schema}`: run `outbox roles apply` as the migrator, or `outbox roles apply --bootstrap` as a superuser to hand the objects to the migrator",
        .objects.join(", ")
    )]
    NotOwner {
        /// The connected role.
        role: String,
        /// The schema.
        schema: String,
        /// Objects it does not own.
        objects: Vec<String>,
    },
    /// A role lacks grants of its component.
    #[error("{}", PermissionDenied {
        detail: format!("permission denied: role `{role}` lacks {}", .missing.join(", ")),
        role: Some(.role.clone()),
        component: Some(*.component),
    })]
    Missing {
        /// The role.
        role: String,
        /// Its component.
        component: Component,
        /// Each missing grant as a GRANT fragment.
        missing: Vec<String>,
    },
    /// The bootstrap was refused: it creates roles and schemas and hands objects over.
    #[error(
        "{detail} (role `{role}` cannot run the bootstrap: run `outbox roles apply --bootstrap` as a superuser, or as a role with CREATEROLE that is a member of the migrator and may create schemas)"
    )]
    BootstrapDenied {
        /// The connected role.
        role: String,
        /// What the database said.
        detail: String,
    },
    /// The schema is missing, at another version, or unreadable for this role.
    #[error(transparent)]
    Schema(#[from] MigrateError),
    /// Database error.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> RolePlan {
        RolePlan::with_defaults(Schema::default()).unwrap()
    }

    #[test]
    fn role_names_are_checked() {
        for good in ["outbox_relay", "Relay-2", "svc@project.iam", "a"] {
            assert!(RoleName::new(good).is_ok(), "{good} refused");
        }
        for bad in [
            "",
            "public",
            "PUBLIC",
            "none",
            "current_user",
            "pg_read_all_data",
            "a\"b",
            "a b",
            "a;b",
            "a'b",
            "a$b",
            &"x".repeat(64),
        ] {
            assert!(RoleName::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn every_decision_names_each_column_once() {
        for o in OBJECTS {
            for c in Component::ALL {
                for p in o.of(c) {
                    if let Select(Only(cols)) | Insert(Only(cols)) | Update(Only(cols)) = p {
                        let mut sorted = cols.to_vec();
                        sorted.sort_unstable();
                        sorted.dedup();
                        assert_eq!(sorted.len(), cols.len(), "{} {c}: {cols:?}", o.name);
                    }
                    if o.kind == Kind::Sequence {
                        assert_eq!(p, Usage, "{} {c}", o.name);
                    } else {
                        assert_ne!(p, Usage, "{} {c}", o.name);
                    }
                }
            }
        }
    }

    #[test]
    fn the_relay_never_inserts_events_nor_touches_consumer_tables() {
        let relay = access_of(&[Component::Relay]);
        let on = |name: &str| relay.iter().find(|(o, _)| o.name == name).map(|(_, a)| a);
        assert_eq!(on("events").unwrap().insert, Merged::No);
        for t in [
            "inbox",
            "inbox_conflicts",
            "inbox_aggregates",
            "consumer_dead_letters",
            "work_items",
            "aggregate_versions",
            "idempotency_keys",
        ] {
            assert!(on(t).is_none(), "relay has access to {t}");
        }
    }

    #[test]
    fn the_operator_is_the_reader_plus_writes() {
        let reader = access_of(&[Component::Reader]);
        let operator = access_of(&[Component::Operator]);
        // The operator reads at least what the reader reads (and payloads of dead letters).
        for (o, r) in &reader {
            let (_, op) = operator.iter().find(|(p, _)| p.name == o.name).unwrap();
            let covers = match (&op.select, &r.select) {
                (_, Merged::No) | (Merged::Table, _) => true,
                (Merged::Some(op), Merged::Some(r)) => r.iter().all(|c| op.contains(c)),
                _ => false,
            };
            assert!(
                covers,
                "{}: {:?} does not cover {:?}",
                o.name, op.select, r.select
            );
        }
        assert!(
            reader
                .iter()
                .all(|(_, a)| a.insert == Merged::No && a.update == Merged::No && !a.delete)
        );
    }

    #[test]
    fn a_shared_role_gets_the_union_in_one_statement_per_object() {
        let r = RoleName::new("svc").unwrap();
        let plan = RolePlan::new(Schema::default())
            .with_role(Component::Reader, r.clone())
            .with_role(Component::Operator, r);
        let grants: Vec<String> = plan
            .grant_statements()
            .into_iter()
            .filter(|s| s.contains("\"outbox\".\"events\""))
            .collect();
        assert_eq!(grants.len(), 1, "{grants:?}");
        assert!(
            grants[0].starts_with("GRANT SELECT (id, event_id,")
                && grants[0].contains("UPDATE (state, attempts, available_at)"),
            "{}",
            grants[0]
        );
    }

    #[test]
    fn the_migrator_gets_no_grants_and_cannot_double_as_a_component() {
        let p = plan();
        assert!(
            !p.grant_statements()
                .iter()
                .any(|s| s.contains("\"outbox_migrator\""))
        );
        let m = RoleName::new("outbox_migrator").unwrap();
        let bad = plan().with_role(Component::Relay, m);
        assert!(matches!(
            bad.bootstrap_statements(),
            Err(RolesError::OwnerAsComponent {
                component: Component::Relay,
                ..
            })
        ));
    }

    #[test]
    fn missing_grants_read_as_permission_denied_with_role_and_component() {
        let e = RolesError::Missing {
            role: "svc".into(),
            component: Component::Relay,
            missing: vec!["USAGE ON SCHEMA \"outbox\"".into()],
        };
        assert_eq!(
            e.to_string(),
            "permission denied: role `svc` lacks USAGE ON SCHEMA \"outbox\" (role `svc` needs the relay grants: run `outbox roles apply` as the migrator)"
        );
    }

    #[test]
    fn components_parse_by_name() {
        for c in Component::ALL {
            assert_eq!(c.as_str().parse::<Component>().unwrap(), c);
        }
        assert!("admin".parse::<Component>().is_err());
    }
}
