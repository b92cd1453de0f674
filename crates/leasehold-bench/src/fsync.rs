//! Fsync mode: the physical floor of the one-client lock cycle.
//!
//! A cycle is an Acquire and a Release, each committed before its reply, so
//! at one client it can be no faster than two syncs of the disk the database
//! is on. One operation here is exactly that, with no server: two
//! `fdatasync`s, each after a 4 KiB overwrite of the same page of a
//! preallocated file in `--fsync-dir` (the file keeps its size, so
//! `fdatasync` writes no metadata, as a WAL commit over an existing page
//! does). The issue-16 target puts the cycle's p50 at most 3 × this one's.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::time::Instant;

use super::stats::Summary;
use super::{BenchArgs, Mode, Report, Target};

/// The page overwritten before each sync.
const PAGE: usize = 4096;

pub(crate) async fn run(args: &BenchArgs) -> Result<Report, String> {
    let dir = args.fsync_dir.clone();
    let (warmup, duration) = (args.warmup(), args.duration());
    let label = args.label.clone();
    let measured = tokio::task::spawn_blocking(move || {
        let file = tempfile_in(&dir)?;
        let result = sync_pairs(&file.1, warmup + duration, warmup);
        let _ = std::fs::remove_file(&file.0);
        result
    })
    .await
    .map_err(|e| format!("the fsync loop failed: {e}"))??;
    let (mut samples, seconds) = measured;
    let ops = samples.len() as u64;
    Ok(Report {
        target: Target::Leasehold,
        mode: Mode::Fsync,
        shape: None,
        clients: 1,
        connections: 0,
        label,
        seconds,
        ops,
        errors: 0,
        ops_per_sec: ops as f64 / seconds,
        latency_ms: Summary::of(&mut samples),
        error_samples: Vec::new(),
        details: serde_json::json!({ "dir": args.fsync_dir.display().to_string() }),
    })
}

/// A new file of one page in `dir`, synced, with its path.
fn tempfile_in(dir: &std::path::Path) -> Result<(std::path::PathBuf, File), String> {
    let path = dir.join(format!(".leasehold-bench-fsync-{}", super::run_id()));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    file.write_all(&[0u8; PAGE])
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok((path, file))
}

/// Times pairs of (overwrite, `fdatasync`) until `until` has passed since
/// the start; pairs that start within `warmup` are not kept. Returns the
/// kept pairs' times in microseconds and the seconds they were kept over.
fn sync_pairs(
    file: &File,
    until: std::time::Duration,
    warmup: std::time::Duration,
) -> Result<(Vec<u32>, f64), String> {
    let mut page = [0u8; PAGE];
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut writes: u64 = 0;
    let mut kept_from = None;
    while start.elapsed() < until {
        let began = Instant::now();
        for _ in 0..2 {
            writes += 1;
            page[..8].copy_from_slice(&writes.to_le_bytes());
            let mut f = file;
            f.seek(SeekFrom::Start(0))
                .and_then(|_| f.write_all(&page))
                .and_then(|()| file.sync_data())
                .map_err(|e| format!("write and fdatasync failed: {e}"))?;
        }
        if began.duration_since(start) >= warmup {
            kept_from.get_or_insert(began);
            let micros = began.elapsed().as_micros();
            samples.push(u32::try_from(micros).unwrap_or(u32::MAX));
        }
    }
    let seconds = kept_from.map_or(0.0, |from| from.elapsed().as_secs_f64());
    Ok((samples, seconds.max(0.001)))
}
