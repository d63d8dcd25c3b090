"""Stop strings end the text where one token at a time would have ended it, in every --spec mode.

The text stops at the first character that completes a stop string (the longest of those
completing there), cut where that string starts; tokens after the one that completed it
are neither committed, counted nor sent, however many a speculative step verified.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from specserve.config import SamplingParams, SpecParams
from specserve.engine import Engine
from specserve.text import StreamDecoder

PIECES = {i: bytes([i]) for i in range(256)}
MODES = ("none", "draft", "ngram", "auto")


def decode(chunks, stop):
    """(text, tokens counted, stop word) for bytes fed in the given groups, as the engine feeds them."""
    d = StreamDecoder(PIECES.__getitem__, stop)
    text, used = "", 0
    for chunk in chunks:
        out, n = d.push(chunk)
        text, used = text + out, used + n
        if d.stopped:
            break
    return text + d.flush(), used, d.stop_word


@pytest.mark.parametrize(
    "data, stop, text, used, word",
    [
        (b" Paris is", ("is", "Paris"), " ", 6, "Paris"),  # " Paris" completes both: the longer, earlier one wins
        (b" Paris.\n\nThe", ("answer", "\n\n"), " Paris.", 9, "\n\n"),
        (b" Paris. More", (".",), " Paris", 7, "."),  # the token completing "." is the last one counted
        (b"xaby", ("ab", "xaby"), "x", 3, "ab"),  # "ab" completes first: "xaby" never gets the chance
        (b"abcabc", ("bca", "zzz"), "a", 4, "bca"),
        (b"no stop here", ("zz",), "no stop here", 12, ""),
    ],
)
def test_first_completed_stop_wins_whatever_the_grouping(data, stop, text, used, word):
    rng = random.Random(0)
    for _ in range(50):
        cuts = sorted(rng.sample(range(len(data) + 1), k=rng.randint(0, len(data))))
        chunks = [list(data[a:b]) for a, b in zip([0, *cuts], [*cuts, len(data)])]
        assert decode(chunks, stop) == (text, used, word), chunks


def test_random_texts_and_stops_do_not_depend_on_grouping():
    rng = random.Random(1)
    for _ in range(500):
        data = bytes(rng.choice(b"abc .") for _ in range(rng.randint(0, 20)))
        stop = tuple("".join(rng.choice("abc.") for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 3)))
        one_by_one = decode([[b] for b in data], stop)
        cuts = sorted(rng.sample(range(len(data) + 1), k=rng.randint(0, len(data) + 1)))
        grouped = decode([list(data[a:b]) for a, b in zip([0, *cuts], [*cuts, len(data)])], stop)
        assert grouped == one_by_one, (data, stop)


def test_llama_api_reports_the_stop_word_that_cut_the_text():
    from specserve.server.apis.llama.completion import final
    from specserve.stats import GenerationStats

    stats = GenerationStats(finish_reason="stop", stop_word="Paris", n_generated=1, n_prompt=5, n_passes=1,
                            t_prompt=0.1, t_total=0.2)  # the real stats, so the fake cannot fall behind them
    req = SimpleNamespace(model="m", sampling=SamplingParams(stop=("is", "Paris")), spec=SpecParams(), verify="gumbel",
                          stream=False)
    target = SimpleNamespace(vocab=SimpleNamespace(eog=frozenset({2})), detokenize=lambda ids, special: b"prompt")
    job = SimpleNamespace(stats=stats, req=req, state=SimpleNamespace(engine=SimpleNamespace(target=target, n_ctx=64)),
                          id_slot=0, prompt_tokens=[1, 2, 3, 4, 5], queue_s=0.0)
    out = final(job, " ", [12])
    assert (out["stop_type"], out["stopping_word"]) == ("word", "Paris")


# --- the engine on the real SmolLM2 pair: the cases from the issue -----------------------------------


@pytest.fixture(scope="module")
def smollm2_slot(real_model_paths):
    from specserve.backends import load_model

    target = load_model(str(real_model_paths["smollm2-f16"]))
    draft = load_model(str(real_model_paths["smollm2-q4_1"]))
    slot = Engine(target, draft, n_ctx=512).new_slot()
    yield slot
    slot.close()
    target.close()
    draft.close()


@pytest.mark.parametrize("stop, text, word", [(("is", "Paris"), " ", "Paris"), (("answer", "\n\n"), " Paris.", "\n\n"),
                                              ((".",), " Paris", ".")])
def test_greedy_stop_strings_end_alike_in_every_mode(smollm2_slot, stop, text, word):
    """Before: " Par" (the first stop in list order won), " Paris.\\n\\nThe " in draft mode only, and
    with "." 6 tokens counted in draft mode against 2 in the others."""
    runs = {mode: smollm2_slot.generate("The capital of France is", SamplingParams(max_tokens=40, stop=stop),
                                        SpecParams(mode=mode)) for mode in MODES}
    assert {mode: g.text for mode, g in runs.items()} == dict.fromkeys(MODES, text)
    assert {mode: (len(g.tokens), g.stats.finish_reason) for mode, g in runs.items()} == \
        dict.fromkeys(MODES, (runs["none"].stats.n_generated, "stop"))  # the same tokens sent and counted everywhere
    if stop == (".",):
        assert runs["none"].stats.n_generated == 2  # " Paris" and "."
    assert {g.stats.stop_word for g in runs.values()} == {word}
