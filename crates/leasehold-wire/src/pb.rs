//! Generated protobuf and gRPC code for `leasehold.v1`, quarantined here.
//! Conversions to domain types live in [`crate::convert`].

#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("leasehold.v1");

/// The encoded descriptors of `leasehold.v1`, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("leasehold_descriptor");
