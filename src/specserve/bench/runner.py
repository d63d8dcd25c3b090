"""Run every benchmark configuration on the same prompts, interleaved.

After one short warm-up run per configuration, each prompt is run by every
configuration in turn, the order rotating from prompt to prompt, so slow drift of
the machine (thermal, other load) falls on all configurations alike. Every run
starts from a cold cache: the slot's target and draft KV caches are emptied first,
so prefix reuse from the previous configuration's run of the same prompt cannot
flatter the next one. Seeds are fixed per prompt: the same prompt is sampled with
the same seed by every configuration and repeat.
"""
from __future__ import annotations

import sys
import zlib
from dataclasses import dataclass, field

from ..config import DEFAULT_VERIFY, SamplingParams, SpecParams
from ..controller import Controller
from ..engine import Engine
from ..prompt import chat_tokens, prompt_tokens
from .workloads import BenchPrompt

WARMUP_TOKENS = 16


@dataclass(frozen=True)
class BenchConfig:
    """One way of generating: the target alone, a drafter at a draft length, or a remote server."""

    name: str
    spec: str  # none | draft | ngram | auto | endpoint
    draft_model: str | None = None  # the draft model as the user named it (draft, auto)
    draft_max: int = 0
    endpoint: str | None = None

    @property
    def flags(self) -> str:
        """The specserve flags that reproduce this configuration."""
        if self.spec == "endpoint":
            return f"--endpoint {self.endpoint}"
        if self.spec == "none":
            return "--spec none"
        md = f" -md {self.draft_model}" if self.draft_model else ""
        return f"--spec {self.spec}{md} --draft-max {self.draft_max}"


def plan_configs(specs: list[str], drafts: list[str], draft_maxes: list[int],
                 endpoints: list[str], ngram_maxes: list[int] | None = None) -> list[BenchConfig]:
    """The target alone, then each drafter x each draft length (prompt lookup's own lengths if
    given), auto at the largest, then endpoints."""
    ngram_maxes = draft_maxes if ngram_maxes is None else ngram_maxes
    label = {d: _short(d) for d in drafts}
    if len(set(label.values())) < len(label):  # same file name in two folders: names must stay unique
        label = {d: d for d in drafts}
    configs = [BenchConfig("target", "none")]
    for k in sorted(set(draft_maxes) | set(ngram_maxes)):
        if "draft" in specs and k in draft_maxes:
            configs += [BenchConfig(f"draft[{label[d]}] k={k}", "draft", d, k) for d in drafts]
        if "ngram" in specs and k in ngram_maxes:
            configs.append(BenchConfig(f"ngram k={k}", "ngram", None, k))
    if "auto" in specs:
        cap = max(draft_maxes + ngram_maxes)
        configs += [BenchConfig(f"auto[{label[d]}] k<={cap}", "auto", d, cap) for d in drafts] or \
                   [BenchConfig(f"auto k<={cap}", "auto", None, cap)]
    return configs + [BenchConfig(f"endpoint {url}", "endpoint", endpoint=url) for url in endpoints]


def _short(model: str) -> str:
    """A draft model's label: a packaged name as it is, a path by its file name."""
    name = model.replace("\\", "/").rsplit("/", 1)[-1]
    return name[:-5] if name.endswith(".gguf") else name


@dataclass
class Measurement:
    """One measured run: which configuration, on which prompt, and its statistics."""

    config: str
    workload: str
    temperature: float
    prompt_index: int
    repeat: int
    stats: dict  # GenerationStats.as_dict(), or the endpoint client's equivalent


@dataclass
class BenchPlan:
    """What to run: configurations x prompts x temperatures x repeats."""

    configs: list[BenchConfig]
    prompts: list[BenchPrompt]
    temperatures: list[float] | None  # None: each prompt's own temperature (else 0)
    max_tokens: int | None  # None: each prompt's own max_tokens (else 128)
    repeat: int = 1
    seed: int = 0
    ignore_eos: bool = False
    verify: str = DEFAULT_VERIFY
    jobs: list[tuple[float, BenchPrompt]] = field(init=False)

    def __post_init__(self) -> None:
        self.jobs = []  # (temperature, prompt): every prompt at every temperature
        for p in self.prompts:
            temperatures = self.temperatures if self.temperatures is not None else [p.temperature or 0.0]
            self.jobs += [(t, p) for t in temperatures]

    def sampling(self, temperature: float, prompt: BenchPrompt, max_tokens: int | None = None) -> SamplingParams:
        seed = (self.seed * 1_000_003 + zlib.crc32(f"{prompt.workload}/{prompt.index}".encode())) % 2**31
        n = max_tokens or self.max_tokens or prompt.max_tokens or 128
        return SamplingParams(temperature=temperature, seed=seed, max_tokens=n, ignore_eos=self.ignore_eos)


class LocalModels:
    """The target and draft models, one Engine per draft sharing the target, one slot per engine.

    Each engine has its own `--spec auto` controller, as a server would: it learns the
    engine's costs and acceptance over the warm-up and the prompts before. With
    auto_profile, it starts from what auto learnt on these models before (as `generate`
    and `serve` do) and keeps what it learns here.
    """

    def __init__(self, target, drafts: dict[str, object], n_ctx: int, auto_profile: bool = False):
        self.target, self.drafts, self.n_ctx = target, drafts, n_ctx
        self.slots = {None: Engine(target, None, n_ctx, controller=self._controller(None, auto_profile)).new_slot()}
        for name, draft in drafts.items():
            engine = Engine(target, draft, n_ctx, controller=self._controller(draft, auto_profile))
            self.slots[name] = engine.new_slot()
        self._tokens: dict[tuple[str, int], list[int]] = {}

    def tokens(self, prompt: BenchPrompt) -> list[int]:
        key = (prompt.workload, prompt.index)
        if key not in self._tokens:
            self._tokens[key] = (chat_tokens(self.target, list(prompt.messages)) if prompt.chat
                                 else prompt_tokens(self.target, prompt.text))
        return self._tokens[key]

    def fits(self, prompt: BenchPrompt, max_tokens: int) -> bool:
        """Whether the prompt and its output fit the context."""
        return len(self.tokens(prompt)) + max_tokens < self.n_ctx

    def run(self, config: BenchConfig, prompt: BenchPrompt, sampling: SamplingParams, verify: str) -> dict:
        slot = self.slots[config.draft_model if config.spec in ("draft", "auto") else None]
        slot.ctx.truncate(0)  # cold start: no prefix reuse between configurations or repeats
        if slot.draft_ctx is not None:
            slot.draft_ctx.truncate(0)
        mode = "none" if config.spec == "none" else config.spec
        spec = SpecParams(mode=mode, draft_max=config.draft_max if mode != "none" else 0)
        return slot.generate(self.tokens(prompt), sampling, spec, verify).stats.as_dict()

    def memory(self) -> dict:
        """Bytes the backend reported for each model and its slot's caches."""
        def entry(model, ctx) -> dict:
            use = ctx.memory()
            return {"path": model.path, "weights_bytes": use.weights, "kv_bytes": use.kv_cache,
                    "compute_bytes": use.compute, "total_bytes": use.total}

        out = {"target": entry(self.target, self.slots[None].ctx), "drafts": {}}
        for name, draft in self.drafts.items():
            out["drafts"][name] = entry(draft, self.slots[name].draft_ctx)
        return out

    def _controller(self, draft, auto_profile: bool) -> Controller:
        from ..config import ModelConfig
        from ..engine import learning_controller

        cfg = ModelConfig(self.target.path, getattr(draft, "path", None), self.n_ctx,
                          n_threads=getattr(self.target, "n_threads", None), auto_profile=auto_profile)
        return learning_controller(cfg, self.target)

    def close(self) -> None:
        for slot in self.slots.values():
            slot.engine.controller.save()
            slot.close()


def run_benchmark(plan: BenchPlan, local: LocalModels, endpoints: dict,
                  progress: bool | None = None) -> list[Measurement]:
    """Warm up, then run every job with every configuration in rotating order; return all measurements."""
    from tqdm import tqdm

    configs, jobs = plan.configs, plan.jobs
    results: list[Measurement] = []
    total = len(configs) * (1 + len(jobs) * plan.repeat)
    disable = None if progress is None else not progress  # None: only on a terminal
    with tqdm(total=total, desc="bench", unit="run", file=sys.stderr, disable=disable, dynamic_ncols=True) as bar:
        def execute(config: BenchConfig, temperature: float, prompt: BenchPrompt, max_tokens=None) -> dict:
            bar.set_postfix_str(config.name, refresh=False)
            sampling = plan.sampling(temperature, prompt, max_tokens)
            if config.spec == "endpoint":
                stats = endpoints[config.endpoint].generate(list(prompt.messages), sampling.max_tokens,
                                                            temperature, sampling.seed, plan.ignore_eos)
            else:
                stats = local.run(config, prompt, sampling, plan.verify)
            bar.update()
            return stats

        warm_t, warm_p = jobs[0]
        for config in configs:
            execute(config, warm_t, warm_p, WARMUP_TOKENS)
        for r in range(plan.repeat):
            for j, (temperature, prompt) in enumerate(jobs):
                shift = (j + r) % len(configs)
                for config in configs[shift:] + configs[:shift]:
                    stats = execute(config, temperature, prompt)
                    results.append(Measurement(config.name, prompt.workload, temperature, prompt.index, r, stats))
    return results
