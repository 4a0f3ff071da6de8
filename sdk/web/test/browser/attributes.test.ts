// The SDK against a real `roomcast dev` of two ChatLinks: in a room whose attributes_expr names
// its host, the host's client pins a message and the other members' clients (on both
// ChatLinks) get it in an attributes event; a viewer's change is refused with an
// AttributeError 150; the host's removal reaches them too.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { AttributeError, Client, dispatch, ErrorCode } from "../../src/index.js";
import { api, type Dev, mintToken, startDev, waitFor } from "../../../../internal/testkit/browser/dev.mjs";

let dev: Dev;

before(async () => {
  dev = await startDev(["--chatlinks", "2"]);
});

after(async () => {
  await dev?.stop();
});

test("a permitted member pins a message every member sees; another member is refused", async () => {
  await api(dev.url, "POST", "/v1/rooms", { room: "podium", settings: { attributes_expr: 'uid == "host"', attribute_keys: ["pinned"] } });
  const clients: Client[] = [];
  try {
    // Members on both ChatLinks: each is given one of the dispatcher's two, in turn.
    const { endpoints } = await dispatch(fetch, dev.url, await mintToken(dev.url, "host", "podium"));
    assert.equal(endpoints.length, 2, "two ChatLinks");
    for (const [i, uid] of ["host", "v1", "v2", "v3"].entries()) {
      const c = new Client({ token: await mintToken(dev.url, uid, "podium"), endpoints: [endpoints[i % 2]!], transport: "ws" });
      await c.connect();
      clients.push(c);
    }
    const nodes = new Set(clients.map((c) => c.loginAck?.node));
    assert.equal(nodes.size, 2, "members on both ChatLinks");
    const [host, viewer] = [clients[0]!, clients[1]!];

    const version = await host.setAttribute("pinned", "Q&A at 9");
    assert.ok(version > 0n);
    await waitFor("every member's pin", async () => clients.every((c) => c.attributes.attrs.pinned === "Q&A at 9" && c.attributes.version >= version), 5000);

    await assert.rejects(viewer.setAttribute("pinned", "mine now"), (e) =>
      e instanceof AttributeError && e.code === ErrorCode.ATTRIBUTES_NOT_ALLOWED && e.notAllowed && /attributes_expr/.test(e.message));
    await assert.rejects(host.setAttribute("announcement", "x"), (e) => e instanceof AttributeError && e.notAllowed && /attribute_keys/.test(e.message));

    await host.removeAttribute("pinned");
    await waitFor("the pin removed everywhere", async () => clients.every((c) => c.attributes.attrs.pinned === undefined), 5000);
    const got = await api(dev.url, "GET", "/v1/rooms/podium/attributes");
    assert.deepEqual(got.attributes, []);
    console.log(`# ${clients.length} members on ${nodes.size} ChatLinks`);
  } finally {
    for (const c of clients) c.close();
  }
});
