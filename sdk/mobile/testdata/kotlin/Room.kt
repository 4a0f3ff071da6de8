// A small Kotlin sample of sdk/mobile's Android API, the docs/mobile.md sketch made whole:
// TestJava (sdk/mobile/java_test.go) compiles it with kotlinc against the Java classes gobind
// generates (`-javapkg com.example.roomcast`). It stands apart from Android's own classes so
// that it compiles without the Android SDK: where an app would use a Handler on the main
// Looper and SharedPreferences, it takes a function to run on the UI thread and a small store.
package com.example.roomcast.sample

import com.example.roomcast.mobile.Client
import com.example.roomcast.mobile.Config
import com.example.roomcast.mobile.Event
import com.example.roomcast.mobile.HistoryQuery
import com.example.roomcast.mobile.Listener
import com.example.roomcast.mobile.Message
import com.example.roomcast.mobile.Mobile
import com.example.roomcast.mobile.Outgoing

/** What the screen shows; the app's views implement it. Called on the UI thread. */
interface RoomView {
    fun showChat(sender: String, text: String)
    fun showGap(missing: Long)
    fun showThinned(count: Long)
    fun showHands(keys: List<String>)
    fun showClosed(code: Int, error: String)
}

/** Where the app keeps the last message id between runs (SharedPreferences on Android). */
interface LastIdStore {
    fun load(): String
    fun save(id: String)
}

/** Passes the client's calls, made on its own thread, to the UI thread. */
class RoomListener(private val ui: (Runnable) -> Unit, private val view: RoomView) : Listener {
    override fun onMessage(m: Message) {
        val change = Mobile.queueEventOf(m)
        if (change != null) {
            ui(Runnable { view.showHands(listOf(change.op)) })
            return
        }
        val text = m.body.toString(Charsets.UTF_8)
        ui(Runnable { view.showChat(m.sender, text) })
    }

    override fun onEvent(e: Event) {
        when (e.kind) {
            Mobile.EventRecovered -> if (!e.recovered) ui(Runnable { view.showGap(e.missing) })
            Mobile.EventThinned -> ui(Runnable { view.showThinned(e.thinnedNormal + e.thinnedBulk) })
            Mobile.EventClosed -> ui(Runnable { view.showClosed(e.code, e.error) })
        }
    }
}

/** A room screen's connection: start it off the UI thread, stop it when the app stops. */
class Room(private val store: LastIdStore, ui: (Runnable) -> Unit, private val view: RoomView) {
    private val listener = RoomListener(ui, view)
    private var client: Client? = null

    /** Logs in; blocks until the login (call it on a background thread). Throws on failure. */
    fun start(token: String, dispatcher: String) {
        val config = Config().apply {
            this.token = token
            this.dispatcher = dispatcher
            device = "android"
            recoverSince = store.load()
            heartbeatIntervalMs = 15_000 // a carrier NAT that drops idle connections after 20 s
        }
        client = Mobile.newClient(config, listener)
    }

    /** Sends a chat line; false when the server refused it (rate limited, say). */
    fun say(text: String): Boolean {
        val res = client!!.send(Outgoing().apply { type = "chat"; body = text.toByteArray(Charsets.UTF_8) })
        return res.errorCode == 0
    }

    /** The room's last messages, oldest first. */
    fun recent(limit: Long): List<String> {
        val page = client!!.history(HistoryQuery().apply { this.limit = limit })
        return (0 until page.len()).map { page.get(it).body.toString(Charsets.UTF_8) }
    }

    /** Raises this member's hand: an entry of the room queue that leaves with the session. */
    fun raiseHand(uid: String): Boolean =
        client!!.queueOffer("hand-$uid", ByteArray(0), true, true).errorCode == 0

    fun networkChanged() = client?.networkChanged()
    fun onStop() = client?.enterBackground()
    fun onStart() = client?.enterForeground()

    /** When the app is closing: keep where it was for the next start's recovery. */
    fun stop() {
        client?.let {
            store.save(it.lastID())
            it.close()
        }
        client = null
    }
}
