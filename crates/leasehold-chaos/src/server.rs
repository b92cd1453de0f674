//! The real `leasehold serve` process: started, killed with SIGKILL,
//! stopped with SIGSTOP and continued, restarted on the same store.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::clock::ClockShim;

/// How long a server may take to print `listening on ADDR`.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Where a server keeps its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// A SQLite file, reused across restarts.
    Sqlite(PathBuf),
    /// A PostgreSQL database and schema (`url` may point at a proxy).
    Postgres { url: String, schema: String },
}

/// One server process slot: at most one child at a time.
#[derive(Debug)]
pub struct Server {
    /// The `leasehold` binary.
    bin: PathBuf,
    store: Store,
    /// Its stderr goes here (appended across restarts), for post-mortems.
    log: PathBuf,
    /// The running child, if any.
    child: Option<Child>,
    /// Where the running child listens.
    addr: Option<SocketAddr>,
    /// Whether the child is stopped (SIGSTOP).
    stopped: bool,
    /// A wall-clock shim and the offset file it reads (see [`crate::clock`]).
    clock: Option<(ClockShim, PathBuf)>,
}

impl Server {
    pub fn new(bin: &Path, store: Store, log: &Path) -> Server {
        Server {
            bin: bin.to_owned(),
            store,
            log: log.to_owned(),
            child: None,
            addr: None,
            stopped: false,
            clock: None,
        }
    }

    /// Runs the server (from its next start on) with its wall clock offset
    /// by the nanoseconds in `offset_file`.
    pub fn set_clock(&mut self, shim: ClockShim, offset_file: PathBuf) {
        self.clock = Some((shim, offset_file));
    }

    /// Where the server listens, while it runs.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts the server (on a free port) and waits until it listens.
    /// Blocking: call it from `spawn_blocking`.
    ///
    /// # Errors
    /// The spawn failed, or the server exited or said nothing in time
    /// (then it is killed).
    pub fn start(&mut self) -> Result<SocketAddr, String> {
        assert!(self.child.is_none(), "server already running");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("open {}: {e}", self.log.display()))?;
        let mut command = Command::new(&self.bin);
        command.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--drain-timeout-ms",
            "300",
        ]);
        match &self.store {
            Store::Sqlite(path) => {
                command.arg("--db").arg(path);
            }
            Store::Postgres { url, schema } => {
                command.args(["--store", url, "--pg-schema", schema, "--pg-pool-size", "4"]);
            }
        }
        if let Some((shim, offset_file)) = &self.clock {
            shim.apply(&mut command, offset_file);
        }
        let mut child = command
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.bin.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        // Reads the first line, then drains stdout until the process exits.
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            let mut sink = String::new();
            while reader.read_line(&mut sink).is_ok_and(|n| n > 0) {
                sink.clear();
            }
        });
        let line = match rx.recv_timeout(START_TIMEOUT) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the server did not start in time".into());
            }
        };
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok());
        let Some(addr) = addr else {
            let _ = child.kill();
            let status = child.wait();
            return Err(format!(
                "the server did not start: first line {line:?}, exit {status:?} (log {})",
                self.log.display()
            ));
        };
        self.child = Some(child);
        self.addr = Some(addr);
        self.stopped = false;
        Ok(addr)
    }

    /// `kill -9` (continuing it first would be pointless: SIGKILL works on
    /// a stopped process too) and reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.addr = None;
        self.stopped = false;
    }

    /// SIGSTOP: the process stays, its connections stay open, nothing moves.
    pub fn stop(&mut self) {
        if let Some(pid) = self.pid() {
            signal("-STOP", pid);
            self.stopped = true;
        }
    }

    /// SIGCONT after [`Server::stop`].
    pub fn cont(&mut self) {
        if let Some(pid) = self.pid().filter(|_| self.stopped) {
            signal("-CONT", pid);
            self.stopped = false;
        }
    }

    /// The exit status, if the child exited by itself (a failed commit
    /// makes the server stop with a non-zero exit, by design).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        self.addr = None;
        self.stopped = false;
        Some(status)
    }

    /// Whether a child is running (or stopped).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.cont();
        self.kill9();
    }
}

fn signal(which: &str, pid: u32) {
    let _ = Command::new("kill")
        .args([which, &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

/// The `leasehold` binary: `$LEASEHOLD_BIN`, else `leasehold` next to the
/// running executable's target directory (`target/debug/leasehold` for a
/// test in `target/debug/deps`, or a binary in `target/release`).
pub fn find_binary() -> Option<PathBuf> {
    if let Ok(bin) = std::env::var("LEASEHOLD_BIN") {
        return Some(PathBuf::from(bin));
    }
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent()?;
    for _ in 0..2 {
        let candidate = dir.join("leasehold");
        if candidate.is_file() {
            return Some(candidate);
        }
        dir = dir.parent()?;
    }
    None
}
