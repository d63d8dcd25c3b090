"""Fill-in-the-middle prompts, for llama-server's /infill and OpenAI's /v1/completions with `suffix`: the
request laid out with the model's own FIM tokens (fim.py), or 400 `infill_not_supported` naming the
token the model lacks."""
from __future__ import annotations

import anyio

from ....fim import FimUnsupported, Infill, healed, model_layout
from ...http.errors import bad_request


def fim_prompt(model, infill: Infill, n_ctx: int, n_predict: int) -> list[int]:
    """The FIM token ids; 400 `infill_not_supported` for a model without FIM tokens."""
    try:
        return model_layout(model, infill, n_ctx, n_predict)
    except FimUnsupported as e:
        raise bad_request(str(e), "model", "infill_not_supported") from None


async def openai_fim_prompt(server, prompt, suffix, max_tokens: int, heal: bool = True) -> tuple[list[int], bytes]:
    """/v1/completions with `suffix`: the prompt is the text before the cursor, `suffix` the text
    after; laid out as /infill lays them out (no extra context), the cursor's line after FIM_MID and
    healed (fim.healed) unless `heal` is False (a grammar constrains the answer instead).
    Returns (token ids, the healed bytes the answer must begin with)."""
    if not isinstance(prompt, str):
        raise bad_request("a prompt of token ids cannot take a suffix: send the text", "prompt")
    head, newline, line = prompt.rpartition("\n")
    infill = Infill(prefix=head + newline, suffix=suffix, prompt=line) if heal else Infill(prefix=prompt, suffix=suffix)
    target = server.target
    tokens = await anyio.to_thread.run_sync(fim_prompt, target, infill, server.n_ctx, max_tokens)
    return healed(target, tokens, infill)
