"""The speculative decoding loop.

An Engine owns the loaded models; a Slot owns one sequence's state (the target's
KV cache, the draft model's cache, the n-gram index). A step reads like the papers:
choose a drafter and length, propose, verify in one target pass, commit, emit.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from .backends import Model, load_model
from .config import ModelConfig, SamplingParams, SpecParams
from .controller import Controller
from .drafters import EMPTY_DRAFT, Drafter
from .drafters.draft_model import DraftModelDrafter, sync_prefix
from .drafters.ngram import NgramDrafter
from .drafters.suffix import SuffixDrafter
from .drafters.suffix_store import SuffixStore
from .policy import OFF, Choice, FixedPolicy, Outcome, Policy
from .stats import GenerationStats
from .text import StreamDecoder
from .verifier import verify

log = logging.getLogger("specserve")

# A same-family draft accepts 60-95% of its greedy drafts; below this after enough
# drafted tokens, the pair is probably wrong (a subtle tokenizer mismatch, say).
_PAIRING_WARN_ACCEPTANCE = 0.25
_PAIRING_WARN_AFTER = 300


class ContextOverflow(ValueError):
    """The prompt does not fit the context."""


@dataclass
class Chunk:
    """What one step produced: token ids and the text that became final."""

    tokens: list[int]
    text: str


@dataclass
class Generation:
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stats: GenerationStats = field(default_factory=GenerationStats)


class Engine:
    def __init__(self, target: Model, draft: Model | None = None, n_ctx: int = 4096, controller=None,
                 suffix_store: SuffixStore | None = None):
        self.target = target
        self.draft = draft
        self.n_ctx = n_ctx
        self.suffix_store = suffix_store  # earlier requests' text for the suffix drafter, shared by slots; None: off
        self.controller = controller if controller is not None else Controller()  # --spec auto, shared by slots
        weights = (getattr(target, "weights_bytes", 0), getattr(draft, "weights_bytes", 0))
        if draft is not None and all(weights) and self.controller is not None:
            self.controller.cost_ratio.setdefault("draft", min(weights[1] / weights[0], 1.0))
        self._greedy_drafted = 0
        self._greedy_accepted = 0
        self._pairing_warned = False

    @classmethod
    def load(cls, cfg: ModelConfig) -> "Engine":
        target = load_model(cfg.target_path, cfg.n_gpu_layers, cfg.n_threads)
        draft = load_model(cfg.draft_path, cfg.n_gpu_layers_draft, cfg.n_threads) if cfg.draft_path else None
        store = SuffixStore(cfg.cross_request_bytes) if cfg.cross_request_bytes else None
        return cls(target, draft, cfg.n_ctx, suffix_store=store)

    @property
    def drafter_names(self) -> list[str]:
        return (["draft"] if self.draft is not None else []) + ["ngram"]

    def new_slot(self) -> "Slot":
        return Slot(self)

    def policy_for(self, spec: SpecParams, temperature: float = 0.0) -> Policy:
        if spec.mode == "none" or spec.draft_max == 0:
            return FixedPolicy(None, 0)
        if spec.mode == "draft":
            if self.draft is None:
                raise ValueError("speculative mode 'draft' needs a draft model (-md)")
            return FixedPolicy("draft", spec.draft_max)
        if spec.mode == "ngram":
            return FixedPolicy("ngram", spec.draft_max)
        if spec.mode == "suffix":
            return FixedPolicy("suffix", spec.suffix_max)
        if self.controller is not None:
            return self.controller.policy(spec, self.drafter_names, temperature)
        return FixedPolicy(self.drafter_names[0], spec.draft_max)

    def note_greedy_acceptance(self, n_drafted: int, n_accepted: int) -> None:
        """Warn once if a draft model's greedy acceptance is far below a same-family pair's."""
        self._greedy_drafted += n_drafted
        self._greedy_accepted += n_accepted
        if self._pairing_warned or self._greedy_drafted < _PAIRING_WARN_AFTER:
            return
        rate = self._greedy_accepted / self._greedy_drafted
        if rate < _PAIRING_WARN_ACCEPTANCE:
            self._pairing_warned = True
            log.warning(
                "draft model acceptance at temperature 0 is %.0f%% over %d drafted tokens; a same-family "
                "pair accepts 60-95%%. The draft may not match the target (run `specserve check`).",
                100 * rate, self._greedy_drafted,
            )

    def close(self) -> None:
        for m in (self.target, self.draft):
            if m is not None:
                m.close()


class Slot:
    """One sequence at a time: reused across requests, keeping whatever prefix matches."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.ctx = engine.target.new_context(engine.n_ctx)
        self.draft_ctx = engine.draft.new_context(engine.n_ctx) if engine.draft is not None else None

    def _drafters(self, spec: SpecParams) -> dict[str, Drafter]:
        """Fresh per-request drafters; the draft model's KV cache outlives them in the slot."""
        drafters: dict[str, Drafter] = {"ngram": NgramDrafter(spec.ngram_min, spec.ngram_max)}
        if self.draft_ctx is not None:
            drafters["draft"] = DraftModelDrafter(self.engine.draft, self.draft_ctx, spec.draft_p_min, spec.draft_min)
        store = self.engine.suffix_store if spec.cross_request else None
        drafters["suffix"] = SuffixDrafter(store, spec.cross_request_scope, cap=spec.suffix_max)  # indexes lazily
        return drafters

    def tokenize_prompt(self, prompt: str | Sequence[int], parse_special: bool = False) -> list[int]:
        if isinstance(prompt, str):
            return self.engine.target.tokenize(prompt, add_special=True, parse_special=parse_special)
        return list(prompt)

    def generate(self, prompt: str | Sequence[int], params: SamplingParams, spec: SpecParams,
                 verify_method: str = "rejection") -> Generation:
        """Run to completion and return tokens, text and stats."""
        gen = Generation()
        stream = self.stream(prompt, params, spec, verify_method, stats=gen.stats)
        for chunk in stream:
            gen.tokens.extend(chunk.tokens)
            gen.text += chunk.text
        return gen

    def stream(self, prompt: str | Sequence[int], params: SamplingParams, spec: SpecParams,
               verify_method: str = "rejection", stats: GenerationStats | None = None) -> Iterator[Chunk]:
        """Yield a Chunk per step. Closing the iterator stops generation at once."""
        engine, ctx = self.engine, self.ctx
        stats = stats if stats is not None else GenerationStats()
        seq = self.tokenize_prompt(prompt)
        if not seq:
            raise ValueError("empty prompt")
        if len(seq) >= engine.n_ctx:
            raise ContextOverflow(f"prompt is {len(seq)} tokens but the context holds {engine.n_ctx}")
        policy = engine.policy_for(spec, params.temperature)
        rng = np.random.default_rng(params.seed)
        decoder = StreamDecoder(engine.target.token_bytes, params.stop)
        eog = frozenset() if params.ignore_eos else engine.target.vocab.eog
        drafters = self._drafters(spec)
        stats.n_prompt = len(seq)
        t0 = time.perf_counter()

        # Prompt: the target's cache holds everything but the last token, which each step feeds.
        stats.n_cached = sync_prefix(ctx, seq[:-1])
        stats.t_prompt = time.perf_counter() - t0
        # A draft model about to be used takes the prompt now, in one batch (what it would
        # otherwise catch up on at its first step). Its time counts as drafting, as llama-server's does.
        draft_model = drafters.get("draft")
        if draft_model is not None:
            missing = draft_model.missing(seq)
            if policy.prefill("draft", missing, params.max_tokens):
                t_draft_prompt = time.perf_counter()
                draft_model.prefill(seq)
                stats.t_prompt_draft = time.perf_counter() - t_draft_prompt
                stats.t_draft += stats.t_prompt_draft
                policy.prefilled("draft", missing, stats.t_prompt_draft)
        n_out = 0
        try:
            while True:
                room = engine.n_ctx - len(seq)  # positions left for this step's 1 + k tokens
                if room <= 0:
                    stats.finish_reason = "length"
                    break
                if policy.sees_ngram:  # what prompt lookup would draft now: a dict lookup
                    policy.see_ngram(*drafters["ngram"].match(seq))
                choice = policy.choose()
                k = min(choice.k, room - 1, params.max_tokens - n_out - 1)
                t_step = time.perf_counter()
                draft = drafters[choice.drafter].propose(seq, k, params, rng) if k > 0 else EMPTY_DRAFT
                t_drafted = time.perf_counter()
                logits = ctx.eval([seq[-1], *draft.tokens], logits="all")
                verdict = verify(draft.tokens, draft.probs, logits, params, rng, verify_method)
                t_verified = time.perf_counter()
                ctx.truncate(len(seq) + verdict.n_accepted)  # the new last token stays pending
                if draft.tokens:
                    drafters[choice.drafter].accepted(verdict.n_accepted)
                stats.t_draft += t_drafted - t_step
                stats.t_verify += t_verified - t_drafted
                stats.record_step(choice.drafter or "none", k, len(draft), verdict.n_accepted)
                policy.observe(Outcome(Choice(choice.drafter, k) if k > 0 else OFF, len(draft), verdict.n_accepted,
                                       t_drafted - t_step, t_verified - t_drafted))
                if choice.drafter == "draft" and params.greedy and draft.tokens:
                    engine.note_greedy_acceptance(len(draft), verdict.n_accepted)

                new = verdict.tokens[: params.max_tokens - n_out]
                finish = None
                for i, t in enumerate(new):
                    if t in eog:
                        new, finish = new[:i], "stop"
                        break
                seq.extend(new)
                n_out += len(new)
                text = decoder.push(new)
                if decoder.stopped:
                    finish = "stop"
                elif finish is None and n_out >= params.max_tokens:
                    finish = "length"
                if finish:
                    text += decoder.flush()
                if n_out and not stats.t_first_token:
                    stats.t_first_token = time.perf_counter() - t0
                stats.n_generated = n_out
                if new or text:
                    yield Chunk(new, text)
                if finish:
                    stats.finish_reason = finish
                    break
        finally:
            stats.n_generated = n_out
            stats.t_total = time.perf_counter() - t0
            stats.predicted_tokens_per_s = policy.predicted_tokens_per_s
            if not stats.finish_reason:
                stats.finish_reason = "cancelled"
            elif engine.suffix_store is not None and spec.cross_request:  # finished: later requests may draft from it
                engine.suffix_store.add(seq[: stats.n_prompt], seq[stats.n_prompt:], spec.cross_request_scope)

    def close(self) -> None:
        self.ctx.close()
        if self.draft_ctx is not None:
            self.draft_ctx.close()
