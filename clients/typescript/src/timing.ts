// Renewal and deadline settings, and the monotonic clock they run on.

import { performance } from "node:perf_hooks";
import { InvalidArgumentError } from "./errors.js";

/** The local monotonic clock, in milliseconds. Never the wall clock. */
export function now(): number {
  return performance.now();
}

export interface Timing {
  readonly ttlMs: number;
  /** How often a renewal is sent (before jitter). */
  readonly renewEveryMs: number;
  /** Subtracted from the TTL for the local deadline. */
  readonly safetyMarginMs: number;
  /** How long one renew, check or release may take. */
  readonly rpcTimeoutMs: number;
}

export interface TimingOptions {
  ttlMs: number;
  renewEveryMs?: number | undefined;
  safetyMarginMs?: number | undefined;
  rpcTimeoutMs?: number | undefined;
}

function positiveInt(name: string, value: number): number {
  if (!Number.isSafeInteger(value) || value <= 0) {
    throw new InvalidArgumentError(`${name} must be a positive integer number of milliseconds, not ${value}`);
  }
  return value;
}

/** The defaults of the Rust client: renew every ttl/3, margin ttl/10 (at most 2 s). */
export function timing(o: TimingOptions): Timing {
  const ttlMs = positiveInt("ttlMs", o.ttlMs);
  const renewEveryMs = positiveInt("renewEveryMs", o.renewEveryMs ?? Math.max(1, Math.floor(ttlMs / 3)));
  const safetyMarginMs = o.safetyMarginMs ?? Math.min(Math.floor(ttlMs / 10), 2_000);
  if (!Number.isSafeInteger(safetyMarginMs) || safetyMarginMs < 0) {
    throw new InvalidArgumentError(`safetyMarginMs must be a non-negative integer, not ${safetyMarginMs}`);
  }
  if (renewEveryMs >= ttlMs - safetyMarginMs) {
    throw new InvalidArgumentError(
      `renewEveryMs (${renewEveryMs}) must be shorter than ttlMs - safetyMarginMs (${ttlMs - safetyMarginMs})`,
    );
  }
  const rpcTimeoutMs = positiveInt("rpcTimeoutMs", o.rpcTimeoutMs ?? Math.min(renewEveryMs, 5_000));
  return { ttlMs, renewEveryMs, safetyMarginMs, rpcTimeoutMs };
}

/** How long a term stays valid after the send time of its last renewal. */
export function validFor(t: Timing): number {
  return t.ttlMs - t.safetyMarginMs;
}

/** Between 75% and 100% of `ms`, so leases renewed together drift apart. */
export function jitterRenewal(ms: number): number {
  return ms * (0.75 + 0.25 * Math.random());
}

/**
 * The pause before retry number `attempt` (1-based) of a failed renewal:
 * an eighth of the interval, doubling, never above the interval, jittered to
 * between half and all of that (as the Rust client does).
 */
export function retryPause(t: Timing, attempt: number): number {
  const base = Math.min(t.renewEveryMs, (t.renewEveryMs / 8) * 2 ** Math.min(attempt - 1, 10));
  return base * (0.5 + 0.5 * Math.random());
}

/** A promise that resolves after `ms` (for pauses a caller awaits). */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => {
    setTimeout(resolve, ms);
  });
}
