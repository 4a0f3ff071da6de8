//go:build !linux

package netpoll

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// Supported says whether this platform has the poller.
const Supported = false

var errUnsupported = errors.New("netpoll: no poller on this platform")

// Poller is Linux only; New fails elsewhere.
type Poller struct{}

// Config is how a Poller waits (poll_linux.go).
type Config struct {
	Nap      time.Duration
	NapBelow int
}

// Mode is how a registration reports readiness (poll_linux.go).
type Mode int

const (
	OneShot Mode = iota
	Level
)

// New fails: there is no poller on this platform.
func New(Config) (*Poller, error) { return nil, errUnsupported }

func (p *Poller) NewID() uint64                                   { panic("unreachable") }
func (p *Poller) Add(syscall.RawConn, uint64, func(), Mode) error { panic("unreachable") }
func (p *Poller) Arm(syscall.RawConn, uint64) error               { panic("unreachable") }
func (p *Poller) Remove(uint64)                                   {}
func (p *Poller) Run()                                            {}
func (p *Poller) Stop()                                           {}

// FD is Linux only; Detach fails elsewhere.
type FD struct{}

// ErrClosed is what an FD's calls return once it is closed.
var ErrClosed = errors.New("netpoll: socket closed")

// Detach fails: there is no poller on this platform.
func Detach(net.Conn) (*FD, error) { return nil, errUnsupported }

func (f *FD) Close() error                                   { return nil }
func (f *FD) Control(func(uintptr)) error                    { return errUnsupported }
func (f *FD) Read(func(fd uintptr) bool) error               { return errUnsupported }
func (f *FD) Write(func(fd uintptr) bool) error              { return errUnsupported }
func ReadNow(syscall.RawConn, []byte) (int, bool, error)     { panic("unreachable") }
func WritevNow(syscall.RawConn, []byte, []byte) (int, error) { panic("unreachable") }
