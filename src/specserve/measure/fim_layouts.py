"""Which FIM layout gives the better suggestion: the first-line match of three layouts (docs/infill.md).

    python -m specserve.measure.fim_layouts --model qwen2.5-coder-1.5b --cuts 24

Over the fim-replay requests (bench/fim_workload.py: cut points down standard-library files, with 0,
2 and 5 characters of the real line typed), the target alone answers each greedily, in-process, in
three layouts, and the tool counts how often the answer's first line is the file's real rest of the
line:
- `mid`: `prompt` (the line up to the cursor) after FIM_MID, as llama-server's README documents it;
- `healed`: the same with the prompt's last token backed off and healed (what /infill serves);
- `prefix`: `prompt` appended to the prefix, before the suffix, as llama-server's code does.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .. import fim, models
from ..backends import load_model
from ..backends.base import sync_and_eval
from ..bench.fim_workload import fim_replay
from ..grammar.healing import TokenHealing, vocab_of

N_CTX = 4096


def first_line(model, ctx, tokens: list[int], heal: bytes, n: int) -> str:
    """The greedy answer up to its first newline (healed bytes left out), at most n tokens."""
    healing = TokenHealing(vocab_of(model), heal) if heal else None
    seq, out, eog = list(tokens), b"", model.vocab.eog
    for _ in range(n):
        row = np.array(sync_and_eval(ctx, seq), dtype=np.float32).reshape(1, -1)
        if healing is not None:
            row = healing.masked(row, [])
        t = int(np.argmax(row[0]))
        if t in eog:
            break
        if healing is not None:
            healing.commit([t])
        seq.append(t)
        out += model.token_bytes(t)
        if b"\n" in out[len(heal):]:
            break
    return out[len(heal):].decode("utf-8", "replace").split("\n", 1)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specserve.measure.fim_layouts", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a packaged model's name or a GGUF path")
    ap.add_argument("--cuts", type=int, default=24, help="cut points over the files (each asked 3 times)")
    ap.add_argument("-n", type=int, default=40, help="most tokens an answer may take to reach its newline")
    ap.add_argument("-t", "--threads", type=int, default=None)
    args = ap.parse_args(argv)
    model = load_model(str(models.resolve(args.model)), n_threads=args.threads)
    ctx = model.new_context(N_CTX)
    hits = {"mid": [], "healed": [], "prefix": []}
    cases = [c for file_cases in fim_replay(args.cuts) for c in file_cases]
    for i, case in enumerate(cases, 1):
        req = fim.Infill(prefix=case.prefix, suffix=case.suffix, prompt=case.prompt)
        tokens = fim.model_layout(model, req, N_CTX, args.n)
        healed, heal = fim.healed(model, tokens, req)
        joined = fim.Infill(prefix=case.prefix + case.prompt, suffix=case.suffix)
        spliced = fim.model_layout(model, joined, N_CTX, args.n)
        answers = {"mid": first_line(model, ctx, tokens, b"", args.n),
                   "healed": first_line(model, ctx, healed, heal, args.n),
                   "prefix": first_line(model, ctx, spliced, b"", args.n)}
        for name, text in answers.items():
            hits[name].append((case.typed, case.matches(text)))
        print(f"\r{i}/{len(cases)} {case.key}", end="", file=sys.stderr)
    print(file=sys.stderr)
    for name, rows in hits.items():
        typed = [m for t, m in rows if t]
        print(f"{name:7s} first line matched {sum(m for _, m in rows)}/{len(rows)}; "
              f"with characters typed {sum(typed)}/{len(typed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
