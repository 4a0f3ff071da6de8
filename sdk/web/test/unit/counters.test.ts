// Counters in the web SDK: adds written as CounterAdd frames, refusals named by their counter,
// totals emitted newest first and only when newer (two frames may cross).

import assert from "node:assert/strict";
import { test } from "node:test";
import { ErrorCode, NotConnectedError, RoomcastError, SendError, validCounterName } from "../../src/index.js";
import type { CounterRefusedEvent, CountersEvent } from "../../src/index.js";
import { harness, until } from "./fakeserver.js";

const { server, client } = harness();

test("addCounter writes CounterAdds; a refusal comes as counterRefused with its counter", async () => {
  const s = await server(async (conn) => {
    await conn.acceptLogin();
    const like = await conn.next("counterAdd"), rose = await conn.next("counterAdd");
    assert.equal(like.name, "like");
    assert.equal(like.amount, 1);
    assert.equal(rose.name, "gift:rose");
    assert.equal(rose.amount, 5);
    assert.notEqual(like.seq, rose.seq);
    conn.send("error", { seq: rose.seq, code: ErrorCode.SEND_RATE_LIMITED, message: "over the counter_conn rate", retryAfterMs: 250 });
    // A send still gets its own answer.
    const send = await conn.next("send");
    conn.send("sendAck", { seq: send.seq, messageId: "01M8SBBFD0000000000000000A" });
  });
  const { c } = client({ endpoints: [s.endpoint] });
  assert.throws(() => c.addCounter("like"), NotConnectedError);
  await c.connect();
  const refused: CounterRefusedEvent[] = [];
  c.on("counterRefused", (e) => refused.push(e));
  assert.throws(() => c.addCounter("no spaces"), RoomcastError);
  assert.throws(() => c.addCounter("like", 0), RoomcastError);
  c.addCounter("like");
  c.addCounter("gift:rose", 5);
  const ack = await c.send({ body: "hi" });
  assert.equal(ack.messageId, "01M8SBBFD0000000000000000A");
  await until("the refusal", () => refused.length === 1);
  assert.equal(refused[0].name, "gift:rose");
  assert.equal(refused[0].amount, 5);
  assert.ok(refused[0].error instanceof SendError);
  assert.equal(refused[0].error.code, ErrorCode.SEND_RATE_LIMITED);
  assert.equal(refused[0].error.retryAfterMs, 250);
});

test("counters events carry every counter, and only newer versions", async () => {
  const s = await server(async (conn) => {
    await conn.acceptLogin();
    conn.send("counterTotals", { version: 5n, counters: [{ name: "gift:rose", total: 3n }, { name: "like", total: 40n }] });
    conn.send("counterTotals", { version: 4n, counters: [{ name: "like", total: 39n }] }); // crossed: older
    conn.send("counterTotals", { version: 5n, counters: [{ name: "like", total: 40n }] }); // the same again
    conn.send("counterTotals", { version: 7n, counters: [{ name: "like", total: 52n }] }); // the rose reset
  });
  const { c } = client({ endpoints: [s.endpoint] });
  const seen: CountersEvent[] = [];
  c.on("counters", (e) => seen.push(e));
  await c.connect();
  await until("two counters events", () => seen.length === 2);
  assert.deepEqual(seen[0].totals, { "gift:rose": 3, like: 40 });
  assert.equal(seen[0].version, 5n);
  assert.deepEqual(seen[1].totals, { like: 52 });
  assert.deepEqual(c.counters, { totals: { like: 52 }, version: 7n });
});

test("validCounterName", () => {
  for (const ok of ["like", "gift:rose", "a.b-c_d", "x".repeat(32)]) assert.ok(validCounterName(ok), ok);
  for (const bad of ["", "x".repeat(33), "no spaces", "émoji", "a/b"]) assert.ok(!validCounterName(bad), bad);
});
