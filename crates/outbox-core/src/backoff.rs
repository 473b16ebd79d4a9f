//! Exponential backoff with jitter: one policy for every retry loop of the toolkit (failed
//! publishes, redelivered consumer events, remote-effect calls and lookups, store outages).

use std::time::Duration;

/// Exponential backoff with "equal jitter".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure (before jitter).
    pub base: Duration,
    /// Upper bound of the delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(500),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The policy the engines use while their store or broker is unreachable: from 200 ms up to
    /// 10 s.
    pub const OUTAGE: Self = Self {
        base: Duration::from_millis(200),
        max: Duration::from_secs(10),
    };

    /// The delay after `attempts` failures (1 = first failure): `base * 2^(attempts-1)` capped
    /// at `max`, then "equal jitter": a uniform pick in `[d/2, d]`, so workers that failed
    /// together do not retry together.
    pub fn delay(&self, attempts: i32) -> Duration {
        let exp = attempts.clamp(1, 32) as u32 - 1;
        let d = self
            .base
            .checked_mul(1u32.checked_shl(exp).unwrap_or(u32::MAX))
            .unwrap_or(self.max)
            .min(self.max);
        let half = d / 2;
        half + half.mul_f64(fastrand::f64())
    }

    /// True when `base` is positive and not above `max`, the condition every configuration that
    /// holds a backoff checks.
    pub fn is_valid(&self) -> bool {
        !self.base.is_zero() && self.max >= self.base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_is_capped_with_jitter() {
        let b = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        for _ in 0..100 {
            let d1 = b.delay(1);
            assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100));
            let d3 = b.delay(3);
            assert!(d3 >= Duration::from_millis(200) && d3 <= Duration::from_millis(400));
            let d30 = b.delay(30);
            assert!(d30 >= Duration::from_millis(500) && d30 <= Duration::from_secs(1));
        }
        assert!(b.is_valid());
        assert!(
            !Backoff {
                base: Duration::ZERO,
                ..b
            }
            .is_valid()
        );
        assert!(
            !Backoff {
                base: Duration::from_secs(2),
                ..b
            }
            .is_valid()
        );
    }
}
