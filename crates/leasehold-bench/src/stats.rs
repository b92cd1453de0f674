//! Latency percentiles from raw samples.
//!
//! Samples are kept as microseconds in a `Vec<u32>` and sorted once at the
//! end: at a few hundred thousand operations a run that is a few megabytes,
//! and the percentiles are exact rather than bucketed.

use serde::Serialize;

/// Latency percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    /// Summarises `micros` (sorted here; the order on entry does not matter).
    pub fn of(micros: &mut [u32]) -> Summary {
        if micros.is_empty() {
            return Summary::default();
        }
        micros.sort_unstable();
        let at = |q: f64| {
            // Nearest-rank percentile.
            let rank = (q * micros.len() as f64).ceil() as usize;
            f64::from(micros[rank.clamp(1, micros.len()) - 1]) / 1000.0
        };
        let sum: u64 = micros.iter().map(|&m| u64::from(m)).sum();
        Summary {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: f64::from(*micros.last().expect("not empty")) / 1000.0,
            mean: sum as f64 / micros.len() as f64 / 1000.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut samples: Vec<u32> = (1..=100).rev().map(|ms| ms * 1000).collect();
        let s = Summary::of(&mut samples);
        assert_eq!(s.p50, 50.0);
        assert_eq!(s.p90, 90.0);
        assert_eq!(s.p99, 99.0);
        assert_eq!(s.max, 100.0);
        assert_eq!(s.mean, 50.5);
    }

    #[test]
    fn no_samples_is_all_zero() {
        assert_eq!(Summary::of(&mut []), Summary::default());
    }
}
