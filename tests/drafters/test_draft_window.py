"""--draft-ctx: the draft model's bounded cache (drafters/window.py). Whatever the window holds, the text
is the target alone's (greedy, and seeded sampling under gumbel); the draft prefills no more than its
window, slides by moving its cells down (positions stay contiguous), and falls back to filling its window
again where the memory cannot shift."""
from __future__ import annotations

import llama_cpp as C
import pytest

from specserve.config import SamplingParams, SpecParams
from specserve.drafters.draft_model import DraftModelDrafter
from specserve.drafters.window import N_SINK, WindowedContext, draft_contexts
from specserve.engine import Engine
from lossless_checks import EPS_F16, EPS_TINY, assert_greedy_equal

LINES = "".join(f"line {i}: the value of x{i} is {i * 7 % 13}\n" for i in range(16))  # ~350 tokens
WINDOW = 128


def _engine(tiny_models, window: int = WINDOW, n_ctx: int = 1024) -> Engine:
    engine = Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=n_ctx)
    engine.draft_window = window
    return engine


def _count_evals(ctx) -> list[int]:
    """The real eval of `ctx`, counting the tokens each pass takes."""
    counted, real = [], ctx.eval

    def counting_eval(tokens, logits="last"):
        counted.append(len(tokens))
        return real(tokens, logits)

    ctx.eval = counting_eval
    return counted


def _positions_contiguous(inner) -> bool:
    """llama.cpp holds the cells at positions 0..n-1: every slide moved them down."""
    mem = inner._mem if hasattr(inner, "_mem") else inner.shared._mem
    seq = getattr(inner, "seq_id", 0)
    return (C.llama_memory_seq_pos_min(mem, seq), C.llama_memory_seq_pos_max(mem, seq)) == (0, len(inner.tokens) - 1)


def test_a_window_smaller_than_the_prompt_gives_the_target_alone_text_and_prefills_only_the_window(tiny_models):
    slot = _engine(tiny_models).new_slot()
    assert isinstance(slot.draft_ctx, WindowedContext) and slot.draft_ctx.inner.n_ctx == WINDOW
    evaluated = _count_evals(slot.draft_ctx.inner)
    prompt = slot.tokenize_prompt(LINES)
    assert len(prompt) > 2 * WINDOW
    drafter = DraftModelDrafter(slot.engine.draft, slot.draft_ctx)
    assert drafter.missing(prompt) < WINDOW  # what auto's prefill judgement is told it costs
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    reference = slot.generate(prompt, params, SpecParams(mode="none")).tokens
    drafter.prefill(prompt)
    assert sum(evaluated) < WINDOW and slot.draft_ctx.inner.tokens[:N_SINK] == prompt[:N_SINK]
    g = slot.generate(prompt, params, SpecParams(mode="draft", draft_max=6))
    slot.close()
    assert g.stats.n_accepted > 0
    assert_greedy_equal(tiny_models["target"], prompt, reference, g.tokens, EPS_TINY, "window 128, long prompt")


@pytest.mark.parametrize("shift", [True, False])
def test_a_window_that_slides_during_generation_gives_the_target_alone_text(tiny_models, shift):
    """A short prompt and 300 tokens: the window slides many times, by moving its cells down, or where the
    memory cannot shift (as a model whose positions cannot move), by filling itself again."""
    slot = _engine(tiny_models).new_slot()
    window = slot.draft_ctx
    slides, real_drop = [], window.inner.drop
    window.inner.drop = lambda start, n: slides.append(n) is None and shift and real_drop(start, n)
    evaluated = _count_evals(window.inner)
    prompt = slot.tokenize_prompt("the cat sat on the mat. " * 3)
    params = SamplingParams(max_tokens=300, ignore_eos=True)
    reference = slot.generate(prompt, params, SpecParams(mode="none")).tokens
    g = slot.generate(prompt, params, SpecParams(mode="draft", draft_max=6))
    assert window.gap > 300 - WINDOW and len(slides) >= 5 and all(n >= window.slide for n in slides)
    if shift:  # each slide re-evaluates nothing: the window takes only the tokens committed since
        assert sum(evaluated) < len(prompt) + 300 + 6 * g.stats.n_passes and _positions_contiguous(window.inner)
    else:  # each slide fills the window again
        assert sum(evaluated) > len(slides) * (WINDOW - 3 * window.slide)
    slot.close()
    assert g.stats.n_accepted > 0
    assert_greedy_equal(tiny_models["target"], prompt, reference, g.tokens, EPS_TINY, f"sliding window {shift=}")


def test_seeded_sampling_with_a_window_gives_the_target_alone_text(tiny_models):
    slot = _engine(tiny_models).new_slot()
    prompt = slot.tokenize_prompt(LINES)
    accepted = 0
    for seed in range(4):
        params = SamplingParams(temperature=0.8, seed=seed, max_tokens=150, ignore_eos=True)
        alone = slot.generate(prompt, params, SpecParams(mode="none")).tokens
        g = slot.generate(prompt, params, SpecParams(mode="draft", draft_max=4), "gumbel")
        accepted += g.stats.n_accepted
        assert g.tokens == alone, f"seed {seed}"
    assert slot.draft_ctx.gap > 0 and accepted > 0
    slot.close()


def test_the_window_holds_the_sinks_and_the_recent_tokens_and_slides_in_steps(tiny_models):
    model = tiny_models["draft_close"]
    window = WindowedContext(model.new_context(WINDOW), n_ctx=1024)
    text = model.tokenize(LINES)
    from specserve import steps

    steps.direct(window.sync(text[:WINDOW - 27], 8))
    gaps = []
    for n in range(WINDOW - 20, len(text), 7):  # the sequence grows as a generation's does, 7 tokens a step
        assert window.missing(text[:n], 8) == 7  # after a slide too: the cells kept are moved, not evaluated
        steps.direct(window.sync(text[:n], 8))
        cells = window.inner.tokens
        assert cells == text[:N_SINK] + text[N_SINK + window.gap:n] and len(cells) + 8 <= WINDOW
        assert _positions_contiguous(window.inner)
        gaps.append(window.gap)
    moves = [b - a for a, b in zip(gaps, gaps[1:]) if b != a]
    assert moves and all(m >= window.slide for m in moves) and len(moves) < len(gaps) / 2  # slides in steps
    other = model.tokenize("something else entirely, " * 30)  # another prompt: the window is filled for it
    assert window.missing(other, 1) > WINDOW // 2
    steps.direct(window.sync(other, 1, logits=False))
    assert window.inner.tokens == other[:N_SINK] + other[N_SINK + window.gap:]
    window.truncate(0)
    assert window.inner.tokens == [] and window.gap == 0
    window.close()


def test_slots_share_one_draft_context_of_slots_x_window_cells(tiny_models):
    engine = _engine(tiny_models, n_ctx=2048)
    slots = engine.new_slots(2)
    inner = [s.draft_ctx.inner for s in slots]
    assert inner[0].shared is inner[1].shared and inner[0].shared.n_ctx == WINDOW and inner[0].shared.n_seq == 2
    full = draft_contexts(engine.draft, 2048, 0, 2)
    ratio = full[0].memory().kv_cache / slots[0].draft_ctx.memory().kv_cache  # llama.cpp's log, in MiB to 2 places
    assert 15 < ratio < 17  # 2 x 128 cells against 2 x 2048
    for c in full:
        c.close()
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    slots[1].generate(LINES, params, SpecParams(mode="draft", draft_max=4))
    held = list(inner[1].tokens)
    g = slots[0].generate(LINES, params, SpecParams(mode="draft", draft_max=4))  # slides its sequence only
    assert g.stats.n_accepted > 0 and slots[0].draft_ctx.gap > 0
    assert _positions_contiguous(inner[0]) and _positions_contiguous(inner[1]) and inner[1].tokens == held
    for s in slots:
        s.close()


@pytest.fixture(scope="module")
def smollm2_pair(real_model_paths):
    from specserve.backends import load_model

    target = load_model(str(real_model_paths["smollm2-f16"]))
    draft = load_model(str(real_model_paths["smollm2-q4_1"]))
    yield target, draft
    target.close()
    draft.close()


def test_greedy_text_is_the_target_alone_with_a_window_on_a_real_long_prompt(smollm2_pair):
    """SmolLM2 F16 target, Q4_1 draft, a source file of ~700 tokens and a question about it, window 256."""
    from specserve.bench.workloads import load_workload
    from specserve.prompt import chat_tokens

    target, draft = smollm2_pair
    engine = Engine(target, draft, n_ctx=2048)
    engine.draft_window = 256
    slot = engine.new_slot()
    accepted = 0
    for bp in load_workload("long-file:600", 2):
        prompt = chat_tokens(target, list(bp.messages))
        assert len(prompt) > 2 * 256
        params = SamplingParams(max_tokens=48)
        reference = slot.generate(prompt, params, SpecParams(mode="none")).tokens
        g = slot.generate(prompt, params, SpecParams(mode="draft", draft_max=6))
        accepted += g.stats.n_accepted
        assert_greedy_equal(target, prompt, reference, g.tokens, EPS_F16, f"window 256 on {bp.category}")
    slot.close()
    assert accepted > 0
