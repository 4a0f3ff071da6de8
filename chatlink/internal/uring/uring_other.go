//go:build !linux

package uring

import "errors"

// Ring is Linux only; NewRing fails elsewhere.
type Ring struct{}

// NewRing fails: io_uring is Linux only.
func NewRing(uint32) (*Ring, error) { return nil, errors.New("io_uring is Linux only") }

func (*Ring) Send([]int32, [][]byte, []int32) error { panic("unreachable") }
func (*Ring) Close()                                {}

func WritePlain([]int32, [][]byte, []int32) { panic("unreachable") }
