"""Reusing cached KV chunks that moved (llama-server's `--cache-reuse N`).

When an editor's window over a file shifts (the cursor moves, a line is edited above
it), the new prompt shares only a short prefix with the cache, but long runs of it are
still there, a few positions later in the cache than in the prompt. llama-server keeps
such runs: it drops the cells between them and shifts the run's positions down
(`llama_memory_seq_rm`, `llama_memory_seq_add`; llama.cpp re-rotates the keys at the
next decode), so only the really new tokens are evaluated.

The kept keys and values were computed after a different preceding context, so what
follows can differ from a cold evaluation of the same prompt (as in llama-server).
Memories that cannot drop a range or shift positions keep their prefix only: the contexts
ask only where the model `can_rollback` (a recurrent state can shift positions, llama.cpp
says, but cannot drop the cells between runs). `drop_cells` is the same move for a draft
model's window (drafters/window.py): the oldest recent cells go, the later ones move down.
"""
from __future__ import annotations

from typing import Sequence

import llama_cpp as C
import numpy as np

from .base import common_prefix


def plan_reuse(cached: Sequence[int], tokens: Sequence[int], n_min: int) -> tuple[int, list[tuple[int, int, int]]]:
    """What of `cached` llama-server's --cache-reuse keeps for the prompt `tokens`: (n_keep, moves).

    As llama-server (server-context.cpp, `n_cache_reuse`): keep the common prefix; then walk the
    cache (head_c) and the prompt (head_p) from its end: where cached[head_c:] and tokens[head_p:]
    agree on a run of n >= n_min tokens, that run is kept, moved from positions head_c.. to head_p..,
    and both heads pass it; otherwise head_c skips one cached token. A move (c, p, n) says
    cached[c:c+n] == tokens[p:p+n], p <= c. Runs only ever move to earlier positions (tokens the
    prompt adds before a run cannot be evaluated in front of it), so the cache afterwards holds
    tokens[:n_keep] and the caller evaluates the rest. n_min <= 0: the prefix alone.
    """
    head_c = head_p = common_prefix(cached, tokens)
    moves: list[tuple[int, int, int]] = []
    if n_min <= 0:
        return head_p, moves
    # The walk in numpy (the server matches every free slot's cache on its event loop: in Python it took
    # 0.2 s a slot at 8k tokens). The walk keeps the first cell from head_c where a run of n_min starts:
    # found for all cells at once, narrowing the candidates one token of the run at a time.
    c_arr, t_arr = np.asarray(cached, np.int64), np.asarray(tokens, np.int64)
    while (c := _first_run(c_arr, t_arr, head_c, head_p, n_min)) is not None:
        n = _run(c_arr, t_arr, c, head_p)
        moves.append((c, head_p, n))
        head_c, head_p = c + n, head_p + n
    return head_p, moves


def _first_run(cached: np.ndarray, tokens: np.ndarray, c0: int, p: int, n_min: int) -> int | None:
    """The first c >= c0 with cached[c:c + n_min] == tokens[p:p + n_min], or None."""
    if len(tokens) - p < n_min:
        return None
    cand = np.flatnonzero(cached[c0:len(cached) - n_min + 1] == tokens[p]) + c0
    for k in range(1, n_min):
        if not len(cand):
            return None
        cand = cand[cached[cand + k] == tokens[p + k]]
    return int(cand[0]) if len(cand) else None


def _run(cached: np.ndarray, tokens: np.ndarray, c: int, p: int) -> int:
    """How many tokens cached[c:] and tokens[p:] agree on, from the first (compared in growing chunks)."""
    n, i, step = min(len(cached) - c, len(tokens) - p), 0, 256
    while i < n:
        j = min(n, i + step)
        differ = np.flatnonzero(cached[c + i:c + j] != tokens[p + i:p + j])
        if len(differ):
            return i + int(differ[0])
        i, step = j, 2 * step
    return n


def reuse_chunks(mem, seq_id: int, cached: Sequence[int], tokens: Sequence[int], n_min: int) -> int | None:
    """Apply `plan_reuse` to sequence `seq_id` of llama.cpp memory `mem`, which holds `cached` at
    positions 0..: afterwards it holds exactly tokens[:n] at positions [0, n); return n.

    None (the memory untouched) where the memory cannot shift positions: keep the prefix instead.
    """
    if not C.llama_memory_can_shift(mem):
        return None
    n_keep, moves = plan_reuse(cached, tokens, n_min)
    for c, p, n in moves:  # in order: earlier moves already sit below p
        move_down(mem, seq_id, c, p, n)
    C.llama_memory_seq_rm(mem, seq_id, n_keep, -1)
    return n_keep


def move_down(mem, seq_id: int, c: int, p: int, n: int) -> None:
    """Move cells [c, c + n) of sequence `seq_id` to positions [p, p + n), p <= c, dropping the cells
    between (llama.cpp re-rotates the keys at the next decode). The memory must be able to shift."""
    C.llama_memory_seq_rm(mem, seq_id, p, c)
    C.llama_memory_seq_add(mem, seq_id, c, c + n, p - c)


def drop_cells(mem, seq_id: int, cached: list[int], start: int, n: int, can_rollback: bool) -> bool:
    """Remove cells [start, start + n) of a sequence holding `cached` at positions 0.. and move the later
    ones down by n (llama.cpp's context shift; the draft window's slide, drafters/window.py); `cached`
    follows. False, with nothing changed, where the memory cannot shift positions."""
    if not (can_rollback and C.llama_memory_can_shift(mem)):
        return False
    move_down(mem, seq_id, start + n, start, len(cached) - start - n)
    del cached[start:start + n]
    return True
