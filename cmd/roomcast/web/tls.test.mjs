// The demo over https:// and wss://: `roomcast dev` with a certificate from a throwaway CA that
// chromium is told to trust (by the CA's public key), as a page served over TLS sees it.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { launchChromium, startDev, waitFor } from "../../../internal/testkit/browser/dev.mjs";

let dir, dev, browser;

/** makeCA writes a CA and a certificate it signed for 127.0.0.1 and localhost; it returns the files and the CA's SPKI hash. */
function makeCA(dir) {
  const ssl = (...args) => execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "pipe", "pipe"] });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  ssl("req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=roomcast test CA");
  ssl("req", ...ec, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=localhost");
  writeFileSync(join(dir, "leaf.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n");
  ssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "leaf.crt", "-days", "2", "-extfile", "leaf.ext");
  writeFileSync(join(dir, "chain.crt"), Buffer.concat([readFileSync(join(dir, "leaf.crt")), readFileSync(join(dir, "ca.crt"))]));
  const spki = ssl("x509", "-in", "ca.crt", "-noout", "-pubkey");
  const der = execFileSync("openssl", ["pkey", "-pubin", "-outform", "der"], { input: spki });
  const hash = execFileSync("openssl", ["dgst", "-sha256", "-binary"], { input: der }).toString("base64");
  return { cert: join(dir, "chain.crt"), key: join(dir, "leaf.key"), spki: hash };
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "roomcast-tls-"));
  const ca = makeCA(dir);
  dev = await startDev(["--chatlinks", "1", "--tls-cert", ca.cert, "--tls-key", ca.key]);
  browser = await launchChromium([`--ignore-certificate-errors-spki-list=${ca.spki}`]);
});

after(async () => {
  await browser?.close();
  await dev?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test("pages served over https chat over wss", async () => {
  assert.match(dev.url, /^https:\/\//);
  const sockets = [];
  const pages = [];
  for (const uid of ["tls-a", "tls-b"]) {
    const page = await browser.context.newPage();
    page.on("websocket", (ws) => sockets.push(ws.url()));
    await page.goto(`${dev.url}/?uid=${uid}&room=secure&join=1`);
    await waitFor(`${uid} connected`, async () => (await page.textContent("#st-state")) === "connected");
    assert.equal(await page.textContent("#st-transport"), "WebSocket");
    pages.push(page);
  }
  assert.ok(sockets.length >= 2 && sockets.every((u) => u.startsWith("wss://")), `sockets ${sockets}`);
  await pages[0].fill("#text", "over tls");
  await pages[0].press("#text", "Enter");
  await waitFor("the other page hears it", async () =>
    (await pages[1].$$eval("#log li.msg .body", (els) => els.map((e) => e.textContent))).includes("over tls"));
  // chromium's TLS (BoringSSL) against the ChatLink's own record layer: the pages' sockets are
  // served by it, none left to crypto/tls (docs/edge.md).
  const metrics = await browser.context.newPage();
  await metrics.goto(`${dev.url}/metrics`);
  const text = await metrics.textContent("body");
  assert.match(text, /roomcast_chatlink_tls_connections_total\{node="[^"]+",record_layer="roomcast"\} [1-9]/);
  assert.doesNotMatch(text, /record_layer="crypto_tls"\} [1-9]/);
});
