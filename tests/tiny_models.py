"""Write tiny, deterministic GGUF models that the real llama.cpp loads.

The test suite builds its own models instead of downloading any: a few-layer
"llama" architecture with random (seeded) F32/F16 weights and a real byte-level
BPE tokenizer (GPT-2 style, ``tokenizer.ggml.model = "gpt2"``) that round-trips
any text.  Writing one takes ~50 ms and ~0.5 MB (F32 defaults).

Vocabulary layout (gpt2 variant):
  * ids 0..255      - the 256 byte tokens, id == byte value, spelled with
                      GPT-2's ``bytes_to_unicode`` mapping (space -> "Ġ").
  * next len(MERGES) - results of the BPE merges in ``MERGES`` (" the", "ing"...).
  * last three      - ``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>`` (CONTROL).
  * optional ``extra_tokens`` appended after those.
BOS = ``<|endoftext|>``, EOS = ``<|im_end|>``, ``add_bos_token = False`` (as in
Qwen2/SmolLM ChatML models): tokenizing never prepends BOS unless the caller
asks for it explicitly.  A ChatML ``tokenizer.chat_template`` is included.

Similarity between target and draft is controlled through the weights: weights
are a pure function of ``seed``; ``noise`` adds Gaussian noise (from
``noise_seed``) of std ``noise * rms(tensor)`` to every tensor.  So
``write_tiny_model(p, seed=1, noise=0.05, noise_seed=7)`` is a close draft of
``write_tiny_model(q, seed=1)``, and ``seed=2`` is an unrelated model.
The output matrix is scaled by ``logit_scale`` so next-token distributions are
peaked (top-1 prob: median ~0.75, 5th percentile ~0.2) rather than near-uniform,
which makes greedy near-ties rare (not impossible) and acceptance non-trivial.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import gguf
import numpy as np

TokenType = gguf.TokenType
DATA = Path(__file__).parent / "data"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
# Qwen2.5-Instruct's chat template (as in its GGUF, kept verbatim in data/), which spells tool calls in the
# Hermes form: write a model with it and with added_tokens=TOOL_TAGS to serve tools as Qwen2.5 does.
QWEN_TOOLS_TEMPLATE = (DATA / "qwen2.5_tools.jinja").read_text()
TOOL_TAGS = ("<tool_call>", "</tool_call>")
# A reasoning model's chat template in Qwen3's style (Qwen3-Thinking-2507, as DeepSeek-R1's): the generation
# prompt opens the reasoning block, so the answer starts inside it; past turns keep their answer without their
# reasoning; tools in the Hermes form. Write a model with it and added_tokens=THINK_TAGS + TOOL_TAGS.
QWEN3_THINKING_TEMPLATE = (DATA / "qwen3_thinking.jinja").read_text()
THINK_TAGS = ("<think>", "</think>")
# Qwen2.5-Coder's FIM tokens, in its order: write a model with control_tokens=QWEN_FIM (test_fim.py)
QWEN_FIM = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")

# Words whose BPE merges are built left to right (" the" -> "Ġ t", "Ġt h", "Ġth e").
_MERGE_WORDS = (" the", "the", " and", " cat", " sat", " on", " mat", " is", " in",
                " of", " to", " a", "ing", "er", " it", " he", " was", " that", " with",
                " at", "ed", " be", "es", " dog", " ran")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character mapping."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_B2U = bytes_to_unicode()


def _build_merges() -> list[str]:
    merges: list[str] = []
    for word in _MERGE_WORDS:
        chars = "".join(_B2U[b] for b in word.encode())
        for k in range(1, len(chars)):
            m = f"{chars[:k]} {chars[k]}"
            if m not in merges:
                merges.append(m)
    return merges


#: Default merge list in rank order (GPT-2 unicode spelling, e.g. "Ġ t").
MERGES: tuple[str, ...] = tuple(_build_merges())


def _gpt2_vocab(merges: Sequence[str]) -> tuple[list[str], list[int]]:
    tokens = [_B2U[b] for b in range(256)]
    for m in MERGES:  # token texts come from the DEFAULT merges: merge edits keep texts
        merged = m.replace(" ", "")
        if merged not in tokens:
            tokens.append(merged)
    tokens += SPECIAL_TOKENS
    types = [TokenType.NORMAL] * (len(tokens) - 3) + [TokenType.CONTROL] * 3
    return tokens, types


def _spm_vocab(n_target: int) -> tuple[list[str], list[int], list[float]]:
    """SentencePiece ("llama") vocab: <unk> <s> </s>, byte fallback, "▁" pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    for m in MERGES:
        piece = m.replace(" ", "").replace("Ġ", "▁")
        if piece not in tokens:
            tokens.append(piece)
            types.append(TokenType.NORMAL)
    while len(tokens) < n_target - 3:  # same vocab size as the gpt2 variant
        tokens.append(f"<unused{len(tokens)}>")
        types.append(TokenType.UNUSED)
    del tokens[n_target - 3:], types[n_target - 3:]
    tokens += SPECIAL_TOKENS
    types += [TokenType.CONTROL] * 3
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    return tokens, types, scores


def _weights(rng: np.random.Generator, n_vocab: int, n_layer: int, n_embd: int, n_head: int,
             n_head_kv: int, n_ff: int, logit_scale: float) -> dict[str, np.ndarray]:
    """Random llama weights.  numpy shapes are (out, in): GGUF reverses them to ggml ne."""
    hd = n_embd // n_head

    def g(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    emb = g((n_vocab, n_embd), 1.0)
    # Output rows = random part + embedding of a "predecessor" token, so the
    # residual stream's current-token component gives its successor a logit
    # spike.  Pure Gaussian logits have top1-top2 gaps of only ~0.3 std, so 5%
    # weight noise flips ~30% of argmaxes; the spike gives real margins (like
    # trained LMs) while attention/FFN keep ~half the argmaxes context dependent.
    # Inputs are RMS-normed, so logit std is ~logit_scale.  The successor map is
    # one random cycle through the vocab: no fixed points or short cycles, which
    # would make greedy decoding repeat one token forever.
    order = rng.permutation(n_vocab)
    pred = np.empty_like(order)
    pred[np.roll(order, -1)] = order
    out = g((n_vocab, n_embd), 1.0) + emb[pred]
    w = {"token_embd.weight": emb,
         "output_norm.weight": np.ones(n_embd, np.float32),
         "output.weight": (out * (0.5 * logit_scale / np.sqrt(n_embd))).astype(np.float32)}
    s = 1.0 / np.sqrt(n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(n_embd, np.float32)
        # q/k a bit larger than 1/sqrt(d) so attention is selective (sequence dependence).
        w[p + "attn_q.weight"] = g((n_head * hd, n_embd), 1.5 * s)
        w[p + "attn_k.weight"] = g((n_head_kv * hd, n_embd), 1.5 * s)
        w[p + "attn_v.weight"] = g((n_head_kv * hd, n_embd), s)
        w[p + "attn_output.weight"] = g((n_embd, n_head * hd), 1.0 / np.sqrt(n_head * hd))
        w[p + "ffn_norm.weight"] = np.ones(n_embd, np.float32)
        w[p + "ffn_gate.weight"] = g((n_ff, n_embd), s)
        w[p + "ffn_up.weight"] = g((n_ff, n_embd), s)
        w[p + "ffn_down.weight"] = g((n_embd, n_ff), 1.0 / np.sqrt(n_ff))
    return w


def write_tiny_model(
    path: str | Path, *, seed: int = 0, n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
    n_head_kv: int = 2, n_ff: int = 128, n_ctx_train: int = 1024, noise: float = 0.0,
    noise_seed: int = 0, logit_scale: float = 4.0, f16: bool = False, quiet_layers: int = 0,
    # -- flagrant vocab mismatches --
    tokenizer_model: str = "gpt2", swap_tokens: tuple[int, int] | None = None,
    extra_tokens: int = 0, bos_id: int | None = None, eos_id: int | None = None,
    # -- subtle tokenizer mismatches --
    drop_merge: str | None = None, swap_merges: tuple[str, str] | None = None,
    token_types: Mapping[str, int] | None = None, control_tokens: Sequence[str] = (),
    chat_template: str | None = CHATML_TEMPLATE, pre_tokenizer: str = "gpt-2",
    added_tokens: Sequence[str] = (),
) -> Path:
    """Write a tiny llama-architecture GGUF to ``path`` and return it as a Path.

    Weights: ``seed`` fixes all weights; ``noise`` > 0 adds N(0, (noise*rms(W))^2)
    noise drawn from ``noise_seed`` to every tensor (noise=0: identical to the
    same-seed model).  ``logit_scale`` ~ std of the logits.  ``f16`` stores the
    2-D matrices as F16 (norms stay F32).  ``quiet_layers``: the last that many
    layers write 1/100 of their output into the residual stream, so the model
    predicts nearly as the same-seed model with that many fewer layers does (a
    cheap draft that agrees with it: scripts/device_measure.py's synthetic pair).

    Flagrant vocab edits (a draft written with these must be rejected as a pair):
      tokenizer_model: "gpt2" (byte-level BPE, default) or "llama" (SentencePiece
          with <unk>/<s>/</s> and <0xXX> byte fallback; same vocab size).
      swap_tokens=(a, b): swap the texts of token ids a and b (use ids >= 5).
      extra_tokens=n: append n NORMAL tokens "<extra_i>" (vocab size grows by n;
          the first rows of the weights stay identical to the un-extended model).
      control_tokens: texts appended as CONTROL tokens after those (FIM tokens: test_fim.py).
      bos_id / eos_id: override the BOS (default <|endoftext|>) / EOS (default
          <|im_end|>) token ids.
    Subtle tokenizer edits (same token texts, different behaviour):
      drop_merge: remove one merge, e.g. "Ġth e" (then " the" -> "Ġth","e").
      swap_merges=(m1, m2): swap the ranks of two merges in ``MERGES``.
      token_types: {token_text: TokenType} overrides, e.g.
          {"<|im_end|>": TokenType.USER_DEFINED}.
      chat_template: the jinja template string (None: no template key).
      pre_tokenizer: ``tokenizer.ggml.pre``; llama.cpp rejects unknown names.
          "gpt-2" (default), "default", "llama3", "qwen2", "smollm" all load.
      added_tokens: texts appended as USER_DEFINED tokens after the extra ones, as Qwen2.5's
          ``<tool_call>`` and ``</tool_call>`` are (vocab size grows; base rows stay identical).
    """
    path = Path(path)
    merges = list(MERGES)
    if drop_merge is not None:
        merges.remove(drop_merge)
    if swap_merges is not None:
        i, j = merges.index(swap_merges[0]), merges.index(swap_merges[1])
        merges[i], merges[j] = merges[j], merges[i]
    tokens, types = _gpt2_vocab(merges)
    scores = None
    if tokenizer_model == "llama":
        tokens, types, scores = _spm_vocab(len(tokens))
    elif tokenizer_model != "gpt2":
        raise ValueError(f"unsupported tokenizer_model {tokenizer_model!r}")
    n_base = len(tokens)
    tokens += [f"<extra_{i}>" for i in range(extra_tokens)] + list(control_tokens) + list(added_tokens)
    types += ([TokenType.NORMAL] * extra_tokens + [TokenType.CONTROL] * len(control_tokens)
              + [TokenType.USER_DEFINED] * len(added_tokens))
    extra_tokens += len(control_tokens) + len(added_tokens)  # rows for all come from one stream below
    if scores is not None:
        scores += [-float(n_base + i) for i in range(extra_tokens)]
    if swap_tokens is not None:
        a, b = swap_tokens
        tokens[a], tokens[b] = tokens[b], tokens[a]
    for text, ttype in (token_types or {}).items():
        types[tokens.index(text)] = ttype

    w = _weights(np.random.default_rng(seed), n_base, n_layer, n_embd, n_head, n_head_kv,
                 n_ff, logit_scale)
    if extra_tokens:  # separate stream: base rows unchanged by extra tokens
        rng_x = np.random.default_rng([seed, 1])
        out_std = 0.5 * logit_scale / np.sqrt(n_embd)
        for name, std in (("token_embd.weight", 1.0), ("output.weight", out_std)):
            extra = (rng_x.standard_normal((extra_tokens, n_embd)) * std).astype(np.float32)
            w[name] = np.concatenate([w[name], extra])
    for i in range(n_layer - quiet_layers, n_layer):
        for name in (f"blk.{i}.attn_output.weight", f"blk.{i}.ffn_down.weight"):
            w[name] *= 0.01
    if noise > 0:
        rng_n = np.random.default_rng(noise_seed)
        for name, t in w.items():
            rms = float(np.sqrt(np.mean(t * t)))
            w[name] = (t + rng_n.standard_normal(t.shape) * noise * rms).astype(np.float32)

    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_name(f"tiny-llama-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    writer.add_block_count(n_layer)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model(tokenizer_model)
    if tokenizer_model == "gpt2":
        writer.add_tokenizer_pre(pre_tokenizer)
        writer.add_token_merges(merges)
        special_ids = {"bos": n_base - 1, "eos": n_base - 2}
    else:
        writer.add_token_scores(scores)
        special_ids = {"bos": 1, "eos": 2}
        writer.add_unk_token_id(0)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_bos_token_id(special_ids["bos"] if bos_id is None else bos_id)
    writer.add_eos_token_id(special_ids["eos"] if eos_id is None else eos_id)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for name, t in w.items():
        if f16 and t.ndim == 2:
            t = t.astype(np.float16)
        writer.add_tensor(name, t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_mamba(path: str | Path, *, seed: int = 0, n_layer: int = 2, n_embd: int = 32, d_state: int = 8,
                     d_conv: int = 4, dt_rank: int = 4, logit_scale: float = 4.0) -> Path:
    """Write a tiny Mamba (recurrent, no attention, no KV cache) GGUF with the same tokenizer.

    Its memory is one state per sequence, which llama.cpp cannot roll back to an earlier
    position: what speculation needs. d_inner = 2 n_embd, the only expansion llama.cpp takes.
    """
    path = Path(path)
    tokens, types = _gpt2_vocab(MERGES)
    n_vocab, d_inner = len(tokens), 2 * n_embd
    rng = np.random.default_rng(seed)

    def g(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    emb = g((n_vocab, n_embd), 1.0)
    w = {"token_embd.weight": emb, "output_norm.weight": np.ones(n_embd, np.float32),
         "output.weight": (g((n_vocab, n_embd), 1.0) * (0.5 * logit_scale / np.sqrt(n_embd))).astype(np.float32)}
    for i in range(n_layer):  # numpy shapes are (out, in): GGUF reverses them to ggml ne
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(n_embd, np.float32)
        w[p + "ssm_in.weight"] = g((2 * d_inner, n_embd), 1.0 / np.sqrt(n_embd))
        w[p + "ssm_conv1d.weight"] = g((d_inner, d_conv), 0.5)
        w[p + "ssm_conv1d.bias"] = np.zeros(d_inner, np.float32)
        w[p + "ssm_x.weight"] = g((dt_rank + 2 * d_state, d_inner), 1.0 / np.sqrt(d_inner))
        w[p + "ssm_dt.weight"] = g((d_inner, dt_rank), 1.0 / np.sqrt(dt_rank))
        w[p + "ssm_dt.bias"] = np.full(d_inner, -2.0, np.float32)
        w[p + "ssm_a"] = -np.exp(rng.uniform(0.0, 2.5, (d_inner, d_state))).astype(np.float32)
        w[p + "ssm_d"] = np.ones(d_inner, np.float32)
        w[p + "ssm_out.weight"] = g((n_embd, d_inner), 1.0 / np.sqrt(d_inner))

    writer = gguf.GGUFWriter(path, arch="mamba")
    writer.add_name(f"tiny-mamba-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_block_count(n_layer)
    writer.add_context_length(1024)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(dt_rank)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_merges(list(MERGES))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_bos_token_id(n_vocab - 1)
    writer.add_eos_token_id(n_vocab - 2)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    for name, t in w.items():
        writer.add_tensor(name, t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
