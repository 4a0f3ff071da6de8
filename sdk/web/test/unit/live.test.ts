// The room's live state in the web SDK: the Login asks for it; viewer counts, member notices
// and room attributes come as events (attributes only when newer) and stay readable.

import assert from "node:assert/strict";
import { test } from "node:test";
import { AttributeError, type AttributesEvent, type MemberNoticeEvent, type ViewersEvent } from "../../src/index.js";
import { harness, until } from "./fakeserver.js";

const { server, client } = harness();

test("viewers, member notices and attributes come as events; attributes only when newer", async () => {
  let asked = false;
  const s = await server(async (conn) => {
    const login = await conn.acceptLogin();
    asked = login.liveState;
    conn.send("viewerCount", { online: 12n, tags: [{ tag: "class:1", members: 4n }] });
    conn.send("memberNotice", { changes: [{ uid: "ann" }, { uid: "bob", left: true }] });
    conn.send("roomAttributes", { version: 3n, attributes: [{ key: "pinned", value: "welcome" }] });
    conn.send("roomAttributes", { version: 2n, attributes: [] }); // crossed: older
    conn.send("roomAttributes", { version: 4n, attributes: [{ key: "announcement", value: "at 8" }, { key: "pinned", value: "welcome" }] });
  });
  const { c } = client({ endpoints: [s.endpoint] });
  const viewers: ViewersEvent[] = [], notices: MemberNoticeEvent[] = [], attrs: AttributesEvent[] = [];
  c.on("viewers", (e) => viewers.push(e));
  c.on("memberNotice", (e) => notices.push(e));
  c.on("attributes", (e) => attrs.push(e));
  await c.connect();
  await until("two attributes events", () => attrs.length === 2);
  assert.ok(asked, "the Login asks for the live state");
  assert.deepEqual(viewers, [{ online: 12, tags: { "class:1": 4 } }]);
  assert.deepEqual(notices, [{ uid: "ann", left: false }, { uid: "bob", left: true }]);
  assert.deepEqual(attrs[0].attrs, { pinned: "welcome" });
  assert.deepEqual(attrs[1], { attrs: { announcement: "at 8", pinned: "welcome" }, version: 4n });
  assert.deepEqual(c.viewers, { online: 12, tags: { "class:1": 4 } });
  assert.deepEqual(c.attributes.attrs, { announcement: "at 8", pinned: "welcome" });
});

test("setAttribute and removeAttribute: each gets its own reply; refusals are AttributeErrors", async () => {
  const s = await server(async (conn) => {
    await conn.acceptLogin();
    const set = await conn.next("setAttribute"), remove = await conn.next("setAttribute");
    assert.deepEqual([set.key, set.value, set.remove], ["pinned", "Q&A at 9", false]);
    assert.deepEqual([remove.key, remove.remove], ["announcement", true]);
    // Answered out of order: each reply reaches its own request.
    conn.send("setAttributeReply", { seq: remove.seq, code: 150, message: "the room's attributes_expr does not permit you" });
    conn.send("setAttributeReply", { seq: set.seq, version: 7n });
    conn.send("roomAttributes", { version: 7n, attributes: [{ key: "pinned", value: "Q&A at 9" }] });
  });
  const { c } = client({ endpoints: [s.endpoint] });
  await c.connect();
  const set = c.setAttribute("pinned", "Q&A at 9");
  const remove = c.removeAttribute("announcement");
  await assert.rejects(remove, (e) => e instanceof AttributeError && e.code === 150 && e.notAllowed && /ATTRIBUTES_NOT_ALLOWED/.test(e.message));
  assert.equal(await set, 7n);
  await until("the change's attributes", () => c.attributes.version === 7n);
  assert.deepEqual(c.attributes.attrs, { pinned: "Q&A at 9" });
});
