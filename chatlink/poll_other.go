//go:build !linux

package chatlink

import (
	"errors"
	"syscall"
)

const pollSupported = false

type poller struct{}

type pollFn func()

func newPoller() (*poller, error) { return nil, errors.New("chatlink: no poller on this platform") }

func (p *poller) newID() uint64                             { panic("unreachable") }
func (p *poller) add(syscall.RawConn, uint64, pollFn) error { panic("unreachable") }
func (p *poller) arm(syscall.RawConn, uint64) error         { panic("unreachable") }
func (p *poller) remove(uint64)                             {}
func (p *poller) run()                                      {}
func (p *poller) stop()                                     {}

func readRaw(syscall.RawConn, []byte) (int, bool, error) { panic("unreachable") }

func writevNow(syscall.RawConn, []byte, []byte) (int, error) { panic("unreachable") }
func plainWrite(int32, []byte) int32                         { panic("unreachable") }
