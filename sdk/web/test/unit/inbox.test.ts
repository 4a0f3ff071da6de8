// At-least-once messages against a fake ChatLink: the login asks for the stored ones, each is
// handed to the app once and acknowledged, a copy is acknowledged again without reaching the
// app, and a refused acknowledgement (113) leaves the session up.

import assert from "node:assert/strict";
import { test } from "node:test";
import { Client } from "../../src/index.js";
import type { Login } from "../../src/gen/client_pb.js";
import type { Message } from "../../src/index.js";
import { type Conn, harness, message, token } from "./fakeserver.js";

const { server, client, until, defer } = harness();

function atLeastOnce(id: string, timeMs: number, body: string = id): Message {
  const m = message(id, timeMs, body);
  m.room = "";
  m.atLeastOnce = true;
  return m;
}

test("at-least-once messages: handed on once, acknowledged, copies acknowledged again", async () => {
  let conn!: Conn, login!: Login;
  const s = await server(async (c) => {
    conn = c;
    login = await c.acceptLogin();
  });
  const { c, of } = client({ endpoints: [s.endpoint] });
  await c.connect();
  assert.equal(login.inbox, true, "the login asks for the stored messages");

  conn.send("push", { messages: [atLeastOnce("01A", 1), message("01R", 2)] });
  assert.deepEqual((await conn.next("ack")).ids, ["01A"]);
  conn.send("push", { messages: [atLeastOnce("01A", 1), atLeastOnce("01B", 3)] }); // a copy, and a new one
  assert.deepEqual((await conn.next("ack")).ids, ["01A", "01B"]);
  conn.send("error", { seq: 0n, code: 113, message: "the store did not answer" });
  conn.send("push", { messages: [message("01S", 4)] });
  await until("the room message after the refused ack", () => of("message").length === 4);
  assert.deepEqual(of("message").map((m) => m.id), ["01A", "01R", "01B", "01S"]);
  assert.equal(c.state, "connected");
  assert.equal(of("recovered").length, 0, "a refused ack is not a refused history");
  assert.equal(c.lastId, "01S", "at-least-once messages do not move where recovery starts");
});

test("without a message listener nothing is acknowledged", async () => {
  let conn!: Conn;
  const s = await server(async (c) => {
    conn = c;
    await c.acceptLogin();
  });
  const c = new Client({ token: token(), endpoints: [s.endpoint], attemptTimeoutMs: 1000 });
  defer(() => c.close());
  await c.connect();
  conn.send("push", { messages: [atLeastOnce("01A", 1)] });
  await assert.rejects(conn.next("ack", 300));
});
