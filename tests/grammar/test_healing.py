"""Token healing: the answer begins with the backed-off token's bytes, which are not sent; every
speculative mode gives the healed target alone's text; the masks are the brute-force ones."""
from __future__ import annotations

import numpy as np
import pytest

from specserve.config import SamplingParams, SpecParams
from specserve.grammar.healing import TokenHealing, _Vocab, after, vocab_of
from constrained_checks import smol  # noqa: F401  (the SmolLM2 pair, a module fixture)


def test_after_keeps_what_remains_and_refuses_what_breaks_it():
    assert after(b"fr", b"from") == b""
    assert after(b"fr", b"f") == b"r"
    assert after(b"fr", b"fr") == b""
    assert after(b"fr", b"x") is None
    assert after(b"fr", b"") is None  # a control token writes nothing: it cannot heal
    assert after(b"", b"anything") == b""


def test_allowed_is_the_brute_force_set():
    pieces = [b"", b"f", b"fr", b"from", b"fra", b"g", b"r", b"\xff", b"\xff\x01", b"frz\xff", b" fr", b"om"]
    vocab = _Vocab(pieces)
    for left in (b"fr", b"f", b"from", b"\xff", b"x", b"fro"):
        want = {i for i, p in enumerate(pieces) if after(left, p) == b"" or (p and after(left, p))}
        assert set(vocab.allowed(left).tolist()) == want, left


def test_masks_rows_under_the_state_each_draft_prefix_reaches():
    vocab = _Vocab([b"f", b"fr", b"from", b"om", b"x", b"r"])
    h = TokenHealing(vocab, b"fr")
    logits = np.zeros((3, 6), np.float32)
    rows = h.masked(logits, [0, 5])  # "f", then "r": healed after two tokens
    assert np.isfinite(rows[0]).tolist() == [True, True, True, False, False, False]
    assert np.isfinite(rows[1]).tolist() == [False, False, False, False, False, True]
    assert np.isfinite(rows[2]).all()  # healed: free
    assert len(h.masked(logits, [4, 0])) == 1  # "x" breaks it: nothing after it is judged
    assert h.valid_prefix([0, 5, 4]) == 3 and h.valid_prefix([0, 4]) == 1 and h.valid_prefix([3]) == 0
    with h.ahead() as walk:
        assert walk.advance(0) and not walk.advance(4) and walk.advance(5)
        assert walk.mask(np.zeros(6, np.float32)) is not None
    h.commit([2])
    assert h.left == b"" and h.valid_prefix([4, 4]) == 2


def test_the_vocabulary_table_matches_the_model(smol):
    vocab = vocab_of(smol.target)
    assert vocab is vocab_of(smol.target)  # read once per model
    left = b" th"
    want = {i for i in range(smol.target.vocab.n_vocab)
            if (p := smol.target.token_bytes(i)) and (p.startswith(left) or left.startswith(p))}
    assert set(vocab.allowed(left).tolist()) == want


@pytest.mark.parametrize("heal", [b" wor", b"ld"])
def test_healed_answers_begin_with_the_healed_bytes_in_every_mode(smol, heal):
    """The prompt stops inside a word; the answer's tokens spell the healed bytes first, the text
    leaves them out, and each speculative mode gives the target alone's tokens."""
    prompt = smol.target.tokenize("The most famous program prints Hello,", add_special=False)
    params = SamplingParams(temperature=0.0, max_tokens=24, heal=heal)
    answers, slot = {}, smol.new_slot()
    for mode in ("none", "draft", "ngram", "auto"):
        gen = slot.generate(prompt, params, SpecParams(mode=mode, draft_max=4))
        full = smol.target.detokenize(gen.tokens)
        assert full.startswith(heal), (mode, full)
        assert gen.text == full[len(heal):].decode("utf-8", "replace"), mode
        answers[mode] = gen.tokens
    assert all(tokens == answers["none"] for tokens in answers.values()), answers
