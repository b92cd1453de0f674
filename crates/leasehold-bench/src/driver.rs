//! The closed loop shared by every target: N workers, each running one
//! operation after another for a fixed time, each timing its own operations.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::stats::Summary;
use super::{BenchArgs, Mode, Report, Target};

/// One client of the benchmark: a connection (or session) and whatever it
/// holds. Set up before the clock starts.
pub(crate) trait Worker: Send + 'static {
    /// Runs one operation; an error is described in a short string.
    fn op(&mut self) -> impl Future<Output = Result<(), String>> + Send;
}

/// How many distinct error messages a run keeps.
const ERROR_SAMPLES: usize = 5;

/// One worker's measurements.
#[derive(Debug)]
pub(crate) struct Recorder {
    /// Operations that start before this are warm-up.
    measure_from: Instant,
    /// Operations that end after this are not counted.
    until: Instant,
    /// Latency of each counted successful operation, in microseconds.
    samples: Vec<u32>,
    /// Counted failed operations.
    errors: u64,
    /// The first distinct error messages, warm-up included.
    error_samples: Vec<String>,
}

impl Recorder {
    fn new(measure_from: Instant, until: Instant) -> Self {
        Recorder {
            measure_from,
            until,
            samples: Vec::new(),
            errors: 0,
            error_samples: Vec::new(),
        }
    }

    fn record(&mut self, began: Instant, result: Result<(), String>) {
        let ended = Instant::now();
        let counted = began >= self.measure_from && ended <= self.until;
        match result {
            Ok(()) if counted => {
                let micros = ended.duration_since(began).as_micros();
                self.samples.push(u32::try_from(micros).unwrap_or(u32::MAX));
            }
            Ok(()) => {}
            Err(e) => {
                if counted {
                    self.errors += 1;
                }
                note_error(&mut self.error_samples, e);
            }
        }
    }
}

fn note_error(samples: &mut Vec<String>, mut e: String) {
    if samples.len() < ERROR_SAMPLES && !samples.contains(&e) {
        e.truncate(300);
        samples.push(e);
    }
}

/// What a run of workers measured, with the workers handed back for any
/// checks of what they saw.
pub(crate) struct Outcome<W> {
    pub workers: Vec<W>,
    pub seconds: f64,
    pub samples: Vec<u32>,
    pub errors: u64,
    pub error_samples: Vec<String>,
}

impl<W> Outcome<W> {
    /// The report for this run; `details` carries mode-specific results.
    pub fn report(
        mut self,
        args: &BenchArgs,
        target: Target,
        mode: Mode,
        details: serde_json::Value,
    ) -> Report {
        let ops = self.samples.len() as u64;
        Report {
            target,
            mode,
            shape: (target == Target::Leasehold).then(|| args.shape()),
            clients: args.clients,
            connections: args.connections(),
            label: args.label.clone(),
            seconds: self.seconds,
            ops,
            errors: self.errors,
            ops_per_sec: ops as f64 / self.seconds,
            latency_ms: Summary::of(&mut self.samples),
            error_samples: self.error_samples,
            details,
        }
    }
}

/// Runs every worker in its own task for `warmup + duration`.
pub(crate) async fn drive<W: Worker>(
    workers: Vec<W>,
    warmup: Duration,
    duration: Duration,
) -> Result<Outcome<W>, String> {
    let start = Instant::now();
    let measure_from = start + warmup;
    let until = measure_from + duration;
    let mut tasks = JoinSet::new();
    for (index, mut worker) in workers.into_iter().enumerate() {
        tasks.spawn(async move {
            let mut recorder = Recorder::new(measure_from, until);
            while Instant::now() < until {
                let began = Instant::now();
                let result = worker.op().await;
                recorder.record(began, result);
            }
            (index, worker, recorder)
        });
    }
    let mut finished = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        finished.push(joined.map_err(|e| format!("a client task failed: {e}"))?);
    }
    finished.sort_by_key(|(index, _, _)| *index);
    let mut outcome = Outcome {
        workers: Vec::with_capacity(finished.len()),
        seconds: duration.as_secs_f64(),
        samples: Vec::new(),
        errors: 0,
        error_samples: Vec::new(),
    };
    for (_, worker, recorder) in finished {
        outcome.workers.push(worker);
        outcome.samples.extend_from_slice(&recorder.samples);
        outcome.errors += recorder.errors;
        for e in recorder.error_samples {
            note_error(&mut outcome.error_samples, e);
        }
    }
    Ok(outcome)
}

/// Sets up `n` workers concurrently (connecting, taking their leases), in
/// index order.
pub(crate) async fn set_up<W, F, Fut>(n: usize, make: F) -> Result<Vec<W>, String>
where
    W: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<W, String>> + Send + 'static,
{
    let mut tasks = JoinSet::new();
    for index in 0..n {
        let made = make(index);
        tasks.spawn(async move { (index, made.await) });
    }
    let mut workers = Vec::with_capacity(n);
    while let Some(joined) = tasks.join_next().await {
        let (index, made) = joined.map_err(|e| format!("a set-up task failed: {e}"))?;
        workers.push((index, made.map_err(|e| format!("client {index}: {e}"))?));
    }
    workers.sort_by_key(|(index, _)| *index);
    Ok(workers.into_iter().map(|(_, w)| w).collect())
}
