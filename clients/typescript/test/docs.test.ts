// The TypeScript in the docs against the package as it is: the blocks of
// docs/client.md are type-checked whole; in every other page (README.md,
// docs/*.md, this package's README, the examples' READMEs, whose blocks are
// fragments) each name imported from @leasehold/client must be one the
// package exports. A renamed or removed export, or an example written
// against names the package never had, fails here.

import assert from "node:assert/strict";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";

import ts from "typescript";

/** clients/typescript (this file runs from dist-test/test). */
const PKG = fileURLToPath(new URL("../../", import.meta.url));
const ROOT = join(PKG, "../..");

/** Pages whose blocks are type-checked whole: each block a module of its own. */
const WHOLE: readonly string[] = ["docs/client.md"];

interface Block {
  /** The page, relative to the repository. */
  readonly page: string;
  /** The line of the block's first line of code in the page (1-based). */
  readonly line: number;
  readonly code: string;
}

/** The ```ts / ```typescript blocks of a page, their indentation removed. */
function blocks(page: string): Block[] {
  const lines = readFileSync(join(ROOT, page), "utf8").split("\n");
  const found: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)```(ts|typescript)\s*$/.exec(lines[i] ?? "");
    if (open === null) continue;
    const indent = open[1]?.length ?? 0;
    const body: string[] = [];
    let j = i + 1;
    for (; j < lines.length && !/^\s*```\s*$/.test(lines[j] ?? ""); j++) body.push((lines[j] ?? "").slice(indent));
    found.push({ page, line: i + 2, code: body.join("\n") });
    i = j;
  }
  return found;
}

function pages(): string[] {
  const out = ["README.md", "clients/typescript/README.md"];
  for (const name of readdirSync(join(ROOT, "docs"))) if (name.endsWith(".md")) out.push(`docs/${name}`);
  for (const dir of ["examples", "clients/typescript/examples"]) {
    for (const name of readdirSync(join(ROOT, dir))) {
      if (existsSync(join(ROOT, dir, name, "README.md"))) out.push(`${dir}/${name}/README.md`);
    }
  }
  return out;
}

/** Type-checks `sources` (virtual modules in this package) against src/; returns one line per error. */
function typecheck(sources: Map<string, Block & { text: string }>): string[] {
  const config = ts.readConfigFile(join(PKG, "tsconfig.json"), (p) => ts.sys.readFile(p));
  const parsed = ts.parseJsonConfigFileContent(config.config, ts.sys, PKG);
  const options: ts.CompilerOptions = {
    ...parsed.options,
    noEmit: true,
    declaration: false,
    sourceMap: false,
    rootDir: undefined,
    // An example may leave a name unused; that is no error in a doc.
    noUnusedLocals: false,
    noUnusedParameters: false,
    // The package by its own name, from its sources (no build needed).
    paths: { "@leasehold/client": [join(PKG, "src/index.ts")], "@leasehold/client/*": [join(PKG, "src/*.ts")] },
  };
  const host = ts.createCompilerHost(options);
  const { fileExists, readFile, getSourceFile } = host;
  host.fileExists = (f) => sources.has(f) || fileExists.call(host, f);
  host.readFile = (f) => sources.get(f)?.text ?? readFile.call(host, f);
  host.getSourceFile = (f, language, ...rest) => {
    const virtual = sources.get(f);
    return virtual !== undefined ? ts.createSourceFile(f, virtual.text, language) : getSourceFile.call(host, f, language, ...rest);
  };
  const program = ts.createProgram([...sources.keys()], options, host);
  const errors: string[] = [];
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const block = d.file === undefined ? undefined : sources.get(d.file.fileName);
    if (d.file !== undefined && block === undefined) continue; // the package's own errors are tsc's to report
    const at = d.file !== undefined && d.start !== undefined ? d.file.getLineAndCharacterOfPosition(d.start).line : 0;
    const where = block === undefined ? "" : `${block.page}:${block.line + at}: `;
    errors.push(`${where}${ts.flattenDiagnosticMessageText(d.messageText, "\n")}`);
  }
  return errors;
}

/**
 * The import declarations of `code` that name this package, each on its own
 * lines and every other line blank (so an error names the page's line); or
 * undefined when there are none.
 */
function packageImports(code: string): string | undefined {
  const file = ts.createSourceFile("block.ts", code, ts.ScriptTarget.ES2022, true);
  const lines = code.split("\n").map(() => "");
  let any = false;
  for (const s of file.statements) {
    if (!ts.isImportDeclaration(s) || !ts.isStringLiteral(s.moduleSpecifier)) continue;
    if (!/^@leasehold\/client(\/|$)/.test(s.moduleSpecifier.text)) continue;
    const first = file.getLineAndCharacterOfPosition(s.getStart(file)).line;
    s.getText(file)
      .split("\n")
      .forEach((line, k) => {
        lines[first + k] = line;
      });
    any = true;
  }
  return any ? `${lines.join("\n")}\nexport {};\n` : undefined;
}

describe("docs: the TypeScript examples", () => {
  it("docs/client.md's blocks type-check, and every name another page imports from the package is exported", () => {
    // One program for both (loading the frameworks' types is most of the time).
    const sources = new Map<string, Block & { text: string }>();
    let whole = 0;
    for (const page of pages()) {
      for (const block of blocks(page)) {
        const text = WHOLE.includes(page) ? block.code : packageImports(block.code);
        if (text === undefined) continue;
        if (WHOLE.includes(page)) whole += 1;
        sources.set(join(PKG, "docs-check", `${page.replace(/\W/g, "_")}_${block.line}.ts`), { ...block, text });
      }
    }
    assert.ok(whole >= 1, "docs/client.md has a TypeScript block");
    assert.ok(sources.size - whole >= 5, `found the pages' imports (${[...new Set([...sources.values()].map((s) => s.page))].join(", ")})`);
    assert.deepEqual(typecheck(sources), []);
  });
});
