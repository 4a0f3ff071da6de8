// The protocol's signals against a fake ChatLink: the login's version and room_seq, Recovery,
// thinning, a server of a newer version, and a refused recover_since (docs/protocol.md).

import assert from "node:assert/strict";
import { test } from "node:test";
import { ErrorCode, HistoryUnavailableError, idFloor, SendError, VersionError } from "../../src/index.js";
import type { Login } from "../../src/gen/client_pb.js";
import { harness, message } from "./fakeserver.js";

const { server, client, until } = harness();

test("a login says its protocol version; a reconnect recovers from the last id and room_seq seen", async () => {
  const logins: Login[] = [];
  const s = await server(async (c, n) => {
    logins.push(await c.acceptLogin({ protocolVersion: 1 }));
    if (n === 1) {
      c.send("push", { messages: [message("01A", 1, "a", 2, 7), message("01B", 2, "b", 3, 0), message("01C", 3, "c", 1, 8)] });
      setTimeout(() => c.close(4500), 50);
    } else {
      c.send("push", { messages: [], history: true, recovery: { recovered: true } });
    }
  });
  const { c, of } = client({ endpoints: [s.endpoint] });
  await c.connect();
  await until("recovered", () => of("recovered").length === 1);
  assert.equal(logins[0].protocolVersion, 1);
  assert.equal(logins[0].recoverSince, "");
  assert.equal(logins[0].recoverSinceRoomSeq, 0n);
  assert.equal(logins[1].protocolVersion, 1);
  assert.equal(logins[1].recoverSince, "01C");
  assert.equal(logins[1].recoverSinceRoomSeq, 8n, "the greatest room_seq seen, not the last one's");
});

test("an incomplete recovery says how many messages are lost", async () => {
  const s = await server(async (c, n) => {
    const login = await c.acceptLogin();
    if (n === 1) {
      c.send("push", { messages: [message("01A", 1, "a", 2, 400)] });
      setTimeout(() => c.close(4500), 50);
      return;
    }
    assert.equal(login.recoverSinceRoomSeq, 400n);
    c.send("push", { messages: [message("01F", 6, "f", 2, 406)], history: true });
    c.send("push", { messages: [message("01G", 7, "g", 2, 407)], history: true, recovery: { recovered: false, missing: 5n } });
  });
  const { c, of } = client({ endpoints: [s.endpoint] });
  await c.connect();
  await until("recovered", () => of("recovered").length === 1);
  assert.deepEqual(of("recovered"), [{ since: "01A", recovered: false, missing: 5, count: 2 }]);
  assert.deepEqual(of("message").map((m) => m.id), ["01A", "01F", "01G"]);
});

test("the hold ends on the Push carrying Recovery, also when it brings nothing", async () => {
  const s = await server(async (c) => {
    await c.acceptLogin();
    c.send("push", { messages: [message("01L", 5)] }); // live, before the answer
    setTimeout(() => c.send("push", { messages: [], history: true, recovery: { recovered: true } }), 30);
  });
  const { c, log, of } = client({ endpoints: [s.endpoint], history: 50, recoveryWaitMs: 5000 });
  const t0 = Date.now();
  await c.connect();
  await until("the live message", () => of("message").length === 1, 1000);
  assert.ok(Date.now() - t0 < 1000, "released by the answer, not by recoveryWaitMs");
  assert.deepEqual(of("recovered"), [{ since: "", recovered: true, missing: 0, count: 0 }]);
  assert.deepEqual(log.filter((e) => e.type !== "connected").map((e) => e.type), ["message", "recovered"], "the held messages come first");
});

test("a history that never comes: the hold ends after recoveryWaitMs with an error", async () => {
  const s = await server((c) => c.acceptLogin());
  const { c, of } = client({ endpoints: [s.endpoint], history: 10, recoveryWaitMs: 150 });
  await c.connect();
  await until("recovered", () => of("recovered").length === 1);
  const [ev] = of("recovered");
  assert.equal(ev.recovered, false);
  assert.ok(ev.error instanceof HistoryUnavailableError, String(ev.error));
});

test("by default the hold outlasts the ChatLink's history read (up to 8 s): an answer after 3 s is a recovery, not an error", async () => {
  const s = await server(async (c) => {
    await c.acceptLogin();
    c.send("push", { messages: [message("01L", 5)] }); // live, before the answer
    setTimeout(() => c.send("push", { messages: [message("01H", 4)], history: true, recovery: { recovered: true } }), 3000);
  });
  const { c, of } = client({ endpoints: [s.endpoint], history: 50, recoveryWaitMs: undefined });
  await c.connect();
  await until("recovered", () => of("recovered").length === 1, 8000);
  assert.deepEqual(of("recovered"), [{ since: "", recovered: true, missing: 0, count: 1 }]);
  assert.deepEqual(of("message").map((m) => m.id), ["01H", "01L"]);
});

test("thinned: the per-lane counts, before the push's messages", async () => {
  const s = await server(async (c) => {
    await c.acceptLogin();
    c.send("push", { messages: [message("01A", 1)], thinned: { normal: 12, bulk: 3 } });
    c.send("push", { messages: [], thinned: { normal: 0, bulk: 40 } }); // a tick all left out
  });
  const { c, log, of } = client({ endpoints: [s.endpoint] });
  await c.connect();
  await until("two thinned", () => of("thinned").length === 2);
  assert.deepEqual(of("thinned"), [{ normal: 12, bulk: 3 }, { normal: 0, bulk: 40 }]);
  assert.deepEqual(log.filter((e) => e.type !== "connected").map((e) => e.type), ["thinned", "message", "thinned"]);
});

test("a LoginAck of a newer protocol version: a clear error, and no tight reconnect loop", async () => {
  let newer = true;
  const s = await server(async (c) => {
    await c.acceptLogin({ protocolVersion: newer ? 2 : 1 });
  });
  const { c, of } = client({ endpoints: [s.endpoint], reconnectMinDelayMs: 100, reconnectMaxDelayMs: 800 });
  await assert.rejects(c.connect(), (e: Error) => /protocol version 2, this SDK 1/.test(e.message));
  assert.equal(c.state, "idle");

  // A node upgraded under a connected client: it reconnects with a growing backoff.
  newer = false;
  await c.connect();
  newer = true;
  const before = s.conns.length;
  s.conns.at(-1)!.close(4500, "upgrade");
  await new Promise((r) => setTimeout(r, 1200));
  const attempts = s.conns.length - before;
  assert.ok(attempts >= 2 && attempts <= 6, `${attempts} attempts in 1.2 s`);
  const errors = of("error").filter((e) => /protocol version 2/.test(e.message));
  assert.ok(errors.length >= 2, "each attempt is reported");
  const delays = of("reconnecting").map((e) => e.delayMs);
  assert.ok(delays.at(-1)! > delays[0], `delays ${delays} should grow`);
  assert.ok(of("reconnecting").slice(1).every((e) => e.reason instanceof Error && /protocol version/.test(e.reason.message)));
  assert.ok(VersionError, "exported");
});

test("109 BAD_RECOVER_SINCE: the hold ends at once, and the bad id is not asked again", async () => {
  const logins: Login[] = [];
  const ackTimes: number[] = [];
  const s = await server(async (c, n) => {
    ackTimes.push(Date.now() + 5000); // the server's clock, ahead of ours
    logins.push(await c.acceptLogin({ serverTimeMs: BigInt(ackTimes.at(-1)!) }));
    if (n === 1) {
      c.send("error", { seq: 0n, code: ErrorCode.BAD_RECOVER_SINCE, message: "not a message id" });
      setTimeout(() => c.close(4500), 100);
    } else {
      c.send("push", { messages: [], history: true, recovery: { recovered: true } });
    }
  });
  const { c, of } = client({ endpoints: [s.endpoint], recoverSince: "not-an-id", recoveryWaitMs: 5000 });
  const t0 = Date.now();
  await c.connect();
  await until("refused", () => of("recovered").length === 1, 1000);
  assert.ok(Date.now() - t0 < 1000);
  const [ev] = of("recovered");
  assert.equal(ev.recovered, false);
  assert.ok(ev.error instanceof SendError && ev.error.code === 109, String(ev.error));
  assert.match(ev.error.message, /BAD_RECOVER_SINCE/);
  await until("reconnected", () => logins.length === 2);
  assert.equal(logins[0].recoverSince, "not-an-id");
  assert.equal(logins[1].recoverSince, idFloor(ackTimes[0]), "from the first login's time, not the refused id");
});

test("a reconnect before any message recovers from the first login's time", async () => {
  const logins: Login[] = [];
  const serverTime = 1796140709675;
  const s = await server(async (c, n) => {
    logins.push(await c.acceptLogin({ serverTimeMs: BigInt(serverTime + n) }));
    if (n === 1) setTimeout(() => c.close(4500), 30);
    else c.send("push", { messages: [], history: true, recovery: { recovered: true } });
  });
  const { c, of } = client({ endpoints: [s.endpoint] });
  await c.connect();
  await until("recovered", () => of("recovered").length === 1);
  assert.equal(logins[1].recoverSince, idFloor(serverTime + 1));
  assert.equal(idFloor(serverTime), "01M8S58DSB0000000000000000", "the id floor of the millisecond");
  assert.deepEqual(of("recovered").map((e) => e.since), [idFloor(serverTime + 1)]);
});
