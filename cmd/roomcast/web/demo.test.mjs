// The demo page and the web SDK in Debian's chromium against a real `roomcast dev`.
//
// SCREENSHOTS=1 also writes the screenshots to docs/ (the ones the docs show).

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { api, launchChromium, repo, sendAsApp, startDev, waitFor } from "../../../internal/testkit/browser/dev.mjs";

let dev, browser;

before(async () => {
  dev = await startDev(["--chatlinks", "3"]);
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  await dev?.stop();
});

/** open loads the demo page as uid in room and waits until it is connected. */
async function open(uid, room, query = "") {
  const page = await browser.context.newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push(e));
  page.problems = problems;
  await page.goto(`${dev.url}/?uid=${uid}&room=${room}&join=1${query}`);
  await waitFor(`${uid} connected`, async () => (await page.textContent("#st-state")) === "connected");
  return page;
}

/** ids returns the message ids in the page's log, in order. */
const ids = (page) => page.$$eval("#log li.msg[data-id]", (lis) => lis.map((li) => li.dataset.id));
const bodies = (page) => page.$$eval("#log li.msg .body", (els) => els.map((e) => e.textContent));

async function say(page, text) {
  await page.fill("#text", text);
  await page.press("#text", "Enter");
}

/**
 * throughAnOutage sends critical messages to room every 25 ms while stopNode(node) takes the
 * page's ChatLink away, until the page is connected elsewhere; then it checks that the page has
 * every message once, in the order sent.
 */
async function throughAnOutage(page, room, stopNode) {
  const node = await page.textContent("#st-node");
  let sent = 0, stop = false;
  const sender = (async () => {
    while (!stop) {
      await sendAsApp(dev.url, room, `${room}-${++sent}`, "critical");
      await new Promise((r) => setTimeout(r, 25));
    }
  })();
  await waitFor("a few messages", async () => (await ids(page)).length >= 5);
  stopNode(node);
  await waitFor("connected elsewhere", async () => (await page.textContent("#st-node")) !== node && (await page.textContent("#st-state")) === "connected", 10000);
  await new Promise((r) => setTimeout(r, 300));
  stop = true;
  await sender;
  await waitFor(`all ${sent} messages`, async () => (await ids(page)).length === sent, 5000);
  assert.deepEqual(await bodies(page), Array.from({ length: sent }, (_, i) => `${room}-${i + 1}`));
}

test("two pages chat", async () => {
  const alice = await open("alice", "chat");
  const bob = await open("bob", "chat");
  await say(alice, "hello bob");
  await waitFor("bob hears alice", async () => (await bodies(bob)).includes("hello bob"));
  await say(bob, "hi alice");
  await waitFor("alice hears bob", async () => (await bodies(alice)).includes("hi alice"));
  // Each sees its own message once (no echo) and the other's once.
  assert.deepEqual(await bodies(alice), ["hello bob", "hi alice"]);
  assert.deepEqual(await bodies(bob), ["hello bob", "hi alice"]);
  assert.deepEqual([...alice.problems, ...bob.problems], []);
  await alice.close();
  await bob.close();
});

test("likes: taps on two pages add up to one live total on both stages", async () => {
  const alice = await open("alice", "likes");
  const bob = await open("bob", "likes");
  for (let i = 0; i < 3; i++) await alice.click("#like");
  for (let i = 0; i < 2; i++) await bob.click("#like");
  for (const page of [alice, bob]) {
    await waitFor("the total of 5 likes", async () => (await page.textContent("#likes")) === "5", 5000);
  }
  // A later page gets the total at its login.
  const carol = await open("carol", "likes");
  await waitFor("carol sees 5 likes", async () => (await carol.textContent("#likes")) === "5", 5000);
  assert.deepEqual([...alice.problems, ...bob.problems, ...carol.problems], []);
  for (const page of [alice, bob, carol]) await page.close();
});

test("danmaku fly across the stage, critical ones styled apart; a later page gets the history", async () => {
  // The room exists while someone is in it; what it kept is the viewer's history on join.
  const host = await open("host", "show");
  await sendAsApp(dev.url, "show", "welcome to the show", "critical");
  const viewer = await open("viewer", "show");
  await waitFor("history on join", async () => (await bodies(viewer)).includes("welcome to the show"));
  // The stage's live state, for the picture: the pinned message and how many watch.
  await api(dev.url, "PUT", "/v1/rooms/show/attributes/pinned", { value: "Tonight: the final. Ask the hosts anything" });
  await waitFor("the pinned message", async () => (await viewer.textContent("#pinned")).startsWith("Tonight"), 5000);
  await waitFor("2 watching", async () => (await viewer.textContent("#watching")) === "2 watching", 10000);
  const lines = ["8888888", "first!", "this goal though", "replay please", "GG", "wow", "LOL", "so close", "what a save", "again!", "who else is watching at 3am", "\\(^o^)/"];
  for (let i = 0; i < 24; i++) {
    await sendAsApp(dev.url, "show", i % 8 === 3 ? `gift: rocket ×${i}` : lines[i % lines.length], i % 8 === 3 ? "critical" : "bulk");
    await new Promise((r) => setTimeout(r, 110)); // a trickle within the room's budget, so they spread out
  }
  await waitFor("danmaku on the stage", async () => (await viewer.locator("#stage .danmaku").count()) >= 8, 5000);
  await new Promise((r) => setTimeout(r, 1000)); // let the last ones enter the stage
  const drawn = await viewer.locator("#stage .danmaku").count();
  const critical = await viewer.locator("#stage .danmaku.critical").count();
  const shot = await viewer.locator("#stage").screenshot({ path: process.env.SCREENSHOTS ? join(repo, "docs/web-demo-stage.png") : undefined });
  assert.ok(shot.length > 10000, "a screenshot of the stage");
  console.log(`# stage: ${drawn} danmaku drawn, ${critical} critical`);
  assert.ok(drawn >= 8 && critical >= 1, `${drawn} drawn, ${critical} critical`);
  const [normalColor, criticalColor] = await Promise.all([
    viewer.locator("#stage .danmaku:not(.critical)").first().evaluate((e) => getComputedStyle(e).color),
    viewer.locator("#stage .danmaku.critical").first().evaluate((e) => getComputedStyle(e).color),
  ]);
  assert.notEqual(normalColor, criticalColor);
  if (process.env.SCREENSHOTS) await viewer.screenshot({ path: join(repo, "docs/web-demo.png") });

  // History on join: the critical and normal lanes are kept (bulk is not).
  const late = await open("late", "show");
  await waitFor("history", async () => (await bodies(late)).filter((b) => b.startsWith("gift")).length === 3);
  assert.deepEqual(viewer.problems, []);
  await viewer.close();
  await late.close();
  await host.close();
});

test("the stage shows how many watch and the pinned message, live", async () => {
  // The documented bound of a viewer count (docs/protocol.md: the viewer interval, 3 s, plus
  // the report interval, 1 s), with room for a busy machine.
  const countBound = 10000;
  const watching = (page) => page.textContent("#watching");
  const pinned = async (page) => ((await page.isVisible("#pinned")) ? page.textContent("#pinned") : null);
  const anchor = await open("anchor", "stage");
  await waitFor("1 watching", async () => (await watching(anchor)) === "1 watching", countBound);
  assert.equal(await pinned(anchor), null, "no pinned message before one is set");

  // Set through the server API: the page in the room shows it at once.
  await api(dev.url, "PUT", "/v1/rooms/stage/attributes/pinned", { value: "Q&A at 9: ask away" });
  await waitFor("the pinned message on the stage", async () => (await pinned(anchor)) === "Q&A at 9: ask away", 5000);

  // A second page: it gets the pinned message at its login, and both count two.
  const fan = await open("fan", "stage");
  await waitFor("the later page's pinned message", async () => (await pinned(fan)) === "Q&A at 9: ask away", 5000);
  for (const page of [anchor, fan]) await waitFor("2 watching", async () => (await watching(page)) === "2 watching", countBound);

  // Changed and removed live; the count goes down when a page leaves.
  await api(dev.url, "PUT", "/v1/rooms/stage/attributes/pinned", { value: "Half time" });
  for (const page of [anchor, fan]) await waitFor("the new pinned message", async () => (await pinned(page)) === "Half time", 5000);
  await fan.close();
  await waitFor("1 watching again", async () => (await watching(anchor)) === "1 watching", countBound);
  await api(dev.url, "PUT", "/v1/rooms/stage/attributes/pinned", { remove: true });
  await waitFor("no pinned message", async () => (await pinned(anchor)) === null, 5000);
  assert.match(await anchor.textContent("#log"), /Pinned: Q&A at 9: ask away/);
  assert.deepEqual([...anchor.problems, ...fan.problems], []);
  await anchor.close();
});

test("a recalled danmaku leaves the stage and the log", async () => {
  const page = await open("watcher", "recall");
  const onStage = (id) => page.$$eval(".danmaku", (els, id) => els.some((el) => el.dataset.id === id), id);
  const logBody = (id) => page.$$eval("#log li.msg", (lis, id) => lis.find((li) => li.dataset.id === id)?.querySelector(".body")?.textContent, id);

  // A danmaku from the app server flies for seven seconds: recalled while it flies.
  const sent = await sendAsApp(dev.url, "recall", "spoiler: the butler did it");
  const id = sent.id;
  assert.ok(id, `no message id in ${JSON.stringify(sent)}`);
  const kept = await sendAsApp(dev.url, "recall", "this one stays");
  await waitFor("the danmaku on the stage", () => onStage(id), 5000);
  await waitFor("the second message in the log", async () => (await logBody(kept.id)) === "this one stays", 5000);

  const answer = await api(dev.url, "DELETE", `/v1/rooms/recall/messages/${id}`);
  assert.equal(answer.already_recalled, false);
  await waitFor("the recalled danmaku off the stage", async () => !(await onStage(id)), 3000);
  assert.equal(await logBody(id), "(recalled)");
  assert.equal(await logBody(kept.id), "this one stays");
  assert.match(await page.textContent("#log"), /A message was recalled by the app/);

  // A page that joins after the recall never shows it: history leaves it out.
  const later = await open("latecomer", "recall");
  await waitFor("the later page's history", async () => (await bodies(later)).includes("this one stays"), 5000);
  assert.ok(!(await bodies(later)).includes("spoiler: the butler did it"), "the recalled message came back in history");
  assert.deepEqual([...page.problems, ...later.problems], []);
  await page.close();
  await later.close();
});

test("a page without WebSocket chats through the HTTP fallback", async () => {
  const blocked = await browser.context.newPage();
  await blocked.addInitScript(() => {
    delete window.WebSocket;
  });
  await blocked.goto(`${dev.url}/?uid=nows&room=fallback&join=1`);
  await waitFor("connected without WebSocket", async () => (await blocked.textContent("#st-state")) === "connected");
  assert.equal(await blocked.evaluate(() => typeof WebSocket), "undefined");
  assert.match(await blocked.textContent("#st-transport"), /SSE/);
  const other = await open("withws", "fallback");
  await say(other, "can you hear me");
  await waitFor("the fallback page receives", async () => (await bodies(blocked)).includes("can you hear me"));
  await say(blocked, "loud and clear");
  await waitFor("the fallback page sends", async () => (await bodies(other)).includes("loud and clear"));
  const failed = await blocked.locator("#log li.failed").count();
  assert.equal(failed, 0, "the send was acknowledged");
  await blocked.close();
  await other.close();
});

test("the page follows a draining ChatLink to another one, every message once and in order", async () => {
  const page = await open("mover", "drain");
  await throughAnOutage(page, "drain", (node) => dev.drain(node, "300ms"));
  const got = await ids(page);
  assert.deepEqual(got, [...got].sort(), "in id order");
  await page.close();
});

test("a page whose ChatLink stops reconnects and recovers what it missed", async () => {
  const page = await open("survivor", "outage");
  // A long spread and a short deadline: the node closes the page (SHUTDOWN) long before the
  // page's turn to move, so the page is away for its reconnect backoff and must recover.
  await throughAnOutage(page, "outage", (node) => dev.drain(node, "600s", "300ms"));
  const log = await page.textContent("#log");
  assert.match(log, /4500 SHUTDOWN/, "the close code is named");
  const recovered = Number(log.match(/Recovered (\d+) messages? missed while away/)?.[1]);
  assert.ok(recovered > 0, `recovered ${recovered} (log: ${log})`);
  await page.close();
});

test("a room whose budget thins a burst: the page notes what was left out", async () => {
  await api(dev.url, "POST", "/v1/rooms", { room: "thin", settings: { normal_budget: 2 } });
  const page = await open("thinned", "thin");
  await Promise.all(Array.from({ length: 15 }, (_, i) => sendAsApp(dev.url, "thin", `burst ${i}`, "normal")));
  const note = await waitFor("the thinned note", async () => (await page.textContent("#log")).match(/Thinned: (\d+) messages? left out[^)]*\)/), 5000);
  const counts = async () => [(await bodies(page)).filter((b) => b.startsWith("burst")).length, Number(await page.textContent("#st-thinned"))];
  // What arrived and what the counts left out make the burst (the kept ones are spread over a second).
  await waitFor("delivered + left out = 15", async () => (await counts()).reduce((a, b) => a + b) === 15, 5000);
  const [got, left] = await counts();
  console.log(`# ${note[0]}; ${got} of 15 delivered`);
  assert.ok(left > 0 && got < 15, `${left} left out, ${got} delivered`);
  assert.deepEqual(page.problems, []);
  await page.close();
});

test("a room pinned to CDN bulk mode: bulk danmaku come by segments and fly across the stage", async () => {
  const page = await open("viewer", "cdnroom");
  // Pinned while the page is in the room: the mode reaches it live, in a CdnConfig frame.
  await api(dev.url, "PUT", "/v1/rooms/cdnroom/cdn", { mode: "CDN_MODE_BULK" });
  await waitFor("the page in CDN mode", async () => (await page.textContent("#st-cdn")).startsWith("bulk"), 10000);
  // The page may be in CDN mode a moment before the room service routes the room's bulk lane
  // to its pusher (docs/protocol.md: around a change a message may come either way): warm up
  // until a message comes by a segment, and let every warm-up message arrive.
  const cdnStats = async () => JSON.parse((await page.getAttribute("#st-cdn", "title")) || "{}");
  let warm = 0;
  await waitFor("a bulk message by segment", async () => {
    await sendAsApp(dev.url, "cdnroom", `warm-up ${warm++}`, "bulk");
    return ((await cdnStats()).messages ?? 0) >= 1;
  }, 15000, 250);
  await waitFor("every warm-up message", async () => (await bodies(page)).filter((b) => b.startsWith("warm-up")).length === warm, 10000);
  // The page refreshes its CDN stats every 500 ms: read them once two reads 600 ms apart agree.
  const settledCount = async () => {
    for (;;) {
      const a = (await cdnStats()).messages;
      await new Promise((r) => setTimeout(r, 600));
      if ((await cdnStats()).messages === a) return a;
    }
  };
  const before = await settledCount();
  const sent = [];
  for (let i = 0; i < 20; i++) {
    sent.push(`via cdn ${i}`);
    await sendAsApp(dev.url, "cdnroom", sent.at(-1), "bulk");
    await new Promise((r) => setTimeout(r, 50));
  }
  await waitFor("every bulk message", async () => (await bodies(page)).filter((b) => b.startsWith("via cdn")).length === 20, 10000);
  assert.deepEqual((await bodies(page)).filter((b) => b.startsWith("via cdn")), sent, "once each, in order");
  await waitFor("the stats to count twenty more", async () => (await cdnStats()).messages - before >= 20, 5000);
  await settledCount();
  const stats = await cdnStats();
  console.log(`# cdn: ${JSON.stringify(stats)}`);
  assert.ok(stats.hits >= 1 && stats.messages - before === 20, `${stats.messages - before} of twenty came by segments`);
  assert.equal(stats.invalid + stats.errors, 0);
  assert.ok((await page.locator("#stage .danmaku.bulk").count()) >= 1, "on the stage");
  assert.match(await page.textContent("#log"), /bulk danmaku come by CDN segments/);
  assert.deepEqual(page.problems, []);
  await page.close();
});
