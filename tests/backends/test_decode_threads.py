"""Every llama.cpp pass of a process runs on one thread: with OpenMP, a second thread that runs passes
makes all of them ~1.5x slower (backends.llama_native.DecodeThreads). The server runs its passes on its
engine thread alone, the draft-cost calibration of a loaded auto profile included."""
from __future__ import annotations

import logging
import threading

import httpx

from server_fixtures import ServerProcess, serve_args, tiny_models_dir  # noqa: F401
import pytest

pytestmark = pytest.mark.server

TWO_THREADS = "llama.cpp passes run on 2 threads"


def test_a_second_decoding_thread_is_named_once(tiny_paths, caplog):
    from specserve.backends import load_model
    from specserve.backends.llama_native import DecodeThreads

    model = load_model(str(tiny_paths["target"]), n_threads=1)
    DecodeThreads.forget()  # what earlier tests' threads left
    try:
        ctx = model.new_context(64)
        ctx.eval([1, 2], "last")
        assert threading.current_thread().name in DecodeThreads.live()
        caplog.set_level(logging.WARNING, logger="specserve")

        def decode_elsewhere():
            other = model.new_context(64)
            other.eval([3], "last")
            other.eval([4], "last")
            other.close()

        t = threading.Thread(target=decode_elsewhere, name="elsewhere")
        t.start()
        t.join()
        warnings = [r.getMessage() for r in caplog.records if "llama.cpp passes run on" in r.getMessage()]
        assert len(warnings) == 1 and "elsewhere" in warnings[0]  # logged once, naming the threads
        assert "elsewhere" not in DecodeThreads.live()  # a thread that ended holds no OpenMP team
        ctx.close()
    finally:
        model.close()


def test_the_server_runs_every_pass_on_its_engine_thread(tiny_models_dir, tmp_path):
    """A server that loads an auto profile calibrates its draft cost with a few passes of each model:
    on the engine thread too, before any request."""
    env = {"SPECSERVE_AUTO_PROFILE": "1", "SPECSERVE_HOME": str(tmp_path / "home" / "models")}
    body = {"prompt": "hello there", "max_tokens": 24, "ignore_eos": True}
    for run in ("learns", "loads"):
        server = ServerProcess(serve_args(tiny_models_dir), tmp_path / f"{run}.log", env=env)
        try:
            assert httpx.post(server.url + "/v1/completions", json=body, timeout=60).status_code == 200
        finally:
            assert server.stop() == 0  # the profile is saved at exit
        log = server.log()
        assert TWO_THREADS not in log, log[-2000:]
    assert "loaded what it learnt before" in log, log[-2000:]  # the second server started from the profile
