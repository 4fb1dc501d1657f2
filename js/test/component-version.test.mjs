// The package hosts the component of one WIT version (WIT_VERSION): a transpiled component of another
// version (a stale gen/) is refused when an instance is made, before any call, with an error that
// names both. Before, the exports were taken by their unversioned names and a 0.3.0 component ran.
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { WIT_VERSION, loadComponent } from "../dist/component.js";
import { tempDir } from "./helpers.mjs";

/** A stand-in for jco's once.js whose exports carry `version` (as jco's do: bare and versioned names). */
function standIn(t, version) {
  const dir = tempDir(t);
  // `protocol`'s JSON start is not taken: the package drives calls with `driver`'s typed one.
  const ifaces = { engine: "engineExport", protocol: "sweep, start", transitions: "transitionsExport", driver: "start" };
  const entries = Object.entries(ifaces).flatMap(([i, fns]) => {
    const body = `{ ${fns.split(", ").map((f) => `${f}() { return "${i}"; }`).join(", ")} }`;
    return [`${i}: ${body}`, `"once:core/${i}@${version}": ${body}`];
  });
  writeFileSync(join(dir, "once.js"), `export function instantiate() { return { ${entries.join(", ")} }; }\n`);
  return dir;
}

test("a component of this package's WIT version is taken, by its versioned export names", async (t) => {
  const instantiate = await loadComponent(standIn(t, WIT_VERSION));
  const x = instantiate({});
  assert.equal(x.engineExport(), "engine");
  assert.equal(x.sweep(), "protocol");
  assert.equal(x.transitionsExport(), "transitions");
  assert.equal(x.start(), "driver");
});

test("a component of another WIT version is refused before any call, naming both versions", async (t) => {
  const instantiate = await loadComponent(standIn(t, "0.3.0"));
  assert.throws(() => instantiate({}), (e) => {
    assert.match(e.message, new RegExp(`exports no once:core/engine@${WIT_VERSION.replaceAll(".", "\\.")}`));
    assert.match(e.message, /once:core\/engine@0\.3\.0/);
    assert.match(e.message, /npm run build/);
    return true;
  });
});
