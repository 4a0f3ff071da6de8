/**
 * The Roomcast web SDK: a browser (or any runtime with WebSocket and fetch) joins a Roomcast
 * room, sends and receives. It speaks the protocol of docs/protocol.md with code generated from
 * proto/*.proto, and only that: tokens are minted by the app server, not here.
 *
 * @module
 */

export { Client } from "./client.js";
export type {
  ClientEvents,
  ConnectedEvent,
  KickedEvent,
  Outgoing,
  ReconnectingEvent,
  RecoveredEvent,
  State,
} from "./client.js";
export { CLIENT_NAME, MAX_FRAME_SIZE } from "./config.js";
export type { Config, Endpoint, EventSourceConstructor, Transport, WebSocketConstructor } from "./config.js";
export { compareMessages } from "./delivery.js";
export { dispatch, readClaims } from "./dispatch.js";
export { sseUrl } from "./transport.js";
export type { Dispatched, TokenClaims } from "./dispatch.js";
export {
  CODE_ABNORMAL_CLOSURE,
  ClosedError,
  CloseError,
  closeCodeName,
  DispatchError,
  errorCodeName,
  LoginTimeoutError,
  NotConnectedError,
  ProtocolError,
  RoomcastError,
  SendError,
  ServerTimeoutError,
  terminalCode,
} from "./errors.js";
export { CloseCode, ErrorCode } from "./gen/client_pb.js";
export type { LoginAck, SendAck } from "./gen/client_pb.js";
export { Lane } from "./gen/message_pb.js";
export type { Message } from "./gen/message_pb.js";
