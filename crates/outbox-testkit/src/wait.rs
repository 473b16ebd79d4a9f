//! Bounded polling: wait until a condition holds, or fail saying what did not happen.

use std::time::Duration;

use tokio::time::Instant;

/// Pause between two polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Calls `poll` until it returns `Ok(Some(value))`, at most for `within`, and returns the value.
/// `poll` is an async closure, so it may borrow what it polls (a source, a transport)
/// mutably.
///
/// # Errors
/// The first error `poll` returns (a hard failure, not a "not yet"), or, when `within` passed
/// without a value, an error naming `what`.
pub async fn until<T>(
    what: &str,
    within: Duration,
    mut poll: impl AsyncFnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = poll().await? {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            anyhow::bail!("{what}: did not happen within {within:?}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_value_or_names_what_did_not_happen() {
        let mut n = 0;
        let got = until("n reaches 3", Duration::from_secs(5), async || {
            n += 1;
            Ok((n >= 3).then_some(n))
        })
        .await
        .unwrap();
        assert_eq!(got, 3);

        let e = until::<()>("never", Duration::from_millis(120), async || Ok(None))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("never"), "{e}");

        let e = until::<()>("fails", Duration::from_secs(5), async || {
            Err(anyhow::anyhow!("hard failure"))
        })
        .await
        .unwrap_err();
        assert_eq!(e.to_string(), "hard failure");
    }
}
