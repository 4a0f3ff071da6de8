package bus

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// createAttempt bounds one attempt of CreateOrUpdateKeyValue and CreateOrUpdateStream.
const createAttempt = 2 * time.Second

// CreateOrUpdateKeyValue is js.CreateOrUpdateKeyValue asked again every 2 s until it answers or
// ctx ends. On a JetStream cluster, two processes creating the same replicated stream at once can
// both go unanswered (nats-io/nats-server#3677: about one time in two on a 3-node cluster), which
// a deployment that starts its roles together meets at its first start; the stream exists by
// then, and the next attempt finds it at once.
func CreateOrUpdateKeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return untilAnswered(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return js.CreateOrUpdateKeyValue(ctx, cfg) })
}

// CreateOrUpdateStream is js.CreateOrUpdateStream asked again like CreateOrUpdateKeyValue.
func CreateOrUpdateStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	return untilAnswered(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.CreateOrUpdateStream(ctx, cfg) })
}

// untilAnswered calls f with a context of createAttempt until it returns anything but an
// unanswered request, or ctx ends. Without a deadline on ctx it calls f once, with ctx: the
// jetstream package's own timeout then ends a request nobody answers.
func untilAnswered[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	if _, ok := ctx.Deadline(); !ok {
		return f(ctx)
	}
	for {
		actx, cancel := context.WithTimeout(ctx, createAttempt)
		v, err := f(actx)
		cancel()
		unanswered := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
		if err == nil || !unanswered || ctx.Err() != nil {
			return v, err
		}
	}
}
