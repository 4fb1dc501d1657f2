"""Drive `once gateway` with the official Python MCP SDK (a client nobody here wrote).

Usage: python_client.py ONCE_BIN REFUND_MCP_BIN WORKDIR CONFIG

initialize, tools/list (annotations intact), then a protected tools/call
twice with the same operation key in _meta: the first runs, the second is a
replay. Exits non-zero on any mismatch. Pinned SDK: mcp==2.3.0 (see .ci/run).
"""

import sys
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

EXPECTED_SDK = "2.3.0"


def check(cond, what):
    if not cond:
        raise SystemExit(f"python interop: {what}")


async def main(once_bin, refund_mcp, workdir, config):
    from importlib.metadata import version

    check(version("mcp") == EXPECTED_SDK, f"mcp {version('mcp')} installed, the test pins {EXPECTED_SDK}")
    work = Path(workdir)
    server = StdioServerParameters(
        command=once_bin,
        args=[
            "gateway", "--config", config, "--db", str(work / "once.db"), "--",
            refund_mcp, "--db", str(work / "effects.db"), "--mode", "unsafe",
        ],
    )
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            check(init.server_info.name == "once-gateway", f"server {init.server_info}")
            check(init.capabilities.tools is not None, "no tools capability")

            tools = {t.name: t for t in (await session.list_tools()).tools}
            check(set(tools) == {"get_order", "refund_order", "find_refund_by_key"}, f"tools {sorted(tools)}")
            check(tools["get_order"].annotations.read_only_hint is True, "get_order lost readOnlyHint")
            check(tools["refund_order"].annotations.destructive_hint is True, "refund_order lost destructiveHint")

            args = {"order_id": 1234, "amount": 200}
            meta = {"once/key": "py-refund-1234"}
            first = await session.call_tool("refund_order", args, meta=meta)
            check(not first.is_error, f"first call failed: {first.content}")
            check(first.structured_content["amount"] == 200, f"receipt {first.structured_content}")
            check(first.meta["once/outcome"]["decision"] == "executed", f"meta {first.meta}")

            again = await session.call_tool("refund_order", args, meta=meta)
            text = again.content[0].text
            check(text.startswith("Replay of operation py-refund-1234:"), f"replay text {text!r}")
            check("Nothing was sent again" in text, f"replay text {text!r}")
            check(again.structured_content["refund_id"] == first.structured_content["refund_id"], "a second refund")

            order = await session.call_tool("get_order", {"order_id": 1234})
            check(order.structured_content["refunded"] == 200, f"order {order.structured_content}")
    print("python interop: ok")


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:5])
