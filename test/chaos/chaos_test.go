package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"roomcast/internal/auth"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/procs"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

const deployDir = "../../deploy"

func TestMain(m *testing.M) {
	if os.Getenv(stormWorkerEnv) != "" {
		os.Exit(runStormWorker())
	}
	procs.Main(m)
}

// start starts the deployment for a case; the cases are skipped with -short (`make chaos` runs
// them) and run one at a time: each takes the machine.
func start(t *testing.T, cfg procs.Config) *procs.Deployment {
	t.Helper()
	if testing.Short() {
		t.Skip("a chaos case: `make chaos` runs it")
	}
	cfg.DeployDir = deployDir
	return procs.Start(t, cfg)
}

// apiCall makes a server API call on the services process at api with the deployment's key.
func apiCall(ctx context.Context, hc *http.Client, api, method, path, body string) error {
	return apiJSON(ctx, hc, api, method, path, body, nil)
}

// apiJSON is apiCall that decodes the answer into out, unless out is nil.
func apiJSON(ctx context.Context, hc *http.Client, api, method, path, body string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+api+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+procs.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// dispatched returns the nodes the dispatcher at api hands out for a member of room.
func dispatched(hc *http.Client, api, room string) ([]string, error) {
	resp, err := hc.Get("http://" + api + "/v1/dispatch?app=" + procs.App + "&room=" + room + "&uid=probe")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var a struct{ Nodes []sdk.Endpoint }
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return nil, err
	}
	var nodes []string
	for _, n := range a.Nodes {
		nodes = append(nodes, n.Node)
	}
	return nodes, nil
}

// member is one SDK client of the room and what it got.
type member struct {
	cl *sdk.Client

	mu          sync.Mutex // guards the fields below
	bodies      []string   // critical messages, in the order handed on
	reconnected time.Time  // when the first reconnect's login succeeded
	reconnects  int        // logins after the first
	recovered   int        // RecoveredEvents with Recovered true
	unrecovered int        // RecoveredEvents with Recovered false
	errs        []error    // ErrorEvents' and ClosedEvents' errors
}

func (m *member) config() sdk.Config {
	return sdk.Config{
		ReconnectMinDelay: 200 * time.Millisecond, ReconnectMaxDelay: time.Second,
		OnMessage: func(msg *clientpb.Message) {
			if msg.GetLane() != clientpb.Lane_LANE_CRITICAL {
				return
			}
			m.mu.Lock()
			m.bodies = append(m.bodies, string(msg.GetBody()))
			m.mu.Unlock()
		},
		OnEvent: func(ev sdk.Event) {
			m.mu.Lock()
			defer m.mu.Unlock()
			switch e := ev.(type) {
			case *sdk.ConnectedEvent:
				if e.Reconnected {
					m.reconnects++
				}
				if e.Reconnected && m.reconnected.IsZero() {
					m.reconnected = time.Now()
				}
			case *sdk.ErrorEvent:
				m.errs = append(m.errs, e.Err)
			case *sdk.ClosedEvent:
				if !errors.Is(e.Err, sdk.ErrClosed) {
					m.errs = append(m.errs, e.Err)
				}
			case *sdk.RecoveredEvent:
				if e.Recovered {
					m.recovered++
				} else {
					m.unrecovered++
				}
			}
		},
	}
}

// room is a room of the deployment with its members, under critical load.
type room struct {
	name    string
	d       *procs.Deployment
	hc      *http.Client
	members []*member
	retried atomic.Int64 // sends the API refused and send made again
}

// join creates the room and logs n members in through the dispatcher, 64 at a time.
func join(t *testing.T, d *procs.Deployment, name string, n int) *room {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := apiCall(ctx, hc, d.Services[0].API, "POST", "/v1/rooms", `{"room":"`+name+`"}`); err != nil {
		t.Fatal(err)
	}
	// Both ChatLinks take members, so that a kill moves part of the room.
	testkit.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		nodes, err := dispatched(hc, d.Services[0].API, name)
		if err != nil || len(nodes) < len(d.ChatLinks) {
			return fmt.Errorf("dispatcher lists %v: %v", nodes, err)
		}
		return nil
	})
	r := &room{name: name, d: d, hc: hc, members: make([]*member, n)}
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range n {
		m := &member{}
		r.members[i] = m
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := r.dial(ctx, t, m, fmt.Sprintf("viewer-%d", i)); err != nil && failed.Add(1) <= 3 {
				t.Errorf("member %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return r
}

// dial logs m in as uid through the first services process's dispatcher; the client is closed
// when t ends.
func (r *room) dial(ctx context.Context, t *testing.T, m *member, uid string) error {
	tok, err := auth.Mint([]byte(procs.Secret), procs.App, uid, r.name, nil, time.Hour)
	if err != nil {
		return err
	}
	cfg := m.config()
	cfg.Token, cfg.Dispatcher, cfg.HTTPClient = tok, r.d.Dispatcher(), r.hc
	cl, err := sdk.Dial(ctx, cfg)
	if err != nil {
		return err
	}
	m.cl = cl
	t.Cleanup(func() { cl.Close() })
	return nil
}

// on returns the members on each node.
func (r *room) on() map[string][]*member {
	out := map[string][]*member{}
	for _, m := range r.members {
		node := m.cl.LoginAck().GetNode()
		out[node] = append(out[node], m)
	}
	return out
}

// send sends total critical messages, "0" .. "total-1", at rate a second through the first
// services process's API, and returns when done (or on the first error, which it returns).
// at(i) is called before message i.
func (r *room) send(ctx context.Context, total, rate int, at func(i int)) error {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range total {
		<-tick.C
		at(i)
		body := fmt.Sprintf(`{"type":"notice","lane":"critical","body":%q}`, strconv.Itoa(i))
		// A refused send is retried, as a sender would; a send refused but delivered anyway
		// shows up as a duplicate.
		for attempt := 0; ; attempt++ {
			err := apiCall(ctx, r.hc, r.d.Services[0].API, "POST", "/v1/rooms/"+r.name+"/messages", body)
			if err == nil {
				break
			}
			if attempt == 50 {
				return fmt.Errorf("message %d: %w", i, err)
			}
			r.retried.Add(1)
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// tally is what the members got of total critical messages: how many are missing and how many
// came twice (summed over the members), how many members have them all once but in another
// order than the room's (the first member's), how many were told their recovery was
// incomplete, and how many of the room's messages came before one sent earlier: with several
// services instances the room's order is by batch window between instances, not by the exact
// arrival of each message (room/batcher.go), so two sends 20 ms apart may swap.
type tally struct {
	lost, duplicates, disordered, unrecovered, swapped int
}

// await waits up to wait until every member has total messages, then counts what they got.
func (r *room) await(t *testing.T, total int, wait time.Duration) tally {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		done := true
		for _, m := range r.members {
			m.mu.Lock()
			done = done && len(m.bodies) >= total
			m.mu.Unlock()
		}
		if done {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	var tl tally
	var order []string // the room's order: the first member's
	for i, m := range r.members {
		m.mu.Lock()
		seen := map[string]int{}
		for _, b := range m.bodies {
			seen[b]++
		}
		for j := range total {
			switch n := seen[strconv.Itoa(j)]; {
			case n == 0:
				if tl.lost++; tl.lost <= 3 {
					t.Logf("member %d lacks message %d; its errors: %v; reconnects %d", i, j, m.errs, m.reconnects)
				}
			case n > 1:
				tl.duplicates += n - 1
			}
		}
		if complete := len(seen) == total && len(m.bodies) == total; complete && order == nil {
			order = slices.Clone(m.bodies)
		} else if complete && !slices.Equal(m.bodies, order) {
			if tl.disordered++; tl.disordered == 1 {
				at := 0
				for at < total && m.bodies[at] == order[at] {
					at++
				}
				t.Logf("member %d's order departs from the room's at position %d: %v, not %v", i, at, m.bodies[at:min(total, at+5)], order[at:min(total, at+5)])
			}
		}
		tl.unrecovered += m.unrecovered
		m.mu.Unlock()
	}
	for j := 1; j < len(order); j++ {
		a, _ := strconv.Atoi(order[j-1])
		b, _ := strconv.Atoi(order[j])
		if b < a {
			tl.swapped++
		}
	}
	return tl
}

// check fails t unless every member has every message exactly once and in order.
func (tl tally) check(t *testing.T) {
	t.Helper()
	if tl.lost > 0 || tl.duplicates > 0 || tl.disordered > 0 {
		t.Errorf("critical lane: %d deliveries lost, %d duplicated, %d members in another order than the room's", tl.lost, tl.duplicates, tl.disordered)
	}
}
