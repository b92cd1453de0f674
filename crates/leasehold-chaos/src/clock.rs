//! Wall-clock jumps of a server process: `clock/jump.c`, built here with
//! the machine's C compiler and loaded into the server with `LD_PRELOAD`,
//! adds to every `CLOCK_REALTIME` reading an offset the harness rewrites in
//! a file while the server runs. The monotonic clock is untouched.
//!
//! A server anchors its wall clock once at start-up and times leases with
//! the monotonic clock, so a jump while it runs must change nothing; a jump
//! followed by a `kill -9` and restart is the real test: the restarted
//! server reads stored expiries in the old clock's frame and must still
//! give every unended term at least a full TTL (invariant 4).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The C source of the shim.
const SOURCE: &str = include_str!("../clock/jump.c");

/// The environment variable naming the offset file.
pub const OFFSET_FILE_ENV: &str = "LEASEHOLD_CHAOS_CLOCK_FILE";

/// The built shim.
#[derive(Debug, Clone)]
pub struct ClockShim {
    /// The shared library to preload.
    pub library: PathBuf,
}

impl ClockShim {
    /// Builds the shim into `dir` (with `$CC`, else `cc`) and proves it
    /// works: `date +%s` under a +1 day offset must print a day later.
    ///
    /// # Errors
    /// No C compiler, a failed build, or a shim that does not move the
    /// clock (a static binary, a libc that bypasses the symbol).
    pub fn build(dir: &Path) -> Result<ClockShim, String> {
        let source = dir.join("clock-jump.c");
        let library = dir.join("libclockjump.so");
        std::fs::write(&source, SOURCE).map_err(|e| e.to_string())?;
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&library)
            .arg(&source)
            .arg("-ldl")
            .output()
            .map_err(|e| format!("{cc}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{cc} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let shim = ClockShim { library };
        let probe = dir.join("clock-probe");
        let day: i64 = 86_400;
        set_offset(&probe, day * 1_000_000_000)?;
        let read = |preload: bool| -> Result<i64, String> {
            let mut command = Command::new("date");
            command.arg("+%s");
            if preload {
                shim.apply(&mut command, &probe);
            }
            let out = command.output().map_err(|e| format!("date: {e}"))?;
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .map_err(|e| format!("date printed something else: {e}"))
        };
        let (before, shifted, after) = (read(false)?, read(true)?, read(false)?);
        if shifted < before + day || shifted > after + day + 5 {
            return Err(format!(
                "the shim does not move the clock: {shifted} vs {before}..{after} + 1 day"
            ));
        }
        let _ = std::fs::remove_file(probe);
        Ok(shim)
    }

    /// Makes `command` run with its wall clock offset by the nanoseconds
    /// in `offset_file`.
    pub fn apply(&self, command: &mut Command, offset_file: &Path) {
        command
            .env("LD_PRELOAD", &self.library)
            .env(OFFSET_FILE_ENV, offset_file);
    }
}

/// Writes a new offset (nanoseconds, may be negative): every later reading
/// of the clock sees it.
///
/// # Errors
/// The file cannot be written.
pub fn set_offset(offset_file: &Path, nanos: i64) -> Result<(), String> {
    // Written beside and renamed over, so a reader never sees half a number.
    let tmp = offset_file.with_extension("tmp");
    std::fs::write(&tmp, nanos.to_string()).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, offset_file).map_err(|e| e.to_string())
}
