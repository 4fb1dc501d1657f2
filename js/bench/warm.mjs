// A warm protected call (start + report, one success dispatched, a new operation key each call)
// through the npm package, on the memory and SQLite ledgers (full, intent-only, normal): the median of sample batches.
//   node bench/warm.mjs [--dir DIR]   (after npm run build; DIR holds the SQLite file, default js/target-bench)
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { Once, sent } from "../dist/index.js";

const dirArg = process.argv.indexOf("--dir");
const dir = dirArg > 0 ? process.argv[dirArg + 1] : new URL("../target-bench/", import.meta.url).pathname;
mkdirSync(dir, { recursive: true });

const send = async () => sent.successJson('{"refund_id":"r-1"}');

async function measure(name, once, samples, perSample) {
  let n = 0;
  const call = () => once.call({ scope: "bench", key: `k-${n++}`, tool: "refund_order", args: { order_id: n, amount: 200 }, send });
  for (let i = 0; i < perSample; i++) await call(); // warm-up
  const perCall = [];
  for (let s = 0; s < samples; s++) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < perSample; i++) {
      const c = await call();
      if (c.account.ending.tag !== "confirmed") throw new Error(`${name}: ${c.account.ending.tag}`);
    }
    perCall.push(Number(process.hrtime.bigint() - t0) / 1000 / perSample);
  }
  perCall.sort((a, b) => a - b);
  const median = perCall[Math.floor(perCall.length / 2)];
  console.log(`${name.padEnd(22)} ${median.toFixed(2).padStart(9)} µs/call  ${Math.round(1e6 / median).toLocaleString("en-US").padStart(7)}/s  (median of ${samples} × ${perSample}; min ${perCall[0].toFixed(2)}, max ${perCall.at(-1).toFixed(2)})`);
  return median;
}

console.log(`node ${process.version}`);
const memory = await Once.memory();
await measure("memory", memory, 15, 400);
await memory.close();
for (const synchronous of ["full", "intent-only", "normal"]) {
  const file = join(dir, `warm-${synchronous}.db`);
  rmSync(file, { force: true });
  const o = await Once.sqlite(file, { synchronous });
  await measure(`sqlite (${synchronous})`, o, 15, 100);
  await o.close();
  rmSync(file, { force: true });
  rmSync(`${file}-wal`, { force: true });
  rmSync(`${file}-shm`, { force: true });
}
