"""The `specserve` command: one subcommand per module in this package."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from . import bench, check, export, generate, models_cmd, serve
from .common import CliError

_SUBCOMMANDS = (generate, serve, bench, check, export, models_cmd)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = argparse.ArgumentParser(prog="specserve", description="Speculative decoding for local GGUF models.")
    p.add_argument("--version", action="version", version=f"specserve {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in _SUBCOMMANDS:
        mod.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    level = os.environ.get("SPECSERVE_LOG", "info").upper()  # specserve's own loggers; debug: auto's every step
    logging.getLogger("specserve").setLevel(getattr(logging, level, logging.INFO))
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given: `serve` in router mode passes it on
    try:
        return args.run(args) or 0
    except CliError as e:
        print(f"specserve: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("specserve: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
