"""Hand-run: Open WebUI (the `open-webui` package, unmodified) chatting through specserve's router, on its Ollama
connection and its OpenAI connection, with a screenshot of each answer and of the model list (docs/openwebui*.png).

    OLLAMA_MODELS=STORE specserve serve --models-from ollama --port 8393 -c 16384 &
    DATA_DIR=/tmp/owui WEBUI_AUTH=False OLLAMA_BASE_URL=http://127.0.0.1:8393 \\
      OPENAI_API_BASE_URLS=http://127.0.0.1:8393/v1 OPENAI_API_KEYS=none \\
      OPENAI_API_CONFIGS='{"0": {"prefix_id": "oai"}}' \\
      OFFLINE_MODE=true HF_HUB_OFFLINE=1 open-webui serve --port 8089 &
    python3 tests/server/openwebui_run.py http://127.0.0.1:8089 qwen2.5-coder:0.5b docs/

Open WebUI signs the page in by itself without WEBUI_AUTH; the script marks its release notes as read, picks the
model in the URL, types a prompt into the chat box and sends it, waits for the answer, and saves the page. Open WebUI
does not fit in CI (7 GB installed, a minute to start): this is the kept run, not a test. Needs Chromium
(tests/browser_fixtures.py). Beside each chat Open WebUI sends requests of its own of up to 8.6k tokens (its tasks), so
the model needs a context of 16k: SmolLM2 (8k trained) answers noise there, hence a Qwen2.5-Coder model.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent.parent))
from browser_fixtures import Browser  # noqa: E402

PROMPT = "Write a Python function that returns the square of a number."


def read_release_notes(url: str) -> None:
    token = httpx.post(f"{url}/api/v1/auths/signin", json={"email": "", "password": ""}).json()["token"]
    version = httpx.get(f"{url}/api/version").json()["version"]
    # "default" function calling: Open WebUI's native mode sends its built-in tools with every chat (about 8.5k
    # tokens of tool definitions, past a small model's context: specserve answers 400 with the counts then)
    httpx.post(f"{url}/api/v1/users/user/settings/update",
               json={"ui": {"version": version, "params": {"function_calling": "default", "max_tokens": 96}}},
               headers={"Authorization": f"Bearer {token}"}).raise_for_status()


def models(url: str) -> list[str]:
    token = httpx.post(f"{url}/api/v1/auths/signin", json={"email": "", "password": ""}).json()["token"]
    data = httpx.get(f"{url}/api/models", headers={"Authorization": f"Bearer {token}"}).json()["data"]
    return [f"{m['id']} ({m.get('owned_by')})" for m in data]


def chat(b: Browser, url: str, model: str, shot: Path) -> str:
    b.goto(f"{url}/?models={model}")
    b.wait("!!document.querySelector('#chat-input')", 60, "the chat box")
    b.js("document.querySelector('#chat-input').focus()")
    b.call("Input.insertText", text=PROMPT)
    b.wait("document.querySelector('#send-message-button') && !document.querySelector('#send-message-button').disabled",
           30, "the send button")
    b.js("document.querySelector('#send-message-button').click()")
    # the answer is done when its text has stood still for 4 s
    last, since = "", time.monotonic()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        text = b.js("(() => { const m = [...document.querySelectorAll('#response-content-container')];"
                    " return m.length ? m[m.length - 1].innerText : '' })()") or ""
        if text != last:
            last, since = text, time.monotonic()
        elif text and time.monotonic() - since > 4:
            break
        time.sleep(0.5)
    text = last
    time.sleep(1)
    b.screenshot(shot)
    return text


def main() -> int:
    url, model, out = sys.argv[1].rstrip("/"), sys.argv[2], Path(sys.argv[3])
    read_release_notes(url)
    print("models Open WebUI lists:", json.dumps(models(url)))
    b = Browser()
    try:
        b.call("Emulation.setDeviceMetricsOverride", width=1280, height=860, deviceScaleFactor=1, mobile=False)
        for name, m in (("ollama", model), ("openai", f"oai.{model}")):
            text = chat(b, url, m, out / f"openwebui-{name}.png")
            print(f"{name} connection, {m}: {text[:300]!r}")
        b.goto(f"{url}/?models={model}")
        b.wait("!!document.querySelector('#chat-input')", 60, "the chat box")
        b.js("[...document.querySelectorAll('button')].find(x => x.innerText.includes(%s)).click()" % json.dumps(model))
        time.sleep(1.5)
        b.screenshot(out / "openwebui-models.png")
    finally:
        b.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
