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
import re
from numbers import Real
from typing import Any, Sequence

from ....config import BIAS_LIMIT, MAX_LOGPROBS, bias_in_range
from ....logprobs import TokenLogprob
from ...http.errors import bad_request

LOWEST = -3.4028234663852886e38  # llama-server's logprob of a probability 0 (JSON has no -inf)


MAX_BIAS_ENTRIES = 16384  # logit_bias entries a request may give: each is checked on the event loop
MAX_BIAS_TEXT = 65536  # characters of text to bias, all entries together: tokenized off the loop (jobs.start)
_TOKEN_ID = re.compile(r"\s*-?[0-9]+\s*")  # a key that is one whole integer (ASCII digits: int() takes it)


def logit_bias_of(value: Any, model, param: str = "logit_bias"
                  ) -> tuple[tuple[tuple[int, float], ...], tuple[tuple[str, float], ...]]:
    """((token id, bias) pairs, (text, bias) pairs) from OpenAI's map of token ids (`{"1234": -100}`) or
    llama-server's list (`[[1234, -100], ["text", -1]]`); as llama-server: a key or first element that is
    text biases each of its tokens (in the list form, text is always text), a bias of false forbids the
    token (-inf), and ±inf forbids or forces it. The text is left to tokenize off the event loop
    (SamplingParams.bias_text). One place for every API: 400 naming the entry for anything else, and for
    more than MAX_BIAS_ENTRIES entries or MAX_BIAS_TEXT characters of text, before any of it is read."""
    if value is None:
        return (), ()
    if not isinstance(value, (dict, list)):
        raise bad_request(f"{param} must be an object of token ids to biases, or an array of [token, bias] pairs",
                          param)
    if len(value) > MAX_BIAS_ENTRIES:
        raise bad_request(f"{param} has {len(value)} entries; at most {MAX_BIAS_ENTRIES} are taken", param,
                          "logit_bias_too_large")
    if isinstance(value, dict):
        # a key is a token id where it is one whole integer (OpenAI's form), else text to tokenize
        entries = [(f"{param}.{k}", int(k) if _TOKEN_ID.fullmatch(k) else k, v) for k, v in value.items()]
    else:
        entries = []
        for i, el in enumerate(value):
            if not (isinstance(el, list) and len(el) == 2):
                raise bad_request(f"{param}[{i}] must be a [token, bias] pair", f"{param}[{i}]")
            entries.append((f"{param}[{i}]", *el))
    n_text = sum(len(token) for _, token, _ in entries if isinstance(token, str))
    if n_text > MAX_BIAS_TEXT:
        raise bad_request(f"{param} has {n_text} characters of text to bias; at most {MAX_BIAS_TEXT} are taken",
                          param, "logit_bias_too_large")
    n_vocab = model.vocab.n_vocab
    ids: list[tuple[int, float]] = []
    texts: list[tuple[str, float]] = []
    for where, token, bias in entries:
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, Real) or not bias_in_range(bias):
            raise bad_request(f"{where}: a bias must be a number from {-BIAS_LIMIT:g} to {BIAS_LIMIT:g}, false "
                              "(or -inf) to forbid the token, or +inf to force it", where)
        if isinstance(token, str):
            if not token:
                raise bad_request(f"{where}: the text to bias is empty", where)
            texts.append((token, float(bias)))
        elif isinstance(token, int) and not isinstance(token, bool) and 0 <= token < n_vocab:
            ids.append((token, float(bias)))
        else:
            raise bad_request(f"{where}: {str(token)[:20]} is not a token id of this model (0 to {n_vocab - 1})", where)
    return tuple(ids), tuple(texts)


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
