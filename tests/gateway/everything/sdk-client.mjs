// The official TypeScript SDK clients, in the modes a user gets them, against `once gateway` with the
// README's config (examples/refund/once.toml) in front of `refund-mcp --mode unsafe`.
//
// Usage: node sdk-client.mjs ONCE_BIN REFUND_MCP WORKDIR CONFIG SDK TRANSPORT
//   SDK:       ts2        @modelcontextprotocol/client 2.4.0 as constructed without options (its default
//                         versionNegotiation mode, which 2.4.0 documents and ships as 'legacy': initialize)
//              ts2-auto   the same client with versionNegotiation { mode: 'auto' }: server/discover, 2026-07-28
//              ts2-legacy the same client with versionNegotiation { mode: 'legacy' } spelled out
//              ts1        @modelcontextprotocol/sdk 1.32.2 (the v1 SDK; initialize)
//   TRANSPORT: stdio (the gateway as the client's child) or http (`once gateway --listen`, Streamable HTTP)
//
// Scenarios, each with its own gateway and ledgers under WORKDIR (the caller counts the refunds in each
// WORKDIR/<scenario>/effects.db, the upstream's own table):
//   rows:    connect; tools/list; a DIRECT get_order; a protected refund_order with a key in _meta
//            (executed), the same call again (replayed, same refund_id), the same key with another amount
//            (conflict, nothing sent), a keyless call and its repeat (derived key, replayed), a call over
//            the quota (blocked, nothing sent). Two operations ran: two refunds.
//   unknown: the README's config with in_flight_wait = "0ms", refund-mcp under pre_effect_disconnect: the
//            call's answer is once's UNKNOWN; the same call again until once settled it (one refund).
//   retry-keyed, retry-derived (http only): the call is POSTed raw and its connection closed once the
//            upstream made the refund, before the answer (refund-mcp under late_reply holds it); then the SDK
//            sends it again with a new request id, on another connection: with the key in _meta, and with no
//            key (derived). One refund each, and the retry is that refund's replay.
// With mode 'auto' on stdio the v2 SDK probes server/discover on a sibling process started with the same
// command (a second gateway on the same ledgers, for the probe only), then starts the one it keeps.
// Every answer must be one the SDK accepted: a call that throws fails the script. Pinned versions are
// checked against node_modules (package-lock.json beside this file; `npm ci` installs them).

import { spawn } from "node:child_process";
import { openSync, readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { request } from "node:http";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
const PINNED = { "@modelcontextprotocol/client": "2.4.0", "@modelcontextprotocol/sdk": "1.32.2" };
const ORDER = 1234;
const TOOLS = ["find_refund_by_key", "get_order", "refund_order"];

const [onceBin, refundMcp, workdir, readmeConfig, sdk, transportKind] = process.argv.slice(2);
const SDKS = {
  ts2: { pkg: "@modelcontextprotocol/client", options: {}, era: "legacy" },
  "ts2-auto": { pkg: "@modelcontextprotocol/client", options: { versionNegotiation: { mode: "auto" } }, era: "modern" },
  "ts2-legacy": { pkg: "@modelcontextprotocol/client", options: { versionNegotiation: { mode: "legacy" } }, era: "legacy" },
  ts1: { pkg: "@modelcontextprotocol/sdk", options: {}, era: "legacy" },
};
const row = SDKS[sdk];
if (!refundMcp || !readmeConfig || !row || !["stdio", "http"].includes(transportKind)) {
  console.error(`usage: node sdk-client.mjs ONCE_BIN REFUND_MCP WORKDIR CONFIG ${Object.keys(SDKS).join("|")} stdio|http`);
  process.exit(2);
}
const label = `${sdk}, ${transportKind}`;

function check(cond, what) {
  if (!cond) throw new Error(`sdk client (${label}): ${what}`);
}

// The installed package must be the pinned one: a test of "2.4.0" that ran another version proves nothing.
const installed = JSON.parse(readFileSync(join(here, "node_modules", row.pkg, "package.json"), "utf8")).version;
check(installed === PINNED[row.pkg], `${row.pkg} ${installed} installed, the test pins ${PINNED[row.pkg]}`);

const v2 = row.pkg === "@modelcontextprotocol/client";
const sdkModule = v2
  ? {
      ...(await import("@modelcontextprotocol/client")),
      ...(await import("@modelcontextprotocol/client/stdio")),
    }
  : {
      ...(await import("@modelcontextprotocol/sdk/client/index.js")),
      ...(await import("@modelcontextprotocol/sdk/client/stdio.js")),
      ...(await import("@modelcontextprotocol/sdk/client/streamableHttp.js")),
    };
const { Client, StdioClientTransport, StreamableHTTPClientTransport } = sdkModule;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const text = (result) => (result.content ?? []).find((c) => c.type === "text")?.text ?? "";
const outcome = (result) => result._meta?.["once/outcome"] ?? {};
const show = (result) => JSON.stringify(result);

/** `once gateway` arguments in front of refund-mcp on `work`'s ledgers. */
function gatewayArgs(work, config, fault, extra = []) {
  return [
    "--config", config, "--db", join(work, "once.db"), "--",
    refundMcp, "--db", join(work, "effects.db"), "--mode", "unsafe", "--fault", fault, ...extra,
  ];
}

// A listening gateway outlives this script unless stopped: a scenario that failed before its stop leaves
// its gateway here, and the exit ends it.
const listening = new Set();
process.on("exit", () => listening.forEach((child) => child.kill("SIGKILL")));

/** `once gateway --listen 127.0.0.1:0`: its URL from the first stdout line, its stderr in `work`/gateway.log. */
function listen(work, args) {
  return new Promise((resolve, reject) => {
    const child = spawn(onceBin, ["gateway", "--listen", "127.0.0.1:0", ...args], {
      stdio: ["ignore", "pipe", openSync(join(work, "gateway.log"), "w")],
    });
    listening.add(child);
    child.once("exit", () => listening.delete(child));
    let out = "";
    const timer = setTimeout(() => reject(new Error(`the gateway did not start: ${out}`)), 30000);
    child.stdout.on("data", (d) => {
      out += String(d);
      const found = out.match(/^once gateway: listening on (http:\/\/\S+)/);
      if (found) {
        clearTimeout(timer);
        resolve({ child, url: found[1] });
      }
    });
    child.once("exit", (code) => reject(new Error(`the gateway exited (${code}): ${out}`)));
  });
}

async function stop(child) {
  const exited = new Promise((resolve) => child.once("exit", (code) => resolve(code)));
  child.kill("SIGTERM");
  check((await exited) === 0, `the gateway did not exit cleanly after SIGTERM (${readLog(child.work)})`);
}

function readLog(work) {
  try {
    return readFileSync(join(work, "gateway.log"), "utf8");
  } catch {
    return "";
  }
}

/** A gateway for one scenario and a way to connect the row's client to it: stdio starts one per client. */
async function gateway(name, { config = readmeConfig, fault = "none", extra = [] } = {}) {
  const work = join(workdir, name);
  mkdirSync(work, { recursive: true });
  const args = gatewayArgs(work, config, fault, extra);
  if (transportKind === "stdio") {
    const connect = () =>
      connectWith(
        new StdioClientTransport({ command: onceBin, args: ["gateway", ...args], stderr: openSync(join(work, "gateway.log"), "a") }),
      );
    return { work, connect, stop: async () => {} };
  }
  const { child, url } = await listen(work, args);
  child.work = work;
  return { work, url, connect: () => connectWith(new StreamableHTTPClientTransport(new URL(url))), stop: () => stop(child) };
}

/** Connect the row's client (discover or initialize, as its mode does) and check what was negotiated. */
async function connectWith(transport) {
  const client = new Client({ name: `once-sdk-${sdk}`, version: "1.0.0" }, row.options);
  await client.connect(transport);
  if (v2) {
    check(client.getProtocolEra() === row.era, `negotiated the ${client.getProtocolEra()} era, expected ${row.era}`);
    const version = row.era === "modern" ? "2026-07-28" : "2025-11-25";
    check(client.getNegotiatedProtocolVersion() === version, `version ${client.getNegotiatedProtocolVersion()}, expected ${version}`);
    if (row.era === "modern") {
      check(client.getDiscoverResult()?.supportedVersions?.includes("2026-07-28"), "server/discover not answered");
    }
  }
  // initialize's serverInfo, or (2026-07-28) the discover result's `_meta` serverInfo.
  check(client.getServerVersion()?.name === "once-gateway", `server ${JSON.stringify(client.getServerVersion())}`);
  return client;
}

/** A result to a client on a revision before 2026-07-28 carries nothing that revision does not know. */
function ofItsRevision(result, step) {
  // The v1 SDK keeps a result's unknown fields (a loose schema), so a leaked field shows here; v2 drops
  // resultType itself on a legacy connection, which makes this check a no-op for it.
  if (row.era === "legacy") check(!("resultType" in result), `${step}: resultType sent to a ${row.era} client: ${show(result)}`);
  return result;
}

/** refund_order on the order, with `key` in `_meta` (or none); a result the SDK rejects fails naming `step`. */
async function refund(client, amount, key, step) {
  let result;
  try {
    result = await client.callTool({ name: "refund_order", arguments: { order_id: ORDER, amount }, ...(key ? { _meta: { "once/key": key } } : {}) });
  } catch (e) {
    e.message = `${step}: the SDK did not accept the answer: ${e.message}`;
    throw e;
  }
  return ofItsRevision(result, step);
}

async function refunded(client) {
  const order = ofItsRevision(await client.callTool({ name: "get_order", arguments: { order_id: ORDER } }), "get_order");
  check(!order.isError, `get_order failed: ${show(order)}`);
  return order.structuredContent.refunded;
}

async function rows() {
  const gw = await gateway("rows");
  const client = await gw.connect();
  try {
    const { tools } = await client.listTools();
    check(JSON.stringify(tools.map((t) => t.name).sort()) === JSON.stringify(TOOLS), `tools ${tools.map((t) => t.name)}`);
    const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
    check(byName.get_order.annotations?.readOnlyHint === true, "get_order lost readOnlyHint");
    check(byName.refund_order.annotations?.destructiveHint === true, "refund_order lost destructiveHint");

    // DIRECT: the upstream's own answer, nothing recorded.
    check((await refunded(client)) === 0, "the order starts unrefunded");

    const key = `ts-${sdk}-${transportKind}`;
    const first = await refund(client, 100, key, "the keyed call");
    check(!first.isError && outcome(first).decision === "executed", `first call: ${show(first)}`);
    check(first.structuredContent?.amount === 100, `receipt ${show(first)}`);
    const refundId = first.structuredContent.refund_id;
    check(refundId !== undefined, `no refund_id: ${show(first)}`);

    const again = await refund(client, 100, key, "its repeat");
    check(outcome(again).decision === "replayed", `replay: ${show(again)}`);
    check(text(again).startsWith(`Replay of operation ${key}:`), `replay text: ${show(again)}`);
    check(again.structuredContent?.refund_id === refundId, `a second refund: ${show(again)}`);

    const other = await refund(client, 50, key, "the same key with another amount");
    check(other.isError === true && outcome(other).decision === "conflict", `conflict: ${show(other)}`);

    const keyless = await refund(client, 30, undefined, "the keyless call");
    check(!keyless.isError && outcome(keyless).decision === "executed", `keyless call: ${show(keyless)}`);
    check(String(outcome(keyless).operation).startsWith("derived:"), `derived key: ${show(keyless)}`);
    const keylessAgain = await refund(client, 30, undefined, "the keyless repeat");
    check(outcome(keylessAgain).decision === "replayed", `keyless repeat: ${show(keylessAgain)}`);
    check(outcome(keylessAgain).operation === outcome(keyless).operation, `another operation: ${show(keylessAgain)}`);
    check(keylessAgain.structuredContent?.refund_id === keyless.structuredContent?.refund_id, "a second keyless refund");

    // The README's quota (500.00 a day): 130 taken, 400 more would pass it. once answers; nothing is sent.
    const over = await refund(client, 400, `${key}-over`, "the call over the quota");
    check(over.isError === true && outcome(over).decision === "blocked", `over the quota: ${show(over)}`);

    // The upstream's own view: one refund per operation (100 + 30).
    check((await refunded(client)) === 130, "the order's refunds are not 100 + 30");
  } finally {
    await client.close();
    await gw.stop();
  }
}

async function unknown() {
  // The README's config, answering at once what is known (no wait for a read): a lost reply is UNKNOWN.
  const config = join(workdir, "unknown.toml");
  writeFileSync(config, `in_flight_wait = "0ms"\n${readFileSync(readmeConfig, "utf8")}`);
  const gw = await gateway("unknown", { config, fault: "pre_effect_disconnect" });
  const client = await gw.connect();
  try {
    const key = `ts-${sdk}-${transportKind}-unknown`;
    const lost = await refund(client, 100, key, "the call whose reply is lost");
    check(outcome(lost).decision === "unknown", `a lost reply: ${show(lost)}\n${readLog(gw.work)}`);
    // once settles it in the background (read, then the owed call sent once); the same call again reads that.
    const end = Date.now() + 30000;
    let answer = lost;
    while (["unknown", "in-flight"].includes(outcome(answer).decision)) {
      check(Date.now() < end, `never settled: ${show(answer)}\n${readLog(gw.work)}`);
      await sleep(250);
      answer = await refund(client, 100, key, "the same call again");
    }
    // Settled by the background worker (read, then sent) before this call: a replay; or the absence was
    // proven and this call is the one that sends the owed attempt: executed, as a later attempt.
    const settled = outcome(answer).decision;
    check(
      settled === "replayed" || (settled === "executed" && outcome(answer).attempt > 1),
      `settled: ${show(answer)}`,
    );
    check(answer.structuredContent?.amount === 100, `receipt: ${show(answer)}`);
    check((await refunded(client)) === 100, "one refund");
  } finally {
    await client.close();
    await gw.stop();
  }
}

/**
 * POST a tools/call as this row's client would, and hang up after the upstream made the refund but before the
 * answer came (refund-mcp under late_reply holds it 1.5 s): an answer lost on a broken connection. `watcher`
 * reads the order (DIRECT) to see the refund made.
 */
async function lostPost(url, id, args, key, watcher) {
  const meta = key ? { "once/key": key } : {};
  const headers = { "content-type": "application/json", accept: "application/json, text/event-stream" };
  if (row.era === "modern") {
    // The 2026-07-28 per-request envelope and headers, under the SDK's own names.
    Object.assign(meta, {
      [sdkModule.PROTOCOL_VERSION_META_KEY]: "2026-07-28",
      [sdkModule.CLIENT_INFO_META_KEY]: { name: `once-sdk-${sdk}`, version: "1.0.0" },
      [sdkModule.CLIENT_CAPABILITIES_META_KEY]: {},
    });
    Object.assign(headers, { "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "refund_order" });
  } else {
    headers["mcp-protocol-version"] = "2025-11-25";
  }
  const body = JSON.stringify({ jsonrpc: "2.0", id, method: "tools/call", params: { name: "refund_order", arguments: args, _meta: meta } });
  const req = request(url, { method: "POST", headers });
  let heard = "";
  req.on("response", (res) => res.on("data", (d) => void (heard += String(d))));
  req.on("error", () => {}); // the hang-up below is ours
  req.end(body);
  const end = Date.now() + 10000;
  while ((await refunded(watcher)) !== args.amount) {
    check(Date.now() < end, `the lost call made no refund: ${heard}`);
    await sleep(25);
  }
  req.destroy();
  check(!heard.includes("once/outcome"), `the answer came before the hang-up: ${heard}`);
}

async function retry(key) {
  const name = key ? "retry-keyed" : "retry-derived";
  const gw = await gateway(name, { fault: "late_reply", extra: ["--late-reply-ms", "1500"] });
  try {
    const args = { order_id: ORDER, amount: 100 };
    const client = await gw.connect();
    try {
      await lostPost(gw.url, `lost-${name}`, args, key, client);
      // MCP's own retry: the same call, a new request id, on another connection than the one that broke.
      const answer = await refund(client, 100, key, "the retry");
      // The lost request was sent and its refund made: the retry is that operation's replay.
      check(!answer.isError && outcome(answer).decision === "replayed", `the retry: ${show(answer)}\n${readLog(gw.work)}`);
      check(answer.structuredContent?.amount === 100, `the retry's receipt: ${show(answer)}`);
      if (key) check(outcome(answer).operation === key, `another operation: ${show(answer)}`);
      else check(String(outcome(answer).operation).startsWith("derived:"), `derived key: ${show(answer)}`);
      const repeat = await refund(client, 100, key, "the retry's repeat");
      check(outcome(repeat).decision === "replayed", `the repeat: ${show(repeat)}`);
      check(repeat.structuredContent?.refund_id === answer.structuredContent?.refund_id, "a second refund");
      check((await refunded(client)) === 100, `one refund: ${readLog(gw.work)}`);
    } finally {
      await client.close();
    }
  } finally {
    await gw.stop();
  }
}

mkdirSync(workdir, { recursive: true });
const scenarios = { rows: rows(), unknown: unknown() };
if (transportKind === "http") Object.assign(scenarios, { "retry-keyed": retry("ts-retry-keyed"), "retry-derived": retry(undefined) });
const results = await Promise.allSettled(Object.values(scenarios));
const names = Object.keys(scenarios);
const failed = results.map((r, i) => [names[i], r]).filter(([, r]) => r.status === "rejected");
for (const [name, f] of failed) console.error(`sdk client (${label}), ${name}: ${f.reason?.stack ?? String(f.reason)}`);
if (failed.length) process.exit(1);
console.log(`sdk client (${label}): ok`);
process.exit(0);
