"""Suffix drafting and the cross-request store: tables of sequences and expected proposals,
counts, scopes, eviction and the memory bound. No model: token ids are plain integers."""
import time

import numpy as np
import pytest

from specserve.drafters.suffix import SAME_REQUEST, SuffixDrafter
from specserve.drafters.suffix_store import ORDERS, SuffixStore, tail_key, tail_keys, window_keys


def test_window_keys_agree_with_the_per_step_key():
    t = np.random.default_rng(0).integers(0, 150_000, size=300)
    for order in (1, 3, 4, 32):
        keys = window_keys(t, order, order, len(t) + 1)  # every window, the one ending at the end included
        for e in (order, order + 1, 200, 300):
            assert int(keys[e - order]) == tail_key(t[:e].tolist(), order)
        assert (window_keys(t, order, 100, 120) == keys[100 - order:120 - order]).all()  # any sub-range
    assert tail_keys(t[:50].tolist(), [32, 4, 1]) == [tail_key(t[:50].tolist(), o) for o in (32, 4, 1)]
    assert tail_keys([5, 6, 7, 8, 9], [8, 4]) == [-1, tail_key([5, 6, 7, 8, 9], 4)]  # too short: no key


A = [1, 2, 3, 4]  # the shortest window indexed is 4 tokens


@pytest.mark.parametrize(
    "seq, k, expected",
    [
        (A + [5, 6] + A, 8, [5, 6, 1, 2, 3, 4]),  # A seen before: what followed, to the end of seq
        (A + [5, 6] + A, 1, [5]),
        ([9, 9, 9, 9] + A + [8, 0] + A + [6] + [9, 9, 9, 9] + A, 2, [8, 0]),  # the 8-window first: not [6, 9]
        (A + [9, 5] + A + [7, 5] + A, 1, [7]),  # A followed by 9 once and 7 once: the newest wins
        (A + [7, 0] + A + [7, 5] + A + [9, 6] + A, 1, [7]),  # 7 twice, 9 once: the most frequent, not the newest
        ([1, 2, 3, 1, 2, 3], 2, []),  # only a 3-window repeats: left to prompt lookup
        (A, 3, []),  # nothing repeats
        (A + A, 0, []),
    ],
)
def test_live_table(seq, k, expected):
    assert SuffixDrafter().propose(seq, k).tokens == expected


def test_draft_length_follows_the_match():
    seq = list(range(100, 200)) + list(range(100, 140))  # the last 40 tokens occurred before
    d = SuffixDrafter()
    assert d.match(seq) == (32, 64)  # a 32-window matched: up to 2 x 32 tokens
    assert d.propose(seq, 64).tokens == list(range(140, 200)) + [100, 101, 102, 103]  # runs on into the repeat
    assert SuffixDrafter(cap=16).propose(seq, 64).tokens == list(range(140, 156))  # the cap
    short = [9, 8] + A + [5, 6, 7, 0, 1, 2] + A  # only a 4-window matches: at most 8 tokens
    assert SuffixDrafter().match(short) == (4, 8)
    assert SuffixDrafter().propose(short, 64).tokens == [5, 6, 7, 0, 1, 2, 1, 2]


def test_confidence_is_the_share_along_the_path():
    x = [10, 11, 12, 13]  # followed by 1 (then 5, 5) twice and by 2 (then 5, 6) once
    seq = x + [1, 5, 5, 9] + x + [1, 5, 5, 8] + x + [2, 5, 6, 3] + x
    d = SuffixDrafter()
    draft = d.propose(seq, 3)
    assert draft.tokens == [1, 5, 5] and draft.dists is None  # deterministic: q one-hot
    assert draft.confidence == pytest.approx([2 / 3, 1.0, 1.0])  # 2 of 3 continue with 1; those two agree after
    # p_min stops the walk where the path's probability falls below it
    assert SuffixDrafter(p_min=0.7).propose(seq, 3).tokens == []


def _doc(rng, n):
    return rng.integers(1000, 50_000, size=n).tolist()


def test_a_retried_request_drafts_the_earlier_answer():
    rng = np.random.default_rng(1)
    prompt, answer = _doc(rng, 60), _doc(rng, 90)
    store = SuffixStore(1 << 20)
    assert SuffixDrafter(store).propose(prompt, 64).tokens == []  # nothing seen yet
    store.add(prompt, answer)
    d = SuffixDrafter(store)
    assert d.match(prompt) == (SAME_REQUEST, 64)  # the same request again: told apart from a window
    draft = d.propose(prompt, 64)
    assert draft.tokens == answer[:64] and draft.confidence == [1.0] * 64
    assert draft.note == {"continuations": 1, "share": 1.0, "requests_ago": 1, "same_request": True}
    assert d.match(prompt + answer[:70]) == (70 + SAME_REQUEST, 20)
    assert d.propose(prompt + answer[:70], 64).tokens == answer[70:]  # mid-answer: the rest, to the doc's end
    # a request in another scope, or one without the store, sees nothing
    assert SuffixDrafter(store, scope="tenant-b").propose(prompt, 64).tokens == []
    assert SuffixDrafter(None).propose(prompt, 64).tokens == []


def test_counts_across_requests_pick_the_majority_then_the_newest():
    rng = np.random.default_rng(2)
    prompt, a, b = _doc(rng, 40), _doc(rng, 30), _doc(rng, 30)
    store = SuffixStore(1 << 20)
    for answer in (a, a, b):  # a twice, then b
        store.add(prompt, answer)
    draft = SuffixDrafter(store).propose(prompt, 64)
    assert draft.tokens == a and draft.confidence[0] == pytest.approx(2 / 3)
    store.add(prompt, b)  # 2 to 2: the newest (b) wins the tie
    draft = SuffixDrafter(store).propose(prompt, 64)
    assert draft.tokens == b and draft.confidence[0] == pytest.approx(1 / 2)
    assert draft.note == {"continuations": 2, "share": 0.5, "requests_ago": 1, "same_request": True}


def test_the_same_request_again_is_told_from_a_shared_ending():
    """The same request again is the same whole prompt, answered alike so far. Two requests that end
    alike are not (the same file after another instruction, a stock instruction in two conversations),
    and a text that merely holds the prompt's last 32 tokens does not vote on a repeat."""
    rng = np.random.default_rng(8)
    shared = _doc(rng, 300)  # a file longer than the prompt tail the store keeps, and the template
    first, other = _doc(rng, 20) + shared, _doc(rng, 20) + shared
    answer, elsewhere = _doc(rng, 80), _doc(rng, 80)
    store = SuffixStore(1 << 20)
    store.add(first, answer)
    assert SuffixDrafter(store).match(other) == (32, 64)  # the same last 300 tokens: a window, not a repeat
    store.add(_doc(rng, 30), first[-32:] + elsewhere)  # newer text holding the prompt's last 32 tokens
    d = SuffixDrafter(store)
    assert d.match(first) == (SAME_REQUEST, 64)
    draft = d.propose(first, 64)
    assert draft.tokens == answer[:64] and draft.confidence == [1.0] * 64  # the other text does not vote
    assert draft.note["requests_ago"] == 2 and draft.note["same_request"]
    assert d.match(first + answer[:5] + [7])[0] < SAME_REQUEST  # answered otherwise: no longer the same
    live = SuffixDrafter()  # a prompt that holds the same exchange already: its own text, a window
    assert live.match(first + answer + first) == (32, 64)


def test_the_longest_window_wins_across_the_request_and_the_store():
    rng = np.random.default_rng(3)
    shared = _doc(rng, 4)  # a 4-token phrase both requests contain
    store = SuffixStore(1 << 20)
    store.add(_doc(rng, 40), shared + [7, 7, 7])  # the store saw it once followed by 7s
    seq = [1, 2] + shared + [8, 8] + [5, 5] + shared  # this request saw it followed by 8s, after fewer tokens
    assert SuffixDrafter(store).propose(seq, 2).tokens == [8, 8]  # same order (4): this request is newest
    seq_longer = [9] + _doc(rng, 40)  # now a 32-window only the store has
    store.add([], seq_longer[:36] + [6, 6, 6])
    assert SuffixDrafter(store).propose([3, 3] + seq_longer[:36], 3).tokens == [6, 6, 6]


def test_same_contents_same_proposals():
    rng = np.random.default_rng(4)
    docs = [(_doc(rng, 50), _doc(rng, 50)) for _ in range(5)]
    docs.append((docs[0][0], _doc(rng, 50)))  # a conflicting answer to the first prompt
    a, b = SuffixStore(1 << 20), SuffixStore(1 << 20)
    for p, o in docs:
        a.add(p, o)
        b.add(p, o)
    for p, _ in docs:
        assert SuffixDrafter(a).propose(p, 64) == SuffixDrafter(b).propose(p, 64)


def _arrays_nbytes(store: SuffixStore) -> int:
    return sum(s.nbytes for segs in store._scopes.values() for s in segs)


def test_eviction_drops_the_oldest_whole_requests_within_the_bound():
    rng = np.random.default_rng(5)
    one = SuffixStore(1 << 30)
    one.add([], _doc(rng, 200))
    per_doc = one.nbytes  # 4 bytes a token + 12 per indexed window + 20 a document
    assert per_doc == 4 * 200 + 20 + 12 * sum(200 - o for o in ORDERS)
    store = SuffixStore(int(per_doc * 10.5))  # room for 10 documents of 200 tokens
    docs = [(_doc(rng, 40), _doc(rng, 160)) for _ in range(25)]
    for i, (p, o) in enumerate(docs):
        store.add(p, o, scope="a" if i % 3 else "b")
        assert store.nbytes == _arrays_nbytes(store) <= store.max_bytes
    assert store.n_docs == 10 and store.n_tokens == 2000
    for i, (p, o) in enumerate(docs):
        draft = SuffixDrafter(store, scope="a" if i % 3 else "b").propose(p, 64).tokens
        assert draft == (o[:64] if i >= 15 else []), i  # the 15 oldest are gone, the 10 newest answer
    assert not store.add([], _doc(rng, 3000))  # larger than the whole store: not stored
    assert store.n_docs == 10


def test_segments_stay_logarithmic():
    rng = np.random.default_rng(6)
    store = SuffixStore(1 << 30)
    for _ in range(64):
        store.add([], _doc(rng, 100))
    assert len(store._scopes[""]) <= 7  # merged like a binary counter
    small = SuffixStore(64 * store.nbytes // 64 // 4)  # room for 16 documents: segments stop at 2
    for _ in range(64):
        small.add([], _doc(rng, 100))
    assert all(s.nbytes <= small.max_bytes // 8 for s in small._scopes[""])  # no merge copies more


def test_lookup_is_cheap_on_a_million_token_store():
    rng = np.random.default_rng(7)
    vocab = 2000  # a small vocabulary: many short windows repeat, as in code
    store = SuffixStore(1 << 30)
    t0 = time.perf_counter()
    docs = [rng.integers(0, vocab, size=4000).tolist() for _ in range(250)]
    for d in docs:
        store.add(d[:1000], d[1000:])
    insert_ms = (time.perf_counter() - t0) * 1000 / len(docs)
    assert store.n_tokens >= 250 * 3256 - 1 and len(store._scopes[""]) <= 9
    seqs = [rng.integers(0, vocab, size=300).tolist() + docs[i][500:540] for i in range(0, 250, 5)]
    times = []
    for s in seqs:
        seq = list(s)
        d = SuffixDrafter(store)
        d.propose(seq, 64)  # a new request: its first call indexes its own 340 tokens
        for extra in range(5):  # steps: the sequence grows by a token, then match + propose
            seq.append(extra)
            t = time.perf_counter()
            d.match(seq)
            d.propose(seq, 64)
            times.append(time.perf_counter() - t)
    step_ms = 1000 * float(np.median(times))
    print(f"insert {insert_ms:.2f} ms per 4k-token request; step {step_ms:.3f} ms at {store.n_tokens} tokens, "
          f"{store.nbytes / 2**20:.0f} MiB")
    assert step_ms < 2.0  # ~0.1-0.3 ms on a quiet machine; the bound leaves room for a busy one


def test_a_request_too_short_for_a_window_does_not_break_lookups():
    """A finished 3-token request leaves an empty segment; looking past it must still work."""
    store = SuffixStore(1 << 20)
    store.add([1, 2], [3], "")
    drafter = SuffixDrafter(store)
    assert drafter.propose([7, 8, 9, 10, 11], 4).tokens == []
    store.add(A + [5, 6, 7], [8], "")
    assert SuffixDrafter(store).propose([0] + A, 3).tokens == [5, 6, 7]
