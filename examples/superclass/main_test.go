package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/sdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSuperclass plays the class on a two-node cluster: class chat stays in the class,
// assistants see their class, the lecturer's notice reaches everyone, a PK message reaches
// exactly two classes, a student cannot send to another class, and a tag change moves a
// student between classes live. Then the moved student reconnects with its old token and is
// still in its new class.
func TestSuperclass(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	cfg := Config{Dispatcher: c.URL(), API: c.URL(), APIKey: devcluster.APIKey, App: devcluster.App, Secret: devcluster.Secret, Room: "class", Out: &out}
	if err := Run(ctx, cfg); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{`"PK: class 1 vs class 3"       -> 12`, `-> refused`, `"notice: break in 5 minutes"   -> 18`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	// Stored tags outlive the session: the old token says class 1, the app server said class 2.
	tok := testcluster.Token(t, "student-1-5", "class", "role:student", "class:1")
	cl, err := sdk.Dial(ctx, sdk.Config{Token: tok, Dispatcher: c.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	p := &play{cfg: cfg}
	var members struct {
		Members []struct {
			UID  string   `json:"uid"`
			Tags []string `json:"tags"`
		} `json:"members"`
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if err := p.api(ctx, "GET", "/v1/rooms/class/members?tag=class:2", nil, &members); err != nil {
			t.Fatal(err)
		}
		for _, m := range members.Members {
			if m.UID == "student-1-5" {
				return nil
			}
		}
		return fmt.Errorf("student-1-5 is not in class 2 after reconnecting: %+v", members)
	})
}
