package mobile

import (
	"errors"
	"math"
	"testing"
	"time"

	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

func TestNewEvent(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		in   sdk.Event
		want Event
	}{
		{&sdk.ConnectedEvent{LoginAck: &clientpb.LoginAck{Node: "cl-1", SessionId: "cl-1-7"}, Reconnected: true},
			Event{Kind: EventConnected, Node: "cl-1", SessionID: "cl-1-7", Reconnected: true}},
		{&sdk.ReconnectingEvent{Attempt: 3, Delay: 1500 * time.Millisecond, Err: boom},
			Event{Kind: EventReconnecting, Attempt: 3, DelayMs: 1500, Error: "boom"}},
		{&sdk.RecoveredEvent{Since: "01K", Recovered: false, Missing: 20, Count: 10},
			Event{Kind: EventRecovered, Since: "01K", Missing: 20, Count: 10}},
		{&sdk.RecoveredEvent{Missing: math.MaxUint64, Err: sdk.ErrHistoryUnavailable},
			Event{Kind: EventRecovered, Missing: math.MaxInt64, Error: sdk.ErrHistoryUnavailable.Error()}},
		{&sdk.ThinnedEvent{Normal: 4, Bulk: math.MaxUint32},
			Event{Kind: EventThinned, ThinnedNormal: 4, ThinnedBulk: math.MaxUint32}},
		{&sdk.KickedEvent{Code: 4007, Reason: "be nice", Terminal: true},
			Event{Kind: EventKicked, Code: 4007, Reason: "be nice", Terminal: true}},
		{&sdk.LimitedEvent{Code: 4013, RetryAfter: 250 * time.Millisecond, Delay: 600 * time.Millisecond},
			Event{Kind: EventLimited, Code: 4013, RetryAfterMs: 250, DelayMs: 600}},
		{&sdk.ErrorEvent{Err: boom}, Event{Kind: EventError, Error: "boom"}},
		{&sdk.RecalledEvent{ID: "01KB", At: time.UnixMilli(1764451200123), ByUID: "alice"},
			Event{Kind: EventRecalled, MessageID: "01KB", RecalledMs: 1764451200123, ByUID: "alice"}},
		{&sdk.ClosedEvent{Err: sdk.ErrClosed}, Event{Kind: EventClosed, Error: sdk.ErrClosed.Error()}},
		{&sdk.ClosedEvent{Err: &sdk.CloseError{Code: 4001}},
			Event{Kind: EventClosed, Code: 4001, Error: (&sdk.CloseError{Code: 4001}).Error()}},
	} {
		if got := newEvent(tc.in); got == nil || *got != tc.want {
			t.Errorf("newEvent(%#v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestNewMessage(t *testing.T) {
	for lane, want := range map[clientpb.Lane]string{
		clientpb.Lane_LANE_CRITICAL:    LaneCritical,
		clientpb.Lane_LANE_NORMAL:      LaneNormal,
		clientpb.Lane_LANE_UNSPECIFIED: LaneNormal,
		clientpb.Lane_LANE_BULK:        LaneBulk,
	} {
		m := newMessage(&clientpb.Message{Id: "01K", Room: "r", Sender: "s", Type: "chat", Lane: lane,
			TagExpr: "vip", Body: []byte("hi"), ServerTimeMs: 42, RoomSeq: 7, AtLeastOnce: true})
		if m.ID != "01K" || m.Room != "r" || m.Sender != "s" || m.Type != "chat" || m.Lane != want ||
			m.TagExpr != "vip" || string(m.Body) != "hi" || m.ServerTimeMs != 42 || m.RoomSeq != 7 || !m.AtLeastOnce {
			t.Errorf("lane %v: %+v", lane, m)
		}
		if lane == clientpb.Lane_LANE_UNSPECIFIED {
			continue
		}
		if back, err := parseLane(want); err != nil || back != lane {
			t.Errorf("parseLane(%q) = %v, %v, want %v", want, back, err, lane)
		}
	}
	if l, err := parseLane(""); err != nil || l != clientpb.Lane_LANE_NORMAL {
		t.Errorf(`parseLane("") = %v, %v, want normal`, l, err)
	}
}
