// The client against a fake ChatLink: login, sends, pushes, heartbeats, reconnects, recovery,
// and servers that misbehave.

import assert from "node:assert/strict";
import { test } from "node:test";
import { Client, CloseError, HistoryError, Lane, LoginTimeoutError, ProtocolError, SendError, ServerTimeoutError } from "../../src/index.js";
import { type Conn, harness, message, startServer } from "./fakeserver.js";

const { server, client, until } = harness();

test("logs in, matches answers to sends by seq, delivers pushes", async () => {
  const s = await server(async (conn) => {
    const login = await conn.acceptLogin();
    assert.equal(login.device, "web");
    assert.equal(login.client, "roomcast-web/0.1");
    const a = await conn.next("send"), b = await conn.next("send");
    // Answered out of order, and one refused: each answer reaches its own send.
    conn.send("sendAck", { seq: b.seq, messageId: "id-b" });
    conn.send("error", { seq: a.seq, code: 102, message: "slow down" });
    conn.send("push", { messages: [message("01A", 1), message("01B", 2)] });
  });
  const { c, of } = client({ endpoints: [s.endpoint] });
  const ack = await c.connect();
  assert.equal(ack.node, "fake");
  assert.equal(c.state, "connected");
  const first = c.send({ body: "a" }), second = c.send({ body: "b" });
  await assert.rejects(first, (e) => e instanceof SendError && e.code === 102 && /RATE_LIMITED/.test(e.message));
  assert.equal((await second).messageId, "id-b");
  await until("two messages", () => of("message").length === 2);
  assert.deepEqual(of("message").map((m) => m.id), ["01A", "01B"]);
});

test("beats at the server's interval and follows a new one from HeartbeatAck", async () => {
  let conn!: Conn;
  const s = await server(async (c) => {
    conn = c;
    // Long enough that the answer to the first beat comes within three intervals (the client
    // gives a silent server up after that) on a loaded machine.
    await c.acceptLogin({ heartbeatIntervalMs: 100 });
  });
  const { c } = client({ endpoints: [s.endpoint] });
  await c.connect();
  const t0 = Date.now();
  const hb = await conn.next("heartbeat");
  assert.ok(Date.now() - t0 >= 80, "the first beat waits an interval");
  assert.ok(hb.clientTimeMs > 0n);
  conn.send("heartbeatAck", { clientTimeMs: hb.clientTimeMs, heartbeatIntervalMs: 400 });
  await conn.next("heartbeat"); // scheduled under the old interval
  const t1 = Date.now();
  conn.send("heartbeatAck", { heartbeatIntervalMs: 400 });
  await conn.next("heartbeat", 2000);
  assert.ok(Date.now() - t1 >= 300, `the next beat came ${Date.now() - t1} ms later, want the new 400 ms interval`);
});

test("a silent server is given up after three intervals, then the client reconnects", async () => {
  const s = await server(async (c) => {
    await c.acceptLogin({ heartbeatIntervalMs: 50 }); // and never answers a heartbeat
  });
  const { c, of } = client({ endpoints: [s.endpoint] });
  await c.connect();
  await until("a timeout", () => of("error").some((e) => e instanceof ServerTimeoutError), 2000);
  await until("a second connection", () => s.conns.length >= 2);
});

test("a server that sends garbage: an error event, a reconnect with backoff, no tight loop", async () => {
  const s = await server(async (c) => {
    await c.acceptLogin();
    c.raw(2, Buffer.from([0xff, 0xff, 0xff, 0xff, 0x0f])); // not a Frame
  });
  const { c, of } = client({ endpoints: [s.endpoint], reconnectMinDelayMs: 100, reconnectMaxDelayMs: 800 });
  await c.connect();
  await new Promise((r) => setTimeout(r, 1200));
  const errors = of("error").filter((e) => e instanceof ProtocolError);
  assert.ok(errors.length >= 1, "the garbage is reported");
  assert.match(errors[0].message, /does not parse/);
  // Logins succeed each time, but each connection breaks at once: the backoff keeps growing
  // (a connection must stay up for stableAfterMs to reset it), so 1.2 s hold a handful.
  assert.ok(s.conns.length >= 2 && s.conns.length <= 6, `${s.conns.length} connections in 1.2 s`);
  const delays = of("reconnecting").map((e) => e.delayMs);
  assert.ok(delays.at(-1)! > delays[0], `delays ${delays} should grow`);
});

test("a server that closes mid-frame: an abnormal close, then a reconnect", async () => {
  const s = await server(async (c, n) => {
    await c.acceptLogin();
    if (n === 1) {
      c.socket.write(Buffer.from([0x82, 100, 1, 2, 3])); // a binary frame of 100 bytes, cut after 3
      c.drop();
    }
  });
  const { c, of } = client({ endpoints: [s.endpoint] });
  await c.connect();
  await until("reconnected", () => of("connected").length === 2);
  const why = of("reconnecting")[0].reason;
  assert.ok(why instanceof CloseError && why.code === 1006 && !why.terminal, String(why));
});

test("a server that never answers the login: the attempt times out, connect rejects", async () => {
  const s = await server(() => {});
  const { c } = client({ endpoints: [s.endpoint], attemptTimeoutMs: 200 });
  const t0 = Date.now();
  await assert.rejects(c.connect(), (e: Error) => /no LoginAck/.test(e.message));
  assert.ok(Date.now() - t0 >= 190);
  assert.equal(c.state, "idle", "connect may be called again");
  assert.equal(s.conns.length, 1, "one attempt, not a loop");
});

test("a server of another protocol version: a clear error, not a crash", async () => {
  for (const answer of [
    (c: Conn) => c.raw(1, '{"type":"welcome","version":2}'), // a text frame
    (c: Conn) => c.send("push", { messages: [message("01A", 1)] }), // no LoginAck first
    (c: Conn) => c.raw(2, Buffer.from([0xa2, 0x06, 0x00])), // a Frame kind this version does not know
  ]) {
    const s = await server(async (c) => {
      await c.next("login");
      answer(c);
    });
    const { c } = client({ endpoints: [s.endpoint], attemptTimeoutMs: 500 });
    await assert.rejects(c.connect(), (e: Error) => e instanceof ProtocolError || e.message.includes("protocol"));
  }
});

test("endpoints are tried in order: a dead one gives way to the next", async () => {
  const dead = await startServer();
  const deadEndpoint = dead.endpoint;
  await dead.close();
  const s = await server((c) => c.acceptLogin());
  const { c } = client({ endpoints: [deadEndpoint, s.endpoint] });
  await c.connect();
  assert.equal(c.endpoint?.wsUrl, s.url);
});

test("a terminal kick stops the client; a transient one reconnects and recovers from the last id", async () => {
  const s = await server(async (c, n) => {
    const login = await c.acceptLogin();
    if (n === 1) {
      c.send("push", { messages: [message("01A", 1), message("01B", 2)] });
      setTimeout(() => c.close(4500, "node is shutting down"), 50);
    } else if (n === 2) {
      assert.equal(login.recoverSince, "01B");
      // Live first, then the history the login asked for, overlapping what the client has.
      c.send("push", { messages: [message("01E", 5)] });
      c.send("push", { messages: [message("01B", 2), message("01C", 3), message("01D", 4)], history: true, recovery: { recovered: true } });
      setTimeout(() => c.close(4007, "bye"), 50);
    }
  });
  const { c, of } = client({ endpoints: [s.endpoint] });
  await c.connect();
  await until("closed", () => of("closed").length === 1);
  assert.deepEqual(of("message").map((m) => m.id), ["01A", "01B", "01C", "01D", "01E"], "once each, in order");
  assert.deepEqual(of("recovered"), [{ since: "01B", recovered: true, missing: 0, count: 2 }]);
  assert.deepEqual(of("kicked").map((k) => [k.code, k.name, k.terminal]), [[4500, "SHUTDOWN", false], [4007, "KICKED", true]]);
  const closed = of("closed")[0];
  assert.ok(closed instanceof CloseError);
  assert.equal(closed.code, 4007);
  assert.equal(c.state, "closed");
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(s.conns.length, 2, "no reconnect after a terminal code");
});

test("the server's Reconnect: log in elsewhere after the delay, then leave the old node", async () => {
  const old = await server(async (c) => {
    await c.acceptLogin({ node: "old" });
    c.send("push", { messages: [message("01A", 1)] });
    c.send("reconnect", { delayMs: 100, reason: "draining" });
  });
  const next = await server(async (c) => {
    const login = await c.acceptLogin({ node: "new" });
    assert.equal(login.recoverSince, "01A");
    c.send("push", { messages: [], history: true, recovery: { recovered: true } });
  });
  let calls = 0;
  const fetch = async () => {
    calls++;
    const nodes = calls === 1 ? [old, next] : [next];
    return new Response(JSON.stringify({ nodes: nodes.map((n) => ({ node: n.url, ws_url: n.url })), ttl_ms: 30000 }));
  };
  const { c, of } = client({ dispatcher: "http://dispatcher", fetch });
  await c.connect();
  const t0 = Date.now();
  await until("moved", () => of("connected").length === 2);
  assert.ok(Date.now() - t0 >= 90, "waits the delay");
  assert.equal(calls, 2, "dispatches again: the list from before names the draining node");
  assert.equal(c.loginAck?.node, "new");
  await until("old closed", () => old.conns[0].closed);
  assert.equal(old.conns[0].closeCode, 1000);
  assert.equal(c.state, "connected");
});

test("a move: a send already written on the old node gets its answer there, later ones go to the new node", async () => {
  let moved!: () => void;
  const movedAt = new Promise<void>((r) => (moved = r));
  const old = await server(async (c) => {
    await c.acceptLogin({ node: "old" });
    const sent = await c.next("send");
    c.send("reconnect", { delayMs: 0, reason: "draining" });
    await movedAt; // the answer comes after the client has logged in elsewhere
    c.send("sendAck", { seq: sent.seq, messageId: "from-old" });
  });
  const next = await server(async (c) => {
    await c.acceptLogin({ node: "new" });
    moved();
    c.send("push", { messages: [], history: true, recovery: { recovered: true } });
    const sent = await c.next("send");
    c.send("sendAck", { seq: sent.seq, messageId: "from-new" });
  });
  let calls = 0;
  const fetch = async () => {
    const nodes = ++calls === 1 ? [old, next] : [next];
    return new Response(JSON.stringify({ nodes: nodes.map((n) => ({ node: n.url, ws_url: n.url })), ttl_ms: 30000 }));
  };
  const { c, of } = client({ dispatcher: "http://dispatcher", fetch });
  await c.connect();
  const inFlight = c.send({ body: "in flight" });
  await until("moved", () => of("connected").length === 2);
  assert.equal((await inFlight).messageId, "from-old");
  assert.equal((await c.send({ body: "after" })).messageId, "from-new");
  await until("old closed", () => old.conns[0].closed);
  assert.equal(old.conns[0].closeCode, 1000);
});

test("a move with fixed endpoints logs in at another node, not again at the one it leaves", async () => {
  const old = await server(async (c) => {
    await c.acceptLogin({ node: "old" });
    c.send("reconnect", { delayMs: 0, reason: "draining" });
  });
  const next = await server(async (c) => {
    await c.acceptLogin({ node: "new" });
  });
  const { c, of } = client({ endpoints: [{ node: "old", wsUrl: old.url }, { node: "new", wsUrl: next.url }] });
  await c.connect();
  await until("moved", () => of("connected").length === 2);
  assert.equal(c.loginAck?.node, "new");
  assert.equal(old.conns.length, 1, "logged in again at the node it was leaving");
  await until("old closed", () => old.conns[0].closed);
});

test("a draining node that closes before the move's delay: the client reconnects at once, not after the delay", async () => {
  const s = await server(async (c, n) => {
    await c.acceptLogin();
    if (n === 1) {
      c.send("reconnect", { delayMs: 60000, reason: "draining" });
      setTimeout(() => c.close(4500, "node is draining"), 50);
    }
  });
  const { c, of } = client({ endpoints: [s.endpoint] });
  await c.connect();
  await until("reconnected", () => of("connected").length === 2, 2000);
  assert.equal(s.conns.length, 2, "one new connection");
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(s.conns.length, 2, "and no second one");
});

test("history: a query frame with its own seq, the page matched to it, a refusal as a HistoryError", async () => {
  const s = await server(async (conn) => {
    await conn.acceptLogin();
    const q1 = await conn.next("historyQuery"), q2 = await conn.next("historyQuery");
    assert.deepEqual([q1.limit, q1.beforeId, q1.lane], [2, "01B", Lane.CRITICAL]);
    assert.equal(q2.cursor, "c1");
    assert.notEqual(q1.seq, q2.seq);
    // Answered out of order, one refused: each answer reaches its own query; a send between
    // them keeps its own answer too.
    conn.send("error", { seq: q2.seq, code: 110, message: "cursor is not one a history page gave" });
    const send = await conn.next("send");
    conn.send("sendAck", { seq: send.seq, messageId: "id-s" });
    conn.send("historyPage", { seq: q1.seq, messages: [message("01A", 1)], nextCursor: "c0" });
  });
  const { c, of } = client({ endpoints: [s.endpoint] });
  await c.connect();
  const page = c.history({ limit: 2, beforeId: "01B", lane: Lane.CRITICAL });
  const refused = c.history({ cursor: "c1" });
  await assert.rejects(refused, (e) => e instanceof HistoryError && e.code === 110 && !e.temporary && /BAD_HISTORY_QUERY/.test(e.message));
  assert.equal((await c.send({ body: "x" })).messageId, "id-s");
  const p = await page;
  assert.deepEqual([p.messages.map((m) => m.id), p.nextCursor], [["01A"], "c0"]);
  assert.equal(of("message").length, 0, "history pages are not message events");
});
