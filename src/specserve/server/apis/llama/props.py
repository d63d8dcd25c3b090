"""llama-server's GET /props and /slots (and POST /slots/{id}?action=erase), in its shapes.

/props: what a client needs to know before it sends anything (llama.vscode reads
`default_generation_settings.n_ctx`): the context of a slot, the slots, the requests' default
sampling, the chat template, the speculative settings, the build. /slots: each slot's current or
last request, plus what speculation did on that slot (`speculation`, a specserve extension).
`--no-slots` answers /slots with 501, as llama-server. A key confined to a scope (--api-key-file's
`scope=`) sees the request of a slot whose cache is its own scope's, and of any other slot only what
carries no request text (its id, context, whether it is busy); it sees no counters summed over other
tenants' requests, and erases only its own scope's slots. The model is named by its file name, never its
path: a path tells a client about the host's directories and user names.
"""
from __future__ import annotations

import math
from pathlib import Path

import llama_cpp
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .... import __version__
from ....config import SamplingParams, SpecParams
from ....draft_choice import of_engine
from ...core.params import sampling_params
from ...http.endpoint import Endpoint
from ...http.errors import ApiError, bad_request
from ...http.guard import KEY_SCOPE
from ...state import ServerState, server_of

RANDOM_SEED = 0xFFFFFFFF  # llama-server's LLAMA_DEFAULT_SEED: a random seed per request
BUILD_INFO = f"specserve {__version__} (llama-cpp-python {llama_cpp.__version__})"
# OpenAI's `system_fingerprint`: opaque to clients; llama-server's reads "b<build>-<commit>"
SYSTEM_FINGERPRINT = f"b{__version__}-specserve-llama-cpp-python-{llama_cpp.__version__}"


def routes() -> list[Endpoint]:
    return [Endpoint("/props", props, ("GET",), needs_model=False),
            Endpoint("/props", props_change, ("POST",), needs_model=False),
            Endpoint("/slots", slots, ("GET",), needs_model=False),
            Endpoint("/slots/{id_slot}", slot_action, ("POST",))]


def prepare(target) -> None:
    """At start-up: the bos and eos tokens' text, kept in the model's piece cache, so that /props answers
    while the server sleeps (core/sleep.py: llama.cpp's vocabulary is freed then)."""
    for token in (target.vocab.bos, target.vocab.eos):
        if token is not None:
            target.token_bytes(token, True)


def not_supported(message: str) -> ApiError:
    return ApiError(501, message, code="not_supported", kind="not_supported_error")


def generation_settings(sampling: SamplingParams, spec: SpecParams | None = None, *, eog=(), stream: bool = False,
                        n_predict: int | None = None, verify: str | None = None) -> dict:
    """A request's (or the defaults') settings in llama-server's `generation_settings` shape. Samplers this
    server does not have show their neutral values; `eog`: the end-of-generation tokens, which
    `ignore_eos` keeps out as llama-server's -inf logit biases do."""
    bias = [{"bias": None, "token": t} for t in sorted(eog)] if sampling.ignore_eos else []  # null: -inf
    bias += [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in sampling.logit_bias]
    out = {
        "seed": RANDOM_SEED if sampling.seed is None else sampling.seed, "temperature": sampling.temperature,
        "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_k": sampling.top_k, "top_p": sampling.top_p,
        "min_p": sampling.min_p, "top_n_sigma": -1.0, "xtc_probability": 0.0, "xtc_threshold": 0.1,
        "typical_p": 1.0, "repeat_last_n": getattr(sampling, "repeat_last_n", 64),
        "repeat_penalty": getattr(sampling, "repeat_penalty", 1.0),
        "presence_penalty": getattr(sampling, "presence_penalty", 0.0),
        "frequency_penalty": getattr(sampling, "frequency_penalty", 0.0), "dry_multiplier": 0.0,
        "mirostat": 0, "adaptive_target": -1.0, "adaptive_decay": 0.9,
        "max_tokens": -1 if n_predict is None else n_predict, "n_predict": -1 if n_predict is None else n_predict,
        "n_keep": 0, "ignore_eos": sampling.ignore_eos, "stream": stream, "stop": list(sampling.stop),
        "logit_bias": bias, "n_probs": getattr(sampling, "logprobs", None) or 0,
        "grammar": sampling.grammar or "", "samplers": ["top_k", "top_p", "min_p", "temperature"],
    }
    if spec is not None:
        out["speculative"] = {"mode": spec.mode, "draft_max": spec.draft_max, "draft_min": spec.draft_min,
                              "draft_p_min": spec.draft_p_min, "ngram_min": spec.ngram_min, "ngram_max": spec.ngram_max,
                              "suffix_max": spec.suffix_max, "cross_request": spec.cross_request,
                              "verify": verify}
        out["speculative.n_max"], out["speculative.n_min"] = spec.draft_max, spec.draft_min
        out["speculative.p_min"] = spec.draft_p_min
    return out


def _speculates(state: ServerState) -> bool:
    """Whether requests that ask nothing are speculated (lookup drafters need no draft model)."""
    return state.profiles[state.settings.model_name].spec.get("mode", "auto") != "none"


def _defaults(state: ServerState) -> dict:
    """The served model's defaults, as a request that sets nothing gets them."""
    profile = state.profiles[state.settings.model_name]
    sampling, _ = sampling_params(profile, state.engine.n_ctx, {})
    n_predict = profile.sampling.get("max_tokens")  # -n, or a profile's max_tokens
    spec = SpecParams(**profile.spec)
    return generation_settings(sampling, spec, eog=state.engine.target.vocab.eog, n_predict=n_predict,
                               verify=profile.verify)


async def props(request: Request) -> Response:
    state = server_of(request)
    engine, settings = state.engine, state.settings
    target, v = engine.target, engine.target.vocab

    def text(t):
        return target.token_bytes(t, True).decode("utf-8", "replace") if t is not None else ""

    return JSONResponse({
        "default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": engine.n_ctx, "is_processing": False,
                                        "speculative": _speculates(state), "params": _defaults(state)},
        "total_slots": settings.parallel,
        "model_alias": settings.model_name,
        "model_path": Path(target.path).name,
        "draft_model_path": Path(engine.draft.path).name if engine.draft is not None else None,
        "draft_choice": of_engine(engine),  # how the draft was chosen (-md auto) and the other candidates
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": settings.slots_endpoint, "endpoint_props": False, "endpoint_metrics": True,
        "ui": settings.webui, "webui": settings.webui,
        "chat_template": target.metadata.get("tokenizer.chat_template") or "",
        "bos_token": text(v.bos), "eos_token": text(v.eos),
        "build_info": BUILD_INFO, "is_sleeping": state.sleeper is not None and state.sleeper.asleep,
        "exact": _exact(target),
    })


def _exact(target) -> dict | None:
    """--exact's start-up check (backends/exact.py): whether passes of any size round as one-token steps here."""
    check = getattr(target, "exact_check", None)
    return None if check is None else {"exact": check.exact, "pad_single": check.pad_single, "detail": check.detail}


async def props_change(request: Request) -> Response:
    raise not_supported("POST /props (changing the server's settings while it runs) is not supported; restart it "
                        "with other flags")


def _slot(state: ServerState, i: int, key_scope: str | None) -> dict:
    """Slot i as llama-server shows it; for a key confined to `key_scope`, the request only where the
    slot's last one was of that scope, and no speculation counters (they sum every tenant's requests)."""
    pool, record = state.scheduler.pool, state.slot_records.slots[i]
    slot = pool.slots[i]
    busy = not pool.is_free(slot)
    out = {"id": i, "n_ctx": state.engine.n_ctx, "speculative": _speculates(state), "is_processing": busy}
    if key_scope is None:
        out["speculation"] = record.speculation()
    job = record.job
    if job is not None and key_scope in (None, job.req.spec.cross_request_scope):
        s, req = job.stats, job.req
        out.update({
            "id_task": record.id_task, "n_prompt_tokens": s.n_prompt,
            "n_prompt_tokens_processed": s.n_prompt - s.n_cached, "n_prompt_tokens_cache": s.n_cached,
            "params": generation_settings(req.sampling, req.spec, eog=state.engine.target.vocab.eog, stream=req.stream,
                                          n_predict=req.sampling.max_tokens, verify=req.verify),
            # an idle slot's budget is spent: nothing remains and nothing is being decoded
            "next_token": [{"has_next_token": busy, "has_new_line": False,
                            "n_remain": req.sampling.max_tokens - s.n_generated if busy else -1,
                            "n_decoded": s.n_generated if busy else 0}],
        })
    return out


async def slots(request: Request) -> Response:
    state = server_of(request)
    if not state.settings.slots_endpoint:
        raise not_supported("This server does not support slots endpoint: it was started with --no-slots")
    key_scope = request.scope.get(KEY_SCOPE)
    return JSONResponse([_slot(state, i, key_scope) for i in range(state.n_slots)])


def other_scope(i: int) -> ApiError:
    return ApiError(403, f"slot {i} holds the cache of another scope than this API key's; a scoped key may act "
                         "only on its own scope's slots", "id_slot", "slot_of_another_scope", kind="permission_error")


async def slot_action(request: Request) -> Response:
    """POST /slots/{id}?action=erase empties the slot's caches, waiting while it is busy; save and restore
    (llama-server's --slot-save-path) are not supported. A scoped key acts only on a slot whose cache
    is its scope's (asked again once the slot is held: another scope's request may have run meanwhile)."""
    state = server_of(request)
    pool = state.scheduler.pool
    try:
        i = int(request.path_params["id_slot"])
    except ValueError:
        raise bad_request("the slot id must be an integer", "id_slot") from None
    if not 0 <= i < len(pool.slots):
        raise bad_request(f"id_slot must be a slot of this server (0 to {len(pool.slots) - 1}), got {i}", "id_slot")
    action = request.query_params.get("action")
    if action in ("save", "restore"):
        raise not_supported(f"slot {action} is not supported: a slot's cache is not written to or read from files")
    if action != "erase":
        raise bad_request(f"action must be erase, save or restore, got {action!r}", "action")
    key_scope = request.scope.get(KEY_SCOPE)
    if key_scope is not None and not pool.holds(i, key_scope):
        raise other_scope(i)
    slot = await pool.acquire([], i)
    try:
        if key_scope is not None and not pool.holds(i, key_scope):
            raise other_scope(i)
        n = await state.scheduler.worker.run(slot.forget_cache)
    finally:
        pool.release(slot)
    return JSONResponse({"id_slot": i, "n_erased": n})
