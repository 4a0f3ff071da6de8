/**
 * The Roomcast web SDK: a browser (or any runtime with WebSocket and fetch) joins a Roomcast
 * room, sends and receives, and in a room in CDN mode polls the room's segments (docs/cdn.md).
 * It speaks the protocol of docs/protocol.md with code generated from proto/*.proto, and only
 * that: tokens are minted by the app server, not here.
 *
 * @module
 */

export { Client } from "./client.js";
export type {
  ClientEvents,
  ConnectedEvent,
  CounterRefusedEvent,
  CountersEvent,
  HistoryQuery,
  KickedEvent,
  LimitedEvent,
  Outgoing,
  ReconnectingEvent,
  RecalledEvent,
  RecoveredEvent,
  State,
  ThinnedEvent,
} from "./client.js";
export type { CdnStats } from "./cdn.js";
export { CLIENT_NAME, MAX_FRAME_SIZE, PROTOCOL_VERSION } from "./config.js";
export type { Config, Endpoint, EventSourceConstructor, Logger, Transport, WebSocketConstructor } from "./config.js";
export { MAX_COUNTER_NAME, MAX_ROOM_COUNTERS, validCounterName } from "./counters.js";
export type { AttributesEvent, MemberNoticeEvent, ViewersEvent } from "./live.js";
export { AttributeError } from "./live.js";
export { compareMessages, idFloor } from "./delivery.js";
export { decodeSegment, MAX_SEGMENT_BYTES, SegmentError, segmentIndex, segmentUrl } from "./segment.js";
export type { WantSegment } from "./segment.js";
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
  HistoryError,
  HistoryUnavailableError,
  LoginTimeoutError,
  NotConnectedError,
  ProtocolError,
  RoomcastError,
  SendError,
  ServerTimeoutError,
  terminalCode,
  limitedCode,
  VersionError,
} from "./errors.js";
export { CdnMode } from "./gen/cdn_pb.js";
export type { CdnConfig, CdnVendor, Segment } from "./gen/cdn_pb.js";
export { CloseCode, ErrorCode, ModerateOp } from "./gen/client_pb.js";
export { ModerateError } from "./moderate.js";
export type { Counter, CounterTotals, HistoryPage, LoginAck, SendAck } from "./gen/client_pb.js";
export { Lane, QueueOp } from "./gen/message_pb.js";
export type { Message, QueueEntry, QueueEvent } from "./gen/message_pb.js";
export { QUEUE_EVENT_TYPE, QueueError, queueEventOf, QueueView } from "./queue.js";
