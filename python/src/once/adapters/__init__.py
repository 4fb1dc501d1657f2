"""Framework adapters, each an optional extra: `openai_agents` (openai-agents), `langchain` (langchain-core, langgraph), `pydantic_ai` (pydantic-ai-slim)."""
