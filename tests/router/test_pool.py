"""The router's pool (fast tier): loads, least-recently-used unloads, places, the memory budget, failures,
with children that are stand-ins (no process): what the pool decides, not how a process starts."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from specserve.router import pool as pool_mod
from specserve.router.child import ChildFailed
from specserve.router.pool import Model, Pool
from specserve.server.http.errors import ApiError
from specserve.stores import Found


class FakeChild:
    """A child whose start takes `delay` seconds and fails with the next of `FakeChild.failures`, if any."""
    started: list[str] = []
    failures: list[str] = []

    def __init__(self, name, args, key):
        self.name, self.args, self.key, self.port = name, args, key, 1
        self.stopping = False
        self.alive = False
        self._exit = asyncio.Event()
        self.started_at = 0.0

    async def start(self, timeout):
        await asyncio.sleep(0.01)
        if FakeChild.failures:
            raise ChildFailed(FakeChild.failures.pop(0), 1)
        FakeChild.started.append(self.name)
        self.alive = True

    async def wait(self):
        await self._exit.wait()
        return 0

    async def stop(self, timeout=0):
        self.stopping, self.alive = True, False
        self._exit.set()

    def kill_now(self):
        self.alive = False

    def reason(self):
        return "exit status 1: boom"

    async def props(self):
        return {"draft_choice": {"mode": "auto", "chosen": f"{self.name}-draft", "reason": "the cheapest"}}


@pytest.fixture(autouse=True)
def fake_children(monkeypatch):
    FakeChild.started, FakeChild.failures = [], []
    monkeypatch.setattr(pool_mod, "Child", FakeChild)


def models(*names, error=None):
    return [Model(Found(n, Path(f"/m/{n}.gguf"), "models-dir", 1, error if n == "broken" else None), ["-m", n])
            for n in names]


def run(coro):
    return asyncio.run(coro)


def test_one_load_for_a_storm_of_requests():
    async def go():
        pool = Pool(models("a"), "k")
        children = await asyncio.gather(*(pool.ensure(pool.models["a"]) for _ in range(20)))
        assert len({id(c) for c in children}) == 1
        assert pool.models["a"].draft_choice["chosen"] == "a-draft"  # as its /props says
        await pool.close()
    run(go())
    assert FakeChild.started == ["a"]


def test_least_recently_used_idle_model_unloads_first():
    async def go():
        pool = Pool(models("a", "b", "c"), "k", max_loaded=2)
        a, b, c = (pool.models[n] for n in "abc")
        await pool.ensure(a)
        await pool.ensure(b)
        await pool.ensure(a)  # b is now the least recently used
        await pool.ensure(c)
        assert [m.state for m in (a, b, c)] == ["loaded", "unloaded", "loaded"]
        a.in_flight = 1  # answering: not unloaded, though least recently used
        await pool.ensure(b)
        assert [m.state for m in (a, b, c)] == ["loaded", "loaded", "unloaded"]
        await pool.close()
    run(go())


def test_no_place_waits_then_429():
    async def go():
        pool = Pool(models("a", "b"), "k", max_loaded=1, place_wait=0.2)
        a, b = pool.models["a"], pool.models["b"]
        await pool.ensure(a)
        a.in_flight = 1
        with pytest.raises(ApiError) as e:
            await pool.ensure(b)
        assert e.value.status == 429 and e.value.headers["Retry-After"]

        async def finish_soon():  # the request on `a` ends: `b` takes its place
            await asyncio.sleep(0.05)
            a.in_flight = 0
            pool.changed()
        pool.place_wait = 5
        await asyncio.gather(finish_soon(), pool.ensure(b))
        assert (a.state, b.state) == ("unloaded", "loaded")
        await pool.close()
    run(go())


def test_failed_load_is_sticky_until_an_explicit_load():
    async def go():
        pool = Pool(models("a"), "k")
        a = pool.models["a"]
        FakeChild.failures = ["exit status 1: error: cannot load model"]
        for _ in range(2):  # the second is refused without a new try
            with pytest.raises(ApiError) as e:
                await pool.ensure(a)
            assert e.value.status == 422 and "cannot load model" in e.value.message
        assert a.status()["failed"] and a.status()["exit_code"] == 1
        await pool.ensure(a, retry=True)  # POST /models/load
        assert a.state == "loaded" and "failed" not in a.status()
        await pool.close()
    run(go())
    assert FakeChild.started == ["a"]


def test_port_taken_tries_another():
    async def go():
        pool = Pool(models("a"), "k")
        FakeChild.failures = ["exit status 1: ERROR: [Errno 98] address already in use"]
        await pool.ensure(pool.models["a"])
        await pool.close()
    run(go())
    assert FakeChild.started == ["a"]


def test_broken_model_never_started():
    async def go():
        pool = Pool(models("broken", error="blob missing"), "k")
        with pytest.raises(ApiError) as e:
            await pool.ensure(pool.models["broken"])
        assert e.value.status == 422 and "blob missing" in e.value.message
    run(go())
    assert FakeChild.started == []


def test_autoload_off():
    async def go():
        pool = Pool(models("a"), "k", autoload=False)
        with pytest.raises(ApiError) as e:
            await pool.ensure(pool.models["a"])
        assert e.value.status == 400 and "/models/load" in e.value.message
        await pool.ensure(pool.models["a"], autoload=True)
        await pool.close()
    run(go())


def test_budget_unloads_until_it_fits_and_refuses_what_never_would():
    sizes = {"a": 60, "b": 50, "c": 30, "huge": 200}

    async def go():
        pool = Pool(models(*sizes), "k", budget=100, estimate=lambda m: (sizes[m.name], f"{sizes[m.name]} B"))
        a, b, c, huge = (pool.models[n] for n in sizes)
        await pool.ensure(a)
        await pool.ensure(c)  # 90: both fit
        await pool.ensure(b)  # 140: a, the least recently used, goes
        assert [m.state for m in (a, b, c)] == ["unloaded", "loaded", "loaded"]
        with pytest.raises(ApiError) as e:
            await pool.ensure(huge)
        assert e.value.status == 422 and "200 B" in e.value.message and "100 B" in e.value.message
        assert [m.state for m in (b, c)] == ["loaded", "loaded"]  # refused before anything was unloaded
        await pool.close()
    run(go())


def test_crash_shows_failed_and_the_next_request_reloads():
    async def go():
        pool = Pool(models("a"), "k")
        a = pool.models["a"]
        child = await pool.ensure(a)
        child.alive = False
        child._exit.set()  # exits without being asked
        for _ in range(5):
            await asyncio.sleep(0)
        assert a.state == "unloaded" and "crashed" in a.status()["reason"]
        assert await pool.ensure(a) is not child
        await pool.close()
    run(go())
    assert FakeChild.started == ["a", "a"]


def test_refresh_keeps_the_same_replaces_the_changed_and_drops_the_gone():
    async def go():
        pool = Pool(models("a", "b", "c"), "k")
        a, b, c = (pool.models[n] for n in "abc")
        for m in (a, b, c):
            await pool.ensure(m)
        changed_b = Model(Found("b", Path("/m/b2.gguf"), "models-dir", 1), ["-m", "b2"])
        a_now = Model(a.found, [*a.args, "--draft-candidates", "d=/m/d.gguf"])  # a new model to draft from
        await pool.refresh([a_now, changed_b, *models("d")])
        assert pool.models["a"] is a and a.state == "loaded"  # the same: its child kept
        assert a.args[-1] == "d=/m/d.gguf"  # its next start sees the new candidate
        assert pool.models["b"] is changed_b and b.state == "unloaded"  # its old child stopped
        assert "c" not in pool.models and c.state == "unloaded"
        assert pool.models["d"].state == "unloaded"
        await pool.close()
    run(go())


def test_alternating_storm_with_one_place_every_request_gets_a_live_child():
    async def go():
        pool = Pool(models("a", "b"), "k", max_loaded=1, place_wait=10)

        async def request(m: Model) -> None:
            child = await asyncio.ensure_future(pool.ensure(m, hold=True))  # in a task of its own, as app.py's
            await asyncio.sleep(0)  # others run between its load and its use: held, it stays loaded
            assert child.alive and m.child is child
            await asyncio.sleep(0.005)
            pool.release(m)
        await asyncio.gather(*(request(pool.models["ab"[i % 2]]) for i in range(20)))
        assert sum(m.state == "loaded" for m in pool.models.values()) == 1
        await pool.close()
    run(go())
    assert 2 <= len(FakeChild.started) <= 20


def test_unloaded_as_soon_as_loaded_the_waiting_request_loads_it_again():
    async def go():
        pool = Pool(models("a"), "k")
        a = pool.models["a"]

        async def unload_once_loaded() -> None:  # POST /models/unload, arriving as the load ends
            while a.state != "loaded":
                await asyncio.sleep(0)
            await pool.unload(a)
        child, _ = await asyncio.gather(pool.ensure(a), unload_once_loaded())
        assert child.alive and a.child is child
        await pool.close()
    run(go())
    assert FakeChild.started == ["a", "a"]


def test_a_load_nobody_waits_for_any_more_takes_no_place():
    async def go():
        pool = Pool(models("a", "b"), "k", max_loaded=1, place_wait=10)
        a, b = pool.models["a"], pool.models["b"]
        await pool.ensure(a)
        a.in_flight = 1  # a request on `a`: `b` must wait for a place
        waiter = asyncio.ensure_future(pool.ensure(b))
        await asyncio.sleep(0.05)
        waiter.cancel()  # its client went away (app.py cancels the request's ensure)
        with pytest.raises(asyncio.CancelledError):
            await waiter
        a.in_flight = 0
        pool.changed()
        await asyncio.sleep(0.05)
        assert (a.state, b.state) == ("loaded", "unloaded") and b.loading is None
        await pool.close()
    run(go())
    assert FakeChild.started == ["a"]
