// Command idleclient is TestIdleWakeups's idle mobile client, in a process of its own that
// imports nothing but sdk/mobile, so that what wakes the process is the client and the Go
// runtime: it logs in with $ROOMCAST_IDLE_TOKEN at $ROOMCAST_IDLE_DISPATCHER (heartbeat
// $ROOMCAST_IDLE_HEARTBEAT_MS; -1 for no client at all), prints "ready" and its Go heap in use,
// and idles until stdin closes.
package main

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"roomcast/sdk/mobile"
)

func main() {
	hb, _ := strconv.ParseInt(os.Getenv("ROOMCAST_IDLE_HEARTBEAT_MS"), 10, 64)
	if hb >= 0 {
		cl, err := mobile.NewClient(&mobile.Config{Token: os.Getenv("ROOMCAST_IDLE_TOKEN"),
			Dispatcher: os.Getenv("ROOMCAST_IDLE_DISPATCHER"), Transport: mobile.TransportTCP, HeartbeatIntervalMs: hb}, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer cl.Close()
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("ready %d\n", ms.HeapInuse)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes it
}
