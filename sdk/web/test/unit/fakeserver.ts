// A small WebSocket server that plays a ChatLink (or a broken one) for the unit tests, and a
// token for it. It speaks RFC 6455 itself so that a test can also send what no real server
// would: garbage, text, half a frame.

import { createHash } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { afterEach } from "node:test";
import { create, fromBinary, type MessageInitShape, toBinary } from "@bufbuild/protobuf";
import { type Frame, FrameSchema, type Login } from "../../src/gen/client_pb.js";
import { type Message, MessageSchema } from "../../src/gen/message_pb.js";
import { Client, type ClientEvents, type Config, type Endpoint } from "../../src/index.js";

/** Kind names a Frame's oneof case. */
export type Kind = NonNullable<Frame["kind"]["case"]>;
/** FrameOf is the value of a decoded Frame of case K. */
export type FrameOf<K extends Kind> = Extract<Frame["kind"], { case: K }>["value"];
/** FrameInit is what a Frame of case K is built from (any field may be left out). */
export type FrameInit<K extends Kind> = Extract<NonNullable<MessageInitShape<typeof FrameSchema>["kind"]>, { case: K }>["value"];

/** token returns an unsigned JWT with the claims the client reads. */
export function token(claims: Record<string, unknown> = { app: "demo", uid: "u1", room: "r1" }): string {
  const b64 = (o: object) => Buffer.from(JSON.stringify(o)).toString("base64url");
  return `${b64({ alg: "HS256", typ: "JWT" })}.${b64(claims)}.c2ln`;
}

/** message builds a pushed message; roomSeq numbers the room's critical and normal ones. */
export function message(id: string, timeMs: number | bigint, body: string = id, lane = 2, roomSeq: number | bigint = 0): Message {
  return create(MessageSchema, { id, room: "r1", sender: "s", type: "chat", lane, body: Buffer.from(body), serverTimeMs: BigInt(timeMs), roomSeq: BigInt(roomSeq) });
}

/** frame encodes a Frame from its oneof case and value. */
export function frame<K extends Kind>(kindCase: K, value: FrameInit<K>): Uint8Array {
  const kind = { case: kindCase, value } as MessageInitShape<typeof FrameSchema>["kind"];
  return toBinary(FrameSchema, create(FrameSchema, { kind }));
}

/** Conn is one client connection on the fake server. */
export class Conn {
  readonly socket: Socket;
  /** The client's frames, decoded, that next has not taken yet. */
  readonly frames: Frame[] = [];
  closed = false;
  /** The code of the client's close frame, once it sent one. */
  closeCode: number | undefined;
  private readonly waiters: (() => void)[] = [];
  private buf = Buffer.alloc(0);

  constructor(socket: Socket) {
    this.socket = socket;
    socket.on("data", (d: Buffer) => this.onData(d));
    socket.on("close", () => {
      this.closed = true;
      this.wake();
    });
    socket.on("error", () => {});
  }

  private onData(d: Buffer): void {
    this.buf = Buffer.concat([this.buf, d]);
    for (;;) {
      if (this.buf.length < 2) return;
      const op = this.buf[0] & 15;
      let len = this.buf[1] & 127, off = 2;
      if (len === 126) { if (this.buf.length < 4) return; len = this.buf.readUInt16BE(2); off = 4; }
      else if (len === 127) { if (this.buf.length < 10) return; len = Number(this.buf.readBigUInt64BE(2)); off = 10; }
      if (this.buf.length < off + 4 + len) return;
      const mask = this.buf.subarray(off, off + 4);
      const payload = Buffer.from(this.buf.subarray(off + 4, off + 4 + len));
      for (let i = 0; i < payload.length; i++) payload[i] ^= mask[i & 3];
      this.buf = this.buf.subarray(off + 4 + len);
      if (op === 2) this.frames.push(fromBinary(FrameSchema, payload));
      if (op === 8) {
        this.closeCode = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
        this.socket.end();
      }
      this.wake();
    }
  }

  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }

  /** next resolves with the next client frame of the given case (earlier ones of other cases are skipped). */
  async next<K extends Kind>(kindCase: K, timeoutMs = 3000): Promise<FrameOf<K>> {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const i = this.frames.findIndex((f) => f.kind.case === kindCase);
      if (i >= 0) return this.frames.splice(0, i + 1)[i].kind.value as FrameOf<K>;
      if (this.closed) throw new Error(`connection closed while waiting for ${kindCase}`);
      if (Date.now() > end) throw new Error(`no ${kindCase} within ${timeoutMs} ms`);
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, 20);
      });
    }
  }

  /** raw writes one WebSocket frame of opcode op, unmasked as a server sends it. */
  raw(op: number, payload: Uint8Array | string): void {
    const p = Buffer.from(payload);
    const head = p.length < 126 ? Buffer.from([0x80 | op, p.length])
      : p.length < 65536 ? Buffer.from([0x80 | op, 126, p.length >> 8, p.length & 255])
      : (() => { const h = Buffer.alloc(10); h[0] = 0x80 | op; h[1] = 127; h.writeBigUInt64BE(BigInt(p.length), 2); return h; })();
    if (!this.closed) this.socket.write(Buffer.concat([head, p]));
  }

  send<K extends Kind>(kindCase: K, value: FrameInit<K>): void {
    this.raw(2, frame(kindCase, value));
  }

  /** acceptLogin answers the Login with a LoginAck (ack overrides its fields) and returns the Login. */
  async acceptLogin(ack: FrameInit<"loginAck"> = {}): Promise<Login> {
    const login = await this.next("login");
    this.send("loginAck", { sessionId: "s-" + Math.random().toString(36).slice(2, 8), node: "fake", room: "r1", uid: "u1", app: "demo", heartbeatIntervalMs: 25000, ...ack });
    return login;
  }

  /** close sends a Kick (if code is a Roomcast code) and a close frame, then ends the socket. */
  close(code: number, reason = ""): void {
    if (code >= 4000) this.send("kick", { code, reason });
    const p = Buffer.alloc(2 + Buffer.byteLength(reason));
    p.writeUInt16BE(code, 0);
    p.write(reason, 2);
    this.raw(8, p);
    this.socket.end();
  }

  /** drop ends the TCP connection without a close frame. */
  drop(): void {
    this.socket.destroy();
  }
}

/** OnConn is called with each connection and its number (from 1); what it throws is ignored. */
export type OnConn = (conn: Conn, n: number) => unknown;

/** FakeServer is a fake ChatLink on a loopback port. */
export interface FakeServer {
  /** ws://127.0.0.1:PORT/v1/ws */
  url: string;
  /** every connection so far */
  conns: Conn[];
  /** the server as the client's Config.endpoints names it */
  endpoint: Endpoint;
  /** conn resolves with the n-th connection (from 1) once it exists. */
  conn(n: number, timeoutMs?: number): Promise<Conn>;
  close(): Promise<void>;
}

/** startServer listens on a free loopback port and calls onConn for each WebSocket connection. */
export async function startServer(onConn: OnConn = () => {}): Promise<FakeServer> {
  const conns: Conn[] = [];
  const waiters: (() => void)[] = [];
  const server = createServer((_req, res) => res.writeHead(404).end());
  server.on("upgrade", (req, socket: Socket) => {
    const accept = createHash("sha1").update(req.headers["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest("base64");
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`);
    socket.setNoDelay(true);
    const c = new Conn(socket);
    conns.push(c);
    for (const w of waiters.splice(0)) w();
    Promise.resolve(onConn(c, conns.length)).catch(() => {});
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const url = `ws://127.0.0.1:${(server.address() as AddressInfo).port}/v1/ws`;
  return {
    url,
    conns,
    endpoint: { node: "fake", wsUrl: url },
    async conn(n, timeoutMs = 3000) {
      const end = Date.now() + timeoutMs;
      while (conns.length < n) {
        if (Date.now() > end) throw new Error(`no connection #${n} within ${timeoutMs} ms (have ${conns.length})`);
        await new Promise<void>((r) => {
          waiters.push(r);
          setTimeout(r, 20);
        });
      }
      return conns[n - 1];
    },
    close() {
      for (const c of conns) c.socket.destroy();
      return new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/** LogEntry is one event of a harness client, with when it came (Date.now()). */
export type LogEntry = { [K in keyof ClientEvents]: { type: K; ev: ClientEvents[K]; at: number } }[keyof ClientEvents];

const logged = ["connected", "message", "reconnecting", "recovered", "thinned", "kicked", "error", "closed"] as const;

/**
 * harness gives a test file its helpers: server starts a fake ChatLink and client a Client with
 * short timings that records its events in order, both closed after each test; until polls.
 */
export function harness() {
  const cleanups: (() => unknown)[] = [];
  afterEach(async () => {
    for (const f of cleanups.splice(0).reverse()) await f();
  });
  return {
    async server(onConn?: OnConn): Promise<FakeServer> {
      const s = await startServer(onConn);
      cleanups.push(() => s.close());
      return s;
    },
    client(cfg: Partial<Config> = {}) {
      const c = new Client({ token: token(), attemptTimeoutMs: 1000, reconnectMinDelayMs: 50, reconnectMaxDelayMs: 400, recoveryWaitMs: 300, ...cfg });
      const log: LogEntry[] = [];
      for (const type of logged) c.on(type, (ev) => log.push({ type, ev, at: Date.now() } as LogEntry));
      cleanups.push(() => c.close());
      /** of returns the client's events of one type so far, in order. */
      const of = <K extends keyof ClientEvents>(type: K): ClientEvents[K][] =>
        log.filter((e) => e.type === type).map((e) => e.ev as ClientEvents[K]);
      return { c, log, of };
    },
    until,
    /** defer runs f after the test. */
    defer(f: () => unknown): void {
      cleanups.push(f);
    },
  };
}

/** until polls fn every 10 ms until it returns true, or throws after timeoutMs. */
export async function until(what: string, fn: () => boolean, timeoutMs = 3000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Logged is a LogEntry of one event type. */
export type Logged<K extends keyof ClientEvents> = Extract<LogEntry, { type: K }>;
