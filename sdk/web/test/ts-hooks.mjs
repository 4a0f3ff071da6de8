// Module hooks (registered by register.mjs) that load TypeScript with esbuild's transform: each
// .ts file is compiled alone, so the package's sources keep to what that allows (tsconfig's
// isolatedModules says so). Imports name a TypeScript file by the .js it compiles to, as tsc
// wants: such an import of a file that exists only as .ts loads the .ts.

import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { transform } from "esbuild";

export async function resolve(specifier, context, nextResolve) {
  try {
    return await nextResolve(specifier, context);
  } catch (err) {
    if (err?.code !== "ERR_MODULE_NOT_FOUND" || !/^\.\.?\//.test(specifier) || !specifier.endsWith(".js")) throw err;
    return nextResolve(specifier.slice(0, -3) + ".ts", context);
  }
}

export async function load(url, context, nextLoad) {
  if (!url.startsWith("file:") || !url.endsWith(".ts")) return nextLoad(url, context);
  const path = fileURLToPath(url);
  const { code } = await transform(await readFile(path, "utf8"), {
    loader: "ts", format: "esm", target: "es2022", sourcefile: path, sourcemap: "inline",
    // As tsc compiles for ES2022 (tsconfig.json): class fields with define semantics.
    tsconfigRaw: { compilerOptions: { useDefineForClassFields: true } },
  });
  return { format: "module", source: code, shortCircuit: true };
}
