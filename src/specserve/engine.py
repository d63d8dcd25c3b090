"""The speculative decoding loop.

An Engine owns the loaded models; a Slot owns one sequence's state (the target's
KV cache, the draft model's cache). A step reads like the papers: propose (the
policy chooses a drafter and a length), verify in one target pass (its rows under the
request's logit_bias, penalties and grammar), commit (commit.py: cut at an
end-of-generation token, max_tokens or a stop string; the logprobs of what was kept),
observe, emit.

A slot's generation is written as a generator of forward passes (steps.py): alone it runs
them at once (`Slot.stream`); a server's slots share one context per model
(`Engine.new_slots`) and its batch scheduler runs every slot's passes in one batch.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from . import steps
from .backends import Model, load_model
from .backends.timing import token_seconds
from .commit import Request, commit
from .config import DEFAULT_VERIFY, DRAFT_CTX_DEFAULT, ModelConfig, SamplingParams, SpecParams
from .auto import Controller
from .auto.profile import learning_controller
from .drafters import EMPTY_DRAFT, Draft, Drafter, propose_steps
from .drafters.draft_model import DraftModelDrafter, GreedyAcceptance
from .drafters.forced import FORCED, with_grammar
from .drafters.hybrid import LOOKUPS, HybridDrafter
from .drafters.ngram import NgramDrafter
from .drafters.suffix import SuffixDrafter
from .drafters.suffix_store import SuffixStore
from .drafters.window import draft_contexts
from .grammar import Constraint, GrammarError, check, for_request
from .logprobs import TokenLogprob
from .policy import OFF, Choice, FixedPolicy, Outcome, Policy, ask_offers, judge
from .processors import LogitRules
from .sampling import Sampler
from .stats import GenerationStats
from .text import StreamDecoder
from .verifier import Verdict, verify

# (slot, spec, the request's grammar constraint or None) -> the request's drafters by name
DrafterFactory = Callable[["Slot", SpecParams, "Constraint | None"], "dict[str, Drafter]"]

log = logging.getLogger("specserve")

# A same-family draft accepts 60-95% of its greedy drafts; below this after enough
# drafted tokens, the pair is probably wrong (a subtle tokenizer mismatch, say).
_PAIRING_WARN_ACCEPTANCE = 0.25
_SHADOW_MAX = 64  # tokens of a lookup's proposal judged unasked (Outcome.shadow): its longest draft under auto
_PAIRING_WARN_AFTER = 300


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


class Engine:
    def __init__(self, target: Model, draft: Model | None = None, n_ctx: int = 4096, controller=None,
                 suffix_store: SuffixStore | None = None, drafters: DrafterFactory | None = None):
        """drafters: what builds a request's drafters in a slot (standard_drafters unless given)."""
        if draft is not None and not draft.can_rollback:
            raise ValueError(f"draft model {draft.path} has a recurrent or hybrid memory, which cannot drop "
                             "rejected tokens: it cannot draft")
        self.target = target
        self.draft = draft
        self.n_ctx = n_ctx
        self.cache_reuse = 0  # --cache-reuse N: slots keep moved runs of >= N cached tokens (backends/cache_reuse.py)
        # --draft-ctx N: the draft model's cache cells a slot (drafters/window.py)
        self.draft_window = DRAFT_CTX_DEFAULT
        self.suffix_store = suffix_store  # earlier requests' text for the suffix drafter, shared by slots; None: off
        self.make_drafters = drafters or standard_drafters
        self.controller = controller if controller is not None else Controller()  # --spec auto, shared by slots
        weights = (target.weights_bytes, draft.weights_bytes if draft is not None else 0)
        if draft is not None and all(weights) and self.controller is not None:
            self.controller.cost_ratio.setdefault("draft", min(weights[1] / weights[0], 1.0))
        # a saved profile's drafting cost is checked against the machine as it is now (learned.py), on the
        # thread that decodes: see calibrate()
        self._uncalibrated = draft is not None and self.controller.loaded
        self.can_speculate = target.can_rollback
        if not self.can_speculate:
            log.warning("target %s has a recurrent or hybrid memory, which cannot drop rejected tokens: "
                        "speculation is off", target.path)
        self.greedy_acceptance = GreedyAcceptance()  # the draft model's, for the run-time pairing warning
        self._pairing_warned = False

    @classmethod
    def load(cls, cfg: ModelConfig) -> "Engine":
        target = load_model(cfg.target_path, cfg.n_gpu_layers, cfg.n_threads)
        draft = load_model(cfg.draft_path, cfg.n_gpu_layers_draft, cfg.n_threads) if cfg.draft_path else None
        store = SuffixStore(cfg.cross_request_bytes) if cfg.cross_request_bytes else None
        engine = cls(target, draft, cfg.n_ctx, controller=learning_controller(cfg, target), suffix_store=store)
        engine.cache_reuse, engine.draft_window = cfg.cache_reuse, cfg.draft_ctx
        return engine

    @property
    def drafter_names(self) -> list[str]:
        return (["draft"] if self.draft is not None else []) + ["ngram", "suffix"] + (
            ["hybrid"] if self.draft is not None else [])

    def new_slot(self) -> "Slot":
        return Slot(self)

    def new_slots(self, n: int, n_batch: int = 512) -> list["Slot"]:
        """n slots whose caches are sequences of one context per model, so that their passes can be
        batched (at most n_batch tokens a pass); separate contexts where the backend cannot."""
        target = self.target.new_shared_context(self.n_ctx, n, n_batch)
        drafts = draft_contexts(self.draft, self.n_ctx, self.draft_window, n, n_batch) if target is not None else None
        if target is None or drafts is None:  # the backend cannot share a context: each slot has its own
            if target is not None:
                target.close()
            return [Slot(self) for _ in range(n)]
        return [Slot(self, target.seqs[i], drafts[i]) for i in range(n)]

    def calibrate(self) -> None:
        """Check a loaded profile's drafting cost against this machine now (a few 1-token passes of each
        model), once. Called on the thread that runs the passes: the first request's (policy_for), or
        the server's engine thread at start. llama.cpp's passes run ~1.5x slower in a process where
        two threads have run them (backends.llama_native.DecodeThreads), so none is run elsewhere."""
        if self._uncalibrated:
            self._uncalibrated = False
            self.controller.calibrate("draft", *token_seconds(self.draft, self.target))

    def policy_for(self, spec: SpecParams, temperature: float = 0.0, grammar: bool = False) -> Policy:
        if spec.mode == "none" or spec.draft_max == 0:
            return FixedPolicy(None, 0)
        if not self.can_speculate:
            if spec.mode == "auto":
                return FixedPolicy(None, 0)
            raise ValueError(f"speculative mode {spec.mode!r} needs a target whose cache can drop rejected tokens; "
                             f"{self.target.path} has a recurrent or hybrid memory (use mode 'none')")
        if spec.mode == "draft":
            if self.draft is None:
                raise ValueError("speculative mode 'draft' needs a draft model (-md)")
            return FixedPolicy("draft", spec.draft_max)
        if spec.mode == "ngram":
            return FixedPolicy("ngram", spec.draft_max)
        if spec.mode == "suffix":
            return FixedPolicy("suffix", spec.suffix_max)
        if self.controller is not None:
            self.calibrate()
            return self.controller.policy(spec, self.drafter_names + [FORCED] * grammar, temperature)
        return FixedPolicy(self.drafter_names[0], spec.draft_max)

    def check_grammar(self, grammar: str) -> None:
        """Raise GrammarError if `grammar` cannot constrain this target (its vocabulary included)."""
        check(grammar, "grammar", self.grammar_tokenizer())

    def grammar_tokenizer(self):
        tokenizer = self.target.grammar_tokenizer()  # built once per model and kept there
        if tokenizer is None:
            raise GrammarError(f"this backend cannot constrain generation ({self.target.path})")
        return tokenizer

    def check_pairing_at_run_time(self) -> None:
        """Warn once if a draft model's greedy acceptance is far below a same-family pair's."""
        seen = self.greedy_acceptance
        if self._pairing_warned or seen.drafted < _PAIRING_WARN_AFTER:
            return
        rate = seen.accepted / seen.drafted
        if rate < _PAIRING_WARN_ACCEPTANCE:
            self._pairing_warned = True
            log.warning(
                "draft model acceptance at temperature 0 is %.0f%% over %d drafted tokens; a same-family "
                "pair accepts 60-95%%. The draft may not match the target (run `specserve check`).",
                100 * rate, seen.drafted,
            )

    def close(self) -> None:
        if self.controller is not None:
            self.controller.save()
        for m in (self.target, self.draft):
            if m is not None:
                m.close()


class Slot:
    """One sequence at a time: reused across requests, keeping whatever prefix matches."""

    def __init__(self, engine: Engine, ctx=None, draft_ctx=None):
        """Contexts of its own, or the given ones (sequences of shared contexts: Engine.new_slots)."""
        self.engine = engine
        self.ctx = ctx if ctx is not None else engine.target.new_context(engine.n_ctx)
        self.draft_ctx = (draft_ctx if draft_ctx is not None
                          else draft_contexts(engine.draft, engine.n_ctx, engine.draft_window)[0])

    def drafters(self, spec: SpecParams, constraint: Constraint | None = None) -> dict[str, Drafter]:
        """A request's fresh drafters, by the engine's factory (Engine(drafters=...))."""
        return self.engine.make_drafters(self, spec, constraint)

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
        LogitRules.check(params, engine.target.vocab.n_vocab)
        constraint = for_request(params, engine.grammar_tokenizer, engine.target)
        policy = engine.policy_for(spec, params.temperature, grammar=params.grammar is not None)
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


def standard_drafters(slot: Slot, spec: SpecParams, constraint: Constraint | None = None) -> dict[str, Drafter]:
    """Fresh per-request drafters; the draft model's KV cache outlives them in the slot. Under a
    grammar each drafts after the forced tokens, within the mask (drafters.forced)."""
    drafters: dict[str, Drafter] = {"ngram": NgramDrafter(spec.ngram_min, spec.ngram_max)}
    model = None
    if slot.draft_ctx is not None:
        model = drafters["draft"] = DraftModelDrafter(slot.engine.draft, slot.draft_ctx, spec.draft_p_min,
                                                      spec.draft_min, slot.engine.greedy_acceptance, constraint,
                                                      slot.engine.cache_reuse)
    store = slot.engine.suffix_store if spec.cross_request else None
    drafters["suffix"] = SuffixDrafter(store, spec.cross_request_scope, cap=spec.suffix_max)  # indexes lazily
    if constraint is not None:
        drafters = with_grammar(drafters, constraint)
    if model is not None:  # a lookup's match, then the draft model: only --spec auto asks for it
        drafters["hybrid"] = HybridDrafter([drafters[n] for n in LOOKUPS], model)
    return drafters
