"""A draft model kept behind by a copy that has ended comes back within a few steps: its catch-up on the copied
tokens is repaid over the run it starts, not by one step. Charged whole to the step that runs it, the catch-up
(the draft model's lag times its cost a token) outweighed what that step makes beyond a plain one, and each
plain step added a token to it: through `specserve serve` with a new user's profile (2026-12-07, a draft cost
learnt at a constant lag, 0.011-0.021 s a token of catch-up), two coding answers that copied 13 and 6 tokens of their
question ran their other 100 and 98 steps plain, the draft model planned at 15.9 tok/s against plain's 11.6."""
from __future__ import annotations

from policies import NAMES, measured
from specserve.auto.request_state import PLAIN_RUN
from specserve.config import SpecParams
from specserve.policy import Choice, Outcome
from workloads import CPU_SERVED

VERIFY, DRAFT_TOK = CPU_SERVED["verify"], CPU_SERVED["draft_tok"]


def step(policy, offers: dict, drafter: str | None = None, n: int = 0, acc: int = 0) -> Choice:
    """One step: the lookups' offers, the policy's choice, and the outcome given (drafter, n, acc), or as chosen
    with every drafted token kept when drafter is None (plain if it chose plain)."""
    for name in ("ngram", "suffix"):
        policy.see(name, offers.get(name, (0, 0)))
    c = policy.choose()
    if drafter is None:
        drafter, n, acc = (c.drafter, c.k, c.k) if c.k else (None, 0, 0)
    t_draft = DRAFT_TOK * n if drafter == "draft" else 0.0
    policy.observe(Outcome(Choice(drafter, n), n, acc, t_draft, VERIFY(1 + n)))
    return c


def test_the_draft_model_comes_back_after_a_copy_ended():
    ctl = measured(VERIFY, DRAFT_TOK)  # 0.009 s a token of catch-up
    policy = ctl.policy(SpecParams(draft_max=8), NAMES)
    for _ in range(3):
        step(policy, {}, "draft", 5, 5)  # the draft model keeps all: 18.5 tok/s against plain's 12
    for _ in range(2):
        step(policy, {"ngram": (4, 32)}, "ngram", 15, 15)  # a copy of 30 tokens, then it ends
    chosen = [step(policy, {}).drafter for _ in range(20)]
    print(chosen)
    # PLAIN_RUN plain steps show the copy ended; then the stretch without a copy grows until the catch-up it
    # would repay (30 tokens' worth, 0.26 s) fits: here 4 more. Before: plain on all 20 (and on, as served)
    back = chosen.index("draft") if "draft" in chosen else len(chosen)
    assert back <= PLAIN_RUN + 6, chosen
    assert set(chosen[back:]) == {"draft"}  # and it runs on
