"""API keys shared by the online endpoint and the Batch API: where keys come from and how a request's is checked."""
