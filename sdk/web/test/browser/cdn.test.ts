// The SDK (in node) against a real `roomcast dev` (its CDN manager, pusher, store and origin): a
// room's CDN mode switched off while bulk messages flow. Every member gets every message exactly
// once: those sent before the switch from the segments up to the off config's lastIndex, those
// after over the connection; then it stops polling.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client } from "../../src/index.js";
import { api, type Dev, mintToken, startDev, waitFor } from "../../../../internal/testkit/browser/dev.mjs";

let dev: Dev;

before(async () => {
  dev = await startDev(["--chatlinks", "1"]);
});

after(async () => {
  await dev?.stop();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test("CDN mode off while bulk messages flow: each message once, then no polling", async () => {
  const room = "finale";
  await api(dev.url, "PUT", `/v1/rooms/${room}/cdn`, { mode: "CDN_MODE_BULK" });
  const members = [];
  try {
    for (let i = 0; i < 2; i++) {
      const got: string[] = [];
      // The room is in CDN mode once the manager has a route for it: log in until the LoginAck says so.
      const c = await waitFor("a LoginAck in CDN mode", async () => {
        const c = new Client({ token: await mintToken(dev.url, `viewer${i}`, room), dispatcher: dev.url, transport: "ws" });
        c.on("message", (m) => got.push(m.id));
        await c.connect();
        if (c.cdnConfig) return c;
        c.close();
        return undefined;
      }, 15000, 200);
      members.push({ c, got });
    }
    // 10 bulk messages a second (under a member's budget on the connection: none is thinned)
    // for 5 s; the mode goes off 2 s in.
    const sent: string[] = [];
    const start = Date.now();
    let off = false;
    while (Date.now() - start < 5000) {
      if (!off && Date.now() - start >= 2000) {
        off = true;
        await api(dev.url, "PUT", `/v1/rooms/${room}/cdn`, { mode: "CDN_MODE_OFF" });
      }
      const res = await api(dev.url, "POST", `/v1/rooms/${room}/messages`, { body: `bulk ${sent.length}`, lane: "bulk" });
      sent.push(res.id);
      await sleep(100);
    }
    for (const [i, { c, got }] of members.entries()) {
      await waitFor(`member ${i}: every message`, () => {
        const missing = sent.filter((id) => !got.includes(id)).length;
        if (missing > 0) throw new Error(`${missing} of ${sent.length} missing, ${JSON.stringify(c.cdnStats)}`);
        return true;
      }, 15000);
      assert.equal(new Set(got).size, got.length, `member ${i}: a message handed on twice`);
      await waitFor(`member ${i}: polling stopped`, () => c.cdnConfig === undefined, 10000);
      const polls = c.cdnStats.polls;
      await sleep(2000);
      assert.equal(c.cdnStats.polls, polls, `member ${i}: polling after the last segment`);
      const st = c.cdnStats;
      console.log(`# member ${i}: ${sent.length} sent, ${JSON.stringify(st)}`);
      assert.ok(st.messages > 0 && st.messages < sent.length, `member ${i}: ${st.messages} of ${sent.length} from segments`);
      assert.equal(st.gaps, 0);
    }
  } finally {
    for (const { c } of members) c.close();
  }
});
