"""A request whose draft model kept nearly all of its first tokens, and then fewer, yet still enough to beat
plain decoding: the draft model goes on. A second of the request was worth its rate so far, which the good
start had set above what any option could make now; at that price a plain step, shorter, lost less than the
draft model's, and each plain step then added a token to the draft model's catch-up, so it never ran again.
Through `specserve serve` (the bench's code edits, then its coding questions, SPECSERVE_LOG=debug,
2026-12-07): two coding answers whose rates so far were 15.6 and 14.5 tok/s when they turned plain ran their
other 78 and 77 steps plain, at 12.3 and 11.6 tok/s, against 15.7 and 13.4 for their draft steps."""
from __future__ import annotations

from specserve.config import SpecParams
from specserve.policy import Choice, Outcome
from policies import NAMES, measured, no_probes
from workloads import CPU_SERVED

VERIFY, DRAFT_TOK = CPU_SERVED["verify"], CPU_SERVED["draft_tok"]


def step(policy, n: int, acc: int) -> None:
    """A draft-model step that drafted n tokens and kept acc, as the served pair times it; no lookup matches."""
    for name in ("ngram", "suffix"):
        policy.see(name, (0, 0))
    policy.choose()
    policy.observe(Outcome(Choice("draft", n), n, acc, DRAFT_TOK * n, VERIFY(1 + n)))


def test_a_good_start_does_not_price_the_draft_model_out():
    ctl = measured(VERIFY, DRAFT_TOK)
    policy = ctl.policy(SpecParams(draft_max=8), NAMES)
    no_probes(policy)
    for _ in range(5):
        step(policy, 8, 8)  # a good start: everything kept, 21 tok/s
    for acc in (2, 8, 0, 8, 3, 8, 1, 0):  # then a little over half
        step(policy, 8, acc)
    for name in ("ngram", "suffix"):
        policy.see(name, (0, 0))
    V = ctl.costs.verify.table(policy.cap + 1)
    draft = policy.plan_for("draft", V)
    rate_so_far = policy.progress.generated / policy.progress.clock
    marginal = (draft.tokens - 1) / (draft.seconds - V[1])  # what a second must be worth for plain to win
    assert draft.rate > 1.1 / V[1]  # the draft model still beats plain decoding by 10%
    assert rate_so_far > marginal  # the trap: priced at the rate so far, a plain step looks better
    assert policy.plan()[0] == "draft"
