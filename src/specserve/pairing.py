"""Can this draft serve this target? The check run before anything is generated.

Flagrant mismatches refuse to start (exit status 2), naming what differs: the
tokenizer model, vocabulary sizes beyond padding, token texts at ids both have,
BOS/EOS ids, add-BOS/add-EOS. These are llama.cpp's rules
(`common_speculative_are_compatible`), except that llama.cpp then runs silently
without the draft and we refuse.

Subtle mismatches start with a warning and the evidence: same token texts but
different merges or pre-tokenizer, special-token flags, chat template, or a probe
text that tokenizes differently. They do not break correctness (the target verifies
everything) but make drafts rarely accepted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .backends.base import Model

VOCAB_PADDING = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
_SPECIAL_IDS = 5  # ids below this are often differently named placeholders; llama.cpp skips them

PROBE_TEXTS = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "   indented\ttabs\n\nnumbers 1234567 3.14159 and emoji 🙂 café naïve 東京",
    "<|im_start|>user\nhi<|im_end|>\n",
)
_METADATA_KEYS = (
    ("tokenizer.ggml.pre", "pre-tokenizer"),
    ("tokenizer.chat_template", "chat template"),
)


@dataclass
class PairingReport:
    problems: list[str] = field(default_factory=list)  # flagrant: refuse
    warnings: list[str] = field(default_factory=list)  # subtle: start, but say so

    @property
    def flagrant(self) -> bool:
        return bool(self.problems)

    @property
    def compatible(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"compatible": self.compatible, "problems": self.problems, "warnings": self.warnings}


def _show(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _where_differs(a: str, b: str) -> str:
    """Where two texts part: the line and a window around the first differing character."""
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    line = a.count("\n", 0, i) + 1
    lo = max(i - 12, 0)
    return (f"from character {i} (line {line}) on: target {_show(a[lo:i + 24])}, draft {_show(b[lo:i + 24])} "
            f"({len(a)} vs {len(b)} characters)")


def check_pairing(target: Model, draft: Model) -> PairingReport:
    r = PairingReport()
    tv, dv = target.vocab, draft.vocab
    if tv.vocab_type != dv.vocab_type:
        r.problems.append(f"tokenizer models differ: target {tv.vocab_type}, draft {dv.vocab_type}")
    if abs(tv.n_vocab - dv.n_vocab) > VOCAB_PADDING:
        r.problems.append(
            f"vocabulary sizes differ by more than padding ({VOCAB_PADDING}): target {tv.n_vocab}, draft {dv.n_vocab}"
        )
    elif tv.n_vocab != dv.n_vocab:
        r.warnings.append(f"vocabulary sizes differ within padding: target {tv.n_vocab}, draft {dv.n_vocab} "
                          "(a draft token the target lacks is always rejected; the draft sees a stand-in for "
                          "a target token it lacks)")
    for what, a, b in (("BOS", tv.bos, dv.bos), ("EOS", tv.eos, dv.eos),
                       ("add-BOS", tv.add_bos, dv.add_bos), ("add-EOS", tv.add_eos, dv.add_eos)):
        if a != b:
            r.problems.append(f"{what} differs: target {a}, draft {b}")
    if r.problems:  # a different tokenizer altogether: listing every differing token says nothing more
        if tv.vocab_type == dv.vocab_type and abs(tv.n_vocab - dv.n_vocab) <= VOCAB_PADDING:
            _compare_tokens(tv, dv, r)
        return r
    _compare_tokens(tv, dv, r)
    if r.problems:
        return r
    _compare_subtle(target, draft, r)
    return r


def _compare_tokens(tv, dv, r: PairingReport) -> None:
    n = min(tv.n_vocab, dv.n_vocab)
    diffs = [i for i in range(n) if tv.token_texts[i] != dv.token_texts[i]]
    flagrant = [i for i in diffs if i >= _SPECIAL_IDS]
    if flagrant:
        i = flagrant[0]
        r.problems.append(
            f"token texts differ at {len(flagrant)} id(s), first at id {i}: "
            f"target {_show(tv.token_texts[i])}, draft {_show(dv.token_texts[i])}"
        )
    for i in diffs:
        if i < _SPECIAL_IDS:
            r.warnings.append(f"special token {i} differs: target {_show(tv.token_texts[i])}, "
                              f"draft {_show(dv.token_texts[i])}")


def _compare_subtle(target: Model, draft: Model, r: PairingReport) -> None:
    tv, dv = target.vocab, draft.vocab
    n = min(tv.n_vocab, dv.n_vocab)
    flag_diffs = [i for i in range(n) if tv.token_attrs[i] != dv.token_attrs[i]]
    if flag_diffs:
        i = flag_diffs[0]
        r.warnings.append(
            f"special-token flags differ at {len(flag_diffs)} id(s), first at id {i} ({_show(tv.token_texts[i])}): "
            f"target attr {tv.token_attrs[i]}, draft attr {dv.token_attrs[i]}"
        )
    for key, what in _METADATA_KEYS:
        a, b = target.metadata.get(key), draft.metadata.get(key)
        if a != b:
            r.warnings.append(f"{what} differs: {_where_differs(str(a), str(b))}")
    merges_t, merges_d = _merges_digest(target), _merges_digest(draft)
    if merges_t != merges_d:
        r.warnings.append(f"BPE merges differ (target {merges_t}, draft {merges_d})")
    for text in PROBE_TEXTS:
        a = target.tokenize(text, add_special=True, parse_special=True)
        b = draft.tokenize(text, add_special=True, parse_special=True)
        if a != b:
            i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            r.warnings.append(
                f"probe text {_show(text)} tokenizes differently from token {i} on: "
                f"target {a[i:i + 4]}, draft {b[i:i + 4]} ({len(a)} vs {len(b)} tokens)"
            )
            break


def _merges_digest(model: Model) -> str | None:
    """A short digest of the BPE merges list from the GGUF file (None when there is none)."""
    from .gguf_meta import read_metadata

    try:
        meta = read_metadata(model.path)
    except (OSError, ValueError):
        return None
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        return None
    digest = getattr(merges, "sha256", None)
    if digest is None:
        import hashlib

        digest = hashlib.sha256("\n".join(merges).encode()).hexdigest()
    return f"{getattr(merges, 'length', None) or len(merges)} merges, sha256 {digest[:12]}"
