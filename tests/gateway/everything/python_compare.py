"""The official Python MCP SDK client against the official MCP reference server
(server-everything, installed by `npm ci` beside this file), once directly and
once through `once gateway`: each feature must answer the same both ways.

Usage: python_compare.py ONCE_BIN WORKDIR   (exit 1 when a row differs)
Pinned SDK: mcp==2.3.0 (see .ci/run).
"""

import shutil
import sys
from importlib.metadata import version
from pathlib import Path

import anyio
import mcp.types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

EXPECTED_SDK = "2.3.0"
SERVER = Path(__file__).parent / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
ROOT = "file:///tmp/once-gateway-root"
SAMPLED = "a scripted model's answer"
# The one documented difference (docs/gateway.md, "Tasks"): the gateway does not declare `tasks`.
DOCUMENTED = {"capabilities": lambda d: ", ".join(c for c in d.split(", ") if c != "tasks")}


async def until(done, seconds):
    with anyio.move_on_after(seconds):
        while not done():
            await anyio.sleep(0.02)
    return done()


async def measure(command, args):
    seen = {"list_changed": 0, "sampled": 0, "elicited": 0, "roots": 0}

    async def sampling(context, params):
        seen["sampled"] += 1
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=SAMPLED), model="scripted"
        )

    async def elicitation(context, params):
        seen["elicited"] += 1
        return types.ElicitResult(action="accept", content={"name": "Ada Lovelace", "check": True})

    async def roots(context):
        seen["roots"] += 1
        return types.ListRootsResult(roots=[types.Root(uri=ROOT, name="the test's root")])

    async def messages(message):
        if isinstance(message, types.ToolListChangedNotification):
            seen["list_changed"] += 1

    row = {}
    server = StdioServerParameters(command=command, args=args)
    async with stdio_client(server) as (read, write):
        async with ClientSession(
            read,
            write,
            sampling_callback=sampling,
            elicitation_callback=elicitation,
            list_roots_callback=roots,
            message_handler=messages,
        ) as session:
            init = await session.initialize()
            await until(lambda: seen["roots"] > 0 and seen["list_changed"] > 0, 5)
            caps = init.capabilities.model_dump(exclude_none=True)
            row["capabilities"] = ", ".join(sorted(caps))
            row["instructions (first line)"] = (init.instructions or "").split("\n")[0]
            tools = [t.name for t in (await session.list_tools()).tools]
            row["tools/list"] = f"{len(tools)} tools"
            row["tools/list_changed"] = "received" if seen["list_changed"] else "none"
            row["prompts/list"] = f"{len((await session.list_prompts()).prompts)} prompts"
            row["resources/list"] = f"{len((await session.list_resources()).resources)} resources"

            progress = []

            async def on_progress(done, total, message):
                progress.append(done)

            await session.call_tool(
                "trigger-long-running-operation", {"duration": 1.5, "steps": 3}, progress_callback=on_progress
            )
            row["progress notifications of a long tool call"] = str(len(progress))

            sampled = await session.call_tool("trigger-sampling-request", {"prompt": "hello"})
            row["sampling/createMessage round trip"] = (
                "answered by the client" if SAMPLED in sampled.content[0].text and seen["sampled"] == 1 else "no"
            )
            elicited = await session.call_tool("trigger-elicitation-request", {})
            text = "\n".join(c.text for c in elicited.content if c.type == "text")
            row["elicitation/create round trip"] = (
                "accepted by the client" if "- Name: Ada Lovelace" in text and seen["elicited"] == 1 else text
            )
            listed = await session.call_tool("get-roots-list", {})
            row["roots/list round trip"] = "answered by the client" if ROOT in listed.content[0].text else "no"
    return row


async def main(once_bin, workdir):
    if version("mcp") != EXPECTED_SDK:
        raise SystemExit(f"python compare: mcp {version('mcp')} installed, the test pins {EXPECTED_SDK}")
    node = shutil.which("node")
    if node is None or not SERVER.exists():
        raise SystemExit(f"python compare: needs node and `npm ci` in {SERVER.parents[3]}")
    direct = await measure(node, [str(SERVER), "stdio"])
    gateway = await measure(
        once_bin, ["gateway", "--db", str(Path(workdir) / "once-py.db"), "--", node, str(SERVER), "stdio"]
    )
    print(f"Python SDK client mcp {EXPECTED_SDK}\n")
    print("| feature | direct | through `once gateway` | |\n| --- | --- | --- | --- |")
    differ = 0
    for feature, d in direct.items():
        g = gateway.get(feature)
        same = d == g
        known = not same and feature in DOCUMENTED and DOCUMENTED[feature](d) == g
        differ += not same and not known
        verdict = "✓" if same else "documented: no tasks" if known else "✗"
        print(f"| {feature} | {d} | {'same' if same else g} | {verdict} |")
    if differ:
        raise SystemExit(f"python compare: {differ} feature(s) differ through the gateway")
    print("\npython compare: ok")


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:3])
