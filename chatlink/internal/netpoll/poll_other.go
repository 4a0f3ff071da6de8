//go:build !linux

package netpoll

import (
	"errors"
	"syscall"
)

// Supported says whether this platform has the poller.
const Supported = false

// Poller is Linux only; New fails elsewhere.
type Poller struct{}

// New fails: there is no poller on this platform.
func New() (*Poller, error) { return nil, errors.New("netpoll: no poller on this platform") }

func (p *Poller) NewID() uint64                             { panic("unreachable") }
func (p *Poller) Add(syscall.RawConn, uint64, func()) error { panic("unreachable") }
func (p *Poller) Arm(syscall.RawConn, uint64) error         { panic("unreachable") }
func (p *Poller) Remove(uint64)                             {}
func (p *Poller) Run()                                      {}
func (p *Poller) Stop()                                     {}

func ReadNow(syscall.RawConn, []byte) (int, bool, error)     { panic("unreachable") }
func WritevNow(syscall.RawConn, []byte, []byte) (int, error) { panic("unreachable") }
