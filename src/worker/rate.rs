//! `processing.maxRate`: this pod's share of the consumer's rate, paced with a token bucket. A receive
//! takes a token per message it asks for before it goes out (and gives back what it did not get), so
//! no received message ever waits for a token: the pace costs no visibility and SIGTERM has nothing of it to release.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::metrics::Metrics;

/// How often the share file is read: the kubelet rewrites a downward-API file within about a minute
/// of an annotation change; a read every few seconds adds little to that and costs nothing.
pub const SHARE_POLL: Duration = Duration::from_secs(2);

/// Tokens a bucket may hold (and so messages one receive may ask for): one second of the rate,
/// at least one message, at most one receive's `batch_size`. A second is what an SRE reads a rate
/// over; a whole batch keeps receives full at rates of 10/s and more.
pub fn burst(rate: f64, batch_size: usize) -> f64 {
    rate.ceil().clamp(1.0, batch_size.max(1) as f64)
}

/// A token bucket over explicit instants (pure: the caller passes the time). It starts empty, so
/// a new pod comes in under its share rather than over it. Over any span of length t it grants at
/// most rate × t + burst tokens (net of what is given back).
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

/// The answer to a request for tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// Taken: this many (the request, at most the burst).
    Take(usize),
    /// Not enough yet: ask again at this instant.
    At(Instant),
}

/// Rounding slack: a token short by less than this counts as there (float refills over many steps).
const EPSILON: f64 = 1e-9;

impl TokenBucket {
    /// `rate` in tokens per second, positive and finite (the caller's parse guarantees it).
    pub fn new(rate: f64, batch_size: usize, now: Instant) -> Self {
        TokenBucket {
            rate,
            burst: burst(rate, batch_size),
            tokens: 0.0,
            at: now,
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    pub fn burst(&self) -> f64 {
        self.burst
    }

    fn refill(&mut self, now: Instant) {
        if now > self.at {
            let dt = now.duration_since(self.at).as_secs_f64();
            self.tokens = (self.tokens + dt * self.rate).min(self.burst);
            self.at = now;
        }
    }

    /// A new rate from `now` on: what accrued so far accrued at the old one; tokens above the new
    /// burst are dropped.
    pub fn set_rate(&mut self, rate: f64, batch_size: usize, now: Instant) {
        self.refill(now);
        self.rate = rate;
        self.burst = burst(rate, batch_size);
        self.tokens = self.tokens.min(self.burst);
    }

    /// Takes min(want, burst) tokens if they are there; else says when they will be. `want` 0 takes 0.
    pub fn grant(&mut self, want: usize, now: Instant) -> Grant {
        self.refill(now);
        let n = (want as f64).min(self.burst).floor();
        if self.tokens + EPSILON >= n {
            self.tokens = (self.tokens - n).max(0.0);
            return Grant::Take(n as usize);
        }
        let secs = (n - self.tokens) / self.rate;
        // Rounded up to the microsecond, so the wake finds the tokens there.
        let wait = Duration::from_micros((secs * 1e6).ceil() as u64 + 1);
        Grant::At(now + wait)
    }

    /// Gives back tokens taken for messages a receive did not return.
    pub fn refund(&mut self, n: usize, now: Instant) {
        self.refill(now);
        self.tokens = (self.tokens + n as f64).min(self.burst);
    }
}

/// A share as the controller writes it (and `--max-rate` takes it): messages per second, a positive
/// finite decimal such as `6.667`. Surrounding whitespace is ignored.
pub fn parse_share(text: &str) -> Result<f64, String> {
    let t = text.trim();
    match t.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "{t:?} is not a rate: write messages per second as a positive number, e.g. 6.667"
        )),
    }
}

/// What the share file says: a share, nothing yet (empty or missing: the controller has not
/// annotated the pod), or something unreadable.
#[derive(Clone, Debug, PartialEq)]
pub enum ShareFile {
    Share(f64),
    Unset,
    Invalid(String),
}

pub fn read_share_file(path: &Path) -> ShareFile {
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => ShareFile::Unset,
        Ok(text) => match parse_share(&text) {
            Ok(v) => ShareFile::Share(v),
            Err(e) => ShareFile::Invalid(e),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => ShareFile::Unset,
        Err(e) => ShareFile::Invalid(format!("cannot read it: {e}")),
    }
}

/// The share in force: the file's last good value, else `initial` (`--max-rate`). Reads the file
/// now and then every `poll`; an unreadable value keeps the last good one and is logged once (until
/// the file changes again).
pub fn watch_share(path: Option<PathBuf>, initial: f64, poll: Duration) -> watch::Receiver<f64> {
    let mut bad: Option<String> = None;
    let mut current = initial;
    if let Some(p) = &path {
        apply_file(p, &mut current, &mut bad);
    }
    let (tx, rx) = watch::channel(current);
    if let Some(path) = path {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(poll).await;
                let before = current;
                apply_file(&path, &mut current, &mut bad);
                if current.to_bits() != before.to_bits() && tx.send(current).is_err() {
                    return;
                }
                if tx.is_closed() {
                    return;
                }
            }
        });
    }
    rx
}

fn apply_file(path: &Path, current: &mut f64, bad: &mut Option<String>) {
    match read_share_file(path) {
        ShareFile::Share(v) => {
            *bad = None;
            // Exactly the value written: any change is news.
            if v.to_bits() != current.to_bits() {
                tracing::info!(from = *current, to = v, file = %path.display(), "rate share changed");
                *current = v;
            }
        }
        ShareFile::Unset => {}
        ShareFile::Invalid(why) => {
            if bad.as_deref() != Some(why.as_str()) {
                tracing::warn!(file = %path.display(), keeping = *current, reason = %why, "cannot use the rate share file; keeping the last good share");
                *bad = Some(why);
            }
        }
    }
}

/// The dispatcher's side: the bucket at the share in force, and the time spent waiting for tokens.
pub struct Limiter {
    bucket: TokenBucket,
    share: watch::Receiver<f64>,
    batch_size: usize,
    metrics: Arc<Metrics>,
    throttled_since: Option<Instant>,
}

impl Limiter {
    pub fn new(
        share: watch::Receiver<f64>,
        batch_size: usize,
        metrics: Arc<Metrics>,
        now: Instant,
    ) -> Self {
        let rate = *share.borrow();
        metrics.set_rate_share(rate);
        Limiter {
            bucket: TokenBucket::new(rate, batch_size, now),
            share,
            batch_size,
            metrics,
            throttled_since: None,
        }
    }

    /// Tokens for a receive of up to `want` messages, or when to ask again.
    pub fn grant(&mut self, want: usize, now: Instant) -> Grant {
        let g = self.bucket.grant(want, now);
        match g {
            Grant::Take(_) => {
                if let Some(since) = self.throttled_since.take() {
                    self.metrics
                        .rate_throttled_micros
                        .add(now.duration_since(since).as_micros() as u64);
                }
            }
            Grant::At(_) => {
                self.throttled_since.get_or_insert(now);
            }
        }
        g
    }

    pub fn refund(&mut self, n: usize, now: Instant) {
        if n > 0 {
            self.bucket.refund(n, now);
        }
    }

    /// Returns once the share changed, with the bucket at the new one; never if it cannot change.
    pub async fn changed(&mut self) {
        if self.share.changed().await.is_err() {
            return std::future::pending().await;
        }
        let rate = *self.share.borrow_and_update();
        self.bucket.set_rate(rate, self.batch_size, Instant::now());
        self.metrics.set_rate_share(rate);
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // exact values: the bucket's arithmetic is exact on these
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn starts_empty_and_fills_at_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(20.0, 10, t0);
        assert_eq!(b.burst(), 10.0);
        let Grant::At(at) = b.grant(10, t0) else {
            panic!("an empty bucket granted")
        };
        // 10 tokens at 20/s: half a second.
        assert!(at >= ms(t0, 500) && at <= ms(t0, 501), "{:?}", at - t0);
        assert_eq!(b.grant(10, at), Grant::Take(10));
        assert!(matches!(b.grant(1, at), Grant::At(_)));
    }

    #[test]
    fn a_request_is_cut_to_the_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(3.0, 10, t0);
        assert_eq!(b.burst(), 3.0);
        assert_eq!(b.grant(10, ms(t0, 5000)), Grant::Take(3));
    }

    #[test]
    fn burst_is_a_second_of_the_rate_within_one_message_and_one_batch() {
        assert_eq!(burst(0.2, 10), 1.0);
        assert_eq!(burst(6.67, 10), 7.0);
        assert_eq!(burst(500.0, 10), 10.0);
        assert_eq!(burst(500.0, 1), 1.0);
    }

    #[test]
    fn refunds_are_capped_at_the_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 10, t0);
        assert_eq!(b.grant(10, ms(t0, 1000)), Grant::Take(10));
        b.refund(10, ms(t0, 1000));
        b.refund(10, ms(t0, 1000));
        assert_eq!(b.grant(10, ms(t0, 1000)), Grant::Take(10));
        assert!(matches!(b.grant(1, ms(t0, 1000)), Grant::At(_)));
    }

    #[test]
    fn a_lower_rate_drops_tokens_above_its_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(20.0, 10, t0);
        b.set_rate(2.0, 10, ms(t0, 1000));
        assert_eq!(b.grant(10, ms(t0, 1000)), Grant::Take(2));
        // Then 2/s: one more token after half a second.
        assert_eq!(b.grant(1, ms(t0, 1500)), Grant::Take(1));
    }

    #[test]
    fn share_text_is_a_positive_number() {
        assert_eq!(parse_share(" 6.667\n"), Ok(6.667));
        assert_eq!(parse_share("20"), Ok(20.0));
        for bad in ["0", "-1", "NaN", "inf", "fast", "1e400"] {
            let e = parse_share(bad).expect_err(bad);
            assert!(e.contains("positive number"), "{e}");
        }
    }

    #[test]
    fn share_file_states() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("share");
        assert_eq!(read_share_file(&p), ShareFile::Unset);
        std::fs::write(&p, "").expect("write");
        assert_eq!(read_share_file(&p), ShareFile::Unset);
        std::fs::write(&p, "6.5").expect("write");
        assert_eq!(read_share_file(&p), ShareFile::Share(6.5));
        std::fs::write(&p, "six").expect("write");
        assert!(matches!(read_share_file(&p), ShareFile::Invalid(_)));
    }

    #[tokio::test]
    async fn the_watch_keeps_the_last_good_share() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("share");
        // No file yet: the initial share.
        let mut rx = watch_share(Some(p.clone()), 2.0, Duration::from_millis(20));
        assert_eq!(*rx.borrow(), 2.0);
        std::fs::write(&p, "7").expect("write");
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .expect("picked up")
            .expect("open");
        assert_eq!(*rx.borrow_and_update(), 7.0);
        std::fs::write(&p, "garbage").expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(*rx.borrow(), 7.0);
        std::fs::write(&p, "").expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(*rx.borrow(), 7.0);
    }

    proptest! {
        /// Whatever is asked, given back or re-rated, within any span the bucket grants at most the
        /// highest rate × span + the highest burst, net of refunds (at a fixed rate: rate × t + burst).
        #[test]
        fn never_grants_more_than_rate_times_time_plus_burst(
            rates in proptest::collection::vec(0.1f64..200.0, 1..3),
            ops in proptest::collection::vec((0u64..400, 0usize..12, 0usize..12, any::<bool>()), 1..200),
            batch in 1usize..=10,
        ) {
            let t0 = Instant::now();
            let mut b = TokenBucket::new(rates[0], batch, t0);
            let mut now_ms = 0u64;
            // (time in ms, net tokens granted at that step)
            let mut log: Vec<(u64, f64)> = Vec::new();
            for (i, (dt, want, back, rerate)) in ops.iter().enumerate() {
                now_ms += dt;
                let now = ms(t0, now_ms);
                if *rerate {
                    b.set_rate(rates[i % rates.len()], batch, now);
                }
                let mut net = 0.0;
                if let Grant::Take(n) = b.grant(*want, now) {
                    prop_assert!(n <= *want);
                    net += n as f64;
                    let back = (*back).min(n);
                    b.refund(back, now);
                    net -= back as f64;
                }
                log.push((now_ms, net));
            }
            let max_rate = rates.iter().copied().fold(0.0, f64::max);
            let max_burst = burst(max_rate, batch);
            // From the start (an empty bucket): at most max rate × t.
            let mut total = 0.0;
            for (t, n) in &log {
                total += n;
                prop_assert!(total <= max_rate * (*t as f64 / 1000.0) + 1e-6, "{total} by {t} ms");
            }
            // Any span: at most max rate × span + burst.
            for i in 0..log.len() {
                let mut sum = 0.0;
                for (t, n) in &log[i..] {
                    sum += n;
                    let span = (*t - log[i].0) as f64 / 1000.0;
                    prop_assert!(sum <= max_rate * span + max_burst + 1e-6, "{sum} in {span}s");
                }
            }
        }
    }
}
