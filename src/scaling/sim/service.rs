//! Random numbers and service times of the simulator: a seeded generator (no OS entropy, no wall clock) and
//! a log-normal service-time distribution fitted to the declared P99 (and mean, when declared).

use crate::api::Duration;

/// Φ⁻¹(0.99): a log-normal's P99 is exp(μ + Z99·σ).
const Z99: f64 = 2.326_347_874_040_841;

/// σ used when no mean is declared: P99/mean ≈ 2.8, typical of request handlers.
pub const DEFAULT_SIGMA: f64 = 0.5;

/// xoshiro256++ seeded through splitmix64: small, fast, and the same sequence on every platform.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit(); // (0, 1]: ln(0) is undefined
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// Log-normal service times: P99 equals the declared `p99`, the mean the declared `mean` when one is given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServiceTime {
    mu: f64,
    sigma: f64,
    cap_ms: u64,
}

impl ServiceTime {
    /// `mean` must be below `p99` (the caller validates); `timeout` caps each sample as the worker would.
    pub fn fit(p99: Duration, mean: Option<Duration>, timeout: Duration) -> ServiceTime {
        let p = p99.as_secs_f64().max(0.001);
        let sigma = match mean {
            None => DEFAULT_SIGMA,
            Some(m) => {
                let m = m.as_secs_f64().max(0.000_001);
                let d = (p / m).ln();
                if d <= 0.0 {
                    0.0
                } else if d >= Z99 * Z99 / 2.0 {
                    // A log-normal's P99/mean ratio peaks at exp(Z99²/2) ≈ 15: the closest fit.
                    Z99
                } else {
                    Z99 - (Z99 * Z99 - 2.0 * d).sqrt()
                }
            }
        };
        ServiceTime {
            mu: p.ln() - Z99 * sigma,
            sigma,
            cap_ms: u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        }
    }

    pub fn sigma(&self) -> f64 {
        self.sigma
    }

    /// The distribution's mean in seconds (before the timeout cap).
    pub fn mean_seconds(&self) -> f64 {
        (self.mu + self.sigma * self.sigma / 2.0).exp()
    }

    /// The distribution's P99 in seconds (before the timeout cap).
    pub fn p99_seconds(&self) -> f64 {
        (self.mu + Z99 * self.sigma).exp()
    }

    /// One service time in milliseconds, at least 1.
    pub fn sample_ms(&self, rng: &mut Rng) -> u32 {
        let secs = (self.mu + self.sigma * rng.normal()).exp();
        let ms = (secs * 1000.0).round().clamp(1.0, self.cap_ms as f64);
        ms.min(f64::from(u32::MAX)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quantile(mut v: Vec<u32>, q: f64) -> f64 {
        v.sort_unstable();
        let i = ((q * v.len() as f64).ceil() as usize).saturating_sub(1);
        f64::from(v[i]) / 1000.0
    }

    #[test]
    fn fitted_distribution_has_declared_p99_and_mean() {
        let st = ServiceTime::fit(
            Duration::from_secs(2),
            Some(Duration::from_millis(800)),
            Duration::from_secs(30),
        );
        assert!((st.p99_seconds() - 2.0).abs() < 1e-9);
        assert!((st.mean_seconds() - 0.8).abs() < 1e-9);
        let mut rng = Rng::new(7);
        let v: Vec<u32> = (0..200_000).map(|_| st.sample_ms(&mut rng)).collect();
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64 / 1000.0;
        assert!((mean - 0.8).abs() < 0.02, "mean {mean}");
        let p99 = quantile(v, 0.99);
        assert!((p99 - 2.0).abs() < 0.08, "p99 {p99}");
    }

    #[test]
    fn default_sigma_without_mean_and_timeout_caps() {
        let st = ServiceTime::fit(Duration::from_secs(2), None, Duration::from_secs(2));
        assert!((st.sigma() - DEFAULT_SIGMA).abs() < f64::EPSILON);
        let mut rng = Rng::new(1);
        assert!((0..10_000).all(|_| st.sample_ms(&mut rng) <= 2000));
    }

    #[test]
    fn same_seed_same_sequence() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        let mut c = Rng::new(43);
        let xa: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let xc: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
        assert!((0..1000).all(|_| a.below(10) < 10));
    }
}
