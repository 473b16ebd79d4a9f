//! The cells of the matrix: which process dies where, and what the design says must follow.

use super::RelayMode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Producer,
    Relay,
    Consumer,
    Executor,
    Provider,
}

impl Role {
    pub(super) fn name(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Relay => "relay",
            Role::Consumer => "consumer",
            Role::Executor => "executor",
            Role::Provider => "provider",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expect {
    /// All invariants hold, exactly one payout per payment.
    ExactlyOnce,
    /// All invariants hold except that some payment was paid out twice.
    DoublePayout,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Abort,
    /// Freeze at the point (SIGSTOP) past the relay lease, then resume (SIGCONT).
    Stop,
    /// No crash point: the provider answers slower than the executor's call timeout.
    SlowProvider,
    /// CDC only: abort at the point and stay down, so that the second relay, a standby on the
    /// slot, must take the stream over alone.
    Takeover,
}

impl Cell {
    /// What the cell expects with `mode`'s relay. The CDC relay confirms its position with the
    /// next status update (every second), not with the settle: killed after the settle, it
    /// sends the last unconfirmed events again (same event ids, absorbed by the inbox).
    pub(super) fn expected_in(&self, mode: RelayMode) -> &'static str {
        match (self.id, mode) {
            ("relay.after_mark", RelayMode::Cdc) => {
                "nothing lost; the events settled since the last confirm go out again, same event_id"
            }
            _ => self.expected,
        }
    }
}

impl Action {
    /// Whether a cell with this action means anything for `mode`'s relay: leases exist only
    /// in polling mode, standbys only in CDC mode.
    pub(super) fn applies_to(self, mode: RelayMode) -> bool {
        match self {
            Action::Stop => mode == RelayMode::Polling,
            Action::Takeover => mode == RelayMode::Cdc,
            Action::Abort | Action::SlowProvider => true,
        }
    }
}

/// One row of the matrix.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cell {
    pub(super) id: &'static str,
    pub(super) step: &'static str,
    pub(super) target: Role,
    pub(super) point: &'static str,
    pub(super) action: Action,
    pub(super) skip: u64,
    pub(super) provider_idempotent: bool,
    pub(super) expect: Expect,
    pub(super) expected: &'static str,
}

pub(super) const CELLS: &[Cell] = &[
    Cell {
        id: "producer.before_commit",
        step: "before producer commit",
        target: Role::Producer,
        point: "producer.before_commit",
        action: Action::Abort,
        skip: 40,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "in-flight tx leaves no row and no intent (G1); the rest once",
    },
    Cell {
        id: "producer.after_commit",
        step: "after producer commit, before publish",
        target: Role::Producer,
        point: "producer.after_commit",
        action: Action::Abort,
        skip: 40,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "committed intent published later; one effect each",
    },
    Cell {
        id: "relay.after_publish",
        step: "after broker accept, before relay marker",
        target: Role::Relay,
        point: "relay.after_publish",
        action: Action::Abort,
        skip: 30,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "republished, same event_id; inbox absorbs (G3-G5)",
    },
    Cell {
        id: "relay.after_mark",
        step: "after relay marker",
        target: Role::Relay,
        point: "relay.after_mark",
        action: Action::Abort,
        skip: 2,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "nothing lost, nothing repeated",
    },
    Cell {
        id: "relay.lease_expired",
        step: "relay lease expired while publishing",
        target: Role::Relay,
        point: "relay.after_publish",
        action: Action::Stop,
        skip: 10,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "other relay takes over; stale marks refused, order kept (G7)",
    },
    Cell {
        id: "relay.standby_takeover",
        step: "CDC: streaming relay dies, the standby takes the slot",
        target: Role::Relay,
        point: "relay.after_publish",
        action: Action::Takeover,
        skip: 20,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "standby streams from the confirmed position; republished, same event_id",
    },
    Cell {
        id: "consumer.after_inbox",
        step: "consumer after inbox insert, before commit",
        target: Role::Consumer,
        point: "consumer.after_inbox",
        action: Action::Abort,
        skip: 30,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "rollback, redelivery, one effect (G5, G6)",
    },
    Cell {
        id: "consumer.after_effect",
        step: "consumer after business update, before commit",
        target: Role::Consumer,
        point: "consumer.after_effect",
        action: Action::Abort,
        skip: 30,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "rollback, redelivery, one effect (G5, G6)",
    },
    Cell {
        id: "consumer.after_commit",
        step: "consumer after commit, before ack",
        target: Role::Consumer,
        point: "consumer.after_commit",
        action: Action::Abort,
        skip: 3,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "redelivery, dedup, no second effect (G5)",
    },
    Cell {
        id: "payout.after_call",
        step: "payout: after provider call, before record",
        target: Role::Executor,
        point: "effects.after_call",
        action: Action::Abort,
        skip: 10,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "key + reconciliation: exactly one payout",
    },
    Cell {
        id: "payout.after_call.no_idempotency",
        step: "payout: after provider call, before record",
        target: Role::Executor,
        point: "effects.after_call",
        action: Action::Abort,
        skip: 10,
        provider_idempotent: false,
        expect: Expect::DoublePayout,
        expected: "provider ignores keys: DOUBLE payout (proof ends here)",
    },
    Cell {
        id: "payout.after_record",
        step: "payout: after recording the result",
        target: Role::Executor,
        point: "effects.after_record",
        action: Action::Abort,
        skip: 10,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "recorded outcome kept: exactly one payout",
    },
    Cell {
        id: "payout.answer_lost",
        step: "payout: provider answer lost (timeout)",
        target: Role::Executor,
        point: "",
        action: Action::SlowProvider,
        skip: 0,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "unknown -> reconciled by key: one payout; backlog rises, falls",
    },
];
