//! One chaos run: servers, proxies, workers and the fault schedule, then
//! the final reads and the check.
//!
//! Topology (every address on 127.0.0.1):
//!
//! ```text
//! SQLite:      workers ──proxy──> server ── file (kill -9, restart on the same file)
//! PostgreSQL:  workers ──proxy 1──> server 1 ──pg proxy 1──┐
//!              workers ──proxy 2──> server 2 ──pg proxy 2──┴──> PostgreSQL (own schema)
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use crate::check::{self, Config, Report};
use crate::history::{History, Line, Recorder};
use crate::proxy::{Mode, Proxy};
use crate::server::{Server, Store};
use crate::store::FencedStore;
use crate::workload::{self, Rng, Worker, Workload};

/// The worker id of the Python worker process (`python/worker.py`).
pub const PYTHON_WORKER: u32 = 200;
/// The worker ids of the TypeScript worker processes
/// (`typescript/worker.mjs`): this one on gRPC, the next on gRPC-Web.
pub const TYPESCRIPT_WORKERS: u32 = 300;

/// The TypeScript client's built module (`clients/typescript/dist/index.js`,
/// from `npm run build` there), which the TypeScript workers import.
pub fn typescript_client() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/typescript/dist/index.js")
}

/// Which store the servers use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    /// A PostgreSQL URL (`postgres://user@host:port/db`); the run creates
    /// its own schema there and drops it at the end.
    Postgres {
        url: String,
    },
    /// As `Postgres`, on a cluster of the run's own (see [`crate::pg`]),
    /// which the run can crash and restart.
    PrivatePostgres,
}

/// The faults a run may inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// `kill -9` of a server, restarted on the same store.
    KillRestart,
    /// SIGSTOP of a server for 1–2 TTLs, then SIGCONT.
    StopCont,
    /// Latency between workers and a server.
    ClientDelay,
    /// Workers partitioned from a server for 0.5–2 TTLs.
    ClientPartition,
    /// Every worker connection to a server closed.
    ClientCut,
    /// Every connection between a server and PostgreSQL closed (what a
    /// database restart looks like to the server).
    DbCut,
    /// A server partitioned from PostgreSQL for 0.5–2 TTLs.
    DbPartition,
    /// SIGSTOP of a worker process for 1–2 TTLs, then SIGCONT: a holder
    /// paused wherever it was (between its deadline check and its write,
    /// with a request in flight...). Needs `RunConfig::worker_bin`.
    WorkerStop,
    /// The private PostgreSQL cluster crashed (immediate stop), down for
    /// 0.3–1.5 s, then started again (recovery from its WAL).
    DbRestart,
    /// The SQLite file's file system filled up (ENOSPC) for 0.3–1.5 s: a
    /// small tmpfs, filled by a filler file and then emptied. Needs the
    /// right to mount (root); skipped otherwise.
    DiskFull,
    /// A server's wall clock jumps (forward 1 min–1 h, or back 1–3 TTLs;
    /// the monotonic clock is untouched), it runs on for up to a TTL, then
    /// `kill -9` and a restart on the jumped clock. Needs a C compiler for
    /// the `LD_PRELOAD` shim (see [`crate::clock`]); skipped otherwise.
    ClockJump,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillRestart => "kill -9 + restart",
            Fault::StopCont => "SIGSTOP + SIGCONT",
            Fault::ClientDelay => "client<->server delay",
            Fault::ClientPartition => "client<->server partition",
            Fault::ClientCut => "client<->server cut",
            Fault::DbCut => "server<->db cut",
            Fault::DbPartition => "server<->db partition",
            Fault::DiskFull => "disk full (ENOSPC)",
            Fault::DbRestart => "database crash + restart",
            Fault::WorkerStop => "worker SIGSTOP + SIGCONT",
            Fault::ClockJump => "wall-clock jump + kill -9 + restart",
        }
    }

    /// The faults that apply to a backend.
    pub fn all(backend: &Backend) -> Vec<Fault> {
        let mut faults = vec![
            Fault::KillRestart,
            Fault::StopCont,
            Fault::ClientDelay,
            Fault::ClientPartition,
            Fault::ClientCut,
            Fault::WorkerStop,
            Fault::ClockJump,
        ];
        match backend {
            Backend::Postgres { .. } => faults.extend([Fault::DbCut, Fault::DbPartition]),
            Backend::PrivatePostgres => {
                faults.extend([Fault::DbCut, Fault::DbPartition, Fault::DbRestart])
            }
            Backend::Sqlite => faults.push(Fault::DiskFull),
        }
        faults
    }
}

/// A run's settings.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub backend: Backend,
    /// How long workers start new terms (the run takes a few seconds more).
    pub duration: Duration,
    pub workers: u32,
    /// Workers run as processes of this binary (`leasehold-chaos` in
    /// worker mode), in addition to the in-process ones; `None`: none.
    pub worker_bin: Option<PathBuf>,
    /// How many worker processes (when `worker_bin` is set).
    pub process_workers: u32,
    /// A Python interpreter that can `import leasehold` (`clients/python`):
    /// then one worker process runs `python/worker.py` on the Python client.
    pub python: Option<PathBuf>,
    /// Node.js (20 or later), with the TypeScript client built
    /// (`clients/typescript/dist`): then two worker processes run
    /// `typescript/worker.mjs`, one on each transport (gRPC, gRPC-Web).
    pub node: Option<PathBuf>,
    pub workload: Workload,
    /// The pause between two faults is uniform in this range.
    pub fault_gap: (Duration, Duration),
    pub faults: Vec<Fault>,
    pub seed: u64,
    /// The `leasehold` binary.
    pub bin: PathBuf,
    /// Where the SQLite file and the server logs go.
    pub dir: PathBuf,
    pub check: Config,
}

impl RunConfig {
    /// A configuration with every fault of `backend`.
    pub fn new(backend: Backend, duration: Duration, bin: &Path, dir: &Path) -> RunConfig {
        let ttl = Duration::from_millis(1000);
        RunConfig {
            faults: Fault::all(&backend),
            backend,
            duration,
            workers: 6,
            worker_bin: None,
            process_workers: 2,
            python: None,
            node: None,
            workload: Workload::new(3, ttl),
            fault_gap: (Duration::from_millis(200), Duration::from_millis(1500)),
            seed: 17,
            bin: bin.to_owned(),
            dir: dir.to_owned(),
            check: Config::default(),
        }
    }
}

/// What a run did and found.
#[derive(Debug)]
pub struct RunResult {
    pub history: History,
    pub report: Report,
    /// Faults injected, by name.
    pub faults: BTreeMap<&'static str, u32>,
    /// Times a server exited by itself and was restarted.
    pub self_exits: u32,
    /// Keys whose final read (after a last kill -9 and restart) never succeeded.
    pub unreadable_at_end: Vec<String>,
    /// Faults that could not be injected on this machine, and why.
    pub skipped: Vec<String>,
}

/// A small tmpfs for the SQLite file, so the disk can be filled; unmounted
/// on drop (after the server using it is gone).
struct SmallDisk {
    mount: PathBuf,
    /// The filler file, while the disk is full.
    filler: PathBuf,
}

impl SmallDisk {
    /// Mounts a 16 MiB tmpfs at `mount`.
    fn mount(mount: &Path) -> Result<SmallDisk, String> {
        std::fs::create_dir_all(mount).map_err(|e| e.to_string())?;
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
            .arg(mount)
            .stderr(std::process::Stdio::piped())
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !status.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                status.status,
                String::from_utf8_lossy(&status.stderr).trim()
            ));
        }
        Ok(SmallDisk {
            mount: mount.to_owned(),
            filler: mount.join("filler"),
        })
    }

    /// Writes the filler until the file system says ENOSPC; returns the
    /// bytes written.
    fn fill(&self) -> u64 {
        use std::io::Write;
        let Ok(mut file) = std::fs::File::create(&self.filler) else {
            return 0;
        };
        let chunk = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        // Bounded: the tmpfs holds 16 MiB.
        for _ in 0..1024 {
            match file.write(&chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => written += n as u64,
            }
        }
        let _ = file.sync_all();
        written
    }

    fn empty(&self) {
        let _ = std::fs::remove_file(&self.filler);
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        self.empty();
        let _ = std::process::Command::new("umount")
            .arg(&self.mount)
            .status();
    }
}

/// One server with the proxy in front of it and, on PostgreSQL, the proxy
/// behind it.
struct Node {
    server: Server,
    front: Proxy,
    back: Option<Proxy>,
    /// The offset file of its wall clock, when clock jumps are on.
    clock: Option<PathBuf>,
    /// Its wall clock's offset from the real one, in nanoseconds.
    offset_ns: i64,
}

impl Node {
    /// (Re)starts the server, retrying while the store is unreachable.
    fn start(&mut self, recorder: &Recorder, name: &str) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..20 {
            match tokio::task::block_in_place(|| self.server.start()) {
                Ok(addr) => {
                    self.front.set_upstream(Some(addr));
                    recorder.event(format!("{name} listening on {addr}"));
                    return Ok(());
                }
                Err(e) => {
                    recorder.event(format!("{name} failed to start: {e}"));
                    last = e;
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
        }
        Err(last)
    }
}

/// `host:port` of a PostgreSQL URL, and the URL with it replaced by `addr`.
pub fn redirect(url: &str, addr: SocketAddr) -> Option<(String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (user, host) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    };
    Some((host, format!("{scheme}://{user}{addr}/{path}")))
}

/// Runs the workload under faults and checks the history.
///
/// # Errors
/// When the system under test cannot be set up (binary, database).
pub async fn run(config: RunConfig) -> Result<RunResult, String> {
    let recorder = Recorder::new();
    let store = FencedStore::new();
    let mut rng = Rng::new(config.seed);
    let schema = format!(
        "lh_chaos_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    );
    let mut nodes = Vec::new();
    let mut skipped = Vec::new();
    let mut disk = None;
    let mut config = config;
    if config.worker_bin.is_none() && config.faults.contains(&Fault::WorkerStop) {
        config.faults.retain(|f| *f != Fault::WorkerStop);
        skipped.push(format!("{}: no worker binary", Fault::WorkerStop.name()));
    }
    let private = match config.backend {
        Backend::PrivatePostgres => {
            let dir = config.dir.clone();
            let pg = tokio::task::block_in_place(|| crate::pg::PrivatePg::start(&dir))
                .map_err(|e| format!("private PostgreSQL: {e}"))?;
            recorder.event(format!("private PostgreSQL at {}", pg.url()));
            Some(pg)
        }
        _ => None,
    };
    let backend = match (&config.backend, &private) {
        (Backend::PrivatePostgres, Some(pg)) => Backend::Postgres { url: pg.url() },
        (other, _) => other.clone(),
    };
    match &backend {
        Backend::Sqlite => {
            let mut db = config.dir.join("chaos.db");
            if config.faults.contains(&Fault::DiskFull) {
                match SmallDisk::mount(&config.dir.join("small-disk")) {
                    Ok(small) => {
                        db = small.mount.join("chaos.db");
                        disk = Some(small);
                    }
                    Err(e) => {
                        config.faults.retain(|f| *f != Fault::DiskFull);
                        skipped.push(format!("{}: {e}", Fault::DiskFull.name()));
                    }
                }
            }
            let server = Server::new(
                &config.bin,
                Store::Sqlite(db),
                &config.dir.join("server-1.log"),
            );
            let front = Proxy::start(None).await.map_err(|e| e.to_string())?;
            nodes.push(Node {
                server,
                front,
                back: None,
                clock: None,
                offset_ns: 0,
            });
        }
        Backend::Postgres { url } => {
            let (db_host, _) = redirect(url, "127.0.0.1:1".parse().unwrap())
                .ok_or_else(|| format!("cannot parse {url}"))?;
            let db_addr: SocketAddr = tokio::net::lookup_host(&db_host)
                .await
                .map_err(|e| format!("{db_host}: {e}"))?
                .next()
                .ok_or_else(|| format!("{db_host}: no address"))?;
            for n in 1..=2 {
                let back = Proxy::start(Some(db_addr))
                    .await
                    .map_err(|e| e.to_string())?;
                let (_, proxied) = redirect(url, back.addr()).expect("parsed above");
                let store = Store::Postgres {
                    url: proxied,
                    schema: schema.clone(),
                };
                let log = config.dir.join(format!("server-{n}.log"));
                let server = Server::new(&config.bin, store, &log);
                let front = Proxy::start(None).await.map_err(|e| e.to_string())?;
                nodes.push(Node {
                    server,
                    front,
                    back: Some(back),
                    clock: None,
                    offset_ns: 0,
                });
            }
        }
        Backend::PrivatePostgres => unreachable!("replaced by its cluster's URL above"),
    }
    if config.faults.contains(&Fault::ClockJump) {
        match crate::clock::ClockShim::build(&config.dir) {
            Ok(shim) => {
                for (n, node) in nodes.iter_mut().enumerate() {
                    let file = config.dir.join(format!("clock-offset-{}", n + 1));
                    crate::clock::set_offset(&file, 0)?;
                    node.server.set_clock(shim.clone(), file.clone());
                    node.clock = Some(file);
                }
            }
            Err(e) => {
                config.faults.retain(|f| *f != Fault::ClockJump);
                skipped.push(format!("{}: {e}", Fault::ClockJump.name()));
            }
        }
    }
    for (n, node) in nodes.iter_mut().enumerate() {
        node.start(&recorder, &format!("server {}", n + 1))?;
    }

    let result = drive(
        &config,
        &recorder,
        &store,
        &mut rng,
        &mut nodes,
        disk.as_ref(),
        private.as_ref(),
    )
    .await;

    // The servers go before their disk, their schema and their database.
    drop(nodes);
    drop(disk);
    if let Backend::Postgres { url } = &config.backend {
        drop_schema(url, &schema).await;
    }
    drop(private);
    result.map(|mut r| {
        r.skipped = skipped;
        r
    })
}

async fn drive(
    config: &RunConfig,
    recorder: &Recorder,
    store: &FencedStore,
    rng: &mut Rng,
    nodes: &mut [Node],
    disk: Option<&SmallDisk>,
    private: Option<&crate::pg::PrivatePg>,
) -> Result<RunResult, String> {
    let start = Instant::now();
    let until = start + config.duration;
    let connect_by = until + Duration::from_secs(5);
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| format!("http://{}", n.front.addr()))
        .collect();

    let mut processes = Vec::new();
    if let Some(bin) = &config.worker_bin {
        for n in 0..config.process_workers {
            let id = 100 + n;
            let url = &urls[n as usize % urls.len()];
            let seconds = config.duration.as_secs_f64();
            let mut command = std::process::Command::new(bin);
            command
                .args(["--worker-url", url, "--worker-id", &id.to_string()])
                .args(["--origin-ns", &recorder.origin().to_string()])
                .args(["--minutes", &(seconds / 60.0).to_string()])
                .args(["--ttl-ms", &config.workload.ttl.as_millis().to_string()])
                .args(["--keys", &config.workload.keys.len().to_string()])
                .args(["--seed", &config.seed.to_string()]);
            processes.push(WorkerProcess::spawn(command, id, config, recorder, store)?);
        }
    }
    if let Some(python) = &config.python {
        let id = PYTHON_WORKER;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/worker.py");
        let mut command = std::process::Command::new(python);
        command
            .arg(script)
            .args(worker_args(&urls[0], id, config, recorder));
        processes.push(WorkerProcess::spawn(command, id, config, recorder, store)?);
    }
    if let Some(node) = &config.node {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let script = here.join("typescript/worker.mjs");
        let client = typescript_client();
        for (n, transport) in ["grpc", "grpc-web"].into_iter().enumerate() {
            let id = TYPESCRIPT_WORKERS + n as u32;
            let mut command = std::process::Command::new(node);
            command
                .arg(&script)
                .arg(&client)
                .args(worker_args(&urls[n % urls.len()], id, config, recorder))
                .arg(transport);
            processes.push(WorkerProcess::spawn(command, id, config, recorder, store)?);
        }
    }
    let mut workers = Vec::new();
    for id in 0..config.workers {
        let url = urls[id as usize % urls.len()].clone();
        let (recorder, store, load, seed) = (
            recorder.clone(),
            store.clone(),
            config.workload.clone(),
            config.seed,
        );
        workers.push(tokio::spawn(async move {
            let Some(client) = workload::connect(&url, connect_by).await else {
                return;
            };
            Worker::new(id, client, recorder, store, seed, load)
                .run(until)
                .await;
        }));
    }
    // The observer: Gets of every key in turn, through every server.
    let observer = {
        let (recorder, keys, urls, timeout) = (
            recorder.clone(),
            config.workload.keys.clone(),
            urls.clone(),
            config.workload.call_timeout,
        );
        tokio::spawn(async move {
            let mut clients = Vec::new();
            for url in &urls {
                if let Some(client) = workload::connect(url, connect_by).await {
                    clients.push(client);
                }
            }
            let mut turn = 0usize;
            while Instant::now() < until && !clients.is_empty() {
                let key = &keys[turn % keys.len()];
                let client = &clients[turn % clients.len()];
                workload::get(client, &recorder, 1000, key, timeout).await;
                turn += 1;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        })
    };

    let mut faults: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut self_exits = 0;
    let ttl = config.workload.ttl;
    let mut round: Vec<Fault> = Vec::new();
    while Instant::now() < until && !config.faults.is_empty() {
        let gap = rng.between(config.fault_gap.0, config.fault_gap.1);
        self_exits += supervise(nodes, recorder, gap).await?;
        // Every fault once per round, in a shuffled order: a short run
        // still sees each kind.
        if round.is_empty() {
            round = config.faults.clone();
            for i in (1..round.len()).rev() {
                round.swap(i, rng.range(0, i as u64 + 1) as usize);
            }
        }
        let fault = round.pop().expect("refilled above");
        let n = rng.range(0, nodes.len() as u64) as usize;
        let name = format!("server {}", n + 1);
        *faults.entry(fault.name()).or_default() += 1;
        match fault {
            Fault::KillRestart => {
                recorder.event(format!("kill -9 {name}"));
                nodes[n].server.kill9();
                let down = rng.between(Duration::ZERO, Duration::from_millis(500));
                self_exits += supervise_others(nodes, n, recorder, down).await?;
                nodes[n].start(recorder, &name)?;
            }
            Fault::StopCont => {
                let pause = rng.between(ttl, ttl * 2);
                recorder.event(format!("SIGSTOP {name} for {} ms", pause.as_millis()));
                nodes[n].server.stop();
                self_exits += supervise_others(nodes, n, recorder, pause).await?;
                nodes[n].server.cont();
                recorder.event(format!("SIGCONT {name}"));
            }
            Fault::ClientDelay => {
                let delay = rng.between(Duration::from_millis(20), Duration::from_millis(400));
                let length = rng.between(Duration::from_millis(500), Duration::from_millis(2000));
                recorder.event(format!(
                    "delay {} ms to {name} for {} ms",
                    delay.as_millis(),
                    length.as_millis()
                ));
                nodes[n].front.set_mode(Mode::Delay(delay));
                self_exits += supervise(nodes, recorder, length).await?;
                nodes[n].front.set_mode(Mode::Pass);
                recorder.event(format!("no delay to {name}"));
            }
            Fault::ClientPartition => {
                let length = rng.between(ttl / 2, ttl * 2);
                recorder.event(format!(
                    "partition workers from {name} for {} ms",
                    length.as_millis()
                ));
                nodes[n].front.set_mode(Mode::Partition);
                self_exits += supervise(nodes, recorder, length).await?;
                nodes[n].front.set_mode(Mode::Pass);
                recorder.event(format!("heal workers-{name}"));
            }
            Fault::ClientCut => {
                recorder.event(format!("cut worker connections to {name}"));
                nodes[n].front.cut();
            }
            Fault::DbCut => {
                recorder.event(format!("cut {name}'s database connections"));
                if let Some(back) = &nodes[n].back {
                    back.cut();
                }
            }
            Fault::WorkerStop => {
                let pick = rng.range(0, processes.len() as u64) as usize;
                let Some(process) = processes.get(pick) else {
                    continue;
                };
                let pause = rng.between(ttl, ttl * 2);
                recorder.event(format!(
                    "SIGSTOP worker {} for {} ms",
                    process.id,
                    pause.as_millis()
                ));
                signal("-STOP", process.child.id());
                self_exits += supervise(nodes, recorder, pause).await?;
                signal("-CONT", process.child.id());
                recorder.event(format!("SIGCONT worker {}", process.id));
            }
            Fault::ClockJump => {
                let Some(file) = nodes[n].clock.clone() else {
                    continue;
                };
                // Forward far (stored expiries look long past), or back a
                // little (they look far ahead: the restarted server keeps
                // those terms that much longer, which stalls their keys).
                let jump = if rng.range(0, 2) == 0 {
                    rng.between(Duration::from_secs(60), Duration::from_secs(3600))
                        .as_nanos() as i64
                } else {
                    -(rng.between(ttl, ttl * 3).as_nanos() as i64)
                };
                nodes[n].offset_ns += jump;
                crate::clock::set_offset(&file, nodes[n].offset_ns)?;
                recorder.event(format!(
                    "{name}'s wall clock jumps {:+} ms ({:+} ms off the real one)",
                    jump / 1_000_000,
                    nodes[n].offset_ns / 1_000_000
                ));
                let run_on = rng.between(Duration::ZERO, ttl);
                self_exits += supervise(nodes, recorder, run_on).await?;
                recorder.event(format!("kill -9 {name} (restarted on the jumped clock)"));
                nodes[n].server.kill9();
                nodes[n].start(recorder, &name)?;
            }
            Fault::DiskFull => {
                let Some(disk) = disk else { continue };
                let length = rng.between(Duration::from_millis(300), Duration::from_millis(1500));
                let filled = tokio::task::block_in_place(|| disk.fill());
                recorder.event(format!(
                    "disk full ({filled} bytes of filler) for {} ms",
                    length.as_millis()
                ));
                // Not restarted while the disk is full: it would only fail
                // to start; the supervisor restarts it after.
                self_exits += supervise_others(nodes, 0, recorder, length).await?;
                disk.empty();
                recorder.event("disk has room again");
            }
            Fault::DbRestart => {
                let Some(pg) = private else { continue };
                let down = rng.between(Duration::from_millis(300), Duration::from_millis(1500));
                recorder.event(format!(
                    "crash the database, down for {} ms",
                    down.as_millis()
                ));
                if let Err(e) = tokio::task::block_in_place(|| pg.crash()) {
                    recorder.event(format!("database crash failed: {e}"));
                }
                self_exits += supervise(nodes, recorder, down).await?;
                tokio::task::block_in_place(|| pg.up())
                    .map_err(|e| format!("the database did not come back: {e}"))?;
                recorder.event("database up again");
            }
            Fault::DbPartition => {
                let length = rng.between(ttl / 2, ttl * 2);
                recorder.event(format!(
                    "partition {name} from the database for {} ms",
                    length.as_millis()
                ));
                if let Some(back) = &nodes[n].back {
                    back.set_mode(Mode::Partition);
                }
                self_exits += supervise(nodes, recorder, length).await?;
                if let Some(back) = &nodes[n].back {
                    back.set_mode(Mode::Pass);
                }
                recorder.event(format!("heal {name}-database"));
            }
        }
    }
    // Let the workers finish their last terms (bounded: a term lasts at
    // most its hold plus a pause plus a few call timeouts).
    let settle = Instant::now() + config.workload.hold + ttl * 2 + config.workload.call_timeout * 6;
    while workers.iter().any(|w| !w.is_finished()) && Instant::now() < settle {
        self_exits += supervise(nodes, recorder, Duration::from_millis(100)).await?;
    }
    for worker in &workers {
        worker.abort();
    }
    observer.abort();
    let mut processes_left = processes.len();
    while processes_left > 0 && Instant::now() < settle {
        processes_left = processes
            .iter_mut()
            .map(|p| !p.exited())
            .filter(|running| *running)
            .count();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for process in processes {
        // Every line it wrote is recorded before the history is checked.
        tokio::task::block_in_place(|| process.finish());
    }

    // The final reads: heal everything, kill -9 and restart every server,
    // then Get every key. What was acknowledged must still be there.
    for (n, node) in nodes.iter_mut().enumerate() {
        node.front.set_mode(Mode::Pass);
        if let Some(back) = &node.back {
            back.set_mode(Mode::Pass);
        }
        node.server.cont();
        node.server.kill9();
        recorder.event(format!("final kill -9 server {}", n + 1));
    }
    for (n, node) in nodes.iter_mut().enumerate() {
        node.start(recorder, &format!("server {}", n + 1))?;
    }
    let mut unreadable_at_end = Vec::new();
    let reader = workload::connect(&urls[0], Instant::now() + Duration::from_secs(10)).await;
    for key in &config.workload.keys {
        let mut read = false;
        if let Some(client) = &reader {
            for _ in 0..20 {
                if workload::get(client, recorder, 2000, key, Duration::from_secs(2)).await {
                    read = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        if !read {
            unreadable_at_end.push(key.clone());
        }
    }
    let history = recorder.snapshot();
    let report = tokio::task::block_in_place(|| check::check(&history, &config.check));
    Ok(RunResult {
        history,
        report,
        faults,
        self_exits,
        unreadable_at_end,
        skipped: Vec::new(),
    })
}

/// A worker running as a process of its own (so it can be SIGSTOPped):
/// its stdout lines are operations for the history and writes for the
/// fenced store, read by a thread of the harness.
/// The arguments the Python and TypeScript workers take after their
/// script (see `python/worker.py`): server URL, worker id, the harness's
/// time origin, seconds to run, TTL, number of keys, seed.
fn worker_args(url: &str, id: u32, config: &RunConfig, recorder: &Recorder) -> [String; 7] {
    [
        url.to_owned(),
        id.to_string(),
        recorder.origin().to_string(),
        config.duration.as_secs_f64().to_string(),
        config.workload.ttl.as_millis().to_string(),
        config.workload.keys.len().to_string(),
        config.seed.to_string(),
    ]
}

struct WorkerProcess {
    id: u32,
    child: std::process::Child,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl WorkerProcess {
    fn spawn(
        mut command: std::process::Command,
        id: u32,
        config: &RunConfig,
        recorder: &Recorder,
        store: &FencedStore,
    ) -> Result<WorkerProcess, String> {
        let log = std::fs::File::create(config.dir.join(format!("worker-{id}.log")))
            .map_err(|e| e.to_string())?;
        let mut child = command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::from(log))
            .spawn()
            .map_err(|e| format!("spawn worker {id} ({command:?}): {e}"))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (recorder, store) = (recorder.clone(), store.clone());
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                match serde_json::from_str::<Line>(&line) {
                    Ok(Line::Op(op)) => recorder.op(op),
                    Ok(Line::Write { worker, key, fence }) => {
                        store.write(&recorder, worker, &key, fence);
                    }
                    Err(e) => recorder.event(format!("worker {id} wrote {line:?}: {e}")),
                }
            }
        });
        Ok(WorkerProcess {
            id,
            child,
            reader: Some(reader),
        })
    }

    fn exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    /// Continues it (it may be stopped), kills it if it still runs, and
    /// waits until its reader has recorded every line.
    fn finish(mut self) {
        signal("-CONT", self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

fn signal(which: &str, pid: u32) {
    let _ = std::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

/// Waits `length`, restarting any server that exits by itself meanwhile;
/// returns how many did.
async fn supervise(
    nodes: &mut [Node],
    recorder: &Recorder,
    length: Duration,
) -> Result<u32, String> {
    supervise_others(nodes, usize::MAX, recorder, length).await
}

/// As [`supervise`], leaving node `except` alone (it is down or stopped on purpose).
async fn supervise_others(
    nodes: &mut [Node],
    except: usize,
    recorder: &Recorder,
    length: Duration,
) -> Result<u32, String> {
    let end = Instant::now() + length;
    let mut exits = 0;
    loop {
        for (n, node) in nodes.iter_mut().enumerate() {
            if n == except {
                continue;
            }
            if let Some(status) = node.server.exited() {
                exits += 1;
                recorder.event(format!("server {} exited by itself: {status}", n + 1));
                node.start(recorder, &format!("server {}", n + 1))?;
            }
        }
        let now = Instant::now();
        if now >= end {
            return Ok(exits);
        }
        tokio::time::sleep((end - now).min(Duration::from_millis(100))).await;
    }
}

async fn drop_schema(url: &str, schema: &str) {
    let Ok((client, connection)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await else {
        eprintln!("could not connect to drop schema {schema}");
        return;
    };
    tokio::spawn(connection);
    if let Err(e) = client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await
    {
        eprintln!("could not drop schema {schema}: {e}");
    }
}
