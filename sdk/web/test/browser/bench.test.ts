// The receive benchmark (bench/decode.mjs) still runs, on a small load.

import assert from "node:assert/strict";
import { test } from "node:test";
import { measure } from "../../bench/decode.mjs";

test("the receive benchmark page runs in chromium", async () => {
  const r = await measure(200, 50, 32, 1);
  assert.equal(r.messages, 10000);
  assert.ok(r.messagesPerSecond > 0 && r.decodeOnlyPerSecond > 0, JSON.stringify(r));
});
