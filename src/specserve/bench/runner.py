"""Run every benchmark configuration on the same prompts, interleaved.

After one short warm-up run per configuration, each prompt is run by every
configuration in turn, the order rotating from prompt to prompt, so slow drift of
the machine (thermal, other load) falls on all configurations alike. Every run
starts from a cold cache: the slot's target and draft KV caches are emptied first,
so prefix reuse from the previous configuration's run of the same prompt cannot
flatter the next one. Seeds are fixed per prompt: the same prompt is sampled with
the same seed by every configuration and repeat.

Cross-request drafting is the exception, on purpose: each configuration (and each
repeat) has its own scope of the engine's store, which keeps what that configuration
generated earlier in the run, as a server would; warm-ups are kept out of it. In a
multi-turn workload each configuration re-sends its own earlier answers.
"""
from __future__ import annotations

import sys
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..config import DEFAULT_VERIFY, SUFFIX_MAX_DEFAULT, SamplingParams, SpecParams
from ..auto import Controller
from ..drafters.suffix_store import SuffixStore
from ..engine import Engine, token_seconds
from ..prompt import chat_tokens, prompt_tokens
from .structured import grammar_for, validates
from .workloads import BenchPrompt, in_run_order, resolve_messages

WARMUP_TOKENS = 16
# Warm up on a request of its own: no measured prompt (a conversation's first turn included) may be
# in a server's prompt cache before it is measured.
WARMUP_MESSAGES = ({"role": "user", "content": "Say hello in one short sentence."},)
STORE_BYTES = 64 << 20  # each engine's cross-request store, as `serve` keeps by default


@dataclass(frozen=True)
class BenchConfig:
    """One way of generating: the target alone, a drafter at a draft length, or a remote server."""

    name: str
    spec: str  # none | draft | ngram | suffix | auto | auto-fresh | endpoint
    draft_model: str | None = None  # the draft model as the user named it (draft, auto)
    draft_max: int = 0
    endpoint: str | None = None
    via: str = "inprocess"  # inprocess: this process's engine; server: the bench's own `specserve serve`
    baseline: str = "target"  # the configuration its speedups are paired against (an endpoint: its own target alone)

    @property
    def flags(self) -> str:
        """The specserve flags that reproduce this configuration."""
        if self.spec == "endpoint":
            return f"--endpoint {self.endpoint}"
        if self.spec == "none":
            return "--spec none"
        md = f" -md {self.draft_model}" if self.draft_model else ""
        spec = "auto" if self.spec == "auto-fresh" else self.spec  # the same setting, each request in a new process
        return f"--spec {spec}{md} --draft-max {self.draft_max}"


VIAS = ("server", "inprocess")
IN_PROCESS = " (in-process)"  # what an in-process configuration's name ends in beside served ones


def plan_configs(specs: list[str], drafts: list[str], draft_maxes: list[int],
                 endpoints: list[str], ngram_maxes: list[int] | None = None,
                 vias: tuple[str, ...] = ("inprocess",),
                 endpoint_baseline: str | list[str] | None = None) -> list[BenchConfig]:
    """The target alone, then each drafter x each draft length (prompt lookup's own lengths if
    given; suffix: once, at its own cap), auto at the largest (auto-fresh too, each run as a new
    process's first request), then endpoints; each through every one of `vias`, served first. Beside
    served configurations an in-process one is named so (IN_PROCESS); auto-fresh runs in-process only.
    An endpoint is a URL or NAME=URL; endpoint_baseline (a URL or NAME among them, or several:
    `endpoint_baselines`) runs its target alone, and the endpoints' speedups are paired against it
    (each server against its own target alone)."""
    local = _plan_local(specs, drafts, draft_maxes, ngram_maxes)
    configs = []
    for via in [v for v in VIAS if v in vias]:
        label = IN_PROCESS if via == "inprocess" and "server" in vias else ""
        configs += [BenchConfig(c.name + label, c.spec, c.draft_model, c.draft_max, via=via)
                    for c in local if via == "inprocess" or c.spec != "auto-fresh"]
    if "inprocess" not in vias:  # auto-fresh is a new process's first request: in-process only
        configs += [BenchConfig(c.name + IN_PROCESS, c.spec, c.draft_model, c.draft_max)
                    for c in local if c.spec == "auto-fresh"]
    named = [endpoint_name(e) for e in endpoints]
    base = endpoint_baselines(named, endpoint_baseline)
    return configs + [BenchConfig(name, "endpoint", endpoint=url, baseline=base[name]) for name, url in named]


def endpoint_baselines(named: list[tuple[str, str]], given: str | list[str] | None) -> dict[str, str]:
    """{endpoint name: the configuration its speedups are paired against} for the (name, url) endpoints.

    given: each a NAME or URL among them, which runs its target alone and is the baseline of every
    endpoint not named otherwise, or ENDPOINT=BASELINE, one endpoint paired against another (two servers
    in one run, each against its own target alone); none: specserve's own target alone ("target")."""
    def find(ref: str) -> str:
        name = next((n for n, url in named if ref in (n, url)), None)
        if name is None:
            raise ValueError(f"--endpoint-baseline {ref} names none of the --endpoint servers")
        return name

    default, pairs = "target", {}
    for item in [given] if isinstance(given, str) else given or []:
        left, sep, right = item.partition("=")
        if sep and "://" not in left:
            pairs[find(left)] = find(right)
        else:
            default = find(item)
    return {name: pairs.get(name, default) for name, _ in named}


def endpoint_name(endpoint: str) -> tuple[str, str]:
    """(name, url) of an --endpoint given as URL (named "endpoint URL") or as NAME=URL."""
    name, sep, url = endpoint.partition("=")
    if sep and "://" not in name:
        return name, url
    return f"endpoint {endpoint}", endpoint


def _plan_local(specs: list[str], drafts: list[str], draft_maxes: list[int],
                ngram_maxes: list[int] | None) -> list[BenchConfig]:
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
    if "suffix" in specs:
        configs.append(BenchConfig(f"suffix k<={SUFFIX_MAX_DEFAULT}", "suffix", None, SUFFIX_MAX_DEFAULT))
    if "auto" in specs:
        cap = max(draft_maxes + ngram_maxes)
        configs += [BenchConfig(f"auto[{label[d]}] k<={cap}", "auto", d, cap) for d in drafts] or \
                   [BenchConfig(f"auto k<={cap}", "auto", None, cap)]
    if "auto-fresh" in specs:
        cap = max(draft_maxes + ngram_maxes)
        configs += [BenchConfig(f"auto-fresh[{label[d]}] k<={cap}", "auto-fresh", d, cap) for d in drafts] or \
                   [BenchConfig(f"auto-fresh k<={cap}", "auto-fresh", None, cap)]
    return configs


def _short(model: str) -> str:
    """A draft model's label: a packaged name as it is, a path by its file name (with its window,
    `bench --draft-ctx LIST`: DRAFT@ctxN)."""
    model, at, window = model.partition("@ctx")
    name = model.replace("\\", "/").rsplit("/", 1)[-1]
    return (name[:-5] if name.endswith(".gguf") else name) + at + window


@dataclass
class Measurement:
    """One measured run: which configuration, on which prompt, and its statistics."""

    config: str
    workload: str
    temperature: float
    prompt_index: int
    repeat: int
    stats: dict  # GenerationStats.as_dict(), or the endpoint client's equivalent
    turn: str = ""  # the prompt's kind in a multi-turn conversation (first, retry, ...)


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
        for p in in_run_order(self.prompts):
            temperatures = self.temperatures if self.temperatures is not None else [p.temperature or 0.0]
            self.jobs += [(t, p) for t in temperatures]

    def sampling(self, temperature: float, prompt: BenchPrompt, max_tokens: int | None = None) -> SamplingParams:
        seed = (self.seed * 1_000_003 + zlib.crc32(f"{prompt.workload}/{prompt.index}".encode())) % 2**31
        n = max_tokens or self.max_tokens or prompt.max_tokens or 128
        grammar = grammar_for(prompt.schema) if prompt.schema is not None and prompt.constrain else None
        return SamplingParams(temperature=temperature, seed=seed, max_tokens=n, ignore_eos=self.ignore_eos,
                              grammar=grammar)


class LocalModels:
    """The target and draft models, one Engine per draft sharing the target, one slot per engine.

    Each engine has its own `--spec auto` controller, as a server would: it learns the
    engine's costs and acceptance over the warm-up and the prompts before. With
    auto_profile, it starts from what auto learnt on these models before (as `generate`
    and `serve` do) and keeps what it learns here.
    """

    def __init__(self, target, drafts: dict[str, object], n_ctx: int, auto_profile: bool = False,
                 windows: dict[str, int] | None = None):
        """windows: a draft's --draft-ctx by its name (default: the engine's)."""
        self.target, self.drafts, self.n_ctx = target, drafts, n_ctx
        def engine(draft, window: int | None = None) -> Engine:
            e = Engine(target, draft, n_ctx, controller=self._controller(draft, auto_profile),
                       suffix_store=SuffixStore(STORE_BYTES))
            e.draft_window = e.draft_window if window is None else window
            return e

        self.slots = {None: engine(None).new_slot()}
        for name, draft in drafts.items():
            self.slots[name] = engine(draft, (windows or {}).get(name)).new_slot()
        self._tokens: dict[tuple[str, int], list[int]] = {}

    def tokens(self, prompt: BenchPrompt) -> list[int]:
        key = (prompt.workload, prompt.index)
        if key not in self._tokens:
            self._tokens[key] = (chat_tokens(self.target, list(prompt.messages)) if prompt.chat
                                 else prompt_tokens(self.target, prompt.text))
        return self._tokens[key]

    def prompt_ids(self, prompt: BenchPrompt, messages: list[dict] | None = None) -> list[int]:
        """The tokens a run evaluates: the prompt's, or `messages` (earlier answers filled in) in the chat template."""
        return chat_tokens(self.target, messages) if messages is not None else self.tokens(prompt)

    def fits(self, prompt: BenchPrompt, max_tokens: int) -> bool:
        """Whether the prompt and its output fit the context (earlier answers it re-sends counted
        at max_tokens each)."""
        return len(self.tokens(prompt)) + (len(prompt.answers_needed) + 1) * max_tokens < self.n_ctx

    def run(self, config: BenchConfig, prompt: BenchPrompt, sampling: SamplingParams, verify: str,
            messages: list[dict] | None = None, scope: str | None = None) -> tuple[dict, str]:
        """(stats, text) of one run. messages: the prompt's own with earlier answers filled in;
        scope: the cross-request scope to read and feed (None: none)."""
        slot = self.slots[config.draft_model if config.spec in ("draft", "auto", "auto-fresh") else None]
        tokens = self.prompt_ids(prompt, messages)
        slot.forget_cache()  # cold start: no prefix reuse between configurations or repeats
        mode = "auto" if config.spec == "auto-fresh" else config.spec
        k = config.draft_max if mode != "none" else 0
        spec = SpecParams(mode=mode, draft_max=k, suffix_max=k if mode == "suffix" else SUFFIX_MAX_DEFAULT,
                          cross_request=scope is not None, cross_request_scope=scope or "")
        if config.spec == "auto-fresh":
            with fresh_controller(slot.engine):
                gen = slot.generate(tokens, sampling, spec, verify)
        else:
            gen = slot.generate(tokens, sampling, spec, verify)
        s, span = gen.stats, gen.stats.t_total - gen.stats.t_first_token  # after the first token
        return {**s.as_dict(), "decode_tokens_per_s": round((s.n_generated - 1) / span, 2)
                if s.n_generated > 1 and span > 0 else 0.0}, gen.text

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


@contextmanager
def fresh_controller(engine: Engine):
    """The engine's `--spec auto` as a new process would start it: a controller loaded from the
    profile its own controller would save now (none with --no-auto-profile: priors), calibrated
    as Engine.load does; what it learns is thrown away after the request."""
    engine.calibrate()  # the engine's own controller first, if it has not run a request yet
    own = engine.controller
    fresh = Controller()
    fresh.costs.cost_ratio = dict(own.costs.cost_ratio)
    if own.profile.store is not None:
        fresh.load_state_dict(own.state_dict())
        fresh.profile.loaded = True
        if engine.draft is not None:
            fresh.calibrate("draft", *token_seconds(engine.draft, engine.target))
    engine.controller = fresh
    try:
        yield fresh
    finally:
        engine.controller = own


def run_benchmark(plan: BenchPlan, local: LocalModels, endpoints: dict,
                  progress: bool | None = None, served=None) -> list[Measurement]:
    """Warm up, then run every job with every configuration in rotating order; return all measurements.
    served: the bench's own servers (served.ServedModels), which run the configurations `via` "server"."""
    from tqdm import tqdm

    configs, jobs = plan.configs, plan.jobs
    results: list[Measurement] = []
    total = len(configs) * (1 + len(jobs) * plan.repeat)
    disable = None if progress is None else not progress  # None: only on a terminal
    with tqdm(total=total, desc="bench", unit="run", file=sys.stderr, disable=disable, dynamic_ncols=True) as bar:
        answers: dict[tuple, str] = {}  # (configuration, repeat, temperature, workload, prompt index) -> answer

        def execute(config: BenchConfig, temperature: float, prompt: BenchPrompt, repeat: int | None,
                    max_tokens=None) -> dict:
            """One run; repeat None: a warm-up, kept out of cross-request stores and conversations."""
            bar.set_postfix_str(config.name, refresh=False)
            sampling = plan.sampling(temperature, prompt, max_tokens)
            run_key = (config.name, repeat, temperature, prompt.workload)
            schema = prompt.schema if sampling.grammar is not None else None  # sent with the request
            messages = resolve_messages(prompt, {i: answers.get((*run_key, i), "") for i in prompt.answers_needed})
            if repeat is None:
                messages = list(WARMUP_MESSAGES)
            if config.spec == "endpoint":
                stats = endpoints[config.endpoint].generate(messages, sampling.max_tokens, temperature, sampling.seed,
                                                            plan.ignore_eos, schema=schema)
                text = stats.pop("text", "")
            else:
                dynamic = prompt.answers_needed or repeat is None
                scope = (None if repeat is None or config.spec not in ("suffix", "auto")
                         else f"{configs.index(config)}#{repeat}@{temperature:g}")
                messages = messages if dynamic else None
                if config.via == "server":
                    stats, text = served.run(config, local.prompt_ids(prompt, messages), sampling, plan.verify, scope,
                                             schema=schema)
                else:
                    stats, text = local.run(config, prompt, sampling, plan.verify, messages, scope)
            if prompt.schema is not None:
                stats["valid"] = validates(text, prompt.schema)
            if repeat is not None:
                answers[(*run_key, prompt.index)] = text
            bar.update()
            return stats

        warm_t, warm_p = jobs[0]
        for config in configs:
            execute(config, warm_t, warm_p, None, WARMUP_TOKENS)
        for r in range(plan.repeat):
            for j, (temperature, prompt) in enumerate(jobs):
                shift = (j + r) % len(configs)
                for config in configs[shift:] + configs[:shift]:
                    stats = execute(config, temperature, prompt, r)
                    results.append(Measurement(config.name, prompt.workload, temperature, prompt.index, r, stats,
                                               prompt.turn))
    return results
