// CDN polling against a fake ChatLink and a fake CDN (docs/cdn.md): segments merged with the long
// connection, paced, on the server's clock; vendors chosen, failing and changed live; bad input.

import assert from "node:assert/strict";
import { test } from "node:test";
import { type CdnConfig, CdnMode, compareMessages, type Config, idFloor, type Message } from "../../src/index.js";
import { type Conn, harness, type Logged, message, type OnConn } from "./fakeserver.js";
import { type Behaviour, type CdnOptions, cdnConfig, encodeSegment, startCdn } from "./fakecdn.js";

const { server, client, until, defer } = harness();
const text = (m: Message) => new TextDecoder().decode(m.body);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** id makes a message id of server time ms; n orders ids of one millisecond. */
const id = (ms: number, n: number) => idFloor(ms).slice(0, 10) + String(n).padStart(16, "0");

/** inCdnMode starts a fake CDN and a fake ChatLink whose LoginAck puts room r1 in CDN mode. */
async function inCdnMode(opts: CdnOptions & { config?: CdnConfig; client?: Partial<Config> } = {}, onConn: OnConn = () => {}) {
  const cdn = startCdn(opts);
  defer(() => cdn.stop());
  const s = await server(async (c, n) => {
    await c.acceptLogin({ serverTimeMs: BigInt(cdn.serverNow()), cdn: opts.config ?? cdn.config() });
    await onConn(c, n);
  });
  const warnings: string[] = [];
  const logger = { warn: (m: string) => warnings.push(m), debug: () => {} };
  const cl = client({ endpoints: [s.endpoint], fetch: cdn.fetch, logger, ...opts.client });
  await cl.c.connect();
  return { cdn, s, warnings, ...cl };
}

test("segments merge with the long connection: once each, in order, paced over the window", async () => {
  let conn!: Conn;
  const { cdn, c, log, of, s } = await inCdnMode({ windowMs: 200 }, (cn) => (conn = cn));
  const sent = [];
  let n = 0;
  for (let i = 0; i < 50; i++) {
    const t = cdn.serverNow();
    const bulk = message(id(t, ++n), t, `bulk ${i}`, 3);
    cdn.add(bulk);
    sent.push(bulk.id);
    if (i % 10 === 0) conn.send("push", { messages: [bulk] }); // also over the long link: a mode change
    if (i % 5 === 0) {
      const crit = message(id(t, ++n), t, `critical ${i}`, 1, i);
      conn.send("push", { messages: [crit] });
      sent.push(crit.id);
    }
    await sleep(20);
  }
  await until("every message", () => of("message").length >= sent.length, 3000);
  await sleep(300);
  const got = of("message").map((m) => m.id);
  assert.equal(got.length, sent.length, "no duplicates");
  assert.deepEqual([...got].sort(), [...sent].sort());

  // The segments' messages come out in (server time, id) order, spread over their window.
  const overLongLink = (m: Message) => Number(text(m).split(" ")[1]) % 10 === 0;
  const viaCdn = log.filter((e): e is Logged<"message"> => e.type === "message" && e.ev.lane === 3 && !overLongLink(e.ev));
  for (let i = 1; i < viaCdn.length; i++) assert.ok(compareMessages(viaCdn[i - 1].ev, viaCdn[i].ev) < 0, `in order: ${viaCdn.map((e) => e.ev.id.slice(-3) + "@" + e.ev.serverTimeMs).join(" ")}`);
  const byWindow = new Map<number, Logged<"message">[]>();
  for (const e of viaCdn) {
    const w = Math.floor(Number(e.ev.serverTimeMs) / 200);
    byWindow.set(w, [...(byWindow.get(w) ?? []), e]);
  }
  // A window's messages come out spread as they were sent: over at least half the time between
  // its first and last server times. (How many a window holds depends on how punctually the loop
  // above ran; a segment that comes very late is released at once, to catch up: on a loaded
  // machine, one may.)
  const span = (ns: number[]) => Math.max(...ns) - Math.min(...ns);
  const windows = [...byWindow.values()].filter((es) => es.length >= 4);
  const spreads = windows.map((es) => `${span(es.map((e) => e.at))}/${span(es.map((e) => Number(e.ev.serverTimeMs)))}`);
  const paced = windows.filter((es) => 2 * span(es.map((e) => e.at)) >= span(es.map((e) => Number(e.ev.serverTimeMs))));
  assert.ok(paced.length >= 2, `a window's messages spread over it, not a burst (released/sent spans): ${spreads} ms`);
  // Publish to release: at most window + poll interval + 500 ms.
  const latency = viaCdn.map((e) => e.at - Number(e.ev.serverTimeMs)).sort((a, b) => a - b);
  assert.ok(latency[Math.floor(latency.length * 0.9)] <= 900, `released after their time: ${latency} ms`);

  const st = c.cdnStats;
  assert.equal(st.duplicates, 5, "the five that came both ways");
  assert.equal(st.messages, 45);
  assert.ok(st.hits >= 5 && st.polls <= st.hits + 4, JSON.stringify(st));
  assert.equal(st.errors + st.invalid + st.late, 0, JSON.stringify(st));
  assert.equal(c.cdnConfig?.mode, CdnMode.BULK);
  assert.equal(s.conns.length, 1);
});

for (const skewMs of [30000, -30000]) {
  test(`a server clock ${skewMs > 0 ? "ahead" : "behind"} by 30 s: the indexes are the server's`, async () => {
    const { cdn, c, of } = await inCdnMode({ windowMs: 200, offsetMs: skewMs });
    const first = Math.floor(cdn.serverNow() / 200);
    for (let i = 0; i < 5; i++) {
      const t = cdn.serverNow();
      cdn.add(message(id(t, i), t, `m${i}`, 3));
      await sleep(40);
    }
    await until("five messages", () => of("message").length === 5, 3000);
    const asked = cdn.indexes();
    // 30 s of skew is 150 windows: an index on the client's own clock would be far off. The
    // window before `first` is fair: it was still open at login and is polled once it is due.
    assert.ok(asked.every((i) => i >= first - 1 && i <= first + 20), `asked ${asked}, server index ${first}`);
    assert.ok(c.cdnStats.misses <= 3, JSON.stringify(c.cdnStats));
    });
}

test("bad vendors and bad segments are counted and logged; the long link goes on", async () => {
  let conn!: Conn;
  const vendors: Record<string, Behaviour> = { "http://five-hundred": "500", "http://down": "down", "http://good": "ok" };
  // The good one as a fallback only, so that the bad ones are asked first.
  const config = cdnConfig(200, Object.keys(vendors).map((b) => ({ template: `${b}/{app}/{room}/{window_ms}/{index}`, weight: b === "http://good" ? 0 : 1 })));
  const { cdn, c, of, s, warnings } = await inCdnMode({ windowMs: 200, vendors, config }, (cn) => (conn = cn));
  const k = Math.floor(cdn.serverNow() / 200) + 2;
  const truncated = encodeSegment({ app: "demo", room: "r1", windowMs: 200, index: BigInt(k), messages: [message(id(k * 200, 1), k * 200, "x".repeat(500), 3)] });
  cdn.bodies.set(k, truncated.subarray(0, truncated.length - 20));
  cdn.bodies.set(k + 1, encodeSegment({ app: "demo", room: "other", windowMs: 200, index: BigInt(k + 1) }));
  cdn.bodies.set(k + 2, new Uint8Array([0x0a, 0xff, 0xff, 0xff])); // not a Segment
  cdn.never.add(k + 3); // a 404 that never fills
  const t = (k + 5) * 200 + 50;
  cdn.add(message(id(t, 1), t, "after the bad ones", 3));
  await until("the message after the bad ones", () => of("message").some((m) => text(m) === "after the bad ones"), 5000);
  conn.send("push", { messages: [message(id(t, 2), t, "long link", 1)] });
  await until("the long link", () => of("message").some((m) => text(m) === "long link"));
  const st = c.cdnStats;
  assert.ok(st.invalid >= 3, `invalid: ${JSON.stringify(st)}`);
  assert.ok(st.gaps >= 4, `gaps: ${JSON.stringify(st)}`);
  assert.ok(st.errors >= 2, `errors: ${JSON.stringify(st)}`);
  assert.ok(st.misses >= 1, `misses: ${JSON.stringify(st)}`);
  // A failing vendor rests (1 s, doubling): it is not asked at every poll.
  for (const bad of ["http://five-hundred", "http://down"]) {
    const asked = cdn.calls.filter((x) => x.url.startsWith(bad)).length;
    assert.ok(asked >= 1 && asked <= 4, `${bad} asked ${asked} times`);
  }
  assert.ok(warnings.some((w) => /HTTP 500/.test(w)) && warnings.some((w) => /fetch failed/.test(w)), warnings.join("\n"));
  assert.ok(warnings.some((w) => /gzip/.test(w)) && warnings.some((w) => /of demo\/other/.test(w)), warnings.join("\n"));
  assert.equal(c.state, "connected");
  assert.equal(s.conns.length, 1, "no reconnect");
  assert.deepEqual(of("error"), []);
});

test("a room whose segments never come: misses and gaps counted, polls bounded", async () => {
  const { cdn, c, of } = await inCdnMode({ windowMs: 100, vendors: { "http://empty": "ok" } });
  for (let i = -5; i < 100; i++) cdn.never.add(Math.floor(cdn.serverNow() / 100) + i);
  await sleep(2000);
  const st = c.cdnStats;
  assert.equal(st.hits, 0);
  assert.ok(st.misses >= 5 && st.gaps >= 5, JSON.stringify(st));
  assert.ok(st.polls <= 25, `${st.polls} polls in 20 windows`);
  assert.equal(c.state, "connected");
  assert.deepEqual(of("error"), []);
});

test("vendors: by weight among those of the member's region, weight 0 only as a fallback", async () => {
  const vendors: Record<string, Behaviour> = { "http://elsewhere": "ok", "http://spare": "ok", "http://flaky": "500" };
  const config = cdnConfig(200, [
    { template: "http://elsewhere/{app}/{room}/{window_ms}/{index}", regions: ["asia"] },
    { template: "http://spare/{app}/{room}/{window_ms}/{index}", weight: 0 },
    { template: "http://flaky/{app}/{room}/{window_ms}/{index}", weight: 5 },
  ]);
  const { cdn, of } = await inCdnMode({ windowMs: 200, vendors, config, client: { cdnRegion: "eu" } });
  const t = cdn.serverNow();
  cdn.add(message(id(t, 1), t, "hi", 3));
  await until("the message", () => of("message").length === 1, 3000);
  const hosts = cdn.calls.map((x) => new URL(x.url).host);
  assert.equal(hosts[0], "flaky", "the weighted vendor first");
  assert.ok(hosts.includes("spare"), "the fallback after it failed");
  assert.ok(!hosts.includes("elsewhere"), "not a vendor of another region while one of ours works");
});

test("a live CdnConfig: new vendors at the next poll, mode off stops polling, no reconnect", async () => {
  let conn!: Conn;
  const vendors: Record<string, Behaviour> = { "http://old": "ok", "http://new": "ok" };
  const config = cdnConfig(200, [{ template: "http://old/{app}/{room}/{window_ms}/{index}" }]);
  const { cdn, c, s } = await inCdnMode({ windowMs: 200, vendors, config }, (cn) => (conn = cn));
  await until("a hit at the old vendor", () => c.cdnStats.hits >= 1, 2000);
  conn.send("cdnConfig", cdnConfig(200, [{ template: "http://new/{app}/{room}/{window_ms}/{index}" }]));
  const switched = cdn.calls.length;
  await until("polls at the new vendor", () => cdn.calls.slice(switched).filter((x) => x.url.startsWith("http://new")).length >= 2, 2000);
  assert.ok(cdn.calls.slice(switched + 1).every((x) => x.url.startsWith("http://new")), "none at the old one after the change");
  conn.send("cdnConfig", cdnConfig(200, [], CdnMode.OFF));
  await until("off", () => c.cdnConfig === undefined);
  const polls = c.cdnStats.polls;
  await sleep(600);
  assert.ok(c.cdnStats.polls <= polls + 1, "no polling while off");
  assert.equal(s.conns.length, 1);
});

test("mode off with a last index: segments polled up to it, every message once, then no polling", async () => {
  let conn!: Conn;
  const w = 200;
  const { cdn, c, of } = await inCdnMode({ windowMs: w }, (cn) => (conn = cn));
  await until("a hit", () => c.cdnStats.hits >= 1, 2000);
  const sent = [];
  let n = 0;
  let last = Infinity;
  const start = Date.now();
  while (Date.now() - start < 1600) {
    const t = cdn.serverNow();
    const i = Math.floor(t / w);
    if (last === Infinity && Date.now() - start >= 800) {
      // The switch, as the CDN manager makes it: windows up to the next but one are written,
      // the members told at once; from the window after, the bulk lane is pushed.
      last = i + 1;
      cdn.lastIndex = last;
      conn.send("cdnConfig", { ...cdn.config(CdnMode.OFF), lastIndex: BigInt(last) });
    }
    const m = message(id(t, ++n), t, `bulk ${n}`, 3);
    if (i <= last) cdn.add(m);
    else conn.send("push", { messages: [m] });
    sent.push(m.id);
    await sleep(20);
  }
  await until("every message", () => of("message").length >= sent.length, 3000);
  await until("polling stopped", () => c.cdnConfig === undefined, 3000);
  const polls = c.cdnStats.polls;
  await sleep(3 * w);
  const got = of("message").map((m) => m.id);
  assert.equal(got.length, sent.length, "no duplicates");
  assert.deepEqual([...got].sort(), [...sent].sort());
  assert.equal(c.cdnStats.polls, polls, "no polling after the last segment");
  assert.ok(cdn.indexes().every((i) => i <= last), `nothing asked after ${last}: ${cdn.indexes()}`);
  assert.equal(c.cdnStats.gaps, 0);
});

test("polling goes on while the long connection reconnects", async () => {
  const { cdn, c, of, s } = await inCdnMode({ windowMs: 200 }, (cn, n) => {
    if (n === 1) setTimeout(() => cn.drop(), 100);
  });
  await until("reconnecting", () => of("reconnecting").length === 1);
  const t = cdn.serverNow();
  cdn.add(message(id(t, 1), t, "during", 3));
  await until("the segment message", () => of("message").length === 1, 3000);
  await until("reconnected", () => s.conns.length === 2 && c.state === "connected");
  assert.equal(c.cdnStats.errors, 0);
});
