//! An operator's pause: read from the store at most once per [`PAUSE_CHECK_INTERVAL`], and
//! waited out without taking anything from the source.

use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::{Consumer, Handler, metric};
use crate::consumer::source::DeliverySource;
use crate::consumer::store::InboxStore;

/// How often, at most, the engine asks its store whether the consumer is paused
/// ([`InboxStore::consumer_paused`]): a pause or a resume holds within this time, plus the
/// batch in progress.
pub const PAUSE_CHECK_INTERVAL: Duration = Duration::from_secs(1);

impl<S: InboxStore, Src: DeliverySource, H: Handler<S::Conn>> Consumer<S, Src, H> {
    /// Whether the consumer is paused: the store's answer, asked at most once per
    /// [`PAUSE_CHECK_INTERVAL`]. On a store error the last answer stands (logged): an outage
    /// neither pauses nor resumes a consumer.
    pub(super) async fn check_paused(&mut self) -> bool {
        if self
            .last_pause_check
            .is_some_and(|t| t.elapsed() < PAUSE_CHECK_INTERVAL)
        {
            return self.paused;
        }
        let first = self.last_pause_check.is_none();
        self.last_pause_check = Some(Instant::now());
        match self.store.consumer_paused(&self.config.name).await {
            Ok(paused) => {
                if paused != self.paused || first {
                    if paused {
                        info!(consumer = %self.config.name, "paused by an operator: taking no deliveries until resumed");
                    } else if !first {
                        info!(consumer = %self.config.name, "resumed by an operator");
                    }
                    metrics::gauge!(metric::PAUSED, "consumer" => self.config.name.clone())
                        .set(if paused { 1.0 } else { 0.0 });
                }
                self.paused = paused;
                self.stats.set_paused(paused);
            }
            Err(e) => {
                warn!(consumer = %self.config.name, error = %e, "could not read whether the consumer is paused")
            }
        }
        self.paused
    }

    /// Paused by an operator: nothing is taken from the source (the broker keeps it, and gets
    /// back what the source had received ahead) and no requeued dead letter is applied; the
    /// batch's wait passes idle (never less than 100 ms, whatever `batch_wait` says).
    pub(super) async fn wait_paused(&mut self) {
        self.source.release().await;
        tokio::time::sleep(
            self.config
                .batch_wait
                .clamp(Duration::from_millis(100), PAUSE_CHECK_INTERVAL),
        )
        .await;
    }
}
