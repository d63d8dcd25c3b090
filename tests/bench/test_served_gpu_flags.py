"""The bench's own servers load the models as the in-process path does: -ngl/-ngld reach them."""
from __future__ import annotations

from specserve.bench import served


def test_the_bench_servers_get_the_gpu_layers(monkeypatch):
    started = []

    class NoServer:
        def __init__(self, args, env=None, log_path=None):
            started.append(args)

        def close(self):
            pass

    monkeypatch.setattr(served, "SpawnedServer", NoServer)
    served.ServedModels("t.gguf", {"d": "d.gguf", "e": "e.gguf"}, 512, 1, 1, auto_profile=False,
                        n_gpu_layers=(99, 20))
    assert [a[a.index("-ngl") + 1] for a in started] == ["99", "99"]
    assert [a[a.index("-ngld") + 1] for a in started] == ["20", "20"]
    started.clear()
    served.ServedModels("t.gguf", {}, 512, 1, 1, auto_profile=False)  # the target alone, on the CPU
    assert "-ngl" not in started[0] and "-ngld" not in started[0]


def test_the_bench_servers_start_from_the_profile_home_and_it_goes_with_them(monkeypatch):
    """--auto-profile-from: every server of the bench's gets the home's environment; closing them removes it."""
    envs = []

    class NoServer:
        def __init__(self, args, env=None, log_path=None):
            envs.append(env)

        def stop(self):
            envs.append("stopped")

    class Home:
        env = {"SPECSERVE_HOME": "/somewhere/models"}
        closed_after = None

        def close(self):
            self.closed_after = list(envs)

    monkeypatch.setattr(served, "SpawnedServer", NoServer)
    home = Home()
    models = served.ServedModels("t.gguf", {"d": "d.gguf", "e": "e.gguf"}, 512, 1, 1, auto_profile=True, home=home)
    assert envs == [home.env, home.env]
    models.close()
    assert home.closed_after == [home.env, home.env, "stopped", "stopped"]  # after the servers saved into it
