"""Framework adapters, each an optional extra: `openai_agents` (openai-agents), `langchain` (langchain-core,
langgraph; its `step_key` also serves the `langgraph` extra's checkpointers), `dbos` (dbos), `pydantic_ai`
(pydantic-ai-slim, Python 3.11+), `agent_framework` (agent-framework-core)."""
