//! Paused routes and consumers: what an operator stopped on purpose. What each stops is told
//! at [`PauseTarget`].

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Action, Actor, OperatorError};

/// The route key of a row: `destination:<destination>` for a row that names its destination,
/// else `type:<aggregate type>` (the keys [`PauseTarget::Route`] and the routes' view use).
pub fn route_key(destination: Option<&str>, aggregate_type: &str) -> String {
    match destination {
        Some(d) => format!("destination:{d}"),
        None => format!("type:{aggregate_type}"),
    }
}

/// What a pause stops, as the API and the CLI name it.
///
/// * A paused **route** (an outbox destination, or an aggregate type's topic for rows without
///   one) is not claimed by the relay: its rows stay pending, and an aggregate whose next row
///   goes there waits, its later rows included, whatever their route (per-aggregate order,
///   G7). A pause holds from the next claim on; a batch already claimed is finished. A relay
///   that streams the database's log instead of claiming (a change-data-capture relay) parks
///   such an aggregate and leaves its events pending in the table
///   ([`crate::relay::log`]), from its next batch after it read the pauses (it reads them at
///   least once a second); a resume's new session publishes them in order. A head
///   that was suspected of crashing relays (the poison-row rule's takeover count) starts its
///   count again after the pause.
/// * A paused **consumer** takes no deliveries from its source (its engine asks its store at most
///   once a second, [`crate::consumer`]): a batch in progress is finished, then what
///   the broker holds for the consumer waits there until it is resumed. What the source had
///   already received stays with it unacknowledged until the broker takes it back by its own
///   rules (after an ack wait, when a consumer timeout closes the channel, where each such
///   return may count as a delivery, or not at all where only offsets are uncommitted; the
///   guide's console chapter says which for each broker). The source is not polled while
///   paused, so its lag is not refreshed either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseTarget {
    /// A route, by its key: `destination:` and the rows' destination, or `type:` and the
    /// aggregate type of rows without a destination (the keys the overview's routes show).
    Route(String),
    /// A consumer, by its name.
    Consumer(String),
}

impl PauseTarget {
    /// The route of rows sent to `destination`.
    pub fn destination(destination: &str) -> Self {
        Self::Route(format!("destination:{destination}"))
    }

    /// The route of rows of `aggregate_type` that name no destination.
    pub fn aggregate_type(aggregate_type: &str) -> Self {
        Self::Route(format!("type:{aggregate_type}"))
    }

    /// The `kind` column's value.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Route(_) => "route",
            Self::Consumer(_) => "consumer",
        }
    }

    /// The `name` column's value.
    pub fn name(&self) -> &str {
        match self {
            Self::Route(n) | Self::Consumer(n) => n,
        }
    }

    /// Checks the name: a route key starts with `destination:` or `type:` followed by a name;
    /// every name is 1 to 1,024 characters.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` saying what is wrong.
    pub fn check(&self, operation: &'static str) -> Result<(), OperatorError> {
        self.check_name(operation)
    }

    /// What every store checks before a pause: the name ([`PauseTarget::check`]) and a reason,
    /// which the audit record keeps and the pause shows.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` saying what is wrong.
    pub fn check_pause(&self, operation: &'static str, reason: &str) -> Result<(), OperatorError> {
        self.check_name(operation)?;
        if reason.trim().is_empty() {
            return Err(OperatorError::invalid(
                operation,
                "a pause needs a reason (it is kept in the audit record and shown with the pause)",
            ));
        }
        Ok(())
    }

    /// The target as the audit record keeps it (`{"route": ...}` or `{"consumer": ...}`).
    pub fn audit_selection(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// The refusal (`Refused`) of a pause of a target that is paused already.
    pub fn paused_already(&self, operation: &'static str) -> OperatorError {
        OperatorError::refused(
            operation,
            format!("{} {} is paused already", self.kind(), self.name()),
        )
    }

    /// The refusal (`NotFound`) of a resume of a target that is not paused.
    pub fn not_paused(&self, operation: &'static str) -> OperatorError {
        OperatorError::not_found(
            operation,
            format!("{} {} is not paused", self.kind(), self.name()),
        )
    }

    fn check_name(&self, operation: &'static str) -> Result<(), OperatorError> {
        let invalid = |message: String| OperatorError::invalid(operation, message);
        let name = self.name();
        if name.is_empty() || name.chars().count() > 1024 {
            return Err(invalid(format!(
                "a {} name has 1 to 1,024 characters",
                self.kind()
            )));
        }
        if let Self::Route(key) = self {
            let rest = key
                .strip_prefix("destination:")
                .or_else(|| key.strip_prefix("type:"));
            if rest.is_none_or(str::is_empty) {
                return Err(invalid(format!(
                    "a route is `destination:<destination>` or `type:<aggregate type>`, not {key:?}"
                )));
            }
        }
        Ok(())
    }
}

/// One pause in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pause {
    /// `route` or `consumer`.
    pub kind: String,
    /// The route's key or the consumer's name.
    pub name: String,
    /// Since when.
    pub paused_at: DateTime<Utc>,
    /// The pause's audit record.
    pub audit_id: i64,
    /// Who paused it (from the audit record).
    pub actor: Option<String>,
    /// Why (from the audit record).
    pub reason: Option<String>,
}

impl Pause {
    /// The pause of `target` that `action` just made, since `paused_at`, under the audit record
    /// `audit_id` (whose actor and reason it shows).
    pub fn new(
        target: &PauseTarget,
        action: &Action<'_>,
        paused_at: DateTime<Utc>,
        audit_id: i64,
    ) -> Self {
        Self {
            kind: target.kind().to_owned(),
            name: target.name().to_owned(),
            paused_at,
            audit_id,
            actor: Some(action.actor().name().to_owned()),
            reason: Some(action.reason().to_owned()),
        }
    }
}

/// Pauses.
pub trait PauseOps: Sync {
    /// Every pause in force, by kind (consumers, then routes) and name, with who paused it
    /// and why.
    ///
    /// # Errors
    /// [`OperatorError`]: the store's failure.
    fn pauses(&self) -> impl Future<Output = Result<Vec<Pause>, OperatorError>> + Send;

    /// Pauses a route or a consumer ([`PauseTarget`]: what each stops, and when), with the
    /// audit record, whose id the pause keeps.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` (a malformed route key, or no reason),
    /// `Refused` (paused already; nothing changed),
    /// `PermissionDenied` (the role may only read), or the store's failure.
    fn pause(
        &self,
        target: &PauseTarget,
        actor: &Actor,
        reason: &str,
    ) -> impl Future<Output = Result<Pause, OperatorError>> + Send {
        async move {
            let action = Action::new("pause", actor, target.audit_selection(), reason);
            action.check(target.check_pause(action.operation(), reason))?;
            let result = self.apply_pause(&action, target).await;
            action.logged(result, |_| 1)
        }
    }

    /// The store's part of [`pause`](Self::pause), called once the target and the reason were
    /// checked: the pause and `action`'s audit record in one transaction, refused
    /// ([`PauseTarget::paused_already`]) when the target is paused already. Logs nothing.
    ///
    /// # Errors
    /// As [`pause`](Self::pause).
    fn apply_pause(
        &self,
        action: &Action<'_>,
        target: &PauseTarget,
    ) -> impl Future<Output = Result<Pause, OperatorError>> + Send;

    /// Resumes a paused route or consumer, with the audit record; a resumed route wakes the
    /// relays at once.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` (a malformed route key), `NotFound` (it is
    /// not paused), `PermissionDenied` (the role may only read), or the store's failure.
    fn resume(
        &self,
        target: &PauseTarget,
        actor: &Actor,
        reason: &str,
    ) -> impl Future<Output = Result<(), OperatorError>> + Send {
        async move {
            let action = Action::new("resume", actor, target.audit_selection(), reason);
            action.check(target.check(action.operation()))?;
            let result = self.apply_resume(&action, target).await;
            action.logged(result, |()| 1)
        }
    }

    /// The store's part of [`resume`](Self::resume), called once the target was checked: the
    /// pause removed with `action`'s audit record in one transaction (refused with
    /// [`PauseTarget::not_paused`] when there is none), and a resumed route's relays woken.
    /// Logs nothing.
    ///
    /// # Errors
    /// As [`resume`](Self::resume).
    fn apply_resume(
        &self,
        action: &Action<'_>,
        target: &PauseTarget,
    ) -> impl Future<Output = Result<(), OperatorError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_names_a_destination_or_an_aggregate_type() {
        assert!(PauseTarget::destination("payments").check("pause").is_ok());
        assert!(PauseTarget::aggregate_type("order").check("pause").is_ok());
        for bad in ["payments", "destination:", "type:", "queue:payments", ""] {
            let e = PauseTarget::Route(bad.into()).check("pause").unwrap_err();
            assert_eq!(
                e.kind,
                super::super::OperatorErrorKind::InvalidRequest,
                "{bad}"
            );
        }
        assert!(PauseTarget::Consumer(String::new()).check("pause").is_err());
        assert!(
            PauseTarget::Consumer("x".repeat(1025))
                .check("pause")
                .is_err()
        );
        assert_eq!(
            serde_json::to_value(PauseTarget::destination("p")).unwrap(),
            serde_json::json!({"route": "destination:p"})
        );
    }

    /// A fake store (pure logic): each hook counts its calls; a pause succeeds, a resume is
    /// refused as not paused.
    #[derive(Default)]
    struct FakePauses {
        applied: std::sync::atomic::AtomicUsize,
    }

    impl PauseOps for FakePauses {
        async fn pauses(&self) -> Result<Vec<Pause>, OperatorError> {
            Ok(Vec::new())
        }

        async fn apply_pause(
            &self,
            action: &Action<'_>,
            target: &PauseTarget,
        ) -> Result<Pause, OperatorError> {
            self.applied
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Pause::new(target, action, Utc::now(), 1))
        }

        async fn apply_resume(
            &self,
            action: &Action<'_>,
            target: &PauseTarget,
        ) -> Result<(), OperatorError> {
            self.applied
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err(target.not_paused(action.operation()))
        }
    }

    /// Counts the events of the target `outbox::audit` by level.
    #[derive(Clone, Default)]
    struct AuditLines(std::sync::Arc<std::sync::Mutex<Vec<tracing::Level>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for AuditLines {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            if event.metadata().target() == "outbox::audit" {
                self.0.lock().unwrap().push(*event.metadata().level());
            }
        }
    }

    #[tokio::test]
    async fn an_action_is_checked_before_its_hook_and_logged_once_by_the_core() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let lines = AuditLines::default();
        let _guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(lines.clone()));
        let store = FakePauses::default();
        let actor = Actor::new("alice", "test").unwrap();
        let route = PauseTarget::destination("payments");
        let applied = || store.applied.load(std::sync::atomic::Ordering::SeqCst);
        let taken = || std::mem::take(&mut *lines.0.lock().unwrap());

        let p = store.pause(&route, &actor, "broker down").await.unwrap();
        assert_eq!(
            (p.actor.as_deref(), p.reason.as_deref()),
            (Some("alice"), Some("broker down"))
        );
        assert_eq!((applied(), taken()), (1, vec![tracing::Level::INFO]));

        // No reason: refused by the core, the hook never called, one warning.
        let e = store.pause(&route, &actor, " ").await.unwrap_err();
        assert_eq!(e.kind, super::super::OperatorErrorKind::InvalidRequest);
        assert_eq!((applied(), taken()), (1, vec![tracing::Level::WARN]));

        // The hook's refusal: logged once, by the core.
        let e = store.resume(&route, &actor, "").await.unwrap_err();
        assert_eq!(e.operation, "resume");
        assert_eq!((applied(), taken()), (2, vec![tracing::Level::WARN]));
    }
}
