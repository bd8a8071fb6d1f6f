"""The online endpoint: the batch job's model and engine behind Ray Serve LLM's OpenAI-compatible API."""
