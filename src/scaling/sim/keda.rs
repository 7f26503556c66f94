//! KEDA's SQS scaler as the HPA runs it, modelled for the simulator: the metric, activation, the HPA's
//! AverageValue algorithm with its tolerance, default behaviors (rate limits, stabilization) and KEDA's cooldown.
//!
//! Sources (read, not copied): KEDA `pkg/scalers/aws_sqs_queue_scaler.go` (metric = visible + in flight,
//! activation when it exceeds `activationQueueLength`), KEDA `pkg/scaling/executor/scale_scaledobjects.go`
//! (0 → max(min, 1) when active; to zero `cooldownPeriod` after the last active poll), Kubernetes
//! `pkg/controller/podautoscaler` (`GetExternalPerPodMetricReplicas`, `stabilizeRecommendationWithBehaviors`,
//! `calculateScaleUpLimitWithScalingRules`) and the HPA documentation's default behavior.

use std::collections::VecDeque;

use super::Scaler;
use super::engine::Observation;

/// KEDA + HPA settings; [`KedaConfig::default`] is the configuration of the benchmark (KEDA and HPA defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct KedaConfig {
    /// Trigger `queueLength`: target (visible + in flight) per replica.
    pub queue_length: u32,
    /// Trigger `activationQueueLength`.
    pub activation_queue_length: u32,
    /// Trigger `scaleOnInFlight`.
    pub scale_on_in_flight: bool,
    /// ScaledObject `pollingInterval` (activation checks), seconds.
    pub polling_interval_s: u64,
    /// ScaledObject `cooldownPeriod` (last active → zero), seconds.
    pub cooldown_s: u64,
    /// kube-controller-manager `--horizontal-pod-autoscaler-sync-period`, seconds.
    pub hpa_sync_s: u64,
    /// `--horizontal-pod-autoscaler-tolerance`.
    pub tolerance: f64,
    /// behavior.scaleDown.stabilizationWindowSeconds.
    pub scale_down_stabilization_s: u64,
    /// behavior.scaleUp policies (selectPolicy Max): +pods and +percent per period.
    pub scale_up_pods: u32,
    pub scale_up_percent: u32,
    pub scale_up_period_s: u64,
    /// behavior.scaleDown policy: -percent per period (100 = no limit).
    pub scale_down_percent: u32,
    pub scale_down_period_s: u64,
    /// ScaledObject minReplicaCount / maxReplicaCount.
    pub min_replicas: u32,
    pub max_replicas: u32,
}

impl Default for KedaConfig {
    fn default() -> Self {
        KedaConfig {
            queue_length: 5,
            activation_queue_length: 0,
            scale_on_in_flight: true,
            polling_interval_s: 30,
            cooldown_s: 300,
            hpa_sync_s: 15,
            tolerance: 0.1,
            scale_down_stabilization_s: 300,
            scale_up_pods: 4,
            scale_up_percent: 100,
            scale_up_period_s: 15,
            scale_down_percent: 100,
            scale_down_period_s: 15,
            min_replicas: 0,
            max_replicas: 20,
        }
    }
}

/// KEDA's operator loop and the HPA it creates, ticking on multiples of their periods from t=0 (at an
/// instant both are due, KEDA's poll runs first).
pub struct Keda {
    cfg: KedaConfig,
    next_poll: u64,
    next_sync: u64,
    last_active: Option<u64>,
    /// HPA recommendations (time, replicas) for the scale-down stabilization window.
    recommendations: VecDeque<(u64, u32)>,
    /// HPA scale events (time, change) for the rate-limit periods.
    events: VecDeque<(u64, i64)>,
}

impl Keda {
    pub fn new(cfg: KedaConfig) -> Keda {
        Keda {
            cfg,
            next_poll: 0,
            next_sync: 0,
            last_active: None,
            recommendations: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    fn metric(&self, obs: &Observation) -> u64 {
        if self.cfg.scale_on_in_flight {
            obs.visible + obs.in_flight
        } else {
            obs.visible
        }
    }

    /// KEDA's executor: activation from zero and scale to zero after the cooldown.
    fn poll(&mut self, now: u64, obs: &Observation, current: u32) -> u32 {
        let active = self.metric(obs) > u64::from(self.cfg.activation_queue_length);
        if active {
            self.last_active = Some(now);
            if current == 0 {
                return self.cfg.min_replicas.max(1).min(self.cfg.max_replicas);
            }
            return current;
        }
        let cooled = match self.last_active {
            // initialCooldownPeriod defaults to 0: never active means free to go to zero at once
            None => true,
            Some(at) => at + self.cfg.cooldown_s * 1000 < now,
        };
        if current > 0 && self.cfg.min_replicas == 0 && cooled {
            return 0;
        }
        current
    }

    /// One HPA sync for an external metric with an AverageValue target of `queueLength`.
    fn sync(&mut self, now: u64, obs: &Observation, current: u32) -> u32 {
        if current == 0 {
            // the HPA reports ScalingDisabled at zero replicas: activation is KEDA's job
            return 0;
        }
        let hpa_min = self.cfg.min_replicas.max(1);
        let hpa_max = self.cfg.max_replicas.max(hpa_min);
        let metric = self.metric(obs) as f64;
        let target = f64::from(self.cfg.queue_length.max(1));
        let ratio = metric / (target * f64::from(current));
        let proposal = if (1.0 - ratio).abs() > self.cfg.tolerance {
            (metric / target).ceil().min(f64::from(u32::MAX)) as u32
        } else {
            current
        };

        // stabilizeRecommendationWithBehaviors: scale-up window 0 (only this proposal), scale-down window
        // the highest recommendation recorded within it
        let window = self.cfg.scale_down_stabilization_s * 1000;
        while self
            .recommendations
            .front()
            .is_some_and(|&(at, _)| at + window <= now)
        {
            self.recommendations.pop_front();
        }
        let down = self
            .recommendations
            .iter()
            .map(|&(_, r)| r)
            .fold(proposal, u32::max);
        let up = proposal;
        let mut desired = current.max(up).min(down);
        self.recommendations.push_back((now, proposal));

        // convertDesiredReplicasWithBehaviorRate
        let up_start = self.period_start(now, current, self.cfg.scale_up_period_s);
        let down_start = self.period_start(now, current, self.cfg.scale_down_period_s);
        if desired > current {
            let by_pods = up_start.saturating_add(i64::from(self.cfg.scale_up_pods));
            let by_percent = (up_start as f64
                * (1.0 + f64::from(self.cfg.scale_up_percent) / 100.0))
                .ceil() as i64;
            let limit = by_pods.max(by_percent).max(i64::from(current));
            let allowed = i64::from(hpa_max).min(limit);
            desired = desired.min(u32::try_from(allowed).unwrap_or(hpa_max));
        } else if desired < current {
            let limit = (down_start as f64 * (1.0 - f64::from(self.cfg.scale_down_percent) / 100.0))
                .max(0.0) as i64;
            let allowed = i64::from(hpa_min).max(limit);
            desired = desired.max(u32::try_from(allowed).unwrap_or(hpa_min));
        }
        let desired = desired.clamp(hpa_min, hpa_max);
        if desired != current {
            self.events
                .push_back((now, i64::from(desired) - i64::from(current)));
        }
        desired
    }

    /// Replicas at the start of the rate-limit period: current minus what the HPA changed within it.
    fn period_start(&mut self, now: u64, current: u32, period_s: u64) -> i64 {
        let longest = self.cfg.scale_up_period_s.max(self.cfg.scale_down_period_s) * 1000;
        while self
            .events
            .front()
            .is_some_and(|&(at, _)| at + longest <= now)
        {
            self.events.pop_front();
        }
        let period = period_s * 1000;
        let changed: i64 = self
            .events
            .iter()
            .filter(|&&(at, _)| at + period > now)
            .map(|&(_, d)| d)
            .sum();
        i64::from(current) - changed
    }
}

impl Scaler for Keda {
    fn next_tick(&self) -> u64 {
        self.next_poll.min(self.next_sync)
    }

    fn tick(&mut self, now: u64, obs: Observation, current: u32) -> u32 {
        let mut replicas = current;
        if now >= self.next_poll {
            replicas = self.poll(now, &obs, replicas);
            self.next_poll = next_multiple(now, self.cfg.polling_interval_s);
        }
        if now >= self.next_sync {
            replicas = self.sync(now, &obs, replicas);
            self.next_sync = next_multiple(now, self.cfg.hpa_sync_s);
        }
        replicas
    }
}

/// The first multiple of `period_s` seconds after `now` (ms).
fn next_multiple(now: u64, period_s: u64) -> u64 {
    let p = period_s.max(1) * 1000;
    (now / p + 1) * p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(visible: u64, in_flight: u64) -> Observation {
        Observation {
            visible,
            in_flight,
            ..Observation::default()
        }
    }

    fn keda() -> Keda {
        Keda::new(KedaConfig {
            max_replicas: 100,
            ..KedaConfig::default()
        })
    }

    #[test]
    fn activates_to_one_then_hpa_doubles_or_adds_four_per_sync() {
        let mut k = keda();
        // t=0: both due; poll activates to 1, the HPA then scales from 1 within its rate limit (max(1+4, 2))
        let r = k.tick(0, obs(1000, 0), 0);
        assert_eq!(r, 5);
        let r = k.tick(15_000, obs(1000, 0), r);
        assert_eq!(r, 10, "max(5+4, 2*5)");
        let r = k.tick(30_000, obs(1000, 0), r);
        assert_eq!(r, 20);
        let r = k.tick(45_000, obs(1000, 0), r);
        assert_eq!(r, 40);
        let r = k.tick(60_000, obs(1000, 0), r);
        assert_eq!(r, 80);
        let r = k.tick(75_000, obs(1000, 0), r);
        assert_eq!(r, 100, "capped at maxReplicaCount");
    }

    #[test]
    fn tolerance_keeps_replicas_within_ten_percent() {
        let mut k = keda();
        k.last_active = Some(0);
        // 10 replicas, target 5 each = 50; 54 is within 10 %
        assert_eq!(k.sync(0, &obs(54, 0), 10), 10);
        // 56 is outside: ceil(56/5) = 12
        assert_eq!(k.sync(15_000, &obs(56, 0), 10), 12);
    }

    #[test]
    fn scale_down_waits_for_the_highest_recommendation_of_five_minutes() {
        let mut k = keda();
        assert_eq!(k.sync(0, &obs(100, 0), 20), 20);
        // the load drops: proposal 2, but 20 was recommended within 300 s
        assert_eq!(k.sync(15_000, &obs(10, 0), 20), 20);
        assert_eq!(k.sync(285_000, &obs(10, 0), 20), 20);
        // after the window: the highest recommendation left is 2
        assert_eq!(k.sync(315_000, &obs(10, 0), 20), 2);
        // and never below the HPA's minimum of 1 while KEDA keeps it active
        assert_eq!(k.sync(330_000, &obs(0, 0), 2), 2, "window still holds 2");
        assert_eq!(k.sync(700_000, &obs(0, 0), 2), 1);
    }

    #[test]
    fn scales_to_zero_only_after_the_cooldown_since_the_last_active_poll() {
        let mut k = keda();
        k.next_sync = u64::MAX; // isolate KEDA's own loop
        assert_eq!(k.tick(0, obs(3, 0), 0), 1);
        assert_eq!(
            k.tick(30_000, obs(0, 1), 1),
            1,
            "in flight counts as active"
        );
        assert_eq!(k.tick(60_000, obs(0, 0), 1), 1);
        assert_eq!(k.tick(330_000, obs(0, 0), 1), 1, "30 + 300 is not yet past");
        assert_eq!(k.tick(360_000, obs(0, 0), 1), 0);
    }
}
