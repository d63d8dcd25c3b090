"""Output constraints and tools, below the adapters: one grammar per request (structured.py),
compiled once on a grammar worker off the event loop (compiling.py), tools
as the template's call form and its grammar (tools.py), and tool calls read back from the text
(toolcalls.py)."""
