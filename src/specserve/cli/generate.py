"""`specserve generate`: one prompt, text streamed to stdout, stats to stderr."""
from __future__ import annotations

import json
import sys
from dataclasses import replace

from .common import CliError, add_model_args, add_sampling_args, add_spec_args, load_engine, model_config, \
    sampling_params, spec_params
from .fitting import add_fit_args, fitted


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text from one prompt with speculative decoding",
                       description="Generate from one prompt. Text streams to stdout, stats go to stderr.")
    add_model_args(p)
    add_fit_args(p.add_argument_group("GPU fit"))
    add_spec_args(p)
    add_sampling_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", help="prompt text")
    src.add_argument("-f", "--file", help="read the prompt from a file ('-' for stdin)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object {text, tokens, stats} instead")
    g = p.add_argument_group("structured output (docs/structured.md)").add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="FILE", help="constrain the output to JSON valid against this JSON Schema")
    g.add_argument("--grammar", metavar="FILE", help="constrain the output to this grammar: GBNF (llama.cpp's), or "
                   "llguidance's Lark if the file starts with %%llguidance or its name ends .lark")
    p.set_defaults(run=run)


def read_prompt(args) -> str:
    if args.prompt is not None:
        return args.prompt
    try:
        if args.file == "-":
            return sys.stdin.read()
        with open(args.file, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise CliError(f"cannot read prompt file: {e}") from None
    except UnicodeDecodeError:
        raise CliError(f"prompt file {args.file} is not UTF-8 text") from None


def read_grammar(args) -> str | None:
    """The llguidance grammar of --json-schema or --grammar, or None."""
    from ..grammar import GrammarError, from_grammar_text, from_json_schema

    path = args.json_schema or args.grammar
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        return from_json_schema(text) if args.json_schema else from_grammar_text(text, path)
    except OSError as e:
        raise CliError(f"cannot read {path}: {e}", 2) from None
    except (GrammarError, UnicodeDecodeError) as e:
        raise CliError(f"{path}: {e}", 2) from None


def run(args) -> int:
    from ..prompt import prompt_tokens
    from ..stats import GenerationStats

    prompt = read_prompt(args)
    if not prompt:
        raise CliError("empty prompt", 2)
    sampling, spec, cfg = sampling_params(args), spec_params(args), fitted(model_config(args), args)
    sampling = replace(sampling, grammar=read_grammar(args))
    engine = load_engine(cfg, quiet=args.json)
    try:
        try:
            if sampling.grammar is not None:
                engine.check_grammar(sampling.grammar)
        except ValueError as e:  # GrammarError: what the grammar cannot do with this vocabulary
            raise CliError(str(e), 2) from None
        if spec.mode == "draft" and engine.draft is None:
            raise CliError("--spec draft needs a draft model (-md)", 2)
        slot = engine.new_slot()
        tokens = prompt_tokens(engine.target, prompt, chat=args.chat)
        text_parts, out_tokens = [], []
        stats = GenerationStats()
        stream = slot.stream(tokens, sampling, spec, verify_method=args.verify, stats=stats)
        try:
            for chunk in stream:
                out_tokens.extend(chunk.tokens)
                if args.json:
                    text_parts.append(chunk.text)
                elif chunk.text:
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
        except ValueError as e:  # the prompt does not fit, or the target cannot speculate in this mode
            raise CliError(str(e), 2) from None
        if args.json:
            choice = getattr(args, "draft_choice", None)
            json.dump({"text": "".join(text_parts), "tokens": out_tokens, "stats": stats.as_dict(),
                       **({"draft_choice": choice.public()} if choice is not None else {})}, sys.stdout)
            sys.stdout.write("\n")
        else:
            sys.stdout.write("\n")
            print(stats.summary_line(), file=sys.stderr)
    finally:
        engine.close()
    return 0
