// RoomcastJava drives sdk/mobile through the Java classes gobind generates, as an Android app
// would: TestJava (sdk/mobile/java_test.go) builds the bindings for this machine's JDK, starts a
// Roomcast cluster with two ChatLinks and runs this program with the tokens of two members of
// one room in the environment. It logs in both, sends, receives, reads a history page, offers
// to the room queue, then prints "KILL <node>" and waits for "KILLED" on stdin: the test kills
// that ChatLink, and the program checks that the receiving member reconnects and recovers
// what was sent meanwhile. Each step prints a line; the last is "OK", and any failure exits 1.
import com.example.roomcast.mobile.Client;
import com.example.roomcast.mobile.Config;
import com.example.roomcast.mobile.Event;
import com.example.roomcast.mobile.HistoryPage;
import com.example.roomcast.mobile.HistoryQuery;
import com.example.roomcast.mobile.Listener;
import com.example.roomcast.mobile.Message;
import com.example.roomcast.mobile.Mobile;
import com.example.roomcast.mobile.Outgoing;
import com.example.roomcast.mobile.QueueChange;
import com.example.roomcast.mobile.QueueResult;
import com.example.roomcast.mobile.SendResult;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;

public final class RoomcastJava {
	private static final long WAIT_MS = 10_000;

	/** Recorder keeps a member's messages and events, in the order of the Listener's calls. */
	static final class Recorder implements Listener {
		final String name;
		final BlockingQueue<Object> calls = new LinkedBlockingQueue<>();
		final List<String> seen = new ArrayList<>(); // what await went past, for the failure's message

		Recorder(String name) { this.name = name; }

		@Override public void onMessage(Message m) { calls.add(m); }
		@Override public void onEvent(Event e) { calls.add(e); }

		/** await returns the next call that matches, skipping the others, or fails after WAIT_MS. */
		Object await(String what, Predicate<Object> match) throws InterruptedException {
			long deadline = System.currentTimeMillis() + WAIT_MS;
			for (;;) {
				Object c = calls.poll(Math.max(0, deadline - System.currentTimeMillis()), TimeUnit.MILLISECONDS);
				if (c == null) {
					fail(name + ": no " + what + " within " + WAIT_MS + " ms; had " + seen);
				}
				if (match.test(c)) {
					return c;
				}
				seen.add(c instanceof Message ? "message " + text((Message) c) : "event " + ((Event) c).getKind());
			}
		}

		Event awaitEvent(String kind, Predicate<Event> match) throws InterruptedException {
			return (Event) await(kind + " event", c -> c instanceof Event && ((Event) c).getKind().equals(kind) && match.test((Event) c));
		}

		Message awaitMessage(String what, Predicate<Message> match) throws InterruptedException {
			return (Message) await(what, c -> c instanceof Message && match.test((Message) c));
		}
	}

	static String text(Message m) { return new String(m.getBody(), StandardCharsets.UTF_8); }

	static void fail(String why) {
		System.out.println("FAIL " + why);
		System.exit(1);
	}

	static void check(boolean ok, String why) {
		if (!ok) {
			fail(why);
		}
	}

	static Client login(String token, String transport, Recorder r) throws Exception {
		Config c = new Config();
		c.setToken(token);
		c.setDispatcher(System.getenv("ROOMCAST_DISPATCHER"));
		c.setTransport(transport);
		c.setDevice("java");
		c.setReconnectMinDelayMs(100);
		c.setReconnectMaxDelayMs(500);
		c.setConnectTimeoutMs(10_000);
		return Mobile.newClient(c, r); // throws Exception when no ChatLink took the login
	}

	static SendResult send(Client from, String body) throws Exception {
		Outgoing o = new Outgoing();
		o.setType("chat");
		o.setLane(Mobile.LaneCritical); // no room budget thins critical messages
		o.setBody(body.getBytes(StandardCharsets.UTF_8));
		SendResult res = from.send(o);
		check(res.getErrorCode() == 0 && res.getMessageID().length() == 26, "send " + body + ": " + res);
		return res;
	}

	public static void main(String[] args) {
		try {
			run();
		} catch (Throwable e) { // exit all the same: the Go side's threads would keep the JVM up
			e.printStackTrace();
			fail(e.toString());
		}
		System.exit(0);
	}

	static void run() throws Exception {
		Recorder bob = new Recorder("bob"), alice = new Recorder("alice");
		Client bobClient = login(System.getenv("ROOMCAST_TOKEN_BOB"), Mobile.TransportTCP, bob);
		Event connected = bob.awaitEvent(Mobile.EventConnected, e -> true);
		System.out.println("login bob " + connected.getNode() + " " + connected.getSessionID());
		Client aliceClient = login(System.getenv("ROOMCAST_TOKEN_ALICE"), Mobile.TransportWebSocket, alice);
		System.out.println("login alice " + alice.awaitEvent(Mobile.EventConnected, e -> true).getNode());

		SendResult sent = send(aliceClient, "hello from java");
		System.out.println("send " + sent.getMessageID());

		Message got = bob.awaitMessage("alice's message", m -> text(m).equals("hello from java"));
		check(got.getSender().equals("alice") && got.getID().equals(sent.getMessageID()) && got.getLane().equals(Mobile.LaneCritical),
			"bob's message " + got);
		System.out.println("receive " + got.getID() + " from " + got.getSender());

		HistoryQuery q = new HistoryQuery();
		q.setLimit(10);
		HistoryPage page = bobClient.history(q);
		check(page.getErrorCode() == 0, "history refused: " + page.getErrorCode() + " " + page.getErrorMessage());
		boolean found = false;
		for (long i = 0; i < page.len(); i++) {
			found |= page.get(i).getID().equals(sent.getMessageID());
		}
		check(found, "the history page of " + page.len() + " messages lacks " + sent.getMessageID());
		System.out.println("history " + page.len() + " messages");

		QueueResult offer = bobClient.queueOffer("hand-bob", "raised".getBytes(StandardCharsets.UTF_8), true, false);
		check(offer.getErrorCode() == 0 && offer.entry() != null && offer.entry().getKey().equals("hand-bob") && offer.entry().getUID().equals("bob"),
			"queue offer: " + offer.getErrorCode() + " " + offer.getErrorMessage());
		QueueResult again = aliceClient.queueOffer("hand-bob", "mine".getBytes(StandardCharsets.UTF_8), true, false);
		check(again.getErrorCode() == Mobile.ErrorQueueKeyExists, "alice's offer of bob's key: " + again.getErrorCode());
		Message change = bob.awaitMessage("the queue's change", m -> Mobile.queueEventOf(m) != null);
		QueueChange qc = Mobile.queueEventOf(change);
		check(qc.getOp().equals(Mobile.QueueOpOffer) && qc.getEntries().get(0).getKey().equals("hand-bob"), "queue change " + qc.getOp());
		System.out.println("queue offer " + offer.entry().getKey() + " version " + qc.getVersion());

		System.out.println("KILL " + connected.getNode());
		String answer = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
		check("KILLED".equals(answer), "the test answered " + answer);
		// If alice was on the killed node too, her send fails while her client has not noticed
		// yet (no answer: an exception), and waits for her next connection once it has. Bob
		// gets the message live or by recovery, whichever comes first.
		SendResult during = null;
		for (int attempt = 1; during == null; attempt++) {
			try {
				during = send(aliceClient, "after the kill");
			} catch (Exception e) {
				check(attempt < 5, "alice's send after the kill: " + e);
				System.out.println("send again after " + e.getMessage());
				Thread.sleep(100);
			}
		}
		String duringID = during.getMessageID();
		Event reconnecting = bob.awaitEvent(Mobile.EventReconnecting, e -> true);
		Event reconnected = bob.awaitEvent(Mobile.EventConnected, e -> e.getReconnected());
		// The message comes before the recovered event when the recovery brought it, after it
		// when it came live: either order is right.
		Event recovered = null;
		Message after = null;
		while (recovered == null || after == null) {
			Object c = bob.await("recovered event and alice's message after the kill", x -> x instanceof Message
				? ((Message) x).getID().equals(duringID) : ((Event) x).getKind().equals(Mobile.EventRecovered));
			if (c instanceof Message) {
				after = (Message) c;
			} else {
				recovered = (Event) c;
			}
		}
		check(recovered.getRecovered() && recovered.getMissing() == 0, "recovery: recovered " + recovered.getRecovered() + ", " + recovered.getError());
		check(text(after).equals("after the kill"), "bob's message after the kill: " + text(after));
		System.out.println("recovered: " + recovered.getRecovered() + " on " + reconnected.getNode() + " after " + reconnecting.getError());

		aliceClient.close();
		bobClient.close();
		check(bobClient.closed(), "bob's client is not closed after close()");
		System.out.println("OK");
	}
}
