// De-duplication by id and ordering by (server time, id) of the messages handed to the app.

import type { Message } from "./gen/message_pb.js";

/** compareMessages orders by server time, then by id (ids sort by time and are unique). */
export function compareMessages(a: Message, b: Message): number {
  if (a.serverTimeMs !== b.serverTimeMs) return a.serverTimeMs < b.serverTimeMs ? -1 : 1;
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}

/**
 * Delivery hands messages to the app at most once each and in order. Live messages of one
 * connection arrive in order; what can arrive out of order is history (recovery after a
 * reconnect, history on join), which the ChatLink sends after the LoginAck, possibly after live
 * messages. So while history is awaited, everything is held, and released sorted once it came.
 */
export class Delivery {
  /** The greatest id seen, what a reconnect recovers from; "" before any. */
  lastId = "";
  private readonly seen = new Set<string>();
  private held: Message[] | undefined;

  constructor(
    private readonly window: number,
    private readonly deliver: (m: Message) => void,
  ) {}

  /** remember marks an id as seen without delivering it (the app's own sends: there is no echo, but recovery would return them). */
  remember(id: string): void {
    if (!id || this.seen.has(id)) return;
    this.seen.add(id);
    if (this.seen.size > this.window) this.seen.delete(this.seen.values().next().value!);
    if (id > this.lastId) this.lastId = id;
  }

  /** add takes a batch from the server and returns how many were new. */
  add(msgs: readonly Message[]): number {
    const fresh: Message[] = [];
    for (const m of msgs) {
      if (this.seen.has(m.id)) continue;
      this.remember(m.id);
      fresh.push(m);
    }
    if (this.held) this.held.push(...fresh);
    else this.emit(fresh);
    return fresh.length;
  }

  /** holding reports whether messages are being held for history. */
  get holding(): boolean {
    return this.held !== undefined;
  }

  /** hold starts holding messages until release. */
  hold(): void {
    this.held ??= [];
  }

  /** release delivers what was held, in order, and stops holding. */
  release(): void {
    const held = this.held;
    this.held = undefined;
    if (held) this.emit(held);
  }

  private emit(msgs: Message[]): void {
    if (msgs.length > 1) msgs.sort(compareMessages);
    for (const m of msgs) this.deliver(m);
  }
}
