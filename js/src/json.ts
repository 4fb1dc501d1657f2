// JavaScript values as JSON text, refusing what JSON.stringify would silently
// change (undefined, functions, NaN, Infinity become null or vanish; a bigint throws).
import { InvalidArgumentsError } from "./errors.js";

/** A JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

const escape = (k: string) => k.replace(/~/g, "~0").replace(/\//g, "~1");

function check(v: unknown, pointer: string, what: string, seen: Set<object>): void {
  const at = pointer || "/";
  switch (typeof v) {
    case "string":
    case "boolean":
      return;
    case "number":
      if (!Number.isFinite(v)) throw new InvalidArgumentsError(`${what} at ${at}: ${v} is not a JSON number`, pointer);
      return;
    case "object":
      if (v === null) return;
      if (seen.has(v)) throw new InvalidArgumentsError(`${what} at ${at}: a cycle`, pointer);
      seen.add(v);
      if (Array.isArray(v)) v.forEach((x, i) => check(x, `${pointer}/${i}`, what, seen));
      else {
        const proto = Object.getPrototypeOf(v);
        if (proto !== Object.prototype && proto !== null) {
          throw new InvalidArgumentsError(`${what} at ${at}: a ${proto?.constructor?.name ?? "non-plain"} object is not JSON`, pointer);
        }
        for (const [k, x] of Object.entries(v)) check(x, `${pointer}/${escape(k)}`, what, seen);
      }
      seen.delete(v);
      return;
    default:
      throw new InvalidArgumentsError(`${what} at ${at}: a ${typeof v} is not JSON`, pointer);
  }
}

/** `v` as JSON text; an InvalidArgumentsError naming the pointer when it is not JSON. */
export function toJson(v: unknown, what = "args"): string {
  check(v, "", what, new Set());
  return JSON.stringify(v);
}
