// @leasehold/client: session leases with fencing tokens for Node and Bun.
//
// createClient() connects; lh.acquire() / lh.withLease() hand out a Lease
// that renews itself, aborts its `signal` when lost, and carries its fence
// (a bigint) for storage-side checks (see ./fence.js).

export { createClient, LeaseholdClient, type AcquireOptions, type ClientOptions, type TlsOptions } from "./client.js";
export { Lease, type Ended, type ToolCallOptions } from "./lease.js";
export {
  BusyError,
  CompactedError,
  InvalidArgumentError,
  LeaseholdError,
  LeaseLostError,
  NotOwnedError,
  PermissionDeniedError,
  QuarantinedError,
  ReservedError,
  ResourceExhaustedError,
  UnauthenticatedError,
  UnavailableError,
  UnsupportedError,
  type LossReason,
  type StaleReason,
} from "./errors.js";
export {
  Watch,
  type HistoryEntry,
  type HistoryPage,
  type KeyPage,
  type KeyState,
  type ListFilterName,
  type LiveTerm,
  type Reservation,
  type ServerInfo,
  type WatchEvent,
  type WatchEventKind,
  type WatchOptions,
} from "./lifecycle.js";
export { PROTOCOL } from "./protocol.js";
export type {
  ToolCallRecord,
  ToolCallRequest,
  ToolInvocation,
  ToolOutcome,
  ToolResult,
  ToolRunner,
  ToolRunResult,
} from "./tools.js";
export type {
  Transcript,
  TranscriptFinding,
  TranscriptFormat,
  TranscriptRepair,
  TranscriptReport,
} from "./transcripts.js";
export {
  FenceTimeoutError,
  PG_ADVANCE,
  PG_CREATE_TABLE,
  PG_HIGHEST,
  PG_HIGHEST_OF_ALL,
  PG_IDLE_TIMEOUT_MS,
  PG_LOCK_TIMEOUT_MS,
  pgFencedWrite,
  pgFenceFloor,
  SQLITE_ADVANCE,
  SQLITE_CREATE_TABLE,
  SQLITE_HIGHEST_OF_ALL,
  SQLITE_OPEN_TIMEOUT_MS,
  sqliteFenceFloor,
  sqliteFencedWrite,
  StaleFenceError,
  type PgFenceOptions,
  type PgPool,
  type PgQueryable,
  type SqliteConnection,
  type SqliteFenceOptions,
} from "./fence.js";
