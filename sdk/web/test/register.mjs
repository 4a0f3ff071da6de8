// Lets node run the TypeScript tests as they are, with no build step: `node --import
// ./test/register.mjs --test test/unit/*.test.ts`. tsc checks their types (test/tsconfig.json);
// this only strips them (ts-hooks.mjs). Node 22.6 and later can strip types themselves, but
// the package supports Node 20.

import { register } from "node:module";

register("./ts-hooks.mjs", import.meta.url);
