"""Built-in chat templates `--chat-template NAME` selects, as Jinja sources.

llama-server's names render what its built-in (C++) templates render: chatml, llama3, command-r,
gemma, phi3, zephyr. `hermes` is this server's: ChatML with tools in Qwen2.5's (Hermes's) form, a
`<tools>` block in the system turn and calls as `<tool_call>{"name": ..., "arguments": ...}</tool_call>`,
so that a ChatML model whose own template has no tools (SmolLM2) can be given tools and its calls
read back.
"""
from __future__ import annotations

CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

LLAMA3 = (
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

COMMAND_R = (
    "{%- set tokens = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', 'assistant': '<|CHATBOT_TOKEN|>'} -%}"
    "{%- for message in messages -%}{%- if message.role in tokens -%}"
    "{{- '<|START_OF_TURN_TOKEN|>' + tokens[message.role] + message.content | trim + '<|END_OF_TURN_TOKEN|>' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}{%- endif -%}"
)

# gemma has no system turn: the system text opens the next user turn, as llama-server's does
GEMMA = (
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}{%- set ns.system = ns.system + message.content | trim -%}"
    "{%- else -%}"
    "{%- set role = 'model' if message.role == 'assistant' else message.role -%}"
    "{{- '<start_of_turn>' + role + '\\n' -}}"
    "{%- if ns.system and role != 'model' -%}{{- ns.system + '\\n\\n' -}}{%- set ns.system = '' -%}{%- endif -%}"
    "{{- message.content | trim + '<end_of_turn>\\n' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

PHI3 = (
    "{%- for message in messages -%}"
    "{{- '<|' + message.role + '|>\\n' + message.content + '<|end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)

ZEPHYR = (
    "{%- for message in messages -%}"
    "{{- '<|' + message.role + '|>\\n' + message.content + '<|endoftext|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)

# Qwen2.5's template without its default system text: tools in the system turn, calls in <tool_call>
# tags, tool results as a user turn in <tool_response> tags
HERMES = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\\n</tool_call><|im_end|>\\n' -}}"
    "{%- elif messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant' and not message.tool_calls) -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant' -}}{%- if message.content -%}{{- '\\n' + message.content -}}{%- endif -%}"
    "{%- for tool_call in message.tool_calls -%}"
    "{%- set call = tool_call.function if tool_call.function is defined else tool_call -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' + call.arguments | tojson"
    " + '}\\n</tool_call>' -}}"
    "{%- endfor -%}{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

BUILTIN = {"chatml": CHATML, "llama3": LLAMA3, "command-r": COMMAND_R, "gemma": GEMMA, "phi3": PHI3,
           "zephyr": ZEPHYR, "hermes": HERMES}


def builtin(name: str) -> str | None:
    """The Jinja source of a built-in template by name, or None if `name` is not one."""
    return BUILTIN.get(name.strip().lower())
