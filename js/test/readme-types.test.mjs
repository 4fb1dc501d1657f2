// The documentation's TypeScript: every ```ts block of the files tests/docs/check.py holds to tested
// examples (the repository's README.md, python/README.md, js/README.md and every page of the guide, docs/)
// is compiled by the pinned tsc under `strict` against the built package's types (dist/, reached by the
// package's own name and exports), once per AI SDK major (a block's `from "ai"` read as each
// devDependency alias), so a signature that makes a user's strict build fail fails here first.
// Also: the `ai` peer range covers every major the adapter is tested on.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import semver from "semver";

const HERE = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const REPO = join(HERE, "..");
/** tests/docs/check.py's EXAMPLE_GLOBS: README.md, python/README.md, js/README.md and every .md under docs/. */
const READMES = [
  join(REPO, "README.md"),
  join(REPO, "python", "README.md"),
  join(HERE, "README.md"),
  ...readdirSync(join(REPO, "docs"), { recursive: true })
    .filter((f) => f.endsWith(".md"))
    .sort()
    .map((f) => join(REPO, "docs", f)),
];
/** The AI SDK majors the adapter is tested on: the devDependency aliases of `ai`. */
const AI_PACKAGES = ["ai", "ai6", "ai7"];

/** The ```ts blocks of a Markdown file, with the line each starts at. */
function tsBlocks(file) {
  const blocks = [];
  const lines = readFileSync(file, "utf8").split("\n");
  for (let i = 0; i < lines.length; i++) {
    if (lines[i].trim() !== "```ts") continue;
    const start = i + 1;
    let j = start;
    while (j < lines.length && lines[j].trim() !== "```") j++;
    blocks.push({ file, line: start + 1, text: lines.slice(start, j).join("\n") });
    i = j;
  }
  return blocks;
}

/**
 * Compile `blocks` in a temporary directory inside the package (so `once-exactly` resolves to it by
 * its name, and `ai`, `zod`, `@openai/agents` to its node_modules) with `strict` on; the diagnostics, or "".
 */
function compile(blocks, aiPackage) {
  const dir = mkdtempSync(join(HERE, ".readme-types-"));
  try {
    const files = blocks.map((b, i) => {
      const name = `block-${i}.ts`;
      const text = b.text.replaceAll('from "ai"', `from "${aiPackage}"`);
      writeFileSync(join(dir, name), `// ${b.file}:${b.line}\n${text}\n`);
      return name;
    });
    writeFileSync(
      join(dir, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          strict: true,
          noEmit: true,
          target: "ES2022",
          module: "NodeNext",
          moduleResolution: "NodeNext",
          types: ["node"],
          // The frameworks' own declarations are not what is checked here (ai 7's need a newer lib).
          skipLibCheck: true,
        },
        files,
      }),
    );
    try {
      execFileSync(process.execPath, [join(HERE, "node_modules", "typescript", "bin", "tsc"), "-p", dir], { encoding: "utf8" });
      return "";
    } catch (e) {
      // Name each diagnostic's block by the README line it came from.
      return String(e.stdout).replace(/\S*block-(\d+)\.ts\((\d+),(\d+)\)/g, (_, i, l, c) => {
        const b = blocks[Number(i)];
        return `${b.file}:${b.line + Number(l) - 2}:${c}`;
      });
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const blocks = READMES.flatMap(tsBlocks);

test("the READMEs hold TypeScript blocks for the quick start and both adapters", () => {
  const all = blocks.map((b) => b.text).join("\n");
  assert.ok(blocks.length >= 3, `${blocks.length} ts blocks`);
  for (const used of ["once.protect(", "protectTool(", "protectedTool(", "deriveKeyFrom"]) assert.ok(all.includes(used), used);
});

for (const aiPackage of AI_PACKAGES) {
  test(`the READMEs' ts blocks compile under tsc --strict (ai from ${aiPackage})`, { timeout: 120_000 }, () => {
    assert.equal(compile(blocks, aiPackage), "");
  });
}

test("a key function on an untyped input fails a strict build: the tests above would see a wrong signature", { timeout: 120_000 }, () => {
  const wrong = { file: "inline", line: 1, text: 'import { Once } from "once-exactly";\nconst once = await Once.memory();\nonce.protect("t", async (a) => a, { key: (a) => a.order_id });\n' };
  assert.match(compile([wrong], "ai"), /TS7006|TS18046|TS2339/);
});

test("the ai peer range covers every AI SDK major the adapter is tested on", () => {
  const pkg = JSON.parse(readFileSync(join(HERE, "package.json"), "utf8"));
  const range = pkg.peerDependencies.ai;
  const majors = new Set();
  for (const name of AI_PACKAGES) {
    const { version } = JSON.parse(readFileSync(join(HERE, "node_modules", name, "package.json"), "utf8"));
    assert.ok(semver.satisfies(version, range), `ai ${version} (${name}) is outside the peer range ${range}`);
    majors.add(semver.major(version));
  }
  assert.deepEqual([...majors].sort(), [5, 6, 7]);
});
