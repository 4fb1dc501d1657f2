"""The official Python MCP SDK client against the official MCP reference server
(server-everything, installed by `npm ci` beside this file), once directly and
once through `once gateway`: each feature must answer the same both ways.

Usage: python_compare.py ONCE_BIN WORKDIR [stdio|http]   (exit 1 when a row differs)
  stdio: the server over stdio, and `once gateway -- <server>` over stdio (the default).
  http:  the server's own Streamable HTTP transport, and `once gateway --listen` (stateless
         Streamable HTTP) in front of the server over stdio; the rows stateless HTTP cannot
         carry must differ exactly as docs/gateway.md ("Over HTTP") says, and say why.
Pinned SDK: mcp==2.3.0 (see .ci/run).
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import anyio
import mcp.types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.extension import NotificationBinding
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

EXPECTED_SDK = "2.3.0"
SERVER = Path(__file__).parent / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
ROOT = "file:///tmp/once-gateway-root"
SAMPLED = "a scripted model's answer"
TASK_TOOL = "simulate-research-query"
TERMINAL = {"completed", "failed", "cancelled"}

# What stateless Streamable HTTP cannot carry (docs/gateway.md, "Over HTTP"): why, and what the gateway
# answers instead, exactly. On stdio nothing may differ.
NOT_RELAYED = "no session stream to carry the notification"
NO_CLIENT_CAPS = "the upstream is every client's: no client capability is declared to it"
NO_TASKS = "no tasks over HTTP: one upstream serves every client and tenant"
DOCUMENTED_HTTP = {
    "capabilities": (NO_TASKS, "completions, logging, prompts, resources, tools"),
    "capabilities.tasks": (NO_TASKS, "none"),
    "tools/list": (NO_CLIENT_CAPS, "13 tools"),
    "tools/list_changed": (NOT_RELAYED, "none"),
    "tools/list execution.taskSupport": (NO_TASKS, "none take tasks"),
    "sampling/createMessage round trip": (NO_CLIENT_CAPS, "the tool is not listed"),
    "elicitation/create round trip": (NO_CLIENT_CAPS, "the tool is not listed"),
    "roots/list round trip": (NO_CLIENT_CAPS, "the tool is not listed"),
    "tools/call as a task, tasks/get, tasks/result": (NO_TASKS, "not offered"),
    "notifications/tasks/status of that task": (NO_TASKS, "no task"),
    "tasks/list": (NO_TASKS, "not offered"),
    "tasks/cancel": (NO_TASKS, "not offered"),
}


async def until(done, seconds):
    with anyio.move_on_after(seconds):
        while not done():
            await anyio.sleep(0.02)
    return done()


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


async def call_as_task(session, name, arguments):
    """A `tools/call` as a task. mcp 2.3.0 defines the 2025-11-25 task types but has no call for this one
    request: its `send_request` checks every `tools/call` answer as a `CallToolResult`. So it goes through
    the session's JSON-RPC dispatcher, and its answer is checked as a `CreateTaskResult` here."""
    params = {"name": name, "arguments": arguments, "task": {"ttl": 60000}}
    raw = await session._dispatcher.send_raw_request("tools/call", params, {})
    return types.CreateTaskResult.model_validate(raw, by_name=False)


async def get_task(session, task_id):
    request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
    return await session.send_request(request, types.GetTaskResult)


async def task_round_trip(session):
    """Call the task tool as a task, poll tasks/get until it ends, then tasks/result: what was seen, in order."""
    created = await call_as_task(session, TASK_TOOL, {"topic": "python"})
    seen = [f"created ({created.task.status})"]
    status = created.task.status
    while status not in TERMINAL:
        await anyio.sleep((created.task.poll_interval or 1000) / 1000)
        status = (await get_task(session, created.task.task_id)).status
        if seen[-1] != f"tasks/get: {status}":
            seen.append(f"tasks/get: {status}")
    request = types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=created.task.task_id))
    result = await session.send_request(request, types.CallToolResult)
    seen.append(f"tasks/result: {result.content[0].text.splitlines()[0]}")
    return created.task.task_id, " → ".join(seen)


async def measure(connect):
    seen = {"list_changed": 0, "sampled": 0, "elicited": 0, "roots": 0, "task_status": []}

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

    async def task_status(params):
        seen["task_status"].append(params)

    row = {}
    async with connect() as streams:
        async with ClientSession(
            streams[0],
            streams[1],
            sampling_callback=sampling,
            elicitation_callback=elicitation,
            list_roots_callback=roots,
            message_handler=messages,
            notification_bindings=[
                NotificationBinding(
                    method="notifications/tasks/status",
                    params_type=types.TaskStatusNotificationParams,
                    handler=task_status,
                )
            ],
        ) as session:
            init = await session.initialize()
            await until(lambda: seen["roots"] > 0 and seen["list_changed"] > 0, 5)
            caps = init.capabilities.model_dump(exclude_none=True, by_alias=True)
            row["capabilities"] = ", ".join(sorted(caps))
            row["capabilities.tasks"] = canonical(caps["tasks"]) if "tasks" in caps else "none"
            row["instructions (first line)"] = (init.instructions or "").split("\n")[0]
            tools = (await session.list_tools()).tools
            names = [t.name for t in tools]
            row["tools/list"] = f"{len(tools)} tools"
            row["tools/list_changed"] = "received" if seen["list_changed"] else "none"
            taking = [
                f"{t.name}: {t.execution.task_support}"
                for t in tools
                if t.execution and t.execution.task_support in ("optional", "required")
            ]
            row["tools/list execution.taskSupport"] = ", ".join(taking) or "none take tasks"
            row["prompts/list"] = f"{len((await session.list_prompts()).prompts)} prompts"
            row["resources/list"] = f"{len((await session.list_resources()).resources)} resources"

            progress = []

            async def on_progress(done, total, message):
                progress.append(done)

            await session.call_tool(
                "trigger-long-running-operation", {"duration": 1.5, "steps": 3}, progress_callback=on_progress
            )
            row["progress notifications of a long tool call"] = str(len(progress))

            # A tool the server did not list is not called (through the gateway it would be a protected
            # call of an unknown tool).
            if "trigger-sampling-request" in names:
                sampled = await session.call_tool("trigger-sampling-request", {"prompt": "hello"})
                row["sampling/createMessage round trip"] = (
                    "answered by the client" if SAMPLED in sampled.content[0].text and seen["sampled"] == 1 else "no"
                )
            else:
                row["sampling/createMessage round trip"] = "the tool is not listed"
            if "trigger-elicitation-request" in names:
                elicited = await session.call_tool("trigger-elicitation-request", {})
                text = "\n".join(c.text for c in elicited.content if c.type == "text")
                row["elicitation/create round trip"] = (
                    "accepted by the client" if "- Name: Ada Lovelace" in text and seen["elicited"] == 1 else text
                )
            else:
                row["elicitation/create round trip"] = "the tool is not listed"
            if "get-roots-list" in names:
                listed = await session.call_tool("get-roots-list", {})
                row["roots/list round trip"] = "answered by the client" if ROOT in listed.content[0].text else "no"
            else:
                row["roots/list round trip"] = "the tool is not listed"

            # MCP 2025-11-25 tasks: the task tool called as a task, its status notifications, tasks/list,
            # and tasks/cancel of a second task.
            tasks = caps.get("tasks", {})
            task_id = None
            if tasks.get("requests", {}).get("tools", {}).get("call") is not None:
                task_id, row["tools/call as a task, tasks/get, tasks/result"] = await task_round_trip(session)
            else:
                row["tools/call as a task, tasks/get, tasks/result"] = "not offered"
            if task_id:
                await until(lambda: any(s.status == "completed" for s in seen["task_status"]), 5)
                mine = [s for s in seen["task_status"] if s.task_id == task_id]
                statuses = ", ".join(dict.fromkeys(s.status for s in mine))
                row["notifications/tasks/status of that task"] = f"{len(mine)} ({statuses})"
            else:
                row["notifications/tasks/status of that task"] = "no task"
            if "list" in tasks:
                listed = (await session.send_request(types.ListTasksRequest(), types.ListTasksResult)).tasks
                ours = [t for t in listed if t.task_id == task_id]
                row["tasks/list"] = f"{len(listed)} task(s)" + (f", the one above {ours[0].status}" if ours else "")
            else:
                row["tasks/list"] = "not offered"
            if "cancel" in tasks and task_id:
                second = await call_as_task(session, TASK_TOOL, {"topic": "a second topic"})
                request = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=second.task.task_id))
                cancelled = await session.send_request(request, types.CancelTaskResult)
                after = await get_task(session, second.task.task_id)
                row["tasks/cancel"] = f"{cancelled.status}; tasks/get then: {after.status}"
            else:
                row["tasks/cancel"] = "not offered"
    return row


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Started:
    """A process whose output said `ready`: the match, and the process to stop."""

    def __init__(self, args, env, ready, log):
        self.log = log
        self.proc = subprocess.Popen(
            args, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        seen = []
        for line in self.proc.stdout:
            seen.append(line)
            if found := re.search(ready, line):
                self.found = found
                break
        else:
            raise SystemExit(f"python compare: {args[0]} did not start:\n{''.join(seen)}")
        # Drained into the log from here on, so the process never blocks on a full pipe.
        self.drain = subprocess.Popen(["cat"], stdin=self.proc.stdout, stdout=log.open("w"))

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.drain.wait(timeout=10)


async def main(once_bin, workdir, mode="stdio"):
    if version("mcp") != EXPECTED_SDK:
        raise SystemExit(f"python compare: mcp {version('mcp')} installed, the test pins {EXPECTED_SDK}")
    node = shutil.which("node")
    if node is None or not SERVER.exists():
        raise SystemExit(f"python compare: needs node and `npm ci` in {SERVER.parents[3]}")
    if mode not in ("stdio", "http"):
        raise SystemExit("usage: python_compare.py ONCE_BIN WORKDIR [stdio|http]")
    work = Path(workdir)
    # The reference server marks its task tool not read-only, so once would protect it, and a protected
    # call is not run as a task (docs/gateway.md, "Tasks"): to measure tasks passing through, it is DIRECT.
    config = work / "once-py.toml"
    config.write_text(f'[tools.{TASK_TOOL}]\nroute = "direct"\n')
    gateway_args = ["--config", str(config), "--db", str(work / f"once-py-{mode}.db"), "--", node, str(SERVER), "stdio"]
    if mode == "stdio":
        direct = await measure(lambda: stdio_client(StdioServerParameters(command=node, args=[str(SERVER), "stdio"])))
        gateway = await measure(
            lambda: stdio_client(StdioServerParameters(command=once_bin, args=["gateway", *gateway_args]))
        )
    else:
        port = free_port()
        own = Started([node, str(SERVER), "streamableHttp"], {"PORT": str(port)}, "listening on port", work / "py-server.log")
        try:
            direct = await measure(lambda: streamable_http_client(f"http://127.0.0.1:{port}/mcp"))
        finally:
            own.stop()
        listening = Started(
            [once_bin, "gateway", "--listen", "127.0.0.1:0", *gateway_args],
            {},
            r"listening on (http://\S+)",
            work / "py-gateway.log",
        )
        try:
            gateway = await measure(lambda: streamable_http_client(listening.found[1]))
        finally:
            listening.stop()
    documented = DOCUMENTED_HTTP if mode == "http" else {}
    print(f"Python SDK client mcp {EXPECTED_SDK}, {mode}\n")
    through = "once gateway --listen" if mode == "http" else "once gateway"
    print(f"| feature | direct | through `{through}` | |\n| --- | --- | --- | --- |")
    differ = 0
    for feature, d in direct.items():
        g = gateway.get(feature)
        same = d == g
        why, expected = documented.get(feature, (None, None))
        known = not same and why is not None and g == expected
        differ += not same and not known
        verdict = "✓" if same else f"documented: {why}" if known else "✗"
        print(f"| {feature} | {d} | {'same' if same else g} | {verdict} |")
    if differ:
        raise SystemExit(f"python compare: {differ} feature(s) differ through the gateway")
    print(f"\npython compare ({mode}): ok")


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:4])
