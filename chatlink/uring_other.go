//go:build !linux

package chatlink

import "errors"

type ring struct{}

type rings struct{}

func newRings() (*rings, error) { return nil, errors.New("io_uring is Linux only") }

func (*rings) get() (*ring, error) { panic("unreachable") }
func (*rings) put(*ring)           {}
func (*rings) close()              {}

func (*ring) send([]int32, [][]byte, []int32) error { panic("unreachable") }
