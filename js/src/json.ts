// JavaScript values as JSON text. Args (toJson) are refused for what JSON.stringify would
// silently change (undefined, functions, NaN, Infinity become null or vanish; a bigint throws):
// they bind the payload. A receipt (receiptText) is never refused: the effect already happened.
import { inspect } from "node:util";
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

const typeName = (v: unknown): string =>
  typeof v !== "object" ? typeof v : v === null ? "null" : (Object.getPrototypeOf(v)?.constructor?.name ?? "Object");

/**
 * A success's response (a protected function's result) or a lookup's receipt as the JSON text
 * stored, returned and replayed. The effect happened, so no value is refused: the text is what
 * `JSON.stringify` writes (a Date as its ISO string, `toJSON` honoured, an `undefined`, function or
 * symbol field dropped, and `null` in an array, NaN and ±Infinity `null`), except that a bigint is
 * its decimal string (exact, where a number past 2^53 would not be) and `undefined` is `null`.
 * A value `JSON.stringify` writes nothing for (a function, a symbol) or throws on (a cycle, a
 * throwing `toJSON`) is `{"once_unserializable": {"type", "repr"}}` whole, `repr` as
 * `util.inspect` shows it.
 */
export function receiptText(v: unknown): string {
  if (v === undefined) return "null";
  try {
    const text = JSON.stringify(v, (_, x) => (typeof x === "bigint" ? x.toString() : x));
    if (text !== undefined) return text;
  } catch {
    // Written below as the stand-in: the effect is done whatever its result looks like.
  }
  return JSON.stringify({ once_unserializable: { type: typeName(v), repr: inspect(v, { breakLength: Infinity }) } });
}
