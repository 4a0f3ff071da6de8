// A fake CDN for the unit tests: a pusher that writes a room's segments as its windows end, on a
// server clock that may be off ours, and a fetch that serves them from vendors that may fail.

import { gzipSync } from "node:zlib";
import { create, type MessageInitShape, toBinary } from "@bufbuild/protobuf";
import { type CdnConfig, CdnConfigSchema, SegmentSchema } from "../../src/gen/cdn_pb.js";
import type { Message } from "../../src/gen/message_pb.js";
import { CdnMode } from "../../src/index.js";

/** Vendor is a CDN vendor of a CdnConfig: its URL template, weight and regions. */
export interface Vendor {
  template: string;
  weight?: number;
  regions?: string[];
}

/** How a fake vendor answers: with the segment, HTTP 500, a network error, or bytes that are no segment. */
export type Behaviour = "ok" | "500" | "down" | "garbage";

/** CdnOptions configure startCdn. */
export interface CdnOptions {
  windowMs?: number;
  offsetMs?: number;
  graceMs?: number;
  vendors?: Record<string, Behaviour>;
}

/** encodeSegment returns a segment as stored: protobuf, gzip-compressed. */
export function encodeSegment(fields: MessageInitShape<typeof SegmentSchema>): Uint8Array<ArrayBuffer> {
  return gzipSync(toBinary(SegmentSchema, create(SegmentSchema, fields)));
}

/** cdnConfig builds a CdnConfig in bulk mode for vendors ({url_template, weight}). */
export function cdnConfig(windowMs: number, vendors: Vendor[], mode: CdnMode = CdnMode.BULK): CdnConfig {
  return create(CdnConfigSchema, {
    mode, windowMs, pollIntervalMs: windowMs, pollJitterMs: Math.round(windowMs / 10),
    vendors: vendors.map((v) => ({ urlTemplate: v.template, weight: v.weight ?? 1, regions: v.regions ?? [] })),
  });
}

/**
 * startCdn writes segments of app "demo", room "r1" every windowMs on a server clock offsetMs
 * ahead of ours, from the window now on: a window's segment appears graceMs after its end, empty
 * if quiet. add(message) puts a message in the window of its server time. Indexes in `never`
 * are not written, nor any after `lastIndex` once it is set (a room that left CDN mode);
 * `bodies` overrides what an index serves.
 *
 * fetch serves {base}/demo/r1/{window}/{index} for the bases in `vendors` (name -> behaviour:
 * "ok", "500", "down" for a network error, "garbage"); calls records every request.
 */
export function startCdn({ windowMs = 200, offsetMs = 0, graceMs = 30, vendors = { "http://cdn-a": "ok" } }: CdnOptions = {}) {
  const serverNow = () => Date.now() + offsetMs;
  const written = new Map<number, Uint8Array<ArrayBuffer>>(); // index -> body
  const pending = new Map<number, Message[]>(); // index -> messages
  const never = new Set<number>();
  const bodies = new Map<number, Uint8Array<ArrayBuffer>>();
  const calls: { url: string; at: number }[] = [];
  let next = Math.floor(serverNow() / windowMs);
  const cdn = { lastIndex: Infinity };
  const timer = setInterval(() => {
    while ((next + 1) * windowMs + graceMs <= serverNow()) {
      if (!never.has(next) && next <= cdn.lastIndex) {
        const messages = (pending.get(next) ?? []).sort((a, b) => (a.serverTimeMs < b.serverTimeMs ? -1 : a.serverTimeMs > b.serverTimeMs ? 1 : 0));
        written.set(next, encodeSegment({ app: "demo", room: "r1", windowMs, index: BigInt(next), messages, nextAtMs: BigInt((next + 2) * windowMs + graceMs) }));
      }
      pending.delete(next);
      next++;
    }
  }, 10);
  const fetch = async (input: string | URL | Request): Promise<Response> => {
    const url = String(input);
    calls.push({ url, at: Date.now() });
    const m = /^(https?:\/\/[^/]+)\/demo\/r1\/(\d+)\/(-?\d+)$/.exec(url);
    const how = m && vendors[m[1]!];
    if (!m || !how) return new Response("no such vendor", { status: 404 });
    if (how === "down") throw new TypeError("fetch failed");
    if (how === "500") return new Response("upstream broke", { status: 500 });
    if (how === "garbage") return new Response(new Uint8Array([0xff, 0xff, 0xff, 0x0f, 0x01]));
    const index = Number(m[3]);
    if (Number(m[2]) !== windowMs) return new Response("not found", { status: 404 });
    const body = bodies.get(index) ?? written.get(index);
    if (!body) return new Response("not found", { status: 404 });
    return new Response(body, { headers: { "Content-Type": "application/x-protobuf" } });
  };
  return Object.assign(cdn, {
    fetch, calls, never, bodies, serverNow, windowMs,
    /** the indexes asked for, in order */
    indexes: () => calls.map((c) => Number(c.url.split("/").at(-1))),
    add(msg: Message) {
      const i = Math.floor(Number(msg.serverTimeMs) / windowMs);
      if (!pending.has(i)) pending.set(i, []);
      pending.get(i)!.push(msg);
    },
    config(mode?: CdnMode) {
      return cdnConfig(windowMs, Object.keys(vendors).map((b) => ({ template: `${b}/{app}/{room}/{window_ms}/{index}` })), mode);
    },
    stop: () => clearInterval(timer),
  });
}
