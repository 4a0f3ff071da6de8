// The packed tarball as an app would use it: `npm pack`, installed in a blank project, which
// type-checks against it and chats through a real `roomcast dev` in node.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";
import { type Dev, mintToken, startDev } from "../../../../internal/testkit/browser/dev.mjs";

const sdk = join(dirname(fileURLToPath(import.meta.url)), "../..");
const tsc = join(sdk, "node_modules/typescript/bin/tsc");
let dev: Dev, dir: string;

before(async () => {
  dev = await startDev(["--chatlinks", "1"]);
  dir = mkdtempSync(join(tmpdir(), "roomcast-pack-"));
});

after(async () => {
  await dev?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const app = `import { Client, CloseError, Lane, type Message } from "@roomcast/web";

declare const process: { argv: string[] }; // without @types/node: the package must not need them
const [dispatcher, tokenA, tokenB] = process.argv.slice(2);
if (!dispatcher || !tokenA || !tokenB) throw new Error("usage: app DISPATCHER TOKEN_A TOKEN_B");
const a = new Client({ token: tokenA, dispatcher });
const b = new Client({ token: tokenB, dispatcher });
const received = new Promise<Message>((resolve) => b.on("message", resolve));
b.on("closed", (err) => {
  if (err instanceof CloseError) console.error("closed with", err.code);
});
await a.connect();
await b.connect();
const ack = await a.send({ body: "hello from a blank project", lane: Lane.NORMAL });
const m = await received;
console.log(JSON.stringify({ ack: ack.messageId, id: m.id, sender: m.sender, body: new TextDecoder().decode(m.body) }));
a.close();
b.close();
`;

test("npm pack gives a tarball a blank project installs, type-checks against and chats with", async () => {
  execFileSync("npm", ["pack", "--silent", "--pack-destination", dir], { cwd: sdk, stdio: ["ignore", "ignore", "inherit"] });
  const tarball = readdirSync(dir).find((f) => f.endsWith(".tgz"));
  assert.ok(tarball, "npm pack wrote a tarball");

  const project = join(dir, "app");
  mkdirSync(project);
  writeFileSync(join(project, "package.json"), JSON.stringify({ name: "blank", private: true, type: "module" }));
  writeFileSync(join(project, "tsconfig.json"), JSON.stringify({
    compilerOptions: { target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, lib: ["ES2022", "DOM"], types: [], outDir: "out" },
    files: ["app.ts"],
  }));
  writeFileSync(join(project, "app.ts"), app);
  execFileSync("npm", ["install", "--no-audit", "--no-fund", "--loglevel=error", join(dir, tarball)], { cwd: project, stdio: ["ignore", "ignore", "inherit"] });

  execFileSync(process.execPath, [tsc, "--noEmit", "-p", project], { stdio: "inherit" }); // the types an app sees
  execFileSync(process.execPath, [tsc, "-p", project], { stdio: "inherit" });

  const flags = Number(process.versions.node.split(".")[0]) < 22 ? ["--experimental-websocket"] : []; // a global WebSocket
  const out = execFileSync(process.execPath, [...flags, "--no-warnings", join(project, "out/app.js"), dev.url,
    await mintToken(dev.url, "ann", "packed"), await mintToken(dev.url, "ben", "packed")], { encoding: "utf8", timeout: 20000 });
  const got = JSON.parse(out);
  assert.equal(got.body, "hello from a blank project");
  assert.equal(got.sender, "ann");
  assert.equal(got.id, got.ack, "ben got the message ann's send was acknowledged for");
});
