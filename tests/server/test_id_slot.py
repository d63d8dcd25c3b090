"""llama-server's `id_slot` on a real `specserve serve --parallel 2`: a request runs on the slot it
names (the answer says which); the pool makes it wait for that slot while it is busy, even when
another is free, and hands a released slot to the longest waiter that can take it."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from specserve.engine import Engine
from specserve.server.core.scheduler import SlotPool

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, serve_args, tiny_models_dir  # noqa: E402,F401


def test_id_slot_runs_on_that_slot(tiny_models_dir, tmp_path):
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "512", "--parallel", "2", "--spec", "none"),
                        tmp_path / "serve.log")
    try:
        with srv.client() as c:
            for want in (1, 0, 1):
                r = c.post("/completion", json={"prompt": "the cat", "n_predict": 4, "id_slot": want})
                assert r.status_code == 200 and r.json()["id_slot"] == want, r.text
            r = c.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "n_predict": 2, "id_slot": 1})
            assert r.status_code in (200, 400), r.text  # the tiny model may lack FIM tokens: the slot check came first

    finally:
        assert srv.stop() == 0


def test_a_waiter_for_one_slot_gets_that_slot_and_others_are_not_held_up(tiny_models):
    engine = Engine(tiny_models["target"], None, n_ctx=64)
    slots = engine.new_slots(2)

    async def run() -> None:
        pool = SlotPool(slots, max_waiting=4)
        first = await pool.acquire([1, 2], id_slot=1)
        assert first is slots[1] and pool.available() and not pool.available(1)
        wants1 = asyncio.ensure_future(pool.acquire([1, 2], id_slot=1))
        await asyncio.sleep(0)
        assert await pool.acquire([1, 2]) is slots[0]  # any slot: slot 0 is free, the waiter does not want it
        later = asyncio.ensure_future(pool.acquire([1, 2]))
        await asyncio.sleep(0)
        pool.release(slots[0])  # the longest waiter wants slot 1: slot 0 goes to the next one
        assert await later is slots[0] and not wants1.done()
        pool.release(slots[1])
        assert await wants1 is slots[1] and pool.waiting == 0

    asyncio.run(run())
