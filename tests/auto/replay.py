"""A request sequence replayed through `--spec auto` with the real lookup drafters and store, no model.

The engine's step as engine.py plays it (each lookup's offer, its shadow judged against the committed
tokens, the policy's choice, the draft, the verdict, the outcome), on token texts given up front: the
target's answer to each request is known, a lookup drafts from the real NgramDrafter and SuffixDrafter
(the store shared by the requests, as a server's), and a draft model is modelled: it proposes the
answer's next token with a probability per request (drawn per text position, so every policy sees the
same draws), another token otherwise. Pass and drafting costs come from a table (the reference pair's
by default). What auto does on a sequence of requests is then tested without a model and without a
clock: which drafter and k each step, tokens per second in the table's seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from specserve.drafters.ngram import NgramDrafter
from specserve.drafters.suffix import SuffixDrafter
from specserve.drafters.suffix_store import SuffixStore
from specserve.policy import Choice, Outcome, ask_offers, judge
from step_simulator import curve

# the reference pair on 2 cores (stop 46's trace: a target pass over 1 token 165 ms, over 9 tokens 283;
# over 64 about 7.5 plain passes, issue 51); the 0.5B 38 ms a drafted token, 5 ms a token to catch up on
REFERENCE = curve({1: 165, 2: 176, 3: 190, 4: 200, 6: 225, 9: 283, 17: 450, 33: 760, 65: 1240})
SHADOW_MAX = 64  # as engine._SHADOW_MAX


@dataclass
class Text:
    """One request: its prompt, the target's answer, and how often the draft model's token is the target's."""

    prompt: list[int]
    answer: list[int]
    model_rate: float = 0.9
    temperature: float = 0.0


@dataclass
class Step:
    drafter: str | None
    k: int
    drafted: int
    accepted: int
    order: int = 0  # the chosen lookup's match length (0: none, or not a lookup)


@dataclass
class Replayed:
    steps: list[Step] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return sum(s.accepted + 1 for s in self.steps) / self.seconds


@dataclass
class Replay:
    """Requests run one after the other on one engine: its controller and its cross-request store."""

    ctl: object  # specserve.auto.Controller
    verify: Callable[[int], float] = REFERENCE
    draft_tok: float = 0.038
    catchup: float = 0.005
    names: tuple[str, ...] = ("draft", "ngram", "suffix", "hybrid")
    store: SuffixStore = field(default_factory=lambda: SuffixStore(64 << 20))
    seed: int = 0
    n_run: int = 0

    def run(self, text: Text, spec) -> Replayed:
        self.n_run += 1
        rng = np.random.default_rng([self.seed, self.n_run])
        u = rng.random(len(text.prompt) + len(text.answer) + 2 * SHADOW_MAX)
        policy = self.ctl.policy(spec, list(self.names), text.temperature, text.prompt)
        lookups = {"ngram": NgramDrafter(spec.ngram_min, spec.ngram_max),
                   "suffix": SuffixDrafter(self.store, cap=spec.suffix_max)}
        lookups = {n: d for n, d in lookups.items() if n in self.names}
        truth = [*text.prompt, *text.answer]
        seq, out = list(text.prompt), Replayed()
        lag = len(text.prompt)  # tokens the draft model's cache lacks
        ask_offers(policy, lookups, seq)  # as the engine asks before a prefill
        if "draft" in self.names and policy.prefill("draft", len(text.prompt) - 1, len(text.answer)):
            t = self.catchup * len(text.prompt)
            policy.prefilled("draft", len(text.prompt) - 1, t)
            out.seconds, lag = t, 1

        def model(at: int, n: int) -> list[int]:  # the draft model's n tokens from text position `at`
            return [truth[p] if u[p] < text.model_rate else truth[p] + 1 for p in range(at, at + n)]

        while len(seq) < len(truth):
            offers = ask_offers(policy, lookups, seq)
            shadow = {name: lookups[name].propose(seq, SHADOW_MAX).tokens for name, o in offers.items() if o[0]}
            c = policy.choose()
            k = min(c.k, len(truth) - len(seq) - 1)
            draft, t_draft = [], 0.0
            if k > 0 and c.drafter in lookups:
                draft = lookups[c.drafter].propose(seq, k).tokens
            elif k > 0 and c.drafter == "draft":
                draft, t_draft = model(len(seq), k), self.draft_tok * k + self.catchup * (lag - 1)
            elif k > 0 and c.drafter == "hybrid":
                head = next((d for d in (lookups[n].propose(seq, k).tokens for n in ("suffix", "ngram")
                                         if n in lookups) if d), [])
                draft = head + model(len(seq) + len(head), k - len(head)) if head else []
                t_draft = self.draft_tok * (k - len(head)) + self.catchup * (lag - 1 + len(head))
            committed = truth[len(seq):len(seq) + len(draft) + 1]
            acc = judge(draft, committed)[1]
            new = committed[:acc + 1]
            t_verify = self.verify(1 + len(draft))
            judged = {n: judge(p, new) for n, p in shadow.items() if n != c.drafter}
            policy.observe(Outcome(Choice(c.drafter, k) if k > 0 else Choice(None, 0), len(draft), acc,
                                   t_draft, t_verify, None, judged or None))
            if c.drafter in ("draft", "hybrid") and k > 0:
                lag = 2 if acc == len(draft) else 1
            else:
                lag += len(new)
            out.steps.append(Step(c.drafter if k > 0 else None, k, len(draft), acc,
                                  offers.get(c.drafter, (0, 0))[0] if k > 0 else 0))
            out.seconds += t_draft + t_verify
            seq += new
        policy.finish()
        self.store.add(text.prompt, text.answer)
        return out


# Synthetic texts of the issue-51 mix (token ids are plain integers; ids >= 5000 are never words):
# a chat template around each prompt, as the store sees it
SYSTEM = list(range(2100, 2130))  # "<|im_start|>system ... <|im_end|><|im_start|>user"
HEADER = [2000, 2001, 2002, 2003, 2004]  # "<|im_end|>\n<|im_start|>assistant\n"


def code_edit(rng: np.random.Generator, n: int = 128) -> Text:
    """A file in the prompt, answered with the file again and a name changed every 25 tokens: the
    lookups copy it between the edits; the draft model keeps 90% of its tokens."""
    file = rng.integers(0, 300, 160).tolist()
    answer = [3000, 3001, 3002] + [t + 5000 if i % 25 == 7 else t for i, t in enumerate(file)]
    return Text(SYSTEM + rng.integers(0, 1000, 12).tolist() + file + HEADER, answer[:n], 0.9)


def question(rng: np.random.Generator, n: int = 128) -> Text:
    """A coding question: an answer of a small vocabulary (short n-grams recur, rarely right); 85% for the model."""
    return Text(SYSTEM + rng.integers(0, 1000, 30).tolist() + HEADER, rng.integers(0, 200, n).tolist(), 0.85)


def story(rng: np.random.Generator, n: int = 128) -> Text:
    """Prose at temperature 0.8: the draft model keeps half its tokens, the lookups nothing."""
    return Text(SYSTEM + rng.integers(0, 1000, 20).tolist() + HEADER, rng.integers(0, 1000, n).tolist(), 0.5, 0.8)
