// The client's parts alone: de-duplication and ordering, the dispatcher's answer, the codes.

import assert from "node:assert/strict";
import { test } from "node:test";
import { Client, closeCodeName, dispatch, errorCodeName, readClaims, terminalCode } from "../../dist/index.js";
import { Delivery } from "../../dist/delivery.js";
import { message, token } from "./fakeserver.mjs";

test("Delivery drops duplicates by id and orders by (server time, id)", () => {
  const got = [];
  const d = new Delivery(100, (m) => got.push(m.id));
  assert.equal(d.add([message("01C", 20), message("01A", 10), message("01B", 20)]), 3);
  assert.equal(d.add([message("01A", 10), message("01D", 30)]), 1);
  assert.deepEqual(got, ["01A", "01B", "01C", "01D"], "sorted by time, then id; 01A once");
  assert.equal(d.lastId, "01D");
});

test("Delivery holds live messages until the history, then releases everything in order", () => {
  const got = [];
  const d = new Delivery(100, (m) => got.push(m.id));
  d.hold();
  d.add([message("05", 5)]); // live, before the history
  assert.deepEqual(got, []);
  d.add([message("03", 3), message("04", 4), message("05", 5)]);
  d.release();
  d.add([message("06", 6)]);
  assert.deepEqual(got, ["03", "04", "05", "06"]);
});

test("Delivery forgets the oldest ids beyond its window, and remembers the app's own sends", () => {
  const got = [];
  const d = new Delivery(2, (m) => got.push(m.id));
  d.remember("own");
  d.add([message("own", 1), message("a", 2), message("b", 3)]);
  d.add([message("own", 1)]); // forgotten: the window holds a and b
  assert.deepEqual(got, ["a", "b", "own"]);
});

test("readClaims reads app, uid and room, and refuses what is not a token", () => {
  assert.deepEqual(readClaims(token({ app: "demo", uid: "ü", room: "r" })), { app: "demo", uid: "ü", room: "r" });
  for (const bad of ["", "a.b", "a.!!!.c", token({ app: "demo", uid: "u" }), token({ app: 1, uid: "u", room: "r" })]) {
    assert.throws(() => readClaims(bad), /malformed token/, bad);
  }
});

test("dispatch returns the ranked endpoints and reports a refusal or garbage clearly", async () => {
  const answer = (status, body) => async (url) => {
    assert.match(url, /^http:\/\/d\/v1\/dispatch\?app=demo&room=r1&uid=u1$/);
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
  assert.ok(terminalCode(4001) && terminalCode(4499) && !terminalCode(4500) && !terminalCode(1006));
});

test("a Config without a token or a place to connect is refused at once", () => {
  assert.throws(() => new Client({}), /token is required/);
  assert.throws(() => new Client({ token: token() }), /dispatcher or endpoints/);
  new Client({ token: token(), dispatcher: "" }); // the page's own origin
});
