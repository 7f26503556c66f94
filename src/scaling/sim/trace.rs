//! Traffic traces for the simulator: CSV `second,arrivals` (messages sent in that second), and the
//! deterministic expansion of a trace into individual messages with arrival instants and service times.

use super::SimError;
use super::service::{Rng, ServiceTime};

/// Longest trace accepted: 31 days of seconds.
pub const MAX_SECONDS: u64 = 31 * 24 * 3600;
/// Most messages a trace may hold: each is simulated (and held in memory) one by one.
pub const MAX_MESSAGES: u64 = 100_000_000;

/// Messages sent per second, from second 0; seconds a file leaves out had no arrivals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    per_second: Vec<u32>,
}

impl Trace {
    pub fn from_counts(per_second: Vec<u32>) -> Trace {
        Trace { per_second }
    }

    /// Parse CSV with the header `second,arrivals`; blank lines and `#` comments are skipped.
    pub fn parse(csv: &str) -> Result<Trace, SimError> {
        let mut lines = csv
            .trim_start_matches('\u{feff}')
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        let Some((_, header)) = lines.next() else {
            return Err(SimError::TraceEmpty);
        };
        let fields: Vec<&str> = header.split(',').map(str::trim).collect();
        if fields != ["second", "arrivals"] {
            return Err(SimError::TraceHeader {
                found: header.to_string(),
            });
        }
        let mut per_second: Vec<u32> = Vec::new();
        for (line, text) in lines {
            let bad = |problem: String| SimError::TraceRow { line, problem };
            let mut parts = text.split(',').map(str::trim);
            let (Some(s), Some(a), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad(format!(
                    "expected two fields `second,arrivals`, found {text:?}"
                )));
            };
            let second: u64 = s.parse().map_err(|_| {
                bad(format!(
                    "second {s:?} is not a whole number of seconds (0, 1, 2, ...)"
                ))
            })?;
            let arrivals: u32 = a.parse().map_err(|_| {
                bad(format!(
                    "arrivals {a:?} is not a whole, non-negative message count"
                ))
            })?;
            if second >= MAX_SECONDS {
                return Err(bad(format!(
                    "second {second} is beyond the 31-day limit of a trace ({MAX_SECONDS} seconds)"
                )));
            }
            let index = second as usize;
            if index < per_second.len() {
                return Err(bad(format!(
                    "second {second} comes after second {}: list seconds in increasing order, each once",
                    per_second.len() - 1
                )));
            }
            per_second.resize(index, 0);
            per_second.push(arrivals);
        }
        if per_second.is_empty() {
            return Err(SimError::TraceEmpty);
        }
        let trace = Trace { per_second };
        if trace.total() > MAX_MESSAGES {
            return Err(SimError::TraceTooLarge {
                total: trace.total(),
                max: MAX_MESSAGES,
            });
        }
        Ok(trace)
    }

    /// Seconds covered: the last listed second plus one.
    pub fn duration_secs(&self) -> u64 {
        self.per_second.len() as u64
    }

    pub fn total(&self) -> u64 {
        self.per_second.iter().map(|&n| u64::from(n)).sum()
    }

    pub fn per_second(&self) -> &[u32] {
        &self.per_second
    }

    /// The trace as messages: within each second, arrival instants are uniform at millisecond resolution;
    /// service times come from `service`. The same seed gives the same messages, so every policy sees
    /// identical traffic and identical work.
    pub fn messages(&self, service: &ServiceTime, seed: u64) -> Vec<Msg> {
        let mut rng = Rng::new(seed);
        let mut out = Vec::with_capacity(usize::try_from(self.total()).unwrap_or(0));
        let mut offsets = Vec::new();
        for (second, &n) in self.per_second.iter().enumerate() {
            offsets.clear();
            offsets.extend((0..n).map(|_| rng.below(1000)));
            offsets.sort_unstable();
            for &off in &offsets {
                out.push(Msg {
                    at: second as u64 * 1000 + off,
                    service: service.sample_ms(&mut rng),
                });
            }
        }
        out
    }
}

/// One simulated message: when it was sent (ms) and how long its handler takes (ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Msg {
    pub at: u64,
    pub service: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Duration;

    #[test]
    fn parses_sparse_rows_comments_and_spaces() {
        let t = Trace::parse("# a comment\nsecond, arrivals\n0,3\n\n2 , 5\n").unwrap();
        assert_eq!(t.per_second(), &[3, 0, 5]);
        assert_eq!(t.duration_secs(), 3);
        assert_eq!(t.total(), 8);
    }

    #[test]
    fn rejects_bad_input_naming_the_line_and_fix() {
        let cases = [
            ("", "no rows"),
            ("seconds,count\n0,1\n", "header"),
            ("second,arrivals\n", "no rows"),
            ("second,arrivals\n0,1,2\n", "line 2"),
            ("second,arrivals\nx,1\n", "whole number of seconds"),
            ("second,arrivals\n0,-1\n", "non-negative"),
            ("second,arrivals\n0,1.5\n", "non-negative"),
            ("second,arrivals\n5,1\n3,1\n", "increasing order"),
            ("second,arrivals\n5,1\n5,1\n", "increasing order"),
            ("second,arrivals\n99999999,1\n", "31-day"),
            (
                "second,arrivals\n0,4000000000\n1,4000000000\n",
                "at most 100000000",
            ),
        ];
        for (csv, needle) in cases {
            let err = Trace::parse(csv).unwrap_err().to_string();
            assert!(err.contains(needle), "{csv:?}: {err}");
        }
    }

    #[test]
    fn messages_are_deterministic_ordered_and_within_their_second() {
        let t = Trace::from_counts(vec![5, 0, 100, 1]);
        let st = ServiceTime::fit(Duration::from_secs(2), None, Duration::from_secs(30));
        let a = t.messages(&st, 9);
        assert_eq!(a, t.messages(&st, 9));
        assert_ne!(a, t.messages(&st, 10));
        assert_eq!(a.len(), 106);
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
        assert!(a[..5].iter().all(|m| m.at < 1000));
        assert!(a[5..105].iter().all(|m| (2000..3000).contains(&m.at)));
        assert!(a.iter().all(|m| m.service >= 1));
    }
}
