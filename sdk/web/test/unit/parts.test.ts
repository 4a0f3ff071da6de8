// The client's parts alone: de-duplication and ordering, the dispatcher's answer, the codes,
// segment decoding and pacing.

import assert from "node:assert/strict";
import { test } from "node:test";
import { gunzipSync, gzipSync } from "node:zlib";
import { Pacer } from "../../src/cdn.js";
import { Delivery } from "../../src/delivery.js";
import {
  Client, closeCodeName, decodeSegment, dispatch, errorCodeName, MAX_SEGMENT_BYTES, limitedCode, readClaims, SegmentError, segmentIndex, segmentUrl, terminalCode,
} from "../../src/index.js";
import { encodeSegment } from "./fakecdn.js";
import { message, token } from "./fakeserver.js";

test("Delivery drops duplicates by id and orders by (server time, id)", () => {
  const got: string[] = [];
  const d = new Delivery(100, (m) => got.push(m.id));
  assert.equal(d.add([message("01C", 20), message("01A", 10), message("01B", 20)]), 3);
  assert.equal(d.add([message("01A", 10), message("01D", 30)]), 1);
  assert.deepEqual(got, ["01A", "01B", "01C", "01D"], "sorted by time, then id; 01A once");
  assert.equal(d.lastId, "01D");
});

test("Delivery holds live messages until the history, then releases everything in order", () => {
  const got: string[] = [];
  const d = new Delivery(100, (m) => got.push(m.id));
  d.hold();
  d.add([message("05", 5)]); // live, before the history
  assert.deepEqual(got, []);
  d.add([message("03", 3), message("04", 4), message("05", 5)]);
  d.unhold();
  d.add([message("06", 6)]);
  assert.deepEqual(got, ["03", "04", "05", "06"]);
});

test("Delivery forgets the oldest ids beyond its window, and remembers the app's own sends", () => {
  const got: string[] = [];
  const d = new Delivery(2, (m) => got.push(m.id));
  d.remember("own");
  d.add([message("own", 1), message("a", 2), message("b", 3)]);
  d.add([message("own", 1)]); // forgotten: the window holds a and b
  assert.deepEqual(got, ["a", "b", "own"]);
  const mine = new Delivery(10, () => {});
  mine.add([message("01A", 1)]);
  mine.remember("01Z");
  assert.equal(mine.lastId, "01A", "an own send does not move where recovery starts");
});

test("readClaims reads app, uid and room, and refuses what is not a token", () => {
  assert.deepEqual(readClaims(token({ app: "demo", uid: "ü", room: "r" })), { app: "demo", uid: "ü", room: "r" });
  for (const bad of ["", "a.b", "a.!!!.c", token({ app: "demo", uid: "u" }), token({ app: 1, uid: "u", room: "r" })]) {
    assert.throws(() => readClaims(bad), /malformed token/, bad);
  }
});

test("dispatch returns the ranked endpoints and reports a refusal or garbage clearly", async () => {
  const answer = (status: number, body: string) => async (url: string | URL | Request) => {
    assert.match(String(url), /^http:\/\/d\/v1\/dispatch\?app=demo&room=r1&uid=u1$/);
    return new Response(body, { status });
  };
  const ok = await dispatch(answer(200, JSON.stringify({ nodes: [{ node: "cl-1", ws_url: "ws://a/v1/ws", tcp_addr: "a:1" }, { node: "x" }], ttl_ms: 5 })), "http://d/", token());
  assert.deepEqual(ok, { endpoints: [{ node: "cl-1", wsUrl: "ws://a/v1/ws", tcpAddr: "a:1" }], ttlMs: 5 });
  await assert.rejects(dispatch(answer(503, '{"error":"no ChatLink is available"}'), "http://d", token()), /HTTP 503: no ChatLink is available/);
  await assert.rejects(dispatch(answer(200, "<html>"), "http://d", token()), /not JSON/);
  await assert.rejects(dispatch(answer(200, '{"nodes":[]}'), "http://d", token()), /no endpoint/);
  await assert.rejects(dispatch(async () => { throw new TypeError("fetch failed"); }, "http://d", token()), /dispatch: fetch failed/);
});

test("every close and error code has its name; 4000-4499 are terminal", () => {
  assert.equal(closeCodeName(4001), "BAD_TOKEN");
  assert.equal(closeCodeName(4505), "ROOM_FULL");
  assert.equal(closeCodeName(1006), "ABNORMAL_CLOSURE");
  assert.equal(closeCodeName(4999), "UNKNOWN");
  assert.equal(errorCodeName(104), "BAD_TAG_EXPR");
  assert.equal(errorCodeName(503), "UNAVAILABLE");
  assert.ok(terminalCode(4001) && terminalCode(4014) && terminalCode(4499) && !terminalCode(4500) && !terminalCode(1006));
  assert.ok(!terminalCode(4013) && !terminalCode(4015) && limitedCode(4013) && limitedCode(4015) && !limitedCode(4014));
});

test("a Config without a token or a place to connect is refused at once", () => {
  // @ts-expect-error: the types require a token too
  assert.throws(() => new Client({}), /token is required/);
  assert.throws(() => new Client({ token: token() }), /dispatcher or endpoints/);
  new Client({ token: token(), dispatcher: "" }); // the page's own origin
});

test("decodeSegment takes the stored gzip stream or the inflated bytes, and refuses anything else", async () => {
  const want = { app: "demo", room: "r1", windowMs: 1000, index: 1796140709 };
  const fields = { app: "demo", room: "r1", windowMs: 1000, index: 1796140709n, messages: [message("01A", 1796140709100, "hi", 3)], sampled: 4, nextAtMs: 1796140711100n };
  const gz = encodeSegment(fields);
  for (const body of [gz, gunzipSync(gz)]) {
    const s = await decodeSegment(new Uint8Array(body), want);
    assert.deepEqual([s.messages.map((m) => m.id), s.sampled, s.nextAtMs], [["01A"], 4, 1796140711100n]);
  }
  const bad = {
    garbage: new Uint8Array([0xff, 0xff, 0xff, 0x0f, 0x01]),
    truncated: gz.subarray(0, gz.length - 8),
    "not gzip after the magic": new Uint8Array([0x1f, 0x8b, 1, 2, 3, 4]),
    "another app": encodeSegment({ ...fields, app: "other" }),
    "another room": encodeSegment({ ...fields, room: "r2" }),
    "another window": encodeSegment({ ...fields, windowMs: 500 }),
    "another index": encodeSegment({ ...fields, index: 1796140710n }),
    "a message of another room": encodeSegment({ ...fields, messages: [{ ...message("01B", 1), room: "r2" }] }),
    "a message without an id": encodeSegment({ ...fields, messages: [message("", 1)] }),
    "a targeted message": encodeSegment({ ...fields, messages: [{ ...message("01C", 1), tagExpr: "vip" }] }),
    "a gzip bomb": gzipSync(Buffer.alloc(MAX_SEGMENT_BYTES + 1)),
  };
  for (const [what, body] of Object.entries(bad)) {
    await assert.rejects(decodeSegment(new Uint8Array(body), want), (e) => e instanceof SegmentError, what);
  }
});

test("segmentUrl fills a vendor's template; segmentIndex is floor(server time / window)", () => {
  assert.equal(segmentUrl("https://cdn.example.com/rc/{app}/{room}/{window_ms}/{index}?v={app}", "demo", "lobby", 1000, 1764451200), "https://cdn.example.com/rc/demo/lobby/1000/1764451200?v=demo");
  assert.equal(segmentIndex(1764451200999, 1000), 1764451200);
  assert.equal(segmentIndex(1764451201000, 1000), 1764451201);
});

test("Pacer keeps a window's spacing when its segment comes faster than the slowest of the last few", () => {
  let now = 10_600; // on the server's clock; the pacer's timers never find anything due
  const p = new Pacer(() => now, () => {}, { late: 0 });
  p.add([message("01", 10_010), message("02", 10_190)], 10_000, 200); // window 0, 600 ms after its start
  now = 10_650;
  p.add([message("03", 10_410), message("04", 10_500), message("05", 10_590)], 10_400, 200); // window 2, 250 ms after
  const at = Object.fromEntries(p["queue"].map((q) => [q.m.id, q.at]));
  p.stop();
  // Released 90 ms apart as they were sent, not all at one capped instant; at most two windows
  // after the segment came.
  assert.deepEqual([at["04"] - at["03"], at["05"] - at["04"]], [90, 90], JSON.stringify(at));
  assert.ok(at["03"] > now && at["05"] <= now + 400, JSON.stringify(at));
});

test("Pacer releases a window's messages over the window, in order; a late one at once, counted", async () => {
  const got: { id: string; at: number }[] = [];
  const stats = { late: 0 };
  const t0 = Date.now();
  const p = new Pacer(() => Date.now(), (m) => got.push({ id: m.id, at: Date.now() - t0 }), stats);
  // A window that started 100 ms ago, with messages 0, 100 and 200 ms into it, given out of order.
  p.add([message("02", t0 - 100 + 100), message("01", t0 - 100), message("03", t0 - 100 + 200)], t0 - 100, 300);
  await new Promise((r) => setTimeout(r, 350));
  assert.deepEqual(got.map((g) => g.id), ["01", "02", "03"]);
  assert.ok(got[0].at < 50 && got[1].at >= 80 && got[2].at >= 180, JSON.stringify(got));
  p.add([message("00", t0 - 150)], t0 + 200, 300); // belongs before what was released
  assert.equal(stats.late, 1);
  assert.equal(got.at(-1)?.id, "00");
  p.stop();
});
