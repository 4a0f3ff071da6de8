// Moderators in the room (docs/protocol.md, "Moderators"): the error of a refused moderate
// request (Client.mute, unmute, remove, recallAsModerator).

import { errorCodeName, RoomcastError } from "./errors.js";
import { ErrorCode } from "./gen/client_pb.js";

/**
 * ModerateError is the server's refusal of a moderate request; the connection stays. code is an
 * ErrorCode: 140 NOT_MODERATOR (this member is not a moderator of the room), 141 OUTSIDE_SCOPE
 * (the member named is outside this moderator's scope), 107 USER_NOT_FOUND (no session in the
 * room), 100 BAD_REQUEST, 105 ROOM_NOT_FOUND, 120 SEND_RATE_LIMITED (over the connection's
 * moderate rate), 503 UNAVAILABLE; for recallAsModerator also 130 MESSAGE_NOT_FOUND.
 */
export class ModerateError extends RoomcastError {
  override name = "ModerateError";
  constructor(
    readonly code: number,
    readonly serverMessage = "",
  ) {
    super(`roomcast: moderate request refused: code ${code} (${errorCodeName(code)})${serverMessage ? ": " + serverMessage : ""}`);
  }

  /** This member is not a moderator of the room. */
  get notModerator(): boolean {
    return this.code === ErrorCode.NOT_MODERATOR;
  }

  /** The member named is outside this moderator's scope. */
  get outsideScope(): boolean {
    return this.code === ErrorCode.OUTSIDE_SCOPE;
  }
}
