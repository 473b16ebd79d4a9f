//! What every component may do on every object of the schema, and how the privileges of
//! several components merge into one role's.

use super::*;

// ---------------------------------------------------------------------------------------------
// The decisions

/// The columns a privilege covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cols {
    /// The whole table (table-level privilege).
    All,
    /// Only these columns (column-level privilege).
    Only(&'static [&'static str]),
}

/// One privilege on one table or sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Privilege {
    Select(Cols),
    Insert(Cols),
    Update(Cols),
    Delete,
    /// On a sequence: `nextval`.
    Usage,
}

pub(super) use Cols::{All, Only};
pub(super) use Privilege::{Delete, Insert, Select, Update, Usage};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Table,
    Sequence,
}

impl Kind {
    pub(super) fn keyword(self) -> &'static str {
        match self {
            Self::Table => "TABLE",
            Self::Sequence => "SEQUENCE",
        }
    }
}

/// What every component may do on one object: [`Decision::table`] or [`Decision::sequence`]
/// (nothing for anyone), then one method per component that may do something. A component
/// not named gets nothing (the decision "nothing"); the operator's list is *in addition to* the
/// reader's.
#[derive(Debug)]
pub(super) struct Decision {
    pub(super) name: &'static str,
    pub(super) kind: Kind,
    pub(super) producer: &'static [Privilege],
    pub(super) relay: &'static [Privilege],
    pub(super) consumer: &'static [Privilege],
    pub(super) executor: &'static [Privilege],
    pub(super) maintainer: &'static [Privilege],
    pub(super) reader: &'static [Privilege],
    pub(super) operator: &'static [Privilege],
}

/// Nothing.
pub(super) const NONE: &[Privilege] = &[];
/// The whole table, read-only.
const READ: &[Privilege] = &[Select(All)];
/// `nextval` on a sequence.
const NEXTVAL: &[Privilege] = &[Usage];
/// What a heartbeat changes in its own row.
pub(super) const BEAT_COLUMNS: &[&str] = &["heartbeat_at", "stats", "stopped_at"];
/// A consumer's or an executor's heartbeat: its own row, nothing else.
pub(super) const BEAT: &[Privilege] = &[Select(All), Insert(All), Update(Only(BEAT_COLUMNS))];

/// The columns of `parts`, one list after the other, as one list:
/// `columns![ENVELOPE, &["payload"]]`.
macro_rules! columns {
    ($($part:expr),+ $(,)?) => {{
        const PARTS: &[&[&str]] = &[$($part),+];
        const JOINED: [&str; column_count(PARTS)] = join_columns(PARTS);
        &JOINED
    }};
}

/// How many columns `parts` hold together.
const fn column_count(parts: &[&[&str]]) -> usize {
    let (mut n, mut p) = (0, 0);
    while p < parts.len() {
        n += parts[p].len();
        p += 1;
    }
    n
}

/// The columns of `parts`, one list after the other; `N` is their [`column_count`].
const fn join_columns<const N: usize>(parts: &[&[&'static str]]) -> [&'static str; N] {
    let mut joined = [""; N];
    let (mut at, mut p) = (0, 0);
    while p < parts.len() {
        let mut i = 0;
        while i < parts[p].len() {
            joined[at] = parts[p][i];
            at += 1;
            i += 1;
        }
        p += 1;
    }
    assert!(at == N, "N is not the column count");
    joined
}

/// An event's aggregate, version and type, as `events` and the inbox tables record them.
const AGGREGATE_EVENT: &[&str] = &[
    "aggregate_type",
    "aggregate_id",
    "aggregate_version",
    "event_type",
];
/// Which event a row of `events` or `discarded_events` holds, with its schema and content type.
const ENVELOPE: &[&str] = columns![
    &["event_id"],
    AGGREGATE_EVENT,
    &["schema_version", "content_type"],
];
/// What a producer writes into `events`, and a discard copies into `discarded_events`.
const PRODUCED: &[&str] = columns![
    ENVELOPE,
    &["payload", "headers", "destination", "partition_key"],
];

/// Every table and sequence of the schema (identity sequences need no grant: inserting into an
/// identity column does not check the sequence's privileges), one decision each.
pub(super) const OBJECTS: &[Decision] = &[
    // Every component checks the schema version at startup (`check_schema`).
    Decision::table("schema_migrations").read_by_every_component(),
    // The outbox: producers fill it, the relay delivers it, cleanup and operators settle it.
    Decision::table("events")
        // The producer columns only: no reading, no delivery state, no created_at.
        .producer(&[Insert(Only(PRODUCED))])
        // The claim reads whole rows and locks them; settling writes the delivery columns and
        // deletes published rows. Never an insert, never a payload change.
        .relay(&[
            Select(All),
            Update(Only(&[
                "state",
                "attempts",
                "available_at",
                "last_error",
                "published_at",
            ])),
            Delete,
        ])
        // Mark mode's retention deletes published rows by ctid, reading only what picks them
        // (never a payload). DELETE is table-wide in PostgreSQL: the statement, not the grant,
        // keeps it to published rows.
        // `created_at` raises the replay horizon (`retention_marks`).
        .maintainer(&[
            Select(Only(&["ctid", "state", "published_at", "created_at"])),
            Delete,
        ])
        // Everything but the payload and the headers.
        .reader(&[Select(Only(columns![
            &["id"],
            ENVELOPE,
            &[
                "payload_sha256",
                "destination",
                "partition_key",
                "created_at",
                "state",
                "attempts",
                "available_at",
                "last_error",
                "published_at",
            ],
        ]))])
        // dead-letters requeue; replay; discard (a delete of dead rows, copied whole into
        // discarded_events); the payload and headers of a dead letter, to judge it.
        .operator(&[
            Select(Only(&["payload", "headers"])),
            Update(Only(&["state", "attempts", "available_at"])),
            Delete,
        ]),
    // Lease tokens: the relay's aggregate leases and the executor's work-item claims.
    Decision::sequence("lease_token_seq")
        .relay(NEXTVAL)
        .executor(NEXTVAL),
    // The relay's aggregate leases; cleanup reaps expired ones, the reader shows them.
    Decision::table("leases")
        .relay(&[
            Select(All),
            Insert(Only(&[
                "aggregate_type",
                "aggregate_id",
                "token",
                "lease_until",
                "head_id",
                "owner",
            ])),
            Update(Only(&[
                "token",
                "lease_until",
                "head_id",
                "takeovers",
                "owner",
                "orphaned_at",
                "takeover_ms",
            ])),
            Delete,
        ])
        // Reaping deletes by ctid.
        .maintainer(&[Select(Only(&["ctid", "lease_until", "takeovers"])), Delete])
        .reader(READ),
    // A relay's lease owner ids.
    Decision::sequence("lease_owner_seq").relay(NEXTVAL),
    // A relay's live session registers its owner, and sweeps the owners that are gone.
    Decision::table("lease_owners")
        .relay(&[Select(All), Insert(Only(&["owner", "pid"])), Delete])
        .reader(READ),
    // The producer's version counter per aggregate (`next_aggregate_version`), its alone.
    Decision::table("aggregate_versions").producer(&[
        Select(All),
        Insert(Only(&["aggregate_type", "aggregate_id", "last_version"])),
        Update(Only(&["last_version"])),
    ]),
    // The producer's request idempotency, its alone.
    Decision::table("idempotency_keys").producer(&[
        Select(Only(&["scope", "key", "request_sha256", "response"])),
        Insert(Only(&["scope", "key", "request_sha256"])),
        Update(Only(&["response", "completed_at"])),
    ]),
    // Each consumer's record of the events it received; cleanup ages it out.
    Decision::table("inbox")
        .consumer(&[
            Select(All),
            Insert(Only(columns![
                &["consumer_name", "event_id", "payload_sha256"],
                AGGREGATE_EVENT,
            ])),
            Update(Only(&["outcome"])),
        ])
        // Retention deletes by ctid and age; it never reads the identities.
        .maintainer(&[Select(Only(&["ctid", "received_at"])), Delete])
        // Tracing an event to each consumer's record of it (ids and fingerprints, no payload).
        .reader(READ),
    // A redelivery that differs from the first: the consumer records it, an operator resolves.
    Decision::table("inbox_conflicts")
        .consumer(&[
            Select(All),
            Insert(Only(columns![
                &[
                    "consumer_name",
                    "event_id",
                    "stored_sha256",
                    "received_sha256",
                ],
                AGGREGATE_EVENT,
                &["payload"],
            ])),
            // A new occurrence reopens a resolved conflict (schema 11).
            Update(Only(&[
                "occurrences",
                "last_seen",
                "resolved_at",
                "resolved_audit_id",
            ])),
        ])
        // Everything but the conflicting payload.
        .reader(&[Select(Only(columns![
            &[
                "id",
                "consumer_name",
                "event_id",
                "stored_sha256",
                "received_sha256",
            ],
            AGGREGATE_EVENT,
            &[
                "occurrences",
                "first_seen",
                "last_seen",
                "resolved_at",
                "resolved_audit_id",
            ],
        ]))])
        // The conflicting payload, to compare it with the first one; resolving a conflict.
        .operator(&[
            Select(Only(&["payload"])),
            Update(Only(&["resolved_at", "resolved_audit_id"])),
        ]),
    // The consumer's ordering guard: the last version it applied per aggregate.
    Decision::table("inbox_aggregates")
        .consumer(&[
            Select(All),
            Insert(Only(&[
                "consumer_name",
                "aggregate_type",
                "aggregate_id",
                "last_version",
            ])),
            Update(Only(&["last_version"])),
        ])
        // Tracing an aggregate: each consumer's last applied version.
        .reader(READ),
    // What a consumer gave up on: it writes them, an operator requeues or discards them.
    Decision::table("consumer_dead_letters")
        .consumer(&[
            Select(All),
            Insert(Only(columns![
                &["consumer_name", "event_id"],
                AGGREGATE_EVENT,
                &[
                    "content_type",
                    "payload",
                    "headers",
                    "error",
                    "attempts",
                    "header_names",
                    "header_values",
                    "content_type_bytes",
                    "broker_metadata",
                ],
            ])),
            Update(Only(&["state", "error", "attempts", "updated_at"])),
        ])
        // Everything but the payload and the headers.
        .reader(&[Select(Only(columns![
            &["id", "consumer_name", "event_id"],
            AGGREGATE_EVENT,
            &[
                "content_type",
                "error",
                "attempts",
                "state",
                "created_at",
                "updated_at",
            ],
        ]))])
        // consumer-dead-letters requeue and discard (state 'resolved'); the payload and headers
        // of a dead letter, to judge it.
        .operator(&[
            Select(Only(&["payload", "headers"])),
            Update(Only(&["state", "updated_at"])),
        ]),
    // Side effects: consumers enqueue, the executor runs, cleanup purges, an operator resolves.
    Decision::table("work_items")
        // Enqueue in the inbox transaction, and the key lookup of a redelivery; never another
        // item's payload.
        .consumer(&[
            Select(Only(&["id", "kind", "idempotency_key", "payload_sha256"])),
            Insert(Only(&[
                "kind",
                "idempotency_key",
                "payload",
                "event_id",
                "consumer_name",
            ])),
        ])
        // Claims read whole items (the provider needs the payload) and write the execution
        // columns; never the kind, key or payload, never an insert or delete.
        .executor(&[
            Select(All),
            Update(Only(&[
                "state",
                "attempts",
                "lookups",
                "lease_token",
                "lease_until",
                "next_attempt_at",
                "unknown_since",
                "reference",
                "last_error",
                "updated_at",
                "resolved_at",
            ])),
        ])
        // The purge locks the rows it deletes (FOR UPDATE SKIP LOCKED), and PostgreSQL lets
        // only a role with UPDATE on some column lock a row: `updated_at` is that column.
        .maintainer(&[
            Select(Only(&["id", "state", "resolved_at"])),
            Update(Only(&["updated_at"])),
            Delete,
        ])
        // `effects list` shows whole items.
        .reader(READ)
        // effects resolve
        .operator(&[Update(Only(&[
            "state",
            "reference",
            "last_error",
            "lease_token",
            "lease_until",
            "next_attempt_at",
            "unknown_since",
            "resolved_at",
            "updated_at",
        ]))]),
    // The operators' actions, append-only: everyone with the reader's grants reads them.
    Decision::table("audit")
        .reader(READ)
        // Each action's record, in its transaction. Never `at` or `db_role` (the database
        // writes them), never an update or a delete.
        .operator(&[Insert(Only(&[
            "actor",
            "via",
            "credential",
            "action",
            "selection",
            "reason",
            "affected",
        ]))]),
    // Discarded dead letters of `events`, written only by the operator's discard.
    Decision::table("discarded_events")
        // Everything but the payload and the headers, as for `events`.
        .reader(&[Select(Only(columns![
            ENVELOPE,
            &[
                "destination",
                "partition_key",
                "created_at",
                "attempts",
                "last_error",
                "discarded_at",
                "audit_id",
            ],
        ]))])
        // discard: the copy of each row, naming the discard's audit record (the statement that
        // writes both, in one transaction); never `discarded_at`, which the database writes.
        .operator(&[Insert(Only(columns![
            PRODUCED,
            &["created_at", "attempts", "last_error", "audit_id"],
        ]))]),
    // Heartbeats (`crate::heartbeat`): each running process upserts its own row; a relay also
    // its publishes per route, and it alone deletes old rows (a day; activity two hours).
    // `instances`: one row per running process, its heartbeat and stats.
    Decision::table("instances")
        .relay(&[Select(All), Insert(All), Update(Only(BEAT_COLUMNS)), Delete])
        .consumer(BEAT)
        .executor(BEAT)
        .reader(READ),
    // `activity`: work done per minute (a relay's publishes per route, a consumer's effects).
    Decision::table("activity")
        .relay(&[Select(All), Insert(All), Update(Only(&["count"])), Delete])
        // Its effects per minute (`Heartbeat::with_consumer`), never a delete.
        .consumer(&[Select(All), Insert(All), Update(Only(&["count"]))])
        .reader(READ),
    // Pauses (migration 10): the relay's claim reads the paused routes, a consumer asks
    // whether it is paused; `outbox pause` and `resume` write them with their audit record.
    Decision::table("pauses")
        .relay(READ)
        .consumer(READ)
        .reader(READ)
        .operator(&[Insert(Only(&["kind", "name", "audit_id"])), Delete]),
    // How far mark mode's purge has deleted published rows: a replay refuses older ranges.
    Decision::table("retention_marks")
        // Raised by the published-row purge in its own statement.
        .maintainer(&[Select(All), Insert(All), Update(Only(&["through"]))])
        // The replay horizon, read by a replay and shown by the console.
        .reader(READ),
];

/// `.relay(&[…])` and so on: one setter per component, replacing that component's list.
macro_rules! setters {
    ($($component:ident),+) => {$(
        const fn $component(self, $component: &'static [Privilege]) -> Self {
            Self { $component, ..self }
        }
    )+};
}

/// A constructor per kind of object, a setter per component (each replaces that component's
/// list), the shapes several objects share, and a component's list.
impl Decision {
    /// A table on which no component may do anything yet.
    const fn table(name: &'static str) -> Self {
        Self::nothing(name, Kind::Table)
    }

    /// A sequence on which no component may do anything yet.
    const fn sequence(name: &'static str) -> Self {
        Self::nothing(name, Kind::Sequence)
    }

    /// An object on which no component may do anything yet.
    const fn nothing(name: &'static str, kind: Kind) -> Self {
        Self {
            name,
            kind,
            producer: NONE,
            relay: NONE,
            consumer: NONE,
            executor: NONE,
            maintainer: NONE,
            reader: NONE,
            operator: NONE,
        }
    }

    setters! { producer, relay, consumer, executor, maintainer, reader, operator }

    /// The whole table, read-only, for every component (the operator through the reader's
    /// grants).
    const fn read_by_every_component(self) -> Self {
        self.producer(READ)
            .relay(READ)
            .consumer(READ)
            .executor(READ)
            .maintainer(READ)
            .reader(READ)
    }

    /// What `component` may do on the object.
    pub(super) fn of(&self, component: Component) -> Vec<Privilege> {
        match component {
            Component::Migrator => Vec::new(),
            Component::Producer => self.producer.to_vec(),
            Component::Relay => self.relay.to_vec(),
            Component::Consumer => self.consumer.to_vec(),
            Component::Executor => self.executor.to_vec(),
            Component::Maintainer => self.maintainer.to_vec(),
            Component::Reader => self.reader.to_vec(),
            Component::Operator => [self.reader, self.operator].concat(),
        }
    }
}

/// The names of every table and sequence the grants cover (the schema's objects at
/// [`crate::migrate::current_version`], identity sequences excepted).
pub fn covered_objects() -> impl Iterator<Item = &'static str> {
    OBJECTS.iter().map(|o| o.name)
}

// ---------------------------------------------------------------------------------------------
// Merging privileges (a role may serve several components)

/// Columns of one privilege kind after merging: none, some (in first-seen order), or all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) enum Merged {
    #[default]
    No,
    Some(Vec<&'static str>),
    Table,
}

impl Merged {
    pub(super) fn add(&mut self, cols: Cols) {
        match (cols, &mut *self) {
            (_, Merged::Table) => {}
            (All, _) => *self = Merged::Table,
            (Only(c), Merged::No) => *self = Merged::Some(c.to_vec()),
            (Only(c), Merged::Some(have)) => {
                for col in c {
                    if !have.contains(col) {
                        have.push(col);
                    }
                }
            }
        }
    }

    /// `SELECT` or `SELECT (a, b)`.
    pub(super) fn render(&self, keyword: &str) -> Option<String> {
        match self {
            Merged::No => None,
            Merged::Table => Some(keyword.to_owned()),
            Merged::Some(c) => Some(format!("{keyword} ({})", c.join(", "))),
        }
    }
}

/// Everything one role may do on one object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Access {
    pub(super) select: Merged,
    pub(super) insert: Merged,
    pub(super) update: Merged,
    pub(super) delete: bool,
    pub(super) usage: bool,
}

impl Access {
    pub(super) fn add(&mut self, p: Privilege) {
        match p {
            Select(c) => self.select.add(c),
            Insert(c) => self.insert.add(c),
            Update(c) => self.update.add(c),
            Delete => self.delete = true,
            Usage => self.usage = true,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `SELECT, UPDATE (state), DELETE`.
    pub(super) fn render(&self) -> String {
        [
            self.select.render("SELECT"),
            self.insert.render("INSERT"),
            self.update.render("UPDATE"),
            self.delete.then(|| "DELETE".to_owned()),
            self.usage.then(|| "USAGE".to_owned()),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ")
    }
}

/// What `components` may do, per object, in `OBJECTS` order (objects with nothing left out).
pub(super) fn access_of(components: &[Component]) -> Vec<(&'static Decision, Access)> {
    OBJECTS
        .iter()
        .filter_map(|o| {
            let mut access = Access::default();
            for c in components {
                for p in o.of(*c) {
                    access.add(p);
                }
            }
            (!access.is_empty()).then_some((o, access))
        })
        .collect()
}
