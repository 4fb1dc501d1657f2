"""The official Python MCP SDK's `Client`, in its default mode and in legacy mode, against `once gateway`.

Usage: python_modern.py ONCE_BIN REFUND_MCP_BIN WORKDIR CONFIG auto|legacy stdio|http

`mcp.client.client.Client(server, mode="auto")` is the SDK's default: it probes `server/discover` and speaks
2026-07-28 with a server that offers it; `mode="legacy"` is the initialize handshake. The gateway runs the
README's config (CONFIG) in front of `refund-mcp --mode unsafe`, as the client's child (stdio) or with
`--listen` (Streamable HTTP). Scenarios, each with its own gateway and ledgers under WORKDIR (the caller
counts the refunds in WORKDIR/<scenario>/effects.db, the upstream's own table):

- rows: connect; tools/list; a DIRECT get_order; a protected refund_order with a key in _meta (executed),
  the same call again (replayed, same refund_id), the same key with another amount (conflict), a keyless call
  and its repeat (derived key, replayed), a call over the quota (blocked). Two refunds.
- unknown: in_flight_wait = "0ms" on top of the README's config, refund-mcp under pre_effect_disconnect: the
  answer is once's UNKNOWN; the same call again until once settled it. One refund.
- retry-keyed, retry-derived (http only): the call POSTed raw and its connection closed before the answer
  (refund-mcp under late_reply holds it), then sent again by the SDK with a new request id on a new
  connection: with the key in _meta, and keyless (derived). One refund each.

Every answer must be one the SDK accepted (a validation error raises and fails the script).
Pinned SDK: mcp==2.3.0 (see .ci/run).
"""

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import anyio
from mcp import StdioServerParameters
from mcp.client.client import Client
from mcp.client.stdio import stdio_client

EXPECTED_SDK = "2.3.0"
ORDER = 1234
TOOLS = {"get_order", "refund_order", "find_refund_by_key"}


class Row:
    def __init__(self, once_bin, refund_mcp, workdir, config, mode, transport):
        self.once_bin, self.refund_mcp, self.workdir, self.config = once_bin, refund_mcp, Path(workdir), config
        self.mode, self.transport = mode, transport
        self.label = f"python {mode}, {transport}"
        # "auto" probes server/discover and adopts 2026-07-28, which the gateway offers; "legacy"'s initialize
        # asks for the newest handshake revision, which the gateway accepts.
        self.version = "2026-07-28" if mode == "auto" else "2025-11-25"

    def check(self, cond, what):
        if not cond:
            raise AssertionError(f"{self.label}: {what}")


def outcome(result):
    return (result.meta or {}).get("once/outcome", {})


def text(result):
    return next((c.text for c in result.content if c.type == "text"), "")


def show(result):
    return result.model_dump_json(by_alias=True, exclude_none=True)


class Gateway:
    """One scenario's gateway: `--listen` (its URL from the first stdout line), or a stdio child per client."""

    def __init__(self, row, name, config=None, fault="none", extra=()):
        self.row = row
        self.work = row.workdir / name
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = self.work / "gateway.log"
        self.args = [
            "--config", str(config or row.config), "--db", str(self.work / "once.db"), "--",
            row.refund_mcp, "--db", str(self.work / "effects.db"), "--mode", "unsafe", "--fault", fault, *extra,
        ]
        self.proc = None
        if row.transport == "http":
            self.proc = subprocess.Popen(
                [row.once_bin, "gateway", "--listen", "127.0.0.1:0", *self.args],
                stdout=subprocess.PIPE,
                stderr=self.log.open("w"),
                text=True,
            )
            line = self.proc.stdout.readline()
            row.check(line.startswith("once gateway: listening on http://"), f"first line {line!r}\n{self.logs()}")
            self.url = line.rsplit(" ", 1)[1].strip()

    def logs(self):
        return self.log.read_text() if self.log.exists() else ""

    def client(self):
        if self.proc is not None:
            return Client(self.url, mode=self.row.mode)
        params = StdioServerParameters(command=self.row.once_bin, args=["gateway", *self.args])
        return Client(stdio_client(params, errlog=self.log.open("a")), mode=self.row.mode)

    def stop(self):
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            code = self.proc.wait(timeout=60)
            self.row.check(code == 0, f"gateway exit {code}\n{self.logs()}")


async def started(row, name, **how):
    # Starting and stopping wait on the process: in a thread, so the scenarios run side by side.
    return await anyio.to_thread.run_sync(lambda: Gateway(row, name, **how))


async def connected(row, gateway):
    client = await gateway.client().__aenter__()
    row.check(client.protocol_version == row.version, f"negotiated {client.protocol_version}, expected {row.version}")
    if row.mode == "auto":
        row.check(client.session.discover_result is not None, "server/discover was not answered")
    # initialize's serverInfo, or (2026-07-28) the discover result's `_meta` serverInfo.
    row.check(client.server_info is not None and client.server_info.name == "once-gateway", f"{client.server_info}")
    return client


def of_its_revision(row, result, step):
    """A result to a client on a revision before 2026-07-28 carries nothing that revision does not know."""
    # The model defaults result_type to "complete"; the fields set are the ones the answer carried.
    if row.mode == "legacy":
        row.check("result_type" not in result.model_fields_set, f"{step}: resultType sent to a legacy client")
    return result


async def refund(row, client, amount, key=None, *, step):
    """refund_order on the order, with `key` in `_meta` (or none); a result the SDK rejects fails naming `step`."""
    meta = {"once/key": key} if key else None
    try:
        result = await client.call_tool("refund_order", {"order_id": ORDER, "amount": amount}, meta=meta)
    except Exception as e:
        raise AssertionError(f"{step}: the SDK did not accept the answer: {type(e).__name__}: {e}") from e
    return of_its_revision(row, result, step)


async def refunded(row, client):
    order = of_its_revision(row, await client.call_tool("get_order", {"order_id": ORDER}), "get_order")
    row.check(not order.is_error, f"get_order failed: {show(order)}")
    return order.structured_content["refunded"]


async def rows(row):
    gateway = await started(row, "rows")
    try:
        client = await connected(row, gateway)
        try:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            row.check(set(tools) == TOOLS, f"tools {sorted(tools)}")
            row.check(tools["get_order"].annotations.read_only_hint is True, "get_order lost readOnlyHint")
            row.check(tools["refund_order"].annotations.destructive_hint is True, "refund_order lost destructiveHint")

            row.check(await refunded(row, client) == 0, "the order starts unrefunded")

            key = f"py-{row.mode}-{row.transport}"
            first = await refund(row, client, 100, key, step="the keyed call")
            row.check(not first.is_error and outcome(first).get("decision") == "executed", f"first: {show(first)}")
            row.check(first.structured_content["amount"] == 100, f"receipt {show(first)}")
            refund_id = first.structured_content["refund_id"]

            again = await refund(row, client, 100, key, step="its repeat")
            row.check(outcome(again).get("decision") == "replayed", f"replay: {show(again)}")
            row.check(text(again).startswith(f"Replay of operation {key}:"), f"replay text: {show(again)}")
            row.check(again.structured_content["refund_id"] == refund_id, f"a second refund: {show(again)}")

            other = await refund(row, client, 50, key, step="the same key with another amount")
            row.check(other.is_error and outcome(other).get("decision") == "conflict", f"conflict: {show(other)}")

            keyless = await refund(row, client, 30, step="the keyless call")
            row.check(not keyless.is_error and outcome(keyless).get("decision") == "executed", f"keyless: {show(keyless)}")
            row.check(str(outcome(keyless).get("operation")).startswith("derived:"), f"derived key: {show(keyless)}")
            keyless_again = await refund(row, client, 30, step="the keyless repeat")
            row.check(outcome(keyless_again).get("decision") == "replayed", f"keyless repeat: {show(keyless_again)}")
            row.check(outcome(keyless_again).get("operation") == outcome(keyless).get("operation"), "another operation")
            row.check(
                keyless_again.structured_content["refund_id"] == keyless.structured_content["refund_id"],
                "a second keyless refund",
            )

            # The README's quota (500.00 a day): 130 taken, 400 more would pass it. once answers; nothing is sent.
            over = await refund(row, client, 400, f"{key}-over", step="the call over the quota")
            row.check(over.is_error and outcome(over).get("decision") == "blocked", f"over the quota: {show(over)}")

            row.check(await refunded(row, client) == 130, "the order's refunds are not 100 + 30")
        finally:
            await client.__aexit__(None, None, None)
    finally:
        await anyio.to_thread.run_sync(gateway.stop)


async def unknown(row):
    # The README's config, answering at once what is known (no wait for a read): a lost reply is UNKNOWN.
    config = row.workdir / "unknown.toml"
    config.write_text('in_flight_wait = "0ms"\n' + Path(row.config).read_text())
    gateway = await started(row, "unknown", config=config, fault="pre_effect_disconnect")
    try:
        client = await connected(row, gateway)
        try:
            key = f"py-{row.mode}-{row.transport}-unknown"
            answer = await refund(row, client, 100, key, step="the call whose reply is lost")
            row.check(outcome(answer).get("decision") == "unknown", f"a lost reply: {show(answer)}\n{gateway.logs()}")
            # once settles it in the background (read, then the owed call sent once); the same call reads that.
            end = time.monotonic() + 30
            while outcome(answer).get("decision") in ("unknown", "in-flight"):
                row.check(time.monotonic() < end, f"never settled: {show(answer)}\n{gateway.logs()}")
                await anyio.sleep(0.25)
                answer = await refund(row, client, 100, key, step="the same call again")
            # Settled by the background worker (read, then sent) before this call: a replay; or the absence
            # was proven and this call is the one that sends the owed attempt: executed, as a later attempt.
            settled = outcome(answer)
            row.check(
                settled.get("decision") == "replayed"
                or (settled.get("decision") == "executed" and settled.get("attempt", 1) > 1),
                f"settled: {show(answer)}",
            )
            row.check(answer.structured_content["amount"] == 100, f"receipt: {show(answer)}")
            row.check(await refunded(row, client) == 100, "one refund")
        finally:
            await client.__aexit__(None, None, None)
    finally:
        await anyio.to_thread.run_sync(gateway.stop)


async def lost_post(row, url, request_id, args, key, watcher):
    """POST a tools/call as this row's client would, and hang up after the upstream made the refund but before
    the answer came (refund-mcp under late_reply holds it 1.5 s): an answer lost on a broken connection.
    `watcher` reads the order (DIRECT) to see the refund made."""
    from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY

    meta = {"once/key": key} if key else {}
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": row.version,
    }
    if row.mode == "auto":
        # The 2026-07-28 per-request envelope and headers, under the SDK's own names.
        meta |= {
            PROTOCOL_VERSION_META_KEY: row.version,
            CLIENT_INFO_META_KEY: {"name": "once-python-modern", "version": "1.0.0"},
            CLIENT_CAPABILITIES_META_KEY: {},
        }
        headers |= {"Mcp-Method": "tools/call", "Mcp-Name": "refund_order"}
    body = json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
         "params": {"name": "refund_order", "arguments": args, "_meta": meta}}
    ).encode()
    parts = urlsplit(url)
    head = f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
        sock.sendall(head.encode() + body)
        end = time.monotonic() + 10
        while await refunded(row, watcher) != args["amount"]:
            row.check(time.monotonic() < end, "the lost call made no refund")
            await anyio.sleep(0.025)
        sock.setblocking(False)
        try:
            heard = sock.recv(65536).decode(errors="replace")
        except BlockingIOError:
            heard = ""
    # Headers may have come (a stream opened); the answer must not have.
    row.check("once/outcome" not in heard, f"the answer came before the hang-up: {heard!r}")


async def retry(row, key):
    name = "retry-keyed" if key else "retry-derived"
    gateway = await started(row, name, fault="late_reply", extra=("--late-reply-ms", "1500"))
    try:
        args = {"order_id": ORDER, "amount": 100}
        client = await connected(row, gateway)
        try:
            await lost_post(row, gateway.url, f"lost-{name}", args, key, client)
            # MCP's own retry: the same call, a new request id, on another connection than the one that broke.
            answer = await refund(row, client, 100, key, step="the retry")
            # The lost request was sent and its refund made: the retry is that operation's replay.
            row.check(
                not answer.is_error and outcome(answer).get("decision") == "replayed",
                f"the retry: {show(answer)}\n{gateway.logs()}",
            )
            row.check(answer.structured_content["amount"] == 100, f"the retry's receipt: {show(answer)}")
            operation = str(outcome(answer).get("operation"))
            row.check(operation == key if key else operation.startswith("derived:"), f"operation: {show(answer)}")
            repeat = await refund(row, client, 100, key, step="the retry's repeat")
            row.check(outcome(repeat).get("decision") == "replayed", f"the repeat: {show(repeat)}")
            row.check(
                repeat.structured_content["refund_id"] == answer.structured_content["refund_id"], "a second refund"
            )
            row.check(await refunded(row, client) == 100, f"one refund\n{gateway.logs()}")
        finally:
            await client.__aexit__(None, None, None)
    finally:
        await anyio.to_thread.run_sync(gateway.stop)


async def main(once_bin, refund_mcp, workdir, config, mode, transport):
    from importlib.metadata import version

    row = Row(once_bin, refund_mcp, workdir, config, mode, transport)
    row.check(version("mcp") == EXPECTED_SDK, f"mcp {version('mcp')} installed, the test pins {EXPECTED_SDK}")
    row.check(mode in ("auto", "legacy") and transport in ("stdio", "http"), "usage: … auto|legacy stdio|http")
    row.workdir.mkdir(parents=True, exist_ok=True)
    scenarios = {"rows": rows(row), "unknown": unknown(row)}
    if transport == "http":
        scenarios |= {"retry-keyed": retry(row, f"py-retry-{mode}"), "retry-derived": retry(row, None)}
    failures = []

    async def run(name, scenario):
        try:
            await scenario
        except Exception as e:  # noqa: BLE001 - every scenario's failure is reported, not only the first
            failures.append((name, e))

    async with anyio.create_task_group() as tg:
        for name, scenario in scenarios.items():
            tg.start_soon(run, name, scenario)
    for name, failure in failures:
        print(f"{row.label}, {name}: {type(failure).__name__}: {failure}", file=sys.stderr)
    if failures:
        raise SystemExit(1)
    print(f"{row.label}: ok")


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:7])
