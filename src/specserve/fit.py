"""--fit: the GPU layers (-ngl, -ngld) and the context (-c) that fit a GPU memory budget, from the GGUF headers.

As llama-server's --fit (llama.cpp's llama_params_fit): what the user gave (-c, -ngl, -ngld) is kept, and only
the rest is chosen, in llama.cpp's order:

1. every layer on the GPU at the context asked: -c, else the target's training context (llama-server's
   default); if that fits, nothing changes;
2. else, where -c was not given, a smaller context: the largest multiple of 256 that fits, down to
   --fit-ctx (4096, llama-server's default);
3. else, at that context, fewer layers: the target's, with the draft whole on the GPU beside it (a draft
   on the CPU makes each of its sequential steps slow); the draft's where -ngl was given.

Where not even one of the target's layers fits (or what was given does not fit), FitError says so with the
numbers. The budget is the GPU memory the models may take: the first GPU's free memory (or --gpu-budget)
less --fit-target's margin (1024 MiB, llama-server's). The draft's cache is its window (--draft-ctx);
`whole_draft_ctx` is the context the same budget allows with the draft at the whole context, as until the
window. Each slot (serve's -np) holds a context of its own, so slots multiply the caches. What stays in RAM
is not checked (llama.cpp's fit assumes it unlimited; `specserve check --budget` prices it).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .memory import KV_CELL_PADDING, ModelShape, cells, estimate, fmt_bytes
from .offload import LayerWeights, OffloadSplit, most_layers_within, split

FIT_CTX_DEFAULT = 4096  # llama-server's --fit-ctx: the least context --fit sets
FIT_TARGET_MIB_DEFAULT = 1024  # llama-server's --fit-target: the GPU memory --fit leaves free, MiB


class FitError(ValueError):
    """Nothing that --fit may choose fits the budget (the message has the numbers)."""


@dataclass(frozen=True)
class Model:
    """One model as the fit sees it. n_gpu_layers: as the user gave it (-1: all), None: the fit's to choose;
    window: a draft's --draft-ctx (0: the whole context)."""

    shape: ModelShape
    weights: LayerWeights
    n_ubatch: int
    n_gpu_layers: int | None = None
    window: int = 0

    @classmethod
    def from_gguf(cls, path: str, n_ubatch: int, n_gpu_layers: int | None = None, window: int = 0) -> "Model":
        shape = ModelShape.from_gguf(path)
        return cls(shape, LayerWeights.from_gguf(path, shape.n_layer), n_ubatch, n_gpu_layers, window)

    @property
    def all_layers(self) -> int:
        return self.shape.n_layer + 1  # llama.cpp's count: the blocks and the output layer

    def split(self, n_ctx: int, n_gpu_layers: int, n_seq: int = 1, cache_type: str = "f16") -> OffloadSplit:
        est = estimate(self.shape, cells(n_ctx, self.window) * n_seq, cache_type, n_ubatch=self.n_ubatch)
        return split(self.shape, self.weights, est, n_gpu_layers)

    def most_layers(self, n_ctx: int, gpu_bytes: int, n_seq: int = 1, cache_type: str = "f16") -> int:
        est = estimate(self.shape, cells(n_ctx, self.window) * n_seq, cache_type, n_ubatch=self.n_ubatch)
        return most_layers_within(self.shape, self.weights, est, gpu_bytes)


@dataclass(frozen=True)
class Fit:
    """What --fit chose: the context (per slot), each model's layers on the GPU (llama.cpp's count, all:
    n_layer + 1) and where the bytes land; `changed` says what was reduced, in words."""

    n_ctx: int
    n_gpu_layers: int
    n_gpu_layers_draft: int | None
    budget: int
    n_seq: int
    splits: dict[str, OffloadSplit]
    changed: tuple[str, ...]
    whole_draft_ctx: int | None = None  # the context fitted with the draft at the whole context instead
    no_draft_ctx: int | None = None  # the context fitted for the target alone

    @property
    def gpu(self) -> int:
        return sum(s.gpu for s in self.splits.values())

    @property
    def ram(self) -> int:
        return sum(s.ram for s in self.splits.values())

    def as_dict(self) -> dict:
        return {"n_ctx": self.n_ctx, "n_gpu_layers": self.n_gpu_layers, "n_gpu_layers_draft": self.n_gpu_layers_draft,
                "budget_bytes": self.budget, "n_seq": self.n_seq, "gpu_bytes": self.gpu, "ram_bytes": self.ram,
                **{role: s.as_dict() for role, s in self.splits.items()}, "changed": list(self.changed),
                "whole_draft_ctx": self.whole_draft_ctx, "no_draft_ctx": self.no_draft_ctx}


def fit(target: Model, draft: Model | None, budget: int, n_ctx: int | None = None,
        n_ctx_min: int = FIT_CTX_DEFAULT, n_seq: int = 1, cache_type: str = "f16") -> Fit:
    """The context and layers that fit `budget` bytes of GPU memory (module docstring). n_ctx: -c as given,
    None: the fit's to choose, from the target's training context down to n_ctx_min."""
    chosen = _fit(target, draft, budget, n_ctx, n_ctx_min, n_seq, cache_type)
    if draft is None or n_ctx is not None:
        return chosen
    # the same budget for the target alone, and with the draft at the whole context: what the draft costs
    # in context, and what its window gives back
    whole = Model(draft.shape, draft.weights, draft.n_ubatch, draft.n_gpu_layers) if draft.window else None
    other = {}
    for name, d in (("no_draft_ctx", None), ("whole_draft_ctx", whole)):
        if name == "no_draft_ctx" or d is not None:
            try:
                other[name] = _fit(target, d, budget, n_ctx, n_ctx_min, n_seq, cache_type).n_ctx
            except FitError:
                pass
    return replace(chosen, **other)


def _fit(target: Model, draft: Model | None, budget: int, n_ctx: int | None, n_ctx_min: int, n_seq: int,
         cache_type: str) -> Fit:
    models = {"target": target, **({"draft": draft} if draft is not None else {})}
    layers = {role: _layers(m, m.n_gpu_layers) if m.n_gpu_layers is not None else m.all_layers
              for role, m in models.items()}

    def splits(ctx: int, layers: dict[str, int]) -> dict[str, OffloadSplit]:
        return {role: m.split(ctx, layers[role], n_seq, cache_type) for role, m in models.items()}

    def gpu(ctx: int, layers: dict[str, int]) -> int:
        return sum(s.gpu for s in splits(ctx, layers).values())

    def done(ctx: int, layers: dict[str, int], changed: list[str]) -> Fit:
        return Fit(ctx, layers["target"], layers.get("draft"), budget, n_seq, splits(ctx, layers), tuple(changed))

    start = n_ctx or target.shape.n_ctx_train or FIT_CTX_DEFAULT
    if gpu(start, layers) <= budget:
        return done(start, layers, [])
    changed, ctx = [], start
    if n_ctx is None:
        floor = min(n_ctx_min, start)
        options = sorted({floor, *range(-(-floor // KV_CELL_PADDING) * KV_CELL_PADDING, start, KV_CELL_PADDING)})
        lo, hi = -1, len(options)  # the GPU's share grows with the context: the last option that fits
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if gpu(options[mid], layers) <= budget else (lo, mid)
        ctx = options[max(lo, 0)]
        if ctx != start:  # a training context below --fit-ctx stays as it is, as in llama.cpp
            changed.append(f"context {start} -> {ctx}" + (" (--fit-ctx)" if lo < 0 else ""))
        if lo >= 0:
            return done(ctx, layers, changed)
    for role in ("target", "draft"):  # fewer layers: the target's first
        if role not in models or models[role].n_gpu_layers is not None:
            continue
        rest = sum(s.gpu for r, s in splits(ctx, layers).items() if r != role)
        most = models[role].most_layers(ctx, budget - rest, n_seq, cache_type) if rest < budget else 0
        if role == "target" and most == 0:
            break  # not even the target's output layer: nothing worth fitting
        if gpu(ctx, {**layers, role: most}) <= budget:
            changed.append(f"{role} layers {models[role].all_layers} -> {most}")
            return done(ctx, {**layers, role: most}, changed)
    raise FitError(_nothing_fits(models, layers, splits(ctx, layers), budget, ctx, n_ctx, n_ctx_min, n_seq))


def _layers(m: Model, n: int) -> int:
    return m.all_layers if n < 0 else min(n, m.all_layers)


def _nothing_fits(models: dict[str, Model], layers: dict[str, int], splits: dict[str, OffloadSplit], budget: int,
                  ctx: int, n_ctx: int | None, n_ctx_min: int, n_seq: int) -> str:
    flags = {"target": "-ngl", "draft": "-ngld"}
    why = "-c" if n_ctx is not None else "--fit-ctx" if ctx == n_ctx_min else "the training context"
    at = f"at context {ctx} ({why})" + (f" in each of {n_seq} slots" if n_seq > 1 else "")
    parts = []
    for role, m in models.items():
        given = f", {flags[role]} given" if m.n_gpu_layers is not None else ""
        parts.append(f"the {role} takes {fmt_bytes(splits[role].gpu)} with {layers[role]}/{m.all_layers} layers"
                     f"{given}")
    need = sum(s.gpu for s in splits.values())
    line = f"nothing fits in {fmt_bytes(budget)} of GPU memory: {at}, " + " and ".join(parts)
    if models["target"].n_gpu_layers is None:  # the target's least share: its output layer beside the rest
        out = models["target"].split(ctx, 1, n_seq).gpu
        rest = need - splits["target"].gpu
        line += f"; the target's output layer alone needs {fmt_bytes(out)} beside {fmt_bytes(rest)}"
    else:
        line += f": {fmt_bytes(need)} in all"
    return line
