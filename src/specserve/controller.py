"""The adaptive policy behind `--spec auto`: speculate only while it pays.

Each step picks the drafter and draft length k with the highest expected tokens per
second, plain decoding (k = 0: 1 token in verify(1)) included:

    E[tokens](k)  = 1 + sum_{i=1..k} prod_{j<=i} d_j a_j
    E[seconds](k) = sum_{l<=k} P(len = l) (draft(l) + verify(1 + l)),  P(len >= i) = prod_{j<=i} d_j

a_j = P(draft token j accepted | 1..j-1 accepted); d_j = P(the drafter returns a j-th
token | it returned j - 1): the n-gram's match rate is d_1. An empty n-gram proposal
costs a dict lookup and leaves a plain step, so the n-gram is used whenever a match pays.

Costs are measured on this engine, never assumed (a CPU verifies 8 tokens at 2-4x the
cost of one, a GPU at ~1x). `Controller`, one per engine and shared by its requests,
keeps: seconds of a target pass over n tokens (EMA per n, interpolated between measured
n, extrapolated with a least-squares slope); per drafter, seconds to draft as a decayed
ridge regression a + b * drafted + c * lag (lag: tokens its cache must catch up on, as
after steps the draft model sat out), plus the catch-up at its first use in a request
(the prompt); and pooled acceptance of recent steps, the prior of new requests.
`AutoPolicy`, one per request, keeps decayed per-position counts of acceptance and
delivery, shrunk toward the request's pooled rate, itself shrunk toward the engine's.
Switching on a lagging drafter charges its catch-up, spread over the tokens the request
is still expected to make (from the mean length of recent requests).

A drafter not in use is probed with a short draft once the steps since its last use
reach an interval (4 after a success is followed up, doubled after a failure, up to 32) and the
probe's expected loss fits in _EPS of the engine's decode time since the drafter last
ran. One that could not pay even at 100% acceptance on the measured costs is not probed.
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
_PRIORS = {"ngram": (0.6, 0.6)}  # (acceptance, delivery) before any data; others (0.7, 1.0)
_FREE = frozenset({"ngram"})  # drafters assumed free to query before their cost is measured


class _Rates:
    """P(success at draft position i | success at 1..i-1), i = 1..cap, as decayed counts."""

    __slots__ = ("hit", "tried", "h", "t", "_cache")

    def __init__(self, cap: int):
        self.hit, self.tried = [0.0] * cap, [0.0] * cap  # [cap] decayed counts per position
        self.h = self.t = 0.0  # pooled over positions
        self._cache: list[float] | None = None

    def add(self, n_tried: int, n_hit: int) -> None:
        hit, tried = self.hit, self.tried
        for i in range(n_tried):
            hit[i] = hit[i] * _G_POS + (i < n_hit)
            tried[i] = tried[i] * _G_POS + 1.0
        self.h = self.h * _G_POOL + n_hit
        self.t = self.t * _G_POOL + n_tried
        self._cache = None

    def rates(self, prior: float) -> list[float]:
        if self._cache is None:
            pooled = (self.h + _PRIOR_W * prior) / (self.t + _PRIOR_W)
            self._cache = [(h + _SHRINK * pooled) / (t + _SHRINK) for h, t in zip(self.hit, self.tried)]
        return self._cache


class _DraftCost:
    """Seconds to draft: a + b * n + c * lag by decayed least squares, ridge toward a prior."""

    __slots__ = ("xx", "xy", "_coef")

    def __init__(self):
        self.xx = [[0.0] * 3 for _ in range(3)]  # [3, 3] sum of x x^T, x = (1, n, lag)
        self.xy = [0.0] * 3  # [3] sum of x * seconds
        self._coef: list[float] | None = None

    def add(self, n: int, lag: int, t: float) -> None:
        x = (1.0, float(n), float(lag))
        for i in range(3):
            self.xy[i] = self.xy[i] * _G_COST + x[i] * t
            row = self.xx[i]
            for j in range(3):
                row[j] = row[j] * _G_COST + x[i] * x[j]
        self._coef = None

    def coef(self, b: float, r: float) -> list[float]:
        """(a, b, c), pulled toward (0, b, r b); with data, b is their proportional fit."""
        if self._coef is None:
            x0 = self.xx[0]
            if x0[1] + r * x0[2] > 0:  # seconds per token-equivalent: t = b (n + r lag)
                b = self.xy[0] / (x0[1] + r * x0[2])
            prior = (0.0, b, r * b)
            # (X^T X + I) w = X^T y + prior: one pseudo-observation per coefficient
            m = [[*self.xx[i], self.xy[i] + prior[i]] for i in range(3)]
            for i in range(3):
                m[i][i] += 1.0
            for i in range(3):  # Gauss-Jordan; the ridge keeps the pivots positive
                piv = m[i][i]
                m[i] = [v / piv for v in m[i]]
                for r in range(3):
                    if r != i and m[r][i]:
                        f = m[r][i]
                        m[r] = [v - f * w for v, w in zip(m[r], m[i])]
            self._coef = [max(m[i][3], 0.0) for i in range(3)]
        return self._coef


class CostModel:
    """Seconds of one target pass over n tokens, measured: EMA per n, linear in between."""

    def __init__(self):
        self._ema: dict[int, float] = {}
        self._cnt: dict[int, int] = {}
        self._keys: list[int] = []  # measured n, sorted
        self._table: list[float] | None = None
        self.batching = 1.0  # (seconds per extra token) / (seconds of a 1-token pass)

    def add(self, n: int, t: float) -> None:
        e = self._ema.get(n)
        if e is None:
            bisect.insort(self._keys, n)
            self._ema[n], self._cnt[n] = t, 1
            self._table = None
            return
        c = self._cnt[n] = self._cnt[n] + 1
        e = self._ema[n] = e + (min(t, 3 * e) - e) * max(0.05, 1 / c)  # clipped: a preempted pass
        tab = self._table
        if tab is not None and (n >= len(tab) or abs(e - tab[n]) > 0.005 * tab[n]):
            self._table = None  # rebuilt when an estimate moved by more than 0.5%

    def table(self, n_max: int) -> list[float] | None:
        """[n_max + 1] seconds of a pass over n tokens (index 0 unused); None before any pass."""
        tab = self._table
        if tab is not None and len(tab) > n_max:
            return tab
        keys, ema = self._keys, self._ema
        if not keys:
            return None
        if len(keys) == 1:  # a guess until a second n is measured
            slope = 0.2 * ema[keys[0]] / keys[0]
        else:  # least squares over the measured n, weighted by how often each was seen
            w = [min(self._cnt[n], 20) for n in keys]
            mx = sum(wi * n for wi, n in zip(w, keys)) / sum(w)
            my = sum(wi * ema[n] for wi, n in zip(w, keys)) / sum(w)
            sxx = sum(wi * (n - mx) ** 2 for wi, n in zip(w, keys))
            slope = max(sum(wi * (n - mx) * (ema[n] - my) for wi, n in zip(w, keys)) / sxx, 0.0)
        tab = [0.0] * (n_max + 1)
        for n in range(1, n_max + 1):
            j = bisect.bisect_left(keys, n)
            if j < len(keys) and keys[j] == n:
                tab[n] = ema[n]
            elif j == 0:
                tab[n] = max(ema[keys[0]] - slope * (keys[0] - n), 0.5 * ema[keys[0]])
            elif j == len(keys):
                tab[n] = ema[keys[-1]] + slope * (n - keys[-1])
            else:
                lo, hi = keys[j - 1], keys[j]
                tab[n] = ema[lo] + (ema[hi] - ema[lo]) * (n - lo) / (hi - lo)
        self._table = tab
        self.batching = (tab[n_max] - tab[1]) / ((n_max - 1) * tab[1]) if n_max > 1 else 1.0
        return tab


class Controller:
    """Engine-level state shared by the requests of one engine: costs, priors, probe pacing."""

    def __init__(self):
        self.lock = threading.Lock()  # one observation at a time updates the shared state
        self.verify = CostModel()
        self.draft: dict[str, _DraftCost] = {}
        self.start_cost: dict[str, float] = {}  # seconds of catch-up at first use in a request (EMA)
        self.pooled: dict[str, list[float]] = {}  # [accepted, tried, delivered, asked] decayed
        self.interval: dict[str, int] = {}  # probe interval, steps
        self.last_used: dict[str, float] = {}  # self.clock when the drafter last drafted
        self.clock = 0.0  # seconds of drafting and verifying observed, all requests
        self.requests, self.tokens = 1.0, 256.0  # decayed counts; a prior of 256 tokens a request

    def policy(self, spec: SpecParams, drafter_names: list[str]) -> "AutoPolicy":
        with self.lock:
            self.requests, self.tokens = 0.9 * self.requests + 1, 0.9 * self.tokens
        return AutoPolicy(self, spec, drafter_names)

    def prior(self, name: str) -> list[float]:
        p = self.pooled.get(name)
        if p is None:
            a, d = _PRIORS.get(name, (0.7, 1.0))
            p = self.pooled[name] = [2 * a, 2.0, 2 * d, 2.0]
        return p

    def draft_coef(self, name: str, V: list[float]) -> list[float]:
        """(a, b, c): seconds to draft n tokens after catching up on lag = a + b n + c lag."""
        b = 0.0 if name in _FREE else 0.25 * V[1]
        r = self.verify.batching  # assumed to help the drafter as much as it helps the target
        fit = self.draft.get(name)
        return fit.coef(b, r) if fit is not None else [0.0, b, r * b]


class AutoPolicy:
    """One request's adaptive policy; see the module docstring."""

    def __init__(self, ctl: Controller, spec: SpecParams, names: list[str]):
        self.ctl, self.cap, self.names = ctl, spec.draft_max, list(names)
        # the draft model returns nothing below --draft-min under greedy: never ask for fewer
        self.kmin = {n: max(1, spec.draft_min) if n == "draft" else 1 for n in names}
        self.acc = {n: _Rates(self.cap) for n in names}
        self.dlv = {n: _Rates(self.cap) for n in names}
        self.lag = dict.fromkeys(names, 0)  # tokens the drafter's cache is behind (after the prompt)
        self.fresh = set(names)  # not run in this request: its cache also lacks the prompt
        self.used_step = dict.fromkeys(names, -(1 << 30))
        self.step = self.generated = 0
        self.probing: tuple[str, bool] | None = None  # (drafter, whether it displaced a drafter)
        self.follow_up: str | None = None  # a drafter whose last probe succeeded: probe it again
        self.pred_tokens = self.pred_time = 0.0
        self._choices: dict[tuple[str, int], Choice] = {}
        self._probe_cost: dict[str, float] = {}  # seconds a probe of the drafter was last expected to lose

    @property
    def predicted_tokens_per_s(self) -> float:
        return self.pred_tokens / self.pred_time if self.pred_time > 0 else 0.0

    def _plan(self, name, V, acc=None, kmin=1, kmax=None, found=False) -> tuple[float, int, float, float]:
        """Best (tokens/s, k, E[tokens], E[seconds]) of one drafter over k in [kmin, kmax].

        found: given that the drafter returns a first token (the n-gram found a match).
        """
        p = self.ctl.prior(name)
        acc = acc or self.acc[name].rates(p[0] / p[1])
        dlv = self.dlv[name].rates(p[2] / p[3])
        if found:
            dlv = [1.0, *dlv[1:]]
        a, b, c = self.ctl.draft_coef(name, V)
        a += 1.5 * c  # drafting on, its cache lags 1-2 tokens at each step
        best = (0.0, 0, 1.0, V[1])
        reach, chain, e_tok, s = 1.0, 1.0, 1.0, 0.0  # P(len >= i), P(len >= i, all accepted)
        c_prev = a + V[1]  # seconds of a step whose draft came back with i - 1 tokens
        for i in range(1, (kmax or self.cap) + 1):
            r = reach * dlv[i - 1]
            s += (reach - r) * c_prev
            reach, chain = r, chain * dlv[i - 1] * acc[i - 1]
            e_tok += chain
            c_prev = a + b * i + V[i + 1]
            t = s + reach * c_prev
            if i >= kmin and e_tok > best[0] * t:
                best = (e_tok / t, i, e_tok, t)
            if chain < 0.02 and i >= kmin:
                break  # longer drafts add < 0.02 tokens a position
        return best

    def _catchup(self, name: str, V) -> float:
        """Seconds the drafter will spend catching up beyond an in-step draft's."""
        start = self.ctl.start_cost.get(name, 0.0) if name in self.fresh else 0.0
        return start + self.ctl.draft_coef(name, V)[2] * max(self.lag[name] - 2, 0)

    def _best(self, V) -> tuple[float, str | None, int, float, float]:
        ctl, best = self.ctl, (1.0 / V[1], None, 0, 1.0, V[1])
        # tokens this request is still expected to make, from the mean length of the others
        horizon = max((ctl.tokens - self.generated) / (ctl.requests - 1) - self.generated, 32.0)
        for name in self.names:
            rate, k, e, t = self._plan(name, V, kmin=self.kmin[name])
            rate = 1.0 / (1.0 / rate + self._catchup(name, V) / horizon)
            if k and rate > best[0]:
                best = (rate, name, k, e, t)
        return best

    def _probe(self, name: str, V, best_rate: float) -> tuple[float, int, float, float] | None:
        """The plan of a short probe of `name`, if one is due now."""
        ctl = self.ctl
        if self.step - self.used_step[name] < ctl.interval.get(name, _PROBE_MIN):
            return None
        budget = _EPS * (ctl.clock - ctl.last_used.get(name, float("-inf")))
        k = self.kmin[name]
        if name != self.follow_up:
            if budget < self._probe_cost.get(name, 0.0):
                return None  # below the cost last computed (a lagging cache only adds to it)
            # seconds a probe that drafts loses against the best choice making its expected tokens
            _, _, e, t = self._plan(name, V, kmin=k, kmax=k, found=True)
            cost = self._probe_cost[name] = self._catchup(name, V) + t - e / best_rate
            if budget < cost:
                return None
        if self._plan(name, V, acc=[1.0] * self.cap, kmin=self.kmin[name])[0] <= 1.0 / V[1]:
            self._probe_cost[name] = 2 * budget  # look again when the budget has doubled
            self.follow_up = None
            return None  # could not pay even if every token were accepted
        return self._plan(name, V, kmin=k, kmax=k)

    def choose(self) -> Choice:
        self.step += 1
        self.probing = None
        V = self.ctl.verify.table(self.cap + 1)  # [cap + 2] seconds per pass over n tokens
        if V is None:
            return OFF  # the first step of a fresh engine measures a plain pass
        rate, name, k, e, t = self._best(V)
        for other in self.names:
            if other != name and (probe := self._probe(other, V, rate)):
                self.probing = (other, k > 0)
                name, (_, k, e, t) = other, probe
                break
        self.pred_tokens += e
        self.pred_time += t
        if not k:
            return OFF
        c = self._choices.get((name, k))
        if c is None:
            c = self._choices[(name, k)] = Choice(name, k)
        return c

    def observe(self, o: Outcome) -> None:
        ctl, k, n, acc = self.ctl, o.choice.k, o.n_drafted, o.n_accepted
        used = o.choice.drafter if k > 0 else None
        self.generated += acc + 1
        with ctl.lock:
            ctl.clock += o.t_draft + o.t_verify
            ctl.tokens += acc + 1
            ctl.verify.add(1 + n, o.t_verify)
            if used:
                p, g = ctl.prior(used), _G_ENGINE
                p[0], p[1] = p[0] * g + acc, p[1] * g + min(n, acc + 1)
                p[2], p[3] = p[2] * g + n, p[3] * g + min(k, n + 1)
                if used in self.fresh:  # the prompt's catch-up: what the regression does not explain
                    a, b, c = ctl.draft_coef(used, ctl.verify.table(self.cap + 1))
                    extra = max(o.t_draft - a - b * n - c * self.lag[used], 0.0)
                    ctl.start_cost[used] = 0.7 * ctl.start_cost.get(used, extra) + 0.3 * extra
                else:
                    ctl.draft.setdefault(used, _DraftCost()).add(n, self.lag[used], o.t_draft)
                if n or not (self.probing and not self.probing[1]):
                    ctl.last_used[used] = ctl.clock
        for other in self.names:
            if other != used:
                self.lag[other] += acc + 1
        if not used:
            return
        self.dlv[used].add(min(k, n + 1), n)
        if n:
            self.acc[used].add(min(n, acc + 1), acc)
        self.lag[used] = 2 if n and acc == n else 1  # it holds all but the bonus (and last draft)
        self._probe_cost.pop(used, None)
        self.fresh.discard(used)
        if self.probing is None:
            self.used_step[used] = self.step
            return
        probed, displaced = self.probing
        if not n and not displaced:
            return  # no match: nothing learnt and nothing lost, ask again next step
        self.used_step[used] = self.step
        if n:
            ok = acc == n or self._best(ctl.verify.table(self.cap + 1))[1] == probed
            iv = ctl.interval.get(probed, _PROBE_MIN)
            ctl.interval[probed] = 1 if ok else min(max(2 * iv, _PROBE_MIN), _PROBE_MAX)
            self.follow_up = probed if ok else None  # a success is followed up outside the budget
