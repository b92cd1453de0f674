// Tool-call pairing checks for transcripts, done by the server (the same
// checks as `leasehold transcript check`), so the history can be validated
// right before it is sent to a model provider.

import type { TranscriptFinding as PbFinding } from "./gen/leasehold/v1/leasehold_pb.js";

/** "openai-chat", "anthropic", "openai-responses"; omitted means auto-detect. */
export type TranscriptFormat = "openai-chat" | "anthropic" | "openai-responses";

/**
 * A transcript: an array of messages (sent as JSON), or JSON text (an array
 * of messages, or JSON lines).
 */
export type Transcript = string | readonly unknown[];

export interface TranscriptFinding {
  /** missing, duplicate_result, orphan, misplaced, duplicate_call_id, text_before_tool_result, results_split_across_messages */
  readonly kind: string;
  readonly callId: string;
  /** 0-based message index. */
  readonly index: number;
  /** 1-based line for JSON-lines input, else 0. */
  readonly line: number;
  readonly detail: string;
  /** The provider error this would cause. */
  readonly providerError: string;
}

export interface TranscriptReport {
  readonly healthy: boolean;
  /** The format checked against; empty when the transcript has no tool activity. */
  readonly format: string;
  readonly messages: number;
  readonly findings: readonly TranscriptFinding[];
  /** The same report as `leasehold transcript check --json`, parsed. */
  readonly report: unknown;
}

export interface TranscriptRepair<T extends Transcript> {
  /** The repaired transcript, in the input's shape (unchanged if healthy). */
  readonly transcript: T extends string ? string : unknown[];
  /** True when the repaired transcript is healthy. */
  readonly healthy: boolean;
  /** Every action taken (moved, dropped, inserted). */
  readonly actions: readonly unknown[];
  /** What repair could not fix, left for a person (indices into the output). */
  readonly unrecoverable: readonly TranscriptFinding[];
}

export function transcriptText(t: Transcript): string {
  return typeof t === "string" ? t : JSON.stringify(t);
}

export function toFinding(f: PbFinding): TranscriptFinding {
  return {
    kind: f.kind,
    callId: f.callId,
    index: Number(f.index),
    line: Number(f.line),
    detail: f.detail,
    providerError: f.providerError,
  };
}
