// The page side of bench/decode.mjs: the web SDK's receive path, fed pre-encoded Push frames by
// a stand-in WebSocket, so that what is timed is the SDK (decoding, de-duplication, ordering,
// events) and not a network.

import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Client, Lane } from "../src/index.js";
import { FrameSchema } from "../src/gen/client_pb.js";
import { MessageSchema } from "../src/gen/message_pb.js";

/** pushFrames encodes frames Push frames of perFrame messages with bodies of bodyBytes. */
function pushFrames(frames: number, perFrame: number, bodyBytes: number): Uint8Array[] {
  const body = new TextEncoder().encode("x".repeat(bodyBytes));
  const out: Uint8Array[] = [];
  let n = 0;
  for (let f = 0; f < frames; f++) {
    const messages = [];
    for (let i = 0; i < perFrame; i++, n++) {
      messages.push(create(MessageSchema, {
        id: "01J" + n.toString(32).padStart(23, "0"), room: "bench", sender: "user-" + (n % 1000), type: "chat",
        lane: Lane.BULK, body, serverTimeMs: BigInt(1_760_000_000_000 + n),
      }));
    }
    out.push(toBinary(FrameSchema, create(FrameSchema, { kind: { case: "push", value: { messages } } })));
  }
  return out;
}

/** A stand-in WebSocket: it answers the Login and lets the bench hand frames to the client. */
class BenchSocket {
  static current: BenchSocket;
  binaryType = "arraybuffer";
  readyState = 0;
  onopen: (() => void) | null = null;
  onmessage: ((ev: { data: ArrayBuffer }) => void) | null = null;
  onclose: ((ev: { code: number; reason: string }) => void) | null = null;
  onerror: (() => void) | null = null;
  constructor() {
    BenchSocket.current = this;
    setTimeout(() => {
      this.readyState = 1;
      this.onopen?.();
    });
  }
  send(b: Uint8Array) {
    if (fromBinary(FrameSchema, b).kind.case === "login") {
      const ack = toBinary(FrameSchema, create(FrameSchema, { kind: { case: "loginAck", value: { sessionId: "bench", node: "bench", heartbeatIntervalMs: 600000 } } }));
      setTimeout(() => this.deliver(ack));
    }
  }
  deliver(b: Uint8Array) {
    this.onmessage?.({ data: b.slice().buffer });
  }
  close() {}
}

export interface Result {
  messages: number;
  ms: number;
  messagesPerSecond: number;
  decodeOnlyPerSecond: number;
}

/** run times the receive path over frames pushes of perFrame messages, bodies of bodyBytes. */
export async function run(frames: number, perFrame: number, bodyBytes: number): Promise<Result> {
  const data = pushFrames(frames, perFrame, bodyBytes);
  const total = frames * perFrame;

  // Decoding alone, as a floor under the SDK's own work; the second pass, once compiled.
  let decoded = 0, decodeMs = 0;
  for (let pass = 0; pass < 2; pass++) {
    decoded = 0;
    const t0 = performance.now();
    for (const b of data) {
      const f = fromBinary(FrameSchema, b);
      if (f.kind.case === "push") decoded += f.kind.value.messages.length;
    }
    decodeMs = performance.now() - t0;
  }
  if (decoded !== total) throw new Error(`decoded ${decoded} of ${total}`);

  const client = new Client({
    token: "e30.eyJhcHAiOiJiZW5jaCIsInVpZCI6ImIiLCJyb29tIjoiYmVuY2gifQ.x",
    endpoints: [{ node: "bench", wsUrl: "ws://bench.invalid/v1/ws" }],
    transport: "ws",
    WebSocket: BenchSocket as unknown as typeof WebSocket,
    dedupeWindow: total + 1,
  });
  let received = 0;
  client.on("message", () => received++);
  await client.connect();
  const t1 = performance.now();
  for (const b of data) BenchSocket.current.deliver(b);
  const ms = performance.now() - t1;
  client.close();
  if (received !== total) throw new Error(`received ${received} of ${total}`);
  return { messages: total, ms, messagesPerSecond: total / (ms / 1000), decodeOnlyPerSecond: total / (decodeMs / 1000) };
}
