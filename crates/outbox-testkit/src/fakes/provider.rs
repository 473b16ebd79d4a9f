//! [`FakeProvider`]: a payment provider with switches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::{CallOutcome, LookupOutcome, RemoteEffect, WorkItem};

use super::lock;

/// How the [`FakeProvider`] answers a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallMode {
    /// Perform (once per key when honouring keys) and answer `Succeeded`.
    Succeed,
    /// Perform, then take this long before answering `Succeeded` (a slow or hung provider).
    SucceedAfter(Duration),
    /// The request is lost before the provider sees it, but the caller cannot tell: `Unknown`.
    LostUnknown,
    /// The provider performs the effect, but the answer is lost: `Unknown`.
    PerformedUnknown,
    /// The request provably never left: `NotSent`.
    NotSent,
    /// The provider refuses: `Failed`.
    Fail,
}

/// The [`FakeProvider`]'s record and switches.
#[derive(Debug)]
pub struct ProviderState {
    /// How calls are answered.
    pub mode: CallMode,
    /// Keys whose calls take this long before answering (as `mode` says).
    pub slow_keys: HashMap<String, Duration>,
    /// Keys whose calls answer only once their gate has a permit (the test adds one): a call
    /// held as long as the test needs, with no clock involved.
    pub gates: HashMap<String, Arc<tokio::sync::Semaphore>>,
    /// Answer every lookup with `Unknown`.
    pub lookup_unknown: bool,
    /// Whether a second call with a known key returns the first result instead of acting again.
    pub honour_keys: bool,
    /// Every call, in order, by key.
    pub calls: Vec<String>,
    /// Every lookup, in order, by key.
    pub lookups: Vec<String>,
    /// Effects really performed: key -> reference.
    pub done: HashMap<String, String>,
    /// Effects performed in total (more than `done.len()` means a double payout).
    pub performed: usize,
}

/// A fake payment provider with switches; never a real service.
#[derive(Debug)]
pub struct FakeProvider(Mutex<ProviderState>);

impl FakeProvider {
    /// A provider answering calls as `mode`, honouring idempotency keys.
    pub fn new(mode: CallMode) -> Self {
        Self(Mutex::new(ProviderState {
            mode,
            slow_keys: HashMap::new(),
            gates: HashMap::new(),
            lookup_unknown: false,
            honour_keys: true,
            calls: Vec::new(),
            lookups: Vec::new(),
            done: HashMap::new(),
            performed: 0,
        }))
    }

    /// Reads or changes the state.
    pub fn with<R>(&self, f: impl FnOnce(&mut ProviderState) -> R) -> R {
        f(&mut lock(&self.0))
    }

    /// Calls made with `key`.
    pub fn calls_for(&self, key: &str) -> usize {
        self.with(|s| s.calls.iter().filter(|k| *k == key).count())
    }

    /// Lookups made for `key`.
    pub fn lookups_for(&self, key: &str) -> usize {
        self.with(|s| s.lookups.iter().filter(|k| *k == key).count())
    }

    /// Effects performed in total.
    pub fn performed(&self) -> usize {
        self.with(|s| s.performed)
    }

    fn perform(s: &mut ProviderState, key: &str) -> String {
        if s.honour_keys
            && let Some(r) = s.done.get(key)
        {
            return r.clone();
        }
        s.performed += 1;
        let reference = format!("ref-{}-{key}", s.performed);
        s.done.insert(key.to_owned(), reference.clone());
        reference
    }
}

impl RemoteEffect for FakeProvider {
    async fn call(&self, item: &WorkItem) -> CallOutcome {
        let key = item.idempotency_key.clone();
        let gate = self.with(|s| s.gates.get(&key).cloned());
        if let Some(gate) = gate {
            gate.acquire().await.expect("gate open").forget();
        }
        let (outcome, wait) = self.with(|s| {
            s.calls.push(key.clone());
            let slow = s.slow_keys.get(&key).copied();
            let (outcome, wait) = match s.mode {
                CallMode::Succeed => (
                    CallOutcome::Succeeded {
                        reference: Self::perform(s, &key),
                    },
                    None,
                ),
                CallMode::SucceedAfter(d) => (
                    CallOutcome::Succeeded {
                        reference: Self::perform(s, &key),
                    },
                    Some(d),
                ),
                CallMode::LostUnknown => (
                    CallOutcome::Unknown {
                        reason: "connection reset".into(),
                    },
                    None,
                ),
                CallMode::PerformedUnknown => {
                    Self::perform(s, &key);
                    (
                        CallOutcome::Unknown {
                            reason: "answer lost".into(),
                        },
                        None,
                    )
                }
                CallMode::NotSent => (
                    CallOutcome::NotSent {
                        reason: "connection refused".into(),
                    },
                    None,
                ),
                CallMode::Fail => (
                    CallOutcome::Failed {
                        reason: "insufficient funds".into(),
                    },
                    None,
                ),
            };
            (outcome, wait.or(slow))
        });
        if let Some(d) = wait {
            tokio::time::sleep(d).await;
        }
        outcome
    }

    async fn lookup(&self, item: &WorkItem) -> LookupOutcome {
        self.with(|s| {
            s.lookups.push(item.idempotency_key.clone());
            if s.lookup_unknown {
                LookupOutcome::Unknown {
                    reason: "503".into(),
                }
            } else if let Some(r) = s.done.get(&item.idempotency_key) {
                LookupOutcome::Succeeded {
                    reference: r.clone(),
                }
            } else {
                LookupOutcome::NotFound
            }
        })
    }
}
