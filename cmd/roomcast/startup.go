package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"roomcast/chatlink"
	"roomcast/internal/roles"
	"roomcast/internal/roles/devcluster"
)

// startFailed prints why a role could not start as one line, the error followed by what to do
// about it, and returns the exit code 1. flags names the command's flags by what they set: a
// listener (roles.ListenError's Listener) or "node", the ChatLink's name; a command without
// such a flag (dev names its nodes itself) leaves it out.
func startFailed(stderr io.Writer, cmd string, err error, flags map[string]string) int {
	msg := err.Error()
	if fix := startupFix(err, flags); fix != "" {
		msg += " (" + fix + ")"
	}
	// One line, whatever the error wraps: an operator greps for it, and a supervisor's log
	// keeps it whole.
	msg = strings.Join(strings.Fields(msg), " ")
	fmt.Fprintf(stderr, "roomcast %s: %s\n", cmd, msg)
	return 1
}

// startupFix says what to do about a start-up error of a known kind, or "" for another kind
// (whose message has to speak for itself).
func startupFix(err error, flags map[string]string) string {
	var listenErr *roles.ListenError
	if errors.As(err, &listenErr) {
		other := "another address"
		if f := flags[listenErr.Listener]; f != "" {
			other = "another " + f
		}
		switch {
		case errors.Is(err, syscall.EADDRINUSE):
			return "another process listens there: stop it, or choose " + other
		case errors.Is(err, syscall.EACCES):
			return "ports below 1024 need privileges: choose " + other + " with a port from 1024 to 65535"
		case errors.Is(err, syscall.EADDRNOTAVAIL):
			return "no interface of this machine has that address: choose " + other + ", or listen on 0.0.0.0"
		}
		return "an address is host:port with a port from 0 to 65535, e.g. 127.0.0.1:8080: choose " + other
	}
	switch {
	case errors.Is(err, devcluster.ErrDataDirInUse):
		return "stop that one, or give this one another --data"
	case errors.Is(err, chatlink.ErrNameHeld) && flags["node"] != "":
		return "wait until the lease ends, or start this node under another " + flags["node"]
	case errors.Is(err, chatlink.ErrNameHeld):
		return "another process runs ChatLinks of this name on the same NATS server: stop it first"
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, nats.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) || errors.Is(err, nats.ErrJetStreamNotEnabledForAccount):
		return "the NATS server runs without JetStream: start it with -js (nats-server -js)"
	case errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) || isTimeout(err):
		return "no NATS server answers at --nats: start one with JetStream (nats-server -js), or point --nats at it"
	}
	return ""
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// checkWritable returns an error unless files can be created in dir.
func checkWritable(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".roomcast-write-check-*")
	if err != nil {
		return err
	}
	name := f.Name()
	_ = f.Close()
	return os.Remove(name)
}

// heldLog holds a role's logs while it starts, so that a failed start prints one line, its
// error, and not the log lines of the pieces that started before it failed and were stopped.
// Once the role runs, release writes what it held and lets later logs through; after a failed
// start, drop discards them.
type heldLog struct {
	out io.Writer

	mu       sync.Mutex // guards the fields below
	held     bytes.Buffer
	released bool
	dropped  bool
}

func (h *heldLog) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.dropped:
		return len(p), nil
	case h.released:
		return h.out.Write(p)
	}
	return h.held.Write(p)
}

// release writes the held logs and lets the later ones through.
func (h *heldLog) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, _ = h.out.Write(h.held.Bytes())
	h.held.Reset()
	h.released = true
}

// drop discards the held logs and the later ones: those of stopping what had started.
func (h *heldLog) drop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held.Reset()
	h.dropped = true
}
