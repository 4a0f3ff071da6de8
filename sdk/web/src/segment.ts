// The CDN segment's format on the client side (docs/cdn.md): its URL, its index, and decoding a
// fetched one. The Go counterpart is the segment package.

import { fromBinary } from "@bufbuild/protobuf";
import { type Segment, SegmentSchema } from "./gen/cdn_pb.js";
import { RoomcastError } from "./errors.js";

/** MAX_SEGMENT_BYTES is the most a segment may inflate to; a pusher's segments are far smaller. */
export const MAX_SEGMENT_BYTES = 8 << 20;

/** segmentIndex is the window of server time ms: floor(ms / windowMs). */
export function segmentIndex(serverTimeMs: number, windowMs: number): number {
  return Math.floor(serverTimeMs / windowMs);
}

/** segmentUrl fills a vendor's URL template: {app}, {room}, {window_ms} and {index}; anything else is kept. */
export function segmentUrl(template: string, app: string, room: string, windowMs: number, index: number): string {
  const v: Record<string, string> = { app, room, window_ms: String(windowMs), index: String(index) };
  return template.replace(/\{(app|room|window_ms|index)\}/g, (_, k: string) => v[k]!);
}

/** SegmentError: a fetched body is not the segment asked for (garbage, truncated, another room's, too large). */
export class SegmentError extends RoomcastError {
  override name = "SegmentError";
}

/** The segment a client asked for; decodeSegment refuses any other. */
export interface WantSegment {
  app: string;
  room: string;
  windowMs: number;
  index: number;
}

/**
 * decodeSegment reads a fetched segment: body is either the stored gzip stream or, when fetch
 * already undid the Content-Encoding (a browser always does), the protobuf bytes themselves (a
 * protobuf Segment never starts with the gzip magic 1f 8b). It rejects with a SegmentError a
 * body that inflates beyond MAX_SEGMENT_BYTES or is not a Segment, a segment of another app,
 * room, window length or index, and one holding a message without an id, of another room, or
 * with a tag expression.
 */
export async function decodeSegment(body: Uint8Array, want: WantSegment): Promise<Segment> {
  let raw = body;
  if (body.length >= 2 && body[0] === 0x1f && body[1] === 0x8b) raw = await gunzip(body);
  else if (body.length > MAX_SEGMENT_BYTES) throw new SegmentError(`segment: ${body.length} bytes, more than ${MAX_SEGMENT_BYTES}`);
  let s: Segment;
  try {
    s = fromBinary(SegmentSchema, raw);
  } catch (e) {
    throw new SegmentError(`segment: not a Segment: ${(e as Error).message}`);
  }
  if (s.app !== want.app || s.room !== want.room) {
    throw new SegmentError(`segment: of ${s.app}/${s.room}, asked for ${want.app}/${want.room}`);
  }
  if (s.windowMs !== want.windowMs || s.index !== BigInt(want.index)) {
    throw new SegmentError(`segment: ${s.windowMs}/${s.index}, asked for ${want.windowMs}/${want.index}`);
  }
  for (const m of s.messages) {
    if (!m.id) throw new SegmentError("segment: a message without an id");
    if (m.room && m.room !== want.room) throw new SegmentError(`segment: message ${m.id} of room ${m.room}`);
    if (m.tagExpr) throw new SegmentError(`segment: message ${m.id} has a tag expression`);
  }
  return s;
}

/** gunzip inflates a gzip stream with the runtime's DecompressionStream, stopping at MAX_SEGMENT_BYTES. */
async function gunzip(body: Uint8Array): Promise<Uint8Array> {
  const reader = new Blob([body as Uint8Array<ArrayBuffer>]).stream().pipeThrough(new DecompressionStream("gzip")).getReader();
  const chunks: Uint8Array[] = [];
  let n = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      n += value.length;
      if (n > MAX_SEGMENT_BYTES) {
        void reader.cancel().catch(() => {});
        throw new SegmentError(`segment: inflates beyond ${MAX_SEGMENT_BYTES} bytes`);
      }
      chunks.push(value);
    }
  } catch (e) {
    if (e instanceof SegmentError) throw e;
    throw new SegmentError(`segment: gzip: ${(e as Error).message}`);
  }
  const out = new Uint8Array(n);
  let off = 0;
  for (const c of chunks) {
    out.set(c, off);
    off += c.length;
  }
  return out;
}
