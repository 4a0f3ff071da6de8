package inbox_test

import (
	"context"
	"strconv"
	"testing"

	"roomcast/internal/testkit"
	"roomcast/store/inbox"
)

// BenchmarkLoginReads: what a login's reads of its stored messages cost when the user has
// nothing stored (most users), in the process's CPU per login, the embedded NATS server
// included: a first read and the second a second later, each a List ("alone"), or each a
// share of one Holding for the 20 logins of a batch ("batched", what a ChatLink does).
func BenchmarkLoginReads(b *testing.B) {
	js := startJS(b)
	ctx := context.Background()
	if _, err := inbox.Open(ctx, js, inbox.Config{}); err != nil {
		b.Fatal(err)
	}
	reader := inbox.NewReader(js)
	const batch = 20
	users := make([]inbox.User, 1000)
	for i := range users {
		users[i] = inbox.User{App: "app", UID: "user-" + strconv.Itoa(i)}
	}
	b.Run("alone", func(b *testing.B) {
		before := testkit.ProcessCPU()
		for i := range b.N {
			u := users[i%len(users)]
			for range 2 {
				if _, err := reader.List(ctx, u.App, u.UID); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64((testkit.ProcessCPU()-before).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
	b.Run("batched", func(b *testing.B) {
		before := testkit.ProcessCPU()
		for i := 0; i < b.N; i += batch {
			from := i % (len(users) - batch)
			for range 2 {
				if _, err := reader.Holding(ctx, users[from:from+batch]); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64((testkit.ProcessCPU()-before).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
}
