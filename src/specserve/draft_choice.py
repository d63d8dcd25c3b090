"""Which of the models at hand should draft for a target: `-md auto`.

Candidates are GGUF paths (the packaged models, a folder's, or what the router discovers). Each is
judged in the order of what it costs to find out:

1. its GGUF header, read without loading anything: a different tokenizer model or a vocabulary
   larger or smaller than padding allows is refused there (pairing.py's flagrant rules);
   more parameters than the target's, or a decode pass costing more than `max_cost` of the target's,
   excludes it (a draft's job is to be cheap);
2. the cost of one of its passes against the target's: measured where `--spec auto` kept a profile
   for this pair on this machine (learned.py), else estimated as the bytes of weights a decode step
   reads (a CPU decode is bound by memory bandwidth; the engine's prior is the same ratio);
3. its memory at the draft's context (memory.py's estimate), which must fit beside the target's;
4. the whole pairing check (pairing.check_pairing) on both vocabularies, loaded without weights:
   flagrant mismatches exclude it, subtle ones are kept as its warnings.

The pairable ones are ranked: one that `bench --drafts auto` pinned for this target first, then those
without subtle mismatches (which make drafts rarely accepted; a differing chat template does not, the
draft never renders one), each group cheapest first. Every candidate carries a one-line reason.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from .config import DRAFT_CTX_DEFAULT, UBATCH_DRAFT_DEFAULT
from .memory import ModelShape, cells, estimate, fmt_bytes
from .pairing import VOCAB_PADDING, check_pairing

MAX_COST = 0.5  # a draft pass above half a target pass rarely pays, whatever its acceptance
_HARMLESS = ("chat template differs",)  # warnings that do not lower acceptance (the draft renders no template)


@dataclass(frozen=True)
class Candidate:
    """One candidate draft and what was found about it."""

    name: str
    path: str
    cost: float | None = None  # one draft pass / one target pass
    cost_source: str = ""  # "measured" (an auto profile) or "estimated" (weights read per token)
    memory: int | None = None  # bytes it adds: weights, KV cache at the draft's context, compute buffer
    warnings: tuple[str, ...] = ()  # subtle mismatches (pairing.py): it pairs, but may draft badly
    excluded: str | None = None  # why it cannot or should not draft (None: it pairs)
    reason: str = ""  # one line: why it ranks where it does, or why it is excluded
    pinned: bool = False  # `bench --drafts auto` measured it the best for this target

    @property
    def flagged(self) -> bool:
        return any(not w.startswith(_HARMLESS) for w in self.warnings)

    def as_dict(self) -> dict:
        return {**asdict(self), "warnings": list(self.warnings), "flagged": self.flagged}


@dataclass(frozen=True)
class DraftChoice:
    """The outcome for one target: the chosen draft (None: run without one), the pairable candidates
    best first, the excluded ones, and the reason for the choice."""

    target: str
    chosen: Candidate | None
    ranked: tuple[Candidate, ...] = ()
    excluded: tuple[Candidate, ...] = ()
    reason: str = ""
    mode: str = "auto"  # "auto"; "none": -md none or no -md; "given": -md FILE

    @property
    def draft_path(self) -> str | None:
        return self.chosen.path if self.chosen else None

    def as_dict(self) -> dict:
        """Everything, paths included: for the router and tools on this host (`public` is what clients see)."""
        return {"mode": self.mode, "chosen": self.chosen.name if self.chosen else None,
                "path": self.draft_path, "reason": self.reason,
                "candidates": [c.as_dict() for c in self.ranked],
                "excluded": [c.as_dict() for c in self.excluded]}

    def public(self) -> dict:
        """The `draft_choice` object of /props, /api/show and /api/ps: as_dict with file names, never paths (a
        path tells a client about the host's folders)."""
        def one(c: Candidate) -> dict:
            d = c.as_dict()
            d["file"] = Path(d.pop("path")).name
            return d

        return {"mode": self.mode, "chosen": self.chosen.name if self.chosen else None,
                "file": Path(self.chosen.path).name if self.chosen else None, "reason": self.reason,
                "candidates": [one(c) for c in self.ranked], "excluded": [one(c) for c in self.excluded]}

    def lines(self) -> list[str]:
        """What `-md auto` prints at start: the choice, then each candidate's reason."""
        out = [f"draft: {self.reason}"]
        out += [f"draft:   {'*' if c is self.chosen else ' '} {c.reason}" for c in self.ranked]
        out += [f"draft:   - {c.reason}" for c in self.excluded]
        return out


def none_choice(target: str, reason: str = "none: no draft model (-md none)") -> DraftChoice:
    return DraftChoice(target, None, reason=reason, mode="none")


def of_engine(engine) -> dict:
    """The `draft_choice` object the APIs show: -md auto's choice, or what -md gave (or did not)."""
    choice = getattr(engine, "draft_choice", None)
    if choice is None:
        target = engine.target.path
        if engine.draft is None:
            choice = none_choice(target, "none: no draft model given (-md)")
        else:
            given = Candidate(display_name(engine.draft.path), engine.draft.path, reason="given with -md")
            choice = DraftChoice(target, given, (given,), reason=f"{given.name}: given with -md", mode="given")
    return choice.public()


def candidate_paths(target: str | os.PathLike, dirs: Iterable[str | os.PathLike] = (),
                    packaged: bool = True) -> list[str]:
    """The GGUF files a target's draft may be chosen from, without the target itself: the packaged models
    that are pulled, each file in `dirs` (a store's blob needs no .gguf name) and every *.gguf in a folder
    there and in the target's own folder (the first part only of a model split in parts). The router
    passes its discovered models instead."""
    from . import models

    found: list[Path] = []
    if packaged:
        found += [e.path for e in models.list_models() if e.present]
    for d in [*dirs, Path(target).parent]:
        d = Path(d).expanduser()
        if d.is_dir():
            found += sorted(p for p in d.glob("*.gguf") if p.is_file() and _first_part(p.name))
        elif d.is_file():
            found.append(d)
    seen, out = {_identity(target)}, []
    for p in found:
        key = _identity(p)
        if key not in seen:
            seen.add(key)
            out.append(str(p))
    return out


def _first_part(name: str) -> bool:
    """llama.cpp's split files are NAME-00001-of-00003.gguf: only the first names the model."""
    stem = name[:-len(".gguf")]
    head, _, of = stem.rpartition("-of-")
    return not (of.isdigit() and head[-5:].isdigit()) or head.endswith("-00001")


def _identity(path) -> tuple:
    try:
        st = os.stat(path)
        return st.st_dev, st.st_ino
    except OSError:
        return (os.path.realpath(path),)


def display_name(path: str) -> str:
    """The packaged model's name where it is one, else the file name without .gguf."""
    from . import models

    p = Path(path)
    for spec in models.MODELS:
        if spec.filename == p.name:
            return spec.name
    return p.name[:-5] if p.name.endswith(".gguf") else p.name


def decode_bytes(path: str | os.PathLike) -> tuple[int, int]:
    """(bytes of weights one decode step reads, parameters). The token embedding is only gathered from,
    one row a token, unless the model has no output matrix of its own and multiplies by it (tied)."""
    from .gguf_meta import read_header

    tensors = read_header(path).tensors
    tied = not any(t.name == "output.weight" for t in tensors)
    read = sum(max(t.n_bytes, 0) for t in tensors if tied or not t.name.startswith("token_embd"))
    return read, sum(t.n_elements for t in tensors)


def measured_cost(target: str, draft: str, n_threads: int) -> float | None:
    """One draft token's seconds / one 1-token target pass's, from the auto profile `--spec auto` kept for
    this pair on this machine; None where there is none (or it has not timed the draft)."""
    from . import learned
    from .auto.cost import Costs

    if not learned.enabled():
        return None
    try:
        state = learned.ProfileStore.for_models(target, draft, n_threads).load()
        if not state or "draft" not in state.get("draft_cost", {}):
            return None
        costs = Costs.from_state(state, 1.0, {})
        V = costs.verify.table(2)
        if not V or V[1] <= 0:
            return None
        return costs.draft_coef("draft", V)[1] / V[1]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def _header_vocab(meta: dict) -> tuple[str | None, int | None]:
    tokens = meta.get("tokenizer.ggml.tokens")
    n = len(tokens) if isinstance(tokens, list) else getattr(tokens, "length", None)
    return meta.get("tokenizer.ggml.model"), n


def choose_draft(target: str, candidates: Sequence[str], *, n_ctx: int = 4096, draft_ctx: int = DRAFT_CTX_DEFAULT,
                 n_ubatch_draft: int = UBATCH_DRAFT_DEFAULT, n_threads: int | None = None,
                 budget: int | None = None, max_cost: float = MAX_COST, target_memory: int = 0,
                 pinned: str | None = None, names: Mapping[str, str] | None = None) -> DraftChoice:
    """Judge each candidate for `target` (module docstring) and choose the best.

    names: {path: name} for candidates known by another name than their file's (a store's model names).
    budget: bytes the target and its draft may take together (None: no limit); target_memory: the
    target's own estimate, counted against it. pinned: a path `bench --drafts auto` chose (draft_pins)."""
    from .gguf_meta import read_metadata

    n_threads = n_threads or max(1, os.cpu_count() or 1)
    t_read, t_params = decode_bytes(target)
    t_tok, t_vocab = _header_vocab(read_metadata(target))
    pin = _identity(pinned) if pinned else None
    judged: list[Candidate] = []
    for path in candidates:
        name = (names or {}).get(str(path)) or display_name(path)
        c = Candidate(name, str(path))
        try:
            meta = read_metadata(path)
            d_read, d_params = decode_bytes(path)
        except (OSError, ValueError) as e:
            judged.append(_out(c, f"not a GGUF file llama.cpp can read ({e})"))
            continue
        d_tok, d_vocab = _header_vocab(meta)
        if d_tok != t_tok:
            judged.append(_out(c, f"vocabulary mismatch: tokenizer model {d_tok}, the target's {t_tok}"))
            continue
        if d_vocab is None or t_vocab is None or abs(d_vocab - t_vocab) > VOCAB_PADDING:
            judged.append(_out(c, f"vocabulary mismatch: {d_vocab} tokens, the target's {t_vocab}"))
            continue
        if d_params > t_params:
            judged.append(_out(c, f"larger than the target ({_params(d_params)} parameters, the target "
                                  f"{_params(t_params)})"))
            continue
        cost, source = measured_cost(target, path, n_threads), "measured"
        if cost is None:
            cost, source = d_read / t_read, "estimated"
        c = Candidate(name, str(path), cost, source, pinned=pin is not None and _identity(path) == pin)
        if cost > max_cost and not c.pinned:
            judged.append(_out(c, f"too costly: a pass costs {cost:.2f} of the target's ({source}), above "
                                  f"{max_cost:g}"))
            continue
        try:
            mem = estimate(ModelShape.from_gguf(path), cells(n_ctx, draft_ctx), n_ubatch=n_ubatch_draft).total
        except (OSError, ValueError) as e:
            judged.append(_out(c, f"cannot estimate its memory ({e})"))
            continue
        c = _with(c, memory=mem)
        if budget is not None and target_memory + mem > budget:
            judged.append(_out(c, f"does not fit: the target {fmt_bytes(target_memory)} + this draft "
                                  f"{fmt_bytes(mem)} > the budget {fmt_bytes(budget)}"))
            continue
        judged.append(c)
    judged = _check_vocabularies(target, judged)
    ok = sorted((c for c in judged if c.excluded is None), key=lambda c: (not c.pinned, c.flagged, c.cost))
    out = tuple(c for c in judged if c.excluded is not None)
    ok = [_with(c, reason=_reason(c, t_read)) for c in ok]
    if not ok:
        why = "no candidate pairs with the target" if judged else "no candidate models were found"
        return DraftChoice(str(target), None, (), out, f"none: {why}; running without a draft model "
                           "(n-gram and suffix drafting stay on)")
    best = ok[0]
    if best.pinned:
        why = "pinned by `specserve bench --drafts auto` as the fastest end to end"
    else:
        why = f"the cheapest of {len(ok)} pairable candidate(s)" if len(ok) > 1 else "the only pairable candidate"
        if best.flagged:
            why += " (every one has subtle vocabulary differences)"
    return DraftChoice(str(target), best, tuple(ok), out,
                       f"{best.name}: {why}; {best.cost:.2f} of a target pass ({best.cost_source}), "
                       f"+{fmt_bytes(best.memory or 0)}")


def _check_vocabularies(target: str, judged: list[Candidate]) -> list[Candidate]:
    """The pairing check on the survivors, each vocabulary loaded without its weights."""
    from .backends.llama_cpp import LlamaCppModel

    if not any(c.excluded is None for c in judged):
        return judged
    t = LlamaCppModel(str(target), n_threads=1, vocab_only=True)
    try:
        out = []
        for c in judged:
            if c.excluded is not None:
                out.append(c)
                continue
            try:
                d = LlamaCppModel(c.path, n_threads=1, vocab_only=True)
            except (OSError, ValueError) as e:
                out.append(_out(c, f"llama.cpp cannot load it ({e})"))
                continue
            try:
                if not d.can_rollback:
                    out.append(_out(c, "a recurrent or hybrid model: it cannot drop rejected tokens"))
                    continue
                report = check_pairing(t, d)
            finally:
                d.close()
            if report.flagrant:
                out.append(_out(c, "vocabulary mismatch: " + "; ".join(report.problems)))
            else:
                out.append(_with(c, warnings=tuple(report.warnings)))
        return out
    finally:
        t.close()


def _with(c: Candidate, **kw) -> Candidate:
    return Candidate(**{**asdict(c), "warnings": c.warnings, **kw})


def _out(c: Candidate, why: str) -> Candidate:
    why = why.replace(c.path, Path(c.path).name)  # llama.cpp's and the header reader's messages name the path
    return _with(c, excluded=why, reason=f"{c.name}: excluded, {why}")


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def _reason(c: Candidate, t_read: int) -> str:
    how = ("timed by --spec auto on this machine" if c.cost_source == "measured"
           else f"weights read per token, {fmt_bytes(c.cost * t_read)} vs {fmt_bytes(t_read)}")
    line = f"{c.name}: a pass costs {c.cost:.2f} of the target's ({how}), +{fmt_bytes(c.memory or 0)} memory"
    if c.pinned:
        line += ", pinned by bench --drafts auto"
    if c.flagged:
        line += f"; flagged: {next(w for w in c.warnings if not w.startswith(_HARMLESS))}"
    elif c.warnings:
        line += "; its chat template differs (no matter: a draft renders none)"
    return line

