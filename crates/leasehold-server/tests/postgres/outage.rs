//! The database away: Unavailable then resuming, health, outages and restarts
//! under load granting nothing.

use super::*;

/// A TCP relay to the database that can be cut (every connection dropped,
/// new ones refused) and restored, to take the database away from a server.
struct Relay {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    /// Bumped on every cut, so relayed connections of an earlier epoch stop.
    epoch: Arc<tokio::sync::watch::Sender<u64>>,
    _task: JoinHandle<()>,
}

impl Relay {
    async fn to(database: SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let epoch = Arc::new(tokio::sync::watch::Sender::new(0u64));
        let task = tokio::spawn({
            let (up, epoch) = (up.clone(), epoch.clone());
            async move {
                loop {
                    let Ok((mut inbound, _)) = listener.accept().await else {
                        return;
                    };
                    if !up.load(Ordering::SeqCst) {
                        continue; // dropped: the database is "down"
                    }
                    let mut cut = epoch.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut outbound) = tokio::net::TcpStream::connect(database).await
                        else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = cut.changed() => {}
                        }
                    });
                }
            }
        });
        Relay {
            addr,
            up,
            epoch,
            _task: task,
        }
    }

    /// A relay to the test database and the database URL through it.
    async fn for_schema(schema: &Schema) -> (Relay, String) {
        let parsed: tokio_postgres::Config = schema.url.parse().unwrap();
        let host = match &parsed.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(host) => host.clone(),
            other => panic!("the test needs a TCP database, not {other:?}"),
        };
        let port = parsed.get_ports().first().copied().unwrap_or(5432);
        let database = tokio::net::lookup_host((host.as_str(), port))
            .await
            .unwrap()
            .next()
            .unwrap();
        let relay = Relay::to(database).await;
        let password = parsed
            .get_password()
            .map(|p| format!(":{}", String::from_utf8_lossy(p)))
            .unwrap_or_default();
        let url = format!(
            "postgres://{}{password}@{}/{}",
            parsed.get_user().unwrap_or("postgres"),
            relay.addr,
            parsed.get_dbname().unwrap_or("postgres")
        );
        (relay, url)
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.epoch.send_modify(|e| *e += 1);
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

/// While the database cannot be reached every request is refused with
/// UNAVAILABLE, never answered from a guess; once it is back, service
/// resumes by itself and nothing acknowledged was lost.
#[tokio::test]
async fn a_database_outage_is_unavailable_then_resumes() {
    let schema = schema_or_skip!();
    let (relay, url) = Relay::for_schema(&schema).await;
    let server = PgServer::start_with(PgConfig {
        connect_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_secs(2),
        ..PgConfig {
            url,
            ..schema.config()
        }
    })
    .await;
    let mut c = server.client().await;
    let lease = lease_of(c.acquire(acquire("k", "a", 60_000)).await.unwrap());

    relay.cut();
    let started = Instant::now();
    let refused = c.renew(renew(&lease, 0)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let refused = c.acquire(acquire("k", "b", 5_000)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let refused = c.check(check("k", lease.fence)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );

    relay.restore();
    let deadline = Instant::now() + Duration::from_secs(10);
    let renewed = loop {
        match c.renew(renew(&lease, 0)).await {
            Ok(reply) => break reply.into_inner().lease.unwrap(),
            Err(status) if status.code() == Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("after the outage: {status:?}"),
        }
    };
    assert_eq!(renewed.fence, lease.fence, "the grant outlived the outage");
    let refused = c.acquire(acquire("k", "b", 5_000)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Aborted, "still held by a");
}

/// The standard health service's status of the lease service on `client`.
async fn health_of(
    client: &mut tonic_health::pb::health_client::HealthClient<Channel>,
) -> tonic_health::pb::health_check_response::ServingStatus {
    let reply = client
        .check(tonic_health::pb::HealthCheckRequest {
            service: "leasehold.v1.Leasehold".into(),
        })
        .await
        .expect("health check");
    reply.into_inner().status()
}

/// Polls health until it is `wanted`, for at most `within`.
async fn health_becomes(
    client: &mut tonic_health::pb::health_client::HealthClient<Channel>,
    wanted: tonic_health::pb::health_check_response::ServingStatus,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let now = health_of(client).await;
        if now == wanted {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "health still {now:?}, not {wanted:?}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// gRPC health follows the database: SERVING while it answers, NOT_SERVING
/// while it cannot be reached (requests are refused UNAVAILABLE meanwhile),
/// SERVING again once it is back.
#[tokio::test]
async fn health_is_not_serving_while_the_database_is_unreachable() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let schema = schema_or_skip!();
    let (relay, url) = Relay::for_schema(&schema).await;
    let server = PgServer::start_with(PgConfig {
        connect_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_secs(2),
        health_interval: Duration::from_millis(100),
        ..PgConfig {
            url,
            ..schema.config()
        }
    })
    .await;
    let channel = Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    assert_eq!(health_of(&mut health).await, ServingStatus::Serving);

    relay.cut();
    health_becomes(
        &mut health,
        ServingStatus::NotServing,
        Duration::from_secs(5),
    )
    .await;
    let refused = server
        .client()
        .await
        .acquire(acquire("k", "a", 5_000))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    // It stays NOT_SERVING while the database is away, not just for a probe.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(health_of(&mut health).await, ServingStatus::NotServing);

    relay.restore();
    health_becomes(&mut health, ServingStatus::Serving, Duration::from_secs(10)).await;
    server
        .client()
        .await
        .acquire(acquire("k", "a", 5_000))
        .await
        .expect("served again");
}

/// When the database went away and came back during a load test, as
/// microseconds since `t0` (0: not yet).
struct Outage {
    t0: Instant,
    down_at: AtomicU64,
    up_at: AtomicU64,
}

impl Outage {
    fn new() -> Outage {
        Outage {
            t0: Instant::now(),
            down_at: AtomicU64::new(0),
            up_at: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    /// Call once the database is unreachable.
    fn went_down(&self) {
        self.down_at.store(self.now(), Ordering::SeqCst);
    }

    /// Call just before the database can be reached again.
    fn coming_up(&self) {
        self.up_at.store(self.now(), Ordering::SeqCst);
    }

    /// Whether a request sent at `sent` and answered at `answered` was
    /// wholly inside the outage.
    fn wholly_inside(&self, sent: u64, answered: u64) -> bool {
        let (down, up) = (
            self.down_at.load(Ordering::SeqCst),
            self.up_at.load(Ordering::SeqCst),
        );
        down != 0 && sent > down && (up == 0 || answered < up)
    }

    /// Whether `sent` was after the database came back.
    fn after(&self, sent: u64) -> bool {
        let up = self.up_at.load(Ordering::SeqCst);
        up != 0 && sent > up
    }
}

/// Workers acquiring and releasing hot keys through `clients` (one each)
/// until `run_for` has passed since the outage's `t0`. Each asserts that a
/// request wholly inside the outage was refused UNAVAILABLE, and records
/// grants in `ledger` (one holder per key, rising fences). Each returns how
/// many requests it had refused inside the outage and how many grants it
/// got after.
fn outage_workers(
    clients: Vec<LeaseholdClient<Channel>>,
    keys: &'static [&'static str],
    ledger: &Arc<Ledger>,
    outage: &Arc<Outage>,
    run_for: Duration,
) -> Vec<JoinHandle<(u64, u64)>> {
    let mut workers = Vec::new();
    for (worker, mut c) in clients.into_iter().enumerate() {
        let (ledger, outage) = (ledger.clone(), outage.clone());
        workers.push(tokio::spawn(async move {
            let owner = format!("w{worker}");
            let (mut in_outage, mut after_outage) = (0u64, 0u64);
            let mut round = 0;
            while outage.t0.elapsed() < run_for {
                round += 1;
                let k = (worker + round) % keys.len();
                let floor = ledger.highest.load(Ordering::SeqCst);
                let sent = outage.now();
                let request = pb::AcquireRequest {
                    request_id: format!("{owner}-{round}"),
                    ..waiting(keys[k], &owner, 2_000, 300)
                };
                let outcome = c.acquire(request).await;
                if outage.wholly_inside(sent, outage.now()) {
                    let status = outcome.as_ref().map(|_| ()).unwrap_err();
                    assert_eq!(status.code(), Code::Unavailable, "{owner}: {status:?}");
                    in_outage += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                let lease = match outcome {
                    Ok(reply) => lease_of(reply),
                    Err(status) if matches!(status.code(), Code::Aborted | Code::Unavailable) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    Err(status) => panic!("{owner}: acquire: {status:?}"),
                };
                ledger.granted(k, lease.fence, floor);
                if outage.after(sent) {
                    after_outage += 1;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                ledger.released(k);
                if let Err(status) = c.release(release(&lease, false)).await {
                    // The outage began while it held: it expires at its TTL.
                    assert_eq!(status.code(), Code::Unavailable, "{owner}: {status:?}");
                }
            }
            (in_outage, after_outage)
        }));
    }
    workers
}

/// Sums what [`outage_workers`] report and checks the outage was exercised
/// and service resumed.
async fn outage_totals(workers: Vec<JoinHandle<(u64, u64)>>) {
    let (mut in_outage, mut after_outage) = (0, 0);
    for worker in workers {
        let (during, after) = worker.await.expect("worker");
        in_outage += during;
        after_outage += after;
    }
    assert!(
        in_outage > 5,
        "the outage was exercised: {in_outage} refusals"
    );
    assert!(
        after_outage > 10,
        "service resumed: {after_outage} grants after"
    );
}

/// A new grant of every key is above every fence acknowledged before.
async fn no_fence_regression(c: &mut LeaseholdClient<Channel>, keys: &[&str], ledger: &Ledger) {
    let highest = ledger.highest.load(Ordering::SeqCst);
    for key in keys {
        let next = lease_of(
            c.acquire(waiting(key, "after", 1_000, 10_000))
                .await
                .unwrap_or_else(|status| panic!("{key} after the outage: {status:?}")),
        );
        assert!(
            next.fence > highest,
            "{key}: {} after {highest}",
            next.fence
        );
    }
}

const HOT_KEYS: [&str; 3] = ["hot/0", "hot/1", "hot/2"];

/// The database cut away under load from two servers: every request sent
/// while it is away and answered before it is back is refused UNAVAILABLE
/// (nothing is granted, refused as busy or stale, from a guess); after it
/// returns, service resumes by itself, still one holder per key, and fences
/// keep rising past every one acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_under_load_grants_nothing_and_resumes() {
    let schema = schema_or_skip!();
    let (relay, url) = Relay::for_schema(&schema).await;
    let config = PgConfig {
        connect_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_secs(2),
        ..PgConfig {
            url,
            ..schema.config()
        }
    };
    let servers = [
        PgServer::start_with(config.clone()).await,
        PgServer::start_with(config).await,
    ];
    let ledger = Arc::new(Ledger::new(HOT_KEYS.len()));
    let outage = Arc::new(Outage::new());
    let mut clients = Vec::new();
    for worker in 0..6 {
        clients.push(servers[worker % 2].client().await);
    }
    let workers = outage_workers(clients, &HOT_KEYS, &ledger, &outage, Duration::from_secs(9));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let before = ledger.grants.load(Ordering::Relaxed);
    assert!(before > 10, "too few grants before the outage: {before}");
    relay.cut();
    outage.went_down();
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    outage.coming_up();
    relay.restore();
    outage_totals(workers).await;
    no_fence_regression(&mut servers[0].client().await, &HOT_KEYS, &ledger).await;
}

/// A PostgreSQL cluster of the test's own (initdb in a temp dir, on a free
/// loopback port), which the test may stop and start: the shared database
/// must never be restarted. Run as the `postgres` user when the test runs
/// as root (PostgreSQL refuses root). Stopped and removed when dropped.
struct PrivateCluster {
    dir: tempfile::TempDir,
    bin: std::path::PathBuf,
    port: u16,
    /// Whether commands run through `runuser -u postgres`.
    as_postgres: bool,
}

impl PrivateCluster {
    /// A running cluster, or `None` with the reason when this machine
    /// cannot make one (no PostgreSQL binaries, no usable user).
    fn start() -> Result<PrivateCluster, String> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .map_err(|e| format!("no /usr/lib/postgresql: {e}"))?
            .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
            .filter(|bin| bin.join("initdb").exists())
            .max()
            .ok_or("no initdb under /usr/lib/postgresql/*/bin")?;
        let uid = std::process::Command::new("id")
            .arg("-u")
            .output()
            .map_err(|e| format!("id -u: {e}"))?;
        let as_postgres = String::from_utf8_lossy(&uid.stdout).trim() == "0";
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        if as_postgres {
            let owned = std::process::Command::new("chown")
                .args(["postgres"])
                .arg(dir.path())
                .status()
                .map_err(|e| format!("chown: {e}"))?;
            if !owned.success() {
                return Err("cannot give the temp dir to the postgres user".into());
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let cluster = PrivateCluster {
            dir,
            bin,
            port,
            as_postgres,
        };
        let data = cluster.data();
        cluster.run(
            "initdb",
            &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"],
        )?;
        cluster.pg_ctl_start()?;
        Ok(cluster)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<(), String> {
        let program = self.bin.join(tool);
        let mut command = if self.as_postgres {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            std::process::Command::new(&program)
        };
        let output = command
            .args(args)
            .output()
            .map_err(|e| format!("{tool}: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{tool} failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "start",
            ],
        )
    }

    /// Stops the database as a crash would (`-m immediate`: no checkpoint,
    /// connections cut; crash recovery on the next start).
    fn crash(&self) {
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        )
        .expect("stop the private cluster");
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }
}

/// The database itself restarted (stopped as by a crash, then started
/// again) under load from two servers: requests wholly inside the outage
/// are UNAVAILABLE, health is NOT_SERVING while it is down and SERVING
/// after, service resumes by itself, one holder per key throughout, and
/// fences rise past every one acknowledged (the sequence survives crash
/// recovery). Runs on a private cluster; skipped when none can be made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_under_load_grants_nothing_and_resumes() {
    use tonic_health::pb::health_check_response::ServingStatus;
    if database().is_none() {
        return;
    }
    let cluster = match PrivateCluster::start() {
        Ok(cluster) => cluster,
        Err(why) => {
            eprintln!("database restart test skipped: cannot run a private PostgreSQL: {why}");
            return;
        }
    };
    let schema = Schema::fresh(cluster.url());
    let config = PgConfig {
        connect_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_secs(2),
        health_interval: Duration::from_millis(100),
        ..schema.config()
    };
    let servers = [
        PgServer::start_with(config.clone()).await,
        PgServer::start_with(config).await,
    ];
    let channel = Channel::from_shared(format!("http://{}", servers[1].addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    assert_eq!(health_of(&mut health).await, ServingStatus::Serving);
    let ledger = Arc::new(Ledger::new(HOT_KEYS.len()));
    let outage = Arc::new(Outage::new());
    let mut clients = Vec::new();
    for worker in 0..6 {
        clients.push(servers[worker % 2].client().await);
    }
    let workers = outage_workers(
        clients,
        &HOT_KEYS,
        &ledger,
        &outage,
        Duration::from_secs(10),
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let before = ledger.grants.load(Ordering::Relaxed);
    assert!(before > 10, "too few grants before the restart: {before}");
    cluster.crash();
    outage.went_down();
    health_becomes(
        &mut health,
        ServingStatus::NotServing,
        Duration::from_secs(5),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    outage.coming_up();
    cluster
        .pg_ctl_start()
        .expect("start the private cluster again");
    health_becomes(&mut health, ServingStatus::Serving, Duration::from_secs(10)).await;
    outage_totals(workers).await;
    no_fence_regression(&mut servers[0].client().await, &HOT_KEYS, &ledger).await;
    drop(servers);
    drop(schema); // on the private cluster, which is still up
}
