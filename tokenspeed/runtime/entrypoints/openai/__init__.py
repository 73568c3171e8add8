"""The OpenAI-compatible API: request models, chat and completions handlers, error bodies."""
