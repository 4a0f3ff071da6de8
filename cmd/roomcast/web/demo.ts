// The demo page of `roomcast dev`: a video-sized stage with the room's danmaku flying across it,
// built on the web SDK (@roomcast/web, sdk/web). build.mjs bundles this file into demo.js, which
// is committed so that `roomcast dev` runs without npm.
//
// URL parameters: uid, room, history (messages on join, default 50), density (1–4), join=1 to
// join at once.
//
// The stage shows the room's live state: how many members watch (the viewer count) and its
// pinned message (the room attribute "pinned"), both as the server sends them. A recalled message
// (docs/protocol.md, "Recall") is taken off the stage and marked "(recalled)" in the log.

import {
  type CdnConfig,
  CdnMode,
  Client,
  CloseCode,
  CloseError,
  closeCodeName,
  ErrorCode,
  errorCodeName,
  Lane,
  type Message,
  SendError,
} from "@roomcast/web";

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const ui = {
  joinForm: $<HTMLFormElement>("join-form"), uid: $<HTMLInputElement>("uid"), room: $<HTMLInputElement>("room"),
  join: $<HTMLButtonElement>("join"), status: $("status"), state: $("st-state"), node: $("st-node"),
  transport: $("st-transport"),
  session: $("st-session"), received: $("st-received"), drawn: $("st-drawn"), thinned: $("st-thinned"),
  cdn: $("st-cdn"), stage: $("stage"),
  stageNote: $("stage-note"), log: $<HTMLOListElement>("log"), sendForm: $<HTMLFormElement>("send-form"),
  text: $<HTMLInputElement>("text"), lane: $<HTMLSelectElement>("lane"), send: $<HTMLButtonElement>("send"),
  density: $<HTMLInputElement>("density"), densityName: $("density-name"), codes: $<HTMLTableElement>("codes"),
  like: $<HTMLButtonElement>("like"), likes: $("likes"), watching: $("watching"), pinned: $("pinned"),
};

const params = new URLSearchParams(location.search);
ui.uid.value = params.get("uid") || `guest-${1000 + Math.floor(Math.random() * 9000)}`;
ui.room.value = params.get("room") || "lobby";
ui.density.value = params.get("density") || ui.density.value;
const historyOnJoin = Number(params.get("history") ?? 50);

const utf8 = new TextDecoder();
const laneName = (lane: Lane) => (lane === Lane.CRITICAL ? "critical" : lane === Lane.BULK ? "bulk" : "normal");
const closeText = (code: number) => `${code} ${closeCodeName(code)}`;
const errorText = (e: Error) =>
  e instanceof CloseError ? `closed with ${closeText(e.code)}${e.reason ? ` (${e.reason})` : ""}`
  : e instanceof SendError ? `${e.code} ${errorCodeName(e.code)}${e.serverMessage ? `: ${e.serverMessage}` : ""}`
  : e.message;

// ---- the stage ----

/** How much of the stage danmaku may cover, and how long one may wait for room before it is skipped. */
const densities = [
  { name: "sparse", rows: 0.3, waitMs: 1000 },
  { name: "normal", rows: 0.6, waitMs: 1500 },
  { name: "dense", rows: 1, waitMs: 2500 },
  { name: "all", rows: 1, waitMs: Infinity },
];

/**
 * Stage flies normal and bulk messages right to left at one speed in rows (so none overtakes
 * another), and pins critical ones at the top centre, styled apart. What finds no free row within
 * the density's wait is skipped, and the skips are counted on the stage.
 */
/** A danmaku for the stage: its message id ("" until an own message's ack names it) and, once drawn, its element. */
interface Item {
  text: string;
  cls: string;
  at: number;
  id: string;
  el?: HTMLElement;
}

class Stage {
  private rows: number[] = []; // when each row takes its next item, ms
  private queue: Item[] = [];
  private pinned: (HTMLElement | undefined)[] = [undefined, undefined, undefined]; // the top slots
  private skipped = 0;
  private timer = 0;

  constructor(private readonly el: HTMLElement) {}

  private get density() {
    return densities[Number(ui.density.value) - 1] ?? densities[2]!;
  }

  private get rowHeight() {
    return Math.max(24, this.el.clientHeight / 14);
  }

  /** add shows a message; id is its message id, or "" for an own message not yet acknowledged (see named). */
  add(text: string, lane: Lane, own: boolean, id = ""): Item {
    const item: Item = { text, cls: `danmaku ${laneName(lane)}${own ? " own" : ""}`, at: performance.now(), id };
    if (lane === Lane.CRITICAL) this.pin(item);
    else {
      this.queue.push(item);
      this.pump();
    }
    return item;
  }

  /** named gives an own message its id once the server acknowledged it. */
  named(item: Item, id: string) {
    item.id = id;
    if (item.el) item.el.dataset.id = id;
  }

  /** recall takes a recalled message off the stage, drawn or waiting for a row; it reports whether it was there. */
  recall(id: string): boolean {
    const waiting = this.queue.length;
    this.queue = this.queue.filter((item) => item.id !== id);
    let found = this.queue.length < waiting;
    for (const el of Array.from(this.el.querySelectorAll<HTMLElement>(".danmaku"))) {
      if (el.dataset.id !== id) continue;
      el.getAnimations().forEach((a) => a.cancel());
      this.remove(el);
      found = true;
    }
    return found;
  }

  /** pump starts queued items in free rows. */
  private pump() {
    clearTimeout(this.timer);
    const now = performance.now();
    const d = this.density;
    const rowCount = Math.max(1, Math.floor((this.el.clientHeight * d.rows) / this.rowHeight) - 1);
    this.rows.length = rowCount;
    while (this.queue.length) {
      const item = this.queue[0]!;
      if (now - item.at > d.waitMs) {
        this.queue.shift();
        this.skipped++;
        ui.stageNote.textContent = `${this.skipped} not shown at this density`;
        continue;
      }
      let row = -1;
      for (let i = 0; i < rowCount; i++) if ((this.rows[i] ?? 0) <= now) { row = i; break; }
      if (row < 0 && d.waitMs === Infinity) row = Math.floor(Math.random() * rowCount); // "all": overlap
      if (row < 0) break;
      this.queue.shift();
      this.fly(item, row, now);
    }
    if (this.queue.length) this.timer = window.setTimeout(() => this.pump(), 100);
  }

  private fly(item: Item, row: number, now: number) {
    const el = this.make(item);
    el.style.top = `${(row + 1) * this.rowHeight - this.rowHeight * 0.9 + 6}px`;
    const stageWidth = this.el.clientWidth, width = el.offsetWidth;
    const speed = stageWidth / 7000; // px per ms: seven seconds across
    this.rows[row] = now + (width + 40) / speed;
    el.animate([{ transform: `translateX(${stageWidth}px)` }, { transform: `translateX(${-width}px)` }],
      { duration: (stageWidth + width) / speed, easing: "linear" }).onfinish = () => this.remove(el);
  }

  /** pin shows a critical message in a free top slot for five seconds; with none free, the oldest gives way. */
  private pin(item: Item) {
    let slot = this.pinned.indexOf(undefined);
    if (slot < 0) {
      slot = this.pinned.reduce((oldest, el, i) => (Number(el!.dataset.at) < Number(this.pinned[oldest]!.dataset.at) ? i : oldest), 0);
      this.remove(this.pinned[slot]!);
    }
    const el = this.make(item);
    el.dataset.at = String(performance.now());
    this.pinned[slot] = el;
    el.style.top = `${8 + slot * this.rowHeight * 1.2}px`;
    el.animate([{ transform: "translateX(-50%)", opacity: 1 }, { transform: "translateX(-50%)", opacity: 1, offset: 0.85 },
      { transform: "translateX(-50%)", opacity: 0 }], { duration: 5000 }).onfinish = () => this.remove(el);
  }

  private make(item: Item) {
    const el = document.createElement("span");
    el.className = item.cls;
    el.textContent = item.text.length > 80 ? item.text.slice(0, 79) + "…" : item.text;
    if (item.id) el.dataset.id = item.id;
    item.el = el;
    this.el.append(el);
    ui.drawn.textContent = String(this.el.querySelectorAll(".danmaku").length);
    return el;
  }

  private remove(el: HTMLElement) {
    const slot = this.pinned.indexOf(el);
    if (slot >= 0) this.pinned[slot] = undefined;
    el.remove();
    ui.drawn.textContent = String(this.el.querySelectorAll(".danmaku").length);
  }
}

const stage = new Stage(ui.stage);
const showDensity = () => (ui.densityName.textContent = densities[Number(ui.density.value) - 1]!.name);
ui.density.addEventListener("input", showDensity);
showDensity();

// ---- the log beside the stage ----

const maxItems = 400;
let received = 0;

function append(li: HTMLLIElement) {
  const nearBottom = ui.log.scrollHeight - ui.log.scrollTop - ui.log.clientHeight < 40;
  ui.log.append(li);
  while (ui.log.children.length > maxItems) ui.log.firstElementChild!.remove();
  if (nearBottom) ui.log.scrollTop = ui.log.scrollHeight;
}

function span(cls: string, text: string) {
  const s = document.createElement("span");
  s.className = cls;
  s.textContent = text;
  return s;
}

function timeEl(ms: number) {
  const t = document.createElement("time");
  const d = ms ? new Date(ms) : new Date();
  t.dateTime = d.toISOString();
  t.textContent = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });
  return t;
}

function note(text: string, kind: "" | "warn" | "error" = "") {
  const li = document.createElement("li");
  li.className = `note ${kind}`;
  li.append(timeEl(0), span("body", text));
  append(li);
}

function messageItem(sender: string, lane: Lane, type: string, text: string, timeMs: number, own: boolean) {
  const li = document.createElement("li");
  li.className = `msg ${laneName(lane)}${own ? " own" : ""}`;
  li.append(timeEl(timeMs), span("sender", own ? `${sender} (you)` : sender || "(app)"));
  if (type && type !== "chat") li.append(span("tag", type));
  li.append(span("body", text), span("tag lane", laneName(lane)));
  return li;
}

function onMessage(m: Message) {
  const text = utf8.decode(m.body);
  const li = messageItem(m.sender, m.lane, m.type, text, Number(m.serverTimeMs), false);
  li.dataset.id = m.id;
  append(li);
  stage.add(text, m.lane, false, m.id);
  ui.received.textContent = String(++received);
}

/** onRecalled takes a recalled message off the stage and strikes it out in the log. */
function onRecalled(id: string, byUid: string) {
  const onStage = stage.recall(id);
  let inLog = false;
  for (const li of Array.from(ui.log.querySelectorAll<HTMLElement>("li.msg[data-id]"))) {
    if (li.dataset.id !== id) continue;
    li.classList.add("recalled");
    li.querySelector(".body")!.textContent = "(recalled)";
    inLog = true;
  }
  if (onStage || inLog) note(`A message was recalled${byUid ? ` by ${byUid}` : " by the app"}${onStage ? ": taken off the stage" : ""}`);
}

// Every close and error code with its name, from the generated enums.
for (const [title, e] of [["close codes", CloseCode], ["error codes", ErrorCode]] as const) {
  ui.codes.insertRow().insertCell().textContent = title;
  for (const [k, v] of Object.entries(e)) {
    if (typeof v !== "number" || v === 0) continue;
    const row = ui.codes.insertRow();
    row.insertCell().textContent = String(v);
    row.insertCell().textContent = k;
  }
}

// ---- what the room's stream left out, and the CDN ----

const plural = (n: number, what: string) => `${n} ${what}${n === 1 ? "" : "s"}`;
let thinnedTotal = 0;
let thinnedNow = { normal: 0, bulk: 0 };
let thinnedTimer = 0;

/** onThinned counts what the budget or flow control left out, and notes it once a second, not once a push. */
function onThinned(normal: number, bulk: number) {
  thinnedTotal += normal + bulk;
  ui.thinned.textContent = String(thinnedTotal);
  thinnedNow = { normal: thinnedNow.normal + normal, bulk: thinnedNow.bulk + bulk };
  thinnedTimer ||= window.setTimeout(() => {
    const { normal: n, bulk: b } = thinnedNow;
    thinnedNow = { normal: 0, bulk: 0 };
    thinnedTimer = 0;
    note(`Thinned: ${plural(n + b, "message")} left out by the room's budget or flow control (${n} normal, ${b} bulk)`, "warn");
  }, 1000);
}

/** showCdn shows whether the room's bulk danmaku come by CDN segments, and what polling them did. */
function showCdn(c: Client) {
  const cfg: CdnConfig | undefined = c.cdnConfig;
  const mode = !cfg ? "off" : cfg.mode === CdnMode.NORMAL_AND_BULK ? "normal+bulk" : "bulk";
  if (mode !== ui.cdn.dataset.mode) {
    if (cfg) note(`The room's ${mode} danmaku come by CDN segments now: a window of ${cfg.windowMs} ms, polled from ${plural(cfg.vendors.length, "vendor")}`);
    else if (ui.cdn.dataset.mode && ui.cdn.dataset.mode !== "off") note("CDN mode ended: everything comes over the connection");
    ui.cdn.dataset.mode = mode;
  }
  const st = c.cdnStats;
  ui.cdn.textContent = cfg || st.polls ? `${mode} · ${st.hits}/${st.polls} segments · ${st.messages} msgs${st.gaps ? ` · ${st.gaps} gaps` : ""}` : "off";
  ui.cdn.title = JSON.stringify(st);
}

// ---- the room's live state: how many watch, and its pinned message ----

/** showWatching shows the room's members online over every ChatLink ("" while unknown). */
function showWatching(online: number | undefined) {
  ui.watching.textContent = online === undefined ? "" : `${online.toLocaleString()} watching`;
}

/**
 * showPinned shows the room attribute "pinned" (set by the app server, or by members the room
 * permits) on the stage, or hides it when the room has none.
 */
function showPinned(attrs: Record<string, string>) {
  const text = attrs.pinned ?? "";
  if (text === ui.pinned.textContent && ui.pinned.hidden === !text) return;
  ui.pinned.textContent = text;
  ui.pinned.hidden = !text;
  if (text) note(`Pinned: ${text}`);
}

// ---- joining, leaving, sending ----

let client: Client | undefined;
let cdnTimer = 0;

function setState(state: string) {
  ui.status.className = `status state-${state}`;
  ui.state.textContent = state;
  const live = state === "connected";
  ui.text.disabled = ui.lane.disabled = ui.send.disabled = ui.like.disabled = !live;
  ui.text.placeholder = live ? "Say something… (Enter sends)" : "Join a room first";
  ui.join.textContent = client ? "Leave" : "Join";
  ui.join.className = client ? "secondary" : "";
  ui.uid.disabled = ui.room.disabled = !!client;
  if (!live) ui.node.textContent = ui.session.textContent = ui.transport.textContent = "–";
}

async function join() {
  const uid = ui.uid.value.trim(), room = ui.room.value.trim();
  const res = await fetch(`/v1/dev/token?${new URLSearchParams({ uid, room })}`, { cache: "no-store" });
  const answer = await res.json().catch(() => ({}));
  if (!res.ok || !answer.token) throw new Error(`no token: HTTP ${res.status} ${answer.error ?? ""}`);

  const c = new Client({ token: answer.token, dispatcher: "", history: historyOnJoin });
  client = c;
  ui.likes.textContent = "0";
  showWatching(undefined);
  showPinned({});
  c.on("message", onMessage);
  c.on("connected", (ev) => {
    const a = ev.loginAck;
    ui.node.textContent = a.node;
    ui.session.textContent = a.sessionId;
    setState("connected");
    ui.transport.textContent = ev.transport === "sse" ? "HTTP fallback (SSE)" : "WebSocket";
    const via = ev.transport === "sse" ? " through the HTTP fallback (no WebSocket)" : "";
    note(ev.reconnected ? `Reconnected to ${a.node}${via}` : `Joined room “${a.room}” as ${a.uid} on ${a.node}${via}`);
  });
  c.on("reconnecting", (ev) => {
    setState("reconnecting");
    note(`${errorText(ev.reason)} — reconnecting in ${(ev.delayMs / 1000).toFixed(1)} s (attempt ${ev.attempt})`, "error");
  });
  c.on("recovered", (ev) => {
    const what = ev.since ? "missed while away" : "of history";
    if (ev.error) note(`No ${what}: ${errorText(ev.error)}`, "error");
    else if (!ev.recovered) {
      note(`Recovered ${plural(ev.count, "message")} ${what}; recovery incomplete: ${ev.missing ? plural(ev.missing, "message") : "some messages"} no longer kept`, "warn");
    } else note(`Recovered ${plural(ev.count, "message")} ${what}`);
  });
  c.on("thinned", (ev) => onThinned(ev.normal, ev.bulk));
  // The room's likes: counted by the server, the running total a few times a second.
  c.on("counters", (ev) => (ui.likes.textContent = (ev.totals.like ?? 0).toLocaleString()));
  c.on("counterRefused", (ev) => note(`Like not counted: ${errorText(ev.error)}`, "warn"));
  // The room's live state: its viewer count (every few seconds, when it changed) and attributes.
  c.on("viewers", (ev) => showWatching(ev.online));
  c.on("attributes", (ev) => showPinned(ev.attrs));
  c.on("recalled", (ev) => onRecalled(ev.id, ev.byUid));
  c.on("kicked", (ev) => note(`Kicked: ${ev.code} ${ev.name}${ev.reason ? ` — ${ev.reason}` : ""}`, "error"));
  c.on("error", (err) => note(`Error: ${errorText(err)}`, "error"));
  c.on("closed", (err) => {
    if (client === c) client = undefined;
    clearInterval(cdnTimer);
    showCdn(c);
    setState("closed");
    showWatching(undefined);
    showPinned({});
    note(`Left: ${errorText(err)}`, err.name === "ClosedError" ? "" : "error");
  });
  setState("connecting");
  clearInterval(cdnTimer);
  cdnTimer = window.setInterval(() => showCdn(c), 500);
  try {
    await c.connect();
  } catch (e) {
    if (client === c) client = undefined;
    clearInterval(cdnTimer);
    setState("closed");
    note(`Could not join: ${errorText(e as Error)}`, "error");
  }
}

ui.joinForm.addEventListener("submit", (ev) => {
  ev.preventDefault();
  if (client) {
    client.close();
    return;
  }
  join().catch((e) => {
    client = undefined;
    setState("closed");
    note(`Could not join: ${(e as Error).message}`, "error");
  });
});

ui.sendForm.addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = ui.text.value;
  if (!text.trim() || !client) return;
  const lane = Number(ui.lane.value) as Lane;
  const li = messageItem(ui.uid.value.trim(), lane, "chat", text, 0, true);
  append(li);
  const item = stage.add(text, lane, true);
  client.send({ body: text, lane }).then(
    (ack) => {
      li.dataset.id = ack.messageId;
      stage.named(item, ack.messageId);
    },
    (e: Error) => {
      li.classList.add("failed");
      li.append(span("tag", `not sent — ${errorText(e)}`));
    },
  );
  ui.text.value = "";
  ui.text.focus();
});

ui.like.addEventListener("click", () => {
  if (!client) return;
  try {
    client.addCounter("like");
  } catch (e) {
    note(`Like not sent: ${errorText(e as Error)}`, "warn");
    return;
  }
  // A heart floats from the button: the tap is on its way; the total follows from the server.
  const pop = document.createElement("span");
  pop.className = "pop";
  pop.textContent = "♥";
  ui.stage.append(pop);
  pop.animate([{ transform: "translateY(0)", opacity: 1 }, { transform: "translateY(80px) scale(1.6)", opacity: 0 }],
    { duration: 900, easing: "ease-out" }).onfinish = () => pop.remove();
});

setState("idle");
if (params.get("join") === "1") ui.joinForm.requestSubmit();
