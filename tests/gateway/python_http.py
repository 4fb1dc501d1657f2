"""Drive `once gateway --listen` with the official Python MCP SDK's Streamable HTTP client.

Usage: python_http.py ONCE_BIN REFUND_MCP_BIN WORKDIR CONFIG

Three gateways, each with its own refund service (WORKDIR/main, WORKDIR/pre, WORKDIR/post):
- main: the README's config plus a tenant token; initialize, tools/list, a protected call, its
  replay, a conflict (same key, other args); SIGTERM -> exit 0.
- pre, post: a never-retry agent (one call, read the text, hang up) under the refund service's
  pre_effect_disconnect and post_commit_disconnect faults; SIGTERM -> exit 0.
The caller counts the refunds in each effects.db. Pinned SDK: mcp==2.3.0 (see .ci/run).
"""

import hashlib
import signal
import subprocess
import sys
from pathlib import Path

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

EXPECTED_SDK = "2.3.0"
TOKEN = "py-tenant-secret"


def check(cond, what):
    if not cond:
        raise SystemExit(f"python http: {what}")


class Gateway:
    """`once gateway --listen 127.0.0.1:0` in front of refund-mcp; the URL from its first stdout line."""

    def __init__(self, once_bin, refund_mcp, work, config, fault):
        work.mkdir(parents=True, exist_ok=True)
        self.log = work / "gateway.log"
        self.proc = subprocess.Popen(
            [
                once_bin, "gateway", "--listen", "127.0.0.1:0", "--config", str(config),
                "--db", str(work / "once.db"), "--",
                refund_mcp, "--db", str(work / "effects.db"), "--mode", "unsafe", "--fault", fault,
            ],
            stdout=subprocess.PIPE,
            stderr=self.log.open("w"),
            text=True,
        )
        line = self.proc.stdout.readline()
        check(line.startswith("once gateway: listening on http://"), f"first line {line!r}\n{self.log.read_text()}")
        self.url = line.rsplit(" ", 1)[1].strip()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        check(code == 0, f"gateway exit {code}\n{self.log.read_text()}")


async def session_on(url, headers, body):
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await body(session)


async def main_scenario(gateway):
    async def body(session):
        tools = {t.name: t for t in (await session.list_tools()).tools}
        check(set(tools) == {"get_order", "refund_order", "find_refund_by_key"}, f"tools {sorted(tools)}")
        check(tools["refund_order"].annotations.destructive_hint is True, "refund_order lost destructiveHint")

        args = {"order_id": 1234, "amount": 200}
        meta = {"once/key": "py-http-1"}
        first = await session.call_tool("refund_order", args, meta=meta)
        check(not first.is_error, f"first call failed: {first.content}")
        check(first.meta["once/outcome"]["decision"] == "executed", f"meta {first.meta}")
        check(first.meta["once/outcome"]["scope"] == "py", f"the tenant is the scope: {first.meta}")

        again = await session.call_tool("refund_order", args, meta=meta)
        text = again.content[0].text
        check(text.startswith("Replay of operation py-http-1:"), f"replay text {text!r}")
        check(again.structured_content["refund_id"] == first.structured_content["refund_id"], "a second refund")

        other = await session.call_tool("refund_order", {"order_id": 1234, "amount": 50}, meta=meta)
        text = other.content[0].text
        check(other.is_error, f"a conflict is an error result: {text!r}")
        check(other.meta["once/outcome"]["decision"] == "conflict", f"conflict meta {other.meta}")

    await session_on(gateway.url, {"Authorization": f"Bearer {TOKEN}"}, body)


async def never_retry(gateway, expect):
    async def body(session):
        result = await session.call_tool("refund_order", {"order_id": 1234, "amount": 200})
        text = result.content[0].text
        check(expect(text), f"never-retry text {text!r}\n{gateway.log.read_text()}")

    await session_on(gateway.url, None, body)


async def main(once_bin, refund_mcp, workdir, config):
    from importlib.metadata import version

    check(version("mcp") == EXPECTED_SDK, f"mcp {version('mcp')} installed, the test pins {EXPECTED_SDK}")
    work = Path(workdir)
    tenant_config = work / "tenants.toml"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    tenant_config.write_text(Path(config).read_text() + f'\n[http]\ntenants = {{ py = "{digest}" }}\n')

    gateway = Gateway(once_bin, refund_mcp, work / "main", tenant_config, "none")
    try:
        await main_scenario(gateway)
    finally:
        gateway.stop()

    cases = [
        ("pre", "pre_effect_disconnect", lambda t: t.startswith("Sent now as attempt 2 of operation ")),
        (
            "post",
            "post_commit_disconnect",
            lambda t: t.startswith("Replay of operation derived:")
            and "once confirmed it by reading find_refund_by_key" in t,
        ),
    ]
    for name, fault, expect in cases:
        gateway = Gateway(once_bin, refund_mcp, work / name, config, fault)
        try:
            await never_retry(gateway, expect)
        finally:
            gateway.stop()
    print("python http: ok")


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:5])
