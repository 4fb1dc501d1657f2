"""Restarts, driven by the official Python MCP SDK: an agent host that loses a reply,
restarts `once gateway` and calls again over a new connection gets one refund.

Usage: python_restart.py ONCE_BIN REFUND_MCP_BIN WORKDIR CONFIG

Two runs, each on a ledger of its own under WORKDIR (keyed/, keyless/), with the
README's config unchanged and `refund-mcp --mode unsafe` (it never dedupes):
the first call's reply is lost after the refund commits (post_commit_disconnect),
the host hangs up, starts a new gateway and calls again - with the same key in
_meta "once/key", and with no key at all. The second call must be a replay.
The caller (host/gateway/tests/gateway_python.rs) counts refunds in each effect ledger.
Pinned SDK: mcp==2.3.0 (see .ci/run).
"""

import sys
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ARGS = {"order_id": 1234, "amount": 200}


def check(cond, what):
    if not cond:
        raise SystemExit(f"python restart: {what}")


def gateway(once_bin, refund_mcp, work, config):
    return StdioServerParameters(
        command=once_bin,
        args=[
            "gateway", "--config", config, "--db", str(work / "once.db"), "--",
            refund_mcp, "--db", str(work / "effects.db"), "--mode", "unsafe",
            "--fault", "post_commit_disconnect",
        ],
    )


async def one_call(server, meta):
    """A whole host lifetime: connect, call once, hang up (the gateway exits)."""
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await session.call_tool("refund_order", ARGS, meta=meta)


async def main(once_bin, refund_mcp, workdir, config):
    for name, meta in [("keyed", {"once/key": "py-restart-1234"}), ("keyless", None)]:
        work = Path(workdir) / name
        work.mkdir(parents=True, exist_ok=True)
        server = gateway(once_bin, refund_mcp, work, config)
        await one_call(server, meta)
        again = await one_call(server, meta)
        text = again.content[0].text
        decision = again.meta["once/outcome"]["decision"]
        check(decision == "replayed", f"{name}: after the restart the call was {decision!r}: {text!r}")
        check("Nothing was sent again" in text, f"{name}: replay text {text!r}")
        print(f"python restart {name}: {text.splitlines()[0][:100]}")
    print("python restart: ok")


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:5])
