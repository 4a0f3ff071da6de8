// The client: connects through the dispatcher, keeps the connection up, and hands the app each
// message once and in order.

import { CdnPoller, type CdnStats } from "./cdn.js";
import type { Endpoint, Config, Settings } from "./config.js";
import { MAX_FRAME_SIZE, withDefaults } from "./config.js";
import { CounterState, validCounterName } from "./counters.js";
import { AttributeError, AttributeState, type AttributesEvent, type MemberNoticeEvent, type ViewersEvent, viewersOf } from "./live.js";
import { Delivery, idFloor } from "./delivery.js";
import { InboxSeen } from "./inbox.js";
import { dispatch } from "./dispatch.js";
import {
  ClosedError,
  CloseError,
  closeCodeName,
  HistoryUnavailableError,
  NotConnectedError,
  ProtocolError,
  RoomcastError,
  SendError,
} from "./errors.js";
import type { CdnConfig } from "./gen/cdn_pb.js";
import { ErrorCode, type HistoryPage, type LoginAck, ModerateOp, type ModerateReply, type Push, type Reconnect, type RoomQueueReply, type SendAck } from "./gen/client_pb.js";
import { Lane, type Message, type QueueEntry, QueueOp } from "./gen/message_pb.js";
import { ModerateError } from "./moderate.js";
import { QueueError } from "./queue.js";
import { type LoginOptions, Session, type SessionSink } from "./session.js";

const unavailable = (why: string) => ({
  recovered: false,
  missing: 0,
  error: new HistoryUnavailableError(`roomcast: the room's history is unavailable: ${why}`),
});

/** A message to send. */
export interface Outgoing {
  /** App-defined, e.g. "chat" or "gift"; at most 32 bytes. Default "chat". */
  type?: string;
  /** The message's priority class. Default Lane.NORMAL. */
  lane?: Lane;
  /** Not empty, at most 16,384 bytes; a string is sent as UTF-8. */
  body: Uint8Array | string;
  /** If set, only members whose tags satisfy it receive the message. */
  tagExpr?: string;
}

/**
 * A page of the room's history to ask for (Client.history). Give at most one of beforeId,
 * afterId and cursor; none asks for the newest messages.
 */
export interface HistoryQuery {
  /** At most this many messages. Default 50; the server caps it at 200. */
  limit?: number;
  /** The messages older than this message id. */
  beforeId?: string;
  /** The messages newer than this message id. */
  afterId?: string;
  /** The next page: a HistoryPage's nextCursor, as it came. */
  cursor?: string;
  /** Only this lane: Lane.CRITICAL or Lane.NORMAL. Default both. */
  lane?: Lane;
}

/**
 * recalled: a message of the room was recalled (by the app server, its sender or a moderator).
 * Remove it
 * from what is shown; the client does not emit it as a "message" from now on, whichever way a
 * copy comes (a recovery, a CDN segment). Once per message.
 */
export interface RecalledEvent {
  /** The recalled message's id. */
  id: string;
  /** When it was recalled, server time, Unix milliseconds. */
  recalledMs: number;
  /** The member who recalled it (its sender, or a moderator of the room); "" when the app server did. */
  byUid: string;
}

/** The client's state; `state` changes are reported by the events below. */
export type State = "idle" | "connecting" | "connected" | "reconnecting" | "closed";

/** connected: a login succeeded, the first or after a reconnect. */
export interface ConnectedEvent {
  loginAck: LoginAck;
  endpoint: Endpoint;
  /** "ws", or "sse" for the HTTP fallback. */
  transport: "ws" | "sse";
  /** Whether this is a reconnect (the client recovers what it missed). */
  reconnected: boolean;
}

/** reconnecting: the connection ended (or the server asked to move) and the client tries again after delayMs. */
export interface ReconnectingEvent {
  /** Consecutive attempts so far, from 1. */
  attempt: number;
  delayMs: number;
  /** Why: the close (a CloseError), an error, or the server's Reconnect request. */
  reason: RoomcastError;
}

/**
 * recovered: the answer to a login that asked for what was missed (after a reconnect, or
 * Config.recoverSince or Config.history on the first login) has been delivered: every message it
 * brought came before this event.
 */
export interface RecoveredEvent {
  /** The id the client recovered from; "" for Config.history. */
  since: string;
  /**
   * True when nothing is missing: every kept message after since that this member may see has
   * been delivered (also when there was none). False when the gap was larger than the room's
   * history (missing says how many are lost), or when the server could not answer (error).
   */
  recovered: boolean;
  /**
   * When recovered is false, how many of the room's critical and normal messages after since are
   * no longer kept; 0 when the server could not count them. It may include messages this
   * member's tags would not allow.
   */
  missing: number;
  /** How many messages the answer brought that had not arrived otherwise. */
  count: number;
  /**
   * Set when the server could not answer: a HistoryUnavailableError, or a SendError with the
   * server's code (109 BAD_RECOVER_SINCE, 503 UNAVAILABLE). Nothing was recovered.
   */
  error?: RoomcastError;
}

/**
 * thinned: the room's budget, the node's flow control or this client's slow reading left
 * messages out of the stream, counted per lane since the previous push. Critical messages are
 * never left out.
 */
export interface ThinnedEvent {
  normal: number;
  bulk: number;
}

/** kicked: the server sent a Kick before closing the connection. */
export interface KickedEvent {
  code: number;
  /** The code's name, e.g. "KICKED", "SHUTDOWN". */
  name: string;
  reason: string;
  /** Whether the client gives up (4000–4499) rather than reconnects. */
  terminal: boolean;
}

/**
 * limited: the server refused a login for now (4013 LOGIN_RATE_LIMITED: a login or join rate;
 * 4015 TOO_MANY_CONNECTIONS) and said when to come back. The client logs in again after
 * delayMs (the hint plus jitter), through the dispatcher when it uses one: within connect(),
 * or as a reconnect (a reconnecting event with the same delay follows).
 */
export interface LimitedEvent {
  code: number;
  /** The code's name, "LOGIN_RATE_LIMITED" or "TOO_MANY_CONNECTIONS". */
  name: string;
  /** The server's hint; 0 when it gave none (the backoff then). */
  retryAfterMs: number;
  delayMs: number;
}

/** The events of a Client, by name. */
/** counters: the room's counters changed, or a login found some. */
export interface CountersEvent {
  /** Every counter of the room and its running total, by name; a reset counter is absent. */
  totals: Record<string, number>;
  /** Grows with every change; the client emits only totals newer than the last it emitted. */
  version: bigint;
}

/** counterRefused: the server refused an addCounter; the amount was not counted. */
export interface CounterRefusedEvent {
  name: string;
  amount: number;
  /** code 120 SEND_RATE_LIMITED (with retryAfterMs), 124 TOO_MANY_COUNTERS, or 100 BAD_REQUEST (an amount over the limit). */
  error: SendError;
}

export interface ClientEvents {
  connected: ConnectedEvent;
  /** The room's counters (likes, gifts): a few times a second while they change. */
  counters: CountersEvent;
  counterRefused: CounterRefusedEvent;
  /** The room's members online, over every ChatLink: a few seconds apart, when it changes. */
  viewers: ViewersEvent;
  /** A member joined or left (rooms whose settings ask for it, while small). */
  memberNotice: MemberNoticeEvent;
  /** The room's attributes (announcement, pinned message): at login and at every change. */
  attributes: AttributesEvent;
  /** Every message of the room, once, in (server time, id) order. */
  message: Message;
  /** A message was recalled: remove it from what is shown. */
  recalled: RecalledEvent;
  reconnecting: ReconnectingEvent;
  recovered: RecoveredEvent;
  thinned: ThinnedEvent;
  kicked: KickedEvent;
  limited: LimitedEvent;
  /** Something went wrong that the client handles itself (it reconnects): a protocol error, a failed attempt, a timeout. */
  error: RoomcastError;
  /** The client stopped for good: close(), a terminal close code, or reconnect turned off. */
  closed: RoomcastError;
}

type Listener<T> = (ev: T) => void;

/**
 * Client is a connection to a room that stays up: it dispatches, logs in, and after a transient
 * close, an error or the server's Reconnect it connects again with backoff and jitter, recovering
 * the messages it missed from the last id it saw.
 */
export class Client {
  private readonly s: Settings;
  private readonly delivery: Delivery;
  private readonly inbox = new InboxSeen(); // at-least-once messages handed on (inbox.ts)
  private readonly listeners = new Map<keyof ClientEvents, Set<Listener<never>>>();
  private session: Session | undefined;
  private _state: State = "idle";
  private seq = 0n;
  private attempt = 0;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  private moveTimer: ReturnType<typeof setTimeout> | undefined;
  private leaving: string | undefined; // the node that asked to move: tried last until a login elsewhere
  private establishing = false; // a reconnect or move is dialing
  private holdTimer: ReturnType<typeof setTimeout> | undefined;
  private recovering: { since: string; count: number } | undefined;
  private since: string; // Config.recoverSince until the server refuses it
  private baseline = ""; // the id floor of the first login's time: recovery's start before any message
  private readonly poller: CdnPoller;
  private dispatched: { endpoints: Endpoint[]; until: number } | undefined;
  private worked: "ws" | "sse" | undefined; // the transport of the last login
  private sink: SessionSink;
  private readonly counterState = new CounterState();
  private readonly attrState = new AttributeState();
  private viewerState: ViewersEvent = { online: 0, tags: {} };

  constructor(config: Config) {
    this.s = withDefaults(config);
    this.since = this.s.recoverSince;
    this.delivery = new Delivery(this.s.dedupeWindow, (m) => this.emit("message", m));
    this.poller = new CdnPoller({
      fetch: this.s.fetch,
      region: this.s.cdnRegion,
      logger: this.s.logger,
      fresh: (msgs) => this.delivery.fresh(msgs),
      release: (m) => this.delivery.release([m]),
    });
    this.sink = {
      push: (s, p) => this.onPush(s, p),
      reconnect: (s, r) => this.onReconnect(s, r),
      end: (s, err) => this.onEnd(s, err),
      cdn: (s, c) => {
        if (s === this.session) this.poller.configure(c);
      },
      historyFailed: (s, err) => this.onHistoryFailed(s, err),
      counters: (s, t) => {
        const totals = this.counterState.take(t);
        if (totals && s === this.session) this.emit("counters", { totals, version: t.version });
      },
      counterRefused: (_s, add, error) => this.emit("counterRefused", { name: add.name, amount: add.amount, error }),
      viewers: (s, v) => {
        if (s !== this.session) return;
        this.viewerState = viewersOf(v);
        this.emit("viewers", { online: this.viewerState.online, tags: { ...this.viewerState.tags } });
      },
      memberNotice: (s, n) => {
        if (s !== this.session) return;
        for (const ch of n.changes) this.emit("memberNotice", { uid: ch.uid, left: ch.left });
      },
      attributes: (s, a) => {
        const ev = this.attrState.take(a);
        if (ev && s === this.session) this.emit("attributes", ev);
      },
      // From any session, a move's old one included: a recall is never wrong to apply.
      recall: (_s, r) => {
        const told = this.delivery.recall(r.messages.map((m) => m.id));
        if (!told.length) return;
        this.poller.drop(told);
        for (const m of r.messages) {
          if (told.includes(m.id)) this.emit("recalled", { id: m.id, recalledMs: Number(m.recalledMs), byUid: m.byUid });
        }
      },
    };
  }

  /** on adds a listener and returns a function that removes it. */
  on<K extends keyof ClientEvents>(type: K, fn: Listener<ClientEvents[K]>): () => void {
    let set = this.listeners.get(type);
    if (!set) this.listeners.set(type, (set = new Set()));
    set.add(fn as Listener<never>);
    return () => set.delete(fn as Listener<never>);
  }

  get state(): State {
    return this._state;
  }

  /** The current session's LoginAck, or undefined while not connected. */
  get loginAck(): LoginAck | undefined {
    return this.session?.loginAck;
  }

  /** The endpoint of the current session. */
  get endpoint(): Endpoint | undefined {
    return this.session?.endpoint;
  }

  /** How the current session reaches its ChatLink: "ws", or "sse" for the HTTP fallback. */
  get transport(): "ws" | "sse" | undefined {
    return this.session?.transport;
  }

  /** The greatest message id received over the connection: what a later session can pass as Config.recoverSince. */
  get lastId(): string {
    return this.delivery.lastId;
  }

  /** The room's CDN config while the client polls its segments (in CDN mode, and while leaving it, up to lastIndex), else undefined. */
  get cdnConfig(): CdnConfig | undefined {
    return this.poller.config;
  }

  /** What the segment poller did so far: a copy. */
  get cdnStats(): CdnStats {
    return { ...this.poller.stats };
  }

  /**
   * connect finds a ChatLink and logs in, trying the endpoints in order (a failure or a transient
   * close moves to the next; a terminal close code rejects at once). It resolves with the
   * LoginAck; from then on the client reconnects by itself until close(). When every endpoint
   * fails it rejects, and connect may be called again; but a login refused for now (4013,
   * 4015) is tried again after the server's hint plus jitter (a limited event), until close().
   */
  async connect(): Promise<LoginAck> {
    if (this._state !== "idle") throw new RoomcastError(`roomcast: connect while ${this._state}`);
    this._state = "connecting";
    const login = { recoverSince: this.since, recoverSinceRoomSeq: 0n, history: this.s.history };
    try {
      let session: Session | undefined;
      for (let attempt = 1; !session; attempt++) {
        try {
          session = await this.establish(login);
        } catch (e) {
          const delayMs = this.limitedDelay(e, attempt);
          if (delayMs === undefined || this.closed) throw e;
          await new Promise((resolve) => {
            this.retryTimer = setTimeout(resolve, delayMs);
          });
          this.retryTimer = undefined;
          if (this.closed) throw new ClosedError();
        }
      }
      this.adopt(session, login, false);
      return session.loginAck!;
    } catch (e) {
      if (this._state === "connecting") this._state = "idle";
      throw e;
    }
  }

  /** send sends m to the room and resolves with the server's SendAck, or rejects with a SendError (the connection stays) or the connection's end. */
  async send(m: Outgoing): Promise<SendAck> {
    const s = this.session;
    if (this.closed) throw new ClosedError();
    if (!s || this._state !== "connected") throw new NotConnectedError();
    const body = typeof m.body === "string" ? new TextEncoder().encode(m.body) : m.body;
    if (body.length > MAX_FRAME_SIZE) throw new RoomcastError(`roomcast: frame too large: body of ${body.length} bytes`);
    const ack = await s.send(++this.seq, { type: m.type ?? "chat", lane: m.lane ?? Lane.NORMAL, body, tagExpr: m.tagExpr ?? "" });
    this.delivery.remember(ack.messageId);
    return ack;
  }

  /**
   * addCounter adds amount (1 to the server's limit, 100 by default) to the room's counter name
   * (1 to 32 characters of A-Z a-z 0-9 _ - : ., like "like" or "gift:rose"): a tap of a like or
   * a gift. It returns once the frame is written; the server does not answer an add it counts,
   * and tells of one it refuses with a counterRefused event. The totals come as counters
   * events. Throws NotConnectedError while not connected, a RoomcastError for a bad name.
   */
  addCounter(name: string, amount = 1): void {
    const s = this.session;
    if (this.closed) throw new ClosedError();
    if (!validCounterName(name)) throw new RoomcastError(`roomcast: counter name must be 1 to 32 characters of A-Z a-z 0-9 _ - : ., not ${JSON.stringify(name)}`);
    if (!Number.isInteger(amount) || amount < 1 || amount > 0xffffffff) throw new RoomcastError(`roomcast: counter amount must be a positive integer, not ${amount}`);
    if (!s || this._state !== "connected") throw new NotConnectedError();
    s.counterAdd(++this.seq, name, amount);
  }

  /** The room's members online as last received (0 before any), and per viewer tag. */
  get viewers(): ViewersEvent {
    return { online: this.viewerState.online, tags: { ...this.viewerState.tags } };
  }

  /** The room's attributes as last received (a copy; empty before any), and their version. */
  get attributes(): AttributesEvent {
    return { attrs: { ...this.attrState.attrs }, version: this.attrState.version };
  }

  /** The room's counters as last received (a copy; empty before any), and their version. */
  get counters(): CountersEvent {
    return { totals: { ...this.counterState.totals }, version: this.counterState.version };
  }

  /**
   * history asks for a page of the room's kept history (critical and normal messages this
   * member may see) and resolves with it, or rejects with a HistoryError (the connection stays)
   * or the connection's end. The page's messages come oldest first and are not emitted as
   * "message" events; its nextCursor, given as the next query's cursor, continues in the same
   * direction (older for the newest messages and beforeId, newer for afterId), and is empty
   * when the room keeps nothing more that way. docs/protocol.md describes paging.
   */
  async history(q: HistoryQuery = {}): Promise<HistoryPage> {
    const s = this.session;
    if (this.closed) throw new ClosedError();
    if (!s || this._state !== "connected") throw new NotConnectedError();
    return s.history(++this.seq, {
      limit: q.limit ?? 0, beforeId: q.beforeId ?? "", afterId: q.afterId ?? "", cursor: q.cursor ?? "", lane: q.lane ?? Lane.UNSPECIFIED,
    });
  }

  /**
   * queueOffer adds an entry with key and value at the tail of the room's queue, or replaces the
   * value of this member's entry with key in place, and resolves with the entry as stored. With
   * ifAbsent a taken key rejects with a QueueError 114 (grab the mic: of many offers of one key,
   * exactly one wins); with dropOnLeave the entry goes when this connection's session ends.
   */
  async queueOffer(key: string, value: Uint8Array | string = new Uint8Array(), opts: { ifAbsent?: boolean; dropOnLeave?: boolean } = {}): Promise<QueueEntry> {
    const bytes = typeof value === "string" ? new TextEncoder().encode(value) : value;
    return first(await this.queue({ op: QueueOp.OFFER, key, value: bytes, ifAbsent: opts.ifAbsent ?? false, dropOnLeave: opts.dropOnLeave ?? false }));
  }

  /** queuePoll takes the entry with key (the head, for "") out of the queue and resolves with it. */
  async queuePoll(key = ""): Promise<QueueEntry> {
    return first(await this.queue({ op: QueueOp.POLL, key }));
  }

  /** queuePeek resolves with the entry with key (the head, for "") without taking it. */
  async queuePeek(key = ""): Promise<QueueEntry> {
    return first(await this.queue({ op: QueueOp.PEEK, key }));
  }

  /** queueRemove takes the entry with key out of the queue and resolves with it. */
  async queueRemove(key: string): Promise<QueueEntry> {
    return first(await this.queue({ op: QueueOp.REMOVE, key }));
  }

  /** queueList resolves with every entry, head first, and the queue's version (for QueueView.reset). */
  async queueList(): Promise<{ entries: QueueEntry[]; version: bigint }> {
    const r = await this.queue({ op: QueueOp.LIST });
    return { entries: r.entries, version: r.version };
  }

  /** queueClear empties the queue (the room's queue_admin_expr must allow it) and resolves with the entries taken out. */
  async queueClear(): Promise<QueueEntry[]> {
    return (await this.queue({ op: QueueOp.CLEAR })).entries;
  }

  /**
   * recall recalls a message this member sent (its SendAck's messageId), if the room lets
   * members recall theirs (its sender_recall_window_s) and the message is young enough. It
   * resolves with alreadyRecalled true when it had been recalled before; a refusal rejects with
   * a SendError: 130 MESSAGE_NOT_FOUND, 131 RECALL_NOT_ALLOWED, 132 RECALL_WINDOW_PASSED.
   * Every member, this one included, gets a "recalled" event.
   */
  async recall(messageId: string): Promise<{ alreadyRecalled: boolean }> {
    const s = this.session;
    if (this.closed) throw new ClosedError();
    if (!s || this._state !== "connected") throw new NotConnectedError();
    const r = await s.recall(++this.seq, messageId);
    if (r.code !== 0) throw new SendError(r.code, r.message);
    return { alreadyRecalled: r.alreadyRecalled };
  }

  /** queue sends a queue request on the current connection; a refusal rejects with a QueueError. */
  private async queue(req: { op: QueueOp; key?: string; value?: Uint8Array; ifAbsent?: boolean; dropOnLeave?: boolean }): Promise<RoomQueueReply> {
    const s = this.session;
    if (this.closed) throw new ClosedError();
    if (!s || this._state !== "connected") throw new NotConnectedError();
    const r = await s.queue(++this.seq, req);
    if (r.code !== 0) throw new QueueError(r.code, r.message);
    return r;
  }

  /**
   * mute stops the member uid sending in the room for durationMs milliseconds (0: until
   * unmuted). This member must be a moderator of the room and uid within its scope
   * (docs/protocol.md, "Moderators"); a refusal rejects with a ModerateError. Resolves with the
   * member's sessions in the room.
   */
  async mute(uid: string, durationMs = 0): Promise<number> {
    if (!Number.isInteger(durationMs) || durationMs < 0) throw new RangeError(`roomcast: mute ${uid}: durationMs must be a whole number of milliseconds, 0 or more (got ${durationMs})`);
    return this.moderate({ op: ModerateOp.MUTE, uid, durationMs: BigInt(durationMs) });
  }

  /** unmute lifts the member uid's mute in the room, as mute does. Resolves with the member's sessions in the room. */
  async unmute(uid: string): Promise<number> {
    return this.moderate({ op: ModerateOp.UNMUTE, uid });
  }

  /**
   * remove closes the member uid's sessions in the room (Kick 4007 KICKED with reason; "" says
   * "removed by a moderator"), as mute does. The member may log in again. Resolves with the
   * sessions closed.
   */
  async remove(uid: string, reason = ""): Promise<number> {
    return this.moderate({ op: ModerateOp.REMOVE, uid, reason });
  }

  /**
   * recallAsModerator recalls the message messageId of the room (critical or normal lane: what
   * history keeps), as mute does; every member, this one included, gets a "recalled" event
   * naming this member. A scoped moderator recalls only the messages of members in its scope who
   * are in the room now (ModerateError 141 OUTSIDE_SCOPE, 107 USER_NOT_FOUND), not the app
   * server's (141); a room-wide moderator recalls any. A message the room's history does not hold
   * rejects with a ModerateError 130 MESSAGE_NOT_FOUND; one recalled before resolves.
   */
  async recallAsModerator(messageId: string): Promise<void> {
    await this.moderate({ op: ModerateOp.RECALL, uid: "", messageId });
  }

  /** moderate sends a moderate request on the current connection; a refusal rejects with a ModerateError. */
  private async moderate(req: { op: ModerateOp; uid: string; durationMs?: bigint; reason?: string; messageId?: string }): Promise<number> {
    const s = this.session;
    if (this.closed) throw new ClosedError();
    if (!s || this._state !== "connected") throw new NotConnectedError();
    const r: ModerateReply = await s.moderate(++this.seq, req);
    if (r.code !== 0) throw new ModerateError(r.code, r.message);
    return Number(r.affected);
  }

  /**
   * setAttribute sets one of the room's attributes, for a member the room permits (its
   * attributes_expr and attribute_keys), and resolves with the version of the room's attributes
   * it made; every member, this one included, then gets the attributes event. A refusal rejects
   * with an AttributeError (150 ATTRIBUTES_NOT_ALLOWED, 125 ATTRIBUTES_FULL, ...).
   */
  async setAttribute(key: string, value: string): Promise<bigint> {
    return this.changeAttribute(key, value, false);
  }

  /** removeAttribute takes one of the room's attributes out, as setAttribute sets one. */
  async removeAttribute(key: string): Promise<bigint> {
    return this.changeAttribute(key, "", true);
  }

  private async changeAttribute(key: string, value: string, remove: boolean): Promise<bigint> {
    const s = this.session;
    if (this.closed) throw new ClosedError();
    if (!s || this._state !== "connected") throw new NotConnectedError();
    const r = await s.setAttribute(++this.seq, key, value, remove);
    if (r.code !== 0) throw new AttributeError(r.code, r.message, r.retryAfterMs);
    return r.version;
  }

  /** close ends the connection and stops reconnecting; the closed event follows. It may be called more than once. */
  close(): void {
    this.stop(new ClosedError());
  }

  // A method, not a comparison of _state, so that TypeScript does not narrow it across awaits.
  private get closed(): boolean {
    return this._state === "closed";
  }

  private stop(err: RoomcastError): void {
    if (this._state === "closed") return;
    this._state = "closed";
    clearTimeout(this.retryTimer);
    clearTimeout(this.moveTimer);
    this.endHold();
    this.poller.stop();
    const s = this.session;
    this.session = undefined;
    s?.close(err);
    this.emit("closed", err);
  }

  /** establish tries the endpoints in order and returns the first session that logged in. */
  private async establish(login: LoginOptions): Promise<Session> {
    let endpoints = this.s.endpoints;
    const fromDispatcher = endpoints.length === 0;
    if (fromDispatcher) {
      if (!this.dispatched || Date.now() >= this.dispatched.until) {
        const d = await dispatch(this.s.fetch, this.s.dispatcher!, this.s.token);
        this.dispatched = { endpoints: d.endpoints, until: Date.now() + d.ttlMs };
      }
      endpoints = this.dispatched.endpoints;
    }
    if (this.leaving !== undefined) {
      // The node being left goes last (a dispatcher may not know yet that it drains).
      const leaving = this.leaving;
      endpoints = [...endpoints.filter((ep) => endpointName(ep) !== leaving), ...endpoints.filter((ep) => endpointName(ep) === leaving)];
    }
    const transports = this.transports();
    if (transports.length === 0) {
      throw new RoomcastError("roomcast: this runtime has neither WebSocket nor EventSource (Node 20 has WebSocket with --experimental-websocket)");
    }
    const errs: string[] = [];
    let limited: CloseError | undefined; // a refusal for now, rethrown when nothing else works
    for (const ep of endpoints) {
      for (const transport of transports) {
        if (this.closed) throw new ClosedError();
        const session = new Session(this.s, ep, transport, login, this.sink);
        try {
          await session.open();
          if (this.closed) {
            session.close(new ClosedError());
            throw new ClosedError();
          }
          this.worked = transport;
          return session;
        } catch (e) {
          if (e instanceof CloseError && e.terminal) throw e;
          if (!(e instanceof RoomcastError)) throw e;
          if (e instanceof CloseError && e.limited) limited = e;
          errs.push(`${ep.node || ep.wsUrl} (${transport}): ${e.message}`);
        }
      }
    }
    if (fromDispatcher) this.dispatched = undefined; // ask again next time
    if (limited) throw limited;
    throw new RoomcastError(`roomcast: no endpoint could be used: ${errs.join("; ")}`);
  }

  /**
   * transports lists how to try an endpoint, in order: with "auto", WebSocket and then the HTTP
   * fallback, or the fallback first once it is what worked (WebSocket is blocked here).
   */
  private transports(): ("ws" | "sse")[] {
    if (this.s.transport !== "auto") return [this.s.transport];
    const have = (["ws", "sse"] as const).filter((t) => (t === "ws" ? this.s.WebSocket : this.s.EventSource));
    return this.worked === "sse" ? [...have].reverse() : [...have];
  }

  /** adopt makes a logged-in session the current one and hears what it received since its LoginAck. */
  private adopt(session: Session, login: LoginOptions, reconnected: boolean): void {
    const old = this.session;
    this.session = session;
    if (this.leaving !== undefined && endpointName(session.endpoint) !== this.leaving) this.leaving = undefined;
    // A move (the server's Reconnect) logs in at the new node before leaving the old one; what
    // was already sent there gets its answer first.
    old?.leave(new CloseError(1000, "moved to another ChatLink"), this.s.attemptTimeoutMs);
    this._state = "connected";
    const ack = session.loginAck!;
    if (!this.baseline && ack.serverTimeMs > 0n) this.baseline = idFloor(Number(ack.serverTimeMs));
    this.emit("connected", { loginAck: ack, endpoint: session.endpoint, transport: session.transport, reconnected });
    if (login.recoverSince || login.history > 0) this.startHold(login.recoverSince);
    this.poller.login(ack);
    session.attach();
  }

  private onPush(s: Session, p: Push): void {
    if (s !== this.session) return;
    if (p.thinned) this.emit("thinned", { normal: p.thinned.normal, bulk: p.thinned.bulk });
    const room = p.messages.filter((m) => !m.atLeastOnce);
    if (room.length < p.messages.length) this.takeInbox(s, p.messages);
    const n = this.delivery.add(room);
    if (p.history && this.recovering) {
      this.recovering.count += n;
      // The last Push of the answer says what it did.
      if (p.recovery) this.endHold({ recovered: p.recovery.recovered, missing: Number(p.recovery.missing) });
    }
  }

  /**
   * takeInbox hands the new at-least-once messages of msgs to the app and acknowledges them,
   * with the copies of those it had (inbox.ts). Without a "message" listener nothing is handed
   * on, so nothing is acknowledged: the server keeps them.
   */
  private takeInbox(s: Session, msgs: readonly Message[]): void {
    if (!this.listeners.get("message")?.size) return;
    const ids: string[] = [];
    for (const m of msgs) {
      if (!m.atLeastOnce) continue;
      if (this.inbox.take(m.id)) this.emit("message", m);
      ids.push(m.id);
    }
    s.ack(ids);
  }

  /** The server refused the login's history request: the hold ends with nothing recovered. */
  private onHistoryFailed(s: Session, err: SendError): void {
    if (s !== this.session || !this.recovering) return;
    // A recover_since the server refuses (from Config.recoverSince) is not asked again.
    if (err.code === ErrorCode.BAD_RECOVER_SINCE && this.recovering.since === this.since) this.since = "";
    this.endHold({ recovered: false, missing: 0, error: err });
  }

  /** The server drains this ChatLink: wait delayMs, dispatch again, log in elsewhere, then leave. */
  private onReconnect(s: Session, r: Reconnect): void {
    if (s !== this.session || this.moveTimer !== undefined || this.establishing) return;
    this.dispatched = undefined;
    this.leaving = endpointName(s.endpoint);
    const reason = new RoomcastError(`roomcast: the server asks to move: ${r.reason || "reconnect"}`);
    this.emit("reconnecting", { attempt: 1, delayMs: r.delayMs, reason });
    this.moveTimer = setTimeout(() => {
      this.moveTimer = undefined;
      void this.reconnectNow();
    }, r.delayMs);
  }

  private onEnd(s: Session, err: RoomcastError): void {
    if (s !== this.session) return;
    this.session = undefined;
    if (s.kick) {
      this.emit("kicked", { code: s.kick.code, name: closeCodeName(s.kick.code), reason: s.kick.reason, terminal: err instanceof CloseError && err.terminal });
    }
    if (!(err instanceof CloseError)) this.emit("error", err);
    // A move waits its delay only while the old connection still serves; without one, the
    // client reconnects like after any close.
    clearTimeout(this.moveTimer);
    this.moveTimer = undefined;
    if (this.retryTimer !== undefined || this.establishing) {
      this._state = "reconnecting"; // an attempt is under way or due
      return;
    }
    if (Date.now() - s.openedAt >= this.s.stableAfterMs) this.attempt = 0;
    this.retry(err);
  }

  /** retry schedules the next attempt with backoff and jitter, or stops for a terminal code. */
  private retry(reason: RoomcastError): void {
    if (this._state === "closed") return;
    if ((reason instanceof CloseError && reason.terminal) || !this.s.reconnect) {
      this.stop(reason);
      return;
    }
    clearTimeout(this.retryTimer);
    this.attempt++;
    // Equal jitter: half the delay fixed, half random, so that a room's clients spread out.
    const cap = this.ceiling(this.attempt);
    const delayMs = this.limitedDelay(reason, this.attempt) ?? Math.round(cap / 2 + Math.random() * (cap / 2));
    this._state = "reconnecting";
    this.emit("reconnecting", { attempt: this.attempt, delayMs, reason });
    this.retryTimer = setTimeout(() => void this.reconnectNow(), delayMs);
  }

  /** ceiling is the longest wait before the attempt-th reconnect. */
  private ceiling(attempt: number): number {
    return Math.min(this.s.reconnectMaxDelayMs, this.s.reconnectMinDelayMs * 2 ** Math.min(attempt - 1, 20));
  }

  /**
   * limitedDelay is the wait before the attempt-th login after err when err is a login the
   * server refused for now (a limited CloseError): its hint plus a random part up to the
   * backoff's ceiling, so that a crowd refused together comes back spread out. It emits the
   * limited event. undefined for any other err.
   */
  private limitedDelay(err: unknown, attempt: number): number | undefined {
    if (!(err instanceof CloseError) || !err.limited) return undefined;
    const delayMs = err.retryAfterMs + Math.round(Math.random() * this.ceiling(attempt));
    this.emit("limited", { code: err.code, name: closeCodeName(err.code), retryAfterMs: err.retryAfterMs, delayMs });
    return delayMs;
  }

  private async reconnectNow(): Promise<void> {
    this.retryTimer = undefined;
    if (this.establishing || this.closed) return;
    const since = this.delivery.lastId || this.since || this.baseline;
    const login = { recoverSince: since, recoverSinceRoomSeq: this.delivery.lastSeq, history: since ? 0 : this.s.history };
    this.establishing = true;
    try {
      const session = await this.establish(login);
      this.establishing = false;
      this.adopt(session, login, true);
    } catch (e) {
      this.establishing = false;
      if (this.closed) return;
      const err = e instanceof RoomcastError ? e : new RoomcastError(String(e));
      this.emit("error", err);
      // After a failed move the draining node may still serve; the retry replaces it.
      this.retry(err);
    }
  }

  /** startHold holds live messages until the history asked for at login arrives, or for recoveryWaitMs. */
  private startHold(since: string): void {
    if (this.recovering) this.endHold(unavailable("the previous connection's history never came"));
    this.delivery.hold();
    this.recovering = { since, count: 0 };
    this.holdTimer = setTimeout(
      () => this.endHold(unavailable(`no answer within ${this.s.recoveryWaitMs} ms`)),
      this.s.recoveryWaitMs,
    );
  }

  /** endHold delivers what was held, in order, then (with how it ended) the recovered event. */
  private endHold(how?: Pick<RecoveredEvent, "recovered" | "missing" | "error">): void {
    clearTimeout(this.holdTimer);
    this.holdTimer = undefined;
    this.delivery.unhold();
    const r = this.recovering;
    this.recovering = undefined;
    if (r && how && this._state !== "closed") this.emit("recovered", { ...r, ...how });
  }

  private emit<K extends keyof ClientEvents>(type: K, ev: ClientEvents[K]): void {
    const set = this.listeners.get(type);
    if (!set) return;
    for (const fn of [...set]) {
      try {
        (fn as Listener<ClientEvents[K]>)(ev);
      } catch (e) {
        // An app's listener must not break the client; report it where the app will see it.
        queueMicrotask(() => {
          throw e;
        });
      }
    }
  }
}

/** first is the one entry a queue answer carries. */
function first(r: RoomQueueReply): QueueEntry {
  const e = r.entries[0];
  if (!e) throw new ProtocolError("roomcast: protocol error: a queue answer without its entry");
  return e;
}

/** endpointName tells endpoints apart: by node name, or by URL for one without a name. */
function endpointName(ep: Endpoint): string {
  return ep.node || ep.wsUrl;
}
