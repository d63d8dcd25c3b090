"""The loaded models and what their slots share.

An Engine owns the loaded models, the speculation policy's controller (--spec auto) and the
settings its slots share (--cache-reuse, --draft-ctx, the cross-request suffix store); it makes
the slots (slot.py), each of which owns one sequence's caches and runs the speculative decoding
loop. A server's slots share one context per model (`Engine.new_slots`), so that its batch
scheduler can run every slot's passes in one batch; `standard_drafters` builds a request's
drafters in a slot unless the engine is given another factory.
"""
from __future__ import annotations

import logging
from typing import Sequence

from .backends import Model, load_model
from .backends.timing import token_seconds
from .config import DRAFT_CTX_DEFAULT, UBATCH_DEFAULT, UBATCH_DRAFT_DEFAULT, ModelConfig, SpecParams
from .auto import Controller
from .auto.profile import learning_controller
from .drafters import Drafter
from .drafters.draft_model import DraftModelDrafter, GreedyAcceptance
from .drafters.forced import FORCED, with_grammar
from .drafters.hybrid import LOOKUPS, HybridDrafter
from .drafters.ngram import NgramDrafter
from .drafters.suffix import SuffixDrafter
from .drafters.suffix_store import SuffixStore
from .drafters.window import draft_contexts
from .grammar import Constraint, GrammarError, check
from .policy import FixedPolicy, Policy
from .slot import DrafterFactory, Slot

log = logging.getLogger("specserve")

# A same-family draft accepts 60-95% of its greedy drafts; below this after enough
# drafted tokens, the pair is probably wrong (a subtle tokenizer mismatch, say).
_PAIRING_WARN_ACCEPTANCE = 0.25
_PAIRING_WARN_AFTER = 300


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
        # -ub / -ubd: the tokens llama.cpp computes at once in each model's contexts (their compute buffers)
        self.n_ubatch, self.n_ubatch_draft = UBATCH_DEFAULT, UBATCH_DRAFT_DEFAULT
        self.suffix_store = suffix_store  # earlier requests' text for the suffix drafter, shared by slots; None: off
        self.make_drafters = drafters or standard_drafters
        self.controller = controller if controller is not None else Controller()  # --spec auto, shared by slots
        weights = (target.weights_bytes, draft.weights_bytes if draft is not None else 0)
        if draft is not None and all(weights):
            self.controller.costs.cost_ratio.setdefault("draft", min(weights[1] / weights[0], 1.0))
        # a saved profile's drafting cost is checked against the machine as it is now (learned.py), on the
        # thread that decodes: see calibrate()
        self._uncalibrated = draft is not None and self.controller.profile.loaded
        self.can_speculate = target.can_rollback
        if not self.can_speculate:
            log.warning("target %s has a recurrent or hybrid memory, which cannot drop rejected tokens: "
                        "speculation is off", target.path)
        self.draft_choice = None  # -md auto/none: how the draft was chosen (draft_choice.DraftChoice), for the APIs
        self.greedy_acceptance = GreedyAcceptance()  # the draft model's, for the run-time pairing warning
        self._pairing_warned = False

    @classmethod
    def load(cls, cfg: ModelConfig) -> "Engine":
        target = load_model(cfg.target_path, cfg.n_gpu_layers, cfg.n_threads, exact=cfg.exact)
        try:
            draft = load_model(cfg.draft_path, cfg.n_gpu_layers_draft, cfg.n_threads, flag="-ngld") \
                if cfg.draft_path else None
        except BaseException:  # the draft refused (-ngld on a CPU build) or not loaded: free the target
            target.close()
            raise
        store = SuffixStore(cfg.cross_request_bytes) if cfg.cross_request_bytes else None
        engine = cls(target, draft, cfg.n_ctx, controller=learning_controller(cfg, target), suffix_store=store)
        engine.cache_reuse, engine.draft_window = cfg.cache_reuse, cfg.draft_ctx
        engine.n_ubatch, engine.n_ubatch_draft = cfg.n_ubatch, cfg.n_ubatch_draft
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
        target = self.target.new_shared_context(self.n_ctx, n, n_batch, self.n_ubatch)
        drafts = (draft_contexts(self.draft, self.n_ctx, self.draft_window, n, n_batch, self.n_ubatch_draft)
                  if target is not None else None)
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

    def policy_for(self, spec: SpecParams, temperature: float = 0.0, grammar: bool = False,
                   prompt: Sequence[int] | None = None) -> Policy:
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
        self.calibrate()
        return self.controller.policy(spec, self.drafter_names + [FORCED] * grammar, temperature, prompt)

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
        self.controller.save()
        for m in (self.target, self.draft):
            if m is not None:
                m.close()


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
