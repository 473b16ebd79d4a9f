//! Pauses of the [`MemoryStore`]: of routes (not claimed) and of consumers.

use chrono::Utc;
use outbox_core::operator::{Action, OperatorError, Pause, PauseOps, PauseTarget};

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

    /// Pauses a route or a consumer; refused when it is paused already.
    async fn apply_pause(
        &self,
        action: &Action<'_>,
        target: &PauseTarget,
    ) -> Result<Pause, OperatorError> {
        let mut ops = lock(&self.inner.ops);
        let key = (target.kind(), target.name().to_owned());
        if ops.pauses.contains_key(&key) {
            return Err(target.paused_already(action.operation()));
        }
        let audit_id = ops.record(action, 1);
        let paused_at = Utc::now();
        ops.pauses.insert(
            key,
            PauseRow {
                paused_at,
                audit_id,
            },
        );
        Ok(Pause::new(target, action, paused_at, audit_id))
    }

    async fn apply_resume(
        &self,
        action: &Action<'_>,
        target: &PauseTarget,
    ) -> Result<(), OperatorError> {
        let removed = {
            let mut ops = lock(&self.inner.ops);
            let removed = ops
                .pauses
                .remove(&(target.kind(), target.name().to_owned()));
            if removed.is_some() {
                ops.record(action, 1);
            }
            removed
        };
        match removed {
            None => Err(target.not_paused(action.operation())),
            Some(_) => {
                // A resumed route's rows may be claimed now.
                if matches!(target, PauseTarget::Route(_)) {
                    self.inner.wake.notify_waiters();
                }
                Ok(())
            }
        }
    }
}
