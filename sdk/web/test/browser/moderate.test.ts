// The SDK against a real `roomcast dev` with two ChatLinks: in a room whose assistants moderate
// their class, an assistant mutes a member of their class (whose sends are then refused),
// unmutes them, recalls their message (not another class's) and removes them; a member of
// another class is a ModerateError 141, and a member who moderates nothing gets 140.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client, CloseCode, ErrorCode, ModerateError, SendError } from "../../src/index.js";
import { api, type Dev, mintToken, startDev, waitFor } from "../../../../internal/testkit/browser/dev.mjs";

let dev: Dev;

before(async () => {
  dev = await startDev(["--chatlinks", "2"]);
});

after(async () => {
  await dev?.stop();
});

test("an assistant mutes, unmutes, recalls the message of and removes a member of their class, and no one else", async () => {
  const room = "class";
  await api(dev.url, "POST", "/v1/rooms", {
    room,
    settings: { moderator_expr: `role == "assistant"`, moderator_scope_prefix: "class:" },
  });
  const join = async (uid: string, ...tags: string[]) => {
    // The app server's tags for the user: the dev token carries none.
    await api(dev.url, "PUT", `/v1/users/${uid}/tags`, { tags });
    const c = new Client({ token: await mintToken(dev.url, uid, room), dispatcher: dev.url, transport: "ws" });
    await c.connect();
    // Moderators act on the members presence knows, a moment after their login.
    await waitFor(`${uid} online`, async () => (await api(dev.url, "GET", `/v1/users/${uid}/sessions`)).sessions?.length > 0);
    return c;
  };
  const asst = await join("asst", "role:assistant", "class:1");
  const s1 = await join("s1", "class:1");
  const s2 = await join("s2", "class:2");
  try {
    // The room service learns the room's settings a moment after their write: until then the
    // assistant is no moderator. Asked again no faster than the connection's moderate rate
    // refills (5 a second), so the retries leave the burst for the requests below.
    await waitFor("asst mutes s1", async () => (await asst.mute("s1", 60_000)) === 1, 10000, 250);
    await waitFor("s1's send refused", async () => {
      try {
        await s1.send({ body: "hello" });
        return false;
      } catch (e) {
        return e instanceof SendError && e.code === ErrorCode.FORBIDDEN;
      }
    });
    await assert.rejects(asst.mute("s2"), (e) => e instanceof ModerateError && e.outsideScope && e.code === 141);
    await assert.rejects(s2.mute("s1"), (e) => e instanceof ModerateError && e.notModerator && /NOT_MODERATOR/.test(e.message));
    await assert.rejects(asst.mute("s1", -5), RangeError);
    assert.equal(await asst.unmute("s1"), 1);
    await waitFor("s1 sends again", async () => {
      try {
        await s1.send({ body: "back" });
        return true;
      } catch {
        return false;
      }
    });
    // A recall of s1's message (s1 hears of it, naming the assistant), not of s2's.
    const heard = new Promise<string>((resolve) => s1.on("recalled", (e) => resolve(`${e.id} by ${e.byUid}`)));
    const of1 = (await s1.send({ body: "to recall" })).messageId;
    await asst.recallAsModerator(of1);
    assert.equal(await heard, `${of1} by asst`);
    const of2 = (await s2.send({ body: "not yours" })).messageId;
    await assert.rejects(asst.recallAsModerator(of2), (e) => e instanceof ModerateError && e.outsideScope);
    const kicked = new Promise<number>((resolve) => s1.on("kicked", (e) => resolve(e.code)));
    assert.equal(await asst.remove("s1", "see you tomorrow"), 1);
    assert.equal(await kicked, CloseCode.KICKED);
  } finally {
    for (const c of [asst, s1, s2]) c.close();
  }
});
