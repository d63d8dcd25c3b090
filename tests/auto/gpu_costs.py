"""Pass and drafting costs of the seed's pair on an RTX 3090, from published llama.cpp figures (no GPU here).

The seed's pair: Qwen3-14B Q4_K_M (a GGUF of about 9.0 GB) as the target, Qwen3-0.6B Q8_0 (about 0.64 GB) as the draft,
both wholly on one RTX 3090 (936 GB/s), llama.cpp's CUDA backend. No published table gives this pair's pass
over n tokens, so the curve is built from what is published for the same card:

- the shape, a pass over n tokens against a pass over 1 (pp512 at micro-batch n: the mean pass over a context
  growing 0..512, the case of a short chat), from llama 8B Q4_0 on an RTX 3090:
  - n = 1..8, measured (MMVQ, the kernel llama.cpp uses up to 8 rows): 156.56, 279.89, 390.96, 470.48, 509.70,
    541.57, 559.30, 583.77 tokens/s, https://github.com/ggml-org/llama.cpp/pull/15802;
    that is 6.39, 7.15, 7.67, 8.50, 9.81, 11.08, 12.52, 13.70 ms a pass;
  - n = 16, measured (MMQ with int8 tensor cores): 914.10 tokens/s at pp2048, 17.50 ms a pass,
    https://github.com/ggml-org/llama.cpp/pull/7716;
  - n = 32 and 64, derived: llama 8B Q3_K_S on an RTX 3090 at n = 16, 32, 64 (1145.06, 1770.40, 2595.01
    tokens/s: 13.97, 18.08, 24.66 ms, https://github.com/ggml-org/llama.cpp/pull/8495) grows by 1.29x and
    1.77x from 16 to 32 and 64; applied to the 17.50 ms at 16: 22.6 and 30.9 ms;
  - n = 9..15 interpolated between 8 and 16 (the kernel switches from MMVQ to MMQ at 9: a step not modelled);
    65 extrapolated from 32..64.
- the scale, a pass over 1 token of the 14B: the 8B Q4_0's 6.39 ms moves 4.65 GB of weights (728 GB/s, 78% of
  the card's bandwidth); the 14B Q4_K_M's 9.0 GB at the same rate: 12.4 ms (81 tokens/s, derived). Every
  point above is scaled by 12.4 / 6.39.

So a pass over 9 tokens costs 2.2x one, over 17 tokens 2.8x (published), not ~1x: a quantized 8-14B on a
3090 is not purely memory-bound at 2-16 rows (the dot products of MMVQ grow with the rows).

The draft: Qwen3-0.6B Q8_0 is small enough that a decode step is bound by kernel launches, not weights:
llama 1B Q4_0 on an RTX 3090 runs a pass over 8 tokens at 2655.01 tokens/s (3.01 ms, PR 15802 above), which
bounds a 1B's pass over one token from above. Taken: 2.5 ms a drafted token (400 tokens/s, derived, with the
host's work per draft token) and 0.4 ms a token caught up in one batch (3.01 ms / 8, derived).
"""
from __future__ import annotations

from step_simulator import curve

_SCALE = 12.4 / 6.387  # the 14B's pass over 1 token / the 8B's (weights moved: 9.0 GB against 4.65 GB)
_LLAMA_8B = {1: 6.387, 2: 7.146, 3: 7.673, 4: 8.502, 5: 9.810, 6: 11.079, 7: 12.516, 8: 13.704,  # PR 15802
             16: 17.50,  # PR 7716
             32: 22.64, 64: 30.89}  # PR 8495's growth from 16 applied to PR 7716's 16

RTX3090_14B = curve({n: ms * _SCALE for n, ms in _LLAMA_8B.items()})  # seconds of a target pass over n tokens
RTX3090_DRAFT_TOK = 0.0025  # seconds a drafted token of the 0.6B
RTX3090_CATCHUP = 0.0004  # seconds a token the 0.6B catches up on in one batch
