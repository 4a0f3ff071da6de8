// The ops console (/console) in Debian's chromium against a real `roomcast dev` with two
// labelled ChatLinks, while `roomcast bench fanout` keeps a room busy on every lane, beyond the
// nodes' egress capacity: both nodes with their region and ISP, the busy room with its members,
// and charts that move, deliveries and flow control's drops per lane among them.
//
// SCREENSHOTS=1 also writes docs/console.png (the one docs/operations.md shows).

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { launchChromium, repo, roomcastBinary, startDev, waitFor } from "../internal/testkit/browser/dev.mjs";

let dev, browser, bench;

before(async () => {
  dev = await startDev(["--chatlinks", "2", "--egress-capacity", "600000",
    "--node-label", "cl-1=AS/CN/22:unicom", "--node-label", "cl-2=AS/CN/11:China Telecom"]);
  browser = await launchChromium();
});

after(async () => {
  bench?.kill("SIGINT");
  await browser?.close();
  await dev?.stop();
});

/** runBench starts `roomcast bench fanout` on room for seconds; resolves with its exit code. */
function runBench(room, seconds) {
  bench = spawn(roomcastBinary(), ["bench", "fanout", "--dispatcher", dev.url, "--room", room, "--client", "raw", "--lane", "mix",
    "--n", "60", "--rate", "40", "--size", "600", "--pause", "0s", "--duration", `${seconds}s`], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  bench.stdout.on("data", (b) => (out += b));
  bench.stderr.on("data", (b) => (out += b));
  return new Promise((resolve) => bench.on("exit", (code) => resolve({ code, out })));
}

/** chart returns how many points the chart of node and measure has, its last value and its highest. */
const chart = (page, node, measure) => page.$eval(`.chart[data-node="${node}"][data-measure="${measure}"]`,
  (d) => ({ points: Number(d.dataset.points), last: Number(d.dataset.last), peak: Number(d.dataset.peak) }));

test("the console shows both nodes, the busy room and moving charts", async () => {
  const page = await browser.context.newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push(e));
  await page.goto(`${dev.url}/console`);

  // Without a key, nothing is shown; a key without the admin scope would be refused the same way.
  await waitFor("the key prompt", async () => (await page.textContent("#status")).includes("API key"));
  await page.fill("#key", "roomcast-dev-key");
  await page.dispatchEvent("#key", "change");

  await waitFor("both nodes with their labels", async () => {
    const rows = await page.$$eval("#nodes tbody tr", (trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent)));
    return rows.length === 2 && rows[0][0] === "cl-1" && rows[0][1] === "AS/CN/22" && rows[0][2] === "unicom" &&
      rows[1][0] === "cl-2" && rows[1][1] === "AS/CN/11" && rows[1][2] === "telecom";
  });

  const done = runBench("console-busy", 8);
  const busy = await waitFor("the busy room with its 60 members", async () => {
    const online = await page.$eval('#rooms tr[data-room="console-busy"] .online', (td) => Number(td.textContent)).catch(() => 0);
    return online === 60 && online;
  }, 20000);
  assert.equal(busy, 60);

  // The charts move while messages flow: more points, and egress above zero on some node.
  const before = await chart(page, "cl-1", "connections");
  await waitFor("egress on the charts", async () => {
    const e1 = await chart(page, "cl-1", "egress_bytes_per_sec"), e2 = await chart(page, "cl-2", "egress_bytes_per_sec");
    return e1.last + e2.last > 0;
  }, 15000);
  // Deliveries per lane while messages flow, and the drops of flow control holding the nodes
  // near their capacity (normal and bulk; critical messages are never dropped).
  await waitFor("deliveries and drops on the lane charts", async () => {
    const d1 = await chart(page, "cl-1", "deliveries"), d2 = await chart(page, "cl-2", "deliveries");
    const x1 = await chart(page, "cl-1", "drops"), x2 = await chart(page, "cl-2", "drops");
    const f1 = await chart(page, "cl-1", "drops_budget"), f2 = await chart(page, "cl-2", "drops_budget");
    return d1.last + d2.last > 0 && x1.peak + x2.peak > 0 && f1.points > 0 && f2.points > 0;
  }, 15000);
  const later = await chart(page, "cl-1", "connections");
  assert.ok(later.points > before.points, `chart points ${before.points} -> ${later.points}`);
  const c1 = await chart(page, "cl-1", "connections"), c2 = await chart(page, "cl-2", "connections");
  assert.equal(c1.last + c2.last, 60);
  if (process.env.SCREENSHOTS) await page.waitForTimeout(4000); // a few more points on the charts
  if (process.env.SCREENSHOTS) await page.screenshot({ path: join(repo, "docs/console.png"), fullPage: true });

  const { code, out } = await done;
  assert.equal(code, 0, out);

  // Moderation through the server API: mute the busy room from its row.
  await page.click('#rooms tr[data-room="console-busy"] button[data-mute]');
  await waitFor("the mute answer", async () => (await page.textContent("#modlog")).includes("mute console-busy: {"));
  assert.deepEqual(problems, []);
  await page.close();
});
