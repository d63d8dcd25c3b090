"""What a step costs, measured: the target's verify pass, a drafter's drafting, the prompt's catch-up.

Costs are measured, never assumed: a CPU verifies 8 tokens at 2-4x the cost of one, a GPU
at ~1x. `VerifyCost` is the seconds of one target pass over n tokens (an EMA per n made
non-decreasing, interpolated and extrapolated); `DraftCost` the seconds a drafter takes for
n tokens after its cache missed `lag` (a decayed ridge regression a + b n + c (lag - 1)).
The prompt's catch-up, per drafter, is an EMA of seconds per prompt token. `Costs` holds the
three for an engine (controller.py), with each drafter's cost before it has any data.

Nothing here locks: the owner (auto.controller.Controller) holds its lock around every call.
"""
from __future__ import annotations

import bisect
import logging

from .names import FREE

log = logging.getLogger("specserve")

_G_COST = 0.95  # per-step decay of the drafting-cost regression
_LOADED_OBS = 4  # the most observations a loaded pass-cost estimate counts as
# passes after which a pass length not measured since is stale, at most: it is left out of the fit
# (interpolated or extrapolated from the fresh ones, optimistically) until a pass of it measures it anew
STALE = 512
STALE_MIN = 16  # the soonest an estimate far above the prior shape goes stale
# the prior shape of a pass's cost: each token past the first adds this share of a 1-token pass (what the fit
# extrapolates with before two pass lengths are measured; a CPU's F16 passes measure about 0.16, a GPU's ~0)
PRIOR_PER_TOKEN = 0.2
# a loaded drafting cost is checked against this many of a process's first drafts, and dropped where one
# costs less than 1 / LOADED_CHEAPER of what it predicts
LOADED_CHECKS = 4
LOADED_CHEAPER = 2.0
LOADED_CHECK_LAG = 9  # judged on drafts that caught up at most this many tokens: a step's own, not a lookup run's


class DraftCost:
    """Seconds to draft n tokens after `lag` missed ones: a + b n + c (lag - 1), by decayed ridge regression.

    The draft model evaluates the missed tokens in one batch (its first draft token comes
    from it), then one token at a time; a is what the first evaluation costs beyond the
    others (its caches went cold during the target's pass). With one draft length a and b
    cannot be told apart: the prior makes them equal.
    """

    def __init__(self):
        self.xx, self.xy, self._coef = [[0.0] * 3 for _ in range(3)], [0.0] * 3, None  # [3, 3], [3]
        self.checks = 0  # fresh drafts still to check a loaded fit against (Costs.learn_draft_cost)

    def add(self, n: int, lag: int, t: float) -> None:
        x = (1.0, n, lag - 1)
        for i in range(3):
            self.xy[i] = self.xy[i] * _G_COST + x[i] * t
            for j in range(3):
                self.xx[i][j] = self.xx[i][j] * _G_COST + x[i] * x[j]
        self._coef = None

    def lag_known(self) -> bool:
        """Whether the catch-up lags seen varied enough to tell c (else c is the prior's)."""
        s1, sm, smm = self.xx[0][0], self.xx[0][2], self.xx[2][2]
        return s1 > 0 and smm / s1 - (sm / s1) ** 2 > 0.25

    def coef(self, e: float, r: float) -> list[float]:
        """[a, b, c], pulled toward (e, e, r e) by one pseudo-observation each.

        e: seconds of one evaluation, from the data when there is some: the least-squares
        fit of t = e (1 + n + r m); r: a batched token's cost relative to e.
        """
        if self._coef is None:
            (s1, sn, sm), (_, snn, snm), (_, _, smm) = self.xx
            x2 = s1 + snn + r * r * smm + 2 * (sn + r * sm + r * snm)
            if x2 > 0:
                e = (self.xy[0] + self.xy[1] + r * self.xy[2]) / x2
            prior, keep = (e, e, r * e), [0, 1, 2]
            while True:  # (X^T X + I) w = X^T y + prior over the kept coefficients, none negative
                w = _solve([[self.xx[i][j] + (i == j) for j in keep] for i in keep],
                           [self.xy[i] + prior[i] for i in keep])
                if min(w) >= 0 or len(keep) == 1:
                    break
                keep.pop(w.index(min(w)))
            self._coef = [0.0] * 3
            for i, v in zip(keep, w):
                self._coef[i] = max(v, 0.0)
        return self._coef

    def scale(self, factor: float) -> None:
        """Every cost it has seen, times factor (the machine got faster or slower)."""
        self.xy, self._coef = [y * factor for y in self.xy], None

    def state(self) -> dict:
        """A copy: `add` changes the lists in place (a state kept as loaded must not follow them)."""
        return {"xx": [list(row) for row in self.xx], "xy": list(self.xy)}

    @classmethod
    def from_state(cls, state: dict, weight: float) -> "DraftCost":
        d = cls()
        d.checks = LOADED_CHECKS
        d.xx = [[float(x) * weight for x in row] for row in state["xx"]]
        d.xy = [float(x) * weight for x in state["xy"]]
        if len(d.xx) != 3 or any(len(row) != 3 for row in d.xx) or len(d.xy) != 3:
            raise ValueError("draft cost regression of the wrong shape")
        return d


def _solve(m: list[list[float]], y: list[float]) -> list[float]:
    """m w = y for a symmetric positive definite m of size 1 to 3, by cofactors."""
    if len(m) == 1:
        return [y[0] / m[0][0]]
    if len(m) == 2:
        (p, q), (_, r) = m
        det = p * r - q * q
        return [(r * y[0] - q * y[1]) / det, (p * y[1] - q * y[0]) / det]
    (a, b, c), (_, d, e), (_, _, f) = m
    c00, c01, c02 = d * f - e * e, c * e - b * f, b * e - c * d
    c11, c12, c22 = a * f - c * c, b * c - a * e, a * d - b * b
    det = a * c00 + b * c01 + c * c02
    return [(c00 * y[0] + c01 * y[1] + c02 * y[2]) / det, (c01 * y[0] + c11 * y[1] + c12 * y[2]) / det,
            (c02 * y[0] + c12 * y[1] + c22 * y[2]) / det]


def _isotonic(y: list[float], w: list[float]) -> list[float]:
    """The weighted least-squares non-decreasing fit to y (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, size]
    for yi, wi in zip(y, w):
        blocks.append([yi, wi, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, s2 = blocks.pop()
            m1, w1, s1 = blocks[-1]
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, s1 + s2]
    return [m for m, _, size in blocks for _ in range(int(size))]


class VerifyCost:
    """Seconds of one target pass over n tokens, measured.

    An EMA per n, then a fit non-decreasing in n weighted by observations that fade while
    other n are measured (a stale or warm-up-slow estimate yields to fresh ones), then
    interpolated between measured n and extrapolated with the slope across them.

    A long pass measured once in a slow spell and never since would price long drafts out for
    good: they are never planned, so never measured again (a profile saved after prose, where
    no long draft ran for thousands of passes, then a code edit; a first run on a busy machine,
    whose 2-token pass cost 17 of its 1-token ones). Three rules keep such an estimate from
    outliving the spell:
    - physics: a pass over n tokens costs at most n passes over one (the batch runs the same
      work, with the weights read once). A measurement above that is an outlier, recorded at
      the bound, and the fit never stands above it;
    - an n not measured in `stale_after(n)` passes is left out of the fit: its cost is
      interpolated between fresh ones or extrapolated past them, optimistically, and the next
      pass over it starts its estimate anew;
    - `stale_after(n)` is STALE for an estimate at or below the prior shape (PRIOR_PER_TOKEN),
      and shrinks with the square of how far it stands above it, to STALE_MIN: an estimate that
      keeps drafting off is re-checked soon, one near what passes usually cost rarely.
    A saved profile's estimates keep their ticks, so a loaded estimate far above the prior
    shape is stale as soon as the passes since it was measured say so (learned.py).
    """

    stale = STALE  # passes after which an n not measured since is stale

    def __init__(self):
        self._m: dict[int, list] = {}  # n -> [EMA seconds, observations, tick of the last]
        self._keys: list[int] = []  # measured n, sorted
        self._tick = self._built = 0  # passes measured: all, and when the table was last built
        self._table: list[float] | None = None
        self._soonest = self.stale  # the fewest passes after which an estimate of the table goes stale
        self.batching = 1.0  # (seconds per extra token) / (seconds of a 1-token pass)

    def add(self, n: int, t: float) -> None:
        self._tick += 1
        one = self._m.get(1)
        if n > 1 and one is not None:
            t = min(t, n * one[0])  # an outlier (a preempted pass): no batch costs more than its tokens one by one
        m = self._m.get(n)
        if m is None or self._tick - m[2] > self.stale_after(n):  # new, or stale: measured anew
            if m is None:
                bisect.insort(self._keys, n)
            self._m[n], self._table = [t, 1, self._tick], None
            return
        m[1], m[2] = m[1] + 1, self._tick
        m[0] += (min(t, 3 * m[0]) - m[0]) * max(0.05, 1 / m[1])  # clipped: a preempted pass
        # rebuilt when an estimate moved by more than 2%, at most every 8 passes, and every quarter
        # of the soonest staleness (an estimate may have gone stale)
        tab, since = self._table, self._tick - self._built
        if tab is not None and since >= 8 and (
                n >= len(tab) or abs(m[0] - tab[n]) > 0.02 * tab[n] or 4 * since >= self._soonest):
            self._table = None

    def refit(self) -> None:
        """Drop the cached table: the next `table` is fitted from the estimates as they are now (a cached one may
        lag them by up to 2%, see observe)."""
        self._table = None

    def table(self, n_max: int) -> list[float] | None:
        """[n_max + 1] seconds of a pass over n tokens (index 0 unused); None before any pass.

        The same list is returned until an estimate moves: callers may cache on its identity."""
        if self._table is not None and len(self._table) > n_max:
            return self._table
        keys = self._fresh_keys()
        if not keys:
            return None
        w = [max(min(self._m[n][1], 20) * 0.99 ** (self._tick - self._m[n][2]), 1e-6) for n in keys]
        lo, hi = keys[0], keys[-1]
        fit = dict(zip(keys, _isotonic([self._m[n][0] for n in keys], w)))
        fit = {n: min(t, fit[lo] * n / lo) for n, t in fit.items()}  # physics (see the class docstring)
        # a guess before two n: the prior shape, which the extrapolation below halves
        slope = (fit[hi] - fit[lo]) / (hi - lo) if hi > lo else 2 * PRIOR_PER_TOKEN * fit[lo] / lo
        tab = [0.0] * (n_max + 1)
        for n in range(1, n_max + 1):
            j = bisect.bisect_left(keys, n)
            if j == 0:
                tab[n] = max(fit[lo] - slope * (lo - n), 0.5 * fit[lo])
            elif j == len(keys):  # optimistic: passes cost less a token as they grow (CPU), or
                tab[n] = fit[hi] + 0.5 * slope * (n - hi)  # ~nothing (GPU); a pass of n corrects it
            else:  # keys[j] may be n itself
                a, b = keys[j - 1], keys[j]
                tab[n] = fit[a] + (fit[b] - fit[a]) * (n - a) / (b - a)
        self._table, self._built = tab, self._tick
        self.batching = (tab[n_max] - tab[1]) / ((n_max - 1) * tab[1]) if n_max > 1 else 1.0
        return tab

    def stale_after(self, n: int) -> int:
        """Passes after which the estimate of n, not measured since, is stale: STALE at or below the prior
        shape (PRIOR_PER_TOKEN over the shortest measured pass), fewer the further above it it stands."""
        lo = self._keys[0] if self._keys else n
        if n <= lo:
            return self.stale
        base = self._m[lo][0] / (1 + PRIOR_PER_TOKEN * (lo - 1))  # a 1-token pass, as the shortest measured says
        est = min(self._m[n][0], base * n)  # physics
        r = est / (base * (1 + PRIOR_PER_TOKEN * (n - 1)))
        return self.stale if r <= 1 else max(int(self.stale / (r * r)), STALE_MIN)

    def _fresh_keys(self) -> list[int]:
        """The measured n the fit uses: the fresh ones (all, while none is)."""
        after = {n: self.stale_after(n) for n in self._keys}
        self._soonest = min(after.values(), default=self.stale)
        return [n for n in self._keys if self._tick - self._m[n][2] <= after[n]] or self._keys

    def scale(self, factor: float) -> None:
        """Every estimate times factor (the machine is that much faster or slower than when they were measured)."""
        for m in self._m.values():
            m[0] *= factor
        self._table = None

    def state(self) -> dict:
        return {"passes": [[n, *self._m[n]] for n in self._keys], "tick": self._tick}

    @classmethod
    def from_state(cls, state: dict) -> "VerifyCost":
        v = cls()
        for n, ema, obs, tick in state["passes"]:
            n = int(n)
            # as few as _LOADED_OBS observations: this process's own passes soon outweigh a saved
            # estimate (the machine may be busier or quieter than when it was saved)
            v._m[n] = [float(ema), max(1, min(int(obs), _LOADED_OBS)), int(tick)]
            bisect.insort(v._keys, n)
        v._tick = int(state["tick"])
        return v


CostModel = VerifyCost  # the name the first controller used


class Costs:
    """An engine's measured costs: the target's passes, each drafter's drafting and prompt catch-up."""

    def __init__(self):
        self.verify = VerifyCost()
        self.draft: dict[str, DraftCost] = {}
        self.prompt_cost: dict[str, float] = {}  # seconds per prompt token a model drafter catches up (EMA)
        self.cost_ratio: dict[str, float] = {}  # a drafter's token cost / the target's, before any data

    def draft_coef(self, name: str, V: list[float]) -> list[float]:
        """[a, b, c]: seconds to draft n tokens after missing lag = a + b n + c (lag - 1)."""
        # before any data: a draft model costs its share of the target's weights (memory-bound decode)
        e = 0.0 if name in FREE else self.cost_ratio.get(name, 0.125) * V[1]
        r = self.verify.batching  # assumed to help the drafter as much as it helps the target
        fit = self.draft.get(name)
        return fit.coef(e, r) if fit is not None else [e, e, r * e]

    def learn_prompt_cost(self, name: str, per_token: float) -> None:
        old = self.prompt_cost.get(name, per_token)
        self.prompt_cost[name] = 0.7 * old + 0.3 * per_token

    def learn_draft_cost(self, name: str, n: int, lag: int, seconds: float) -> None:
        """A drafter took `seconds` for n tokens, its cache `lag` tokens behind.

        A loaded fit that one of this process's first drafts finds LOADED_CHEAPER times dearer than
        they are is dropped: it was learnt while the machine was busy (a newcomer's first run beside a
        build saved the 0.5B at 2-4x its cost, and the next process, pricing it so, drafted on 2 steps
        of 199 and did not time it again). Dearer than saved is left to the regression's decay: a slow
        spell now should not erase what quiet minutes learnt."""
        fit = self.draft.get(name) or self.draft.setdefault(name, DraftCost())
        if fit.checks and lag <= LOADED_CHECK_LAG:  # (a long catch-up is one batch: the fit's c says little there)
            fit.checks -= 1
            a, b, c = fit.coef(0.0, self.verify.batching)
            predicted = a + b * n + c * (lag - 1)
            if seconds * LOADED_CHEAPER < predicted:
                fit = self.draft[name] = DraftCost()
                log.info("auto: drafter %r drafted %d tokens in %.1f ms, %.1fx under its saved cost: "
                         "the saved cost is dropped", name, n, 1e3 * seconds, predicted / seconds)
        fit.add(n, lag, seconds)

    def scale(self, name: str, factor: float) -> None:
        """The drafter's costs, its prompt catch-up too, times factor (Controller.calibrate)."""
        self.draft[name].scale(factor)
        if name in self.prompt_cost:
            self.prompt_cost[name] *= factor

    def state(self) -> dict:
        """Its sections of a saved profile (controller.Controller.state_dict); not cost_ratio, which the
        engine sets from its models."""
        return {"verify": self.verify.state(),
                "draft_cost": {name: fit.state() for name, fit in self.draft.items()},
                "prompt_cost": dict(self.prompt_cost)}

    @classmethod
    def from_state(cls, state: dict, weight: float, cost_ratio: dict[str, float]) -> "Costs":
        """From a saved profile, the drafting costs' evidence scaled by `weight` (Controller.load_state_dict)."""
        c = cls()
        c.verify = VerifyCost.from_state(state["verify"])
        c.draft = {str(name): DraftCost.from_state(fit, weight) for name, fit in state["draft_cost"].items()}
        c.prompt_cost = {str(k): float(x) for k, x in state["prompt_cost"].items()}
        c.cost_ratio = cost_ratio
        return c
