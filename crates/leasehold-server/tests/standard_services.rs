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
