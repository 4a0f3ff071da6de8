// De-duplication by id and ordering by (server time, id) of the messages handed to the app.

import type { Message } from "./gen/message_pb.js";

/** compareMessages orders by server time, then by id (ids sort by time and are unique). */
export function compareMessages(a: Message, b: Message): number {
  if (a.serverTimeMs !== b.serverTimeMs) return a.serverTimeMs < b.serverTimeMs ? -1 : 1;
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}

const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/**
 * idFloor returns the least message id of millisecond ms: it sorts before every id made then or
 * later. An id is 26 characters of Crockford base32, the first 10 the milliseconds
 * (docs/protocol.md), so this is a valid recover_since asking for everything from ms on.
 */
export function idFloor(ms: number): string {
  let t = BigInt(Math.max(0, Math.floor(ms)));
  let head = "";
  for (let i = 0; i < 10; i++) {
    head = crockford[Number(t & 31n)] + head;
    t >>= 5n;
  }
  return head + "0".repeat(16);
}

const recallMark = "recall:";

/**
 * Delivery hands messages to the app at most once each and in order. Live messages of one
 * connection arrive in order; what can arrive out of order is history (recovery after a
 * reconnect, history on join), which the ChatLink sends after the LoginAck, possibly after live
 * messages. So while history is awaited, everything is held, and released sorted once it came.
 *
 * Messages from CDN segments share the ids seen (a message may come both ways around a mode
 * change) but not lastId and lastSeq: those say where the long connection's recovery starts,
 * and segments lag behind it.
 */
export class Delivery {
  /** The greatest id of the long connection seen, what a reconnect recovers from; "" before any. */
  lastId = "";
  /** The greatest room_seq of the long connection seen: Login.recover_since_room_seq. */
  lastSeq = 0n;
  private readonly seen = new Set<string>();
  private held: Message[] | undefined;

  constructor(
    private readonly window: number,
    private readonly deliver: (m: Message) => void,
  ) {}

  /**
   * remember marks the id of a message the app sent as seen without delivering it: there is no
   * echo, but recovery would return it. It does not move lastId: messages of others stamped
   * before it may still be on their way (as in the Go SDK).
   */
  remember(id: string): void {
    this.mark(id);
  }

  /** add takes a batch from the long connection and returns how many were new. */
  add(msgs: readonly Message[]): number {
    const fresh = this.fresh(msgs);
    for (const m of fresh) {
      if (m.id > this.lastId) this.lastId = m.id;
      if (m.roomSeq > this.lastSeq) this.lastSeq = m.roomSeq;
    }
    this.release(fresh);
    return fresh.length;
  }

  /** fresh returns the messages of msgs not seen before, and marks them seen without delivering them. */
  fresh(msgs: readonly Message[]): Message[] {
    const out: Message[] = [];
    for (const m of msgs) if (this.mark(m.id)) out.push(m);
    return out;
  }

  /** release delivers msgs (already marked seen) in order, or holds them with the rest while history is awaited. */
  release(msgs: Message[]): void {
    if (this.held) this.held.push(...msgs);
    else this.emit(msgs);
  }

  /** holding reports whether messages are being held for history. */
  get holding(): boolean {
    return this.held !== undefined;
  }

  /** hold starts holding messages until unhold. */
  hold(): void {
    this.held ??= [];
  }

  /** unhold delivers what was held, in order, and stops holding. */
  unhold(): void {
    const held = this.held;
    this.held = undefined;
    if (held) this.emit(held);
  }

  /**
   * recall takes the ids of a Recall frame and returns those it had not been told of: each is
   * marked seen (a copy that comes later, live, in a recovery or a segment, is a duplicate) and
   * dropped from what is held for history. A recall is remembered among the ids seen, as
   * "recall:" and the id, so that one sent again is not told twice.
   */
  recall(ids: readonly string[]): string[] {
    const told: string[] = [];
    for (const id of ids) {
      if (!id || !this.mark(recallMark + id)) continue;
      this.mark(id);
      told.push(id);
    }
    if (told.length && this.held) this.held = this.held.filter((m) => !told.includes(m.id));
    return told;
  }

  /** mark adds id to the ids seen and reports whether it is new; without an id every message is new. */
  private mark(id: string): boolean {
    if (!id) return true;
    if (this.seen.has(id)) return false;
    this.seen.add(id);
    if (this.seen.size > this.window) this.seen.delete(this.seen.values().next().value!);
    return true;
  }

  private emit(msgs: Message[]): void {
    if (msgs.length > 1) msgs.sort(compareMessages);
    for (const m of msgs) this.deliver(m);
  }
}
