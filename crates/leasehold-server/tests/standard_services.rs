//! Stock gRPC tools can talk to the server: health checking and reflection.

mod common;

use common::TestServer;
use tokio_stream::StreamExt;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1alpha;

async fn channel(server: &TestServer) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// grpc.health.v1 reports the lease service as serving.
#[tokio::test]
async fn health_reports_serving() {
    let server = TestServer::start().await;
    let mut health = HealthClient::new(channel(&server).await);
    for service in ["", "leasehold.v1.Leasehold"] {
        let reply = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            reply.status,
            ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }
}

/// Server reflection lists the lease service.
#[tokio::test]
async fn reflection_lists_the_lease_service() {
    let server = TestServer::start().await;
    let mut reflection = ServerReflectionClient::new(channel(&server).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("unexpected reply {reply:?}");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"leasehold.v1.Leasehold".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_owned()),
        "{names:?}"
    );
}

/// Server reflection v1alpha (Python's grpcio-reflection, older grpcurl and
/// GUI tools speak only this version) lists the same services as v1.
#[tokio::test]
async fn reflection_v1alpha_lists_the_lease_service() {
    use v1alpha::server_reflection_request::MessageRequest;
    use v1alpha::server_reflection_response::MessageResponse;

    let server = TestServer::start().await;
    let mut reflection =
        v1alpha::server_reflection_client::ServerReflectionClient::new(channel(&server).await);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("unexpected reply {reply:?}");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "leasehold.v1.Leasehold",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    ] {
        assert!(names.contains(&expected.to_owned()), "{names:?}");
    }
}

/// ServerInfo names the release (`leasehold --version`), the protocol
/// revision and the backend; the Rust client reads it and its health.
#[tokio::test]
async fn server_info_names_version_protocol_and_backend() {
    let server = TestServer::start().await;
    let mut raw = server.client().await;
    let reply = raw
        .server_info(leasehold_wire::pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(reply.protocol, leasehold_wire::PROTOCOL);
    assert_eq!(reply.backend, "sqlite");

    let client = leasehold_client::Client::connect(server.url())
        .await
        .unwrap();
    let info = client.server_info().await.unwrap();
    assert_eq!(info.version, reply.version);
    assert!(info.is_compatible(), "{info:?}");
    assert!(client.health().await.unwrap());
}

/// A server that lacks an RPC the client calls (an older leasehold, or not
/// leasehold at all: here a bare gRPC server with only the health service)
/// is refused as Unsupported, with a message naming the likely cause,
/// instead of tonic's empty UNIMPLEMENTED.
#[tokio::test]
async fn a_server_without_the_rpc_is_named_as_older_or_foreign() {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let client = leasehold_client::Client::connect(format!("http://{addr}"))
        .await
        .unwrap();
    for err in [
        client.server_info().await.unwrap_err(),
        client
            .get(&leasehold_client::Key::parse("k").unwrap())
            .await
            .map(|_| ())
            .unwrap_err(),
    ] {
        let leasehold_client::ClientError::Server(leasehold_core::Error::Unsupported(message)) =
            &err
        else {
            panic!("not Unsupported: {err:?}");
        };
        assert!(
            message.contains("older leasehold than this client")
                && message.contains(&format!("revision {}", leasehold_wire::PROTOCOL))
                && message.contains("leasehold health"),
            "{message}"
        );
    }
    served.abort();
}
