"""FIM prompt layout (fim.py) against Qwen2.5-Coder's token names, on a tiny model that has them."""
from __future__ import annotations

import pytest

from specserve.backends import load_model
from specserve.fim import CHUNK_SEPARATOR, FimTokens, FimUnsupported, Infill, fim_tokens, layout, model_layout
from tiny_models import QWEN_FIM, write_tiny_model


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("fim") / "fim.gguf", seed=1, control_tokens=QWEN_FIM)
    model = load_model(str(path), n_threads=1)
    yield model
    model.close()


def text_of(model, ids):
    special = special_ids(model)
    return "".join(model.vocab.token_texts[i] if i in special else model.detokenize([i]).decode() for i in ids)


def special_ids(model):
    f = fim_tokens(model)
    return {f.pre, f.suf, f.mid, f.rep, f.sep}


def test_qwen_token_names_are_found_by_their_texts(fim_model):
    texts = fim_model.vocab.token_texts
    f = fim_tokens(fim_model)
    assert [texts[i] for i in (f.pre, f.suf, f.mid, f.rep, f.sep)] == \
        ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"]


def test_the_repo_level_layout_with_prompt_after_the_middle_token(fim_model):
    req = Infill(prefix="def f(x):\n", suffix="\n    return y\n", prompt="    y = ",
                 extra=[("a.py", "import os\n"), ("b.py", "X = 1\n")])
    ids = model_layout(fim_model, req, n_ctx=4096, n_predict=64)
    assert text_of(fim_model, ids) == (
        "<|repo_name|>myproject\n<|file_sep|>a.py\nimport os\n<|file_sep|>b.py\nX = 1\n<|file_sep|>filename\n"
        "<|fim_prefix|>def f(x):\n<|fim_suffix|>\n    return y\n<|fim_middle|>    y = ")


def test_a_file_that_spells_a_fim_token_stays_text(fim_model):
    ids = model_layout(fim_model, Infill(prefix="s = '<|fim_middle|>'\n"), n_ctx=1024)
    assert ids.count(fim_tokens(fim_model).mid) == 1  # only the layout's own


def test_budget_prefix_keeps_its_tail_suffix_its_head(fim_model):
    tok = lambda s: fim_model.tokenize(s, add_special=False, parse_special=False) if s else []  # noqa: E731
    f = fim_tokens(fim_model)
    prefix = "".join(f"line {i}\n" for i in range(400))
    suffix = "".join(f"after {i}\n" for i in range(400))
    n_batch, prompt = 256, "x = "
    ids = layout(f, tok, Infill(prefix=prefix, suffix=suffix, prompt=prompt), n_ctx=4096, n_batch=n_batch)
    pre, suf, mid = ids.index(f.pre), ids.index(f.suf), ids.index(f.mid)
    p_ids, s_ids = tok(prefix), tok(suffix)
    assert ids[pre + 1:suf] == p_ids[-3 * (n_batch // 4):]  # the prefix's last 192 tokens
    assert ids[suf + 1:mid] == s_ids[:n_batch // 4 - 2 - len(tok(prompt))]  # the suffix's first 62 less the prompt
    assert ids[mid + 1:] == tok(prompt)


def test_budget_extra_chunks_cut_from_their_start_to_fit(fim_model):
    tok = lambda s: fim_model.tokenize(s, add_special=False, parse_special=False) if s else []  # noqa: E731
    f = fim_tokens(fim_model)
    extra = [(f"f{i}.py", "".join(f"v{i}_{j} = {j}\n" for j in range(40))) for i in range(20)]
    n_ctx, n_batch, n_predict = 2048, 512, 128
    ids = layout(f, tok, Infill(prefix="a\n", extra=extra), n_ctx=n_ctx, n_predict=n_predict, n_batch=n_batch)
    full = layout(f, tok, Infill(prefix="a\n", extra=extra), n_ctx=100_000, n_predict=n_predict, n_batch=n_batch)
    n_extra = n_ctx - n_batch - 2 * n_predict
    head = full.index(f.pre)
    assert head > n_extra  # the whole extra context would not fit
    assert ids.index(f.pre) == n_extra and ids[:n_extra] == full[head - n_extra:head]  # its tail: the newest chunks
    assert ids[-6:] == full[-6:]


def test_without_repo_and_file_tokens_chunks_are_joined_plainly(fim_model):
    tok = lambda s: fim_model.tokenize(s, add_special=False, parse_special=False) if s else []  # noqa: E731
    f = fim_tokens(fim_model)
    plain = FimTokens(f.pre, f.suf, f.mid)
    ids = layout(plain, tok, Infill(prefix="p", suffix="s", extra=[("a.py", "A")]), n_ctx=1024)
    assert ids == [*tok(CHUNK_SEPARATOR), *tok("A"), f.pre, *tok("p"), f.suf, *tok("s"), f.mid]


def test_a_model_without_fim_tokens_is_refused_naming_the_missing_token(tiny_models):
    with pytest.raises(FimUnsupported, match=r"infill is not supported by this model: its vocabulary has no FIM "
                                             r"prefix token \(<\|fim_prefix\|>.*no suffix token.*no middle token"):
        model_layout(tiny_models["target"], Infill(prefix="a"), n_ctx=1024)


def test_without_n_predict_the_extra_context_still_leaves_room_to_generate(fim_model):
    tok = lambda s: fim_model.tokenize(s, add_special=False, parse_special=False) if s else []  # noqa: E731
    f = fim_tokens(fim_model)
    extra = [("big.py", "x = 1\n" * 2000)]
    prefix, suffix = "p = 2\n" * 2000, "s = 3\n" * 2000
    ids = layout(f, tok, Infill(prefix=prefix, suffix=suffix, extra=extra), n_ctx=1024, n_predict=0, n_batch=512)
    assert len(ids) == 1023  # one token of room: llama-server's share alone would have made it 1025
