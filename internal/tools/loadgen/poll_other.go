//go:build !linux

package loadgen

import "errors"

// rawPollers is Linux's (poll_linux.go); elsewhere every raw member has a reader goroutine.
type rawPollers struct{}

type rawPoller struct{}

func newRawPollers() (*rawPollers, error) { return nil, nil }

func (rp *rawPollers) add(*rawClient) error { return errors.New("bench: no poller here") }
func (rp *rawPollers) stop()                {}
func (p *rawPoller) remove(*rawClient)      {}
func (c *rawClient) writePolled(byte, []byte) error {
	return errors.New("bench: no poller here")
}
