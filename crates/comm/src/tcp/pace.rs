//! A token bucket on what a rank writes to its right neighbour
//! (`CommConfig::with_link_rate`): the ring behaves as if each link were
//! that slow, so the bytes a communication hook saves can be measured on
//! one machine, where the links are memory copies. Tokens (bytes) accrue
//! at the rate up to a few milliseconds' worth; a write takes at most what
//! is there. Applied in the sender, not by the kernel (`tc` on loopback
//! would slow every other process on the machine, and does not touch the
//! Unix sockets that neighbours on one machine use).

use std::cell::Cell;
use std::time::{Duration, Instant};

/// The most a link sends at once after idling, in time at its rate.
const BURST: Duration = Duration::from_millis(5);
/// The smallest write worth a system call (fewer bytes only to finish a
/// message); a slower link's burst is smaller still.
const MIN_WRITE: f64 = 16_384.0;

#[derive(Debug)]
pub(crate) struct Pace {
    /// Bytes per second.
    rate: f64,
    /// The bucket's size in bytes.
    burst: f64,
    /// Tokens in the bucket, and when they were counted.
    bucket: Cell<(f64, Instant)>,
}

impl Pace {
    pub(crate) fn new(bytes_per_second: u64) -> Self {
        let rate = bytes_per_second.max(1) as f64;
        let burst = (rate * BURST.as_millis() as f64 / 1000.0).max(1.0);
        Pace {
            rate,
            burst,
            bucket: Cell::new((burst, Instant::now())),
        }
    }

    /// How many of `want` bytes may be written now, or how long until a
    /// write is worth making.
    pub(crate) fn allowance(&self, want: usize) -> Result<usize, Duration> {
        self.allowance_at(want, Instant::now())
    }

    fn allowance_at(&self, want: usize, now: Instant) -> Result<usize, Duration> {
        let (tokens, then) = self.bucket.get();
        let tokens = (tokens + now.duration_since(then).as_secs_f64() * self.rate).min(self.burst);
        self.bucket.set((tokens, now));
        let worth = (want as f64).min(MIN_WRITE).min(self.burst);
        if tokens >= worth {
            Ok((tokens as usize).min(want))
        } else {
            Err(Duration::from_secs_f64((worth - tokens) / self.rate))
        }
    }

    /// Takes the tokens of `bytes` written.
    pub(crate) fn spend(&self, bytes: usize) {
        let (tokens, then) = self.bucket.get();
        self.bucket.set((tokens - bytes as f64, then));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_lets_its_burst_go_then_asks_to_wait_for_the_rest() {
        // 1 MB/s: a burst of 5,000 bytes.
        let pace = Pace::new(1_000_000);
        let t0 = pace.bucket.get().1;
        assert_eq!(pace.allowance_at(100, t0), Ok(100));
        assert_eq!(pace.allowance_at(1 << 20, t0), Ok(5_000));
        pace.spend(5_000);
        // The next write worth making (the burst, under MIN_WRITE) in 5 ms.
        let wait = pace.allowance_at(1 << 20, t0).unwrap_err();
        assert!(
            wait.abs_diff(Duration::from_millis(5)) < Duration::from_micros(1),
            "{wait:?}"
        );
        // 2 ms later 2,000 bytes are back: a short message's tail goes.
        let t2 = t0 + Duration::from_millis(2);
        assert_eq!(pace.allowance_at(1_500, t2), Ok(1_500));
        pace.spend(1_500);
        // Never more than the burst, however long the link idled.
        assert_eq!(
            pace.allowance_at(1 << 20, t2 + Duration::from_secs(9)),
            Ok(5_000)
        );
    }
}
