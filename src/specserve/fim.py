"""Fill-in-the-middle prompts: the model's FIM tokens and llama-server's /infill layout.

A code model trained for FIM reads the code before and after the cursor between its own
control tokens and writes the middle. The tokens come from the GGUF: metadata keys
(`tokenizer.ggml.fim_pre_token_id`, ...) where the file has them, else the token texts
llama.cpp itself recognises (Qwen2.5-Coder: `<|fim_prefix|>`, `<|fim_suffix|>`, `<|fim_middle|>`,
`<|repo_name|>`, `<|file_sep|>`; StarCoder, CodeLlama, DeepSeek and OLMo spell them otherwise).

The layout is llama-server's repo-level pattern (https://arxiv.org/pdf/2409.12186):

    [FIM_REP]myproject\\n [FIM_SEP]{filename}\\n{text} ... [FIM_SEP]filename\\n
    [FIM_PRE]{prefix}[FIM_SUF]{suffix}[FIM_MID]{prompt}

with its budget rules: the prefix keeps its last 3/4 of a batch of tokens, the suffix its first
quarter less the prompt; the extra chunks fill what the context leaves after a batch and twice
n_predict (and never more than leaves room for n_predict), cut from their start (the chunks nearest
the cursor, last, are kept). Without FIM_REP/FIM_SEP the chunks are joined with a plain separator.
`prompt` (the current line up to the cursor) comes after FIM_MID, as llama-server documents it: a
keystroke then only appends tokens to the previous request's prompt, so the cached prefix covers all
but the new ones.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

# llama.cpp's spellings (llama-vocab.cpp), first match wins
_SPELLINGS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>", "<|fim_sep|>", "<fim-sep>", "<SEP>"),
}
_METADATA = {"pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
             "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
             "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
             "rep": ("tokenizer.ggml.fim_rep_token_id",), "sep": ("tokenizer.ggml.fim_sep_token_id",)}
_ROLE = {"pre": "prefix", "suf": "suffix", "mid": "middle"}
REPO_NAME = "myproject"  # llama-server's fixed project name (and "filename" for the current file)
CURRENT_FILE = "filename"
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"  # between extra chunks when the model has no FIM_SEP
DEFAULT_BATCH = 2048  # llama-server's default -b: the prefix and suffix share one batch
_found: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> FimTokens (a scan of its vocabulary)


class FimUnsupported(ValueError):
    """The model's vocabulary lacks a FIM token that infill needs; the message names it."""


@dataclass(frozen=True)
class FimTokens:
    """A model's FIM token ids (None where its vocabulary has none)."""

    pre: int | None
    suf: int | None
    mid: int | None
    rep: int | None = None
    sep: int | None = None

    def require(self) -> None:
        """Raise FimUnsupported naming each of FIM_PRE, FIM_SUF, FIM_MID the model lacks."""
        missing = [f"{_ROLE[k]} token ({' / '.join(_SPELLINGS[k][:3])})" for k in ("pre", "suf", "mid")
                   if getattr(self, k) is None]
        if missing:
            raise FimUnsupported("infill is not supported by this model: its vocabulary has no FIM "
                                 + ", no ".join(missing))


def fim_tokens(model) -> FimTokens:
    """The FIM tokens of a loaded model (backends' Model: `.vocab.token_texts`, `.metadata`), found once
    per model (the scan of a 152k-token vocabulary takes ~15 ms, too much for every keystroke)."""
    try:
        return _found[model]
    except (KeyError, TypeError):
        pass
    found = _scan(model)
    try:
        _found[model] = found
    except TypeError:
        pass
    return found


def _scan(model) -> FimTokens:
    texts = model.vocab.token_texts
    n_vocab = model.vocab.n_vocab
    metadata = getattr(model, "metadata", {}) or {}
    ids = {text: i for i, text in enumerate(texts) if text and text[0] in "<▁"}
    found = {}
    for role in _SPELLINGS:
        tid = None
        for key in _METADATA[role]:
            value = metadata.get(key)
            if value is not None and str(value).lstrip("-").isdigit() and 0 <= int(value) < n_vocab:
                tid = int(value)
                break
        if tid is None:
            tid = next((ids[s] for s in _SPELLINGS[role] if s in ids), None)
        found[role] = tid
    return FimTokens(**found)


@dataclass(frozen=True)
class Infill:
    """What a FIM request asks: the text around the cursor and the extra context chunks."""

    prefix: str = ""
    suffix: str = ""
    prompt: str = ""  # the current line up to the cursor: after FIM_MID
    extra: Sequence[tuple[str, str]] = ()  # (filename, text), oldest first


def layout(fim: FimTokens, tokenize: Callable[[str], list[int]], req: Infill, n_ctx: int,
           n_predict: int = 0, n_batch: int = DEFAULT_BATCH, bos: int | None = None) -> list[int]:
    """The token ids of `req` laid out as llama-server's /infill does, within its budget rules.

    tokenize(text) -> ids without special tokens and without parsing control-token texts (a
    file that spells `<|fim_prefix|>` is code, not markup). n_batch is capped at half the
    context so that the rules leave room to generate on small contexts. bos: prepended when
    the model adds one (before the prefix, after the extra context, as llama-server does)."""
    fim.require()
    n_batch = max(8, min(n_batch, n_ctx // 2))
    extra: list[int] = []
    if fim.rep is not None:
        extra += [fim.rep, *tokenize(REPO_NAME + "\n")]
    for filename, text in req.extra:
        if fim.sep is not None:
            extra += [fim.sep, *tokenize(filename + "\n")]
        else:
            extra += tokenize(CHUNK_SEPARATOR)
        extra += tokenize(text)
    if fim.sep is not None:
        extra += [fim.sep, *tokenize(CURRENT_FILE + "\n")]
    prefix, suffix, prompt = tokenize(req.prefix), tokenize(req.suffix), tokenize(req.prompt)
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    # llama-server's share for the extra context; and never so much that the prompt and n_predict (at
    # least one token) would not fit the context, which llama-server's share allows without n_predict
    fixed = (bos is not None) + 3 + n_prefix + n_suffix + len(prompt)
    n_extra = min(max(0, n_ctx - n_batch - 2 * max(n_predict, 0)), max(0, n_ctx - fixed - max(n_predict, 1)),
                  len(extra))
    out = extra[len(extra) - n_extra:]
    if bos is not None:
        out.append(bos)
    out += [fim.pre, *prefix[len(prefix) - n_prefix:], fim.suf, *suffix[:n_suffix], fim.mid, *prompt]
    return out


def healed(model, tokens: list[int], req: Infill) -> tuple[list[int], bytes]:
    """Token healing at the cursor: `tokens` (req laid out) less the prompt's last token, and that
    token's bytes, which the answer must begin with (grammar.healing). A cursor inside a word
    (`    fr`) otherwise leaves the model at a token boundary it never saw in training. Without a
    prompt, the layout ends with FIM_MID and nothing is healed."""
    if not req.prompt or len(tokens) < 2:
        return tokens, b""
    return tokens[:-1], model.token_bytes(tokens[-1])


def model_layout(model, req: Infill, n_ctx: int, n_predict: int = 0, n_batch: int = DEFAULT_BATCH) -> list[int]:
    """`layout` for a loaded model: its FIM tokens, its tokenizer, its BOS if it adds one.
    Raises FimUnsupported."""
    vocab = model.vocab
    bos = vocab.bos if vocab.add_bos else None
    return layout(fim_tokens(model), lambda s: model.tokenize(s, add_special=False, parse_special=False) if s else [],
                  req, n_ctx, n_predict, n_batch, bos)
