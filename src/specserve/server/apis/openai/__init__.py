"""OpenAI's APIs: chat completions, completions, Responses, and what they share."""
