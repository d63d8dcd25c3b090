"""Hand-run: a screenshot of the chat page during a code-edit answer (docs/webui.png).

    specserve serve --pair qwen --port 8080 &
    python3 tests/server/webui_screenshot.py http://127.0.0.1:8080 docs/webui.png [API_KEY]

Two turns: a code edit of the packaged workload (add type hints to a module) answered in full,
its numbers under it, and a follow-up edit caught while it streams. Needs Chromium (tests/browser_fixtures.py).
"""
from __future__ import annotations

import json
import sys
import time
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from browser_fixtures import Browser  # noqa: E402

PROMPT = 2  # the code_edit.jsonl line: add type hints to a small module
FOLLOW_UP = "Now also add a one-line docstring to each function. Return the complete code."
DONE = ("!document.getElementById('send').disabled && "
        "document.querySelector('.msg.assistant:last-child .stats').textContent.includes('tok/s')")


def main(url: str, out: str, key: str | None = None, mid_tokens: int = 30) -> None:
    lines = (resources.files("specserve") / "data" / "code_edit.jsonl").read_text().splitlines()
    first = json.loads(lines[PROMPT])
    b = Browser()
    try:
        b.call("Emulation.setDeviceMetricsOverride", width=1280, height=860, deviceScaleFactor=1, mobile=False)
        b.goto(url.rstrip("/") + "/")
        if key:
            b.js(f"sessionStorage.setItem('specserve.apiKey', {json.dumps(key)}); location.reload(); true")
            time.sleep(1)
        b.wait("document.querySelectorAll('#model option').length")
        b.js("document.getElementById('max-tokens').value = 400; true")
        for i, text in enumerate((first["messages"][0]["content"], FOLLOW_UP)):
            b.js(f"document.getElementById('prompt').value = {json.dumps(text)}; "
                 "document.getElementById('composer').requestSubmit(); true")
            b.wait(f"document.querySelectorAll('.msg.assistant').length === {i + 1}")
            if i == 0:
                b.wait(DONE, timeout=600)
                time.sleep(3.5)  # the server panel's next refresh counts it
            else:  # caught mid-answer
                b.wait(f"document.querySelectorAll('.msg.assistant:last-child .body span').length >= {mid_tokens} "
                       f"|| ({DONE})", timeout=600)
                b.screenshot(Path(out))
        print("console errors:", b.errors())
    finally:
        b.close()


if __name__ == "__main__":
    main(*sys.argv[1:3], *(sys.argv[3:4] or [None]))
