// Builds the demo page's script: type-checks demo.ts against the web SDK's declarations, then
// bundles it with the SDK and the protobuf runtime into demo.js, which is committed (`roomcast
// dev` serves it, go:embed, with no npm). The SDK is the package in node_modules/@roomcast/web,
// a link to sdk/web: build it first (`make web-build`); `make demo-build` does both.
//
//   node build.mjs            write demo.js
//   node build.mjs --check    fail if the committed demo.js differs from the build

import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import * as esbuild from "esbuild";

const dir = dirname(fileURLToPath(import.meta.url));
const check = process.argv.includes("--check");

if (!existsSync(join(dir, "node_modules/@roomcast/web/dist/index.js"))) {
  console.error("the web SDK is not built: run 'make demo-build' (or 'make web-build', then this)");
  process.exit(1);
}
execFileSync(process.execPath, [join(dir, "node_modules/typescript/bin/tsc"), "-p", dir], { stdio: "inherit" });

const demo = await esbuild.build({
  entryPoints: [join(dir, "demo.ts")], bundle: true, format: "esm", target: "es2022", minify: true, write: false, legalComments: "none",
});
const js = demo.outputFiles[0].contents;
const kb = (n) => (n / 1024).toFixed(1) + " KB";
console.log(`demo bundle (SDK, protobuf runtime, page): ${kb(js.length)} minified, ${kb(gzipSync(js, { level: 9 }).length)} gzipped`);

const out = join(dir, "demo.js");
if (check) {
  const committed = existsSync(out) ? readFileSync(out) : Buffer.alloc(0);
  if (!committed.equals(Buffer.from(js))) {
    console.error(`${out} is not what the build produces: run 'make demo-build' and commit it`);
    process.exit(1);
  }
} else {
  writeFileSync(out, js);
}
