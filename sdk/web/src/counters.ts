// Counters (docs/protocol.md, "Counters"): a member adds to the room's named counters (a tap of a
// like, a gift) and receives their running totals, never a message per tap.

import type { CounterTotals } from "./gen/client_pb.js";

/** The longest counter name, and how many counters a room may have. */
export const MAX_COUNTER_NAME = 32;
export const MAX_ROOM_COUNTERS = 32;

/** validCounterName: 1 to 32 characters of A-Z a-z 0-9 _ - : . */
export function validCounterName(name: string): boolean {
  return /^[A-Za-z0-9_:.-]{1,32}$/.test(name);
}

/** How many adds a session remembers, to name the counter of a refusal. */
export const COUNTER_RING = 256;

/** A sent add, remembered by its seq until a refusal may name it. */
export interface SentAdd {
  seq: bigint;
  name: string;
  amount: number;
}

/**
 * CounterState keeps the room's newest totals: a frame with a version not greater than the last
 * one taken is old (two may cross) and ignored.
 */
export class CounterState {
  version = 0n;
  totals: Record<string, number> = {};

  /** take applies t and returns the totals it makes, or undefined when t is not newer. */
  take(t: CounterTotals): Record<string, number> | undefined {
    if (t.version <= this.version) return undefined;
    const totals: Record<string, number> = {};
    for (const c of t.counters) totals[c.name] = Number(c.total);
    this.version = t.version;
    this.totals = totals;
    return { ...totals };
  }
}
