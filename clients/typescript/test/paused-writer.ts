// A fence-worker.js child, driven line by line: the earlier owner that the
// paused-writer tests stop inside its fenced write.

import { type ChildProcess, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

const WORKER = fileURLToPath(new URL("./fence-worker.js", import.meta.url));

export class PausedWriter {
  readonly child: ChildProcess;
  #out = "";
  #waiters: Array<() => void> = [];

  constructor(args: string[]) {
    this.child = spawn(process.execPath, [WORKER, ...args], { stdio: ["pipe", "pipe", "inherit"] });
    this.child.stdout?.setEncoding("utf8");
    this.child.stdout?.on("data", (chunk: string) => {
      this.#out += chunk;
      for (const w of this.#waiters.splice(0)) w();
    });
    this.child.on("exit", () => {
      for (const w of this.#waiters.splice(0)) w();
    });
  }

  /** The first line matching `pattern`, waiting at most `ms`. */
  async line(pattern: RegExp, ms = 20_000): Promise<string> {
    const deadline = Date.now() + ms;
    for (;;) {
      const found = this.#out.split("\n").find((l) => pattern.test(l));
      if (found !== undefined) return found;
      if (this.child.exitCode !== null || Date.now() > deadline) {
        throw new Error(`worker: no line matching ${pattern} (output: ${JSON.stringify(this.#out)})`);
      }
      await new Promise<void>((resolve) => {
        this.#waiters.push(resolve);
        setTimeout(resolve, 200);
      });
    }
  }

  stop(): void {
    this.child.kill("SIGSTOP");
  }

  /** Continues the process and lets its write go on. */
  resume(): void {
    this.child.kill("SIGCONT");
    this.child.stdin?.write("go\n");
  }

  kill(): void {
    if (this.child.exitCode === null) {
      this.child.kill("SIGCONT");
      this.child.kill("SIGKILL");
    }
  }
}
