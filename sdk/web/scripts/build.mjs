// Builds the package (dist/: ES modules and type declarations) and prints the SDK's size
// minified and gzipped without the protobuf runtime; fails if that is over its goal.
//
//   node scripts/build.mjs

import { execFileSync } from "node:child_process";
import { rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import * as esbuild from "esbuild";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const goalGzipBytes = 25 * 1024;

rmSync(join(root, "dist"), { recursive: true, force: true });
execFileSync(process.execPath, [join(root, "node_modules/typescript/bin/tsc"), "-p", root], { stdio: "inherit" });

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

