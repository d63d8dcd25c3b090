"""--cache-reuse (llama-server's KV shifting): which cached runs a new prompt keeps, and that a real
llama.cpp cache, single-sequence or a sequence of a shared context, ends up holding that prompt."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specserve import steps
from specserve.backends.base import common_prefix
from specserve.backends.cache_reuse import plan_reuse

A, B, C, D = list(range(100, 120)), list(range(200, 220)), list(range(300, 320)), list(range(400, 405))


@pytest.mark.parametrize("cached, tokens, n_min, want", [
    # the window lost its first lines: the prefix [1, 2] stays, B + C move down by len(A)
    ([1, 2, *A, *B, *C], [1, 2, *B, *C], 16, (42, [(22, 2, 40)])),
    # a line edited in the middle: B is gone, C moves down; D (5 tokens) is new and evaluated
    ([1, *A, *B, *C], [1, *A, *C, *D], 16, (41, [(41, 21, 20)])),
    # two gaps: each run moves by what was dropped before it
    ([*A, 7, 7, *B, 8, *C], [*A, *B, *C], 16, (60, [(22, 20, 20), (43, 40, 20)])),
    # a run shorter than n_min is not worth it: only the prefix is kept (not B's first 5 tokens)
    ([1, *A, *B[:5]], [1, *B[:5]], 16, (1, [])),
    ([1, *A, *B[:5]], [1, *B[:5]], 5, (6, [(21, 1, 5)])),
    # n_min 0: off, the prefix alone
    ([1, 2, *A, *B], [1, 2, *B], 0, (2, [])),
    # a line inserted before a run: the run would have to move up, and tokens cannot be evaluated in
    # front of it, so it is lost (as in llama-server)
    ([1, *A, *B], [1, 9, *A, *B], 16, (1, [])),
    # the new prompt ends inside a run: the run is cut there
    ([1, *A, *B], [1, *B[:18]], 16, (19, [(21, 1, 18)])),
])
def test_the_plan_keeps_llama_servers_runs(cached, tokens, n_min, want):
    assert plan_reuse(cached, tokens, n_min) == want


def llama_server_walk(cached, tokens, n_min):
    """server-context.cpp's walk, token by token: the plan's specification."""
    head_c = head_p = common_prefix(cached, tokens)
    moves = []
    if n_min <= 0:
        return head_p, moves
    while head_c < len(cached) and head_p < len(tokens):
        n = 0
        while head_c + n < len(cached) and head_p + n < len(tokens) and cached[head_c + n] == tokens[head_p + n]:
            n += 1
        if n >= n_min:
            moves.append((head_c, head_p, n))
            head_c, head_p = head_c + n, head_p + n
        else:
            head_c += 1
    return head_p, moves


_TOKENS = st.lists(st.integers(0, 3), max_size=60)  # a 4-token alphabet: many short partial runs


@settings(max_examples=300, deadline=None, derandomize=True)
@given(cached=_TOKENS, edits=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 6), _TOKENS.map(lambda t: t[:6])),
                                      max_size=4), n_min=st.sampled_from([0, 1, 2, 3, 5, 8]))
def test_the_plan_is_llama_servers_walk(cached, edits, n_min):
    tokens = list(cached)
    for at, cut, insert in edits:  # an edit: `cut` tokens at `at` replaced by `insert`
        tokens[at:at + cut] = insert
    assert plan_reuse(cached, tokens, n_min) == llama_server_walk(cached, tokens, n_min)


def test_runs_just_short_of_the_minimum_do_not_make_the_walk_quadratic():
    """Runs of 255 of one token after the prefix, n_min 256: the token-by-token walk compares about 1M
    token pairs (0.19 s in Python, on the event loop for every free slot); the plan, the same answer."""
    cached, tokens = ([7] * 255 + [8]) * 32, [7] * 8192
    assert plan_reuse(cached, tokens, 256) == llama_server_walk(cached, tokens, 256) == (255, [])


def _lines(model, n: int) -> list[int]:
    return model.tokenize("".join(f"line {i}: the value of x{i} is {i * 7 % 13}\n" for i in range(n)))


def _probs(logits) -> np.ndarray:
    z = np.exp(logits - logits.max())
    return z / z.sum()


@pytest.mark.parametrize("shared", [False, True])
def test_a_shifted_window_reuses_the_cache_and_predicts_as_a_cold_prompt_nearly(tiny_models, shared):
    model = tiny_models["target"]
    old = _lines(model, 20)  # ~560 tokens
    new = old[:5] + old[45:]  # the window's first lines gone (a prefix of 5 tokens stays)
    ctx = model.new_shared_context(1024, 2).seqs[1] if shared else model.new_context(1024)
    try:
        ctx.eval(old)
        n = steps.direct(steps.sync_prefix(ctx, new[:-1], 16))
        assert n == len(new) - 1 and list(ctx.tokens) == new[:-1]  # all reused, nothing evaluated
        reused = np.array(ctx.eval(new[-1:])[0])
    finally:
        ctx.close()
    cold_ctx = model.new_context(1024)
    cold = np.array(cold_ctx.eval(new)[0])
    unrelated = np.array(cold_ctx.eval(old[-40:])[0])  # the same context further on: a prediction elsewhere
    cold_ctx.close()
    # The moved keys and values were computed after the 40 dropped tokens, so the next token's
    # distribution is not exactly a cold prompt's (llama-server has the same property). With positions
    # shifted right the difference is small: measured 0.001 in probability here (0.04 on SmolLM2), far
    # below what a different prompt gives.
    gap = np.abs(_probs(reused) - _probs(cold)).max()
    assert reused.argmax() == cold.argmax() and gap < 0.01
    assert gap < np.abs(_probs(unrelated) - _probs(cold)).max() / 5


def test_a_run_below_the_minimum_is_evaluated_again(tiny_models):
    model = tiny_models["target"]
    old = _lines(model, 8)
    new = old[:5] + old[45:]
    ctx = model.new_context(1024)
    ctx.eval(old)
    n = ctx.reuse(new, len(new))  # the run is len(new) - 5 tokens: too short
    assert n == 5 and ctx.tokens == new[:5]
    ctx.close()


def test_a_recurrent_memory_keeps_its_prefix_only(tiny_models):
    model = tiny_models["mamba"]
    old = _lines(model, 4)
    new = old[:5] + old[25:]
    ctx = model.new_context(512)
    ctx.eval(old)
    assert ctx.reuse(new, 8) == 5 and ctx.tokens == new[:5]
    after = np.array(ctx.eval(new[5:])[0])
    cold_ctx = model.new_context(512)
    np.testing.assert_allclose(after, cold_ctx.eval(new)[0], atol=1e-4)  # evaluated again, as a cold prompt
    ctx.close()
    cold_ctx.close()
