"""llguidance's tokenizer for a llama.cpp vocabulary (grammar-constrained generation).

llguidance.llamacpp builds it on llama_tokenize, which splits added (USER_DEFINED) tokens out
of any text, parse_special or not, while llguidance marks those spelled like a tag special
(Qwen2.5's `<tool_call>`, Gemma 3's `<b>`): text that a grammar forces inside a JSON string,
`"</tool_call>"`, came back as the one special token, which the grammar cannot take there, and
the request ended in a grammar error ("forced bytes: got '<'; applying '\\xff'"). Where a
vocabulary has such tokens, the tokenizer here tokenizes with llguidance's own, piece by piece,
each such token's text cut before its last byte so that llama.cpp cannot find it; the
vocabulary, the special tokens and so the masks are llguidance's as before.
"""
from __future__ import annotations

import warnings

import llguidance

_ATTR_CONTROL, _ATTR_USER_DEFINED = 1 << 3, 1 << 4


def grammar_tokenizer(model, vocab_ptr) -> llguidance.LLTokenizer:
    """The tokenizer for `model` (a LlamaCppModel; vocab_ptr: its llama_vocab), every
    end-of-generation token ending a grammar."""
    from llguidance.llamacpp import lltokenizer_from_vocab

    v = model.vocab
    eos = sorted(v.eog) or None
    with warnings.catch_warnings():  # it reads attributes through a deprecated alias, once per token
        warnings.simplefilter("ignore", DeprecationWarning)
        native = lltokenizer_from_vocab(vocab_ptr, eos_token=eos)
    pieces = [model.token_bytes(i, special=True) for i in range(v.n_vocab)]
    tags = [i for i, (piece, attr) in enumerate(zip(pieces, v.token_attrs))
            if attr & _ATTR_USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">")]
    if not tags:
        return native
    special = sorted({i for i, attr in enumerate(v.token_attrs) if attr & _ATTR_CONTROL} | set(tags))
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TagsAsText(native, pieces, special, v, tags)),
                                  eos_token=eos)


class _TagsAsText:
    """What llguidance.TokenizerWrapper reads: the vocabulary, and a tokenize of bytes."""

    def __init__(self, native: llguidance.LLTokenizer, pieces: list[bytes], special: list[int], vocab,
                 tags: list[int]):
        self.native = native
        self.tokens, self.special_token_ids = pieces, special
        self.eos_token_id, self.bos_token_id = vocab.eos, vocab.bos
        self.tags = sorted({pieces[i] for i in tags}, key=len, reverse=True)

    def __call__(self, data: bytes) -> list[int]:
        cuts = sorted({p + len(t) - 1 for t in self.tags if t in data for p in _finds(data, t)})
        if not cuts:
            return self.native.tokenize_bytes(data)
        out, a = [], 0
        for c in [*cuts, len(data)]:
            if c > a:
                out += self.native.tokenize_bytes(data[a:c])
            a = c
        return out


def _finds(data: bytes, t: bytes) -> list[int]:
    found, p = [], data.find(t)
    while p != -1:
        found.append(p)
        p = data.find(t, p + 1)
    return found
