package chatlink

import (
	"errors"
	"runtime"
	"sync"
	"syscall"

	"roomcast/chatlink/internal/uring"
	"roomcast/chatlink/internal/wsproto"
)

// out is the frames one member gets from one write of a room.
type out struct {
	c  *conn
	fs [][]byte
}

var outPool = sync.Pool{New: func() any { return new([]out) }}

// writeOuts writes each member its frames. Members whose socket the node writes itself
// (sockWriter: the node has io_uring rings) and that have nothing queued are claimed and sent
// their frames in batches of up to uring.Entries, one system call per batch. The others get
// their frames through their transport's write.
func (n *Node) writeOuts(outs []out) {
	wires := wireCache{m: wirePool.Get().(map[wireKey][]byte)}
	defer func() { clear(wires.m); wirePool.Put(wires.m) }()
	b := batchPool.Get().(*batch)
	defer b.reset()
	for _, o := range outs {
		w, ok := o.c.t.(*sockWriter)
		switch {
		case ok && w.sealing(): // sealed for this member alone; queued if not claimed
			sealed, claimed := w.claimSealed(wires.of(w.ws, o.fs))
			if !claimed {
				continue
			}
			b.add(w, sealed)
		case !ok || !w.claim():
			for _, f := range o.fs {
				o.c.write(f)
			}
			continue
		default:
			b.add(w, wires.of(w.ws, o.fs))
		}
		if len(b.ws) == uring.Entries {
			n.sendBatch(b)
		}
	}
	if len(b.ws) > 0 {
		n.sendBatch(b)
	}
}

// batch is the claimed members of one send and their frames.
type batch struct {
	ws   []*sockWriter
	bufs [][]byte
	fds  []int32
	res  []int32
	held []bool
}

var batchPool = sync.Pool{New: func() any { return &batch{} }}

func (b *batch) add(w *sockWriter, wire []byte) {
	b.ws = append(b.ws, w)
	b.bufs = append(b.bufs, wire)
}

// wireKey names a frame's wire form: the frame and its framing.
type wireKey struct {
	frame *byte
	ws    bool
}

// wirePool holds the maps of one write's wire forms.
var wirePool = sync.Pool{New: func() any { return map[wireKey][]byte{} }}

// wireCache is one write's wire forms. Most members of a write get the same frame over the
// same framing, so the last one is checked before the map.
type wireCache struct {
	m        map[wireKey][]byte
	lastKey  wireKey
	lastWire []byte
}

// of returns frames fs as they go on the wire: header and frame in one buffer, made once per
// write for every member that gets the same frame over the same framing.
func (c *wireCache) of(ws bool, fs [][]byte) []byte {
	if len(fs) != 1 {
		var w []byte // several frames (rare): this member's own buffer
		for _, f := range fs {
			w = appendWire(w, ws, f)
		}
		return w
	}
	k := wireKey{&fs[0][0], ws}
	if k == c.lastKey && c.lastWire != nil {
		return c.lastWire
	}
	w, ok := c.m[k]
	if !ok {
		w = appendWire(nil, ws, fs[0])
		c.m[k] = w
	}
	c.lastKey, c.lastWire = k, w
	return w
}

func appendWire(dst []byte, ws bool, f []byte) []byte {
	if ws {
		dst = wsproto.AppendHeader(dst, opData, len(f))
	} else {
		dst = tcpWire(dst, len(f))
	}
	return append(dst, f...)
}

// reset empties b and puts it back in the pool.
func (b *batch) reset() {
	clear(b.ws)
	clear(b.bufs)
	b.ws, b.bufs = b.ws[:0], b.bufs[:0]
	batchPool.Put(b)
}

// maxRings bounds the node's rings: more writers than cores cannot send at once anyway.
var maxRings = 2 * runtime.GOMAXPROCS(0)

var errSocketClosed = errors.New("chatlink: socket closed")

// sendBatch sends b's frames through a ring (or, should none be had, with a write(2) each)
// and ends every claim in it; b is empty afterwards.
func (n *Node) sendBatch(b *batch) {
	k := len(b.ws)
	b.fds, b.res, b.held = growTo(b.fds, k), growTo(b.res, k), growTo(b.held, k)
	// Hold every descriptor open, and submit only those still open.
	sub := 0
	for i, w := range b.ws {
		fd, ok := w.p.lockFD()
		b.held[i] = ok
		if ok {
			b.fds[sub], b.bufs[sub] = fd, b.bufs[i]
			sub++
		}
	}
	// bufs[:sub] lines up with fds[:sub] now: the held members, in order.
	var sendErr error
	var r *uring.Ring
	if n.rings != nil && sub > 0 {
		var err error
		if r, err = n.rings.Get(); err != nil && n.ringFailed.CompareAndSwap(false, true) {
			// No ring now (the descriptor limit, say): the members get plain writes.
			n.log.Warn("io_uring ring unavailable; writing plainly until one is (logged once)", "err", err)
		}
	}
	if r == nil { // no ring: plain writes (nothing to write when sub is 0)
		uring.WritePlain(b.fds[:sub], b.bufs[:sub], b.res[:sub])
	} else {
		sendErr = r.Send(b.fds[:sub], b.bufs[:sub], b.res[:sub])
		n.rings.Put(r)
		if sendErr == nil {
			n.m.ringSends.Add(float64(sub))
		} else {
			// Only a bug gets here. Some of the frames may have gone out: the members are
			// closed rather than sent a frame twice or missing one.
			n.log.Error("io_uring send failed; closing the batch's members", "err", sendErr)
		}
	}
	// Every descriptor is let go before any claim ends: ending one may close its socket, and
	// the close waits for the descriptor.
	for i, w := range b.ws {
		if b.held[i] {
			w.p.unlockFD()
		}
	}
	j := 0 // b.res and b.bufs index the held members only
	for i, w := range b.ws {
		switch {
		case !b.held[i]:
			w.sent(nil, 0, errSocketClosed)
		case sendErr != nil:
			w.sent(nil, 0, sendErr)
			j++
		default:
			res := b.res[j]
			wire := b.bufs[j]
			j++
			switch {
			case res >= 0:
				w.sent(wire, int(res), nil)
			case syscall.Errno(-res) == syscall.EAGAIN:
				w.sent(wire, 0, nil)
			default:
				w.sent(wire, 0, syscall.Errno(-res))
			}
		}
	}
	clear(b.ws)
	clear(b.bufs)
	b.ws, b.bufs = b.ws[:0], b.bufs[:0]
}

func growTo[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
