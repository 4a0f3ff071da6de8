package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// pipelineDepth is how many polls a connection sends before it reads their answers (HTTP/1.1
// pipelining): a hundred thousand viewers' polls cost a few system calls per batch, not two
// each.
const pipelineDepth = 32

// maxPollTries bounds the polls of one viewer for one segment (the first and its retries).
const maxPollTries = 8

// poll is one viewer's request for one window's segment.
type poll struct {
	viewer int32
	tries  int32
	index  int64
	due    time.Time // when the viewer meant to poll, for lateness
}

// viewerFleet is the virtual viewers of bench cdn: cheap HTTP pollers, not SDK clients. Each
// viewer polls each window's segment once it is due, at its own jitter, as the SDK does, over
// a few keep-alive connections to the edge that all viewers share, pipelined; a 404 is polled
// again a fifth of a window later. It counts requests, answers and bytes on the wire.
type viewerFleet struct {
	addr    string                      // the edge's host:port
	host    string                      // its Host header
	path    func(index int64) string    // a segment's request path
	window  time.Duration               // for retries
	onFirst func(index int64, b []byte) // gets the first body of each window, to check
	polls   chan []poll
	pending atomic.Int64 // polls not yet answered with a segment nor given up

	requests, hits, misses, failures, gaveUp, wireBytes atomic.Int64

	mu      sync.Mutex // guards the fields below
	late    *hdrhistogram.Histogram
	checked map[int64]bool // windows whose first body went to onFirst
	retries []poll         // polled again from retryAt on
	retryAt []time.Time
	errs    []string
}

func newViewerFleet(addr, host string, path func(int64) string, window time.Duration, onFirst func(int64, []byte)) *viewerFleet {
	return &viewerFleet{
		addr: addr, host: host, path: path, window: window, onFirst: onFirst,
		polls: make(chan []poll, 1024), late: newLatencyHistogram(), checked: map[int64]bool{},
	}
}

// run keeps conns connections polling, and retries coming, until ctx ends.
func (f *viewerFleet) run(ctx context.Context, conns int) {
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() { f.connection(ctx) })
	}
	wg.Go(func() { f.retryLoop(ctx) })
	wg.Wait()
}

// retryLoop hands the polls to retry to the connections as their times come.
func (f *viewerFleet) retryLoop(ctx context.Context) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		f.mu.Lock()
		var due []poll
		for i := 0; i < len(f.retries); {
			if f.retryAt[i].After(now) {
				i++
				continue
			}
			due = append(due, f.retries[i])
			last := len(f.retries) - 1
			f.retries[i], f.retryAt[i] = f.retries[last], f.retryAt[last]
			f.retries, f.retryAt = f.retries[:last], f.retryAt[:last]
		}
		f.mu.Unlock()
		for len(due) > 0 {
			k := min(len(due), pipelineDepth)
			if !f.send(ctx, due[:k]) {
				return
			}
			due = due[k:]
		}
	}
}

// schedule has viewers 0..n-1 poll window index from due on, each at a random jitter in
// [0, jitter), and returns once the last poll is handed over (or ctx ends).
func (f *viewerFleet) schedule(ctx context.Context, n int, index int64, due time.Time, jitter time.Duration) {
	slots := max(int(jitter/time.Millisecond), 1)
	bySlot := make([][]int32, slots)
	for v := range int32(n) {
		s := rand.IntN(slots)
		bySlot[s] = append(bySlot[s], v)
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for s, viewers := range bySlot {
		at := due.Add(time.Duration(s) * time.Millisecond)
		if w := time.Until(at); w > 0 {
			timer.Reset(w)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		}
		for len(viewers) > 0 {
			k := min(len(viewers), pipelineDepth)
			batch := make([]poll, k)
			for i, v := range viewers[:k] {
				batch[i] = poll{viewer: v, index: index, due: at}
			}
			viewers = viewers[k:]
			f.pending.Add(int64(k))
			if !f.send(ctx, batch) {
				return
			}
		}
	}
}

// send hands a batch to the connections; false when ctx ended first.
func (f *viewerFleet) send(ctx context.Context, batch []poll) bool {
	select {
	case f.polls <- batch:
		return true
	case <-ctx.Done():
		return false
	}
}

// connection polls batches over one keep-alive connection, dialing again after an error.
func (f *viewerFleet) connection(ctx context.Context) {
	var c *wireConn
	defer func() {
		if c != nil {
			c.nc.Close()
		}
	}()
	for {
		var batch []poll
		select {
		case <-ctx.Done():
			return
		case batch = <-f.polls:
		}
		if c == nil {
			var err error
			if c, err = dialWire(ctx, f.addr, &f.wireBytes); err != nil {
				f.fail(batch, err)
				continue
			}
		}
		if err := f.exchange(c, batch); err != nil {
			c.nc.Close()
			c = nil
		}
	}
}

// exchange writes batch's requests and reads their answers in order. Polls left unanswered by a
// failed connection are polled again.
func (f *viewerFleet) exchange(c *wireConn, batch []poll) error {
	for _, p := range batch {
		fmt.Fprintf(c.bw, "GET %s HTTP/1.1\r\nHost: %s\r\nAccept-Encoding: gzip\r\n\r\n", f.path(p.index), f.host)
	}
	f.requests.Add(int64(len(batch)))
	if err := c.bw.Flush(); err != nil {
		f.fail(batch, err)
		return err
	}
	for i, p := range batch {
		first := f.wantBody(p.index)
		status, body, closing, err := readAnswer(c.br, first)
		if err != nil {
			f.fail(batch[i:], err)
			return err
		}
		f.answered(p, status, body, first)
		if closing {
			f.fail(batch[i+1:], errors.New("the edge closed the connection"))
			return io.EOF
		}
	}
	return nil
}

// wantBody reports whether the next answer for index should be kept for onFirst.
func (f *viewerFleet) wantBody(index int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.checked[index]
}

func (f *viewerFleet) answered(p poll, status int, body []byte, first bool) {
	switch status {
	case 200:
		f.hits.Add(1)
		f.mu.Lock()
		recordLatency(f.late, time.Since(p.due))
		check := first && !f.checked[p.index]
		f.checked[p.index] = f.checked[p.index] || check
		f.mu.Unlock()
		if check {
			f.onFirst(p.index, body)
		}
		f.pending.Add(-1)
	case 404:
		f.misses.Add(1)
		f.retry(p)
	default:
		f.failures.Add(1)
		f.note(fmt.Errorf("segment %d: HTTP %d", p.index, status))
		f.retry(p)
	}
}

// retry polls p again a fifth of a window later, or gives it up.
func (f *viewerFleet) retry(p poll) {
	p.tries++
	if p.tries >= maxPollTries {
		f.gaveUp.Add(1)
		f.pending.Add(-1)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.retries = append(f.retries, p)
	f.retryAt = append(f.retryAt, time.Now().Add(f.window/5))
}

// fail counts polls a connection could not answer and polls them again.
func (f *viewerFleet) fail(batch []poll, err error) {
	f.failures.Add(int64(len(batch)))
	f.note(err)
	for _, p := range batch {
		f.retry(p)
	}
}

func (f *viewerFleet) note(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs) < maxErrors {
		f.errs = append(f.errs, err.Error())
	}
}

// wireConn is a connection to the edge whose received bytes are counted.
type wireConn struct {
	nc net.Conn
	bw *bufio.Writer
	br *bufio.Reader
}

// countingReader counts what it reads into n.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(int64(k))
	return k, err
}

// dialWire connects to addr; the bytes read from it count in received.
func dialWire(ctx context.Context, addr string, received *atomic.Int64) (*wireConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &wireConn{nc: nc, bw: bufio.NewWriterSize(nc, 16<<10), br: bufio.NewReaderSize(countingReader{nc, received}, 64<<10)}, nil
}

// readAnswer reads one HTTP/1.1 response: its status, its body when keep (else discarded),
// and whether the server closes the connection after it.
func readAnswer(br *bufio.Reader, keep bool) (status int, body []byte, closing bool, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, nil, false, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, nil, false, fmt.Errorf("not an HTTP answer: %q", line)
	}
	if status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return 0, nil, false, fmt.Errorf("status line %q", line)
	}
	length, chunked := -1, false
	for {
		line, err = br.ReadSlice('\n')
		if err != nil {
			return 0, nil, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return 0, nil, false, fmt.Errorf("Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			closing = bytes.EqualFold(value, []byte("close"))
		}
	}
	switch {
	case chunked:
		body, err = readChunked(br, keep)
	case length >= 0 && keep:
		body = make([]byte, length)
		_, err = io.ReadFull(br, body)
	case length >= 0:
		_, err = br.Discard(length)
	default:
		err = errors.New("an answer without a length")
	}
	return status, body, closing, err
}

func readChunked(br *bufio.Reader, keep bool) ([]byte, error) {
	var body []byte
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		size, _, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(";"))
		n, err := strconv.ParseInt(string(size), 16, 32)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("chunk size %q", line)
		}
		if n == 0 {
			for { // trailers, then the empty line
				line, err := br.ReadSlice('\n')
				if err != nil {
					return nil, err
				}
				if len(bytes.TrimRight(line, "\r\n")) == 0 {
					return body, nil
				}
			}
		}
		if keep {
			start := len(body)
			body = append(body, make([]byte, n)...)
			if _, err := io.ReadFull(br, body[start:]); err != nil {
				return nil, err
			}
		} else if _, err := br.Discard(int(n)); err != nil {
			return nil, err
		}
		if _, err := br.Discard(2); err != nil { // the chunk's CRLF
			return nil, err
		}
	}
}
