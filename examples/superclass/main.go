// Command superclass plays a "super small class" on Roomcast: one lecturer, three classes of
// five students and an assistant each, all in one room, kept apart by tags. It prints who
// received each message and checks it against what the room's rules promise; it exits 1 when
// anything reached the wrong members.
//
// By default it starts its own in-process deployment (the one `roomcast dev` runs); with
// --dispatcher and --api it plays against a running one instead:
//
//	go run ./examples/superclass
//	go run ./examples/superclass --dispatcher http://127.0.0.1:8080 --api http://127.0.0.1:8080
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"time"

	"roomcast/internal/auth"
	"roomcast/internal/roles/devcluster"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// Config says where to play.
type Config struct {
	Dispatcher, API, APIKey, App, Secret string
	// Room is the room to play in; a fresh one per run keeps runs apart.
	Room string
	Out  io.Writer
}

func main() {
	cfg := Config{Out: os.Stdout}
	flag.StringVar(&cfg.Dispatcher, "dispatcher", "", "dispatcher URL of a running deployment (default: start one in-process)")
	flag.StringVar(&cfg.API, "api", "", "server API URL of a running deployment")
	flag.StringVar(&cfg.APIKey, "api-key", devcluster.APIKey, "server API key")
	flag.StringVar(&cfg.App, "app", devcluster.App, "app id")
	flag.StringVar(&cfg.Secret, "secret", devcluster.Secret, "the app's token secret")
	flag.StringVar(&cfg.Room, "room", fmt.Sprintf("superclass-%d", time.Now().Unix()), "room to play in")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if cfg.Dispatcher == "" {
		dir, err := os.MkdirTemp("", "superclass")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer os.RemoveAll(dir)
		c, err := devcluster.Start(ctx, devcluster.Config{DataDir: dir, ChatLinks: 2})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer c.Close()
		cfg.Dispatcher, cfg.API = c.URL(), c.URL()
	}
	if err := Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "superclass:", err)
		os.Exit(1)
	}
}

// member is one participant: a connected client and what it received.
type member struct {
	uid    string
	tags   []string
	client *sdk.Client

	mu  sync.Mutex      // guards got
	got map[string]bool // message bodies received
}

func (m *member) received(body string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.got[body]
}

// class is the members' class number ("" for the lecturer).
func (m *member) class() string {
	for _, t := range m.tags {
		if c, ok := strings.CutPrefix(t, "class:"); ok {
			return c
		}
	}
	return ""
}

type play struct {
	cfg     Config
	members []*member
	byUID   map[string]*member
	failed  []string
}

// Run plays the class and checks every delivery.
func Run(ctx context.Context, cfg Config) error {
	p := &play{cfg: cfg, byUID: map[string]*member{}}
	defer func() {
		for _, m := range p.members {
			if m.client != nil {
				_ = m.client.Close()
			}
		}
	}()
	// The room's rules: the lecturer and assistants may send to anyone; a student's messages
	// stay in the student's class, and a student may not pick an audience.
	if err := p.api(ctx, "POST", "/v1/rooms", map[string]any{
		"room": cfg.Room, "name": "Super small class",
		"settings": map[string]any{
			"broadcast_expr": `role in ["lecturer", "assistant"]`,
			"scope_prefix":   "class:",
			"normal_budget":  -1, // a class is small: let every message through
			"flush_tick_ms":  50,
		},
	}, nil); err != nil {
		return err
	}
	if err := p.join(ctx, "lecturer", "role:lecturer"); err != nil {
		return err
	}
	for c := 1; c <= 3; c++ {
		if err := p.join(ctx, fmt.Sprintf("assistant-%d", c), "role:assistant", fmt.Sprintf("class:%d", c)); err != nil {
			return err
		}
		for s := 1; s <= 5; s++ {
			if err := p.join(ctx, fmt.Sprintf("student-%d-%d", c, s), "role:student", fmt.Sprintf("class:%d", c)); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(cfg.Out, "room %s: 1 lecturer, 3 classes of 5 students, 3 assistants\n\n", cfg.Room)

	inClass := func(classes ...string) func(*member) bool {
		return func(m *member) bool { return slices.Contains(classes, m.class()) }
	}
	everyone := func(*member) bool { return true }

	p.send(ctx, "student-1-1", "class 1 chat", "", inClass("1"))
	p.send(ctx, "assistant-2", "class 2 homework", `"class:2" in tags`, inClass("2"))
	p.send(ctx, "lecturer", "notice: break in 5 minutes", "", everyone)
	p.send(ctx, "lecturer", "PK: class 1 vs class 3", `"class:1" in tags || "class:3" in tags`, inClass("1", "3"))
	p.refused(ctx, "student-1-2", "sneaking into class 2", `"class:2" in tags`)

	// The app server moves a student to class 2; the move takes effect at once.
	if err := p.api(ctx, "PUT", "/v1/users/student-1-5/tags", map[string]any{"tags": []string{"role:student", "class:2"}}, nil); err != nil {
		return err
	}
	p.byUID["student-1-5"].tags = []string{"role:student", "class:2"}
	fmt.Fprintln(cfg.Out, "student-1-5 moved to class 2")
	p.send(ctx, "student-2-1", "class 2 chat after the move", "", inClass("2"))
	p.send(ctx, "student-1-1", "class 1 chat after the move", "", inClass("1"))

	if len(p.failed) > 0 {
		return fmt.Errorf("%d deliveries went wrong:\n  %s", len(p.failed), strings.Join(p.failed, "\n  "))
	}
	fmt.Fprintln(cfg.Out, "\nevery message reached exactly the members it should")
	return nil
}

func (p *play) join(ctx context.Context, uid string, tags ...string) error {
	tok, err := auth.Mint([]byte(p.cfg.Secret), p.cfg.App, uid, p.cfg.Room, tags, time.Hour)
	if err != nil {
		return err
	}
	m := &member{uid: uid, tags: tags, got: map[string]bool{}}
	m.client, err = sdk.Dial(ctx, sdk.Config{
		Token: tok, Dispatcher: p.cfg.Dispatcher,
		OnMessage: func(msg *clientpb.Message) {
			m.mu.Lock()
			m.got[string(msg.Body)] = true
			m.mu.Unlock()
		},
	})
	if err != nil {
		return fmt.Errorf("%s: %w", uid, err)
	}
	p.members = append(p.members, m)
	p.byUID[uid] = m
	return nil
}

// send has uid send body (to expr, if set) and checks that exactly the members for which want
// is true, other than the sender, received it.
func (p *play) send(ctx context.Context, uid, body, expr string, want func(*member) bool) {
	from := p.byUID[uid]
	if _, err := from.client.Send(ctx, sdk.Outgoing{Type: "chat", Body: []byte(body), TagExpr: expr}); err != nil {
		p.failed = append(p.failed, fmt.Sprintf("%s could not send %q: %v", uid, body, err))
		return
	}
	var expected []*member
	for _, m := range p.members {
		if m != from && want(m) {
			expected = append(expected, m)
		}
	}
	// Wait for the expected members, then a little longer for any unexpected one.
	deadline := time.Now().Add(5 * time.Second)
	for _, m := range expected {
		for !m.received(body) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	time.Sleep(200 * time.Millisecond)
	var got []string
	for _, m := range p.members {
		switch r, w := m.received(body), m != from && want(m); {
		case r:
			got = append(got, m.uid)
			if !w {
				p.failed = append(p.failed, fmt.Sprintf("%s got %q", m.uid, body))
			}
		case w:
			p.failed = append(p.failed, fmt.Sprintf("%s did not get %q", m.uid, body))
		}
	}
	fmt.Fprintf(p.cfg.Out, "%-12s %-30q -> %d: %s\n", uid, body, len(got), strings.Join(got, " "))
}

// refused checks that uid may not send body to expr.
func (p *play) refused(ctx context.Context, uid, body, expr string) {
	_, err := p.byUID[uid].client.Send(ctx, sdk.Outgoing{Type: "chat", Body: []byte(body), TagExpr: expr})
	var se *sdk.SendError
	if !errors.As(err, &se) || se.Code != uint32(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN) {
		p.failed = append(p.failed, fmt.Sprintf("%s sending %q to %s: want FORBIDDEN, got %v", uid, body, expr, err))
		return
	}
	fmt.Fprintf(p.cfg.Out, "%-12s %-30q -> refused: %s\n", uid, body, se.Message)
}

// api calls the server API; a 2xx answer is decoded into out when out is not nil.
func (p *play) api(ctx context.Context, method, path string, body, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.cfg.API+path, r)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+p.cfg.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: HTTP %d %s", method, path, resp.StatusCode, raw)
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}
