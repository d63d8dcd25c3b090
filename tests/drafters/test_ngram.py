"""Prompt-lookup drafting, as tables of sequences and expected proposals."""
import pytest

from specserve import steps
from specserve.drafters.ngram import NgramDrafter


@pytest.mark.parametrize(
    "seq, k, expected",
    [
        ([1, 2, 3, 4, 1, 2], 2, [3, 4]),  # last 2 tokens [1, 2] seen before: propose what followed
        ([1, 2, 3, 4, 1, 2], 8, [3, 4, 1, 2]),  # continuation runs to the end of the sequence
        ([1, 2, 3, 9, 2, 3, 7, 2, 3], 1, [7]),  # most recent earlier match wins: not [9]
        ([5, 1, 2, 8, 6, 1, 2, 9, 5, 1, 2], 2, [8, 6]),  # longest n first: [5, 1, 2] beats [1, 2] -> not [9, 5]
        ([1, 2, 3, 4], 3, []),  # nothing repeats
        ([7, 7, 7], 2, [7]),  # overlapping match of [7, 7] at positions 0-1 continues with 7
        ([1, 2, 1, 2], 0, []),  # k = 0: no draft
        ([3], 4, []),  # too short to match anything
    ],
)
def test_lookup_table(seq, k, expected):
    assert NgramDrafter(n_min=1, n_max=3).propose(seq, k).tokens == expected


def test_index_follows_a_growing_sequence_and_a_new_request():
    d = NgramDrafter(n_min=1, n_max=2)
    seq = [1, 2, 3, 1]
    assert d.propose(seq, 2).tokens == [2, 3]
    seq += [2, 3, 4, 1, 2]  # grows: only the new n-grams are indexed
    assert d.propose(seq, 2).tokens == [3, 4]  # [1, 2] most recently followed by 3 (at 4-5), not the suffix itself
    assert d.propose([9, 8, 9], 1).tokens == [8]  # a different sequence: the index starts over


def test_min_n_respected():
    assert NgramDrafter(n_min=2, n_max=3).propose([1, 5, 1], 2).tokens == []  # only a 1-gram repeats


def test_peek_tells_the_match_before_proposing():
    d = NgramDrafter(n_min=1, n_max=3)
    assert d.peek([1, 2, 3, 4, 1, 2]) == (2, 4)  # [1, 2] seen before; 4 tokens follow it (3, 4, 1, 2)
    assert d.peek([1, 2, 3]) == (0, 0)  # nothing repeats: nothing to draft


@pytest.mark.parametrize(
    "head, k, expected",
    [
        ([3], 2, [4, 1]),  # its own proposal [3, 4, 1] starts with the head: what follows it
        ([3, 4], 2, [1, 2]),
        ([9], 2, []),  # its proposal does not start with the head: nothing of its own after it
        ([], 2, [3, 4]),  # no head: its own proposal
    ],
)
def test_a_lookup_continues_after_another_drafters_head_where_its_proposal_starts_with_it(head, k, expected):
    """The default continue_after_steps (drafters/base.py), which a grammar's forced run uses (drafters/forced.py)."""
    d = NgramDrafter(n_min=1, n_max=3)
    assert steps.direct(d.continue_after_steps([1, 2, 3, 4, 1, 2], head, k, None)).tokens == expected
