"""The chat page at `/`, in a real browser (headless Chromium) against the real server, and
`--no-webui`. The browser tests skip where Chromium is not installed (.ci/run installs it)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from browser_fixtures import Browser, need_chromium  # noqa: E402
from server_fixtures import API_KEY, ServerProcess, serve_args, tiny_models_dir  # noqa: E402,F401

pytestmark = [pytest.mark.server, pytest.mark.browser]

ANSWER_DONE = ("(() => { const s = document.querySelector('.msg.assistant:last-child .stats'); "
               "return !document.getElementById('send').disabled && s && s.textContent.includes('tok/s') })()")


def _server(tiny_models_dir, tmp_path_factory, *extra, api_key=None):
    log = tmp_path_factory.mktemp("webui_log") / "serve.log"
    return ServerProcess(serve_args(tiny_models_dir, "--alias", "tiny", *extra), log, api_key=api_key)


@pytest.fixture(scope="module")
def server(tiny_models_dir, tmp_path_factory):
    srv = _server(tiny_models_dir, tmp_path_factory, "--spec", "draft", "--profile", "lookup=spec=ngram")
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log()


@pytest.fixture(scope="module")
def browser():
    need_chromium()
    b = Browser()
    yield b
    b.close()


def type_and_send(b: Browser, text: str) -> None:
    b.js(f"document.getElementById('prompt').value = {json.dumps(text)}; "
         "document.getElementById('composer').requestSubmit(); true")


def test_the_page_is_served_with_a_strict_policy_and_without_the_key(tiny_models_dir, tmp_path_factory):
    srv = _server(tiny_models_dir, tmp_path_factory, api_key=API_KEY)
    try:
        for path, kind in (("/", "text/html"), ("/webui/app.js", "text/javascript"), ("/webui/style.css", "text/css")):
            r = httpx.get(srv.url + path)  # no key: the files hold no data
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
            assert "script-src 'self'" in r.headers["content-security-policy"]
            assert r.headers["x-content-type-options"] == "nosniff"
        assert httpx.get(srv.url + "/v1/models").status_code == 401  # the API still needs it
        assert httpx.get(srv.url + "/metrics").status_code == 401
        assert httpx.get(srv.url + "/", headers={"Host": "evil.example"}).status_code == 400  # the Host guard holds
    finally:
        assert srv.stop() == 0


def test_no_webui_leaves_the_root_unanswered(tiny_models_dir, tmp_path_factory):
    srv = _server(tiny_models_dir, tmp_path_factory, "--no-webui")
    try:
        for path in ("/", "/webui/app.js", "/webui/style.css"):
            assert httpx.get(srv.url + path).status_code == 404
        assert httpx.get(srv.url + "/health").status_code == 200
    finally:
        assert srv.stop() == 0


def test_the_page_loads_with_no_console_error(server, browser):
    browser.goto(server.url + "/")
    browser.wait("document.querySelectorAll('#model option').length === 2", what="the models from /v1/models")
    assert browser.js("[...document.querySelectorAll('#model option')].map(o => o.value)") == ["tiny", "lookup"]
    browser.wait("document.getElementById('health').textContent === 'ok'", what="/health in the header")
    browser.wait("document.getElementById('server-panel').textContent.includes('acceptance')",
                 what="the server panel from /metrics")
    assert browser.js("document.getElementById('legend').children.length") >= 6
    assert browser.errors() == []


def test_a_message_streams_an_answer_with_drafted_tokens_coloured(server, browser):
    browser.goto(server.url + "/")
    browser.wait("document.querySelectorAll('#model option').length")
    # count the pieces appended to the answer: streamed, it grows chunk by chunk
    browser.js("window.appends = 0; new MutationObserver(rs => { window.appends += rs.filter(r => "
               "r.target.classList && r.target.classList.contains('body')).length })"
               ".observe(document.getElementById('transcript'), {childList: true, subtree: true}); true")
    type_and_send(browser, "the cat sat on the mat")
    browser.wait(ANSWER_DONE, timeout=60, what="the answer and its numbers")
    assert browser.js("window.appends") > 3
    spans = browser.js("[...document.querySelectorAll('.msg.assistant .body span')]"
                       ".map(s => [s.dataset.source, getComputedStyle(s).backgroundColor])")
    drafted = [colour for source, colour in spans if source == "draft"]
    assert drafted and all(c not in ("rgba(0, 0, 0, 0)", "transparent") for c in drafted)  # coloured
    assert {s for s, _ in spans} <= {"draft", "target"}
    stats = browser.js("document.querySelector('.msg.assistant .stats').textContent")
    assert "acceptance" in stats and "τ" in stats and "draft ×" in stats
    # the answer is in the conversation: a second turn sends it back
    type_and_send(browser, "and then?")
    browser.wait("document.querySelectorAll('.msg.assistant').length === 2")
    browser.wait(ANSWER_DONE, timeout=60)
    # Stop ends a long answer at once; the text so far stays
    browser.js("document.getElementById('max-tokens').value = 2000; window.appends = 0; true")
    type_and_send(browser, "go on for a long time")
    browser.wait("window.appends > 2", what="the long answer streaming")
    browser.js("document.getElementById('stop').click(); true")
    browser.wait("!document.getElementById('send').disabled && document.querySelector("
                 "'.msg.assistant:last-child .stats').textContent.includes('stopped')", what="the stopped answer")
    assert browser.js("document.querySelector('.msg.assistant:last-child .body').textContent.length") > 0
    browser.js("document.getElementById('new-chat').click(); true")
    assert browser.js("document.querySelectorAll('.msg').length") == 0
    assert browser.errors() == []


def test_the_key_is_asked_once_and_a_refused_key_asked_again(tiny_models_dir, tmp_path_factory, browser):
    srv = _server(tiny_models_dir, tmp_path_factory, "--spec", "draft", api_key=API_KEY)
    try:
        browser.goto(srv.url + "/")
        browser.wait("document.getElementById('key-dialog').open", what="the key prompt")
        # /metrics answers late: its refusal of the wrong key comes after the right key is given,
        # and must not ask for a key again
        browser.js("const f = window.fetch; window.fetch = async (u, i) => { const r = await f(u, i); "
                   "if (String(u).includes('/metrics')) await new Promise(ok => setTimeout(ok, 1500)); "
                   "return r; }; true")
        browser.js("document.getElementById('key-input').value = 'wrong'; "
                   "document.getElementById('key-form').requestSubmit(); true")
        browser.wait("document.getElementById('key-dialog').open && "
                     "document.getElementById('key-error').textContent.includes('refused')", what="asked again")
        browser.js(f"document.getElementById('key-input').value = {json.dumps(API_KEY)}; "
                   "document.getElementById('key-form').requestSubmit(); true")
        browser.wait("!document.getElementById('key-dialog').open && "
                     "document.querySelectorAll('#model option').length", what="the models, with the key")
        browser.wait("document.getElementById('server-panel').textContent.includes('acceptance')",
                     what="the server's numbers, with the key")
        assert not browser.js("document.getElementById('key-dialog').open")
        assert browser.js("sessionStorage.getItem('specserve.apiKey')") == API_KEY
        type_and_send(browser, "hello world")
        browser.wait(ANSWER_DONE, timeout=60)
        assert browser.js("document.querySelectorAll('.msg.assistant .body span[data-source=draft]').length") > 0
        browser.goto(srv.url + "/")  # the same tab: not asked again
        browser.wait("document.getElementById('server-panel').textContent.includes('acceptance')")
        assert not browser.js("document.getElementById('key-dialog').open")
    finally:
        assert srv.stop() == 0
