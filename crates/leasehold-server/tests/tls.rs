//! TLS and mutual TLS on the gRPC port, with certificates made at test time
//! (rcgen): the right client gets in, the wrong ones do not, and a reload
//! swaps certificates for new connections without dropping open ones.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::{T0, binary};
use leasehold_client::{Client, ClientError, Tls};
use leasehold_core::{Clock, Error, ManualClock};
use leasehold_server::server::{self, Listeners};
use leasehold_server::sqlite::SyncMode;
use leasehold_server::tls::{ServerTls, TlsFiles};
use leasehold_server::{Engine, EngineConfig};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

/// A certificate authority that can sign server and client certificates.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    fn pem(&self) -> Vec<u8> {
        self.cert.pem().into_bytes()
    }

    /// A leaf certificate and its key, as PEM.
    fn issue(&self, name: &str, purpose: ExtendedKeyUsagePurpose) -> (Vec<u8>, Vec<u8>) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![purpose];
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem().into_bytes(), key.serialize_pem().into_bytes())
    }
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn write(&self, name: &str, pem: &[u8]) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// An in-process server with `tls` on 127.0.0.1:0; returns its address.
async fn serve(tls: Arc<ServerTls>, db: &Path) -> (std::net::SocketAddr, Engine) {
    let engine = server::open_engine(
        db,
        SyncMode::Full,
        Arc::new(ManualClock::new(T0)) as Arc<dyn Clock>,
        EngineConfig::default(),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listeners = Listeners {
        tls: Some(tls),
        ..Listeners::plain(listener)
    };
    tokio::spawn(server::serve_on(
        listeners,
        engine.clone(),
        std::future::pending(),
        server::ServeOptions::default(),
    ));
    (addr, engine)
}

/// Whether a client with `tls` can acquire a key on the server at `addr`.
async fn can_acquire(url: String, tls: Tls, key: &str) -> Result<(), ClientError> {
    let client = Client::connect_tls(url, tls).await?;
    let guard = client.acquire(key).ttl(Duration::from_secs(5)).await?;
    guard.release().await?;
    Ok(())
}

fn refused_by_transport(result: Result<(), ClientError>) {
    assert!(
        matches!(result, Err(ClientError::Server(Error::Unavailable(_)))),
        "expected the connection to be refused, got {result:?}"
    );
}

#[tokio::test]
async fn tls_lets_in_only_clients_that_trust_the_server() {
    let files = Files::new();
    let ca = Ca::new("leasehold test CA");
    let (cert, key) = ca.issue("server", ExtendedKeyUsagePurpose::ServerAuth);
    let tls = ServerTls::load(TlsFiles {
        cert: files.write("server.pem", &cert),
        key: files.write("server.key", &key),
        client_ca: None,
    })
    .unwrap();
    let (addr, _engine) = serve(tls, &files.path("l.db")).await;
    let https = format!("https://localhost:{}", addr.port());
    let trusted = Tls {
        ca_pem: Some(ca.pem()),
        ..Tls::default()
    };

    can_acquire(https.clone(), trusted, "session:1")
        .await
        .unwrap();
    // Plaintext to a TLS port gets nowhere.
    let plain = Client::connect(format!("http://{addr}")).await;
    if let Ok(plain) = plain {
        let refused = plain.acquire("session:2").await.map(|_| ());
        refused_by_transport(refused);
    }
    // A client that trusts another CA refuses the server's certificate.
    let other = Tls {
        ca_pem: Some(Ca::new("another CA").pem()),
        ..Tls::default()
    };
    refused_by_transport(can_acquire(https, other, "session:3").await);
}

#[tokio::test]
async fn mutual_tls_requires_a_client_certificate_from_the_client_ca() {
    let files = Files::new();
    let ca = Ca::new("leasehold test CA");
    let (cert, key) = ca.issue("server", ExtendedKeyUsagePurpose::ServerAuth);
    let tls = ServerTls::load(TlsFiles {
        cert: files.write("server.pem", &cert),
        key: files.write("server.key", &key),
        client_ca: Some(files.write("clients.pem", &ca.pem())),
    })
    .unwrap();
    let (addr, _engine) = serve(tls, &files.path("l.db")).await;
    let https = format!("https://localhost:{}", addr.port());

    let no_cert = Tls {
        ca_pem: Some(ca.pem()),
        ..Tls::default()
    };
    refused_by_transport(can_acquire(https.clone(), no_cert, "session:1").await);

    let stranger = Ca::new("a stranger's CA");
    let foreign = Tls {
        ca_pem: Some(ca.pem()),
        identity: Some(stranger.issue("worker", ExtendedKeyUsagePurpose::ClientAuth)),
        domain: None,
    };
    refused_by_transport(can_acquire(https.clone(), foreign, "session:2").await);

    let worker = Tls {
        ca_pem: Some(ca.pem()),
        identity: Some(ca.issue("worker", ExtendedKeyUsagePurpose::ClientAuth)),
        domain: None,
    };
    can_acquire(https, worker, "session:3").await.unwrap();
}

#[tokio::test]
async fn a_reload_serves_the_new_certificate_and_keeps_open_connections() {
    let files = Files::new();
    let old_ca = Ca::new("old CA");
    let (cert, key) = old_ca.issue("server", ExtendedKeyUsagePurpose::ServerAuth);
    let tls = ServerTls::load(TlsFiles {
        cert: files.write("server.pem", &cert),
        key: files.write("server.key", &key),
        client_ca: None,
    })
    .unwrap();
    let (addr, _engine) = serve(tls.clone(), &files.path("l.db")).await;
    let https = format!("https://localhost:{}", addr.port());
    let trusts = |ca: &Ca| Tls {
        ca_pem: Some(ca.pem()),
        ..Tls::default()
    };
    let open = Client::connect_tls(https.clone(), trusts(&old_ca))
        .await
        .unwrap();
    let held = open.acquire("session:held").await.unwrap();

    // Rotate: a certificate from a new CA, then reload.
    let new_ca = Ca::new("new CA");
    let (cert, key) = new_ca.issue("server", ExtendedKeyUsagePurpose::ServerAuth);
    files.write("server.pem", &cert);
    files.write("server.key", &key);
    // A half-written rotation is refused and changes nothing.
    files.write("server.key", b"not a key");
    assert!(tls.reload().is_err());
    can_acquire(https.clone(), trusts(&old_ca), "session:a")
        .await
        .unwrap();
    files.write("server.key", &key);
    tls.reload().unwrap();

    can_acquire(https.clone(), trusts(&new_ca), "session:b")
        .await
        .unwrap();
    refused_by_transport(can_acquire(https, trusts(&old_ca), "session:c").await);
    // The connection opened before the rotation still works.
    held.verify().await.unwrap();
    held.release().await.unwrap();
}

#[test]
fn serve_refuses_a_non_loopback_address_without_client_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(binary())
        .args(["serve", "--listen", "0.0.0.0:0", "--db"])
        .arg(dir.path().join("l.db"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--insecure"), "{stderr}");
    assert!(stderr.contains("--client-ca"), "{stderr}");
}

/// The real binary: `serve --tls-cert/--tls-key`, the CLI with `--tls-ca`,
/// and a certificate rotation by SIGHUP that the process survives.
#[test]
fn the_binary_serves_tls_and_reloads_on_sighup() {
    use std::io::{BufRead, BufReader};
    let files = Files::new();
    let ca = Ca::new("leasehold test CA");
    let (cert, key) = ca.issue("server", ExtendedKeyUsagePurpose::ServerAuth);
    let mut child = Command::new(binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(files.path("l.db"))
        .arg("--tls-cert")
        .arg(files.write("server.pem", &cert))
        .arg("--tls-key")
        .arg(files.write("server.key", &key))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: std::net::SocketAddr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .parse()
        .unwrap();
    let cli = |ca_file: &Path| {
        Command::new(binary())
            .args(["acquire", "session:cli", "--ttl-ms", "1000", "--server"])
            .arg(format!("https://localhost:{}", addr.port()))
            .arg("--tls-ca")
            .arg(ca_file)
            .output()
            .unwrap()
    };
    let ok = cli(&files.write("ca.pem", &ca.pem()));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("fence=1"));

    let new_ca = Ca::new("new CA");
    let (cert, key) = new_ca.issue("server", ExtendedKeyUsagePurpose::ServerAuth);
    files.write("server.pem", &cert);
    files.write("server.key", &key);
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let new_ca_file = files.write("new-ca.pem", &new_ca.pem());
    let mut reloaded = false;
    for _ in 0..100 {
        let out = cli(&new_ca_file);
        // Busy (the first acquire still holds the key) means TLS worked.
        if String::from_utf8_lossy(&out.stderr).contains("Aborted") {
            reloaded = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(reloaded, "the rotated certificate was never served");
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP ended the server"
    );
    let _ = child.kill();
    let _ = child.wait();
}
