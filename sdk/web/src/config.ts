// The client's configuration and its defaults.

import { RoomcastError } from "./errors.js";

/** CLIENT_NAME is what the SDK reports in Login.client. */
export const CLIENT_NAME = "roomcast-web/0.1";

/** PROTOCOL_VERSION is the version of the wire protocol (docs/protocol.md) the SDK speaks. */
export const PROTOCOL_VERSION = 1;

/** MAX_FRAME_SIZE is the largest frame either side may send, in protobuf bytes. */
export const MAX_FRAME_SIZE = 65536;

/** Endpoint is one ChatLink as the dispatcher describes it (docs/protocol.md §1). */
export interface Endpoint {
  /** The ChatLink's name, e.g. "cl-1". */
  node: string;
  /** Its WebSocket URL, e.g. "ws://127.0.0.1:9101/v1/ws". */
  wsUrl: string;
  /** Its TCP address, for native clients; unused here. */
  tcpAddr?: string;
}

/** A WebSocket constructor: the browser's, or one a test or a non-browser runtime gives. */
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocket;

/** An EventSource constructor, for the HTTP fallback. */
export type EventSourceConstructor = new (url: string) => EventSource;

/**
 * How the client reaches a ChatLink: "ws" (WebSocket), "sse" (the HTTP fallback: Server-Sent
 * Events down, POST up), or "auto": WebSocket, and the fallback where WebSocket is missing or an
 * endpoint cannot be reached by it (a proxy that refuses the upgrade).
 */
export type Transport = "auto" | "ws" | "sse";

/** Logger receives the client's few log lines; `console` is one. */
export interface Logger {
  warn(message: string, ...args: unknown[]): void;
  debug(message: string, ...args: unknown[]): void;
}

/** Config says where and how a Client connects. Only token and dispatcher (or endpoints) are required. */
export interface Config {
  /** The login JWT minted by the app server. Its app, uid and room claims are read (not verified) for the dispatch query. Required. */
  token: string;
  /**
   * The base URL of the dispatcher, e.g. "https://chat.example.com"; GET {dispatcher}/v1/dispatch
   * gives the endpoints. "" means the page's own origin. Required unless endpoints is set.
   */
  dispatcher?: string;
  /** If not empty, dialed in order instead of asking the dispatcher (reconnects too). */
  endpoints?: Endpoint[];
  /** How to reach a ChatLink. Default "auto". */
  transport?: Transport;
  /** Sent in Login.device. Default "web". */
  device?: string;
  /** The id of the last message the app has from an earlier session: the first login recovers what came after it. */
  recoverSince?: string;
  /** Without recoverSince: how many of the room's latest messages the first login asks for (at most 100). Default 0. */
  history?: number;
  /** Bounds connecting to and logging in at one endpoint, so that a hanging one gives way to the next. Default 10000. */
  attemptTimeoutMs?: number;
  /** Whether to reconnect after a transient close, an error or the server's Reconnect. Default true. */
  reconnect?: boolean;
  /** The first reconnect waits about this long; each failed attempt doubles it. Default 500. */
  reconnectMinDelayMs?: number;
  /** The longest wait between reconnect attempts. Default 20000. */
  reconnectMaxDelayMs?: number;
  /** How long a connection must stay up before its end counts as a fresh start for the backoff. Default 10000. */
  stableAfterMs?: number;
  /**
   * How long live messages are held after a login that asked for history or recovery, so that
   * the history is delivered first and everything in order. The hold ends earlier when the
   * history arrives. Default 10000: the ChatLink answers within 8 s (it gives up reading history
   * then and says so with an Error 503), and the hold must outlast that.
   */
  recoveryWaitMs?: number;
  /** How many message ids are remembered to drop duplicates. Default 10000. */
  dedupeWindow?: number;
  /**
   * The member's region, as the deployment's dispatcher names them: in CDN mode, vendors that
   * list regions are chosen only when they list this one. Default "": the vendors that list none.
   */
  cdnRegion?: string;
  /** Receives the client's few log lines (CDN polling problems, mostly). Default none. */
  logger?: Logger;
  /** The WebSocket implementation. Default globalThis.WebSocket. */
  WebSocket?: WebSocketConstructor;
  /** The EventSource implementation for the fallback. Default globalThis.EventSource. */
  EventSource?: EventSourceConstructor;
  /** The fetch implementation for dispatch and the fallback's sends. Default globalThis.fetch. */
  fetch?: typeof fetch;
}

/** Settings is a Config with every default filled in. */
export type Settings = Required<Omit<Config, "dispatcher" | "recoverSince" | "logger">> & {
  dispatcher: string | undefined;
  recoverSince: string;
  logger: Logger | undefined;
};

/** withDefaults returns cfg with the documented defaults, or throws for a Config the client cannot use. */
export function withDefaults(cfg: Config): Settings {
  if (!cfg || typeof cfg.token !== "string" || cfg.token === "") {
    throw new RoomcastError("roomcast: Config.token is required");
  }
  const endpoints = cfg.endpoints ?? [];
  if (cfg.transport !== undefined && !["auto", "ws", "sse"].includes(cfg.transport)) {
    throw new RoomcastError(`roomcast: unknown transport ${JSON.stringify(cfg.transport)} (want "auto", "ws" or "sse")`);
  }
  if (endpoints.length === 0 && typeof cfg.dispatcher !== "string") {
    throw new RoomcastError("roomcast: Config needs dispatcher or endpoints");
  }
  const ws = cfg.WebSocket ?? (globalThis.WebSocket as WebSocketConstructor | undefined);
  const f = cfg.fetch ?? globalThis.fetch?.bind(globalThis);
  const positive = (v: number | undefined, def: number) => (v !== undefined && v > 0 ? v : def);
  const min = positive(cfg.reconnectMinDelayMs, 500);
  return {
    token: cfg.token,
    dispatcher: cfg.dispatcher,
    endpoints,
    transport: cfg.transport ?? "auto",
    device: cfg.device || "web",
    recoverSince: cfg.recoverSince ?? "",
    history: Math.min(100, Math.max(0, Math.floor(cfg.history ?? 0))),
    attemptTimeoutMs: positive(cfg.attemptTimeoutMs, 10000),
    reconnect: cfg.reconnect ?? true,
    reconnectMinDelayMs: min,
    reconnectMaxDelayMs: Math.max(min, positive(cfg.reconnectMaxDelayMs, 20000)),
    stableAfterMs: positive(cfg.stableAfterMs, 10000),
    recoveryWaitMs: positive(cfg.recoveryWaitMs, 10000),
    dedupeWindow: positive(cfg.dedupeWindow, 10000),
    cdnRegion: cfg.cdnRegion ?? "",
    logger: cfg.logger,
    WebSocket: ws as WebSocketConstructor,
    EventSource: (cfg.EventSource ?? globalThis.EventSource) as EventSourceConstructor,
    fetch: f as typeof fetch,
  };
}
