package api_test

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// historyRoom fills a room through the API with 12 messages numbered in their body: 0-11, lanes
// critical (every third) and normal, those with i%4 == 1 only for "vip" members, plus bulk
// messages that history does not keep. It waits until all 12 are kept and returns the bodies
// in order.
func historyRoom(t *testing.T, c *devcluster.Cluster, g apipb.RoomcastAPIClient, room string) []string {
	t.Helper()
	var bodies []string
	for i := range 12 {
		lane, expr := "normal", ""
		if i%3 == 0 {
			lane = "critical"
		}
		if i%4 == 1 {
			expr = `"vip" in tags`
		}
		if _, err := g.SendToRoom(devCtx(), &apipb.SendToRoomRequest{Room: room, Type: "chat", Lane: lane, Body: strconv.Itoa(i), TagExpr: expr}); err != nil {
			t.Fatal(err)
		}
		if _, err := g.SendToRoom(devCtx(), &apipb.SendToRoomRequest{Room: room, Type: "danmaku", Lane: "bulk", Body: "bulk"}); err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, strconv.Itoa(i))
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		page, err := g.GetHistory(devCtx(), &apipb.GetHistoryRequest{Room: room, Limit: 100})
		if err != nil {
			return err
		}
		if got := bodiesOf(page.Messages); !slices.Equal(got, bodies) {
			return fmt.Errorf("history %v, want %v", got, bodies)
		}
		return nil
	})
	return bodies
}

func bodiesOf(ms []*clientpb.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.Body)
	}
	return out
}

// visible returns the bodies of historyRoom a member with the vip tag (or without) may see.
func visible(bodies []string, vip bool) []string {
	var out []string
	for i, b := range bodies {
		if vip || i%4 != 1 {
			out = append(out, b)
		}
	}
	return out
}

// pageAll follows next cursors from the first page and returns every page's bodies, and the
// bodies in the order a reader sees them (oldest first overall).
func pageAll(t *testing.T, first func(cursor string) (*clientpb.HistoryPage, error), older bool) (pages [][]string, all []string) {
	t.Helper()
	cursor := ""
	for range 20 {
		page, err := first(cursor)
		if err != nil {
			t.Fatal(err)
		}
		got := bodiesOf(page.Messages)
		pages = append(pages, got)
		if older {
			all = append(got, all...)
		} else {
			all = append(all, got...)
		}
		if page.NextCursor == "" {
			return pages, all
		}
		cursor = page.NextCursor
	}
	t.Fatal("paging did not end")
	return nil, nil
}

// TestHistoryGRPC pages a room's history over gRPC: the newest first and older pages, pages
// after an id, one lane, what a member with or without a tag may see, and bad queries.
func TestHistoryGRPC(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	g := grpcClient(t, c)
	const room = "hist"
	bodies := historyRoom(t, c, g, room)
	all, err := g.GetHistory(devCtx(), &apipb.GetHistoryRequest{Room: room, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(all.Messages))
	for i, m := range all.Messages {
		ids[i] = m.Id
	}

	t.Run("newest then older pages", func(t *testing.T) {
		pages, got := pageAll(t, func(cursor string) (*clientpb.HistoryPage, error) {
			return g.GetHistory(devCtx(), &apipb.GetHistoryRequest{Room: room, Limit: 5, Cursor: cursor})
		}, true)
		want := [][]string{bodies[7:], bodies[2:7], bodies[:2]}
		if fmt.Sprint(pages) != fmt.Sprint(want) || !slices.Equal(got, bodies) {
			t.Errorf("pages %v, want %v", pages, want)
		}
	})
	t.Run("after an id, newer pages", func(t *testing.T) {
		pages, got := pageAll(t, func(cursor string) (*clientpb.HistoryPage, error) {
			r := &apipb.GetHistoryRequest{Room: room, Limit: 4, Cursor: cursor}
			if cursor == "" {
				r.AfterId = ids[2]
			}
			return g.GetHistory(devCtx(), r)
		}, false)
		want := [][]string{bodies[3:7], bodies[7:11], bodies[11:]}
		if fmt.Sprint(pages) != fmt.Sprint(want) || !slices.Equal(got, bodies[3:]) {
			t.Errorf("pages %v, want %v", pages, want)
		}
	})
	t.Run("before an id", func(t *testing.T) {
		page, err := g.GetHistory(devCtx(), &apipb.GetHistoryRequest{Room: room, Limit: 3, BeforeId: ids[6]})
		if err != nil {
			t.Fatal(err)
		}
		if got := bodiesOf(page.Messages); !slices.Equal(got, bodies[3:6]) || page.NextCursor == "" {
			t.Errorf("before %s: %v (next %q), want %v and a cursor", ids[6], got, page.NextCursor, bodies[3:6])
		}
	})
	t.Run("one lane", func(t *testing.T) {
		page, err := g.GetHistory(devCtx(), &apipb.GetHistoryRequest{Room: room, Lane: "critical"})
		if err != nil {
			t.Fatal(err)
		}
		if got := bodiesOf(page.Messages); !slices.Equal(got, []string{"0", "3", "6", "9"}) {
			t.Errorf("critical lane: %v", got)
		}
	})
	for _, vip := range []bool{false, true} {
		t.Run(fmt.Sprintf("as a member, vip %v", vip), func(t *testing.T) {
			var tags []string
			if vip {
				tags = []string{"vip"}
			}
			_, got := pageAll(t, func(cursor string) (*clientpb.HistoryPage, error) {
				return g.GetHistory(devCtx(), &apipb.GetHistoryRequest{Room: room, Limit: 3, Cursor: cursor, AsMember: true, Uid: "bob", Tags: tags})
			}, true)
			if want := visible(bodies, vip); !slices.Equal(got, want) {
				t.Errorf("member sees %v, want %v", got, want)
			}
		})
	}
	t.Run("bad queries", func(t *testing.T) {
		for _, r := range []*apipb.GetHistoryRequest{
			{Room: room, Cursor: "not-a-cursor"},
			{Room: room, BeforeId: "x"},
			{Room: room, AfterId: ids[0], BeforeId: ids[1]},
			{Room: room, Lane: "bulk"},
			{Room: room, Uid: "bob"},
		} {
			_, err := g.GetHistory(devCtx(), r)
			if code := grpcErrorCode(err); code != "BAD_HISTORY_QUERY" {
				t.Errorf("%v: %v (reason %q), want BAD_HISTORY_QUERY", r, err, code)
			}
		}
	})
}

// TestHistoryHTTP pages the same way over HTTP, as a member with a tag, and checks the bad
// query's answer.
func TestHistoryHTTP(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	g := grpcClient(t, c)
	const room = "hist"
	bodies := historyRoom(t, c, g, room)
	for _, vip := range []bool{false, true} {
		var got []string
		q := url.Values{"limit": {"4"}, "as_member": {"true"}, "uid": {"bob"}, "tags": {"fan"}}
		if vip {
			q["tags"] = append(q["tags"], "vip")
		}
		for range 10 {
			out := mustHTTP(t, c, 200, "GET", "/v1/rooms/"+room+"/history?"+q.Encode(), "")
			var page []string
			msgs, _ := out["messages"].([]any)
			for _, m := range msgs {
				body, err := base64.StdEncoding.DecodeString(m.(map[string]any)["body"].(string))
				if err != nil {
					t.Fatalf("body of %v: %v", m, err)
				}
				page = append(page, string(body))
			}
			got = append(page, got...)
			next, _ := out["next_cursor"].(string)
			if next == "" {
				break
			}
			q.Set("cursor", next)
		}
		if want := visible(bodies, vip); !slices.Equal(got, want) {
			t.Errorf("vip %v: member sees %v over HTTP, want %v", vip, got, want)
		}
	}
	out := mustHTTP(t, c, 400, "GET", "/v1/rooms/"+room+"/history?cursor=nope", "")
	if out["name"] != "BAD_HISTORY_QUERY" || out["code"] != float64(clientpb.ErrorCode_ERROR_CODE_BAD_HISTORY_QUERY) {
		t.Errorf("bad cursor: %v", out)
	}
}

// TestHistoryRetention: a room's settings keep fewer messages, and for less time, than the
// deployment; the history API serves only what they keep.
func TestHistoryRetention(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	g := grpcClient(t, c)
	const room = "hist"
	if _, err := g.CreateRoom(devCtx(), &apipb.CreateRoomRequest{Room: room, Settings: &roompb.RoomSettings{HistoryMaxMessages: 5}}); err != nil {
		t.Fatal(err)
	}
	bodies := make([]string, 12)
	for i := range bodies {
		bodies[i] = strconv.Itoa(i)
		if _, err := g.SendToRoom(devCtx(), &apipb.SendToRoomRequest{Room: room, Body: bodies[i]}); err != nil {
			t.Fatal(err)
		}
	}
	want := bodies[7:]
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		page, err := g.GetHistory(devCtx(), &apipb.GetHistoryRequest{Room: room, Limit: 100})
		if err != nil {
			return err
		}
		if got := bodiesOf(page.Messages); !slices.Equal(got, want) || page.NextCursor != "" {
			return fmt.Errorf("history %v (next %q), want %v: the room keeps 5", got, page.NextCursor, want)
		}
		return nil
	})

	// A one-second age: the messages leave the room's history about a second after they came.
	if _, err := g.UpdateRoom(devCtx(), &apipb.UpdateRoomRequest{Room: room, Settings: &roompb.RoomSettings{HistoryMaxMessages: 5, HistoryMaxAgeS: 1}}); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		page, err := g.GetHistory(devCtx(), &apipb.GetHistoryRequest{Room: room})
		if err != nil {
			return err
		}
		if len(page.Messages) > 0 {
			return fmt.Errorf("history still holds %v after the room's age", bodiesOf(page.Messages))
		}
		return nil
	})
}
