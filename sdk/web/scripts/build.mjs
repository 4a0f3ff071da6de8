// Builds the package (dist/: ES modules and type declarations), the demo page's bundle
// (cmd/roomcast/web/demo.js, committed: `roomcast dev` serves it without npm) and prints the
// SDK's size minified and gzipped without the protobuf runtime.
//
//   node scripts/build.mjs            build everything
//   node scripts/build.mjs --check    also fail if the committed demo bundle differs from the build

import { execFileSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import * as esbuild from "esbuild";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const demoDir = join(root, "../../cmd/roomcast/web");
const check = process.argv.includes("--check");
const goalGzipBytes = 25 * 1024;

rmSync(join(root, "dist"), { recursive: true, force: true });
execFileSync(process.execPath, [join(root, "node_modules/typescript/bin/tsc"), "-p", root], { stdio: "inherit" });
execFileSync(process.execPath, [join(root, "node_modules/typescript/bin/tsc"), "-p", join(root, "tsconfig.pages.json")], { stdio: "inherit" });

const common = { bundle: true, format: "esm", target: "es2022", minify: true, write: false, legalComments: "none" };

// The SDK alone, the way an app's bundler sees it: the protobuf runtime is the app's dependency.
const sdk = await esbuild.build({ ...common, entryPoints: [join(root, "src/index.ts")], external: ["@bufbuild/protobuf"] });
const min = sdk.outputFiles[0].contents;
const gz = gzipSync(min, { level: 9 }).length;
writeFileSync(join(root, "dist/roomcast.min.js"), min);
const kb = (n) => (n / 1024).toFixed(1) + " KB";
console.log(`sdk bundle (without @bufbuild/protobuf): ${kb(min.length)} minified, ${kb(gz)} minified+gzipped (goal ≤ ${kb(goalGzipBytes)})`);
if (gz > goalGzipBytes) {
  console.error("sdk bundle is over its size goal");
  process.exit(1);
}

// The demo page's script, with everything it needs.
const demo = await esbuild.build({ ...common, entryPoints: [join(demoDir, "demo.ts")] });
const demoJs = demo.outputFiles[0].contents;
console.log(`demo bundle (SDK, protobuf runtime, page): ${kb(demoJs.length)} minified, ${kb(gzipSync(demoJs, { level: 9 }).length)} gzipped`);
const demoPath = join(demoDir, "demo.js");
if (check) {
  let committed = Buffer.alloc(0);
  try {
    committed = readFileSync(demoPath);
  } catch {
    // missing: differs
  }
  if (!committed.equals(Buffer.from(demoJs))) {
    console.error(`${demoPath} is not what the build produces: run 'make web-build' and commit it`);
    process.exit(1);
  }
} else {
  writeFileSync(demoPath, demoJs);
}
