package api_test

import (
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

// TestByTagExpression counts, lists, mutes and kicks a room's members by tag expression over
// gRPC and HTTP, with the room's members spread over two ChatLinks.
func TestByTagExpression(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, func(cfg *devcluster.Config) { cfg.ChatLinks, cfg.LeaseInterval = 2, 100*time.Millisecond })
	g := grpcClient(t, c)
	ctx := devCtx()
	if _, err := g.CreateRoom(ctx, &apipb.CreateRoomRequest{Room: "cls"}); err != nil {
		t.Fatal(err)
	}
	n1, n2 := c.Nodes[0].TCPAddr(), c.Nodes[1].TCPAddr()
	s1, _ := member(t, n1, "s1", "cls", "class:1", "role:student")
	s2, _ := member(t, n1, "s2", "cls", "class:2", "role:student")
	a1, _ := member(t, n1, "a1", "cls", "class:1", "role:assistant")
	s3, _ := member(t, n2, "s3", "cls", "class:1", "role:student")
	s4, _ := member(t, n2, "s4", "cls", "class:2", "role:student")
	lec, _ := member(t, n2, "lec", "cls", "role:lecturer")
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if r, err := g.GetRoom(ctx, &apipb.GetRoomRequest{Room: "cls"}); err != nil || r.Online != 6 || len(r.Nodes) != 2 {
			return fmt.Errorf("GetRoom: %v %v, want 6 members on 2 nodes", r, err)
		}
		return nil
	})

	// Online counts per expression and per tag, over both transports.
	exprs := []string{`"class:1" in tags`, `role == "student"`, `uid startsWith "s"`, `"class:9" in tags`}
	var co *apipb.CountOnlineResponse
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error { // presence counts sessions a moment after the nodes
		var err error
		if co, err = g.CountOnline(ctx, &apipb.CountOnlineRequest{Room: "cls", TagExprs: exprs, TagPrefix: "class:"}); err != nil || co.Sessions != 6 {
			return fmt.Errorf("CountOnline: %v %v, want 6 sessions", co, err)
		}
		return nil
	})
	var got []string
	for _, tc := range co.ExprCounts {
		got = append(got, fmt.Sprintf("%s=%d", tc.TagExpr, tc.Online))
	}
	for _, tc := range co.TagCounts {
		got = append(got, fmt.Sprintf("%s=%d", tc.Tag, tc.Online))
	}
	want := `"class:1" in tags=3 role == "student"=4 uid startsWith "s"=4 "class:9" in tags=0 class:1=3 class:2=2`
	if co.RoomOnline != 6 || co.Sessions != 6 || strings.Join(got, " ") != want {
		t.Fatalf("CountOnline: room_online %d, sessions %d, counts %s; want 6, 6, %s", co.RoomOnline, co.Sessions, strings.Join(got, " "), want)
	}
	q := url.Values{"tag_exprs": {`role in ["assistant", "lecturer"]`, `!("class:2" in tags)`}, "tag_prefix": {"role:"}}
	out := mustHTTP(t, c, 200, "GET", "/v1/rooms/cls/online?"+q.Encode(), "")
	got = nil
	for _, key := range []string{"expr_counts", "tag_counts"} {
		for _, tc := range out[key].([]any) {
			m := tc.(map[string]any)
			got = append(got, fmt.Sprintf("%s%s=%v", m["tag_expr"], m["tag"], m["online"]))
		}
	}
	want = `role in ["assistant", "lecturer"]=2 !("class:2" in tags)=4 role:assistant=1 role:lecturer=1 role:student=4`
	if out["room_online"] != 6.0 || strings.Join(got, " ") != want {
		t.Fatalf("GET /v1/rooms/cls/online: %v; counts %s, want %s", out, strings.Join(got, " "), want)
	}

	// Member lists by expression, across both nodes, a page at a time; with tag, both hold.
	var uids []string
	token := ""
	for page := 0; ; page++ {
		lm, err := g.ListMembers(ctx, &apipb.ListMembersRequest{Room: "cls", TagExpr: `"class:1" in tags`, PageSize: 1, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range lm.Members {
			uids = append(uids, m.Uid)
		}
		if token = lm.NextPageToken; token == "" {
			break
		}
		if page > 6 {
			t.Fatal("member pages do not end")
		}
	}
	if slices.Sort(uids); fmt.Sprint(uids) != "[a1 s1 s3]" {
		t.Fatalf("members with class:1: %v", uids)
	}
	q = url.Values{"tag_expr": {`"class:1" in tags || "class:2" in tags`}, "tag": {"role:student"}}
	out = mustHTTP(t, c, 200, "GET", "/v1/rooms/cls/members?"+q.Encode(), "")
	uids = nil
	for _, m := range out["members"].([]any) {
		uids = append(uids, m.(map[string]any)["uid"].(string))
	}
	if slices.Sort(uids); fmt.Sprint(uids) != "[s1 s2 s3 s4]" {
		t.Fatalf("students of class 1 or 2: %v", uids)
	}

	// A mute by expression stops exactly the members it matches, on both nodes.
	r, err := g.MuteRoom(ctx, &apipb.MuteRoomRequest{Room: "cls", Muted: true, TagExpr: `"class:2" in tags`})
	if err != nil || r.Muted || len(r.TagMutes) != 1 || r.TagMutes[0].TagExpr != `"class:2" in tags` || r.TagMutes[0].UntilMs != 0 {
		t.Fatalf("MuteRoom by tags: %v %v", r, err)
	}
	expectSendRefused(t, s2, clientpb.ErrorCode_ERROR_CODE_FORBIDDEN)
	expectSendRefused(t, s4, clientpb.ErrorCode_ERROR_CODE_FORBIDDEN)
	for _, m := range []*testkit.Client{s1, a1, s3, lec} {
		expectSendAccepted(t, m, s2)
	}
	// The app server is not stopped by it.
	if _, err := g.SendToRoom(ctx, &apipb.SendToRoomRequest{Room: "cls", Body: "from the app", Sender: "s2"}); err != nil {
		t.Fatalf("app send in a room with a tag mute: %v", err)
	}
	// A second mute, for a time, over HTTP; then the first is lifted and only the second holds.
	out = mustHTTP(t, c, 200, "POST", "/v1/rooms/cls/mute", `{"muted":true,"tag_expr":"role == \"lecturer\"","duration_ms":600000}`)
	if mutes := out["tag_mutes"].([]any); len(mutes) != 2 || mutes[1].(map[string]any)["until_ms"].(float64) <= float64(time.Now().UnixMilli()) {
		t.Fatalf("POST mute by tags: %v", out)
	}
	expectSendRefused(t, lec, clientpb.ErrorCode_ERROR_CODE_FORBIDDEN)
	out = mustHTTP(t, c, 200, "POST", "/v1/rooms/cls/mute", `{"muted":false,"tag_expr":"\"class:2\" in tags"}`)
	if mutes := out["tag_mutes"].([]any); len(mutes) != 1 || mutes[0].(map[string]any)["tag_expr"] != `role == "lecturer"` {
		t.Fatalf("lift a mute by tags: %v", out)
	}
	expectSendAccepted(t, s2, s1)
	expectSendAccepted(t, s4, s1)
	expectSendRefused(t, lec, clientpb.ErrorCode_ERROR_CODE_FORBIDDEN)
	if _, err := g.MuteRoom(ctx, &apipb.MuteRoomRequest{Room: "cls", TagExpr: `role == "lecturer"`}); err != nil {
		t.Fatal(err)
	}
	expectSendAccepted(t, lec, s1)

	// A kick by expression closes the matching members on both ChatLinks, and only them.
	k, err := g.Kick(ctx, &apipb.KickRequest{Room: "cls", TagExpr: `"class:1" in tags && role == "student"`, Reason: "class 1 is over"})
	if err != nil || k.Kicked != 2 {
		t.Fatalf("Kick by tags: %v %v, want 2 kicked", k, err)
	}
	s1.ExpectKickAfterPushes(clientpb.CloseCode_CLOSE_CODE_KICKED)
	s3.ExpectKickAfterPushes(clientpb.CloseCode_CLOSE_CODE_KICKED)
	out = mustHTTP(t, c, 200, "POST", "/v1/rooms/cls/kick", `{"tag_expr":"\"class:2\" in tags"}`)
	if out["kicked"] != 2.0 {
		t.Fatalf("POST /v1/rooms/cls/kick: %v, want 2 kicked", out)
	}
	s2.ExpectKickAfterPushes(clientpb.CloseCode_CLOSE_CODE_KICKED)
	s4.ExpectKickAfterPushes(clientpb.CloseCode_CLOSE_CODE_KICKED)
	lm, err := g.ListMembers(ctx, &apipb.ListMembersRequest{Room: "cls"})
	if err != nil || len(lm.Members) != 2 {
		t.Fatalf("members after the kicks: %v %v, want a1 and lec", lm, err)
	}
	expectSendAccepted(t, a1, lec)
	out = mustHTTP(t, c, 200, "POST", "/v1/rooms/cls/kick", `{"tag_expr":"\"class:1\" in tags && role == \"student\""}`)
	if out["kicked"] != 0.0 {
		t.Fatalf("a kick matching no one: %v, want 0 kicked", out)
	}
}

// TestByTagExpressionBadInput checks the answers to bad expressions and misplaced fields of the
// calls by tag expression, over gRPC and HTTP.
func TestByTagExpressionBadInput(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, func(cfg *devcluster.Config) { cfg.ChatLinks, cfg.LeaseInterval = 1, 100*time.Millisecond })
	g := grpcClient(t, c)
	ctx := devCtx()
	if _, err := g.CreateRoom(ctx, &apipb.CreateRoomRequest{Room: "mine"}); err != nil {
		t.Fatal(err)
	}
	member(t, c.Nodes[0].TCPAddr(), "u1", "mine", "class:1")
	const bad = `len(tags) > 0`
	grpcCases := []struct {
		name   string
		call   func() error
		code   codes.Code
		reason string
	}{
		{"kick", func() error { _, err := g.Kick(ctx, &apipb.KickRequest{Room: "mine", TagExpr: bad}); return err }, codes.InvalidArgument, "BAD_TAG_EXPR"},
		{"mute", func() error {
			_, err := g.MuteRoom(ctx, &apipb.MuteRoomRequest{Room: "mine", Muted: true, TagExpr: bad})
			return err
		}, codes.InvalidArgument, "BAD_TAG_EXPR"},
		{"list", func() error {
			_, err := g.ListMembers(ctx, &apipb.ListMembersRequest{Room: "mine", TagExpr: bad})
			return err
		}, codes.InvalidArgument, "BAD_TAG_EXPR"},
		{"count", func() error {
			_, err := g.CountOnline(ctx, &apipb.CountOnlineRequest{Room: "mine", TagExprs: []string{`"a" in tags`, bad}})
			return err
		}, codes.InvalidArgument, "BAD_TAG_EXPR"},
		{"kick by tags without a room", func() error { _, err := g.Kick(ctx, &apipb.KickRequest{TagExpr: `"a" in tags`}); return err }, codes.InvalidArgument, "BAD_REQUEST"},
		{"kick by tags and uid", func() error {
			_, err := g.Kick(ctx, &apipb.KickRequest{Room: "mine", Uid: "u1", TagExpr: `"a" in tags`})
			return err
		}, codes.InvalidArgument, "BAD_REQUEST"},
		{"kick by tags in an unknown room", func() error {
			_, err := g.Kick(ctx, &apipb.KickRequest{Room: "nosuch", TagExpr: `"a" in tags`})
			return err
		}, codes.NotFound, "ROOM_NOT_FOUND"},
		{"mute by tags in an unknown room", func() error {
			_, err := g.MuteRoom(ctx, &apipb.MuteRoomRequest{Room: "nosuch", Muted: true, TagExpr: `"a" in tags`})
			return err
		}, codes.NotFound, "ROOM_NOT_FOUND"},
		{"mute past ten years", func() error {
			_, err := g.MuteRoom(ctx, &apipb.MuteRoomRequest{Room: "mine", Muted: true, TagExpr: `"a" in tags`, DurationMs: math.MaxInt64})
			return err
		}, codes.InvalidArgument, "BAD_REQUEST"},
		{"negative mute duration", func() error {
			_, err := g.MuteRoom(ctx, &apipb.MuteRoomRequest{Room: "mine", Muted: true, TagExpr: `"a" in tags`, DurationMs: -1})
			return err
		}, codes.InvalidArgument, "BAD_REQUEST"},
		{"room mute with a duration", func() error {
			_, err := g.MuteRoom(ctx, &apipb.MuteRoomRequest{Room: "mine", Muted: true, DurationMs: 1000})
			return err
		}, codes.InvalidArgument, "BAD_REQUEST"},
		{"count by tags without a room", func() error {
			_, err := g.CountOnline(ctx, &apipb.CountOnlineRequest{TagPrefix: "class:"})
			return err
		}, codes.InvalidArgument, "BAD_REQUEST"},
		{"bad tag prefix", func() error {
			_, err := g.CountOnline(ctx, &apipb.CountOnlineRequest{Room: "mine", TagPrefix: "a b"})
			return err
		}, codes.InvalidArgument, "BAD_REQUEST"},
		{"too many expressions", func() error {
			_, err := g.CountOnline(ctx, &apipb.CountOnlineRequest{Room: "mine", TagExprs: slices.Repeat([]string{`"a" in tags`}, 33)})
			return err
		}, codes.InvalidArgument, "BAD_REQUEST"},
		{"count in an unknown room", func() error {
			_, err := g.CountOnline(ctx, &apipb.CountOnlineRequest{Room: "nosuch", TagPrefix: "class:"})
			return err
		}, codes.NotFound, "ROOM_NOT_FOUND"},
	}
	for _, tc := range grpcCases {
		t.Run("grpc "+tc.name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != tc.code || grpcErrorCode(err) != tc.reason {
				t.Fatalf("got %v (reason %q), want %v with reason %q", err, grpcErrorCode(err), tc.code, tc.reason)
			}
		})
	}
	badQ := url.QueryEscape(bad)
	httpCases := []struct {
		name, method, path, body string
		status                   int
		code                     float64
	}{
		{"kick", "POST", "/v1/rooms/mine/kick", `{"tag_expr":"len(tags) > 0"}`, 400, 104},
		{"mute", "POST", "/v1/rooms/mine/mute", `{"muted":true,"tag_expr":"tags[0] == \"a\""}`, 400, 104},
		{"list", "GET", "/v1/rooms/mine/members?tag_expr=" + badQ, "", 400, 104},
		{"count", "GET", "/v1/rooms/mine/online?tag_exprs=" + badQ, "", 400, 104},
		{"kick by tags on a user's route", "POST", "/v1/users/u1/kick", `{"room":"mine","tag_expr":"\"a\" in tags"}`, 400, 100},
		{"count by tags without a room", "GET", "/v1/online?tag_prefix=class:", "", 400, 100},
	}
	for _, tc := range httpCases {
		t.Run("http "+tc.name, func(t *testing.T) {
			status, out := httpCall(t, c, tc.method, tc.path, devcluster.APIKey, tc.body)
			if status != tc.status || out["code"] != tc.code || out["error"] == "" {
				t.Fatalf("HTTP %d %v, want %d with code %v", status, out, tc.status, tc.code)
			}
		})
	}
	// A room holds at most 16 tag mutes; muting one of them again only renews it.
	for i := range 16 {
		mustHTTP(t, c, 200, "POST", "/v1/rooms/mine/mute", fmt.Sprintf(`{"muted":true,"tag_expr":"\"t:%d\" in tags"}`, i))
	}
	out := mustHTTP(t, c, 200, "POST", "/v1/rooms/mine/mute", `{"muted":true,"tag_expr":"\"t:3\" in tags","duration_ms":1000}`)
	if n := len(out["tag_mutes"].([]any)); n != 16 {
		t.Fatalf("muting an expression again: %d mutes, want 16", n)
	}
	mustHTTP(t, c, 400, "POST", "/v1/rooms/mine/mute", `{"muted":true,"tag_expr":"\"t:16\" in tags"}`)
	// A room closed and created again starts without them.
	mustHTTP(t, c, 200, "POST", "/v1/rooms/mine/close", "")
	out = mustHTTP(t, c, 201, "POST", "/v1/rooms", `{"room":"mine"}`)
	if n := len(out["room"].(map[string]any)["tag_mutes"].([]any)); n != 0 {
		t.Fatalf("a reopened room has %d tag mutes: %v", n, out)
	}

	// Counts per tag are refused, not cut short, when more than 1000 distinct tags have the
	// prefix: 32 members with 32 tags each.
	for i := range 32 {
		tags := make([]string, 32)
		for j := range tags {
			tags[j] = fmt.Sprintf("g:%d-%d", i, j)
		}
		member(t, c.Nodes[0].TCPAddr(), fmt.Sprintf("m%d", i), "wide", tags...)
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if r, err := g.GetRoom(ctx, &apipb.GetRoomRequest{Room: "wide"}); err != nil || r.Online != 32 {
			return fmt.Errorf("GetRoom: %v %v, want 32 members", r, err)
		}
		return nil
	})
	status, out := httpCall(t, c, "GET", "/v1/rooms/wide/online?tag_prefix=g:", devcluster.APIKey, "")
	if status != 400 || !strings.Contains(out["error"].(string), "longer tag_prefix") {
		t.Fatalf("1024 distinct tags counted: HTTP %d %v, want 400 asking for a longer prefix", status, out)
	}
	out = mustHTTP(t, c, 200, "GET", "/v1/rooms/wide/online?tag_prefix=g:7-", "")
	if n := len(out["tag_counts"].([]any)); n != 32 || out["room_online"] != 32.0 {
		t.Fatalf("tags starting with g:7-: %d counted, %v; want 32", n, out)
	}
}

// TestKickByTagsReachesUnreportedNodes: a kick by expression reaches a node that holds members of
// the room the room service does not know of yet (the node has not reported since they came).
func TestKickByTagsReachesUnreportedNodes(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, func(cfg *devcluster.Config) { cfg.ChatLinks, cfg.LeaseInterval = 1, time.Minute })
	g := grpcClient(t, c)
	ctx := devCtx()
	if _, err := g.CreateRoom(ctx, &apipb.CreateRoomRequest{Room: "new"}); err != nil {
		t.Fatal(err)
	}
	bad, _ := member(t, c.Nodes[0].TCPAddr(), "bad", "new", "troll")
	good, _ := member(t, c.Nodes[0].TCPAddr(), "good", "new")
	if r, err := g.GetRoom(ctx, &apipb.GetRoomRequest{Room: "new"}); err != nil || len(r.Nodes) != 0 {
		t.Fatalf("GetRoom: %v %v; the test needs a room its node has not reported yet", r, err)
	}
	if k, err := g.Kick(ctx, &apipb.KickRequest{Room: "new", TagExpr: `"troll" in tags`}); err != nil || k.Kicked != 0 {
		t.Fatalf("Kick by tags: %v %v, want 0 counted (the node is not known to hold the room)", k, err)
	}
	bad.ExpectKick(clientpb.CloseCode_CLOSE_CODE_KICKED)
	good.ExpectSilence(100 * time.Millisecond)
}
