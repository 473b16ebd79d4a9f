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

/// A cell that kills `target` at `point` after `skip` passes, with a provider that honours
/// idempotency keys, expecting one effect per event: what most cells are.
const fn crash(
    id: &'static str,
    step: &'static str,
    target: Role,
    point: &'static str,
    skip: u64,
    expected: &'static str,
) -> Cell {
    Cell {
        id,
        step,
        target,
        point,
        action: Action::Abort,
        skip,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected,
    }
}

pub(super) const CELLS: &[Cell] = &[
    crash(
        "producer.before_commit",
        "before producer commit",
        Role::Producer,
        "producer.before_commit",
        40,
        "in-flight tx leaves no row and no intent (G1); the rest once",
    ),
    crash(
        "producer.after_commit",
        "after producer commit, before publish",
        Role::Producer,
        "producer.after_commit",
        40,
        "committed intent published later; one effect each",
    ),
    crash(
        "relay.after_publish",
        "after broker accept, before relay marker",
        Role::Relay,
        "relay.after_publish",
        30,
        "republished, same event_id; inbox absorbs (G3-G5)",
    ),
    crash(
        "relay.after_mark",
        "after relay marker",
        Role::Relay,
        "relay.after_mark",
        2,
        "nothing lost, nothing repeated",
    ),
    Cell {
        action: Action::Stop,
        ..crash(
            "relay.lease_expired",
            "relay lease expired while publishing",
            Role::Relay,
            "relay.after_publish",
            10,
            "other relay takes over; stale marks refused, order kept (G7)",
        )
    },
    Cell {
        action: Action::Takeover,
        ..crash(
            "relay.standby_takeover",
            "CDC: streaming relay dies, the standby takes the slot",
            Role::Relay,
            "relay.after_publish",
            20,
            "standby streams from the confirmed position; republished, same event_id",
        )
    },
    crash(
        "consumer.after_inbox",
        "consumer after inbox insert, before commit",
        Role::Consumer,
        "consumer.after_inbox",
        30,
        "rollback, redelivery, one effect (G5, G6)",
    ),
    crash(
        "consumer.after_effect",
        "consumer after business update, before commit",
        Role::Consumer,
        "consumer.after_effect",
        30,
        "rollback, redelivery, one effect (G5, G6)",
    ),
    crash(
        "consumer.after_commit",
        "consumer after commit, before ack",
        Role::Consumer,
        "consumer.after_commit",
        3,
        "redelivery, dedup, no second effect (G5)",
    ),
    crash(
        "payout.after_call",
        "payout: after provider call, before record",
        Role::Executor,
        "effects.after_call",
        10,
        "key + reconciliation: exactly one payout",
    ),
    Cell {
        provider_idempotent: false,
        expect: Expect::DoublePayout,
        ..crash(
            "payout.after_call.no_idempotency",
            "payout: after provider call, before record",
            Role::Executor,
            "effects.after_call",
            10,
            "provider ignores keys: DOUBLE payout (proof ends here)",
        )
    },
    crash(
        "payout.after_record",
        "payout: after recording the result",
        Role::Executor,
        "effects.after_record",
        10,
        "recorded outcome kept: exactly one payout",
    ),
    Cell {
        action: Action::SlowProvider,
        ..crash(
            "payout.answer_lost",
            "payout: provider answer lost (timeout)",
            Role::Executor,
            "",
            0,
            "unknown -> reconciled by key: one payout; backlog rises, falls",
        )
    },
];
