package roomqueue

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// FuzzQueueChange runs a sequence of changes, decoded from the input, by members with various
// rights against one queue, and checks what must always hold: keys stay unique, the queue stays
// within its limit, a refusal changes nothing, and a success did what its op says.
func FuzzQueueChange(f *testing.F) {
	f.Add([]byte{1, 0, 0, 1, 1, 0, 2, 0, 0, 5, 1, 1, 6, 2, 0})
	f.Add([]byte{1, 3, 1, 1, 3, 2, 2, 3, 0, 4, 0, 0})
	f.Fuzz(func(t *testing.T, program []byte) {
		const maxEntries = 4
		keys := []string{"", "mic", "a", "b", "c"}
		callers := []caller{
			{}, // the app server
			{member: true, uid: "u1", session: "s1", mayChange: true},
			{member: true, uid: "u2", session: "s2", mayChange: true, admin: true},
			{member: true, uid: "u3", session: "s3"},
		}
		st := &clientpb.QueueState{}
		now := time.UnixMilli(1)
		for i := 0; i+2 < len(program); i += 3 {
			op := clientpb.QueueOp(program[i] % 8) // 0, 3, 4 and 7 are not changes: refused
			key := keys[int(program[i+1])%len(keys)]
			who := callers[int(program[i+2])%len(callers)]
			req := &roompb.QueueRequest{Key: key, Value: []byte{program[i]}, Uid: who.uid, SessionId: who.session, IfAbsent: program[i+1]&8 != 0}
			if key == "" && (op == clientpb.QueueOp_QUEUE_OP_OFFER || op == clientpb.QueueOp_QUEUE_OP_REMOVE) {
				continue // Service.check refuses these before change sees them
			}
			before := proto.Clone(st).(*clientpb.QueueState)
			answer, ev, err := change(st, op, req, who, maxEntries, now)
			if err := check(st, maxEntries); err != nil {
				t.Fatalf("after %v %q by %+v: %v", op, key, who, err)
			}
			if err != nil {
				if !proto.Equal(before, st) {
					t.Fatalf("refused %v %q by %+v changed the queue: %v", op, key, who, err)
				}
				continue
			}
			if ev == nil || ev.Op != op {
				t.Fatalf("%v succeeded with event %v", op, ev)
			}
			switch op {
			case clientpb.QueueOp_QUEUE_OP_OFFER:
				if i := find(st, key); i < 0 || st.Entries[i].Uid != who.uid || len(answer) != 1 {
					t.Fatalf("offer of %q by %+v: the queue is %v", key, who, st.Entries)
				}
			case clientpb.QueueOp_QUEUE_OP_POLL, clientpb.QueueOp_QUEUE_OP_REMOVE:
				if len(answer) != 1 || find(st, answer[0].Key) >= 0 || len(st.Entries) != len(before.Entries)-1 {
					t.Fatalf("%v of %q: answered %v, the queue is %v", op, key, answer, st.Entries)
				}
			case clientpb.QueueOp_QUEUE_OP_CLEAR:
				if len(st.Entries) != 0 || len(answer) != len(before.Entries) {
					t.Fatalf("clear left %v", st.Entries)
				}
			default:
				t.Fatalf("%v is not a change, yet it succeeded", op)
			}
		}
	})
}

// check returns what is wrong with a queue, or nil.
func check(st *clientpb.QueueState, maxEntries int) error {
	if len(st.Entries) > maxEntries {
		return fmt.Errorf("%d entries, the limit is %d", len(st.Entries), maxEntries)
	}
	seen := make(map[string]bool)
	for _, e := range st.Entries {
		if seen[e.Key] {
			return fmt.Errorf("key %q twice", e.Key)
		}
		seen[e.Key] = true
	}
	return nil
}
