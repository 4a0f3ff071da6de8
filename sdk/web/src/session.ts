// One connection to one ChatLink: login, sends matched to their answers, heartbeats.

import { create, fromBinary, type MessageInitShape, toBinary } from "@bufbuild/protobuf";
import type { Endpoint, Settings } from "./config.js";
import { CLIENT_NAME, MAX_FRAME_SIZE, PROTOCOL_VERSION } from "./config.js";
import {
  CloseError,
  HistoryError,
  LoginTimeoutError,
  ProtocolError,
  RoomcastError,
  SendError,
  ServerTimeoutError,
  VersionError,
} from "./errors.js";
import type { CdnConfig } from "./gen/cdn_pb.js";
import {
  type CounterTotals,
  type MemberNotice,
  type RoomAttributes,
  type ViewerCount,
  ErrorCode,
  type Frame,
  FrameSchema,
  type HistoryPage,
  type Kick,
  type LoginAck,
  type Push,
  type Reconnect,
  type Recall,
  type RecallReply,
  type RoomQueueReply,
  type ModerateReply,
  type ModerateRequestSchema,
  type SetAttributeReply,
  type RoomQueueRequestSchema,
  type SendAck,
} from "./gen/client_pb.js";
import { COUNTER_RING, type SentAdd } from "./counters.js";
import { MAX_ACK_IDS } from "./inbox.js";
import { type ConnHandlers, dialSSE, dialWebSocket, type FrameConn } from "./transport.js";

const defaultHeartbeatMs = 25000;
const minHeartbeatMs = 10; // a floor against a server's typo

/** What a session tells its client. */
export interface SessionSink {
  push(s: Session, p: Push): void;
  reconnect(s: Session, r: Reconnect): void;
  /** The room's CDN config changed (a CdnConfig frame). */
  cdn(s: Session, c: CdnConfig): void;
  /** The server refused the login's history request (an Error with seq 0). */
  historyFailed(s: Session, err: SendError): void;
  /** The room's counters (a CounterTotals frame). */
  counters(s: Session, t: CounterTotals): void;
  /** The room's members online (a ViewerCount frame). */
  viewers(s: Session, v: ViewerCount): void;
  /** Members joined or left (a MemberNotice frame). */
  memberNotice(s: Session, n: MemberNotice): void;
  /** The room's attributes (a RoomAttributes frame). */
  attributes(s: Session, a: RoomAttributes): void;
  /** Messages of the room were recalled (a Recall frame). */
  recall(s: Session, r: Recall): void;
  /** The server refused a CounterAdd; the amount was not counted. */
  counterRefused(s: Session, add: SentAdd, err: SendError): void;
  /** A logged-in session ended; not called for one that failed before its LoginAck. */
  end(s: Session, err: RoomcastError): void;
}

/** What the Login asks for besides the token. */
export interface LoginOptions {
  recoverSince: string;
  /** The greatest room_seq seen, sent with recoverSince; 0n if none. */
  recoverSinceRoomSeq: bigint;
  history: number;
}

/** A Send, HistoryQuery, queue request, moderate request or SetAttribute waiting for its answer. */
interface Waiting {
  resolve(a: SendAck | HistoryPage | RoomQueueReply | ModerateReply | SetAttributeReply | RecallReply): void;
  reject(e: Error): void;
  /** A HistoryQuery: a refusal is a HistoryError, not a SendError. */
  history?: boolean;
}

/**
 * Session is one connection and its login. open() resolves with the LoginAck, or rejects with
 * why the endpoint could not be used; after that the sink hears of pushes, Reconnects and the
 * end.
 */
export class Session {
  loginAck: LoginAck | undefined;
  /** The Kick the server sent before closing, if any. */
  kick: Kick | undefined;
  readonly openedAt = Date.now();

  private conn: FrameConn | undefined;
  private ended: RoomcastError | undefined;
  private hintMs = 0; // retry_after_ms of an Error before the LoginAck
  private readonly waiting = new Map<bigint, Waiting>();
  private readonly adds: (SentAdd | undefined)[] = []; // the last CounterAdds, by seq % COUNTER_RING
  private intervalMs = defaultHeartbeatMs;
  private lastFrameAt = Date.now();
  private nextBeatAt = 0;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private loginDone: ((err?: RoomcastError) => void) | undefined;
  private leaving: { err: RoomcastError; timer: ReturnType<typeof setTimeout> } | undefined;
  // What happened between the LoginAck and attach(): a runtime may hand over several frames
  // before the client's await of open() resumes.
  private early: (() => void)[] | undefined = [];

  constructor(
    private readonly s: Settings,
    readonly endpoint: Endpoint,
    /** How this session reaches its ChatLink: "ws" or "sse" (the HTTP fallback). */
    readonly transport: "ws" | "sse",
    private readonly login: LoginOptions,
    private readonly sink: SessionSink,
  ) {}

  /** open connects and logs in, within Settings.attemptTimeoutMs. */
  open(): Promise<LoginAck> {
    return new Promise<LoginAck>((resolve, reject) => {
      this.loginDone = (err) => {
        this.loginDone = undefined;
        clearTimeout(this.timer);
        if (err) reject(err);
        else {
          this.startHeartbeats();
          resolve(this.loginAck!);
        }
      };
      this.timer = setTimeout(
        () => this.end(new LoginTimeoutError(`roomcast: no LoginAck from ${this.endpoint.node || this.endpoint.wsUrl} within ${this.s.attemptTimeoutMs} ms`)),
        this.s.attemptTimeoutMs,
      );
      const handlers: ConnHandlers = {
        open: () => this.write({
          case: "login",
          value: {
            token: this.s.token, device: this.s.device, client: CLIENT_NAME, protocolVersion: PROTOCOL_VERSION,
            recoverSince: this.login.recoverSince, recoverSinceRoomSeq: this.login.recoverSince ? this.login.recoverSinceRoomSeq : 0n,
            history: this.login.recoverSince ? 0 : this.login.history,
            inbox: true, // the client acknowledges at-least-once messages (inbox.ts)
            liveState: true, // viewer counts, member notices, room attributes (live.ts)
          },
        }),
        frame: (data) => this.onFrame(data),
        end: (err) => this.end(err),
      };
      this.conn = this.transport === "sse"
        ? dialSSE(this.s.EventSource, this.s.fetch, this.endpoint, handlers)
        : dialWebSocket(this.s.WebSocket, this.endpoint, handlers);
    });
  }

  /** attach starts telling the sink, first of what happened since the LoginAck. */
  attach(): void {
    const early = this.early ?? [];
    this.early = undefined;
    for (const f of early) f();
  }

  private tell(f: () => void): void {
    if (this.early) this.early.push(f);
    else f();
  }

  /** send writes a Send frame and resolves with its SendAck, or rejects with a SendError or the connection's end. */
  send(seq: bigint, value: { type: string; lane: number; body: Uint8Array; tagExpr: string }): Promise<SendAck> {
    if (this.ended) return Promise.reject(this.ended);
    return new Promise<SendAck>((resolve, reject) => {
      this.waiting.set(seq, { resolve: (a) => resolve(a as SendAck), reject });
      this.write({ case: "send", value: { ...value, seq } });
    });
  }

  /** history writes a HistoryQuery frame and resolves with its HistoryPage, or rejects with a HistoryError or the connection's end. */
  history(seq: bigint, value: { limit: number; beforeId: string; afterId: string; cursor: string; lane: number }): Promise<HistoryPage> {
    if (this.ended) return Promise.reject(this.ended);
    return new Promise<HistoryPage>((resolve, reject) => {
      this.waiting.set(seq, { resolve: (a) => resolve(a as HistoryPage), reject, history: true });
      this.write({ case: "historyQuery", value: { ...value, seq } });
    });
  }

  /** ack tells the server the app has the at-least-once messages ids (inbox.ts). */
  ack(ids: string[]): void {
    for (let i = 0; i < ids.length && !this.ended; i += MAX_ACK_IDS) {
      this.write({ case: "ack", value: { ids: ids.slice(i, i + MAX_ACK_IDS) } });
    }
  }

  /** counterAdd writes a CounterAdd frame; the server answers only a refusal (sink.counterRefused). */
  counterAdd(seq: bigint, name: string, amount: number): void {
    if (this.ended) throw this.ended;
    this.adds[Number(seq % BigInt(COUNTER_RING))] = { seq, name, amount };
    this.write({ case: "counterAdd", value: { seq, name, amount } });
  }

  /** queue writes a RoomQueueRequest and resolves with its RoomQueueReply (whatever its code), or rejects with the connection's end. */
  queue(seq: bigint, value: Omit<MessageInitShape<typeof RoomQueueRequestSchema>, "seq" | "$typeName">): Promise<RoomQueueReply> {
    if (this.ended) return Promise.reject(this.ended);
    return new Promise<RoomQueueReply>((resolve, reject) => {
      this.waiting.set(seq, { resolve: (a) => resolve(a as RoomQueueReply), reject });
      this.write({ case: "queueRequest", value: { ...value, seq } });
    });
  }

  /** moderate writes a ModerateRequest and resolves with its ModerateReply (whatever its code), or rejects with the connection's end. */
  moderate(seq: bigint, value: Omit<MessageInitShape<typeof ModerateRequestSchema>, "seq" | "$typeName">): Promise<ModerateReply> {
    if (this.ended) return Promise.reject(this.ended);
    return new Promise<ModerateReply>((resolve, reject) => {
      this.waiting.set(seq, { resolve: (a) => resolve(a as ModerateReply), reject });
      this.write({ case: "moderateRequest", value: { ...value, seq } });
    });
  }

  /** setAttribute writes a SetAttribute and resolves with its SetAttributeReply (whatever its code), or rejects with the connection's end. */
  setAttribute(seq: bigint, key: string, value: string, remove: boolean): Promise<SetAttributeReply> {
    if (this.ended) return Promise.reject(this.ended);
    return new Promise<SetAttributeReply>((resolve, reject) => {
      this.waiting.set(seq, { resolve: (a) => resolve(a as SetAttributeReply), reject });
      this.write({ case: "setAttribute", value: { seq, key, value, remove } });
    });
  }

  /** recall writes a RecallRequest and resolves with its RecallReply (whatever its code), or rejects with the connection's end. */
  recall(seq: bigint, messageId: string): Promise<RecallReply> {
    if (this.ended) return Promise.reject(this.ended);
    return new Promise<RecallReply>((resolve, reject) => {
      this.waiting.set(seq, { resolve: (a) => resolve(a as RecallReply), reject });
      this.write({ case: "recallRequest", value: { seq, messageId } });
    });
  }

  /** close ends the session without telling the sink; pending sends and queue requests fail with err. */
  close(err: RoomcastError): void {
    this.end(err, true);
  }

  /**
   * leave closes a session a move has left, as close does, once the sends, history queries and
   * queue requests already written on it have their answers (the draining node still serves
   * them), or after waitMs.
   */
  leave(err: RoomcastError, waitMs: number): void {
    if (this.ended || this.leaving) return;
    if (this.waiting.size === 0) {
      this.close(err);
      return;
    }
    this.leaving = { err, timer: setTimeout(() => this.close(err), waitMs) };
  }

  private write(kind: MessageInitShape<typeof FrameSchema>["kind"]): void {
    const bytes = toBinary(FrameSchema, create(FrameSchema, { kind }));
    if (bytes.length > MAX_FRAME_SIZE) {
      // Only a Send or a queue offer can be this large; refuse it without harm to the connection.
      if (kind?.case === "send" || kind?.case === "queueRequest") this.answer(BigInt(kind.value.seq ?? 0), undefined, new RoomcastError(`roomcast: frame too large: ${bytes.length} bytes, the limit is ${MAX_FRAME_SIZE}`));
      return;
    }
    this.conn?.send(bytes);
  }

  private onFrame(data: Uint8Array): void {
    if (this.ended) return;
    this.lastFrameAt = Date.now();
    let f: Frame;
    try {
      f = fromBinary(FrameSchema, data);
    } catch (e) {
      this.end(new ProtocolError(`roomcast: protocol error: a frame of ${data.length} bytes does not parse: ${(e as Error).message}`));
      return;
    }
    const k = f.kind;
    if (k.case === "kick") {
      this.kick = k.value; // the close follows; it reports the kick's code
      return;
    }
    if (!this.loginAck) {
      if (k.case === "loginAck") {
        if (k.value.protocolVersion > PROTOCOL_VERSION) {
          this.end(new VersionError(`roomcast: protocol error: the server speaks protocol version ${k.value.protocolVersion}, this SDK ${PROTOCOL_VERSION}`));
          return;
        }
        this.loginAck = k.value;
        this.setInterval(k.value.heartbeatIntervalMs);
        this.loginDone?.();
        return;
      }
      if (k.case === "reconnect") return; // a draining node: the login will be refused or moved anyway
      if (k.case === "error" && k.value.seq === 0n) {
        // The reason for the Kick that follows (121 LOGIN_RATE_LIMITED, with the retry hint).
        this.hintMs = k.value.retryAfterMs;
        return;
      }
      this.end(new ProtocolError(`roomcast: protocol error: the server answered the Login with ${k.case ?? "an unknown frame"}, not a LoginAck: does it speak Roomcast protocol version 1?`));
      return;
    }
    switch (k.case) {
      case "push":
        this.tell(() => this.sink.push(this, k.value));
        return;
      case "sendAck":
      case "historyPage":
      case "queueReply":
      case "moderateReply":
      case "setAttributeReply":
      case "recallReply":
        this.answer(k.value.seq, k.value);
        return;
      case "error": {
        const err = new SendError(k.value.code, k.value.message, k.value.retryAfterMs);
        if (k.value.code === ErrorCode.ACK_FAILED) {
          // The messages stay stored: they come again after the next login, and are acknowledged then.
          this.s.logger?.warn(`roomcast: acknowledgement not applied: ${k.value.message}`);
          return;
        }
        const add = this.adds[Number(k.value.seq % BigInt(COUNTER_RING))];
        if (add && add.seq === k.value.seq && k.value.seq !== 0n) {
          this.tell(() => this.sink.counterRefused(this, add, err));
          return;
        }
        // seq 0 answers no send: the login's history request was refused (109, 503).
        if (k.value.seq === 0n) this.tell(() => this.sink.historyFailed(this, err));
        else this.answer(k.value.seq, undefined, err);
        return;
      }
      case "heartbeatAck":
        this.setInterval(k.value.heartbeatIntervalMs);
        return;
      case "reconnect":
        this.tell(() => this.sink.reconnect(this, k.value));
        return;
      case "cdnConfig":
        this.tell(() => this.sink.cdn(this, k.value));
        return;
      case "counterTotals":
        this.tell(() => this.sink.counters(this, k.value));
        return;
      case "viewerCount":
        this.tell(() => this.sink.viewers(this, k.value));
        return;
      case "memberNotice":
        this.tell(() => this.sink.memberNotice(this, k.value));
        return;
      case "roomAttributes":
        this.tell(() => this.sink.attributes(this, k.value));
        return;
      case "recall":
        this.tell(() => this.sink.recall(this, k.value));
        return;
      case undefined:
        return; // a frame kind newer than this SDK
      default:
        this.end(new ProtocolError(`roomcast: protocol error: the server sent ${k.case} after the login`));
    }
  }

  private answer(seq: bigint, ack?: SendAck | HistoryPage | RoomQueueReply | ModerateReply | SetAttributeReply | RecallReply, err?: Error): void {
    const w = this.waiting.get(seq);
    if (!w) return;
    this.waiting.delete(seq);
    if (err instanceof SendError && w.history) w.reject(new HistoryError(err.code, err.serverMessage));
    else if (err) w.reject(err);
    else w.resolve(ack!);
    if (this.leaving && this.waiting.size === 0) this.close(this.leaving.err);
  }

  private setInterval(ms: number): void {
    if (ms > 0) this.intervalMs = Math.max(ms, minHeartbeatMs);
  }

  /**
   * Heartbeats go out every interval; a server silent for three intervals (it answers every
   * Heartbeat, so a live one never is) ends the session.
   */
  private startHeartbeats(): void {
    this.nextBeatAt = Date.now() + this.intervalMs;
    const tick = () => {
      if (this.ended) return;
      const now = Date.now();
      if (now - this.lastFrameAt >= 3 * this.intervalMs) {
        this.end(new ServerTimeoutError("roomcast: no frame from the server for three heartbeat intervals"));
        return;
      }
      if (now >= this.nextBeatAt) {
        this.write({ case: "heartbeat", value: { clientTimeMs: BigInt(now) } });
        this.nextBeatAt = now + this.intervalMs;
      }
      this.timer = setTimeout(tick, Math.max(0, Math.min(this.nextBeatAt, this.lastFrameAt + 3 * this.intervalMs) - now));
    };
    this.timer = setTimeout(tick, this.intervalMs);
  }

  private end(err: RoomcastError, quiet = false): void {
    if (this.ended) return;
    if (err instanceof CloseError && this.kick && (err.code !== this.kick.code || err.limited)) {
      // A server older than Kick.retry_after_ms said it only in the Error before.
      err = new CloseError(this.kick.code, this.kick.reason || err.reason, this.kick.retryAfterMs || this.hintMs);
    }
    this.ended = err;
    clearTimeout(this.timer);
    clearTimeout(this.leaving?.timer);
    this.conn?.close();
    for (const w of this.waiting.values()) w.reject(err);
    this.waiting.clear();
    if (this.loginDone) this.loginDone(err);
    else if (!quiet) this.tell(() => this.sink.end(this, err));
  }
}
