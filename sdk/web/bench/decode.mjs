// Web SDK messages received per second in Chromium: the SDK's receive path (protobuf decoding,
// de-duplication by id, ordering, one event per message) over pre-encoded Push frames.
//
//   node bench/decode.mjs [frames] [messages per frame] [body bytes]
//
// `make web-bench` runs it after installing what it needs: this package's toolchain and the
// browser harness (internal/testkit/browser, playwright-core and chromium).
//
// Defaults: 4000 frames of 50 messages with 32-byte bodies (200,000 messages), best of 3 runs.

import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";
import * as esbuild from "esbuild";
import { launchChromium } from "../../../internal/testkit/browser/dev.mjs";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");

/** measure runs the bench page in chromium and returns the best of runs. */
export async function measure(frames = 4000, perFrame = 50, bodyBytes = 32, runs = 3) {
  const bundle = await esbuild.build({
    entryPoints: [join(root, "bench/receive.ts")], bundle: true, format: "iife", globalName: "bench",
    target: "es2022", minify: true, write: false,
  });
  const browser = await launchChromium();
  try {
    const page = await browser.context.newPage();
    await page.setContent("<!doctype html><title>roomcast web SDK bench</title>");
    await page.addScriptTag({ content: bundle.outputFiles[0].text });
    let best;
    for (let i = 0; i < runs; i++) {
      const r = await page.evaluate(([f, p, b]) => globalThis.bench.run(f, p, b), [frames, perFrame, bodyBytes]);
      if (!best || r.messagesPerSecond > best.messagesPerSecond) best = r;
    }
    best.browser = browser.context.browser()?.version() ?? "chromium";
    return best;
  } finally {
    await browser.close();
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [frames, perFrame, bodyBytes] = process.argv.slice(2).map(Number);
  const r = await measure(frames || undefined, perFrame || undefined, bodyBytes || undefined);
  const k = (n) => Math.round(n / 1000) + "k";
  console.log(`${r.browser}: ${r.messages} messages in ${r.ms.toFixed(0)} ms: ${k(r.messagesPerSecond)} messages/s through the SDK ` +
    `(decode, de-duplication, ordering, events); decoding alone ${k(r.decodeOnlyPerSecond)} messages/s`);
}
