// Polling a room's CDN segments (docs/cdn.md): which index is due on the server's clock, which
// vendor to ask, what to count, and pacing each window's messages over the window.

import type { Logger } from "./config.js";
import { compareMessages } from "./delivery.js";
import { type CdnConfig, CdnMode, type Segment } from "./gen/cdn_pb.js";
import type { LoginAck } from "./gen/client_pb.js";
import type { Message } from "./gen/message_pb.js";
import { decodeSegment, segmentIndex, segmentUrl } from "./segment.js";

/** CdnStats counts what the segment poller did since the client was made. */
export interface CdnStats {
  /** Segment fetches made. */
  polls: number;
  /** Fetches answered with the segment asked for. */
  hits: number;
  /** Fetches answered 404: not written yet, or never (a gap). */
  misses: number;
  /** Fetches that failed: the network, or an HTTP status other than 200 and 404 (a 5xx vendor). */
  errors: number;
  /** Bodies refused: garbage, truncated, too large, or another room's or window's segment. */
  invalid: number;
  /** Indexes given up: still missing a few windows after they were due, or skipped to catch up. */
  gaps: number;
  /** Segment messages handed on (not seen before). */
  messages: number;
  /** Segment messages dropped because their id had been seen (over the long connection or in another segment). */
  duplicates: number;
  /** Segment messages that came after a later one was released: handed on at once, out of order. */
  late: number;
  /** Messages the pusher's cap left out of the segments fetched (Segment.sampled). */
  sampled: number;
}

const graceMs = 100; // the pusher writes a window this long after its end (docs/cdn.md)
const gapAfterWindows = 3; // a segment still missing this many windows after it was due is a gap, once a later one exists
const maxBehind = 8; // windows fetched at most to catch up (a tab back from the background)
const vendorBackoffMinMs = 1000;
const vendorBackoffMaxMs = 30000;
const delaysKept = 8; // segment arrivals the playout delay is taken from

interface Vendor {
  template: string;
  weight: number;
  regions: string[];
  failures: number;
  downUntil: number; // local ms; a vendor that failed is not asked again before
}

/** What the poller needs of its client. */
export interface PollerDeps {
  fetch: typeof fetch;
  /** The member's region, to choose among vendors that list regions; "" for none. */
  region: string;
  logger: Logger | undefined;
  /** fresh returns the messages not seen before, marking them seen. */
  fresh(msgs: Message[]): Message[];
  /** release hands one message on to the app. */
  release(m: Message): void;
}

type Fetched = { segment: Segment } | { missing: true } | { failed: true };

/**
 * CdnPoller fetches a room's segments while the room is in CDN mode. Windows are on the server's
 * clock, learned from the LoginAck; segment index i is due when its window has ended plus the
 * pusher's grace (or at the previous segment's next_at_ms), and is fetched then plus a random
 * jitter. Vendors are chosen by weight among those serving the member's region; one that fails
 * rests (1 s, doubling to 30 s) while the others are asked. A segment still missing a few
 * windows after it was due is a gap: counted, and passed over. It keeps polling while the long
 * connection reconnects: the two paths are independent, and ids tie them together.
 */
export class CdnPoller {
  readonly stats: CdnStats = { polls: 0, hits: 0, misses: 0, errors: 0, invalid: 0, gaps: 0, messages: 0, duplicates: 0, late: 0, sampled: 0 };
  private cfg: CdnConfig | undefined; // set while polling
  private app = "";
  private room = "";
  private offsetMs = 0; // the server's clock minus ours
  private vendors: Vendor[] = [];
  private next = 0; // the next index to fetch
  private hint: { index: number; atMs: number } | undefined; // when segment index is expected
  private lastPollAt = 0; // server ms of the last regular poll
  private timer: ReturnType<typeof setTimeout> | undefined;
  private gen = 0; // moves on when polling restarts or stops: a fetch of an older gen is dropped
  private busy = false;
  private stalls = 0; // waits in a row on a room whose segments stopped
  private readonly ahead = new Map<number, Segment>(); // segments fetched before their turn
  private readonly pacer: Pacer;

  constructor(private readonly d: PollerDeps) {
    this.pacer = new Pacer(() => this.serverNow(), d.release, this.stats);
  }

  /** config is the CDN config in force, or undefined while the room is not in CDN mode. */
  get config(): CdnConfig | undefined {
    return this.cfg;
  }

  /** login takes a LoginAck: the server's clock, the session's app and room, and the room's config. */
  login(ack: LoginAck): void {
    if (ack.serverTimeMs > 0n) this.offsetMs = Number(ack.serverTimeMs) - Date.now();
    if (ack.app !== this.app || ack.room !== this.room) this.stopPolling();
    this.app = ack.app;
    this.room = ack.room;
    this.configure(ack.cdn);
  }

  /**
   * configure follows a CdnConfig (from a LoginAck or a CdnConfig frame, which replaces the last
   * one whole). An off config with a lastIndex (the room leaves CDN mode, docs/cdn.md) keeps the
   * polling going up to that segment, which holds the last messages sent before the switch; then
   * it stops.
   */
  configure(cfg: CdnConfig | undefined): void {
    const draining = cfg?.mode === CdnMode.OFF && cfg.lastIndex > 0n;
    if (!cfg || (cfg.mode === CdnMode.OFF && !draining) || cfg.windowMs === 0 || cfg.vendors.length === 0) {
      if (this.cfg) this.d.logger?.debug("roomcast: CDN mode off");
      this.stopPolling();
      return;
    }
    const restart = !this.cfg || this.cfg.windowMs !== cfg.windowMs;
    const old = new Map(this.vendors.map((v) => [v.template, v]));
    this.vendors = cfg.vendors.map((v) => ({
      template: v.urlTemplate, weight: v.weight, regions: v.regions,
      failures: old.get(v.urlTemplate)?.failures ?? 0, downUntil: old.get(v.urlTemplate)?.downUntil ?? 0,
    }));
    this.cfg = cfg;
    this.d.logger?.debug("roomcast: CDN mode", CdnMode[cfg.mode], "window", cfg.windowMs, "vendors", cfg.vendors.length);
    if (restart) {
      this.gen++;
      this.busy = false;
      this.next = segmentIndex(this.serverNow(), cfg.windowMs);
      this.hint = undefined;
      this.lastPollAt = 0;
      this.stalls = 0;
      this.ahead.clear();
    }
    if (this.drained()) return;
    if (!this.busy) this.schedule(false);
  }

  /** last is the last index to poll: the off config's lastIndex while the room leaves CDN mode. */
  private last(): number {
    const cfg = this.cfg;
    return cfg && cfg.mode === CdnMode.OFF ? Number(cfg.lastIndex) : Infinity;
  }

  /** drained stops the polling of a room leaving CDN mode once every segment up to the last is in or a gap. */
  private drained(): boolean {
    if (this.next <= this.last()) return false;
    this.d.logger?.debug("roomcast: CDN mode off: the last segment polled");
    this.stopPolling();
    return true;
  }

  /** drop takes recalled messages out of what waits to be released. */
  drop(ids: readonly string[]): void {
    this.pacer.drop(ids);
  }

  /** stop ends polling and drops what waits to be released. */
  stop(): void {
    this.stopPolling();
    this.pacer.stop();
  }

  private stopPolling(): void {
    this.cfg = undefined;
    this.gen++;
    this.busy = false;
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private serverNow(): number {
    return Date.now() + this.offsetMs;
  }

  /** dueAt is the server time at which segment index should be on storage. */
  private dueAt(index: number): number {
    if (this.hint?.index === index) return this.hint.atMs;
    return (index + 1) * this.cfg!.windowMs + graceMs;
  }

  /** schedule sets the timer for the next poll: a retry of the index that was not there, or the next due one. */
  private schedule(retry: boolean): void {
    clearTimeout(this.timer);
    const cfg = this.cfg!;
    const w = cfg.windowMs, interval = cfg.pollIntervalMs || w;
    const jitter = cfg.pollJitterMs || w / 5;
    const now = this.serverNow();
    let at: number;
    if (retry) {
      at = now + Math.min(Math.max(100, Math.min(interval, w) / 2) * 2 ** this.stalls, 4 * w);
      const up = Math.min(...this.vendors.map((v) => v.downUntil)) + this.offsetMs;
      if (up > at) at = up; // every vendor rests
    } else {
      at = Math.max(this.dueAt(this.next), this.lastPollAt + interval);
      this.lastPollAt = at;
    }
    at += Math.random() * jitter;
    this.timer = setTimeout(() => void this.poll(), Math.max(0, at - now));
  }

  /**
   * poll fetches every index that is due, in order. One that is not there yet is asked again
   * soon; one still missing a few windows after it was due is a gap once a later segment exists
   * (docs/cdn.md); when no later one exists either, the room's segments have stopped coming (a
   * pusher lost, storage down): the poller waits, asking less and less often, and falls at most
   * a few windows behind.
   */
  private async poll(): Promise<void> {
    this.timer = undefined;
    const cfg = this.cfg;
    if (!cfg || this.busy) return;
    const gen = this.gen;
    this.busy = true;
    let retry = false;
    const w = cfg.windowMs;
    const latestDue = () => segmentIndex(this.serverNow() - graceMs, w) - 1;
    if (this.next < latestDue() - maxBehind + 1) {
      const skip = latestDue() - maxBehind + 1 - this.next;
      this.stats.gaps += skip;
      this.d.logger?.warn(`roomcast: CDN: ${skip} segments behind, skipped`);
      this.next += skip;
      for (const i of this.ahead.keys()) if (i < this.next) this.ahead.delete(i);
    }
    const last = this.last();
    while (this.next <= last && this.dueAt(this.next) <= this.serverNow()) {
      const index = this.next;
      const got = await this.fetchIndex(index);
      if (gen !== this.gen) return; // stopped, or restarted with another window
      if ("segment" in got) {
        this.take(got.segment, index);
        this.stalls = 0;
        this.next = index + 1;
        continue;
      }
      retry = true;
      if (this.serverNow() < this.dueAt(index) + gapAfterWindows * w) break;
      if (last !== Infinity) {
        // Leaving CDN mode: the segments end at the last one, so none later will show this
        // one a gap, and waiting for it would keep polling a room that is off.
        this.stats.gaps++;
        this.next = index + 1;
        retry = false;
        continue;
      }
      const latest = Math.min(latestDue(), last);
      if (latest <= index) break;
      const later = await this.fetchIndex(latest);
      if (gen !== this.gen) return;
      if ("segment" in later) {
        this.ahead.set(latest, later.segment);
        this.stats.gaps++;
        this.d.logger?.debug(`roomcast: CDN: segment ${index} never came; a gap`);
        this.next = index + 1;
        retry = false;
        continue;
      }
      // Nothing later either: the segments stopped coming (or a vendor failed); they may still
      // be written late (a storage outage), so wait, asking less and less often.
      if ("missing" in later) this.stalls++;
      break;
    }
    this.busy = false;
    if (this.cfg && !this.drained()) this.schedule(retry);
  }

  /**
   * fetchIndex asks the vendors for segment index in the order they were drawn: a failure or a
   * refused body moves to the next one, and so does a 404 for a segment a window overdue (a
   * vendor may lack what another has).
   */
  private async fetchIndex(index: number): Promise<Fetched> {
    const early = this.ahead.get(index);
    if (early) {
      this.ahead.delete(index);
      return { segment: early };
    }
    const cfg = this.cfg!;
    const want = { app: this.app, room: this.room, windowMs: cfg.windowMs, index };
    const vendors = this.draw();
    if (vendors.length === 0) return { failed: true };
    let result: Fetched = { failed: true };
    for (const v of vendors) {
      const url = segmentUrl(v.template, this.app, this.room, cfg.windowMs, index);
      this.stats.polls++;
      let res: Response;
      let body: Uint8Array;
      try {
        res = await this.d.fetch(url);
        if (res.status === 404) {
          this.stats.misses++;
          void res.body?.cancel().catch(() => {});
          this.rested(v, true);
          result = { missing: true };
          if (this.serverNow() < this.dueAt(index) + cfg.windowMs) return result;
          continue;
        }
        if (res.status !== 200) {
          void res.body?.cancel().catch(() => {});
          throw new Error(`HTTP ${res.status}`);
        }
        body = new Uint8Array(await res.arrayBuffer());
      } catch (e) {
        this.stats.errors++;
        this.rested(v, false);
        this.d.logger?.warn(`roomcast: CDN: ${url}: ${(e as Error).message}`);
        continue;
      }
      try {
        const segment = await decodeSegment(body, want);
        this.rested(v, true);
        return { segment };
      } catch (e) {
        // A wrong object (a stale cache, a misrouted request) is not a vendor down: no rest.
        this.stats.invalid++;
        this.d.logger?.warn(`roomcast: CDN: ${url}: ${(e as Error).message}`);
      }
    }
    return result;
  }

  /** rested records how a vendor did: a failure rests it, doubling each time; an answer ends that. */
  private rested(v: Vendor, ok: boolean): void {
    if (ok) {
      v.failures = 0;
      v.downUntil = 0;
      return;
    }
    v.failures++;
    v.downUntil = Date.now() + Math.min(vendorBackoffMaxMs, vendorBackoffMinMs * 2 ** Math.min(v.failures - 1, 10));
  }

  /**
   * draw orders the vendors that are not resting for one fetch: those serving the member's
   * region (or listing none) by a weighted draw, weight 0 last (a fallback only), then the rest.
   */
  private draw(): Vendor[] {
    const now = Date.now();
    const up = this.vendors.filter((v) => v.downUntil <= now && v.template);
    const serves = (v: Vendor) => (this.d.region ? v.regions.length === 0 || v.regions.includes(this.d.region) : v.regions.length === 0);
    const local = up.filter(serves);
    return [...weightedOrder(local), ...weightedOrder(up.filter((v) => !serves(v)))];
  }

  /** take hands on a segment's new messages to the pacer and learns when the next is due. */
  private take(s: Segment, index: number): void {
    const w = this.cfg!.windowMs;
    this.stats.hits++;
    this.stats.sampled += s.sampled;
    const nextAt = Number(s.nextAtMs);
    // A hint within reason: no earlier than the next window's end, at most two windows after it.
    if (nextAt > 0) this.hint = { index: index + 1, atMs: Math.min(Math.max(nextAt, (index + 2) * w), (index + 4) * w) };
    const fresh = this.d.fresh(s.messages);
    this.stats.duplicates += s.messages.length - fresh.length;
    this.stats.messages += fresh.length;
    this.pacer.add(fresh, index * w, w);
  }
}

/** weightedOrder draws vendors one by one with probability proportional to weight; weight 0 comes last. */
function weightedOrder(vs: Vendor[]): Vendor[] {
  const pool = vs.filter((v) => v.weight > 0);
  const out: Vendor[] = [];
  while (pool.length) {
    let r = Math.random() * pool.reduce((s, v) => s + v.weight, 0);
    let i = 0;
    while (i < pool.length - 1 && (r -= pool[i]!.weight) >= 0) i++;
    out.push(pool.splice(i, 1)[0]!);
  }
  return [...out, ...vs.filter((v) => v.weight === 0)];
}

/**
 * Pacer releases segment messages in (server time, id) order, each at its server time plus a
 * playout delay: the largest of the last few segments' arrival delays after their window's
 * start (at most three windows), so that a window's messages come out over a window, as they were
 * sent, instead of in one burst. A message that sorts before one already released (it reached
 * the pusher late and went into a later segment) is released at once and counted late.
 */
export class Pacer {
  private queue: { m: Message; at: number }[] = [];
  private delays: number[] = [];
  private last: Message | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    private readonly now: () => number,
    private readonly release: (m: Message) => void,
    private readonly stats: Pick<CdnStats, "late">,
  ) {}

  /** add queues the messages of a segment whose window started at windowStartMs (server time) and lasts windowMs. */
  add(msgs: Message[], windowStartMs: number, windowMs: number): void {
    const now = this.now();
    this.delays.push(now - windowStartMs);
    if (this.delays.length > delaysKept) this.delays.shift();
    // One delay for the whole segment, at most a window after it arrived: capping each message
    // at that instead released every message of a window that came faster than the slowest of
    // the last few at the same instant, in one burst.
    const delay = Math.min(Math.max(...this.delays), 3 * windowMs, now - windowStartMs + windowMs);
    for (const m of msgs) {
      if (this.last && compareMessages(m, this.last) < 0) {
        this.stats.late++;
        this.release(m);
        continue;
      }
      // At the latest two windows after it arrived, whatever time a message claims.
      this.queue.push({ m, at: Math.min(Number(m.serverTimeMs) + delay, now + 2 * windowMs) });
    }
    this.queue.sort((a, b) => compareMessages(a.m, b.m));
    this.pump();
  }

  /** stop drops what waits. */
  stop(): void {
    clearTimeout(this.timer);
    this.queue = [];
  }

  /** drop takes the messages with ids out of what waits (recalled). */
  drop(ids: readonly string[]): void {
    this.queue = this.queue.filter((q) => !ids.includes(q.m.id));
  }

  private pump(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    const now = this.now();
    while (this.queue.length && this.queue[0]!.at <= now) {
      const { m } = this.queue.shift()!;
      this.last = m;
      this.release(m);
    }
    if (this.queue.length) this.timer = setTimeout(() => this.pump(), this.queue[0]!.at - now);
  }
}
