// The transports that carry frames between the client and a ChatLink.

import type { Endpoint, EventSourceConstructor, WebSocketConstructor } from "./config.js";
import { CODE_ABNORMAL_CLOSURE, CloseError, ProtocolError, type RoomcastError } from "./errors.js";

/** What a transport tells its session. Each is called on the event loop; after `end`, nothing more. */
export interface ConnHandlers {
  /** The connection is up: the session sends its Login. */
  open(): void;
  /** One frame's protobuf bytes. */
  frame(data: Uint8Array): void;
  /** The connection ended: a CloseError (with the close code) or a ProtocolError. */
  end(err: RoomcastError): void;
}

/** FrameConn is one open (or opening) connection. */
export interface FrameConn {
  /** Sends a frame; the first one sent is the Login. */
  send(frame: Uint8Array): void;
  /** Closes the connection; the handlers are not called any more. */
  close(): void;
}

/**
 * dialWebSocket opens a WebSocket to ep.wsUrl. Each binary message is one frame; a text message
 * is a protocol error (docs/protocol.md §2).
 */
export function dialWebSocket(WS: WebSocketConstructor | undefined, ep: Endpoint, h: ConnHandlers): FrameConn {
  let ended = false;
  const end = (err: RoomcastError) => {
    if (ended) return;
    ended = true;
    detach();
    try {
      ws?.close();
    } catch {
      // closing a socket that failed is of no interest
    }
    h.end(err);
  };
  let ws: WebSocket | undefined;
  try {
    if (!WS) throw new Error("this runtime has no WebSocket");
    ws = new WS(ep.wsUrl);
  } catch (e) {
    // A blocked or malformed URL throws at once; report it like a failed connection, later, so
    // that the caller has its FrameConn first.
    queueMicrotask(() => end(new CloseError(CODE_ABNORMAL_CLOSURE, `cannot open ${ep.wsUrl}: ${(e as Error).message}`)));
    return { send() {}, close: () => (ended = true) };
  }
  const sock = ws;
  sock.binaryType = "arraybuffer";
  sock.onopen = () => h.open();
  sock.onmessage = (ev: MessageEvent) => {
    if (ended) return;
    if (typeof ev.data === "string") {
      end(new ProtocolError("roomcast: protocol error: the server sent a WebSocket text message"));
      return;
    }
    h.frame(new Uint8Array(ev.data as ArrayBuffer));
  };
  sock.onclose = (ev: CloseEvent) => end(new CloseError(ev.code || CODE_ABNORMAL_CLOSURE, ev.reason));
  sock.onerror = () => {
    // The close event follows with the code; an error alone says nothing more.
  };
  function detach() {
    sock.onopen = sock.onmessage = sock.onclose = sock.onerror = null;
  }
  return {
    send(frame) {
      if (!ended && sock.readyState === 1) sock.send(frame);
    },
    close() {
      if (ended) return;
      ended = true;
      detach();
      sock.close(1000);
    },
  };
}

/**
 * sseUrl is the HTTP fallback's URL on the ChatLink of ep: the WebSocket listener's, with http
 * for ws, https for wss and /v1/sse for /v1/ws (docs/protocol.md §2).
 */
export function sseUrl(ep: Endpoint): string {
  const u = new URL(ep.wsUrl);
  u.protocol = u.protocol === "wss:" ? "https:" : "http:";
  u.pathname = u.pathname.replace(/\/v1\/ws$/, "") + "/v1/sse";
  u.search = "";
  return u.toString();
}

const base64url = (b: Uint8Array) => btoa(String.fromCharCode(...b)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");

/**
 * dialSSE reaches the ChatLink of ep without WebSocket: the first frame sent (the Login) opens a
 * Server-Sent Events stream that carries every frame from the server; later frames are POSTed,
 * one at a time and in order, to the stream's key.
 */
export function dialSSE(ES: EventSourceConstructor | undefined, f: typeof fetch, ep: Endpoint, h: ConnHandlers): FrameConn {
  const base = sseUrl(ep);
  let ended = false, es: EventSource | undefined, key = "";
  const queue: Uint8Array[] = [];
  let posting = Promise.resolve();
  const end = (err: RoomcastError) => {
    if (ended) return;
    ended = true;
    es?.close();
    h.end(err);
  };
  const post = async (frame: Uint8Array) => {
    if (ended) return;
    try {
      const res = await f(`${base}/${key}`, { method: "POST", body: frame as Uint8Array<ArrayBuffer>, headers: { "Content-Type": "application/x-protobuf" } });
      if (!res.ok) end(new CloseError(CODE_ABNORMAL_CLOSURE, `POST ${base} answered HTTP ${res.status}`));
    } catch (e) {
      end(new CloseError(CODE_ABNORMAL_CLOSURE, `POST ${base}: ${(e as Error).message}`));
    }
  };
  const flush = () => {
    if (!key) return;
    for (const frame of queue.splice(0)) posting = posting.then(() => post(frame));
  };
  const open = (login: Uint8Array) => {
    try {
      if (!ES) throw new Error("this runtime has no EventSource");
      es = new ES(`${base}?login=${base64url(login)}`);
    } catch (e) {
      queueMicrotask(() => end(new CloseError(CODE_ABNORMAL_CLOSURE, `cannot open ${base}: ${(e as Error).message}`)));
      return;
    }
    es.addEventListener("stream", (ev) => {
      key = (ev as MessageEvent).data;
      flush();
    });
    es.onmessage = (ev) => {
      if (ended) return;
      let bytes: Uint8Array;
      try {
        bytes = Uint8Array.from(atob(ev.data), (c) => c.charCodeAt(0));
      } catch {
        end(new ProtocolError("roomcast: protocol error: an event of the stream is not base64"));
        return;
      }
      h.frame(bytes);
    };
    // The stream ended (after a Kick, whose code the session keeps) or never opened.
    es.onerror = () => end(new CloseError(CODE_ABNORMAL_CLOSURE, "the event stream ended"));
  };
  queueMicrotask(() => {
    if (!ended) h.open();
  });
  return {
    send(frame) {
      if (ended) return;
      if (!es) open(frame);
      else {
        queue.push(frame);
        flush();
      }
    },
    close() {
      ended = true;
      es?.close();
    },
  };
}
