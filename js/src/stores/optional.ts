// The native modules behind the SQLite and PostgreSQL ledgers, loaded when such a ledger is opened and not
// when the package is imported: `Once.memory()` needs neither, and `pg` is an optional peer dependency that
// only a PostgreSQL ledger needs. Both packages are CommonJS, so a synchronous require serves the worker's
// synchronous SQLite open as well as the main thread's PostgreSQL one.
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);

/**
 * The package `name`, required for `ledger`; a missing package is an Error that names it and says how to
 * install it. Any other failure to load it (a native module built for another Node) is passed on as it is.
 */
export function loadOptional<T>(name: string, ledger: string): T {
  try {
    return require(name) as T;
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    // Only the package itself being absent: a module missing inside it is its own broken install.
    if (err?.code === "MODULE_NOT_FOUND" && String(err.message).startsWith(`Cannot find module '${name}'`)) {
      throw new Error(`${ledger} needs the package ${name}, which is not installed: npm install ${name}`);
    }
    throw e;
  }
}
