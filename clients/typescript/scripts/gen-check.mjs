// Fails when the committed generated code (src/gen) differs from a fresh
// generation from ../../proto with the pinned generator.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";

const here = new URL("..", import.meta.url).pathname;
const fresh = mkdtempSync(join(tmpdir(), "leasehold-gen-"));

function files(dir) {
  const out = [];
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) out.push(...files(path));
    else out.push(path);
  }
  return out;
}

try {
  execFileSync(
    join(here, "node_modules", ".bin", "buf"),
    ["generate", "../../proto", "--template", "buf.gen.yaml", "-o", fresh],
    {
      cwd: here,
      stdio: "inherit",
      env: { ...process.env, PATH: `${join(here, "node_modules", ".bin")}:${process.env.PATH ?? ""}` },
    },
  );
  const committedDir = join(here, "src", "gen");
  const freshDir = join(fresh, "src", "gen");
  const committed = files(committedDir).map((p) => relative(committedDir, p)).sort();
  const generated = files(freshDir).map((p) => relative(freshDir, p)).sort();
  const problems = [];
  for (const name of generated) {
    if (!committed.includes(name)) problems.push(`missing from src/gen: ${name}`);
    else if (!readFileSync(join(committedDir, name)).equals(readFileSync(join(freshDir, name))))
      problems.push(`out of date: src/gen/${name}`);
  }
  for (const name of committed) {
    if (!generated.includes(name)) problems.push(`not generated any more: src/gen/${name}`);
  }
  if (problems.length > 0) {
    console.error(`generated code is out of date with the proto; run \`npm run gen\`:\n  ${problems.join("\n  ")}`);
    process.exitCode = 1;
  } else {
    console.log(`gen:check: src/gen matches the proto (${generated.length} file(s))`);
  }
} finally {
  rmSync(fresh, { recursive: true, force: true });
}
