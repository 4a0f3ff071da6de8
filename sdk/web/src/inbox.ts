// At-least-once messages (Message.atLeastOnce): the server stores them for the user until a
// session acknowledges them, and sends the stored ones after each login (Login.inbox). The
// client hands each to the app once, at once (they are not part of the room's order, so they
// neither wait for a history answer nor move where recovery starts), acknowledges it once the
// "message" listeners have returned, and drops the copies that come again by id, acknowledging
// those too: a copy comes again because its acknowledgement did not reach the server, and it
// would come at every login until one does.

/** How many at-least-once ids a client remembers: a user has at most 100 stored by default. */
export const INBOX_WINDOW = 1000;

/** The most ids one Ack frame may carry. */
export const MAX_ACK_IDS = 100;

/** InboxSeen remembers the ids of the latest INBOX_WINDOW at-least-once messages handed to the app. */
export class InboxSeen {
  private readonly ids = new Set<string>();

  /** take remembers id and reports whether it is new. */
  take(id: string): boolean {
    if (this.ids.has(id)) return false;
    this.ids.add(id);
    if (this.ids.size > INBOX_WINDOW) this.ids.delete(this.ids.values().next().value!);
    return true;
  }
}
