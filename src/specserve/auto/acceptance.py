"""How often drafts are accepted: per draft position, per lookup match length, per draft confidence.

`Rates` holds P(draft token i accepted | 1..i-1 accepted) for i = 1..cap as decayed
counts, shrunk toward a pooled rate: a request keeps one per drafter (and per match
bucket for the lookups). How hard a request's rate leans on the engine's pooled rate is
`Spread`'s to say: as much as requests have been alike. What a position's rate is shrunk
toward follows `Shape`: how acceptance moves with the draft position, engine-wide (a
lookup's copy either holds or breaks at once, so its first token is judged far more harshly
than its pooled rate says). `ConfidenceMap` is what a draft
model's own top probability at a drafted token says about that token's acceptance,
bucketed and learnt online; the confidence stop (planner.ConfidenceStop) reads it. Another
maps the target's top probability where a draft token was judged to its acceptance: how
sure the target has been of a request's tokens predicts how much of a draft it keeps.
"""
from __future__ import annotations

import bisect

_G_POS = 0.97  # per-trial decay of a request's counts at one draft position
_G_POOL = 0.95  # per-step decay of a request's pooled counts
_G_CONF = 0.995  # per-token decay of a confidence bucket's counts: the pair changes slowly
_SHRINK = 6.0  # pseudo-trials pulling a position's rate toward the pooled rate
PRIOR_W = 10.0  # pseudo-trials pulling a request's pooled rate toward the engine's, until Spread knows
_G_SPREAD = 0.9  # per-request decay of a Spread's moments: about the last 10 requests
# a request's (decayed) trials before its rate tells the spread anything. One is enough: the
# binomial noise is subtracted, and a request where a lookup failed at once stops planning it,
# so a higher bar would hear only from the requests where it kept working (writing after code:
# its 1-trial failures never counted, and the n-gram's prior was taken as alike everywhere)
_SPREAD_MIN_TRIED = 1.0
SPREAD_MIN_N = 3.0  # requests seen before the spread replaces PRIOR_W
W_MIN, W_MAX = 2.0, 40.0  # the prior's weight in pseudo-trials, whatever the spread says
_CONF_PRIOR_W = 4.0  # pseudo-trials pulling a confidence bucket toward "calibrated"
_G_SHAPE = 0.99  # per-trial decay of a Shape group's counts
_SHAPE_W = 4.0  # pseudo-tokens, kept as expected, pulling a Shape group's factor toward 1
RATE_MAX = 0.995  # no position's prior is surer than this
MAP_MIN = 16.0  # (decayed) tokens a ConfidenceMap judges before its expected() is trusted

PRIORS = {"ngram": (0.6, 0.6)}  # (acceptance, delivery) before any data; others (0.7, 1.0)
# a lookup's acceptance given the order n of the match it follows (its draft follows an
# earlier occurrence of the last n tokens): longer matches predict better
ORDER_PRIOR = {1: 0.15, 2: 0.3, 3: 0.45, 4: 0.6, 8: 0.7, 16: 0.8, 32: 0.85}
# a match at a request's first step, whatever its length: it ends in the prompt's last tokens
# (the chat template's "assistant" header), so the suffix drafter proposes an earlier answer's
# opening, right only where the question repeats; learnt apart from matches within an answer
OPENING = -1
ORDER_PRIOR[OPENING] = 0.15
# a suffix match that is the same request again (drafters.suffix.SAME_REQUEST: the store's earlier
# answer to this very prompt, as answered so far), which a greedy request copies to its last token.
# Learnt apart from the windows and openings that other workloads' text breaks: a repeat after
# other requests had been planned from their failures (4x the target alone, not 8x)
REPEAT = -2
ORDER_PRIOR[REPEAT] = 0.995
# a repeat's positions may be surer than RATE_MAX, as far as repeats have kept their tokens: at 0.995
# a 64-token copy is priced to lose 8 of its tokens, and where a 40-token pass costs as much a token as
# a 65-token one (the quiet 2-core CPU: 0.775 s and 1.239 s) repeats took 3-4 passes where 2 cover them
REPEAT_RATE_MAX = 0.9995


def match_bucket(order: int) -> int:
    """Match lengths pooled for acceptance: 1, 2, 3, 4-7, 8-15, 16-31, 32+."""
    if order < 4:
        return order
    return 4 if order < 8 else 8 if order < 16 else 16 if order < 32 else 32


class Rates:
    """P(success at draft position i | success at 1..i-1), i = 1..cap, as decayed counts."""

    def __init__(self, cap: int):
        self.hit, self.tried = [0.0] * cap, [0.0] * cap  # [cap] decayed counts per position
        self.h = self.t = 0.0  # pooled over positions
        self._cache: list[float] | None = None
        self._key: tuple[float, float] | None = None  # (prior, weight) the cache was made with

    def add(self, n_tried: int, n_hit: int) -> None:
        for i in range(n_tried):
            self.hit[i] = self.hit[i] * _G_POS + (i < n_hit)
            self.tried[i] = self.tried[i] * _G_POS + 1.0
        self.h, self.t, self._cache = self.h * _G_POOL + n_hit, self.t * _G_POOL + n_tried, None

    def rates(self, prior: float, weight: float = PRIOR_W, shape: tuple[float, ...] | None = None,
              rate_max: float = RATE_MAX) -> list[float]:
        """[cap], each shrunk toward the pooled rate, itself shrunk toward `prior` by `weight` trials.

        shape: [cap] factors (Shape.factors): position i is shrunk toward the pooled rate times
        shape[i] (at most rate_max) instead, so a request's level moves every position and the
        engine's shape stays.
        """
        if self._cache is None or self._key != (prior, weight, shape, rate_max):
            self._key = (prior, weight, shape, rate_max)
            pooled = self.level(prior, weight)
            if shape is None:
                self._cache = [(h + _SHRINK * pooled) / (t + _SHRINK) for h, t in zip(self.hit, self.tried)]
            else:
                self._cache = [(h + _SHRINK * min(pooled * f, rate_max)) / (t + _SHRINK)
                               for h, t, f in zip(self.hit, self.tried, shape)]
        return self._cache

    def level(self, prior: float, weight: float = PRIOR_W) -> float:
        """The pooled rate over positions, shrunk toward `prior` by `weight` trials."""
        return (self.h + weight * prior) / (self.t + weight)

    @property
    def rate(self) -> float | None:
        """The request's own pooled rate, once it has tried enough to say (None before)."""
        return self.h / self.t if self.t >= _SPREAD_MIN_TRIED else None


class Shape:
    """How acceptance moves with the draft position, engine-wide, for one (drafter, match bucket, regime).

    A pooled rate counts every judged token alike, so a lookup whose copies either hold for
    16 tokens or break at the first is pooled near 0.9 though its first token is kept 3 times
    in 4 (the n-gram on code edits, 4-7 token matches: 46 drafts planned for about 9 kept
    tokens each kept 3.9). Per group of positions (1, 2, 3-4, 5-8, 9-16, 17-32, 33+) it counts
    the tokens kept against those expected at the request's own pooled rate, once the request
    has ended; their ratio is the factor of that position's rate. Judged against each request's
    own rate, requests that differ (code keeps 0.9 at every position, prose 0.45) make no
    shape, only how drafts break within a request does (judged against the rate known while
    the request ran, a prose request's first rejections count against code's level). A group
    seen little keeps a factor near 1; each group's counts decay per trial in it.
    """

    GROUPS = 7

    def __init__(self):
        self.hit, self.expected = [0.0] * self.GROUPS, [0.0] * self.GROUPS
        self._key: int | None = None
        self._factors: tuple[float, ...] = ()

    @classmethod
    def group(cls, i: int) -> int:
        """The group of 0-based draft position i."""
        return min(i.bit_length(), cls.GROUPS - 1)

    @classmethod
    def judge(cls, counts: list[list[float]], n_tried: int, n_hit: int) -> None:
        """Add one judged draft (positions 1..n_tried judged, 1..n_hit kept) to a request's
        [hit, tried] counts per group."""
        for i in range(n_tried):
            g = cls.group(i)
            counts[0][g] += i < n_hit
            counts[1][g] += 1.0

    def add(self, counts: list[list[float]]) -> None:
        """A finished request's [hit, tried] counts per group, judged against its own pooled rate."""
        hit, tried = counts
        if sum(tried) <= 0:
            return
        level = sum(hit) / sum(tried)
        for g in range(self.GROUPS):
            if tried[g]:
                decay = _G_SHAPE ** tried[g]
                self.hit[g] = self.hit[g] * decay + hit[g]
                self.expected[g] = self.expected[g] * decay + level * tried[g]
        self._key = None

    def factors(self, cap: int) -> tuple[float, ...]:
        """[cap] the rate at each position over the pooled rate; the same tuple until the counts change."""
        if self._key != cap:
            self._key = cap
            by_group = [(h + _SHAPE_W) / (e + _SHAPE_W) for h, e in zip(self.hit, self.expected)]
            self._factors = tuple(by_group[self.group(i)] for i in range(cap))
        return self._factors

    def state(self) -> list[list[float]]:
        return [list(self.hit), list(self.expected)]

    @classmethod
    def from_state(cls, state, weight: float) -> "Shape":
        s = cls()
        s.hit, s.expected = _counts(state, cls.GROUPS, weight, "position shape")
        return s


class Spread:
    """How much requests differ in one acceptance rate (a drafter's, at one match bucket and regime).

    A request's rate leans on the engine's pooled rate, which the last request or two made.
    Where requests are alike (code after code) that prior deserves much weight; where they
    are not (a translation after code, whose lookups rarely hold) little, or the new request
    pays for the last one's habits for half its length. Empirical Bayes with a beta prior:
    if request rates scatter around the pooled rate m with variance v, the prior is worth
    m (1 - m) / v - 1 trials. v is estimated from each finished request's own rate r over t
    trials: (r - m)^2 less the binomial noise m (1 - m) / t, over the last ~10 requests.
    """

    def __init__(self):
        self.n = self.dev = self.noise = 0.0  # decayed: requests, squared deviations, binomial noise

    def add(self, rate: float, mean: float, tried: float) -> None:
        g = _G_SPREAD
        self.n = g * self.n + 1.0
        self.dev = g * self.dev + (rate - mean) ** 2
        self.noise = g * self.noise + mean * (1.0 - mean) / tried

    def weight(self, mean: float) -> float:
        """Pseudo-trials the pooled rate `mean` is worth to a new request."""
        if self.n < SPREAD_MIN_N:
            return PRIOR_W
        var, spread = (self.dev - self.noise) / self.n, mean * (1.0 - mean)
        if var * (W_MAX + 1.0) <= spread:
            return W_MAX
        return max(spread / var - 1.0, W_MIN)

    def state(self) -> list[float]:
        return [self.n, self.dev, self.noise]

    @classmethod
    def from_state(cls, state) -> "Spread":
        s = cls()
        s.n, s.dev, s.noise = (float(x) for x in state)
        if min(s.n, s.dev, s.noise) < 0:
            raise ValueError("negative spread moments")
        return s


class ConfidenceMap:
    """P(a drafted token is accepted | a top probability there), by bucket of that probability.

    Two are kept per draft model and regime: by the draft's own top probability at the token
    (what the confidence stop reads), and by the target's where the token was judged (what a
    request's predicted acceptance reads, `expected`). Only tokens the verifier judged count
    (those up to the first rejection). Before data a bucket is calibrated: a token judged at
    top probability p is accepted with about p.
    """

    EDGES = (0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)  # bucket b holds p in [EDGES[b-1], EDGES[b])
    MIDS = (0.1, 0.3, 0.45, 0.55, 0.65, 0.75, 0.85, 0.925, 0.97, 0.995)

    def __init__(self):
        self.hit, self.tried = [0.0] * len(self.MIDS), [0.0] * len(self.MIDS)
        self._table: tuple[float, ...] | None = None

    @classmethod
    def bucket(cls, p: float) -> int:
        return bisect.bisect_right(cls.EDGES, p)

    def add(self, confidence, n_accepted: int) -> None:
        """One verified draft: its per-token top probabilities and how many tokens were kept."""
        for i in range(min(len(confidence), n_accepted + 1)):
            b = self.bucket(confidence[i])
            self.hit[b] = self.hit[b] * _G_CONF + (i < n_accepted)
            self.tried[b] = self.tried[b] * _G_CONF + 1.0
        self._table = None

    def table(self) -> tuple[float, ...]:
        """[buckets] acceptance per bucket; the same tuple until the counts change."""
        if self._table is None:
            self._table = tuple((h + _CONF_PRIOR_W * m) / (t + _CONF_PRIOR_W)
                                for h, t, m in zip(self.hit, self.tried, self.MIDS))
        return self._table

    def expected(self, seen: list[float]) -> float | None:
        """The acceptance of tokens whose probabilities fell in the buckets as `seen` counts them
        ([buckets] weights), once this map has judged MAP_MIN tokens (None before)."""
        total = sum(seen)
        if total <= 0 or sum(self.tried) < MAP_MIN:
            return None
        return sum(w * a for w, a in zip(seen, self.table())) / total

    def state(self) -> list[list[float]]:
        return [list(self.hit), list(self.tried)]

    @classmethod
    def from_state(cls, state, weight: float) -> "ConfidenceMap":
        m = cls()
        m.hit, m.tried = _counts(state, len(m.MIDS), weight, "confidence map")
        return m


def _counts(state, n: int, weight: float, what: str) -> tuple[list[float], list[float]]:
    """A saved pair of count lists of length n, checked, scaled by weight."""
    a, b = state
    if len(a) != n or len(b) != n or min(*a, *b) < 0:
        raise ValueError(f"{what} of the wrong shape")
    return [float(x) * weight for x in a], [float(x) * weight for x in b]
