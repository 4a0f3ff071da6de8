// A small WebSocket server that plays a ChatLink (or a broken one) for the unit tests, and a
// token for it. It speaks RFC 6455 itself so that a test can also send what no real server
// would: garbage, text, half a frame.

import { createHash } from "node:crypto";
import { createServer } from "node:http";
import { afterEach } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { FrameSchema } from "../../dist/gen/client_pb.js";
import { MessageSchema } from "../../dist/gen/message_pb.js";
import { Client } from "../../dist/index.js";

/** token returns an unsigned JWT with the claims the client reads. */
export function token(claims = { app: "demo", uid: "u1", room: "r1" }) {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  return `${b64({ alg: "HS256", typ: "JWT" })}.${b64(claims)}.c2ln`;
}

/** message builds a pushed message; roomSeq numbers the room's critical and normal ones. */
export function message(id, timeMs, body = id, lane = 2, roomSeq = 0) {
  return create(MessageSchema, { id, room: "r1", sender: "s", type: "chat", lane, body: Buffer.from(body), serverTimeMs: BigInt(timeMs), roomSeq: BigInt(roomSeq) });
}

/** frame encodes a Frame from its oneof case and value. */
export function frame(kindCase, value) {
  return toBinary(FrameSchema, create(FrameSchema, { kind: { case: kindCase, value } }));
}

/** Conn is one client connection on the fake server. */
class Conn {
  constructor(socket) {
    this.socket = socket;
    this.frames = []; // decoded frames from the client
    this.waiters = [];
    this.closed = false;
    this.buf = Buffer.alloc(0);
    socket.on("data", (d) => this.onData(d));
    socket.on("close", () => {
      this.closed = true;
      this.wake();
    });
    socket.on("error", () => {});
  }

  onData(d) {
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

  wake() {
    for (const w of this.waiters.splice(0)) w();
  }

  /** next resolves with the next client frame of the given case (earlier ones of other cases are skipped). */
  async next(kindCase, timeoutMs = 3000) {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const i = this.frames.findIndex((f) => f.kind.case === kindCase);
      if (i >= 0) return this.frames.splice(0, i + 1)[i].kind.value;
      if (this.closed) throw new Error(`connection closed while waiting for ${kindCase}`);
      if (Date.now() > end) throw new Error(`no ${kindCase} within ${timeoutMs} ms`);
      await new Promise((r) => {
        this.waiters.push(r);
        setTimeout(r, 20);
      });
    }
  }

  raw(op, payload) {
    const p = Buffer.from(payload);
    const head = p.length < 126 ? Buffer.from([0x80 | op, p.length])
      : p.length < 65536 ? Buffer.from([0x80 | op, 126, p.length >> 8, p.length & 255])
      : (() => { const h = Buffer.alloc(10); h[0] = 0x80 | op; h[1] = 127; h.writeBigUInt64BE(BigInt(p.length), 2); return h; })();
    if (!this.closed) this.socket.write(Buffer.concat([head, p]));
  }

  send(kindCase, value) {
    this.raw(2, frame(kindCase, value));
  }

  /** loginAck answers the Login. */
  async acceptLogin(ack = {}) {
    const login = await this.next("login");
    this.send("loginAck", { sessionId: "s-" + Math.random().toString(36).slice(2, 8), node: "fake", room: "r1", uid: "u1", app: "demo", heartbeatIntervalMs: 25000, ...ack });
    return login;
  }

  /** close sends a Kick (if code is a Roomcast code) and a close frame, then ends the socket. */
  close(code, reason = "") {
    if (code >= 4000) this.send("kick", { code, reason });
    const p = Buffer.alloc(2 + Buffer.byteLength(reason));
    p.writeUInt16BE(code, 0);
    p.write(reason, 2);
    this.raw(8, p);
    this.socket.end();
  }

  /** drop ends the TCP connection without a close frame. */
  drop() {
    this.socket.destroy();
  }
}

/**
 * startServer listens on a free loopback port and calls onConn for each WebSocket connection.
 * Its URL is ws://127.0.0.1:PORT/v1/ws; conns lists every connection so far.
 */
export async function startServer(onConn = () => {}) {
  const conns = [];
  const waiters = [];
  const server = createServer((req, res) => res.writeHead(404).end());
  server.on("upgrade", (req, socket) => {
    const accept = createHash("sha1").update(req.headers["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest("base64");
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`);
    socket.setNoDelay(true);
    const c = new Conn(socket);
    conns.push(c);
    for (const w of waiters.splice(0)) w();
    Promise.resolve(onConn(c, conns.length)).catch(() => {});
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const url = `ws://127.0.0.1:${server.address().port}/v1/ws`;
  return {
    url,
    conns,
    endpoint: { node: "fake", wsUrl: url },
    /** conn resolves with the n-th connection (1-based) once it exists. */
    async conn(n, timeoutMs = 3000) {
      const end = Date.now() + timeoutMs;
      while (conns.length < n) {
        if (Date.now() > end) throw new Error(`no connection #${n} within ${timeoutMs} ms (have ${conns.length})`);
        await new Promise((r) => {
          waiters.push(r);
          setTimeout(r, 20);
        });
      }
      return conns[n - 1];
    },
    close() {
      for (const c of conns) c.socket.destroy();
      return new Promise((r) => server.close(r));
    },
  };
}

/**
 * harness gives a test file its helpers: server starts a fake ChatLink and client a Client with
 * short timings that records its events in order, both closed after each test; until polls.
 */
export function harness() {
  const cleanups = [];
  afterEach(async () => {
    for (const f of cleanups.splice(0).reverse()) await f();
  });
  return {
    async server(onConn) {
      const s = await startServer(onConn);
      cleanups.push(() => s.close());
      return s;
    },
    client(cfg) {
      const c = new Client({ token: token(), attemptTimeoutMs: 1000, reconnectMinDelayMs: 50, reconnectMaxDelayMs: 400, recoveryWaitMs: 300, ...cfg });
      const log = [];
      for (const type of ["connected", "message", "reconnecting", "recovered", "thinned", "kicked", "error", "closed"]) {
        c.on(type, (ev) => log.push({ type, ev, at: Date.now() }));
      }
      cleanups.push(() => c.close());
      return { c, log, of: (type) => log.filter((e) => e.type === type).map((e) => e.ev) };
    },
    until,
    /** defer runs f after the test. */
    defer: (f) => cleanups.push(f),
  };
}

/** until polls fn every 10 ms until it returns true, or throws after timeoutMs. */
export async function until(what, fn, timeoutMs = 3000) {
  const end = Date.now() + timeoutMs;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
