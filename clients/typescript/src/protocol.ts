// The revision of `leasehold.v1` this client speaks (ServerInfo.protocol in
// the proto): raised by one whenever an RPC or a field it relies on is added.

/** The revision of `leasehold.v1` this client speaks: `ServerInfo.protocol` must be at least this. */
export const PROTOCOL = 1;
