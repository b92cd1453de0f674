//! A private PostgreSQL cluster for one run, so the database itself can be
//! crashed (`pg_ctl stop -m immediate`: no checkpoint, recovery from the
//! WAL at the next start) without touching the machine's shared server.
//!
//! Uses the `initdb` and `pg_ctl` of `/usr/lib/postgresql/*/bin` (or
//! `$LEASEHOLD_CHAOS_PG_BIN`). PostgreSQL refuses to run as root, so as
//! root the cluster belongs to the `postgres` user and every command runs
//! through `su postgres`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A running private cluster; stopped (immediately) on drop.
#[derive(Debug)]
pub struct PrivatePg {
    /// `initdb`, `pg_ctl` live here.
    bin: PathBuf,
    /// The cluster's data directory (also its socket directory's parent).
    data: PathBuf,
    /// Its loopback port.
    port: u16,
    /// Run commands as `postgres` (we are root).
    as_postgres: bool,
    /// The server's log.
    log: PathBuf,
}

impl PrivatePg {
    /// Creates and starts a cluster under `dir`.
    ///
    /// # Errors
    /// No PostgreSQL binaries, or initdb/pg_ctl failed (the message says which).
    pub fn start(dir: &Path) -> Result<PrivatePg, String> {
        let bin = find_bin().ok_or("no PostgreSQL binaries in /usr/lib/postgresql/*/bin")?;
        let as_postgres = is_root();
        let base = dir.join("pg");
        std::fs::create_dir_all(&base).map_err(|e| e.to_string())?;
        if as_postgres {
            run(Command::new("chown").args(["-R", "postgres"]).arg(&base))?;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let pg = PrivatePg {
            bin,
            data: base.join("data"),
            port,
            as_postgres,
            log: base.join("postgres.log"),
        };
        let initdb = format!(
            "{} -D {} -A trust -U postgres --no-sync",
            pg.bin.join("initdb").display(),
            pg.data.display()
        );
        pg.shell(&initdb)?;
        pg.up()?;
        Ok(pg)
    }

    /// The URL of its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Crashes it: immediate stop, no checkpoint.
    ///
    /// # Errors
    /// pg_ctl failed.
    pub fn crash(&self) -> Result<(), String> {
        self.pg_ctl("-m immediate -w stop")
    }

    /// Starts it (recovering from its WAL after a crash).
    ///
    /// # Errors
    /// pg_ctl failed.
    pub fn up(&self) -> Result<(), String> {
        let options = format!(
            "-w -t 60 -l {} -o '-p {} -k {} -c listen_addresses=127.0.0.1' start",
            self.log.display(),
            self.port,
            self.data.parent().expect("data has a parent").display()
        );
        self.pg_ctl(&options)
    }

    fn pg_ctl(&self, args: &str) -> Result<(), String> {
        self.shell(&format!(
            "{} -D {} {args}",
            self.bin.join("pg_ctl").display(),
            self.data.display()
        ))
    }

    /// Runs `line` (as `postgres` when we are root), output to nowhere:
    /// the postmaster must not inherit our pipes.
    fn shell(&self, line: &str) -> Result<(), String> {
        let mut command = if self.as_postgres {
            let mut c = Command::new("su");
            c.args(["postgres", "-s", "/bin/sh", "-c", line]);
            c
        } else {
            let mut c = Command::new("sh");
            c.args(["-c", line]);
            c
        };
        run(&mut command).map_err(|e| format!("{line}: {e}"))
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let _ = self.crash();
    }
}

fn run(command: &mut Command) -> Result<(), String> {
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("exited with {status}"))
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn find_bin() -> Option<PathBuf> {
    if let Ok(bin) = std::env::var("LEASEHOLD_CHAOS_PG_BIN") {
        return Some(PathBuf::from(bin));
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").is_file() && bin.join("pg_ctl").is_file())
        .collect();
    versions.sort();
    versions.pop()
}
