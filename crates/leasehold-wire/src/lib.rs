//! leasehold's wire format, shared by the server and every Rust client.
//!
//! - [`pb`]: the generated protobuf and gRPC code for `leasehold.v1`,
//!   quarantined: nothing outside this crate builds `pb` values by hand.
//! - [`status`]: the one table between [`leasehold_core::Error`] and
//!   `tonic::Status` (and the Session stream's in-band refusals), both ways.
//! - [`convert`]: the conversions between `pb` and domain values, both ways.

/// The revision of `leasehold.v1` this code speaks (`ServerInfo.protocol`):
/// raised by one whenever an RPC or a field a client may rely on is added.
pub const PROTOCOL: u32 = 2;

pub mod convert;
pub mod pb;
pub mod status;
