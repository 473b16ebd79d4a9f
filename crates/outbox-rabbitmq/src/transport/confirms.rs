//! Pairing publisher confirms with returned messages by event id.
//!
//! A mandatory publish that no queue receives comes back as `basic.return`. lapin attaches each
//! return to whichever confirm it resolves next, not to the publish it belongs to, and RabbitMQ
//! may deliver a return after the (multiple) ack that covers its message. Taken at face value, a
//! returned publish can look confirmed: an event nobody received would count as sent.
//!
//! The [`Collector`] (one task per channel) sees every confirm of the channel and decides
//! publishes in *cohorts*:
//!
//! 1. publishes run in spawned tasks (a caller's cancellation cannot drop a confirm that may
//!    carry someone else's return), take a ticket before `basic.publish`, and always register;
//! 2. when something resolved, the collector waits until every ticket taken so far registered,
//!    takes all undecided publishes as the cohort, and publishes a *probe*: an empty message to
//!    a queue name that does not exist, through the default exchange, not mandatory (the broker
//!    drops it and acknowledges it);
//! 3. every return attached to any resolved confirm is harvested into a map by its
//!    `message_id` (our event id), whichever confirm lapin put it on;
//! 4. once the probe and every cohort member resolved, each member is decided: returned if its
//!    event id was harvested, else by its own ack or nack. The broker sent every cohort
//!    member's return before it acknowledged the probe (it routed the member before it even
//!    received the probe), so all those returns reached lapin before the probe's ack, and
//!    were attached to confirms that resolved no later than the probe: harvested.
//!
//! The probe costs one tiny publish per cohort (a cohort holds every publish confirmed in the
//! meantime, so under load it is one probe for many messages).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use lapin::message::BasicReturnMessage;
use lapin::options::BasicPublishOptions;
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation, PublisherConfirm};
use tokio::sync::{mpsc, oneshot};
use tracing::{error, warn};

/// Routing key of the probe on the default exchange: a queue name nobody declares.
const PROBE_ROUTING_KEY: &str = "outbox.confirm-probe.no-such-queue";
/// `message_id` of the probe.
const PROBE_ID: &str = "outbox-confirm-probe";
/// How long the collector waits for publishes that took a ticket to register.
const REGISTRATION_WAIT: Duration = Duration::from_secs(5);

/// The collector's verdict for one publish.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Confirmed, and not returned: routed to at least one queue.
    Routed,
    /// Returned by the broker (no queue for its routing key, or too large).
    Returned(Box<BasicReturnMessage>),
    /// `basic.nack`.
    Nacked,
    /// The channel is not in confirm mode.
    NotRequested,
    /// Confirmed, but the collector could not make sure it was not returned (the probe could not
    /// be published or a publish never registered): retry it, the same event id.
    Undecided(String),
    /// The confirm failed (channel or connection closed).
    Failed(lapin::Error),
    /// The collector is gone (the runtime is shutting down).
    Stopped,
}

enum Registration {
    Confirm {
        ticket: u64,
        event_id: String,
        confirm: PublisherConfirm,
        reply: oneshot::Sender<Verdict>,
    },
    /// The publish failed before a confirm existed; its caller already has the error.
    NoConfirm { ticket: u64 },
}

/// The sending side, kept with the channel.
#[derive(Clone)]
pub(crate) struct Collector {
    tx: mpsc::UnboundedSender<Registration>,
    tickets: Arc<AtomicU64>,
}

impl Collector {
    /// Starts the collector task for `channel` (in confirm mode).
    pub(crate) fn spawn(channel: Channel) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let tickets = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(rx, Arc::clone(&tickets), channel));
        Self { tx, tickets }
    }

    /// Takes a ticket; call right before `basic.publish`, in the task that will register.
    pub(crate) fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::SeqCst)
    }

    /// Hands a confirm to the collector; the verdict arrives on the returned receiver.
    pub(crate) fn register(
        &self,
        ticket: u64,
        event_id: String,
        confirm: PublisherConfirm,
    ) -> oneshot::Receiver<Verdict> {
        let (reply, rx) = oneshot::channel();
        if let Err(mpsc::error::SendError(Registration::Confirm { reply, .. })) =
            self.tx.send(Registration::Confirm {
                ticket,
                event_id,
                confirm,
                reply,
            })
        {
            let _ = reply.send(Verdict::Stopped);
        }
        rx
    }

    /// Accounts for a ticket whose publish produced no confirm.
    pub(crate) fn register_failure(&self, ticket: u64) {
        let _ = self.tx.send(Registration::NoConfirm { ticket });
    }
}

enum Status {
    Ack,
    Nack,
    NotRequested,
    Failed(lapin::Error),
}

struct State {
    futs: FuturesUnordered<BoxFuture<'static, (u64, Result<Confirmation, lapin::Error>)>>,
    /// Registered, undecided publishes by key.
    waiting: HashMap<u64, (String, oneshot::Sender<Verdict>)>,
    /// Resolved confirms (publishes and probes) by key, not yet decided.
    resolved: HashMap<u64, Status>,
    /// Harvested returns by event id.
    returned: HashMap<String, BasicReturnMessage>,
    next_key: u64,
    /// Tickets below `watermark` registered; `early` holds registered ones above it.
    watermark: u64,
    early: BTreeSet<u64>,
}

impl State {
    fn add(&mut self, r: Registration) {
        let ticket = match r {
            Registration::Confirm {
                ticket,
                event_id,
                confirm,
                reply,
            } => {
                let key = self.next_key;
                self.next_key += 1;
                self.waiting.insert(key, (event_id, reply));
                self.futs.push(async move { (key, confirm.await) }.boxed());
                ticket
            }
            Registration::NoConfirm { ticket } => ticket,
        };
        self.early.insert(ticket);
        while self.early.remove(&self.watermark) {
            self.watermark += 1;
        }
    }

    fn on_resolved(&mut self, key: u64, result: Result<Confirmation, lapin::Error>) {
        let (status, attached) = match result {
            Ok(Confirmation::Ack(m)) => (Status::Ack, m),
            Ok(Confirmation::Nack(m)) => (Status::Nack, m),
            Ok(Confirmation::NotRequested) => (Status::NotRequested, None),
            Err(e) => (Status::Failed(e), None),
        };
        if let Some(m) = attached {
            let id = m
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(ShortString::to_string)
                .unwrap_or_default();
            self.returned.insert(id, m);
        }
        self.resolved.insert(key, status);
    }

    /// Harvests every confirm that is already resolved.
    fn drain_ready(&mut self) {
        while let Some(Some((key, result))) = self.futs.next().now_or_never() {
            self.on_resolved(key, result);
        }
    }

    fn decide(&mut self, key: u64, undecided: Option<&str>) {
        let Some((event_id, reply)) = self.waiting.remove(&key) else {
            return;
        };
        let status = self.resolved.remove(&key);
        let verdict = if let Some(m) = self.returned.remove(&event_id) {
            Verdict::Returned(Box::new(m))
        } else {
            match status {
                Some(Status::Failed(e)) => Verdict::Failed(e),
                Some(Status::NotRequested) => Verdict::NotRequested,
                Some(Status::Nack) => Verdict::Nacked,
                Some(Status::Ack) => match undecided {
                    None => Verdict::Routed,
                    Some(why) => Verdict::Undecided(why.to_owned()),
                },
                None => Verdict::Undecided("no confirm".to_owned()),
            }
        };
        let _ = reply.send(verdict);
    }
}

async fn run(
    mut rx: mpsc::UnboundedReceiver<Registration>,
    tickets: Arc<AtomicU64>,
    channel: Channel,
) {
    let mut st = State {
        futs: FuturesUnordered::new(),
        waiting: HashMap::new(),
        resolved: HashMap::new(),
        returned: HashMap::new(),
        next_key: 0,
        watermark: 0,
        early: BTreeSet::new(),
    };
    let mut closed = false;
    // The probe in flight and the cohort it decides.
    let mut probe: Option<(u64, HashSet<u64>)> = None;
    loop {
        if closed && st.futs.is_empty() && st.waiting.is_empty() {
            return;
        }
        // Start a cohort once something resolved and no probe is in flight.
        if probe.is_none() && st.resolved.keys().any(|k| st.waiting.contains_key(k)) {
            let mut complete = true;
            let target = tickets.load(Ordering::SeqCst);
            let deadline = tokio::time::Instant::now() + REGISTRATION_WAIT;
            while st.watermark < target {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(r)) => st.add(r),
                    Ok(None) => {
                        closed = true;
                        break;
                    }
                    Err(_) => {
                        complete = false;
                        break;
                    }
                }
            }
            let cohort: HashSet<u64> = st.waiting.keys().copied().collect();
            let published = if complete {
                channel
                    .basic_publish(
                        ShortString::from(""),
                        ShortString::from(PROBE_ROUTING_KEY),
                        BasicPublishOptions::default(),
                        &[],
                        BasicProperties::default().with_message_id(ShortString::from(PROBE_ID)),
                    )
                    .await
                    .map_err(|e| e.to_string())
            } else {
                Err("publishes did not register in time".to_owned())
            };
            match published {
                Ok(confirm) => {
                    let key = st.next_key;
                    st.next_key += 1;
                    st.futs.push(async move { (key, confirm.await) }.boxed());
                    probe = Some((key, cohort));
                }
                Err(e) => {
                    // Without a probe nothing confirmed can be called routed: the resolved
                    // members are retried (same event id); the others wait for the next cohort.
                    warn!(error = %e, "cannot publish the confirm probe; resolved publishes are retried");
                    st.drain_ready();
                    let why = format!("the confirm probe could not be published: {e}");
                    let done: Vec<u64> = cohort
                        .iter()
                        .copied()
                        .filter(|k| st.resolved.contains_key(k))
                        .collect();
                    for k in done {
                        st.decide(k, Some(&why));
                    }
                }
            }
        }
        if let Some((probe_key, cohort)) = &probe
            && st.resolved.contains_key(probe_key)
            && cohort.iter().all(|k| st.resolved.contains_key(k))
        {
            st.drain_ready();
            let probe_status = st.resolved.remove(probe_key);
            let undecided = match probe_status {
                Some(Status::Ack) => None,
                Some(Status::Failed(e)) => Some(format!("the confirm probe failed: {e}")),
                _ => Some("the confirm probe was not acknowledged".to_owned()),
            };
            for k in cohort.clone() {
                st.decide(k, undecided.as_deref());
            }
            st.returned.remove(PROBE_ID);
            probe = None;
            if st.returned.len() > 10_000 {
                error!(
                    held = st.returned.len(),
                    "dropping returned messages nobody claimed"
                );
                st.returned.clear();
            }
            // Publishes that resolved meanwhile start the next cohort at once.
            continue;
        }
        tokio::select! {
            r = rx.recv(), if !closed => match r {
                Some(r) => st.add(r),
                None => closed = true,
            },
            Some((key, result)) = st.futs.next(), if !st.futs.is_empty() => {
                st.on_resolved(key, result);
                st.drain_ready();
            }
            else => return,
        }
    }
}
