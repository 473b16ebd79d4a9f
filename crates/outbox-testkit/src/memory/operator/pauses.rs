//! Pauses of the [`MemoryStore`]: of routes (not claimed) and of consumers.

use chrono::Utc;
use outbox_core::operator::{Action, Actor, OperatorError, Pause, PauseOps, PauseTarget};

use super::PauseRow;
use crate::memory::{MemoryStore, lock};

impl PauseOps for MemoryStore {
    /// Every pause in force, by kind (consumers, then routes) and name.
    async fn pauses(&self) -> Result<Vec<Pause>, OperatorError> {
        let ops = lock(&self.inner.ops);
        let mut pauses = Vec::with_capacity(ops.pauses.len());
        for kind in ["consumer", "route"] {
            for ((_, name), p) in ops.pauses.iter().filter(|((k, _), _)| *k == kind) {
                let record = ops.entry(p.audit_id);
                pauses.push(Pause {
                    kind: kind.to_owned(),
                    name: name.clone(),
                    paused_at: p.paused_at,
                    audit_id: p.audit_id,
                    actor: record.map(|a| a.actor.clone()),
                    reason: record.map(|a| a.reason.clone()),
                });
            }
        }
        Ok(pauses)
    }

    /// Pauses a route or a consumer; never refused for a log-streaming relay (the fake has
    /// none).
    async fn pause(
        &self,
        target: &PauseTarget,
        actor: &Actor,
        reason: &str,
    ) -> Result<Pause, OperatorError> {
        const OP: &str = "pause";
        let action = Action::new(OP, actor, target.audit_selection(), reason);
        let result = target.check_pause(OP, reason).and_then(|()| {
            let mut ops = lock(&self.inner.ops);
            let key = (target.kind(), target.name().to_owned());
            if ops.pauses.contains_key(&key) {
                return Err(target.paused_already(OP));
            }
            let audit_id = ops.record(&action, 1);
            let paused_at = Utc::now();
            ops.pauses.insert(
                key,
                PauseRow {
                    paused_at,
                    audit_id,
                },
            );
            Ok(Pause::new(target, &action, paused_at, audit_id))
        });
        action.logged(result, |_| 1)
    }

    async fn resume(
        &self,
        target: &PauseTarget,
        actor: &Actor,
        reason: &str,
    ) -> Result<(), OperatorError> {
        const OP: &str = "resume";
        let action = Action::new(OP, actor, target.audit_selection(), reason);
        let result = target.check(OP).and_then(|()| {
            let mut ops = lock(&self.inner.ops);
            match ops
                .pauses
                .remove(&(target.kind(), target.name().to_owned()))
            {
                None => Err(target.not_paused(OP)),
                Some(_) => {
                    ops.record(&action, 1);
                    Ok(())
                }
            }
        });
        // A resumed route's rows may be claimed now.
        if result.is_ok() && matches!(target, PauseTarget::Route(_)) {
            self.inner.wake.notify_waiters();
        }
        action.logged(result, |()| 1)
    }
}
