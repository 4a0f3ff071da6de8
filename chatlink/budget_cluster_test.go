package chatlink_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
)

// TestBudgetsPerAudience: ten classes of a room each get 10 messages a second sent to their own
// class (a tag expression), under the default budget of 20 a second per member. Each member's
// budget applies to what it would receive, so every member gets its own class's messages and
// no class starves; none gets another class's, and none more than its budget allows.
func TestBudgetsPerAudience(t *testing.T) {
	t.Parallel()
	const classes, rate, budget = 10, 10, 20 // budget: the default normal_budget
	perClass, seconds := 200, 3
	if testing.Short() {
		perClass, seconds = 20, 2
	}
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	node := c.Nodes[0]

	members := make([][]*testkit.Client, classes)
	for k := range classes {
		members[k] = make([]*testkit.Client, perClass)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < classes*perClass; i += 8 {
				k, j := i%classes, i/classes
				cl := testkit.DialTCP(t, node.TCPAddr())
				cl.Login(testcluster.Token(t, fmt.Sprintf("u%d-%d", k, j), "classes", fmt.Sprintf("class:%d", k)))
				members[k][j] = cl
			}
		})
	}
	wg.Wait()

	// Every class gets rate messages a second, the classes in turn.
	sent := make([]int, classes)
	start := time.Now()
	tick := time.NewTicker(time.Second / (classes * rate))
	defer tick.Stop()
	for i := 0; i < classes*rate*seconds; i++ {
		<-tick.C
		k := i % classes
		apiSend(t, c, "classes", fmt.Sprintf(`{"body":"%d","tag_expr":"\"class:%d\" in tags"}`, k, k))
		sent[k]++
	}
	elapsed := time.Since(start)

	// Budget: rate a second and one 100 ms tick's worth at the start.
	most := int(budget*elapsed.Seconds()) + budget/10 + 1
	got := make([][]int, classes)
	for k := range classes {
		got[k] = make([]int, perClass)
	}
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		for k, cls := range members {
			for j, cl := range cls {
			drain:
				for {
					select {
					case f := <-cl.Frames():
						for _, m := range f.GetPush().GetMessages() {
							if string(m.Body) != fmt.Sprint(k) {
								t.Fatalf("member %d of class %d got class %s's message", j, k, m.Body)
							}
							got[k][j]++
						}
					default:
						break drain
					}
				}
				if got[k][j] > most {
					t.Fatalf("member %d of class %d got %d messages in %v, over its budget of %d/s", j, k, got[k][j], elapsed, budget)
				}
				if got[k][j] < sent[k] {
					return fmt.Errorf("member %d of class %d got %d of its class's %d messages (%d/s, within its budget of %d/s)",
						j, k, got[k][j], sent[k], rate, budget)
				}
			}
		}
		return nil
	})
}
