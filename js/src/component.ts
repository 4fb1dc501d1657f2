// The transpiled component (gen/, by `npm run build`): its instances, and the
// imports they are handed. The engine worker hosts one instance at a time; the
// tests instantiate it the same way.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

/** The WIT package of the component this package hosts (wit/once.wit). */
export const WIT_VERSION = "2.0.0";

/**
 * The exports of `engine`, `protocol`'s `sweep`, `transitions` and the typed `driver`, in one object.
 * `protocol`'s `start`, `report` and `resume` carry the same steps as JSON text, the encoding for hosts whose
 * typed crossings are slow (wasmtime-py); jco lifts the typed ones as fast, so this package uses `driver`'s.
 */
export type Exports = Record<string, (...a: unknown[]) => unknown>;

/** Makes a fresh instance of the component over the imports given (by interface name, `once:core/ledger`...). */
export type Instantiate = (imports: Record<string, object>) => Exports;

// Node has WebAssembly; the ES2022 lib does not declare it.
type CoreModule = object;
const Wasm = (globalThis as unknown as { WebAssembly: { Module: new (bytes: Uint8Array) => CoreModule } }).WebAssembly;

/** Load the component jco transpiled into `genDir` (its core modules compiled once). */
export async function loadComponent(genDir: string): Promise<Instantiate> {
  const modules = new Map<string, CoreModule>();
  const getCoreModule = (path: string) => {
    let m = modules.get(path);
    if (m === undefined) modules.set(path, (m = new Wasm.Module(readFileSync(join(genDir, path)))));
    return m;
  };
  const { instantiate } = (await import(pathToFileURL(join(genDir, "once.js")).href)) as {
    instantiate: (get: typeof getCoreModule, imports: unknown) => Record<string, Exports>;
  };
  return (ifaces) => {
    // jco's generated code looks interfaces up with their version too, depending on the release.
    const imports = Object.fromEntries(
      Object.entries(ifaces).flatMap(([name, iface]) => [[name, iface], [`${name}@${WIT_VERSION}`, iface]]),
    );
    const root = instantiate(getCoreModule, imports);
    // By their versioned names: a component of another version (a stale gen/) is refused here, at load.
    const exported = (iface: string): Exports => {
      const name = `once:core/${iface}@${WIT_VERSION}`;
      const found = root[name];
      if (found === undefined) {
        throw new Error(`the once component exports no ${name} (it exports ${Object.keys(root).filter((k) => k.includes("@")).join(", ") || "nothing versioned"}): rebuild the package (npm run build)`);
      }
      return found;
    };
    const engine = exported("engine");
    const { sweep } = exported("protocol");
    return { ...engine, sweep, ...exported("transitions"), ...exported("driver") };
  };
}
