// The browser tests' harness, shared by the web SDK's (sdk/web), the demo page's
// (cmd/roomcast/web) and the ops console's (console) tests: a real `roomcast dev` on free
// loopback ports, Debian's chromium driven by playwright-core, and the dev deployment's API.

import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

/** repo is the repository's root. */
export const repo = join(dirname(fileURLToPath(import.meta.url)), "../../..");

/** @type {string | undefined} */
let built;

/**
 * roomcastBinary builds cmd/roomcast once (the Go build cache makes this quick) and returns its
 * path; $ROOMCAST_BIN names a binary built already.
 * @returns {string}
 */
export function roomcastBinary() {
  if (process.env.ROOMCAST_BIN) return process.env.ROOMCAST_BIN;
  if (!built) {
    const dir = mkdtempSync(join(tmpdir(), "roomcast-bin-"));
    built = join(dir, "roomcast");
    execFileSync("go", ["build", "-o", built, "./cmd/roomcast"], { cwd: repo, stdio: "inherit" });
  }
  return built;
}

/**
 * startDev runs `roomcast dev` on free loopback ports and resolves once its banner is printed,
 * with its URL, its NATS URL and the ChatLinks' WebSocket URLs. stop() ends it and waits.
 * @param {string[]} args more flags of `roomcast dev`
 */
export async function startDev(args = []) {
  const data = mkdtempSync(join(tmpdir(), "roomcast-dev-"));
  const proc = spawn(roomcastBinary(), ["dev", "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--data", data, ...args], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "", err = "";
  proc.stderr.on("data", (b) => (err += b));
  const exited = new Promise((resolve) => proc.on("exit", (code) => resolve(code)));
  /** @type {string} */
  const banner = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`roomcast dev did not start in 30 s:\n${out}\n${err}`)), 30000);
    proc.stdout.on("data", (b) => {
      out += b;
      if (out.includes("Ctrl-C stops.")) {
        clearTimeout(timer);
        resolve(out);
      }
    });
    exited.then((code) => reject(new Error(`roomcast dev exited with ${code}:\n${out}\n${err}`)));
  });
  const url = /** @type {string} */ (banner.match(/demo page\s+(\S+)\//)?.[1]);
  const nats = /** @type {string} */ (banner.match(/NATS\s+(\S+)/)?.[1]);
  const chatlinks = Object.fromEntries([...banner.matchAll(/chatlink (\S+)\s+(\S+)/g)].map((m) => [m[1], m[2]]));
  return {
    url, nats, chatlinks, data,
    log: () => err,
    /**
     * drain asks ChatLink node to hand its clients to the other nodes and stop (`roomcast drain`).
     * @param {string} node
     */
    drain(node, spread = "200ms", deadline = "0s") {
      return execFileSync(roomcastBinary(), ["drain", "--nats", nats, "--node", node, "--spread", spread, "--deadline", deadline], { encoding: "utf8" });
    },
    async stop() {
      proc.kill("SIGINT");
      const timer = setTimeout(() => proc.kill("SIGKILL"), 10000);
      await exited;
      clearTimeout(timer);
      rmSync(data, { recursive: true, force: true });
    },
  };
}

/**
 * launchChromium starts Debian's chromium ($CHROMIUM, default /usr/bin/chromium) headless with a
 * fresh profile, and extra flags.
 * @param {string[]} extraArgs
 */
export async function launchChromium(extraArgs = []) {
  const profile = mkdtempSync(join(tmpdir(), "roomcast-chromium-"));
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync", ...extraArgs],
    viewport: { width: 1280, height: 800 },
  });
  return {
    context: browser,
    async close() {
      await browser.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

/**
 * mintToken asks the dev deployment for a token (the dev-only /v1/dev/token).
 * @param {string} url the deployment's URL
 * @param {string} uid
 * @param {string} room
 * @returns {Promise<string>}
 */
export async function mintToken(url, uid, room) {
  const res = await fetch(`${url}/v1/dev/token?uid=${uid}&room=${room}`);
  return (await res.json()).token;
}

/**
 * api calls the server API (docs/api.md) with the dev key and returns the JSON answer.
 * @param {string} url the deployment's URL
 * @param {string} method
 * @param {string} path
 * @param {unknown} [body]
 * @returns {Promise<any>}
 */
export async function api(url, method, path, body) {
  const res = await fetch(`${url}${path}`, {
    method,
    headers: { Authorization: "Bearer roomcast-dev-key", "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`server API: ${method} ${path}: HTTP ${res.status}: ${await res.text()}`);
  return res.json();
}

/**
 * sendAsApp sends a message to room through the server API.
 * @param {string} url the deployment's URL
 * @param {string} room
 * @param {string} body
 */
export function sendAsApp(url, room, body, lane = "normal") {
  return api(url, "POST", `/v1/rooms/${room}/messages`, { body, lane });
}

/**
 * waitFor polls fn until it returns a truthy value, and returns it, or throws once timeoutMs
 * passed; what fn throws counts as a falsy answer.
 * @template T
 * @param {string} what
 * @param {() => T | Promise<T>} fn
 * @returns {Promise<NonNullable<T>>}
 */
export async function waitFor(what, fn, timeoutMs = 10000, everyMs = 50) {
  const end = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`timed out waiting for ${what} (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** @typedef {Awaited<ReturnType<typeof startDev>>} Dev a running `roomcast dev` */
/** @typedef {Awaited<ReturnType<typeof launchChromium>>} Browser a running chromium */
