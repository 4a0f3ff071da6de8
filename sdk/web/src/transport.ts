// The transports that carry frames between the client and a ChatLink.

import type { Endpoint, WebSocketConstructor } from "./config.js";
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
