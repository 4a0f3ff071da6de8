package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// DirectGetRequest is a batched direct get of JetStream (ADR-31, nats-server 2.11+): the
// stream's messages on a subject from a sequence or a time, as many as batch, answered by a
// stream of messages that ends with an end-of-batch status.
type DirectGetRequest struct {
	Seq       uint64     `json:"seq,omitempty"`
	StartTime *time.Time `json:"start_time,omitempty"`
	NextFor   string     `json:"next_by_subj"`
	Batch     int        `json:"batch"`
}

// errDirectGet is a direct get's answer that is neither a message nor its end.
var errDirectGet = errors.New("direct get failed")

// DirectGet sends one batched direct get of a stream and hands each entry to take, in order,
// on the caller's goroutine. more reports that the batch ended before the subject's
// messages did (by its size or the server's byte limit): ask again from after the last one.
//
// The answers come on the connection's reply mux (RequestAnswers), not on a subscription of
// the read's own.
func DirectGet(ctx context.Context, nc *nats.Conn, stream string, req DirectGetRequest, take func(seq uint64, entry *nats.Msg)) (more bool, err error) {
	body, err := json.Marshal(req)
	if err != nil {
		return false, err
	}
	var answerErr error
	err = RequestAnswers(ctx, nc, "$JS.API.DIRECT.GET."+stream, body, func(msg *nats.Msg) bool {
		var ended bool
		ended, more, answerErr = directGetAnswer(msg, stream, take)
		return ended
	})
	if err != nil {
		return false, err
	}
	return more, answerErr
}

// directGetAnswer handles one message of a direct get's answer: a kept entry, handed to take,
// or a status that ends the answer (ended), with more and err for DirectGet to return.
func directGetAnswer(msg *nats.Msg, stream string, take func(seq uint64, entry *nats.Msg)) (ended, more bool, err error) {
	if status := msg.Header.Get("Status"); len(msg.Data) == 0 && status != "" {
		switch status {
		case "404": // nothing from there on
			return true, false, nil
		case "204": // the end of the batch
			pending, _ := strconv.ParseUint(msg.Header.Get("Nats-Num-Pending"), 10, 64)
			return true, pending > 0, nil
		case "503":
			return true, false, fmt.Errorf("%w: no server answers direct gets of %s", errDirectGet, stream)
		default:
			return true, false, fmt.Errorf("%w: status %s %s", errDirectGet, status, msg.Header.Get("Description"))
		}
	}
	seq, err := strconv.ParseUint(msg.Header.Get("Nats-Sequence"), 10, 64)
	if err != nil {
		return true, false, fmt.Errorf("%w: a message without its sequence", errDirectGet)
	}
	take(seq, msg)
	return false, false, nil
}
