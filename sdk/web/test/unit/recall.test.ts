// Recall in the web SDK: a Recall frame takes the message out of what the client has not
// emitted (held for a recovery, waiting in the CDN pacer) and out of what comes later; each
// recall is told once as a "recalled" event; a member's own recall is answered by seq; a
// moderator's recall is a ModerateRequest naming the message.

import assert from "node:assert/strict";
import { test } from "node:test";
import { Pacer } from "../../src/cdn.js";
import type { Message, RecalledEvent } from "../../src/index.js";
import { ModerateError, ModerateOp, SendError } from "../../src/index.js";
import { harness, message, until } from "./fakeserver.js";

const { server, client } = harness();

const recall = (...ids: string[]) => ({ messages: ids.map((id) => ({ id, recalledMs: 1764451200123n, byUid: "" })) });

test("a recalled message is told once and never emitted after the recall, live or in a recovery", async () => {
  const s = await server(async (conn) => {
    await conn.acceptLogin();
    conn.send("push", { messages: [message("01A", 10), message("01B", 20)] });
    conn.send("recall", recall("01B"));
    conn.send("recall", recall("01C")); // before the message arrives
    conn.send("push", { messages: [message("01B", 20), message("01C", 30), message("01D", 40)] });
    conn.send("recall", recall("01B")); // told again
    const req = await conn.next("recallRequest");
    assert.equal(req.messageId, "01D");
    conn.send("recallReply", { seq: req.seq, code: 131, message: "a member may recall only its own messages" });
    const again = await conn.next("recallRequest");
    conn.send("recallReply", { seq: again.seq, recalledMs: 5n, alreadyRecalled: true });
  });
  const { c } = client({ endpoints: [s.endpoint] });
  const got: string[] = [], recalled: RecalledEvent[] = [];
  c.on("message", (m) => got.push(m.id));
  c.on("recalled", (e) => recalled.push(e));
  await c.connect();
  await until("01D", () => got.includes("01D"));
  assert.deepEqual(got, ["01A", "01B", "01D"]);
  assert.deepEqual(recalled, [
    { id: "01B", recalledMs: 1764451200123, byUid: "" },
    { id: "01C", recalledMs: 1764451200123, byUid: "" },
  ]);
  await assert.rejects(c.recall("01D"), (e) => e instanceof SendError && e.code === 131 && /RECALL_NOT_ALLOWED/.test(e.message));
  assert.deepEqual(await c.recall("01D"), { alreadyRecalled: true });
});

test("a message held for the login's history and recalled meanwhile is not emitted", async () => {
  const s = await server(async (conn) => {
    await conn.acceptLogin();
    conn.send("push", { messages: [message("01F", 60)] }); // live, held for the history
    conn.send("recall", recall("01F"));
    conn.send("push", { history: true, messages: [message("01E", 50), message("01F", 60)], recovery: { recovered: true } });
  });
  const { c } = client({ endpoints: [s.endpoint], history: 10 });
  const got: string[] = [];
  c.on("message", (m) => got.push(m.id));
  let recovered = false;
  c.on("recovered", () => (recovered = true));
  await c.connect();
  await until("recovered", () => recovered);
  assert.deepEqual(got, ["01E"]);
});

test("the CDN pacer drops a recalled message that waits for its play time", async () => {
  const released: Message[] = [];
  const start = Date.now(); // the server's clock starts at 0 with the test
  const p = new Pacer(() => Date.now() - start, (m) => released.push(m), { late: 0 });
  p.add([message("01G", 30), message("01H", 40)], 0, 1000);
  p.drop(["01G"]);
  await until("01H", () => released.length > 0);
  await new Promise((r) => setTimeout(r, 50));
  p.stop();
  assert.deepEqual(released.map((m) => m.id), ["01H"]);
});

test("a moderator's recall is a ModerateRequest RECALL naming the message; a refusal is a ModerateError", async () => {
  const s = await server(async (conn) => {
    await conn.acceptLogin();
    const req = await conn.next("moderateRequest");
    assert.equal(req.op, ModerateOp.RECALL);
    assert.equal(req.messageId, "01M90NFA041RFEB0GAVC6FRPV7");
    assert.equal(req.uid, "");
    conn.send("moderateReply", { seq: req.seq, affected: 1n });
    const other = await conn.next("moderateRequest");
    conn.send("moderateReply", { seq: other.seq, code: 141, message: "s2 shares none of your class: tags (class:1)" });
  });
  const { c } = client({ endpoints: [s.endpoint] });
  await c.connect();
  await c.recallAsModerator("01M90NFA041RFEB0GAVC6FRPV7");
  await assert.rejects(c.recallAsModerator("01M90NFA0XDACW97HMB0CZJJ2S"), (e) => e instanceof ModerateError && e.outsideScope && /OUTSIDE_SCOPE/.test(e.message));
});
