// The room's live state (docs/protocol.md, "Viewer counts", "Room attributes"): its members
// online and per viewer tag, a few seconds apart and only when they change; join and leave
// notices of a small room that asks; and its attributes (an announcement, a pinned message),
// whole at login and at every change.

import { errorCodeName, RoomcastError } from "./errors.js";
import { ErrorCode, type RoomAttributes, type ViewerCount } from "./gen/client_pb.js";

/**
 * AttributeError is the server's refusal of setAttribute or removeAttribute; the connection
 * stays. code is an ErrorCode: 150 ATTRIBUTES_NOT_ALLOWED (the room's attributes_expr or
 * attribute_keys do not permit this member this key), 125 ATTRIBUTES_FULL, 100 BAD_REQUEST (a
 * bad key), 103 FORBIDDEN (muted or banned), 105 ROOM_NOT_FOUND (closed), 120
 * SEND_RATE_LIMITED (this connection, or the room's members together, changed its attributes
 * too often: retryAfterMs), 503
 * UNAVAILABLE.
 */
export class AttributeError extends RoomcastError {
  override name = "AttributeError";
  constructor(
    readonly code: number,
    readonly serverMessage = "",
    /** With 120: how long to wait before the same change may be taken. */
    readonly retryAfterMs = 0,
  ) {
    super(`roomcast: attribute change refused: code ${code} (${errorCodeName(code)})${serverMessage ? ": " + serverMessage : ""}`);
  }

  /** The room does not let this member change this attribute. */
  get notAllowed(): boolean {
    return this.code === ErrorCode.ATTRIBUTES_NOT_ALLOWED;
  }
}

/** viewers: the room's members online changed, or a login learned them. */
export interface ViewersEvent {
  online: number;
  /** For each tag the room's settings name (viewer_tags): how many members online have it. */
  tags: Record<string, number>;
}

/** memberNotice: a member joined (left false) or left; small rooms that ask only. */
export interface MemberNoticeEvent {
  uid: string;
  left: boolean;
}

/** attributes: the room's attributes changed, or a login found some. */
export interface AttributesEvent {
  /** Every attribute by key; a removed one is absent. */
  attrs: Record<string, string>;
  /** Grows with every change; the client emits only sets newer than the last it emitted. */
  version: bigint;
}

/** viewersOf turns a ViewerCount frame into its event. */
export function viewersOf(v: ViewerCount): ViewersEvent {
  const tags: Record<string, number> = {};
  for (const t of v.tags) tags[t.tag] = Number(t.members);
  return { online: Number(v.online), tags };
}

/**
 * AttributeState keeps the room's newest attributes: a frame with a version not greater than
 * the last is dropped (two may cross: one after the LoginAck, one broadcast).
 */
export class AttributeState {
  attrs: Record<string, string> = {};
  version = 0n;

  /** take applies a frame and returns its event, or undefined when it is not newer. */
  take(a: RoomAttributes): AttributesEvent | undefined {
    if (a.version <= this.version) return undefined;
    const attrs: Record<string, string> = {};
    for (const kv of a.attributes) attrs[kv.key] = kv.value;
    this.attrs = attrs;
    this.version = a.version;
    return { attrs: { ...attrs }, version: a.version };
  }
}
