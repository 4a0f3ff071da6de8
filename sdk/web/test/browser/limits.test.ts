// The SDK against a real `roomcast dev` whose ChatLink limits joins per room: a crowd that
// logs in at once is refused with Kick 4013 over the join rate, waits the server's hint
// (a limited event) and every member ends up logged in; a send over its rate is refused with
// a SendError 120 carrying the hint.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client, CloseCode, ErrorCode, type LimitedEvent, SendError } from "../../src/index.js";
import { type Dev, mintToken, startDev } from "../../../../internal/testkit/browser/dev.mjs";

let dev: Dev;

before(async () => {
  dev = await startDev(["--chatlinks", "1", "--limit-joins-per-room", "5/s:2", "--limit-sends-per-conn", "5/s:1"]);
});

after(async () => {
  await dev?.stop();
});

test("a crowd over the room's join rate waits the hint and every member logs in", async () => {
  const members = 8;
  const limited: LimitedEvent[] = [];
  const clients = await Promise.all(Array.from({ length: members }, async (_, i) => {
    const c = new Client({ token: await mintToken(dev.url, `m${i}`, "crowd"), dispatcher: dev.url, transport: "ws" });
    c.on("limited", (e) => limited.push(e));
    await c.connect();
    return c;
  }));
  try {
    assert.equal(clients.filter((c) => c.state === "connected").length, members);
    assert.ok(limited.length >= members - 2, `${limited.length} limited events, want at least ${members - 2}`);
    for (const e of limited) {
      assert.equal(e.code, CloseCode.LOGIN_RATE_LIMITED);
      assert.equal(e.name, "LOGIN_RATE_LIMITED");
      assert.ok(e.retryAfterMs > 0 && e.retryAfterMs <= 1000 && e.delayMs >= e.retryAfterMs, JSON.stringify(e));
    }
  } finally {
    for (const c of clients) c.close();
  }
});

test("a send over the connection's rate rejects with the server's hint", async () => {
  const c = new Client({ token: await mintToken(dev.url, "fast", "rated"), dispatcher: dev.url, transport: "ws" });
  await c.connect();
  try {
    await c.send({ body: "one" });
    await assert.rejects(c.send({ body: "two" }), (e) =>
      e instanceof SendError && e.code === ErrorCode.SEND_RATE_LIMITED && e.retryAfterMs > 0 && e.retryAfterMs <= 200);
  } finally {
    c.close();
  }
});
