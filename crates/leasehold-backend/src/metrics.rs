//! Prometheus metrics: the text exposition format (0.0.4), written by hand,
//! and the histogram both backends and the services observe into.
//!
//! Why not a metrics crate: every number the lease table knows (live terms,
//! waiters, grants, expirations) is already counted in the lessor under the
//! lock each request holds anyway (`leasehold_core::lessor::Stats`), so a
//! scrape reads one snapshot instead of the hot path touching a global
//! recorder; and each server (tests run many in one process) has its own
//! numbers with no global registry. What is left is a histogram type and a
//! writer, both small.
//!
//! Names follow Prometheus conventions (`leasehold_` prefix, `_total` for
//! counters, base units: seconds), and labels never carry a key, owner,
//! lease id or anything else a client chose: only bounded sets (the RPC, the
//! status code, the stale reason, how a term ended).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets for request and commit latencies, in seconds.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Buckets for how many rows a commit writes.
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// A cumulative histogram with fixed buckets, safe to observe from any thread.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative), plus one for +Inf.
    counts: Vec<AtomicU64>,
    /// The sum of observations, as f64 bits.
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    pub fn observe(&self, value: f64) {
        let bucket = self
            .bounds
            .iter()
            .position(|bound| value <= *bound)
            .unwrap_or(self.bounds.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }

    pub fn observe_duration(&self, duration: Duration) {
        self.observe(duration.as_secs_f64());
    }

    /// How many observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

/// A page of metrics being written in the text exposition format.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// The finished page.
    pub fn into_text(self) -> String {
        self.text
    }

    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (label, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{label}=\"{}\"", escape(value));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    /// A counter with no labels.
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.header(name, help, "counter");
        self.sample(name, &[], value as f64);
    }

    /// A counter family: one sample per label set.
    pub fn counters<'a>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Vec<(&'a str, &'a str)>, u64)>,
    ) {
        self.header(name, help, "counter");
        for (labels, value) in samples {
            self.sample(name, &labels, value as f64);
        }
    }

    /// A gauge with no labels.
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.header(name, help, "gauge");
        self.sample(name, &[], value);
    }

    /// A histogram family: one histogram per label set.
    pub fn histograms<'a>(
        &mut self,
        name: &str,
        help: &str,
        histograms: impl IntoIterator<Item = (Vec<(&'a str, &'a str)>, &'a Histogram)>,
    ) {
        self.header(name, help, "histogram");
        let bucket = format!("{name}_bucket");
        for (labels, histogram) in histograms {
            let mut cumulative = 0;
            for (i, count) in histogram.counts.iter().enumerate() {
                cumulative += count.load(Ordering::Relaxed);
                let le = match histogram.bounds.get(i) {
                    Some(bound) => bound.to_string(),
                    None => "+Inf".to_owned(),
                };
                let mut with_le = labels.clone();
                with_le.push(("le", &le));
                self.sample(&bucket, &with_le, cumulative as f64);
            }
            let sum = f64::from_bits(histogram.sum.load(Ordering::Relaxed));
            self.sample(&format!("{name}_sum"), &labels, sum);
            self.sample(&format!("{name}_count"), &labels, cumulative as f64);
        }
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_is_cumulative_with_sum_and_count() {
        static BOUNDS: &[f64] = &[1.0, 2.0];
        let h = Histogram::new(BOUNDS);
        for v in [0.5, 1.5, 1.5, 7.0] {
            h.observe(v);
        }
        let mut out = Exposition::default();
        out.histograms("x_seconds", "help", [(vec![("rpc", "A")], &h)]);
        let text = out.into_text();
        assert!(
            text.contains("x_seconds_bucket{rpc=\"A\",le=\"1\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{rpc=\"A\",le=\"2\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{rpc=\"A\",le=\"+Inf\"} 4\n"),
            "{text}"
        );
        assert!(text.contains("x_seconds_sum{rpc=\"A\"} 10.5\n"), "{text}");
        assert!(text.contains("x_seconds_count{rpc=\"A\"} 4\n"), "{text}");
        assert!(text.contains("# TYPE x_seconds histogram\n"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = Exposition::default();
        out.counters("c_total", "help", [(vec![("l", "a\"b\\c\nd")], 1)]);
        assert!(
            out.into_text()
                .contains("c_total{l=\"a\\\"b\\\\c\\nd\"} 1\n")
        );
    }
}
