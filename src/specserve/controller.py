"""The adaptive policy behind `--spec auto`: speculate only while it pays.

Each step picks the drafter and draft length k (k = 0: plain decoding, 1 token in
verify(1)) with the highest E[tokens] / E[seconds]:

    E[tokens](k)  = 1 + sum_{i=1..k} prod_{j<=i} d_j a_j
    E[seconds](k) = sum_{l<=k} P(len = l) (draft(l) + verify(1 + l)),  P(len >= i) = prod_{j<=i} d_j

a_j = P(draft token j accepted | 1..j-1 accepted); d_j = P(the drafter returns a j-th
token | it returned j - 1). The engine tells the policy each step what prompt lookup
would match (`see_ngram`: the order n of the matched n-gram and the tokens after it), so
the n-gram is planned only when it has a match (d = 1 up to what is available), with
acceptance learnt per match order: a 4-gram match predicts a copy far better than a 1-gram.

Costs are measured, never assumed (a CPU verifies 8 tokens at 2-4x the cost of one, a
GPU at ~1x). `Controller`, one per engine and shared by its requests, holds: verify(n),
an EMA per n made non-decreasing, interpolated and extrapolated; draft(l) + catch-up as
a decayed ridge regression a + b l + c (lag - 1) per drafter (lag: tokens its cache missed,
many after it sat out; at its first use in a request, the prompt too); pooled acceptance,
the prior of new requests. `AutoPolicy`, one per request, keeps decayed per-position
counts shrunk toward its pooled rate. Switching on a lagging drafter charges its
catch-up over the tokens the request is still expected to make.

A draft model takes the prompt before the first step (`prefill`) only if it is expected
to save more over the request than the prompt costs it (its measured seconds per prompt
token x the tokens its cache lacks): on a CPU a Q4_1 draft processes a long prompt at
half the F16 target's speed, which a short answer never wins back.

A drafter not in use is probed with a short draft once the steps since its last use
reach an interval (doubled after a failure, up to 32) and the probe's expected loss,
catch-up included, fits in _EPS of the decode time since the drafter last ran (in this
request, plus what the engine saved before it). A fully accepted probe is followed up at
once, a few times; one whose catch-up cost is still unknown, while its lag is short; one
that could not pay even at 100% acceptance, at 1/8 of the budget.
"""
from __future__ import annotations

import bisect
import threading

from .config import SpecParams
from .policy import OFF, Choice, Outcome

_G_POS = 0.97  # per-trial decay of a request's counts at one draft position
_G_POOL = 0.95  # per-step decay of a request's pooled counts
_G_ENGINE = 0.98  # per-step decay of the engine's pooled counts
_G_COST = 0.95  # per-step decay of the drafting-cost regression
_SHRINK = 2.0  # pseudo-trials pulling a position's rate toward the pooled rate
_PRIOR_W = 10.0  # pseudo-trials pulling a request's pooled rate toward the engine's
_EPS = 0.01  # share of decode time that probes may lose
_PROBE_MIN, _PROBE_MAX = 4, 32  # steps between probes of an unused drafter
_FOLLOW_UPS = 6  # successful probes in a row that may bypass the budget
_PRIORS = {"ngram": (0.6, 0.6)}  # (acceptance, delivery) before any data; others (0.7, 1.0)
# the n-gram's acceptance given the order n of the n-gram it matched (its draft follows an
# earlier occurrence of the last n tokens): longer matches predict better
_NGRAM_ORDER_PRIOR = {1: 0.15, 2: 0.3, 3: 0.45, 4: 0.6, 8: 0.7, 16: 0.8, 32: 0.85}
# drafters with no model, which copy what follows an earlier occurrence of the text's end:
# nearly free to query or to catch up, and their offer (match length, tokens available) is known
_FREE = frozenset({"ngram", "suffix"})
LOOKUP_MAX = 64  # how far a lookup drafter may draft under auto where the user set no --draft-max


def match_bucket(order: int) -> int:
    """Match lengths pooled for acceptance: 1, 2, 3, 4-7, 8-15, 16-31, 32+."""
    if order < 4:
        return order
    return 4 if order < 8 else 8 if order < 16 else 16 if order < 32 else 32


class _Rates:
    """P(success at draft position i | success at 1..i-1), i = 1..cap, as decayed counts."""

    def __init__(self, cap: int):
        self.hit, self.tried = [0.0] * cap, [0.0] * cap  # [cap] decayed counts per position
        self.h = self.t = 0.0  # pooled over positions
        self._cache: list[float] | None = None

    def add(self, n_tried: int, n_hit: int) -> None:
        for i in range(n_tried):
            self.hit[i] = self.hit[i] * _G_POS + (i < n_hit)
            self.tried[i] = self.tried[i] * _G_POS + 1.0
        self.h, self.t, self._cache = self.h * _G_POOL + n_hit, self.t * _G_POOL + n_tried, None

    def rates(self, prior: float) -> list[float]:
        """[cap], each shrunk toward the pooled rate, itself shrunk toward `prior`."""
        if self._cache is None:
            pooled = (self.h + _PRIOR_W * prior) / (self.t + _PRIOR_W)
            self._cache = [(h + _SHRINK * pooled) / (t + _SHRINK) for h, t in zip(self.hit, self.tried)]
        return self._cache


class _DraftCost:
    """Seconds to draft n tokens after `lag` missed ones: a + b n + c (lag - 1), by decayed ridge regression.

    The draft model evaluates the missed tokens in one batch (its first draft token comes
    from it), then one token at a time; a is what the first evaluation costs beyond the
    others (its caches went cold during the target's pass). With one draft length a and b
    cannot be told apart: the prior makes them equal.
    """

    def __init__(self):
        self.xx, self.xy, self._coef = [[0.0] * 3 for _ in range(3)], [0.0] * 3, None  # [3, 3], [3]

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


class CostModel:
    """Seconds of one target pass over n tokens, measured.

    An EMA per n, then a fit non-decreasing in n weighted by observations that fade while
    other n are measured (a stale or warm-up-slow estimate yields to fresh ones), then
    interpolated between measured n and extrapolated with the slope across them.
    """

    def __init__(self):
        self._m: dict[int, list] = {}  # n -> [EMA seconds, observations, tick of the last]
        self._keys: list[int] = []  # measured n, sorted
        self._tick = self._built = 0  # passes measured: all, and when the table was last built
        self._table: list[float] | None = None
        self.batching = 1.0  # (seconds per extra token) / (seconds of a 1-token pass)

    def add(self, n: int, t: float) -> None:
        self._tick += 1
        m = self._m.get(n)
        if m is None:
            bisect.insort(self._keys, n)
            self._m[n], self._table = [t, 1, self._tick], None
            return
        m[1], m[2] = m[1] + 1, self._tick
        m[0] += (min(t, 3 * m[0]) - m[0]) * max(0.05, 1 / m[1])  # clipped: a preempted pass
        tab = self._table  # rebuilt when an estimate moved by more than 2%, at most every 8 passes
        if tab is not None and self._tick - self._built >= 8 and (n >= len(tab) or abs(m[0] - tab[n]) > 0.02 * tab[n]):
            self._table = None

    def table(self, n_max: int) -> list[float] | None:
        """[n_max + 1] seconds of a pass over n tokens (index 0 unused); None before any pass."""
        if self._table is not None and len(self._table) > n_max:
            return self._table
        keys = self._keys
        if not keys:
            return None
        w = [max(min(self._m[n][1], 20) * 0.99 ** (self._tick - self._m[n][2]), 1e-6) for n in keys]
        fit = dict(zip(keys, _isotonic([self._m[n][0] for n in keys], w)))
        lo, hi = keys[0], keys[-1]
        slope = (fit[hi] - fit[lo]) / (hi - lo) if hi > lo else 0.4 * fit[lo] / lo  # a guess before two n
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


class Controller:
    """Engine-level state shared by the requests of one engine: costs, priors, probe pacing.

    What it learns can be kept across processes (`learned.ProfileStore`): `state_dict()`
    and `load_state_dict()` carry the measured costs and the pooled acceptance, not the
    probe pacing of the moment.
    """

    def __init__(self, store=None):
        self.lock = threading.Lock()  # one observation at a time updates the shared state
        self.store = store  # a learned.ProfileStore, or None: nothing kept across processes
        self.n_requests = 0
        self.verify = CostModel()
        self.draft: dict[str, _DraftCost] = {}
        self.prompt_cost: dict[str, float] = {}  # seconds per prompt token a model drafter catches up (EMA)
        self.pooled: dict[tuple, list[float]] = {}  # (drafter, order, regime) -> decayed counts
        self.interval: dict[str, int] = {}  # probe interval, steps
        self.last_used: dict[str, float] = {}  # self.clock when the drafter last drafted, any request
        self.clock = 0.0  # seconds of drafting and verifying observed, all requests
        self.requests, self.tokens = 1.0, 256.0  # decayed counts; a prior of 256 tokens a request
        self.cost_ratio: dict[str, float] = {}  # a drafter's token cost / the target's, before any data

    def policy(self, spec: SpecParams, drafter_names: list[str], temperature: float = 0.0) -> "AutoPolicy":
        with self.lock:
            self.requests, self.tokens = 0.9 * self.requests + 1, 0.9 * self.tokens
            self.n_requests += 1
            if self.store is not None and self.store.due(self.n_requests):
                self.store.save(self._state(), self.n_requests)
        return AutoPolicy(self, spec, drafter_names, temperature)

    # --- kept across processes ---------------------------------------------------------------

    def load(self) -> bool:
        """Take up the store's saved state, if it has one for these models; whether it did."""
        state = self.store.load() if self.store is not None else None
        if state is None:
            return False
        try:
            self.load_state_dict(state)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            import logging

            logging.getLogger("specserve").warning("ignoring a malformed auto profile (%s)", e)
            self.__init__(self.store)
            return False
        return True

    def save(self) -> None:
        if self.store is not None:
            with self.lock:
                self.store.save(self._state(), self.n_requests)

    def state_dict(self) -> dict:
        with self.lock:
            return self._state()

    def _state(self) -> dict:
        v = self.verify
        return {
            "verify": {"passes": [[n, *v._m[n]] for n in v._keys], "tick": v._tick},
            "draft_cost": {name: {"xx": fit.xx, "xy": fit.xy} for name, fit in self.draft.items()},
            "prompt_cost": dict(self.prompt_cost),
            "pooled": [[name, order, regime, *counts] for (name, order, regime), counts in self.pooled.items()],
            "requests": self.requests, "tokens": self.tokens,
        }

    def load_state_dict(self, state: dict, weight: float = 0.5) -> None:
        """Restore a saved state, its evidence scaled by `weight` so that this process's own
        measurements soon outweigh it (the machine may be busier or quieter than it was)."""
        v = CostModel()
        for n, ema, obs, tick in state["verify"]["passes"]:
            n = int(n)
            v._m[n] = [float(ema), max(1, min(int(obs), 20)), int(tick)]
            bisect.insort(v._keys, n)
        v._tick = int(state["verify"]["tick"])
        draft = {}
        for name, fit in state["draft_cost"].items():
            d = _DraftCost()
            d.xx = [[float(x) * weight for x in row] for row in fit["xx"]]
            d.xy = [float(x) * weight for x in fit["xy"]]
            if len(d.xx) != 3 or any(len(row) != 3 for row in d.xx) or len(d.xy) != 3:
                raise ValueError("draft cost regression of the wrong shape")
            draft[str(name)] = d
        pooled = {}
        for name, order, regime, *counts in state["pooled"]:
            if len(counts) != 4 or min(counts) < 0:
                raise ValueError("pooled acceptance counts of the wrong shape")
            pooled[(str(name), int(order), float(regime))] = [float(c) * weight for c in counts]
        with self.lock:
            self.verify, self.draft, self.pooled = v, draft, pooled
            self.prompt_cost = {str(k): float(x) for k, x in state["prompt_cost"].items()}
            self.requests, self.tokens = float(state["requests"]), float(state["tokens"])

    def prior(self, name: str, order: int = 0, regime: float = 0.0) -> list[float]:
        """Pooled [accepted, tried, delivered, asked] of a drafter (at one n-gram match order) at one
        temperature regime: acceptance at temperature 0 says little about acceptance at 0.8."""
        key = (name, order, regime)
        p = self.pooled.get(key)
        if p is None:
            a, d = (_NGRAM_ORDER_PRIOR[order], 1.0) if order else _PRIORS.get(name, (0.7, 1.0))
            p = self.pooled[key] = [2 * a, 2.0, 2 * d, 2.0]
        return p

    def draft_coef(self, name: str, V: list[float]) -> list[float]:
        """[a, b, c]: seconds to draft n tokens after missing lag = a + b n + c (lag - 1)."""
        # before any data: a draft model costs its share of the target's weights (memory-bound decode)
        e = 0.0 if name in _FREE else self.cost_ratio.get(name, 0.125) * V[1]
        r = self.verify.batching  # assumed to help the drafter as much as it helps the target
        fit = self.draft.get(name)
        return fit.coef(e, r) if fit is not None else [e, e, r * e]


class AutoPolicy:
    """One request's adaptive policy; see the module docstring."""

    # the engine tells it, each step, what each lookup drafter would match: see(name, offer)
    # (see_ngram(order, available) where the engine speaks only of the n-gram)
    sees_offers = True
    sees_ngram = True

    def __init__(self, ctl: Controller, spec: SpecParams, names: list[str], temperature: float = 0.0):
        self.ctl, self.names = ctl, list(names)
        # a model drafter stops at --draft-max; a lookup drafter at its own, longer cap (which a
        # --draft-max the user set lowers: SpecParams.suffix_max)
        lookup_cap = getattr(spec, "suffix_max", LOOKUP_MAX) or spec.draft_max
        self.caps = {n: lookup_cap if n in _FREE else spec.draft_max for n in names}
        self.cap = max(self.caps.values(), default=spec.draft_max)
        self.regime = min(round(temperature * 4) / 4, 2.0)  # pooled priors per 0.25 of temperature
        # the draft model returns nothing below --draft-min under greedy: never ask for fewer
        self.kmin = {n: max(1, spec.draft_min) if n == "draft" else 1 for n in names}
        self.acc = {n: _Rates(self.caps[n]) for n in names}
        self.acc_order: dict[tuple[str, int], _Rates] = {}  # a lookup drafter's acceptance by match bucket
        self.offers: dict[str, tuple[int, int]] = {}  # lookup drafter -> (match length, tokens available)
        self._step_order = 0  # the match bucket of the drafter used at the step being observed
        self.dlv = {n: _Rates(self.caps[n]) for n in names}
        self.lag = dict.fromkeys(names, 0)  # tokens the drafter's cache is behind (after the prompt)
        self.fresh = set(names)  # not run in this request: its cache also lacks the prompt
        self.missing = dict.fromkeys(names, 0)  # prompt tokens a fresh drafter's cache lacks
        self.max_tokens = 1 << 30  # the request's own cap on what it generates
        self.used_step = dict.fromkeys(names, -(1 << 30))
        # the probe budget accrues with this request's own seconds, from what the engine had saved
        self.clock = 0.0
        self.since = {n: ctl.last_used.get(n, float("-inf")) - ctl.clock for n in names}
        self._step_offers: dict[str, tuple[int, int]] = {}
        self.step = self.generated = 0
        self.probing: tuple | None = None  # (drafter, whether it displaced a drafter, its plan)
        self.pending: tuple | None = None  # (drafter, plan): a probe that found nothing, to ask again
        self.follow_up: tuple | None = None  # (drafter, successes): its last probe succeeded, probe again
        self.pred_tokens = self.pred_time = 0.0
        self._probe_cost: dict[str, float] = {}  # seconds a probe of the drafter was last expected to lose
        self._plans_V: list[float] | None = None  # the cost table the cached plans were made with
        self._plans: dict[str, dict[tuple, tuple[float, int, float, float]]] = {n: {} for n in names}

    @property
    def predicted_tokens_per_s(self) -> float:
        return self.pred_tokens / self.pred_time if self.pred_time > 0 else 0.0

    def _plan(self, name, V, kmin=1, kmax=None, found=False, ceiling=False) -> tuple[float, int, float, float]:
        """Best (tokens/s, k, E[tokens], E[seconds]) of one drafter over k in [kmin, kmax].

        found: given that the drafter returns a first token (the n-gram found a match);
        ceiling: as if every draft token were accepted. Cached until V or the drafter's
        estimates change.
        """
        if V is not self._plans_V:
            self._plans_V, self._plans = V, {n: {} for n in self.names}
        order, cap = 0, self.caps[name]
        kmax = min(kmax or cap, cap)
        if name in self.offers:  # what it would draft now is known
            order, available = self.offers[name]
            found, kmax = True, min(kmax, available)
            if not order or kmax < kmin:
                return (0.0, 0, 1.0, V[1])  # no match: nothing to draft
            order = match_bucket(order)
        key = (kmin, kmax, found, ceiling, order)
        best = self._plans[name].get(key)
        if best is not None:
            return best
        p = self.ctl.prior(name, 0, self.regime)
        if ceiling:
            acc = [1.0] * cap
        elif order:
            q = self.ctl.prior(name, order, self.regime)
            acc = self.acc_order.setdefault((name, order), _Rates(cap)).rates(q[0] / q[1])
        else:
            acc = self.acc[name].rates(p[0] / p[1])
        # a known match delivers every token up to `available`, which bounds kmax
        dlv = [1.0] * cap if order else self.dlv[name].rates(p[2] / p[3])
        a, b, c = self.ctl.draft_coef(name, V)
        best_r, best_k, best_e, best_t = 0.0, 0, 1.0, V[1]
        reach, chain, e_tok, s = 1.0, 1.0, 1.0, 0.0  # P(len >= i), P(len >= i, all accepted)
        c_prev = a + V[1]  # seconds of a step whose draft came back with i - 1 tokens
        # (the cache then misses 2 tokens instead of 1 after a fully accepted draft: + c chain)
        for i in range(1, kmax + 1):
            d = 1.0 if found and i == 1 else dlv[i - 1]
            r = reach * d
            s += (reach - r) * c_prev
            reach, chain = r, chain * d * acc[i - 1]
            e_tok += chain
            c_prev = a + b * i + c * chain + V[i + 1]
            t = s + reach * c_prev
            if i >= kmin:
                if e_tok > best_r * t:
                    best_r, best_k, best_e, best_t = e_tok / t, i, e_tok, t
                if chain < 0.02:
                    break  # longer drafts add < 0.02 tokens a position
        best = (best_r, best_k, best_e, best_t)
        self._plans[name][key] = best
        return best

    def _catchup(self, name: str, V) -> float:
        """Seconds the drafter will spend catching up beyond an in-step draft's."""
        if name in _FREE:
            return 0.0  # indexing the tokens it missed: microseconds a token
        start = self.ctl.prompt_cost.get(name, 0.0) * self.missing[name] if name in self.fresh else 0.0
        return start + self.ctl.draft_coef(name, V)[2] * max(self.lag[name] - 2, 0)

    def _horizon(self) -> float:
        """Tokens this request is still expected to make: the others' mean length, within its own cap."""
        ctl = self.ctl
        mean = max((ctl.tokens - self.generated) / (ctl.requests - 1) - self.generated, 32.0)
        return max(min(mean, self.max_tokens - self.generated), 1.0)

    def _best(self, V) -> tuple[float, str | None, int, float, float]:
        best = (1.0 / V[1], None, 0, 1.0, V[1])
        horizon = self._horizon()
        for name in self.names:
            rate, k, e, t = self._plan(name, V, kmin=self.kmin[name])
            if not k:
                continue  # nothing to draft (no n-gram match)
            rate = 1.0 / (1.0 / rate + self._catchup(name, V) / horizon)
            if rate > best[0]:
                best = (rate, name, k, e, t)
        return best

    def _probe(self, name: str, V, best_rate: float) -> tuple[float, int, float, float] | None:
        """The plan of a short probe of `name`, if one is due now."""
        ctl = self.ctl
        if name in self.offers and not self.offers[name][0]:
            return None  # nothing to probe with
        if self.step - self.used_step[name] < ctl.interval.get(name, _PROBE_MIN):
            return None
        budget = _EPS * (self.clock - self.since[name])
        k, fit = self.kmin[name], ctl.draft.get(name)
        # what catching up costs is unknown until lags vary: look while the lag is short and cheap
        # (never while its cache lacks this request's prompt: that catch-up is what makes a probe costly)
        early = (name not in _FREE and name not in self.fresh and fit is not None and not fit.lag_known()
                 and self.lag[name] <= 2 * _PROBE_MIN)
        if not (early or self.follow_up and self.follow_up[0] == name):
            if budget < self._probe_cost.get(name, 0.0):
                return None  # below the cost last computed (a lagging cache only adds to it)
            # seconds a probe that drafts loses against the best choice making its expected tokens
            _, _, e, t = self._plan(name, V, kmin=k, kmax=k, found=True)
            cost = self._catchup(name, V) + t - e / best_rate
            if not self._could_pay(name, V):
                cost *= 8  # only to refresh what it costs, rarely
            self._probe_cost[name] = cost
            if budget < cost:
                return None
        return self._plan(name, V, kmin=k, kmax=k)

    def _could_pay(self, name: str, V) -> bool:
        """Whether the drafter would pay if every token it drafted were accepted."""
        return self._plan(name, V, kmin=self.kmin[name], found=True, ceiling=True)[0] > 1.0 / V[1]

    def prefill(self, name: str, n_missing: int, max_tokens: int) -> bool:
        """Whether a model drafter should take the prompt before the first step.

        Catching up on the prompt costs the same whenever it happens (one batch); doing it
        up front only pays if the drafter is then expected to save more than that over the
        request: (plain seconds per token - its seconds per token) x the tokens to come
        > its measured seconds per prompt token x n_missing. Until that cost has been
        measured once (at a first use, which the plans charge), nothing is prefilled.
        """
        self.max_tokens = max_tokens
        if name not in self.names or name in _FREE or max_tokens < 2:  # one token: nothing to draft
            return False
        self.missing[name] = n_missing
        if n_missing > 0:  # (none: its cache holds the prompt already, nothing to pay)
            per_token = self.ctl.prompt_cost.get(name)
            V = self.ctl.verify.table(self.cap + 1)
            if per_token is None or V is None:
                return False
            rate = self._plan(name, V, kmin=self.kmin[name])[0]
            saved = min(self._horizon(), max_tokens - 1) * (V[1] - 1.0 / rate) if rate > 0 else 0.0
            if saved <= per_token * n_missing:
                return False
        self.fresh.discard(name)
        self.lag[name] = 1  # the prompt's last token, which every step feeds
        return True

    def prefilled(self, name: str, n_tokens: int, seconds: float) -> None:
        """Told what a prefill cost: the prompt's catch-up rate, for the next decisions."""
        if n_tokens > 0:
            with self.ctl.lock:
                self._learn_prompt_cost(name, seconds / n_tokens)

    def _learn_prompt_cost(self, name: str, per_token: float) -> None:
        old = self.ctl.prompt_cost.get(name, per_token)
        self.ctl.prompt_cost[name] = 0.7 * old + 0.3 * per_token

    def see(self, name: str, offer: tuple[int, int]) -> None:
        """What a lookup drafter would draft this step: its match length (0: none), tokens available."""
        if name in self.caps:
            self.offers[name] = (int(offer[0]), int(offer[1]))  # plans are cached by match and length

    def see_ngram(self, order: int, available: int) -> None:
        self.see("ngram", (order, available))

    def choose(self) -> Choice:
        self.step += 1
        self.probing = None
        self._step_offers = dict(self.offers)
        V = self.ctl.verify.table(self.cap + 1)  # [cap + 2] seconds per pass over n tokens
        if V is None:
            return OFF  # the first step of a fresh engine measures a plain pass
        rate, name, k, e, t = self._best(V)
        pending, self.pending = self.pending, None
        for other in self.names:
            if other == name:
                continue
            probe = pending[1] if pending and pending[0] == other and not k else self._probe(other, V, rate)
            if probe:
                self.probing = (other, k > 0, probe)
                name, (_, k, e, t) = other, probe
                break
        self.pred_tokens += e
        self.pred_time += t
        return Choice(name, k) if k else OFF

    def observe(self, o: Outcome) -> None:
        ctl, k, n, acc = self.ctl, o.choice.k, o.n_drafted, o.n_accepted
        used = o.choice.drafter if k > 0 else None
        self.generated += acc + 1
        self.clock += o.t_draft + o.t_verify
        with ctl.lock:
            ctl.clock += o.t_draft + o.t_verify
            ctl.tokens += acc + 1
            ctl.verify.add(1 + n, o.t_verify)
            if used:
                p, g = ctl.prior(used, 0, self.regime), _G_ENGINE
                p[0], p[1] = p[0] * g + acc, p[1] * g + min(n, acc + 1)
                p[2], p[3] = p[2] * g + n, p[3] * g + min(k, n + 1)
                if used in self.fresh:  # the prompt's catch-up: what the regression does not explain
                    a, b, c = ctl.draft_coef(used, ctl.verify.table(self.cap + 1))
                    if self.missing[used] > 0 and used not in _FREE:
                        extra = max(o.t_draft - a - b * n - c * self.lag[used], 0.0)
                        self._learn_prompt_cost(used, extra / self.missing[used])
                else:
                    fit = ctl.draft.get(used) or ctl.draft.setdefault(used, _DraftCost())
                    fit.add(n, self.lag[used], o.t_draft)
                if n or not (self.probing and not self.probing[1]):
                    ctl.last_used[used], self.since[used] = ctl.clock, self.clock
        for other in self.names:
            if other != used:
                self.lag[other] += acc + 1
        if not used:
            return
        self.dlv[used].add(min(k, n + 1), n)
        if n:
            self.acc[used].add(min(n, acc + 1), acc)
            order = self._step_offers.get(used, (0, 0))[0]
            if order:
                o = match_bucket(order)
                self.acc_order.setdefault((used, o), _Rates(self.caps[used])).add(min(n, acc + 1), acc)
                with ctl.lock:
                    q = ctl.prior(used, o, self.regime)
                    q[0], q[1] = q[0] * _G_ENGINE + acc, q[1] * _G_ENGINE + min(n, acc + 1)
        self.lag[used] = 2 if n and acc == n else 1  # it holds all but the bonus (and last draft)
        self._probe_cost.pop(used, None)
        self._plans[used] = {}  # its estimates changed
        self.fresh.discard(used)
        if self.probing is None:
            self.used_step[used] = self.step
            return
        probed, displaced, plan = self.probing
        if not n and not displaced:
            self.pending = (probed, plan)  # no match: nothing lost, ask again next step
            return
        self.used_step[used] = self.step
        if n:
            V, iv = ctl.verify.table(self.cap + 1), ctl.interval.get(probed, _PROBE_MIN)
            done = self.follow_up[1] if self.follow_up and self.follow_up[0] == probed else 0
            # all accepted: followed up at once, outside the budget, a few times at most
            good = acc == n and done < _FOLLOW_UPS and self._could_pay(probed, V)
            ok = good or self._best(V)[1] == probed
            ctl.interval[probed] = 1 if ok else min(max(2 * iv, _PROBE_MIN), _PROBE_MAX)
            self.follow_up = (probed, done + 1) if good else None
