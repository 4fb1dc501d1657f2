"""A scripted `agents.Model`: the SDK's real tool-calling path with no network and no API key."""

from __future__ import annotations

import itertools
import json
from typing import Any, AsyncIterator, Callable, Union

from agents import Model, ModelResponse, Usage, set_tracing_disabled
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

# No network: the SDK's trace export would try to reach OpenAI.
set_tracing_disabled(True)
_ids = itertools.count(1)
# One turn: the tool calls to make (name, args: a dict, or the raw arguments text as a model may send it), or the
# final text.
Turn = Union[list[tuple[str, Union[dict[str, Any], str]]], str]


def tool_outputs(input: Any) -> list[str]:
    """The outputs of the tool calls so far, as the SDK hands them back to the model."""
    if isinstance(input, str):
        return []
    return [str(i.get("output")) for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]


class ScriptedModel(Model):
    """Plays `script`: each turn is a function of the tool outputs so far, returning a Turn."""

    def __init__(self, script: Callable[[list[str]], Turn]) -> None:
        self.script = script
        self.turns = 0

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,
                           output_schema: Any, handoffs: Any, tracing: Any, **kwargs: Any) -> ModelResponse:
        self.turns += 1
        turn = self.script(tool_outputs(input))
        if isinstance(turn, str):
            output: list[Any] = [ResponseOutputMessage(
                id=f"msg-{next(_ids)}", role="assistant", status="completed", type="message",
                content=[ResponseOutputText(text=turn, type="output_text", annotations=[])])]
        else:
            # A fresh call id per call, as a model mints them: never an operation key.
            output = [ResponseFunctionToolCall(type="function_call", call_id=f"call-{next(_ids)}", name=name,
                                               arguments=args if isinstance(args, str) else json.dumps(args), id=f"fc-{next(_ids)}")
                      for name, args in turn]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")
