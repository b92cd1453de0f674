// The web console in a real headless Chromium (Debian's /usr/bin/chromium,
// driven by playwright-core: no browser is downloaded). Starts
// `$LEASEHOLD_BIN serve --console-listen … --auth …`, makes leases with the
// TypeScript client (and the leasehold CLI for terms that must not be
// renewed), and checks what each page shows, live, without reloads.
// Screenshots of every page at 1280x800 and 390x844 go to
// target/console-screenshots/ (LEASEHOLD_SCREENSHOTS=docs/console to
// refresh the committed ones: a test run leaves the work tree as it was).
import { spawn, execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, writeFileSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../..");
const bin = process.env.LEASEHOLD_BIN;
const tsClient = process.env.LEASEHOLD_TS_CLIENT || join(repo, "clients/typescript");
const shots = join(repo, process.env.LEASEHOLD_SCREENSHOTS ?? "target/console-screenshots");
const { createClient } = await import(join(tsClient, "dist/index.js"));

const TOKENS = { ops: "ops-browser-token", viewer: "viewer-browser-token", tenantA: "tenant-a-browser-token" };
const sha = (t) => createHash("sha256").update(t).digest("hex");

const dir = mkdtempSync(join(tmpdir(), "leasehold-console-"));
writeFileSync(join(dir, "auth.toml"), `
[[principal]]
name = "ops"
token_sha256 = "${sha(TOKENS.ops)}"
scopes = [{ prefix = "", rights = ["admin"] }]

[[principal]]
name = "viewer"
token_sha256 = "${sha(TOKENS.viewer)}"
scopes = [{ prefix = "", rights = ["read"] }]

[[principal]]
name = "tenant-a"
token_sha256 = "${sha(TOKENS.tenantA)}"
scopes = [{ prefix = "a:", rights = ["read"] }]
`);

function serverEnv() {
  const env = { ...process.env, RUST_LOG: "warn" };
  delete env.LEASEHOLD_STORE;
  delete env.LEASEHOLD_DB;
  return env;
}
const server = spawn(bin, [
  "serve", "--listen", "127.0.0.1:0", "--console-listen", "127.0.0.1:0",
  "--auth", join(dir, "auth.toml"), "--db", join(dir, "l.db"), "--drain-timeout-ms", "300",
], { stdio: ["ignore", "pipe", "inherit"], env: serverEnv() });
const lines = createInterface({ input: server.stdout });
const addresses = await new Promise((ok, fail) => {
  const found = {};
  lines.on("line", (line) => {
    if (line.startsWith("listening on ")) found.grpc = "http://" + line.slice(13).trim();
    if (line.startsWith("console on ")) { found.console = line.slice(11).trim().replace(/\/$/, ""); ok(found); }
  });
  server.on("exit", (code) => fail(new Error("leasehold serve exited with " + code)));
  setTimeout(() => fail(new Error("the server did not start")), 10000);
});
const { grpc, console: consoleUrl } = addresses;

const client = createClient({ baseUrl: grpc, token: TOKENS.ops, owner: "browser-test" });
/** A term the CLI holds: nobody renews it, so it counts down and expires. */
function cliAcquire(key, ttlMs, owner) {
  const out = execFileSync(bin, ["acquire", key, "--server", grpc, "--ttl-ms", String(ttlMs), "--owner", owner, "--json"], {
    env: { ...process.env, LEASEHOLD_TOKEN: TOKENS.ops },
  });
  return JSON.parse(out.toString()).lease;
}

let browser;
const started = Date.now();
const step = (what) => console.log(`-- ${what} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
try {
  browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });

  /** A signed-in page as `who`, at a viewport. */
  async function signedIn(who, viewport = { width: 1280, height: 800 }, scheme = "light") {
    const context = await browser.newContext({ viewport, colorScheme: scheme });
    const page = await context.newPage();
    page.on("pageerror", (err) => { throw err; });
    await page.goto(consoleUrl + "/#/keys");
    await page.fill("#token", TOKENS[who]);
    await page.click("#login button[type=submit]");
    await page.waitForSelector("table#keys");
    return page;
  }
  const row = (page, key) => page.locator(`tr[data-key="${key}"]`);

  // Leases before the page opens.
  await client.acquire("b:secret", { ttlMs: 60000 });
  await (await client.acquire("a:history", { ttlMs: 10000 })).release();
  const held = cliAcquire("a:alpha", 60000, "worker-7");

  step("keys list shows a lease and counts it down");
  const ops = await signedIn("ops");
  await row(ops, "a:alpha").waitFor();
  const seconds = async () => parseFloat(await row(ops, "a:alpha").locator(".countdown").innerText());
  const first = await seconds();
  await ops.waitForTimeout(2200);
  const later = await seconds();
  assert.ok(later < first, `countdown ${first} -> ${later}`);
  assert.equal(await row(ops, "a:alpha").locator("td").nth(2).innerText(), "worker-7");

  step("a release, an expiry and a quarantine appear without a reload");
  await ops.evaluate(() => { window.__notReloaded = true; });
  const released = await client.acquire("a:released", { ttlMs: 10000 });
  await row(ops, "a:released").locator(".badge.live").waitFor();
  await released.release();
  await row(ops, "a:released").locator(".badge.free").waitFor();
  await row(ops, "a:released").locator(".badge.released").waitFor();
  cliAcquire("a:expiring", 1200, "worker-lost");
  await row(ops, "a:expiring").locator(".badge.live").waitFor();
  await row(ops, "a:expiring").locator(".badge.expired").waitFor({ timeout: 8000 });
  const quarantined = await client.acquire("a:quarantine", { ttlMs: 10000, maxRecoveries: 1 });
  await row(ops, "a:quarantine").locator(".badge.live").waitFor();
  await quarantined.suspend();
  await row(ops, "a:quarantine").locator(".badge.quarantined").waitFor();
  assert.equal(await ops.evaluate(() => window.__notReloaded), true, "the page was not reloaded");

  step("key page shows history and an unsettled tool call");
  const tools = await client.acquire("a:history", { ttlMs: 10000 });
  let running = tools.runToolCalls(
    [{ callId: "call-done", name: "search" }, { callId: "call-hung", name: "send_email" }],
    async ({ call, signal }) => {
      if (call.callId === "call-done") return "ok";
      await new Promise((done) => signal.addEventListener("abort", done));
      return "aborted";
    },
  ).catch(() => {});
  await ops.goto(consoleUrl + "/#/key/" + encodeURIComponent("a:history"));
  await ops.locator("#history li").first().waitFor();
  assert.match(await ops.locator("#history").innerText(), /released/);
  await ops.locator("#calls tr.unsettled", { hasText: "call-hung" }).waitFor();
  await ops.locator("#calls tr", { hasText: "call-done" }).locator(".badge.succeeded").waitFor();
  assert.equal(await ops.locator("#calls tr.unsettled").count(), 1);
  await ops.locator("#force-release").waitFor();

  step("screenshots");
  mkdirSync(shots, { recursive: true });
  const shoot = async (page, name) => {
    await page.waitForTimeout(300);
    await page.screenshot({ path: join(shots, name + ".png"), fullPage: false });
  };
  await shoot(ops, "key-desktop");
  await ops.goto(consoleUrl + "/#/keys");
  await row(ops, "a:alpha").waitFor();
  await shoot(ops, "keys-desktop");
  await ops.goto(consoleUrl + "/#/activity");
  await ops.locator("#health dd").first().waitFor();
  // Some activity for the graph and the event list.
  for (let i = 0; i < 4; i++) await (await client.acquire(`a:burst-${i}`, { ttlMs: 5000 })).release();
  await ops.locator("#activity-events li").nth(7).waitFor();
  await shoot(ops, "activity-desktop");
  const narrow = await signedIn("ops", { width: 390, height: 844 }, "dark");
  await row(narrow, "a:alpha").waitFor();
  await shoot(narrow, "keys-narrow");
  await narrow.goto(consoleUrl + "/#/key/" + encodeURIComponent("a:history"));
  await narrow.locator("#calls tr.unsettled").waitFor();
  await shoot(narrow, "key-narrow");
  await narrow.goto(consoleUrl + "/#/activity");
  await narrow.locator("#health dd").first().waitFor();
  await (await client.acquire("a:burst-narrow", { ttlMs: 5000 })).release();
  await narrow.locator("#activity-events li").nth(1).waitFor();
  await shoot(narrow, "activity-narrow");

  step("an admin's force-release, confirmed by fence");
  await ops.goto(consoleUrl + "/#/key/" + encodeURIComponent("a:alpha"));
  const dialog = new Promise((done) => ops.once("dialog", async (d) => { done(d.message()); await d.accept(); }));
  await ops.click("#force-release");
  assert.match(await dialog, new RegExp(`fence ${held.fence}\\b`));
  await ops.locator("#live .badge.recoverable").waitFor();
  await ops.locator("#key-events li .badge.suspended").waitFor();

  step("a viewer without admin sees no admin action, and a forged one is refused");
  const viewer = await signedIn("viewer");
  await row(viewer, "b:secret").waitFor();
  await viewer.goto(consoleUrl + "/#/key/" + encodeURIComponent("b:secret"));
  await viewer.locator("#live .badge.live").waitFor();
  assert.equal(await viewer.locator("#force-release, #unquarantine").count(), 0);
  await viewer.goto(consoleUrl + "/#/key/" + encodeURIComponent("a:quarantine"));
  await viewer.locator("#live .badge.quarantined").waitFor();
  assert.equal(await viewer.locator("#unquarantine").count(), 0);
  const forged = await viewer.evaluate(async ([token]) => {
    const json = await fetch("/api/unquarantine", {
      method: "POST",
      headers: { Authorization: "Bearer " + token, "Content-Type": "application/json" },
      body: JSON.stringify({ key: "a:quarantine" }),
    });
    const form = await fetch("/api/unquarantine", {
      method: "POST",
      headers: { Authorization: "Bearer " + token, "Content-Type": "application/x-www-form-urlencoded" },
      body: "key=a%3Aquarantine",
    });
    return [json.status, form.status];
  }, [TOKENS.viewer]);
  assert.deepEqual(forged, [403, 415]);
  // The admin's button works.
  await ops.goto(consoleUrl + "/#/key/" + encodeURIComponent("a:quarantine"));
  await ops.click("#unquarantine");
  await ops.locator("#live .badge.recoverable").waitFor();

  step("a token scoped to a: never sees a b: key");
  const tenant = await signedIn("tenantA");
  await row(tenant, "a:alpha").waitFor();
  await client.acquire("b:during", { ttlMs: 10000 });
  const marker = await client.acquire("a:during", { ttlMs: 10000 });
  await row(tenant, "a:during").waitFor();
  assert.doesNotMatch(await tenant.locator("body").innerText(), /\bb:/);
  await tenant.goto(consoleUrl + "/#/activity");
  await tenant.locator("#health dd").first().waitFor();
  await client.acquire("b:activity", { ttlMs: 10000 });
  await marker.release();
  await tenant.locator("#activity-events li", { hasText: "a:during" }).waitFor();
  assert.doesNotMatch(await tenant.locator("body").innerText(), /\bb:/);
  await tenant.goto(consoleUrl + "/#/key/" + encodeURIComponent("b:secret"));
  await tenant.locator("#key-error", { hasText: /PERMISSION|not allowed|tenant-a/i }).waitFor();
  assert.doesNotMatch(await tenant.locator("#live").innerText(), /holder|fence/i);

  await tools.release().catch(() => {});
  await running;
  step("done");
} finally {
  if (browser) await browser.close();
  await client.close?.();
  server.kill("SIGTERM");
  rmSync(dir, { recursive: true, force: true });
}
