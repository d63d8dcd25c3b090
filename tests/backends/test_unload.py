"""A model unloaded and loaded again in place (a sleeping server, --sleep-idle-seconds): what was read from
it stays readable while it is unloaded, anything that needs llama.cpp raises instead of touching freed
memory, and once reloaded it computes what it computed before."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest


def test_unloaded_model_keeps_what_was_read_and_refuses_what_needs_llama_cpp(tiny_paths):
    from specserve.backends import load_model

    model = load_model(str(tiny_paths["target"]), n_threads=1)
    try:
        tokens = model.tokenize("hello world")
        pieces = [model.token_bytes(t) for t in tokens]
        ctx = model.new_context(64)
        before = np.array(ctx.eval(tokens, "last"))
        ctx.close()
        metadata, vocab = dict(model.metadata), model.vocab
        model.unload()
        assert model.metadata == metadata and model.vocab is vocab
        assert [model.token_bytes(t) for t in tokens] == pieces  # read before: kept
        for needs_llama_cpp in (lambda: model.tokenize("hello"), lambda: model.token_bytes(tokens[0], True),
                                lambda: model.new_context(64), lambda: model.grammar_tokenizer()):
            with pytest.raises(RuntimeError, match="unloaded"):
                needs_llama_cpp()
        model.reload()
        assert model.tokenize("hello world") == tokens
        ctx = model.new_context(64)
        np.testing.assert_array_equal(ctx.eval(tokens, "last"), before)
        ctx.close()
        assert model.grammar_tokenizer() is not None  # built again, on the new vocabulary
    finally:
        model.close()


def test_a_file_changed_on_disk_is_not_reloaded(tiny_paths, tmp_path):
    from specserve.backends import load_model

    path = tmp_path / "target.gguf"
    shutil.copy(tiny_paths["target"], path)
    model = load_model(str(path), n_threads=1)
    try:
        model.unload()
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        with pytest.raises(ValueError, match="changed on disk"):
            model.reload()
        assert not model.handle
    finally:
        model.close()
