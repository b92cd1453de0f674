#!/usr/bin/env node
// The `leasehold` command of the npm package: finds the server binary that
// npm installed for this platform (an optional dependency, as esbuild and
// biome ship theirs) and runs it with this process's arguments, stdio and
// exit status. LEASEHOLD_BINARY overrides the path.
"use strict";

const { spawn } = require("node:child_process");
const { existsSync } = require("node:fs");

/** npm's name for the platform package of this machine, or undefined. */
function platformPackage() {
  const { platform, arch } = process;
  if (platform === "linux" && arch === "x64") {
    // glibc or musl: only glibc is built today.
    const glibc = typeof process.report?.getReport === "function" && process.report.getReport().header.glibcVersionRuntime;
    return glibc ? "@leasehold/server-linux-x64-gnu" : undefined;
  }
  return undefined;
}

function binary() {
  const override = process.env.LEASEHOLD_BINARY;
  if (override) {
    if (!existsSync(override)) fail(`LEASEHOLD_BINARY=${override} does not exist`);
    return override;
  }
  const pkg = platformPackage();
  const where = `${process.platform}-${process.arch}${process.platform === "linux" && pkg === undefined ? " (musl)" : ""}`;
  if (pkg === undefined) {
    fail(
      `no leasehold server binary is published for ${where}.\n` +
        "Build one from source (cargo build --release, https://github.com/leasehold) and set LEASEHOLD_BINARY to it.",
    );
  }
  try {
    return require.resolve(`${pkg}/bin/leasehold`);
  } catch {
    fail(
      `the platform package ${pkg} is not installed (npm skips optional dependencies with --omit=optional or --no-optional).\n` +
        `Install it (npm install ${pkg}) or set LEASEHOLD_BINARY to a leasehold binary.`,
    );
  }
}

function fail(message) {
  process.stderr.write(`leasehold: ${message}\n`);
  process.exit(1);
}

const child = spawn(binary(), process.argv.slice(2), { stdio: "inherit" });
// The server drains on SIGTERM and SIGINT: pass them on, exit as it exits.
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(signal, () => child.kill(signal));
}
child.on("error", (err) => fail(`could not run ${err.path ?? "the server"}: ${err.message}`));
child.on("exit", (code, signal) => {
  if (signal) process.kill(process.pid, signal);
  else process.exit(code ?? 1);
});
