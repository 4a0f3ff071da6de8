package wsproto

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lxzan/gws"

	"roomcast/internal/testkit"
)

type discardEvents struct{ gws.BuiltinEventHandler }

func (discardEvents) OnMessage(_ *gws.Conn, m *gws.Message) { m.Close() }

// BenchmarkWebSocketWrite compares two ways of writing a 700-byte frame to one of 1,000
// WebSocket connections on loopback, round robin: a plain write(2) of the framed bytes, and
// gws's WriteAsync, which the ChatLink uses where it does not write its sockets itself
// (Config.PlainWrites; a goroutine per write to an idle connection). Each round of 1,000
// writes ends when they are all done, as a tick would. cpu-ns/write is the process's CPU
// (RUSAGE_SELF) per write; the clients reading in the same process cost the same in both, so
// the difference is the cost of the write path above the system call.
func BenchmarkWebSocketWrite(b *testing.B) {
	sockets := 1000
	if s := os.Getenv("ROOMCAST_BENCH_SOCKETS"); s != "" { // more, to see the cache's share
		sockets, _ = strconv.Atoi(s)
	}
	conns := make(chan *gws.Conn, sockets)
	up := gws.NewUpgrader(discardEvents{}, &gws.ServerOption{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r)
		if err != nil {
			return
		}
		conns <- c
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	var server []*gws.Conn
	var fds []int
	var clients []*gws.Conn
	for range sockets {
		cl, _, err := gws.NewClient(discardEvents{}, &gws.ClientOption{Addr: "ws://" + ln.Addr().String() + "/"})
		if err != nil {
			b.Fatal(err)
		}
		go cl.ReadLoop()
		clients = append(clients, cl)
		s := <-conns
		server = append(server, s)
		rc, err := s.NetConn().(syscall.Conn).SyscallConn()
		if err != nil {
			b.Fatal(err)
		}
		_ = rc.Control(func(fd uintptr) { fds = append(fds, int(fd)) })
	}
	defer func() {
		for _, c := range append(server, clients...) {
			_ = c.NetConn().Close()
		}
	}()
	payload := make([]byte, 700)
	framed := append(AppendHeader(nil, OpBinary, len(payload)), payload...)

	for _, via := range []string{"write(2)", "gws-async"} {
		b.Run(fmt.Sprintf("via=%s", via), func(b *testing.B) {
			var written atomic.Int64
			done := func(error) { written.Add(1) }
			before := testkit.ProcessCPU()
			b.ResetTimer()
			for i := range b.N {
				k := i % sockets
				if via == "gws-async" {
					server[k].WriteAsync(gws.OpcodeBinary, payload, done)
				} else {
					for {
						_, err := syscall.Write(fds[k], framed)
						if err == syscall.EAGAIN {
							time.Sleep(time.Millisecond)
							continue
						}
						if err != nil {
							b.Fatal(err)
						}
						break
					}
				}
				if k == sockets-1 || i == b.N-1 {
					// A tick's writes are done (WriteAsync's too); let the clients read.
					for via == "gws-async" && written.Load() < int64(i+1) {
						time.Sleep(100 * time.Microsecond)
					}
					time.Sleep(time.Millisecond)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((testkit.ProcessCPU()-before).Nanoseconds())/float64(b.N), "cpu-ns/write")
		})
	}
}
