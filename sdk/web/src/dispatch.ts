// Finding a ChatLink: the dispatcher's answer (docs/protocol.md §1).

import type { Endpoint } from "./config.js";
import { DispatchError, RoomcastError } from "./errors.js";

/** The claims of a login token the client needs to ask the dispatcher. */
export interface TokenClaims {
  app: string;
  uid: string;
  room: string;
}

/**
 * readClaims decodes the payload of a JWT without verifying its signature: the client only
 * needs to know where to connect, and the ChatLink verifies the token anyway.
 */
export function readClaims(token: string): TokenClaims {
  const parts = token.split(".");
  if (parts.length !== 3) {
    throw new RoomcastError(`roomcast: malformed token: want 3 dot-separated parts, got ${parts.length}`);
  }
  let claims: Partial<TokenClaims>;
  try {
    const b64 = parts[1]!.replace(/-/g, "+").replace(/_/g, "/");
    const bin = atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4));
    claims = JSON.parse(new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0))));
  } catch (e) {
    throw new RoomcastError(`roomcast: malformed token: payload: ${(e as Error).message}`);
  }
  const { app, uid, room } = claims ?? {};
  if (typeof app !== "string" || typeof uid !== "string" || typeof room !== "string" || !app || !uid || !room) {
    throw new RoomcastError("roomcast: malformed token: app, uid and room claims are required");
  }
  return { app, uid, room };
}

/** The dispatcher's JSON answer. */
interface DispatchAnswer {
  nodes?: { node?: string; ws_url?: string; tcp_addr?: string }[];
  ttl_ms?: number;
  error?: string;
}

/** Dispatched is the dispatcher's ranked list of endpoints and how long it may be reused. */
export interface Dispatched {
  endpoints: Endpoint[];
  ttlMs: number;
}

/**
 * dispatch asks the dispatcher at base which ChatLinks the holder of token should try, best
 * first. The list is never empty: no usable endpoint is a DispatchError.
 */
export async function dispatch(f: typeof fetch, base: string, token: string, signal?: AbortSignal): Promise<Dispatched> {
  const c = readClaims(token);
  const q = new URLSearchParams({ app: c.app, room: c.room, uid: c.uid });
  const url = base.replace(/\/+$/, "") + "/v1/dispatch?" + q.toString();
  let res: Response, text: string;
  try {
    res = await f(url, { cache: "no-store", signal });
    text = await res.text();
  } catch (e) {
    throw new DispatchError(`roomcast: dispatch: ${(e as Error).message}`);
  }
  let a: DispatchAnswer | undefined;
  try {
    a = JSON.parse(text);
  } catch {
    // reported below
  }
  if (!res.ok) {
    throw new DispatchError(`roomcast: dispatch: HTTP ${res.status}: ${a?.error || text.trim()}`);
  }
  if (!a || typeof a !== "object") throw new DispatchError("roomcast: dispatch: the answer is not JSON");
  const endpoints = (Array.isArray(a.nodes) ? a.nodes : [])
    .filter((n) => n && typeof n.ws_url === "string" && n.ws_url !== "")
    .map((n) => ({ node: String(n.node ?? ""), wsUrl: n.ws_url!, tcpAddr: n.tcp_addr }));
  if (endpoints.length === 0) throw new DispatchError("roomcast: dispatch: the dispatcher offered no endpoint");
  return { endpoints, ttlMs: typeof a.ttl_ms === "number" ? a.ttl_ms : 0 };
}
