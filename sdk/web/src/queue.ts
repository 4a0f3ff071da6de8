// The room queue (docs/protocol.md, "Room queue"): the error of a refused request, the change
// events the room receives, and a view that keeps a copy of the queue in step with them.

import { fromBinary } from "@bufbuild/protobuf";
import { errorCodeName, RoomcastError } from "./errors.js";
import { ErrorCode } from "./gen/client_pb.js";
import { Lane, type Message, type QueueEntry, type QueueEvent, QueueEventSchema, QueueOp } from "./gen/message_pb.js";

/** The message type of a room queue change (critical lane, from the server). */
export const QUEUE_EVENT_TYPE = "rc.queue";

/**
 * QueueError is the server's refusal of a queue request; the connection stays. code is an
 * ErrorCode: 114 QUEUE_KEY_EXISTS (the key is taken: someone else grabbed it), 115
 * QUEUE_NOT_FOUND, 116 QUEUE_FULL, 100 BAD_REQUEST, 101 MESSAGE_TOO_LARGE, 103 FORBIDDEN,
 * 503 UNAVAILABLE.
 */
export class QueueError extends RoomcastError {
  override name = "QueueError";
  constructor(
    readonly code: number,
    readonly serverMessage = "",
  ) {
    super(`roomcast: queue request refused: code ${code} (${errorCodeName(code)})${serverMessage ? ": " + serverMessage : ""}`);
  }

  /** The key is taken (an offer with ifAbsent lost the race). */
  get keyExists(): boolean {
    return this.code === ErrorCode.QUEUE_KEY_EXISTS;
  }
}

/** queueEventOf returns the queue change m carries, or undefined when m is not one (or not from the server). */
export function queueEventOf(m: Message): QueueEvent | undefined {
  if (m.type !== QUEUE_EVENT_TYPE || m.sender !== "" || m.lane !== Lane.CRITICAL) return undefined;
  try {
    const ev = fromBinary(QueueEventSchema, m.body);
    return ev.version > 0n ? ev : undefined;
  } catch {
    return undefined;
  }
}

/**
 * QueueView is a copy of a room's queue kept in step with its change events: reset() it with
 * queueList()'s answer, then apply() every event. Events are applied in version order whatever
 * order they come in; one that arrives before its predecessor waits for it.
 */
export class QueueView {
  private _version = 0n;
  private _entries: QueueEntry[] = [];
  private early = new Map<bigint, QueueEvent>();

  /** reset replaces the view with a listing and drops the waiting events it covers. */
  reset(entries: readonly QueueEntry[], version: bigint): void {
    this._entries = [...entries];
    this._version = version;
    for (const v of [...this.early.keys()]) if (v <= version) this.early.delete(v);
    this.drain();
  }

  /** apply takes in one change; true means events are missing (if that lasts, reset from a new listing). */
  apply(ev: QueueEvent): boolean {
    if (ev.version > this._version) {
      this.early.set(ev.version, ev);
      this.drain();
    }
    return this.early.size > 0;
  }

  /** The entries, head first. */
  get entries(): readonly QueueEntry[] {
    return this._entries;
  }

  /** The version of the queue the view shows. */
  get version(): bigint {
    return this._version;
  }

  /** How many events wait for a missing predecessor. */
  get waiting(): number {
    return this.early.size;
  }

  private drain(): void {
    for (;;) {
      const ev = this.early.get(this._version + 1n);
      if (!ev) return;
      this.early.delete(ev.version);
      this.change(ev);
      this._version = ev.version;
    }
  }

  private change(ev: QueueEvent): void {
    const indexOf = (key: string) => this._entries.findIndex((e) => e.key === key);
    switch (ev.op) {
      case QueueOp.OFFER:
        for (const e of ev.entries) {
          const i = indexOf(e.key);
          if (i >= 0) this._entries[i] = e;
          else this._entries.push(e);
        }
        return;
      case QueueOp.CLEAR:
        this._entries = [];
        return;
      default: // poll, remove, drop
        for (const e of ev.entries) {
          const i = indexOf(e.key);
          if (i >= 0) this._entries.splice(i, 1);
        }
    }
  }
}
