// specserve's chat page (docs/webui.md). Plain JavaScript, no dependencies: it talks to this
// server only (/v1/models, /v1/chat/completions with "speculative": {"trace": true}, /metrics, /health).
"use strict";

const KEY_STORE = "specserve.apiKey";
const METRICS_EVERY_MS = 3000;
const RATE_WINDOW_MS = 30000;
const SOURCES = [  // the drafters the engine names; any other name the server sends is shown as it comes
  ["target", "the target wrote it (not drafted)"],
  ["draft", "draft model, kept by the target"],
  ["ngram", "prompt lookup, kept"],
  ["suffix", "suffix store (earlier text), kept"],
  ["hybrid", "lookup, then the draft model, kept"],
  ["grammar", "forced by the grammar, kept"],
];
const KNOWN = new Set(SOURCES.map(s => s[0]));

const $ = id => document.getElementById(id);
const state = { messages: [], chat: 0, busy: false, abort: null, models: [], keyWaiters: null, seen: new Set(KNOWN) };

// --- the API key: asked once, kept in this tab; a 401 asks again ----------------------------------

function authHeaders(extra) {
  const h = Object.assign({}, extra || {});
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function askKey(message) {
  if (state.keyWaiters) return state.keyWaiters.promise;  // one dialog for every caller waiting
  let resolve;
  const promise = new Promise(r => { resolve = r; });
  state.keyWaiters = { promise, resolve };
  $("key-error").textContent = message || "";
  $("key-input").value = "";
  $("key-dialog").showModal();
  $("key-input").focus();
  return promise;
}

function keySubmitted(ev) {
  ev.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) { $("key-error").textContent = "Enter a key."; return; }
  sessionStorage.setItem(KEY_STORE, key);
  $("key-dialog").close();
  const waiters = state.keyWaiters;
  state.keyWaiters = null;
  if (waiters) waiters.resolve();
}

// fetch with the key; on 401, ask for a key and try again
async function api(path, init) {
  init = init || {};
  for (;;) {
    const sent = sessionStorage.getItem(KEY_STORE);
    const r = await fetch(path, Object.assign({}, init, { headers: authHeaders(init.headers) }));
    if (r.status !== 401) return r;
    // a key given while this request was out is tried before anyone is asked again
    if (sessionStorage.getItem(KEY_STORE) !== sent) continue;
    await askKey(sent ? "The server refused that key." : "");
  }
}

async function errorText(r) {
  try {
    const body = await r.json();
    return (body.error && body.error.message) || JSON.stringify(body);
  } catch (e) {
    return r.status + " " + r.statusText;
  }
}

// --- models and profiles ----------------------------------------------------------------------

async function loadModels() {
  const r = await api("/v1/models");
  if (!r.ok) { $("model-info").textContent = "models: " + await errorText(r); return; }
  const data = (await r.json()).data || [];
  state.models = data;
  const select = $("model");
  select.replaceChildren();
  for (const m of data) {
    const opt = document.createElement("option");
    opt.value = m.id;
    opt.textContent = m.id;
    const spec = m.specserve || {};
    opt.title = JSON.stringify({ speculative: spec.speculative, sampling: spec.sampling, verify: spec.verify });
    select.append(opt);
  }
  showModel();
}

function showModel() {
  const m = state.models.find(x => x.id === $("model").value);
  const s = (m && m.specserve) || {};
  const parts = [];
  if (s.target) parts.push("target " + s.target);
  parts.push(s.draft ? "draft " + s.draft : "no draft model");
  if (s.n_ctx) parts.push("context " + s.n_ctx);
  const mode = s.speculative && s.speculative.mode;
  if (mode) parts.push("spec " + mode);
  $("model-info").textContent = parts.join(" · ");
}

// --- the legend -------------------------------------------------------------------------------

function sourceClass(source) {
  return "tok src-" + (KNOWN.has(source) ? source : "other");
}

function legendItem(source, meaning) {
  const li = document.createElement("li");
  const sample = document.createElement("span");
  sample.className = sourceClass(source);
  sample.textContent = source;
  li.append(sample, document.createTextNode(meaning));
  return li;
}

function drawLegend() {
  const ul = $("legend");
  ul.replaceChildren(...SOURCES.map(([s, m]) => legendItem(s, m)));
}

function noteSource(source) {
  if (state.seen.has(source)) return;
  state.seen.add(source);
  $("legend").append(legendItem(source, "drafter named by the server, kept"));
}

// --- the transcript ---------------------------------------------------------------------------

function addMessage(role, text) {
  $("empty").hidden = true;
  const div = document.createElement("div");
  div.className = "msg " + role;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = role === "user" ? "you" : role;
  const body = document.createElement("div");
  body.className = "body";
  if (text) body.textContent = text;
  const stats = document.createElement("div");
  stats.className = "stats";
  div.append(who, body, stats);
  $("transcript").append(div);
  scrollDown();
  return { div, body, stats };
}

function scrollDown() {
  const t = $("transcript");
  t.scrollTop = t.scrollHeight;
}

function fmt(x, digits) {
  return Number(x).toFixed(digits);
}

function statItems(items) {  // [[label, value], ...] -> "label <b>value</b> · ..."
  const frag = document.createDocumentFragment();
  items.forEach(([label, value], i) => {
    if (i) frag.append(document.createTextNode(" · "));
    if (label) frag.append(document.createTextNode(label + " "));
    const b = document.createElement("b");
    b.textContent = value;
    frag.append(b);
  });
  return frag;
}

// live numbers while the answer streams (counted here); the server's own when it ends
function showLive(view, live) {
  if (!live.traced) {  // chunks are not tokens: the numbers come with the end
    view.stats.replaceChildren(statItems([["", "streaming…"]]));
    return;
  }
  const items = [["", live.tokens + " tokens"]];
  const secs = (performance.now() - live.t0) / 1000;
  if (live.tokens > 1 && secs > 0) items.push(["", fmt(live.tokens / secs, 1) + " tok/s"]);
  if (live.tokens) items.push(["drafted and kept", fmt(100 * live.drafted / live.tokens, 0) + "%"]);
  view.stats.replaceChildren(statItems(items));
}

function showFinal(view, usage, stopped) {
  const s = (usage && usage.speculative) || {};
  const items = [];
  if (usage) items.push(["", usage.completion_tokens + " tokens"]);
  if (s.tokens_per_s !== undefined) items.push(["", fmt(s.tokens_per_s, 1) + " tok/s"]);
  if (s.drafted) items.push(["acceptance", fmt(100 * s.acceptance, 0) + "% (" + s.accepted + "/" + s.drafted + ")"]);
  if (s.mean_accepted_len) items.push(["τ", fmt(s.mean_accepted_len, 2)]);
  const steps = Object.entries(s.drafter_steps || {}).filter(([d]) => d !== "none");
  if (steps.length) items.push(["drafters", steps.map(([d, n]) => d + " ×" + n).join(", ")]);
  else if (s.passes) items.push(["drafters", "none (the target alone)"]);
  if (s.target_alone_tokens_per_s) {
    const speedup = s.tokens_per_s ? " (" + fmt(s.tokens_per_s / s.target_alone_tokens_per_s, 2) + "×)" : "";
    items.push(["target alone ≈", fmt(s.target_alone_tokens_per_s, 1) + " tok/s" + speedup]);
  }
  if (stopped) items.push(["", "stopped"]);
  view.stats.replaceChildren(statItems(items));
}

function appendTrace(view, trace, live) {
  const frag = document.createDocumentFragment();
  for (const piece of trace) {
    const span = document.createElement("span");
    span.className = sourceClass(piece.source);
    span.dataset.source = piece.source;
    span.title = piece.source;
    span.textContent = piece.text;
    frag.append(span);
    noteSource(piece.source);
    live.tokens += 1;
    if (piece.source !== "target") live.drafted += 1;
  }
  view.body.append(frag);
}

// --- a chat turn --------------------------------------------------------------------------------

function setBusy(busy) {
  state.busy = busy;
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...state.messages);
  const body = { model: $("model").value || undefined, messages, stream: true };
  const t = parseFloat($("temperature").value);
  if (!Number.isNaN(t)) body.temperature = t;
  const n = parseInt($("max-tokens").value, 10);
  if (n > 0) body.max_tokens = n;
  if ($("trace").checked) body.speculative = { trace: true };
  return body;
}

async function send(text) {
  const chat = state.chat;  // New chat during the answer starts another conversation: this one's end is dropped
  state.messages.push({ role: "user", content: text });
  addMessage("user", text);
  const view = addMessage("assistant", "");
  const live = { tokens: 0, drafted: 0, t0: performance.now(), traced: $("trace").checked };
  let content = "", usage = null, stopped = false;
  const abort = new AbortController();
  state.abort = abort;
  setBusy(true);
  try {
    const r = await api("/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(requestBody()), signal: abort.signal,
    });
    if (!r.ok) throw new Error(await errorText(r));
    await readEvents(r, event => {
      if (event.error) throw new Error(event.error.message || "error");
      const choice = event.choices && event.choices[0];
      if (event.usage) usage = event.usage;
      if (!choice || !choice.delta || !choice.delta.content) return;
      if (!live.tokens && !content) live.t0 = performance.now();
      content += choice.delta.content;
      if (choice.speculative_trace) appendTrace(view, choice.speculative_trace, live);
      else { view.body.append(document.createTextNode(choice.delta.content)); live.tokens += 1; }
      showLive(view, live);
      scrollDown();
    });
  } catch (e) {
    if (e.name === "AbortError") stopped = true;
    else {
      const err = document.createElement("div");
      err.className = "error";
      err.textContent = e.message;
      view.div.append(err);
    }
  } finally {
    state.abort = null;
    setBusy(false);
  }
  if (chat !== state.chat) return;
  if (content) state.messages.push({ role: "assistant", content });
  else if (!stopped) state.messages.pop();  // an error before any text: the turn did not happen
  showFinal(view, usage, stopped);
  scrollDown();
  refreshServer();
}

// server-sent events from a fetch body: one JSON object per `data:` line, until [DONE]
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

function newChat() {
  if (state.abort) state.abort.abort();
  state.chat += 1;
  state.messages = [];
  $("transcript").replaceChildren($("empty"));
  $("empty").hidden = false;
  $("prompt").focus();
}

// --- the server panel: /health and /metrics every few seconds -------------------------------------

const samples = [];  // [time ms, tokens generated] for the rate over RATE_WINDOW_MS

function parseMetrics(text) {  // Prometheus text -> {name: value summed over its labels}
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const space = line.lastIndexOf(" ");
    const series = line.slice(0, space);
    const brace = series.indexOf("{");
    const name = brace < 0 ? series : series.slice(0, brace);
    out[name] = (out[name] || 0) + parseFloat(line.slice(space + 1));
  }
  return out;
}

function panel(rows) {
  const dl = $("server-panel");
  dl.replaceChildren();
  for (const [label, value] of rows) {
    const dt = document.createElement("dt");
    dt.textContent = label;
    const dd = document.createElement("dd");
    dd.textContent = value;
    dl.append(dt, dd);
  }
}

async function refreshServer() {
  const rows = [];
  const badge = $("health");
  try {
    const h = await (await fetch("/health")).json();
    badge.textContent = h.status;
    badge.className = "health " + (h.status === "ok" ? "ok" : "bad");
    const slots = h.slots_idle + h.slots_processing;
    rows.push(["slots busy", h.slots_processing + " / " + slots], ["queue", h.queue_depth + " / " + h.queue_max]);
    const r = await api("/metrics");
    if (r.ok) {
      const m = parseMetrics(await r.text());
      const P = "specserve:";
      const tokens = m[P + "tokens_predicted_total"] || 0;
      const now = performance.now();
      samples.push([now, tokens]);
      while (samples.length > 2 && now - samples[0][0] > RATE_WINDOW_MS) samples.shift();
      const [t0, n0] = samples[0];
      const drafted = m[P + "spec_decode_num_draft_tokens_total"] || 0;
      const accepted = m[P + "spec_decode_num_accepted_tokens_total"] || 0;
      rows.push(
        ["requests", String(m[P + "requests_total"] || 0)],
        ["errors", String(m[P + "request_errors_total"] || 0)],
        ["tokens", String(tokens)],
        // the counters move when a request finishes: a rate over the last RATE_WINDOW_MS, not per step
        ["tok/s (30 s)", now - t0 >= 1000 ? fmt(1000 * (tokens - n0) / (now - t0), 1) : "–"],
        ["acceptance", drafted ? fmt(100 * accepted / drafted, 1) + "% of " + drafted : "–"],
      );
    }
    $("server-age").textContent = "· " + new Date().toLocaleTimeString();
  } catch (e) {
    badge.textContent = "unreachable";
    badge.className = "health bad";
  }
  panel(rows);
}

async function pollServer() {
  await refreshServer();
  setTimeout(pollServer, METRICS_EVERY_MS);
}

// --- wiring ---------------------------------------------------------------------------------------

function init() {
  drawLegend();
  $("key-form").addEventListener("submit", keySubmitted);
  $("key-dialog").addEventListener("cancel", ev => ev.preventDefault());  // Escape would leave callers waiting
  $("model").addEventListener("change", showModel);
  $("composer").addEventListener("submit", ev => {
    ev.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || state.busy) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", ev => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => { if (state.abort) state.abort.abort(); });
  $("new-chat").addEventListener("click", newChat);
  loadModels();
  pollServer();
}

document.addEventListener("DOMContentLoaded", init);
