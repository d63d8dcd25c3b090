"""The speculative decoding loop, in a slot: one sequence at a time, reused across requests.

A Slot owns the target's KV cache and the draft model's (its contexts; a server's slots hold
sequences of one shared context per model: Engine.new_slots). A step reads like the papers:
propose (the policy chooses a drafter and a length), verify in one target pass (its rows under
the request's logit_bias, penalties and grammar), commit (commit.py: cut at an end-of-generation
token, max_tokens or a stop string; the logprobs of what was kept), observe, emit.

A generation is written as a generator of forward passes (steps.py): alone a slot runs them at
once (`Slot.stream`); a server's batch scheduler runs every slot's passes in one batch. Whoever
holds a slot asks it, never its contexts: what its cache can give a prompt (`reusable`), to
empty it (`forget_cache`), to warm it (`warm_steps`), which context its target's passes run on
(`target_group`), what its caches take (`cache_bytes`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

from . import steps
from .backends import Model
from .backends.base import Context, pass_group
from .backends.cache_reuse import plan_reuse
from .commit import Request, commit
from .config import DEFAULT_VERIFY, SamplingParams, SpecParams
from .drafters import EMPTY_DRAFT, Draft, Drafter, propose_steps
from .drafters.draft_model import DraftModelDrafter, GreedyAcceptance
from .drafters.forced import FORCED
from .drafters.suffix_store import SuffixStore
from .drafters.window import draft_contexts
from .grammar import Constraint, for_request
from .logprobs import TokenLogprob
from .policy import OFF, Choice, Outcome, Policy, ask_offers, judge
from .processors import LogitRules, with_bias_text
from .sampling import Sampler
from .stats import GenerationStats
from .text import StreamDecoder
from .verifier import Verdict, verify

# (slot, spec, the request's grammar constraint or None) -> the request's drafters by name
DrafterFactory = Callable[["Slot", SpecParams, "Constraint | None"], "dict[str, Drafter]"]

_SHADOW_MAX = 64  # tokens of a lookup's proposal judged unasked (Outcome.shadow): its longest draft under auto


class SlotEngine(Protocol):
    """What a slot and its drafters need of the engine that made it (engine.Engine)."""

    target: Model
    draft: Model | None
    n_ctx: int
    cache_reuse: int  # --cache-reuse N (backends/cache_reuse.py)
    draft_window: int  # --draft-ctx N (drafters/window.py)
    n_ubatch: int  # -ub N: the target's micro-batch
    n_ubatch_draft: int  # -ubd N: the draft's
    suffix_store: SuffixStore | None
    greedy_acceptance: GreedyAcceptance
    make_drafters: DrafterFactory

    def grammar_tokenizer(self): ...

    def policy_for(self, spec: SpecParams, temperature: float = 0.0, grammar: bool = False,
                   prompt: Sequence[int] | None = None) -> Policy: ...

    def check_pairing_at_run_time(self) -> None: ...


class ContextOverflow(ValueError):
    """The prompt does not fit the context."""


@dataclass
class Chunk:
    """What one step produced: token ids and the text that became final. The first n_drafted
    tokens were drafted by `drafter` and kept; the rest (at most one) the target wrote itself.
    logprobs: one per token, when the request asks (SamplingParams.logprobs; logprobs.py). They follow
    `tokens`, not `text`: text held back for a stop string comes in a later chunk."""

    tokens: list[int]
    text: str
    drafter: str | None = None
    n_drafted: int = 0
    note: dict | None = None  # where the drafter found its draft (Draft.note: a lookup's earlier text), for the trace
    logprobs: list[TokenLogprob] | None = None


@dataclass
class Generation:
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stats: GenerationStats = field(default_factory=GenerationStats)


class Slot:
    """One sequence at a time: reused across requests, keeping whatever prefix matches."""

    def __init__(self, engine: SlotEngine, ctx: Context | None = None, draft_ctx: Context | None = None):
        """Contexts of its own, or the given ones (sequences of shared contexts: Engine.new_slots)."""
        self.engine = engine
        self.ctx = ctx if ctx is not None else engine.target.new_context(engine.n_ctx, n_ubatch=engine.n_ubatch)
        if draft_ctx is None:
            draft_ctx = draft_contexts(engine.draft, engine.n_ctx, engine.draft_window,
                                       n_ubatch=engine.n_ubatch_draft)[0]
        self.draft_ctx = draft_ctx  # None without a draft model; a WindowedContext under --draft-ctx

    def drafters(self, spec: SpecParams, constraint: Constraint | None = None) -> dict[str, Drafter]:
        """A request's fresh drafters, by the engine's factory (Engine(drafters=...))."""
        return self.engine.make_drafters(self, spec, constraint)

    # --- what a server asks of its slots (never their contexts) ---

    def reusable(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` the target's cache can give a prompt: its prefix, and runs that moved
        under --cache-reuse."""
        return plan_reuse(self.ctx.tokens, tokens, self.engine.cache_reuse)[0]

    def forget_cache(self) -> int:
        """Empty the caches, the target's and the draft model's, so that the next prompt is evaluated
        from its first token; the number of tokens the target's held."""
        n = len(self.ctx.tokens)
        self.ctx.truncate(0)
        if self.draft_ctx is not None:
            self.draft_ctx.truncate(0)
        return n

    def target_group(self) -> object:
        """What the target's passes run on: the shared context the slot holds a sequence of, or its own
        (a batch scheduler tells the target's passes from the draft model's by it: steps.Eval.group)."""
        return pass_group(self.ctx)

    def cache_bytes(self) -> int:
        """KV cache and compute buffers of the slot's contexts, the target's and the draft model's."""
        uses = [c.memory() for c in (self.ctx, self.draft_ctx) if c is not None]
        return sum(u.kv_cache + u.compute for u in uses)

    def warm_steps(self, tokens: list[int], stats: GenerationStats) -> steps.Steps:
        """Put `tokens` into the caches, the target's and the draft model's, without generating (a
        server's warm request: llama.vim sends /infill with `n_predict: 0` when its extra context
        changes): each then holds all but the last token, as a generation over `tokens` would leave
        them before its first step, so that the next request with this prefix evaluates only what is new."""
        stats.n_prompt = len(tokens)
        t0 = time.perf_counter()
        try:
            stats.n_cached = yield from steps.sync_prefix(self.ctx, tokens[:-1], self.engine.cache_reuse)
            stats.t_prompt = time.perf_counter() - t0
            if self.draft_ctx is not None:
                t = time.perf_counter()
                drafter = DraftModelDrafter(self.engine.draft, self.draft_ctx, cache_reuse=self.engine.cache_reuse)
                yield from drafter.prefill_steps(tokens)
                stats.t_prompt_draft = stats.t_draft = time.perf_counter() - t
            stats.finish_reason = "length"
        finally:
            stats.t_total = time.perf_counter() - t0

    def _forward_seconds(self) -> float:
        """Seconds this slot's contexts have spent in forward passes."""
        return sum(c.t_eval for c in (self.ctx, self.draft_ctx) if c is not None)

    def tokenize_prompt(self, prompt: str | Sequence[int], parse_special: bool = False) -> list[int]:
        if isinstance(prompt, str):
            return self.engine.target.tokenize(prompt, add_special=True, parse_special=parse_special)
        return list(prompt)

    def generate(self, prompt: str | Sequence[int], params: SamplingParams, spec: SpecParams,
                 verify_method: str = DEFAULT_VERIFY) -> Generation:
        """Run to completion and return tokens, text and stats."""
        gen = Generation()
        stream = self.stream(prompt, params, spec, verify_method, stats=gen.stats)
        for chunk in stream:
            gen.tokens.extend(chunk.tokens)
            gen.text += chunk.text
        return gen

    def stream(self, prompt: str | Sequence[int], params: SamplingParams, spec: SpecParams,
               verify_method: str = DEFAULT_VERIFY, stats: GenerationStats | None = None) -> Iterator[Chunk]:
        """Yield a Chunk per step. Closing the iterator stops generation at once."""
        return steps.drive(self.generate_steps(prompt, params, spec, verify_method, stats))

    def generate_steps(self, prompt: str | Sequence[int], params: SamplingParams, spec: SpecParams,
                       verify_method: str = DEFAULT_VERIFY, stats: GenerationStats | None = None) -> steps.Steps:
        """The generation as a generator: it yields each forward pass it needs (steps.Eval, to be sent
        the logits) and each step's Chunk (sent None). `stream` runs the passes at once; the server's
        batch scheduler runs those of all its slots together. Closing it stops generation at once."""
        engine = self.engine
        stats = stats if stats is not None else GenerationStats()
        seq = self.tokenize_prompt(prompt)
        if not seq:
            raise ValueError("empty prompt")
        if len(seq) >= engine.n_ctx:
            raise ContextOverflow(f"prompt is {len(seq)} tokens but the context holds {engine.n_ctx}")
        params = with_bias_text(params, engine.target)
        LogitRules.check(params, engine.target.vocab.n_vocab)
        constraint = for_request(params, engine.grammar_tokenizer, engine.target)
        policy = engine.policy_for(spec, params.temperature, grammar=params.grammar is not None, prompt=seq)
        req = Request(Sampler(params, verify_method), StreamDecoder(engine.target.token_bytes, params.stop,
                                                                    skip=len(params.heal)),
                      frozenset() if params.ignore_eos else engine.target.vocab.eog,
                      self.drafters(spec, constraint), policy, constraint)
        stats.n_prompt = len(seq)
        t0 = time.perf_counter()
        # Prompt: the target's cache holds everything but the last token, which each step feeds.
        stats.n_cached = yield from steps.sync_prefix(self.ctx, seq[:-1], engine.cache_reuse)
        stats.t_prompt = time.perf_counter() - t0
        forward0 = self._forward_seconds()
        yield from self._prefill_drafters(req, seq, params.max_tokens, stats)
        try:
            while True:
                if constraint is not None and constraint.stuck():  # no token can follow: say why
                    stats.finish_reason = "stop"
                    break
                choice, draft = yield from self._propose(req, seq, params.max_tokens - stats.n_generated, stats)
                verdict = yield from self._verify(req, seq, draft, stats)
                new, text, finish = commit(req, seq, verdict, params.max_tokens - stats.n_generated, engine.n_ctx)
                logprobs = req.take_logprobs(new, verdict)
                self._observe(req, choice, draft, verdict, len(new), stats)
                if not stats.t_first_token and new:
                    stats.t_first_token = time.perf_counter() - t0
                if new or text:
                    yield Chunk(new, text, choice.drafter, min(verdict.n_accepted, len(new)), draft.note, logprobs)
                if finish:
                    stats.finish_reason = finish
                    break
        finally:
            stats.t_total = time.perf_counter() - t0
            stats.t_forward = self._forward_seconds() - forward0
            stats.predicted_tokens_per_s = policy.predicted_tokens_per_s
            policy.finish()
            stats.stop_word = req.decoder.stop_word
            if constraint is not None:
                stats.t_grammar, stats.grammar_error = constraint.seconds, constraint.error
            if not stats.finish_reason:
                stats.finish_reason = "cancelled"
            elif engine.suffix_store is not None and spec.cross_request:  # finished: later requests may draft from it
                engine.suffix_store.add(seq[: stats.n_prompt], seq[stats.n_prompt:], spec.cross_request_scope)

    def _prefill_drafters(self, req: Request, seq: list[int], max_tokens: int,
                          stats: GenerationStats) -> steps.Steps:
        """A drafter about to be used takes the prompt now, in one batch (what it would otherwise catch up
        on at its first step), if the policy says so, having seen the lookups' offers (the same request
        again is copied, with nothing left to a draft model). Its time counts as drafting, as llama-server's."""
        ask_offers(req.policy, req.drafters, seq)
        for name, drafter in req.drafters.items():
            missing = drafter.missing(seq)
            if req.policy.prefill(name, missing, max_tokens):
                t, meter = time.perf_counter(), steps.Meter()
                yield from steps.metered(drafter.prefill_steps(seq), meter)
                t = meter.cost(time.perf_counter() - t)
                stats.t_prompt_draft += t
                stats.t_draft += t
                req.policy.prefilled(name, missing, t)

    def _propose(self, req: Request, seq: list[int], n_left: int, stats: GenerationStats) -> steps.Steps:
        """The policy's choice and the chosen drafter's draft, at most what the context and max_tokens
        leave room for. Returns (Choice, Draft)."""
        req.shadow, req.forced = {}, 0
        # what the lookups would draft now (the policy is told), and each match's proposal, judged after the step
        offers = ask_offers(req.policy, req.drafters, seq)
        req.shadow = {name: req.drafters[name].propose(seq, _SHADOW_MAX, req.sampler).tokens
                      for name, o in offers.items() if o[0]}
        choice = req.policy.choose()
        k = min(choice.k, self.engine.n_ctx - len(seq) - 1, n_left - 1)  # the verified token needs room too
        t, meter = time.perf_counter(), steps.Meter()
        draft = EMPTY_DRAFT
        if k > 0:
            proposal = propose_steps(req.drafters[choice.drafter], seq, k, req.sampler, choice.stop)
            draft = yield from steps.metered(proposal, meter)
            if req.constraint is not None and choice.drafter != FORCED:  # the forced run it led with
                req.forced = len(req.constraint.forced(k))
        req.t_draft = meter.cost(time.perf_counter() - t)  # in a batch: this slot's share of the passes
        stats.t_draft += req.t_draft
        return (Choice(choice.drafter, k) if k > 0 else OFF), draft

    def _verify(self, req: Request, seq: list[int], draft: Draft, stats: GenerationStats) -> steps.Steps:
        """One target pass over the last committed token and the draft, then the verdict."""
        t = time.perf_counter()
        n_vocab = self.engine.target.vocab.n_vocab
        # a token the target cannot produce (a draft with a larger vocabulary) is rejected: score none after it
        n_eval = next((i for i, x in enumerate(draft.tokens) if not 0 <= x < n_vocab), len(draft))
        op = steps.Eval(self.ctx, [seq[-1], *draft.tokens[:n_eval]], "all")
        t_wait = time.perf_counter()
        logits = yield op  # [n_eval + 1, n_vocab]
        t_wait = time.perf_counter() - t_wait
        if req.raw_logprobs:  # read after the commit, before the next pass
            req.rows = logits
        if req.sampler.rules is not None:  # logit_bias and penalties, each row after its own draft prefix
            logits = req.sampler.rules.apply(logits, seq, draft.tokens[:n_eval])
        if req.constraint is not None:  # each row under the grammar state its draft prefix reaches
            logits = req.constraint.masked(logits, draft.tokens[:n_eval])
        verdict = verify(draft.tokens, draft.dists, logits, req.sampler, len(seq))
        self.ctx.truncate(len(seq) + verdict.n_accepted)  # the new last token stays pending
        req.t_verify = time.perf_counter() - t - t_wait + op.seconds  # in a batch: this slot's share
        stats.t_verify += req.t_verify
        return verdict

    def _observe(self, req: Request, choice: Choice, draft: Draft, verdict: Verdict, n_kept: int,
                 stats: GenerationStats) -> None:
        """Tell the drafter, the policy and the stats what the step did. The policy learns the draft's
        real acceptance; the stats count only positions up to where the text ended."""
        if draft.tokens:
            req.drafters[choice.drafter].accepted(verdict.n_accepted)
        committed = verdict.tokens[:n_kept]
        shadow = {name: judge(tokens, committed) for name, tokens in req.shadow.items() if name != choice.drafter}
        req.policy.observe(Outcome(choice, len(draft), verdict.n_accepted, req.t_draft, req.t_verify,
                                   draft.confidence, shadow or None, verdict.target_top, req.forced))
        stats.record_step(choice.drafter or "none", choice.k, min(len(draft), n_kept), min(verdict.n_accepted, n_kept))
        stats.n_generated += n_kept
        self.engine.check_pairing_at_run_time()

    def close(self) -> None:
        self.ctx.close()
        if self.draft_ctx is not None:
            self.draft_ctx.close()
