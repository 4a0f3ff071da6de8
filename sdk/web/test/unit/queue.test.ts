// The room queue in the web SDK: requests matched to their replies by seq, refusals as
// QueueError, change events decoded and applied in version order.

import assert from "node:assert/strict";
import { test } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { MessageSchema, QueueEntrySchema, QueueEventSchema } from "../../src/gen/message_pb.js";
import { Lane, QUEUE_EVENT_TYPE, QueueError, queueEventOf, QueueOp, QueueView } from "../../src/index.js";
import { harness } from "./fakeserver.js";

const { server, client } = harness();
const entry = (key: string, uid = "u1") => create(QueueEntrySchema, { key, uid });

test("queue requests get their own replies; refusals are QueueErrors", async () => {
  const s = await server(async (conn) => {
    await conn.acceptLogin();
    const offer = await conn.next("queueRequest"), list = await conn.next("queueRequest");
    assert.equal(offer.op, QueueOp.OFFER);
    assert.equal(offer.key, "mic");
    assert.equal(offer.ifAbsent, true);
    assert.equal(offer.dropOnLeave, true);
    assert.equal(Buffer.from(offer.value).toString(), "me");
    assert.equal(list.op, QueueOp.LIST);
    // Answered out of order: each reply reaches its own request.
    conn.send("queueReply", { seq: list.seq, entries: [entry("a"), entry("b")], version: 7n });
    conn.send("queueReply", { seq: offer.seq, code: 114, message: "key \"mic\" is taken" });
    const poll = await conn.next("queueRequest");
    assert.equal(poll.op, QueueOp.POLL);
    assert.equal(poll.key, "");
    conn.send("queueReply", { seq: poll.seq, entries: [entry("a")], version: 8n });
  });
  const { c } = client({ endpoints: [s.endpoint] });
  await c.connect();
  const offer = c.queueOffer("mic", "me", { ifAbsent: true, dropOnLeave: true });
  const list = c.queueList();
  await assert.rejects(offer, (e) => e instanceof QueueError && e.code === 114 && e.keyExists && /QUEUE_KEY_EXISTS/.test(e.message));
  const l = await list;
  assert.deepEqual(l.entries.map((e) => e.key), ["a", "b"]);
  assert.equal(l.version, 7n);
  assert.equal((await c.queuePoll()).key, "a");
});

test("QueueView applies events in version order; queueEventOf takes only the server's", () => {
  const ev = (version: bigint, op: QueueOp, ...keys: string[]) => create(QueueEventSchema, { version, op, entries: keys.map((k) => entry(k)) });
  const v = new QueueView();
  v.reset([entry("a")], 4n);
  assert.equal(v.apply(ev(6n, QueueOp.OFFER, "c")), true); // early: waits for 5
  assert.equal(v.version, 4n);
  assert.equal(v.apply(ev(5n, QueueOp.OFFER, "b")), false);
  assert.deepEqual(v.entries.map((e) => e.key), ["a", "b", "c"]);
  v.apply(ev(5n, QueueOp.OFFER, "z")); // old: ignored
  v.apply(ev(7n, QueueOp.DROP, "b"));
  v.apply(ev(8n, QueueOp.OFFER, "a")); // a replacement keeps its place
  assert.deepEqual(v.entries.map((e) => e.key), ["a", "c"]);
  v.apply(ev(9n, QueueOp.CLEAR));
  assert.equal(v.entries.length, 0);
  assert.equal(v.version, 9n);

  const body = toBinary(QueueEventSchema, ev(3n, QueueOp.CLEAR));
  const msg = (sender: string, type = QUEUE_EVENT_TYPE, lane = Lane.CRITICAL) => create(MessageSchema, { type, sender, lane, body });
  assert.equal(queueEventOf(msg(""))?.version, 3n);
  assert.equal(queueEventOf(msg("mallory")), undefined);
  assert.equal(queueEventOf(msg("", "chat")), undefined);
  assert.equal(queueEventOf(msg("", QUEUE_EVENT_TYPE, Lane.NORMAL)), undefined);
});
