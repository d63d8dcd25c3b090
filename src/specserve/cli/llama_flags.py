"""llama-server's flags on `specserve serve`, so that a llama-server command line starts this server.

Three kinds (docs/llama-server-compat.md lists them all):
- flags that mean here what they mean there: the sampling defaults (--temp, --top-k, --top-p, --min-p,
  --seed, -n), the chat template (--chat-template NAME|JINJA, --chat-template-file), several --alias
  names and --tags, --slots/--no-slots, --cors-origins (comma-separated), --no-ui, --spec-type, -v;
- flags for what this server always does, or for how llama.cpp arranges its own work, accepted and
  logged (--jinja, --metrics, --cont-batching, --kv-unified, -tb, -fa, --offline, ...);
- flags for what it does not do, refused with the reason: --context-shift (generation ends at the
  context, finish_reason "length", rather than dropping the oldest tokens), -ctk/-ctv, self-extend,
  the synthetic drafts of --spec-synth-len;
- --spec-synth-rates (llama-server's made-up acceptance rates, a benchmark mode that llama.cpp's own
  test_with_and_without_draft starts it with): accepted with a warning and ignored, so that such a command
  line starts; speculation stays real, and the output the target's.
(--sleep-idle-seconds is one of serve's own flags: cli/serve.py.)

Default temperature: llama-server samples at 0.8 unless told otherwise; specserve stays greedy
(temperature 0). Greedy output is the target's own text whatever speculation did, reproduces without
a seed, and drafts are accepted most often there; every editor and OpenAI client sends its own
temperature, and `--temp 0.8` gives llama-server's default to those that do not.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from .common import CliError

log = logging.getLogger("specserve.server")

# accepted for llama-server's command lines, with what they amount to here
_ACCEPTED_BOOL = {
    "--jinja": "chat templates are always rendered with Jinja",
    "--no-jinja": "chat templates are always rendered with Jinja (the GGUF's own, or --chat-template's)",
    "--metrics": "/metrics is always served",
    "-cb": "continuous batching is always on", "--cont-batching": "continuous batching is always on",
    "-kvu": "each slot holds a whole context (-c) of its own", "--kv-unified": "each slot holds a whole context",
    "--no-kv-unified": "each slot holds a whole context (-c) of its own",
    "--offline": "nothing is downloaded at run time", "--no-context-shift": "generation ends at the context",
    "--swa-full": "not needed: the cache is kept whole", "--no-cache-idle-slots": "idle slots keep their caches",
    "--props": "POST /props (changing settings at run time) is not served; GET /props is",
    "--no-warmup": "models are warmed at start-up", "--no-mmap": "llama.cpp's default mapping is used",
    "--mlock": "llama.cpp's default memory locking is used",
}
_ACCEPTED_VALUE = {
    "-tb": "the same -t threads process prompts", "--threads-batch": "the same -t threads process prompts",
    "-fa": "llama.cpp's default attention is used", "--flash-attn": "llama.cpp's default attention is used",
    "--cache-ram": "no host-memory prompt cache: each slot keeps its own",
    "--threads-http": "the HTTP server is asynchronous",
    "--keep": "no context shift",
    "--n-keep": "no context shift", "-to": "see --read-timeout", "--timeout": "see --read-timeout",
}
_REFUSED = {
    "--context-shift": "context shift drops the oldest tokens of a full context and goes on; specserve ends the "
                       "answer at the context instead (finish_reason \"length\"): ask for fewer tokens or a larger -c",
    "-ctk": "the KV cache is kept in llama.cpp's default type (f16)",
    "--cache-type-k": "the KV cache is kept in llama.cpp's default type (f16)",
    "-ctv": "the KV cache is kept in llama.cpp's default type (f16)",
    "--cache-type-v": "the KV cache is kept in llama.cpp's default type (f16)",
    "--grp-attn-n": "self-extend (group attention) is not supported", "-gan": "self-extend is not supported",
    "--grp-attn-w": "self-extend (group attention) is not supported", "-gaw": "self-extend is not supported",
    "--spec-synth-len": "synthetic acceptance (a llama-server benchmark mode) makes the output invalid",
}
# accepted and ignored, with a warning: the command line starts, and nothing it asks for is done
_IGNORED_VALUE = {
    "--spec-synth-rates": "synthetic acceptance rates (a llama-server benchmark mode) are ignored: drafts are "
                          "accepted where the target's tokens agree, and the output stays the target's",
}
# llama-server's --spec-type names -> --spec modes
_SPEC_TYPES = {"none": "none", "draft-simple": "draft", "ngram-simple": "ngram", "ngram-map-k": "ngram",
               "ngram-map-k4v": "ngram", "ngram-mod": "ngram", "ngram-cache": "suffix"}


def add_llama_args(p: argparse.ArgumentParser) -> None:
    """llama-server's flags (see the module docstring)."""
    g = p.add_argument_group("llama-server's flags (docs/llama-server-compat.md)")
    g.add_argument("--temp", "--temperature", dest="default_temp", type=float, default=None, metavar="T",
                   help="requests' default temperature (default: 0, greedy; llama-server's is 0.8)")
    g.add_argument("--top-k", dest="default_top_k", type=int, default=None, metavar="K",
                   help="requests' default top-k (default 0: off)")
    g.add_argument("--top-p", dest="default_top_p", type=float, default=None, metavar="P",
                   help="requests' default top-p (default 1: off)")
    g.add_argument("--min-p", dest="default_min_p", type=float, default=None, metavar="P",
                   help="requests' default min-p (default 0: off)")
    g.add_argument("-s", "--seed", dest="default_seed", type=int, default=None, metavar="S",
                   help="requests' default seed (-1 or absent: a random one per request)")
    g.add_argument("-n", "--n-predict", "--predict", dest="n_predict", type=int, default=None, metavar="N",
                   help="requests' default limit on generated tokens (default: until the context is full; -1: "
                        "the same)")
    g.add_argument("--chat-template", metavar="NAME|JINJA",
                   help="the chat template to render chats with instead of the GGUF's: a built-in name (chatml, "
                        "hermes: ChatML with Qwen/Hermes tool calls, llama3, command-r, gemma, phi3, zephyr) "
                        "or the Jinja source itself")
    g.add_argument("--chat-template-file", metavar="FILE", help="the chat template's Jinja source, from FILE")
    g.add_argument("-rea", "--reasoning", choices=("on", "off", "auto"), default=None,
                   help="whether chat templates are told to let the model reason (their enable_thinking): on, off, "
                        "auto (default: on, as llama-server's auto). A request's chat_template_kwargs override it")
    g.add_argument("--chat-template-kwargs", metavar="JSON",
                   help="more variables for every chat template, a JSON object (e.g. '{\"enable_thinking\": false}')")
    g.add_argument("--tags", metavar="A,B", help="tags listed with the model in /v1/models")
    g.add_argument("--slots", dest="slots", action="store_true", default=True,
                   help="serve GET /slots (default)")
    g.add_argument("--no-slots", dest="slots", action="store_false", help="answer GET /slots with 501")
    g.add_argument("--no-ui", dest="no_webui", action="store_true", help="the same as --no-webui")
    g.add_argument("--webui", "--ui", dest="no_webui", action="store_false", help="serve the chat page (default)")
    g.add_argument("--cors-origins", metavar="A,B", help="the same as --cors-origin for each comma-separated origin")
    g.add_argument("--spec-type", metavar="TYPE", help="llama-server's speculation type, as --spec: none, "
                   "draft-simple -> draft, ngram-* -> ngram, ngram-cache -> suffix")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="answers carry `__verbose` (the prompt as rendered), as llama-server's")
    for flag, why in _ACCEPTED_BOOL.items():
        g.add_argument(flag, dest=f"llama_{flag.lstrip('-').replace('-', '_')}", action="store_true",
                       help=argparse.SUPPRESS)
    for flag, why in {**_ACCEPTED_VALUE, **_REFUSED, **_IGNORED_VALUE}.items():
        if flag != "--context-shift":
            g.add_argument(flag, dest=f"llama_{flag.lstrip('-').replace('-', '_')}", metavar="V",
                           help=argparse.SUPPRESS)
    g.add_argument("--context-shift", dest="llama_context_shift", action="store_true", help=argparse.SUPPRESS)


def llama_overrides(args) -> None:
    """Apply llama-server's flags to the serve flags they stand for; CliError(2) for a refused one."""
    for flag, why in _REFUSED.items():
        if getattr(args, f"llama_{flag.lstrip('-').replace('-', '_')}", None):
            raise CliError(f"{flag} is not supported: {why}", 2)
    for flag, why in {**_ACCEPTED_BOOL, **_ACCEPTED_VALUE}.items():
        if getattr(args, f"llama_{flag.lstrip('-').replace('-', '_')}", None):
            log.info("%s: accepted (%s)", flag, why)
    for flag, why in _IGNORED_VALUE.items():
        if getattr(args, f"llama_{flag.lstrip('-').replace('-', '_')}", None):
            log.warning("%s: %s", flag, why)
    if args.cors_origins:
        args.cors_origin = [*args.cors_origin, *filter(None, (o.strip() for o in args.cors_origins.split(",")))]
    if args.spec_type:
        modes = {_SPEC_TYPES.get(t.strip().lower(), None) for t in args.spec_type.split(",")}
        if None in modes or len(modes) != 1:
            raise CliError(f"--spec-type {args.spec_type}: the types served are {', '.join(_SPEC_TYPES)} (one "
                       "speculation mode; draft-eagle3, draft-mtp and the like need model heads this server does not "
                       "run)", 2)
        args.spec = modes.pop()
    if args.n_predict is not None and args.n_predict < -1 or args.n_predict == 0:
        raise CliError(f"-n must be > 0 (or -1: no limit), got {args.n_predict}", 2)


def default_sampling(args) -> dict:
    """The served model's profile's sampling fields from --temp, --top-k, --top-p, --min-p, --seed, -n."""
    out = {}
    for name, key in (("default_temp", "temperature"), ("default_top_k", "top_k"), ("default_top_p", "top_p"),
                      ("default_min_p", "min_p")):
        if getattr(args, name) is not None:
            out[key] = getattr(args, name)
    if args.default_seed is not None and args.default_seed >= 0:
        out["seed"] = args.default_seed
    if args.n_predict is not None and args.n_predict > 0:
        out["max_tokens"] = args.n_predict
    return out


def template_kwargs(args) -> dict:
    """The chat template variables --chat-template-kwargs and --reasoning give every chat."""
    import json

    from ..chat import TEMPLATE_OWN

    kwargs = {}
    if args.chat_template_kwargs:
        try:
            kwargs = json.loads(args.chat_template_kwargs)
        except ValueError as e:
            raise CliError(f"--chat-template-kwargs is not JSON: {e}", 2) from None
        if not isinstance(kwargs, dict) or TEMPLATE_OWN & set(kwargs):
            raise CliError("--chat-template-kwargs must be a JSON object, without "
                           f"{', '.join(sorted(TEMPLATE_OWN))}", 2)
    if args.reasoning is not None:
        kwargs["enable_thinking"] = args.reasoning != "off"
    return kwargs


def aliases(given: str | None) -> tuple[str, ...]:
    """--alias a,b,c: the names, sorted as llama-server lists them (its id is the first of them)."""
    if not given:
        return ()
    return tuple(sorted({a.strip() for a in given.split(",") if a.strip()}))


def chat_template(args) -> str | None:
    """The Jinja source --chat-template or --chat-template-file gives, or None (the GGUF's own)."""
    from ..chat_templates import builtin

    if args.chat_template and args.chat_template_file:
        raise CliError("give --chat-template or --chat-template-file, not both", 2)
    if args.chat_template_file:
        try:
            return Path(args.chat_template_file).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"--chat-template-file: {e}", 2) from None
    if args.chat_template:
        return builtin(args.chat_template) or args.chat_template
    return None
