//! The operator's commands: `dead-letters`, `conflicts`, `consumer-dead-letters`, `pause`,
//! `resume`, `pauses`, `replay`, `audit` and `trace`. Each reads and acts through the operator contract
//! (`outbox_core::operator`), as the console does, so they work on any store that implements it;
//! every action is recorded in the audit table under the actor (`--actor`, else
//! `OUTBOX_ACTOR`, else the OS user) with `via = cli`.

use std::process::ExitCode;

use anyhow::{Result, bail};
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use outbox_core::operator::{
    Actor, ConflictFilter, ConsumerSelection, DeadLetterFilter, DeadLetterSelection, GROUP_SCAN,
    OperatorStore, PauseTarget, RangeSelection, ReplaySelection,
};

/// Who acts and why: every action's audit record.
#[derive(Args, Debug, Clone)]
pub(crate) struct ActionArgs {
    /// Why (kept in the audit record).
    #[arg(long, default_value = "")]
    reason: String,
    /// Who acts, for the audit record [default: $OUTBOX_ACTOR, else the OS user].
    #[arg(long, env = "OUTBOX_ACTOR")]
    actor: Option<String>,
}

impl ActionArgs {
    pub(crate) fn actor(&self) -> Result<Actor> {
        let name = self
            .actor
            .clone()
            .or_else(|| std::env::var("USER").ok())
            .or_else(|| std::env::var("LOGNAME").ok())
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| "unknown OS user".to_owned());
        Ok(Actor::new(name, "cli")?)
    }

    pub(crate) fn reason(&self) -> &str {
        &self.reason
    }
}

/// Which outbox dead letters (every flag optional; all given must hold).
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct FilterArgs {
    /// Only this aggregate type.
    #[arg(long)]
    aggregate_type: Option<String>,
    /// Only this event type.
    #[arg(long)]
    event_type: Option<String>,
    /// Only rows with this destination override.
    #[arg(long)]
    destination: Option<String>,
    /// Only this reason group (the key `dead-letters groups` prints).
    #[arg(long)]
    group: Option<String>,
    /// Only events written at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<DateTime<Utc>>,
    /// Only events written before this time (RFC 3339).
    #[arg(long)]
    until: Option<DateTime<Utc>>,
}

impl FilterArgs {
    fn filter(&self) -> DeadLetterFilter {
        DeadLetterFilter {
            aggregate_type: self.aggregate_type.clone(),
            event_type: self.event_type.clone(),
            destination: self.destination.clone(),
            reason_group: self.group.clone(),
            created_after: self.since,
            created_before: self.until,
        }
    }

    fn is_empty(&self) -> bool {
        self.filter() == DeadLetterFilter::default()
    }
}

/// Ids, `--all`, or a filter: what an action on outbox dead letters takes.
#[derive(Args, Debug, Clone)]
pub(crate) struct SelectArgs {
    /// Event ids.
    event_ids: Vec<uuid::Uuid>,
    /// Every dead letter.
    #[arg(long, conflicts_with = "event_ids")]
    all: bool,
    #[command(flatten)]
    filter: FilterArgs,
}

impl SelectArgs {
    fn selection(&self) -> Result<DeadLetterSelection> {
        let filtered = !self.filter.is_empty();
        Ok(match (self.event_ids.is_empty(), self.all, filtered) {
            (false, false, false) => {
                // Each id once: the note compares the count changed with the ids given.
                let mut ids = self.event_ids.clone();
                ids.sort_unstable();
                ids.dedup();
                DeadLetterSelection::Ids(ids)
            }
            (true, true, false) => DeadLetterSelection::All,
            (true, false, true) => DeadLetterSelection::Matching(self.filter.filter()),
            _ => bail!("give event ids, --all, or filter flags (one of the three)"),
        })
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum DeadLetterCmd {
    /// List dead letters, oldest first.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[command(flatten)]
        filter: FilterArgs,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Dead letters grouped by reason (their error with numbers and ids as `#`), largest first.
    Groups {
        #[command(flatten)]
        filter: FilterArgs,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// One dead letter whole, payload and headers included, as JSON (needs the operator role).
    Show {
        /// Its event id.
        event_id: uuid::Uuid,
    },
    /// Make dead letters pending again (attempts reset), by ids, --all or filter; their
    /// aggregates resume in order.
    Requeue {
        #[command(flatten)]
        select: SelectArgs,
        #[command(flatten)]
        action: ActionArgs,
    },
    /// Give dead letters up for good, by ids, --all or filter (needs --reason): each is kept
    /// whole in `discarded_events` and removed from the outbox; its aggregate moves on.
    Discard {
        #[command(flatten)]
        select: SelectArgs,
        #[command(flatten)]
        action: ActionArgs,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum ConflictsCmd {
    /// List conflicts, newest first.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// Only this event id's.
        #[arg(long)]
        event_id: Option<uuid::Uuid>,
        /// Only the open ones (not resolved).
        #[arg(long)]
        open: bool,
    },
    /// One conflict with the conflicting payload and, where this database still holds it,
    /// the first one, as JSON (needs the operator role).
    Show {
        /// Its id (from `list`).
        id: i64,
    },
    /// Mark conflicts resolved after dealing with their cause (needs --reason): they leave
    /// the open list and the overview's count. Nothing is applied or undone: the consumer's
    /// effect stays the first payload's. The same conflicting payload arriving again reopens
    /// a conflict.
    Resolve {
        /// Conflict ids (from `list`).
        #[arg(required = true)]
        ids: Vec<i64>,
        #[command(flatten)]
        action: ActionArgs,
    },
}

/// Which consumer dead letters.
#[derive(Args, Debug, Clone)]
pub(crate) struct ConsumerSelectArgs {
    /// Dead-letter ids (from `list`).
    ids: Vec<i64>,
    /// Every open dead letter (of --consumer, of --group, when given).
    #[arg(long, conflicts_with = "ids")]
    all: bool,
    /// Only this consumer.
    #[arg(long)]
    consumer: Option<String>,
    /// Only this reason group (the key `groups` prints).
    #[arg(long)]
    group: Option<String>,
}

impl ConsumerSelectArgs {
    fn selection(&self) -> Result<ConsumerSelection> {
        if self.ids.is_empty() && !self.all {
            bail!("give dead-letter ids or --all (with --consumer or --group to narrow it)");
        }
        Ok(ConsumerSelection {
            consumer: self.consumer.clone(),
            // Each id once: the note compares the count changed with the ids given.
            ids: (!self.all).then(|| {
                let mut ids = self.ids.clone();
                ids.sort_unstable();
                ids.dedup();
                ids
            }),
            reason_group: self.group.clone(),
        })
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum ConsumerDeadLetterCmd {
    /// List open consumer dead letters, oldest first.
    List {
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
        /// Only this reason group.
        #[arg(long)]
        group: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Open consumer dead letters grouped by consumer and reason, largest first.
    Groups {
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// One consumer dead letter whole, payload and headers as received, as JSON (needs the
    /// operator role).
    Show {
        /// Its id.
        id: i64,
    },
    /// Mark dead letters for their consumer to apply again, through its inbox.
    Requeue {
        #[command(flatten)]
        select: ConsumerSelectArgs,
        #[command(flatten)]
        action: ActionArgs,
    },
    /// Give dead letters up (state `resolved`, never applied; needs --reason).
    Discard {
        #[command(flatten)]
        select: ConsumerSelectArgs,
        #[command(flatten)]
        action: ActionArgs,
    },
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// `list` as JSON, or one entry per item as `line` writes it (`none` when it is empty).
fn print_list<T: serde::Serialize>(
    list: &[T],
    json: bool,
    none: &str,
    line: impl Fn(&T) -> String,
) -> Result<()> {
    if json {
        return print_json(&list);
    }
    if list.is_empty() {
        println!("{none}");
    }
    for item in list {
        println!("{}", line(item));
    }
    Ok(())
}

/// `whole` as JSON when given; else one entry per group as `line` writes it, and a note when
/// the groups count only the oldest [`GROUP_SCAN`] of the `what` that match.
fn print_groups<T: serde::Serialize, G>(
    whole: Option<&T>,
    groups: &[G],
    complete: bool,
    what: &str,
    line: impl Fn(&G) -> String,
) -> Result<()> {
    if let Some(whole) = whole {
        return print_json(whole);
    }
    if groups.is_empty() {
        println!("no {what}");
    }
    for g in groups {
        println!("{}", line(g));
    }
    if !complete {
        println!(
            "note: {GROUP_SCAN} or more {what} match; these groups count the oldest {GROUP_SCAN} only"
        );
    }
    Ok(())
}

/// Prints what an action did (`said`) and returns its exit code: 1, with a note, when of
/// `asked` named ids fewer than all were acted on (see [`not_all`]).
fn acted(said: &str, asked: Option<usize>, done: u64, what: &str) -> ExitCode {
    println!("{said}");
    not_all(asked, done, what).unwrap_or(ExitCode::SUCCESS)
}

/// `outbox dead-letters`.
pub(crate) async fn dead_letters<O: OperatorStore>(
    admin: O,
    cmd: DeadLetterCmd,
) -> Result<ExitCode> {
    admin.ready().await?;
    match cmd {
        DeadLetterCmd::List {
            limit,
            filter,
            json,
        } => {
            let list = admin.dead_letters(&filter.filter(), limit).await?;
            print_list(&list, json, "no dead letters", |d| {
                format!(
                    "{}  {}/{} v{}  {}  attempts={}  waiting_behind={}  created={}\n    last_error: {}",
                    d.event_id,
                    d.aggregate_type,
                    d.aggregate_id,
                    d.aggregate_version,
                    d.event_type,
                    d.attempts,
                    d.blocked_behind,
                    d.created_at.to_rfc3339(),
                    d.last_error.as_deref().unwrap_or("-")
                )
            })?;
        }
        DeadLetterCmd::Groups { filter, json } => {
            let all = admin.dead_letter_groups(&filter.filter()).await?;
            let shown = json.then_some(&all);
            print_groups(shown, &all.groups, all.complete, "dead letters", |g| {
                format!(
                    "{:>7}  {}\n         types {}  events {}  created {} .. {}",
                    g.count,
                    g.reason,
                    g.aggregate_types.join(","),
                    g.event_types.join(","),
                    g.first_created_at.to_rfc3339(),
                    g.last_created_at.to_rfc3339()
                )
            })?;
        }
        DeadLetterCmd::Show { event_id } => print_json(&admin.dead_letter(event_id).await?)?,
        DeadLetterCmd::Requeue { select, action } => {
            let (which, actor) = (select.selection()?, action.actor()?);
            let n = admin
                .requeue_dead_letters(&which, &actor, action.reason())
                .await?;
            let said = format!("requeued {n} dead letter(s)");
            return Ok(acted(&said, ids_asked(&which), n, "dead letters"));
        }
        DeadLetterCmd::Discard { select, action } => {
            let (which, actor) = (select.selection()?, action.actor()?);
            let d = admin
                .discard_dead_letters(&which, &actor, action.reason())
                .await?;
            let said = format!(
                "discarded {} dead letter(s) (kept in discarded_events; audit record {})",
                d.discarded, d.audit_id
            );
            return Ok(acted(&said, ids_asked(&which), d.discarded, "dead letters"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `outbox conflicts`.
pub(crate) async fn conflicts<O: OperatorStore>(admin: O, cmd: ConflictsCmd) -> Result<ExitCode> {
    admin.ready().await?;
    match cmd {
        ConflictsCmd::List {
            limit,
            event_id,
            open,
        } => {
            let list = admin
                .conflicts(
                    ConflictFilter {
                        event_id,
                        open_only: open,
                    },
                    limit,
                )
                .await?;
            if list.is_empty() {
                println!("no conflicts");
            }
            for c in list {
                let state = match (&c.resolved_at, &c.resolved_by) {
                    (Some(at), by) => format!(
                        "resolved {} by {}: {}",
                        at.to_rfc3339(),
                        by.as_deref().unwrap_or("?"),
                        c.resolution_reason.as_deref().unwrap_or("")
                    ),
                    (None, _) => "open".to_owned(),
                };
                println!(
                    "#{}  {}  consumer={}  {}/{} v{}  {}  seen {}x (first {}, last {})  {state}\n    stored  sha256 {}\n    received sha256 {}",
                    c.id,
                    c.event_id,
                    c.consumer_name,
                    c.aggregate_type,
                    c.aggregate_id,
                    c.aggregate_version,
                    c.event_type,
                    c.occurrences,
                    c.first_seen.to_rfc3339(),
                    c.last_seen.to_rfc3339(),
                    c.stored_sha256,
                    c.received_sha256
                );
            }
        }
        ConflictsCmd::Show { id } => print_json(&admin.conflict(id).await?)?,
        ConflictsCmd::Resolve { mut ids, action } => {
            ids.sort_unstable();
            ids.dedup();
            let r = admin
                .resolve_conflicts(&ids, &action.actor()?, action.reason())
                .await?;
            println!(
                "resolved {} conflict(s) (audit record {})",
                r.resolved, r.audit_id
            );
            if let Some(code) = not_all(Some(ids.len()), r.resolved, "open conflicts") {
                return Ok(code);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `outbox consumer-dead-letters`.
pub(crate) async fn consumer_dead_letters<O: OperatorStore>(
    admin: O,
    cmd: ConsumerDeadLetterCmd,
) -> Result<ExitCode> {
    admin.ready().await?;
    match cmd {
        ConsumerDeadLetterCmd::List {
            consumer,
            group,
            limit,
            json,
        } => {
            let which = ConsumerSelection {
                consumer,
                ids: None,
                reason_group: group,
            };
            let list = admin.consumer_dead_letters(&which, limit).await?;
            print_list(&list, json, "no consumer dead letters", |v| {
                let d = &v.dead_letter;
                format!(
                    "#{}  consumer={}  state={}  event={}  {}/{} v{}  {}  attempts={}  since {}\n    error: {}",
                    d.id,
                    d.consumer_name,
                    d.state,
                    d.event_id.map_or("-".to_owned(), |e| e.to_string()),
                    d.aggregate_type.as_deref().unwrap_or("-"),
                    d.aggregate_id.as_deref().unwrap_or("-"),
                    d.aggregate_version
                        .map_or("-".to_owned(), |v| v.to_string()),
                    d.event_type.as_deref().unwrap_or("-"),
                    d.attempts,
                    d.created_at.to_rfc3339(),
                    d.error
                )
            })?;
        }
        ConsumerDeadLetterCmd::Groups { consumer, json } => {
            let which = ConsumerSelection {
                consumer,
                ..ConsumerSelection::default()
            };
            let all = admin.consumer_dead_letter_groups(&which).await?;
            let shown = json.then_some(&all);
            print_groups(
                shown,
                &all.groups,
                all.complete,
                "consumer dead letters",
                |g| {
                    format!(
                        "{:>7}  consumer={}  {}\n         since {} .. {}",
                        g.count,
                        g.consumer_name,
                        g.reason,
                        g.first_at.to_rfc3339(),
                        g.last_at.to_rfc3339()
                    )
                },
            )?;
        }
        ConsumerDeadLetterCmd::Show { id } => print_json(&admin.consumer_dead_letter(id).await?)?,
        ConsumerDeadLetterCmd::Requeue { select, action } => {
            let (which, actor) = (select.selection()?, action.actor()?);
            let n = admin
                .requeue_consumer_dead_letters(&which, &actor, action.reason())
                .await?;
            let said = format!(
                "requeued {n} consumer dead letter(s); the consumer applies them through its inbox"
            );
            let asked = which.ids.as_ref().map(Vec::len);
            return Ok(acted(&said, asked, n, "open dead letters"));
        }
        ConsumerDeadLetterCmd::Discard { select, action } => {
            let (which, actor) = (select.selection()?, action.actor()?);
            let n = admin
                .discard_consumer_dead_letters(&which, &actor, action.reason())
                .await?;
            let said =
                format!("discarded {n} consumer dead letter(s) (state resolved, never applied)");
            let asked = which.ids.as_ref().map(Vec::len);
            return Ok(acted(&said, asked, n, "open dead letters"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `outbox audit`: the recorded actions, newest first.
pub(crate) async fn audit<O: OperatorStore>(
    admin: O,
    limit: i64,
    before: Option<i64>,
    json: bool,
) -> Result<ExitCode> {
    admin.ready().await?;
    let list = admin.audit(before, limit).await?;
    print_list(&list, json, "no recorded actions", |a| {
        format!(
            "#{}  {}  {} via {}{} (db role {})  {}  affected={}\n    selection: {}\n    reason: {}",
            a.id,
            a.at.to_rfc3339(),
            a.actor,
            a.via,
            a.credential
                .as_deref()
                .map_or(String::new(), |c| format!(" [credential {c}]")),
            a.db_role,
            a.action,
            a.affected,
            a.selection,
            if a.reason.is_empty() { "-" } else { &a.reason }
        )
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `outbox trace`: everything this database holds of an event or an aggregate, as JSON.
pub(crate) async fn trace<O: OperatorStore>(
    admin: O,
    event_id: Option<uuid::Uuid>,
    aggregate: Option<String>,
    limit: i64,
) -> Result<ExitCode> {
    admin.ready().await?;
    match (event_id, aggregate) {
        (Some(id), None) => print_json(&admin.trace_event(id).await?)?,
        (None, Some(aggregate)) => {
            let Some((t, i)) = aggregate.split_once('/') else {
                bail!("--aggregate takes TYPE/ID, e.g. payment/42");
            };
            print_json(&admin.trace_aggregate(t, i, limit).await?)?;
        }
        _ => bail!("give an event id or --aggregate TYPE/ID"),
    }
    Ok(ExitCode::SUCCESS)
}

/// What `outbox replay` republishes.
#[derive(Args, Debug, Clone)]
pub(crate) struct ReplayArgs {
    /// The aggregate, TYPE/ID (or a time range: --since and --until).
    #[arg(long, required_unless_present = "since", conflicts_with = "since")]
    aggregate: Option<String>,
    /// From this version on [default: 1].
    #[arg(long, requires = "aggregate")]
    from_version: Option<i64>,
    /// A time range instead of an aggregate: the published events written at or after this
    /// time (RFC 3339), each aggregate extended to its newest version; must be after the
    /// replay horizon (what retention deleted).
    #[arg(long, requires = "until")]
    since: Option<DateTime<Utc>>,
    /// The time range's end: events written before this time (RFC 3339).
    #[arg(long, requires = "since")]
    until: Option<DateTime<Utc>>,
    /// With a time range: only this aggregate type.
    #[arg(long, requires = "since")]
    aggregate_type: Option<String>,
    /// With a time range: only events with this destination override.
    #[arg(long, requires = "since")]
    destination: Option<String>,
    /// Only say how many events it would republish.
    #[arg(long)]
    dry_run: bool,
    /// Refuse unless it takes exactly this many events (the dry run's count).
    #[arg(long)]
    expect_events: Option<i64>,
    #[command(flatten)]
    action: ActionArgs,
}

/// `outbox replay`: an aggregate's published events republished with their original ids (mark
/// mode).
pub(crate) async fn replay<O: OperatorStore>(admin: O, a: ReplayArgs) -> Result<ExitCode> {
    admin.ready().await?;
    if let (Some(since), Some(until)) = (a.since, a.until) {
        let which = RangeSelection {
            created_after: since,
            created_before: until,
            aggregate_type: a.aggregate_type.clone(),
            destination: a.destination.clone(),
        };
        let plan = admin
            .replay(
                &which,
                a.dry_run,
                a.expect_events,
                &a.action.actor()?,
                a.action.reason(),
            )
            .await?;
        let what = format!(
            "{} event(s) of {} aggregate(s): {} written in the range, {} later ones of the same \
             aggregates (each to its newest version)",
            plan.events,
            plan.aggregates,
            plan.in_range,
            plan.events - plan.in_range
        );
        let horizon = plan.horizon.map_or_else(
            || "no replay horizon recorded (retention_marks has no row)".to_owned(),
            |h| format!("replay horizon {}", h.to_rfc3339()),
        );
        if plan.dry_run {
            println!("dry run: would republish {what}; {horizon}");
        } else {
            println!("republishing {what} under their original ids; {horizon}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let aggregate = a.aggregate.clone().unwrap_or_default();
    let Some((t, i)) = aggregate.split_once('/') else {
        bail!("--aggregate takes TYPE/ID, e.g. payment/42");
    };
    let which = ReplaySelection {
        aggregate_type: t.to_owned(),
        aggregate_id: i.to_owned(),
        from_version: a.from_version,
    };
    let plan = admin
        .replay(
            &which,
            a.dry_run,
            a.expect_events,
            &a.action.actor()?,
            a.action.reason(),
        )
        .await?;
    let held = match (plan.lowest_version_held, plan.newest_version_held) {
        (Some(l), Some(n)) => format!("versions {l} to {n} held"),
        _ => "nothing held".to_owned(),
    };
    if plan.dry_run {
        println!(
            "dry run: would republish {} event(s) of {aggregate}; {held}",
            plan.events
        );
    } else {
        println!(
            "republishing {} event(s) of {aggregate} under their original ids; {held}",
            plan.events
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What `outbox pause` or `outbox resume` names: exactly one of the flags.
#[derive(Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub(crate) struct PauseArgs {
    /// The route of rows sent to this destination (the producer's override).
    #[arg(long)]
    destination: Option<String>,
    /// The route of rows of this aggregate type that name no destination.
    #[arg(long)]
    aggregate_type: Option<String>,
    /// A route by the key the console shows (`destination:NAME` or `type:NAME`).
    #[arg(long)]
    route: Option<String>,
    /// A consumer, by its name.
    #[arg(long)]
    consumer: Option<String>,
}

impl PauseArgs {
    fn target(&self) -> PauseTarget {
        match (
            &self.destination,
            &self.aggregate_type,
            &self.route,
            &self.consumer,
        ) {
            (Some(d), ..) => PauseTarget::destination(d),
            (_, Some(t), ..) => PauseTarget::aggregate_type(t),
            (_, _, Some(r), _) => PauseTarget::Route(r.clone()),
            (.., Some(c)) => PauseTarget::Consumer(c.clone()),
            // clap requires one of the group.
            (None, None, None, None) => PauseTarget::Route(String::new()),
        }
    }
}

/// `outbox pause`: a route stops being claimed by the polling relays, or a consumer stops
/// taking deliveries, until `outbox resume`.
pub(crate) async fn pause<O: OperatorStore>(
    admin: O,
    which: PauseArgs,
    action: ActionArgs,
) -> Result<ExitCode> {
    admin.ready().await?;
    let target = which.target();
    let pause = admin
        .pause(&target, &action.actor()?, action.reason())
        .await?;
    println!(
        "paused {} {} (audit record {}); `outbox resume` ends it",
        pause.kind, pause.name, pause.audit_id
    );
    Ok(ExitCode::SUCCESS)
}

/// `outbox resume`: ends a pause.
pub(crate) async fn resume<O: OperatorStore>(
    admin: O,
    which: PauseArgs,
    action: ActionArgs,
) -> Result<ExitCode> {
    admin.ready().await?;
    let target = which.target();
    admin
        .resume(&target, &action.actor()?, action.reason())
        .await?;
    println!("resumed {} {}", target.kind(), target.name());
    Ok(ExitCode::SUCCESS)
}

/// `outbox pauses`: every pause in force.
pub(crate) async fn pauses<O: OperatorStore>(admin: O, json: bool) -> Result<ExitCode> {
    admin.ready().await?;
    let pauses = admin.pauses().await?;
    print_list(&pauses, json, "nothing is paused", |p| {
        format!(
            "{} {} paused at {} by {}: {}",
            p.kind,
            p.name,
            p.paused_at.to_rfc3339(),
            p.actor.as_deref().unwrap_or("?"),
            p.reason.as_deref().unwrap_or("")
        )
    })?;
    Ok(ExitCode::SUCCESS)
}

/// How many ids an outbox dead-letter action named (`None` for a filter or everything).
fn ids_asked(which: &DeadLetterSelection) -> Option<usize> {
    match which {
        DeadLetterSelection::Ids(ids) => Some(ids.len()),
        _ => None,
    }
}

/// After an action on `asked` named ids of which `done` were acted on: a note and exit code 1
/// when some were not `what` (already handled, or unknown), so a script sees it.
fn not_all(asked: Option<usize>, done: u64, what: &str) -> Option<ExitCode> {
    let asked = asked?;
    let done = usize::try_from(done).unwrap_or(usize::MAX);
    (done < asked).then(|| {
        println!("note: {} of the given ids were not {what}", asked - done);
        ExitCode::from(1)
    })
}
