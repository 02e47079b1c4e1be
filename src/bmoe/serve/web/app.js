// bmoe's page: a chat through /v1/chat/completions (streamed), a decision form for
// /v1/decide, and the engine panel fed by /v1/bmoe/metrics (server-sent events).
// Plain JavaScript, no build step, nothing fetched from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { model: null, messages: [], controller: null };

// -- small helpers ---------------------------------------------------------------------

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function num(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

function fmt(x, digits, unit) {
  return x === null || x === undefined ? "–" : x.toFixed(digits) + (unit || "");
}

function mib(bytes) {
  return (bytes / 1048576).toFixed(1);
}

function scrollDown() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

// Read server-sent events from a fetch response: calls onData(text) per event.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n/)) >= 0) {
      const line = buffer.slice(0, cut);
      buffer = buffer.slice(buffer[cut] === "\r" ? cut + 2 : cut + 1);
      if (line === "") {
        if (data.length) onData(data.join("\n"));
        data = [];
      } else if (line.startsWith("data:")) {
        data.push(line.slice(line[5] === " " ? 6 : 5));
      }
    }
  }
  if (data.length) onData(data.join("\n"));
}

// A server started with --api-key wants a key with every request: asked once (on the first
// 401), kept in this tab only (sessionStorage), sent as Authorization: Bearer.
const KEY_ITEM = "bmoe-api-key";
let asking = null;

function withKey(headers = {}) {
  const key = sessionStorage.getItem(KEY_ITEM);
  return key ? { ...headers, Authorization: `Bearer ${key}` } : headers;
}

function askKey() {
  if (!asking) {
    asking = new Promise((resolve) => {
      const key = window.prompt("This server needs an API key (its --api-key):");
      if (key && key.trim()) sessionStorage.setItem(KEY_ITEM, key.trim());
      resolve();
    }).finally(() => setTimeout(() => { asking = null; }, 0));
  }
  return asking;
}

async function api(url, options = {}) {
  let response = await fetch(url, { ...options, headers: withKey(options.headers) });
  if (response.status === 401) {
    await askKey();
    response = await fetch(url, { ...options, headers: withKey(options.headers) });
  }
  return response;
}

async function errorText(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || response.statusText;
  } catch (_) {
    return response.status + " " + response.statusText;
  }
}

// -- chat ------------------------------------------------------------------------------

function addMessage(role, text) {
  const node = el("div", "msg " + role);
  const content = el("div", "content", text);
  node.appendChild(content);
  $("messages").appendChild(node);
  scrollDown();
  return node;
}

function assistantBubble() {
  const node = addMessage("assistant", "");
  const fold = el("details", "reasoning");
  fold.open = true;
  fold.hidden = true;
  fold.appendChild(el("summary", null, "Reasoning"));
  const thought = el("div", "reasoning-text");
  fold.appendChild(thought);
  node.insertBefore(fold, node.firstChild);
  const meta = el("div", "meta");
  node.appendChild(meta);
  return { node, fold, thought, content: node.querySelector(".content"), meta };
}

function request(history) {
  const body = { messages: history, stream: true };
  if (state.model) body.model = state.model;
  for (const key of ["temperature", "top_p", "max_tokens", "seed"]) {
    const v = num(key);
    if (v !== undefined && !Number.isNaN(v)) body[key] = v;
  }
  return body;
}

function busy(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
}

// images attached to the next message, as data: URIs (chat completions' image_url parts)
function readImage(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function takeAttached() {
  const input = $("attach");
  const files = [...input.files];
  input.value = "";
  $("attached").textContent = "";
  return Promise.all(files.map(readImage));
}

$("attach").addEventListener("change", () => {
  const n = $("attach").files.length;
  $("attached").textContent = n ? `${n} image${n > 1 ? "s" : ""}` : "";
});

async function send(text) {
  const system = $("system").value.trim();
  const history = [...(system ? [{ role: "system", content: system }] : []), ...state.messages];
  const images = await takeAttached();
  // the images first, then the text (as llama.cpp's own page puts them)
  const content = images.length
    ? [...images.map((url) => ({ type: "image_url", image_url: { url } })), { type: "text", text }]
    : text;
  history.push({ role: "user", content });
  const shown = addMessage("user", text);
  for (const url of images) {
    const img = el("img", "thumb");
    img.src = url;
    shown.insertBefore(img, shown.firstChild);
  }
  const bubble = assistantBubble();
  const controller = new AbortController();
  state.controller = controller;
  busy(true);
  let answer = "";
  let reasoning = "";
  let finish = null;
  const started = performance.now();
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(request(history)),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    await readEvents(response, (data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      for (const choice of chunk.choices || []) {
        const d = choice.delta || {};
        if (d.reasoning_content) {
          reasoning += d.reasoning_content;
          bubble.fold.hidden = false;
          bubble.thought.textContent = reasoning;
        }
        if (d.content) {
          if (!answer && reasoning) bubble.fold.open = false; // the answer begins: fold the thinking
          answer += d.content;
          bubble.content.textContent = answer;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      scrollDown();
    });
    state.messages.push({ role: "user", content }, { role: "assistant", content: answer });
    const secs = ((performance.now() - started) / 1000).toFixed(1);
    bubble.meta.textContent = `${finish || "done"} · ${secs} s`;
    bubble.node.dataset.state = "done";
  } catch (err) {
    if (controller.signal.aborted) {
      // what was shown stays in the conversation
      state.messages.push({ role: "user", content }, { role: "assistant", content: answer });
      bubble.meta.textContent = "stopped";
      bubble.meta.classList.add("stopped");
      bubble.node.dataset.state = "stopped";
    } else {
      bubble.meta.textContent = "error: " + err.message;
      bubble.meta.classList.add("error");
      bubble.node.dataset.state = "error";
    }
  } finally {
    state.controller = null;
    busy(false);
  }
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || state.controller) return;
  $("prompt").value = "";
  send(text);
});

$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});

$("stop").addEventListener("click", () => {
  if (state.controller) state.controller.abort(); // the server cancels on disconnect
});

$("clear").addEventListener("click", () => {
  if (state.controller) state.controller.abort();
  state.messages = [];
  $("messages").replaceChildren();
});

// -- decisions -------------------------------------------------------------------------

$("decide").addEventListener("submit", async (event) => {
  event.preventDefault();
  const out = $("d-result");
  const choices = $("d-choices").value.split("\n").map((s) => s.trim()).filter((s) => s);
  const body = { prefix: $("d-prefix").value, suffix: $("d-suffix").value, choices };
  if (state.model) body.model = state.model;
  out.replaceChildren(el("div", "muted", "deciding…"));
  $("d-go").disabled = true;
  try {
    const response = await api("/v1/decide", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    if (!response.ok) throw new Error(await errorText(response));
    const result = await response.json();
    out.replaceChildren();
    result.choices.forEach((name, i) => {
      const p = result.choice_p_renorm[i];
      const row = el("div", "option" + (i === result.best ? " best" : ""));
      row.appendChild(el("span", "name", name));
      const bar = el("span", "bar");
      const fill = el("i");
      fill.style.width = (100 * p).toFixed(1) + "%";
      bar.appendChild(fill);
      row.appendChild(bar);
      row.appendChild(el("span", "p", (100 * p).toFixed(1) + "%"));
      row.title = "log p = " + (result.choice_logp[i] === null ? "-inf" : result.choice_logp[i].toFixed(3));
      out.appendChild(row);
    });
    out.appendChild(el("div", "muted", `${result.n_tokens} tokens, prefill ${result.prefill_s.toFixed(3)} s`));
  } catch (err) {
    out.replaceChildren(el("div", "error", err.message));
  } finally {
    $("d-go").disabled = false;
  }
});

// -- the engine panel ------------------------------------------------------------------

const COLD = [229, 231, 235]; // not in the cache
const CACHED = [96, 165, 250]; // in the cache
const HOT = [220, 38, 38]; // routed recently

function cellColour(code, top) {
  const resident = code & 1;
  const heat = (code >> 1) / top;
  const base = resident ? CACHED : COLD;
  const mix = (a, b) => Math.round(a + (b - a) * heat * 0.9);
  return `rgb(${mix(base[0], HOT[0])},${mix(base[1], HOT[1])},${mix(base[2], HOT[2])})`;
}

function drawGrid(cache) {
  const canvas = $("grid");
  const rows = cache.cells;
  const n = cache.n_expert;
  const width = canvas.clientWidth || 400;
  const cell = Math.max(1, Math.min(18, Math.floor(width / n)));
  const gap = cell >= 6 ? 1 : 0;
  canvas.width = n * cell;
  canvas.height = Math.max(1, rows.length * cell);
  canvas.style.height = canvas.height * (width / canvas.width) + "px";
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  rows.forEach((row, y) => {
    for (let x = 0; x < row.length; x++) {
      ctx.fillStyle = cellColour(parseInt(row[x], 16), cache.heat_top);
      ctx.fillRect(x * cell, y * cell, cell - gap, cell - gap);
    }
  });
  canvas.dataset.cells = rows.join(" ");
  canvas.title = `${cache.layers.length} streamed layers × ${n} experts (${cache.resident_experts} cached)`;
}

function showMetrics(m) {
  document.body.dataset.metrics = String(Number(document.body.dataset.metrics || 0) + 1); // events drawn
  const badge = $("state");
  badge.textContent = m.state;
  badge.className = "badge " + m.state;
  $("m-requests").textContent = m.requests;
  const s = m.slots;
  $("m-slots").textContent = s ? `${s.busy} / ${s.total} busy` + (s.waiting ? `, ${s.waiting} waiting` : "") : "–";
  const r = m.request;
  $("m-toks").textContent = r ? fmt(r.tok_s, 1) : "–";
  $("m-tokens").textContent = r ? (r.max_tokens ? `${r.tokens} / ${r.max_tokens}` : String(r.tokens)) : "–";
  const hit = r && r.hit_pct !== null ? r.hit_pct : m.cache ? m.cache.hit_pct : null;
  $("m-hit").textContent = m.streaming ? fmt(hit, 1, " %") : "no cache";
  $("m-read").textContent = r ? fmt(r.read_mib_per_token, 2, " MiB") : "–";
  $("m-stall").textContent = r ? fmt(r.stall_ms_per_token, 2, " ms") : "–";
  const d = r ? r.drafts : null;
  $("m-drafts").textContent = d ? `${fmt(d.tokens_per_verify, 2)} (${d.accepted} / ${d.drafted} accepted)` : "–";
  const prefill = $("m-prefill");
  if (r && r.prefill_total) {
    prefill.max = r.prefill_total;
    prefill.value = r.prefill_done;
    const secs = r.prefill_s === null ? "" : `, ${r.prefill_s.toFixed(2)} s`;
    $("m-prefill-text").textContent = `${r.prefill_done} / ${r.prefill_total} tokens${secs}`;
  } else {
    prefill.value = 0;
    $("m-prefill-text").textContent = "–";
  }
  $("resident-note").hidden = m.streaming;
  $("grid-box").hidden = !m.cache;
  if (m.cache) {
    const c = m.cache;
    $("m-cache").max = Math.max(1, c.budget_bytes);
    $("m-cache").value = c.resident_bytes;
    $("m-cache-text").textContent = `${mib(c.resident_bytes)} / ${mib(c.budget_bytes)} MiB${c.stale ? " (stale)" : ""}`;
    drawGrid(c);
  } else {
    $("m-cache-text").textContent = m.streaming ? "–" : "resident";
  }
}

async function watchMetrics() {
  // read with fetch, not EventSource, which cannot send the key; after an error (a server
  // restart) it connects again, as EventSource would
  for (;;) {
    try {
      const response = await api("/v1/bmoe/metrics");
      if (response.ok) await readEvents(response, (data) => showMetrics(JSON.parse(data)));
    } catch (err) {
      // the server went away: try again below
    }
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

async function loadModel() {
  try {
    const response = await api("/v1/models");
    const list = await response.json();
    const card = list.data[0];
    state.model = card.id;
    const meta = card.meta || {};
    const how = meta.moe_stream ? "experts streamed" : "resident";
    $("model").textContent = `${card.id} · ${meta.arch} · ${meta.n_expert} experts, ${meta.n_expert_used} per token · ${how}`;
  } catch (err) {
    $("model").textContent = "cannot reach the server: " + err.message;
  }
}

loadModel();
watchMetrics();
