// A server run with --auth: the client's bearer token gets in within its
// scopes, no token is UnauthenticatedError, a scope it lacks is
// PermissionDeniedError; on both transports.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { createClient, PermissionDeniedError, ResourceExhaustedError, UnauthenticatedError } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

const sha256 = (token: string): string => createHash("sha256").update(token).digest("hex");

describe("bearer tokens against --auth", () => {
  let server: TestServer;
  before(async () => {
    const dir = mkdtempSync(join(tmpdir(), "leasehold-ts-auth-"));
    const auth = join(dir, "auth.toml");
    writeFileSync(
      auth,
      `
[[principal]]
name = "fleet"
token_sha256 = "${sha256("fleet-token")}"
scopes = [{ prefix = "session:", rights = ["hold", "check"] }]
`,
    );
    server = await startServer(dir, "127.0.0.1:0", ["--auth", auth]);
  });
  after(async () => {
    await server.close();
  });

  for (const transport of ["grpc", "grpc-web"] as const) {
    it(`sends the token over ${transport}`, async () => {
      const fleet = createClient({ baseUrl: server.baseUrl, transport, token: "fleet-token" });
      const lease = await fleet.acquire(`session:${transport}`, { ttlMs: 2_000 });
      assert.equal(await lease.gate(), lease.fence);
      await lease.release();
      await assert.rejects(fleet.acquire(`db:${transport}`, { ttlMs: 2_000 }), PermissionDeniedError);
      const anonymous = createClient({ baseUrl: server.baseUrl, transport });
      await assert.rejects(anonymous.acquire(`session:x-${transport}`, { ttlMs: 2_000 }), UnauthenticatedError);
      fleet.close();
      anonymous.close();
    });
  }
});

describe("keys per principal", () => {
  let server: TestServer;
  before(async () => {
    const dir = mkdtempSync(join(tmpdir(), "leasehold-ts-keys-"));
    const auth = join(dir, "auth.toml");
    writeFileSync(
      auth,
      `
[[principal]]
name = "fleet"
token_sha256 = "${sha256("fleet-token")}"
scopes = [{ prefix = "session:", rights = ["hold", "check"] }]

[[principal]]
name = "other"
token_sha256 = "${sha256("other-token")}"
scopes = [{ prefix = "session:", rights = ["hold", "check"] }]
`,
    );
    server = await startServer(dir, "127.0.0.1:0", ["--auth", auth, "--max-keys-per-principal", "1"]);
  });
  after(async () => {
    await server.close();
  });

  for (const transport of ["grpc", "grpc-web"] as const) {
    it(`refuses a principal's key past the limit with ResourceExhaustedError (${transport})`, async () => {
      const fleet = createClient({ baseUrl: server.baseUrl, transport, token: "fleet-token" });
      const other = createClient({ baseUrl: server.baseUrl, transport, token: "other-token" });
      const held = await fleet.acquire(`session:${transport}-1`, { ttlMs: 5_000 });
      await assert.rejects(
        fleet.acquire(`session:${transport}-2`, { ttlMs: 5_000 }),
        (err: unknown) => err instanceof ResourceExhaustedError && err.limit === "keys_per_principal",
      );
      // Its held key and other principals are served as ever.
      assert.equal(await held.gate(), held.fence);
      const theirs = await other.acquire(`session:${transport}-2`, { ttlMs: 5_000 });
      await theirs.release();
      // A release gives the key back.
      await held.release();
      const next = await fleet.acquire(`session:${transport}-3`, { ttlMs: 5_000 });
      await next.release();
      fleet.close();
      other.close();
    });
  }
});
