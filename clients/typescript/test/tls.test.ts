// TLS and mutual TLS against a real `leasehold serve --tls-cert/--tls-key
// [--client-ca]`, with certificates made by openssl for the test run: the
// right client gets in on both transports, plaintext or an untrusted server
// or a missing client certificate is UnavailableError, a bearer token works
// over TLS, and grpc-web over fetch trusts a private CA through
// NODE_EXTRA_CA_CERTS.

import assert from "node:assert/strict";
import { execFile, execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { createClient, InvalidArgumentError, UnauthenticatedError, UnavailableError } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

interface Pki {
  dir: string;
  ca: string;
  otherCa: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
}

const openssl = (dir: string, ...args: string[]): void => {
  execFileSync("openssl", args, { cwd: dir, stdio: "ignore" });
};

function makeCa(dir: string, name: string): void {
  openssl(dir, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
    "-subj", `/CN=${name}`, "-keyout", `${name}.key`, "-out", `${name}.pem`,
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign");
}

function issue(dir: string, name: string, extensions: string): void {
  openssl(dir, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
    "-subj", `/CN=${name}`, "-keyout", `${name}.key`, "-out", `${name}.csr`);
  writeFileSync(join(dir, `${name}.ext`), extensions);
  openssl(dir, "x509", "-req", "-in", `${name}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
    "-days", "2", "-extfile", `${name}.ext`, "-out", `${name}.pem`);
}

/** A CA, a server certificate for 127.0.0.1 and localhost, a client certificate, and an unrelated CA. */
function makePki(): Pki {
  const dir = mkdtempSync(join(tmpdir(), "leasehold-ts-pki-"));
  makeCa(dir, "ca");
  makeCa(dir, "other-ca");
  issue(dir, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
  issue(dir, "worker-1", "extendedKeyUsage=clientAuth\n");
  const read = (file: string): string => readFileSync(join(dir, file), "utf8");
  return {
    dir,
    ca: read("ca.pem"),
    otherCa: read("other-ca.pem"),
    serverCert: join(dir, "server.pem"),
    serverKey: join(dir, "server.key"),
    clientCert: read("worker-1.pem"),
    clientKey: read("worker-1.key"),
  };
}

const https = (server: TestServer): string => server.baseUrl.replace(/^http:/, "https:");
const transports = ["grpc", "grpc-web"] as const;
/** Short TTL and timeouts, so refused attempts (retried as Unavailable) end soon. */
const quick = { ttlMs: 2_000, rpcTimeoutMs: 1_000 };

describe("TLS", () => {
  let pki: Pki;
  let server: TestServer;
  before(async () => {
    pki = makePki();
    server = await startServer(undefined, "127.0.0.1:0", ["--tls-cert", pki.serverCert, "--tls-key", pki.serverKey]);
  });
  after(async () => {
    await server.close();
  });

  for (const transport of transports) {
    it(`holds a lease over https with the private CA (${transport})`, async () => {
      const lh = createClient({ baseUrl: https(server), transport, tls: { ca: pki.ca } });
      const lease = await lh.acquire(`session:tls-${transport}`, quick);
      assert.equal(await lease.gate(), lease.fence);
      await lease.release();
      lh.close();
    });

    it(`refuses plaintext to a TLS server as UnavailableError (${transport})`, async () => {
      const lh = createClient({ baseUrl: server.baseUrl, transport });
      await assert.rejects(lh.acquire(`session:plain-${transport}`, quick), UnavailableError);
      lh.close();
    });

    it(`refuses a server whose CA it does not trust as UnavailableError (${transport})`, async () => {
      for (const tls of [undefined, { ca: pki.otherCa }]) {
        const lh = createClient({ baseUrl: https(server), transport, ...(tls === undefined ? {} : { tls }) });
        await assert.rejects(lh.acquire(`session:untrusted-${transport}`, quick), UnavailableError);
        lh.close();
      }
    });
  }

  it("takes the CA as bytes too", async () => {
    const lh = createClient({ baseUrl: https(server), tls: { ca: new TextEncoder().encode(pki.ca) } });
    const lease = await lh.acquire("session:bytes", quick);
    await lease.release();
    lh.close();
  });

  it("refuses contradictory options when the client is made", () => {
    assert.throws(() => createClient({ baseUrl: server.baseUrl, tls: { ca: pki.ca } }), InvalidArgumentError);
    assert.throws(
      () => createClient({ baseUrl: https(server), tls: { ca: pki.ca, cert: pki.clientCert } }),
      InvalidArgumentError,
    );
  });

  it("grpc-web over fetch trusts a private CA given as NODE_EXTRA_CA_CERTS", async () => {
    // fetch takes no per-client CA; a process started with the variable does.
    const client = fileURLToPath(new URL("../src/index.js", import.meta.url));
    const script = `
      import { createClient } from ${JSON.stringify(client)};
      const lh = createClient({ baseUrl: ${JSON.stringify(https(server))}, transport: "grpc-web" });
      const lease = await lh.acquire("session:extra-ca", { ttlMs: 2000, rpcTimeoutMs: 1000 });
      await lease.release();
      console.log("fence", String(lease.fence));
    `;
    const run = (env: NodeJS.ProcessEnv): Promise<{ ok: boolean; out: string }> =>
      new Promise((resolve) => {
        execFile(process.execPath, ["--input-type=module", "-e", script], { env, timeout: 20_000 }, (err, stdout, stderr) =>
          resolve({ ok: err === null, out: stdout + stderr }),
        );
      });
    const withCa = await run({ ...process.env, NODE_EXTRA_CA_CERTS: join(pki.dir, "ca.pem") });
    assert.ok(withCa.ok, withCa.out);
    assert.match(withCa.out, /^fence \d+$/m);
    const without = await run({ ...process.env, NODE_EXTRA_CA_CERTS: "" });
    assert.ok(!without.ok, `without the CA the client got in: ${without.out}`);
    assert.match(without.out, /UnavailableError/);
  });
});

describe("mutual TLS", () => {
  let pki: Pki;
  let server: TestServer;
  before(async () => {
    pki = makePki();
    const auth = join(pki.dir, "auth.toml");
    const sha256 = createHash("sha256").update("fleet-token").digest("hex");
    writeFileSync(
      auth,
      `
[[principal]]
name = "worker"
subject = "worker-1"
scopes = [{ prefix = "session:", rights = ["hold", "check"] }]

[[principal]]
name = "fleet"
token_sha256 = "${sha256}"
scopes = [{ prefix = "token:", rights = ["hold", "check"] }]
`,
    );
    server = await startServer(undefined, "127.0.0.1:0", [
      "--tls-cert", pki.serverCert, "--tls-key", pki.serverKey, "--client-ca", join(pki.dir, "ca.pem"),
      "--auth", auth,
    ]);
  });
  after(async () => {
    await server.close();
  });

  for (const transport of transports) {
    it(`lets in a client certificate from the client CA (${transport})`, async () => {
      const tls = { ca: pki.ca, cert: pki.clientCert, key: pki.clientKey };
      const lh = createClient({ baseUrl: https(server), transport, tls });
      const lease = await lh.acquire(`session:mtls-${transport}`, quick);
      assert.equal(await lease.gate(), lease.fence);
      await lease.release();
      lh.close();
    });

    it(`refuses a client without a certificate as UnavailableError (${transport})`, async () => {
      const lh = createClient({ baseUrl: https(server), transport, tls: { ca: pki.ca } });
      await assert.rejects(lh.acquire(`session:anonymous-${transport}`, quick), UnavailableError);
      lh.close();
    });

    it(`checks a bearer token sent over mutual TLS (${transport})`, async () => {
      const tls = { ca: pki.ca, cert: pki.clientCert, key: pki.clientKey };
      const fleet = createClient({ baseUrl: https(server), transport, tls, token: "fleet-token" });
      const lease = await fleet.acquire(`token:${transport}`, quick);
      await lease.release();
      fleet.close();
      const wrong = createClient({ baseUrl: https(server), transport, tls, token: "guess" });
      await assert.rejects(wrong.acquire(`token:${transport}`, quick), UnauthenticatedError);
      wrong.close();
    });
  }
});
