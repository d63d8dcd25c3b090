"""logit_bias as the APIs spell it, and each committed token's logprobs in each API's shape.

The engine gives a TokenLogprob per committed token (logprobs.py: the target's own distribution at
that position, read from the verification pass, so the same whatever speculation did). Shapes:
- llama-server's (`n_probs` on /completion, its `completion_probabilities`; OpenAI chat's
  `logprobs.content`, which llama-server fills with the same objects): per token `id`, `token`,
  `bytes`, `logprob` and `top_logprobs` (or, with `post_sampling_probs`, `prob` and `top_probs`:
  probabilities of the distribution the token was drawn from).
- OpenAI's legacy completions shape (`logprobs` as a number on /v1/completions): `tokens`,
  `token_logprobs`, `top_logprobs` (a map of token text to logprob per position), `text_offset`.
A token's text is its piece as far as it is whole UTF-8 (llama-server's rule); `bytes` has all of it.
In the legacy shape, which has no bytes, a piece that is not whole UTF-8 is named `bytes:\\xNN` (OpenAI's way).
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Any, Sequence

from ....config import MAX_LOGPROBS
from ....logprobs import TokenLogprob
from ...http.errors import bad_request

LOWEST = -3.4028234663852886e38  # llama-server's logprob of a probability 0 (JSON has no -inf)


def logit_bias_of(value: Any, model, param: str = "logit_bias") -> tuple[tuple[int, float], ...]:
    """(token id, bias) pairs from OpenAI's map of token ids (`{"1234": -100}`) or llama-server's list
    (`[[1234, -100], ["text", -1]]`); as llama-server: a key or first element that is text biases each of
    its tokens (in the list form, text is always text), and a bias of false forbids the token (-inf).
    400 naming the entry for anything else."""
    if value is None:
        return ()
    if isinstance(value, dict):
        # a key is a token id where it is one whole integer (OpenAI's form), else text to tokenize
        entries = [(f"{param}.{k}", int(k) if k.strip().lstrip("-").isdigit() else k, v)
                   for k, v in value.items()]
    elif isinstance(value, list):
        entries = []
        for i, el in enumerate(value):
            if not (isinstance(el, list) and len(el) == 2):
                raise bad_request(f"{param}[{i}] must be a [token, bias] pair", f"{param}[{i}]")
            entries.append((f"{param}[{i}]", *el))
    else:
        raise bad_request(f"{param} must be an object of token ids to biases, or an array of [token, bias] pairs",
                          param)
    n_vocab = model.vocab.n_vocab
    out: list[tuple[int, float]] = []
    for where, token, bias in entries:
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, Real) or not math.isfinite(bias):
            raise bad_request(f"{where}: a bias must be a number, or false to forbid the token", where)
        if isinstance(token, str):
            if not token:
                raise bad_request(f"{where}: the text to bias is empty", where)
            out += [(t, float(bias)) for t in model.tokenize(token, add_special=False)]
        elif isinstance(token, int) and not isinstance(token, bool) and 0 <= token < n_vocab:
            out.append((token, float(bias)))
        else:
            raise bad_request(f"{where}: {str(token)[:20]} is not a token id of this model (0 to {n_vocab - 1})", where)
    return tuple(out)


def count(n: Any, param: str, low: int = 0) -> int:
    """A number of alternatives asked for: an integer in [low, MAX_LOGPROBS], or a 400 naming `param`."""
    if isinstance(n, bool) or not isinstance(n, int) or not low <= n <= MAX_LOGPROBS:
        raise bad_request(f"{param} must be an integer from {low} to {MAX_LOGPROBS}, got {str(n)[:20]}", param)
    return n


def _text(raw: bytes) -> str:
    """The piece's text as far as it is whole UTF-8 (a token may hold part of a character)."""
    for cut in range(len(raw), max(len(raw) - 4, -1), -1):
        try:
            return raw[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return raw.decode("utf-8", "replace")


def _piece(model, token: int) -> tuple[str, list[int]]:
    raw = model.token_bytes(token, True)
    return _text(raw), list(raw)


def _lp(x: float) -> float:
    return x if x > -math.inf else LOWEST


def llama_probs(model, rows: Sequence[TokenLogprob], post_sampling: bool = False) -> list[dict]:
    """llama-server's `completion_probabilities` (and OpenAI chat's `logprobs.content`, as llama-server fills it)."""
    key, top_key = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")
    value = math.exp if post_sampling else _lp

    def entry(token: int, lp: float) -> dict:
        text, raw = _piece(model, token)
        return {"id": token, "token": text, "bytes": raw, key: value(lp)}

    return [{**entry(r.id, r.logprob), top_key: [entry(t, lp) for t, lp in r.top]} for r in rows]


def _legacy_token(model, token: int) -> str:
    """A token as OpenAI's legacy shape names it: its text, or `bytes:\\xNN...` where it is not whole UTF-8
    (the map of alternatives is keyed by these names: byte tokens would otherwise all be "")."""
    raw = model.token_bytes(token, True)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def legacy(model, rows: Sequence[TokenLogprob], offset: int = 0) -> dict:
    """OpenAI's legacy completions `logprobs`; `offset`: where the choice's generated text starts in its text."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for r in rows:
        out["tokens"].append(_legacy_token(model, r.id))
        out["token_logprobs"].append(_lp(r.logprob))
        out["top_logprobs"].append({_legacy_token(model, t): _lp(lp) for t, lp in r.top})
        out["text_offset"].append(offset)
        offset += len(_piece(model, r.id)[0])
    return out


def per_token(model, event) -> list[tuple[str, list[int], list[TokenLogprob] | None]]:
    """A streamed Text event as llama-server streams logprobs, one token a chunk: (text, tokens, logprobs)
    per token where the event has logprobs and its text is exactly its tokens' (a step commits several
    tokens under speculation); else the event whole (text held back for a stop string, a split character)."""
    rows, tokens = event.logprobs, list(event.tokens)
    if not rows or len(tokens) == 1:
        return [(event.text, tokens, rows)]
    pieces = [model.token_bytes(t, True) for t in tokens]
    try:
        texts = [p.decode("utf-8") for p in pieces]
    except UnicodeDecodeError:
        return [(event.text, tokens, rows)]
    if "".join(texts) != event.text:
        return [(event.text, tokens, rows)]
    return [(text, [t], [row]) for text, t, row in zip(texts, tokens, rows)]
