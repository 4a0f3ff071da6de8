package api_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"roomcast/internal/auth"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// Isolation between apps. The victim is the dev app ("demo"); the attacker, app "mallory", holds a
// valid API key and token secret of its own and aims every server API call and every client
// frame at the victim's names: the same room ("stage"), the same uid ("bob"), and the victim's
// session id, message ids, history cursor, inbox ids and queue keys, which it has learnt somehow.
// Each attempt is either refused or acts on the attacker's own namesakes; the victim's state, read
// with the victim's key before and after, is unchanged, the victim's member receives nothing of
// the attacker's and is not kicked, muted or banned, and no answer to the attacker carries
// anything of the victim's (every victim datum holds the marker "victim-").

const (
	attackerApp    = "mallory"
	attackerKey    = "mallory-key"
	attackerSecret = "mallory-secret-0123456789"
	victimMarker   = "victim-"
	victimTag      = "vip"     // a name the attacker knows, not the victim's data
	victimKey      = "entry-1" // the victim's queue entry's key, known to the attacker
)

// victim is what the victim app has, and what the attacker has learnt of it.
type victim struct {
	c        *devcluster.Cluster
	api      apipb.RoomcastAPIClient
	bob      *testkit.Client // the victim's member "bob" in "stage"
	session  string          // bob's session id
	msgID    string          // a message of stage's history
	cursor   string          // a history cursor of stage
	inboxIDs []string        // bob's stored at-least-once messages
}

// startVictim starts a cluster whose ChatLinks and API know both apps, and gives the victim a
// room with a name, history, a queue entry, a member with tags and a stored message.
func startVictim(t *testing.T) *victim {
	t.Helper()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.LeaseInterval = 100 * time.Millisecond
		cfg.API.Keys = auth.APIKeys{devcluster.APIKey: {App: devcluster.App}, attackerKey: {App: attackerApp}}
		cfg.ChatLink.Keys = auth.Keyring{devcluster.App: []byte(devcluster.Secret), attackerApp: []byte(attackerSecret)}
	})
	v := &victim{c: c, api: grpcClient(t, c)}
	ctx := devCtx()
	if _, err := v.api.CreateRoom(ctx, &apipb.CreateRoomRequest{Room: "stage", Name: victimMarker + "name"}); err != nil {
		t.Fatal(err)
	}
	cl := testkit.DialTCP(t, c.Nodes[0].TCPAddr())
	cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: testcluster.Token(t, "bob", "stage", victimTag), Device: victimMarker + "device", Inbox: true}}})
	ack := cl.Next().GetLoginAck()
	if ack == nil {
		t.Fatal("bob: no LoginAck")
	}
	v.bob, v.session = cl, ack.SessionId
	testcluster.WaitOnline(t, c, "bob")
	if _, err := v.api.SendToRoom(ctx, &apipb.SendToRoomRequest{Room: "stage", Body: victimMarker + "history", Lane: "critical"}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.api.SendToUsers(ctx, &apipb.SendToUsersRequest{Uids: []string{"bob"}, Body: victimMarker + "inbox", AtLeastOnce: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.api.SetMemberTags(ctx, &apipb.SetMemberTagsRequest{Uid: "bob", Tags: []string{victimTag, victimMarker + "stored-tag"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.api.OfferQueue(ctx, &roompb.QueueRequest{Room: "stage", Key: victimKey, Value: []byte(victimMarker + "value"), Uid: "bob"}); err != nil {
		t.Fatal(err)
	}
	cl.CollectPushes(2) // the room's message and his own
	page, err := v.api.GetHistory(ctx, &apipb.GetHistoryRequest{Room: "stage", Limit: 1})
	if err != nil || len(page.Messages) != 1 {
		t.Fatalf("victim's history: %v %v", page, err)
	}
	v.msgID, v.cursor = page.Messages[0].Id, page.NextCursor
	if v.cursor == "" {
		// One message kept: any cursor the victim could be given reads the same way.
		v.cursor = page.Messages[0].Id
	}
	// The room's counts come from the node's reports: wait for them before reading the state.
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		room, err := v.api.GetRoom(ctx, &apipb.GetRoomRequest{Room: "stage"})
		if err != nil {
			return err
		}
		members, err := v.api.ListMembers(ctx, &apipb.ListMembersRequest{Room: "stage"})
		if err != nil {
			return err
		}
		online, err := v.api.CountOnline(ctx, &apipb.CountOnlineRequest{Room: "stage", TagExprs: []string{`"` + victimTag + `" in tags`}})
		if err != nil {
			return err
		}
		if room.Online != 1 || len(members.Members) != 1 || online.RoomOnline != 1 || online.ExprCounts[0].Online != 1 {
			return fmt.Errorf("bob not counted yet: %v, %v, %v", room, members, online)
		}
		return nil
	})
	v.inboxIDs = testcluster.Stored(t, c, "bob")
	if len(v.inboxIDs) != 1 {
		t.Fatalf("bob's stored messages: %v, want one", v.inboxIDs)
	}
	return v
}

// state reads everything of the victim's the API and the inbox show, as text.
func (v *victim) state(t *testing.T) string {
	t.Helper()
	ctx := devCtx()
	var b strings.Builder
	add := func(what string, m proto.Message, err error) {
		if err != nil {
			t.Fatalf("victim's %s: %v", what, err)
		}
		fmt.Fprintf(&b, "%s: %s\n", what, protojson.Format(m))
	}
	room, err := v.api.GetRoom(ctx, &apipb.GetRoomRequest{Room: "stage"})
	add("room", room, err)
	members, err := v.api.ListMembers(ctx, &apipb.ListMembersRequest{Room: "stage"})
	add("members", members, err)
	history, err := v.api.GetHistory(ctx, &apipb.GetHistoryRequest{Room: "stage"})
	add("history", history, err)
	queue, err := v.api.ListQueue(ctx, &roompb.QueueRequest{Room: "stage"})
	add("queue", queue, err)
	sessions, err := v.api.GetUserSessions(ctx, &apipb.GetUserSessionsRequest{Uid: "bob"})
	add("sessions", sessions, err)
	tags, err := v.api.GetMemberTags(ctx, &apipb.GetMemberTagsRequest{Uid: "bob"})
	add("tags", tags, err)
	cdn, err := v.api.GetRoomCdn(ctx, &apipb.GetRoomCdnRequest{Room: "stage"})
	add("room cdn", cdn, err)
	policy, err := v.api.GetCdnPolicy(ctx, &apipb.GetCdnPolicyRequest{})
	add("cdn policy", policy, err)
	limits, err := v.api.GetAppLimits(ctx, &apipb.GetAppLimitsRequest{})
	add("app limits", limits, err)
	counters, err := v.api.GetCounters(ctx, &apipb.GetCountersRequest{Room: "stage"})
	add("counters", counters, err)
	online, err := v.api.CountOnline(ctx, &apipb.CountOnlineRequest{Room: "stage", TagExprs: []string{`"` + victimTag + `" in tags`}})
	add("online", online, err)
	fmt.Fprintf(&b, "inbox: %v\n", testcluster.Stored(t, v.c, "bob"))
	return b.String()
}

// checkBob fails unless bob received nothing of the attacker's and is still in his room,
// receiving and allowed to send.
func (v *victim) checkBob(t *testing.T) {
	t.Helper()
	if _, err := v.api.SendToRoom(devCtx(), &apipb.SendToRoomRequest{Room: "stage", Body: "after"}); err != nil {
		t.Fatal(err)
	}
	for {
		f := v.bob.Next()
		if strings.Contains(f.String(), attackerApp) || f.GetKick() != nil {
			t.Fatalf("bob received %v", f)
		}
		if p := f.GetPush(); p != nil && slices.ContainsFunc(p.Messages, func(m *clientpb.Message) bool { return string(m.Body) == "after" }) {
			break
		}
	}
	v.bob.Send(&clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{Seq: 99, Body: []byte("bob after")}}})
	for {
		f := v.bob.Next()
		if f.GetSendAck().GetSeq() == 99 {
			return
		}
		if f.GetError() != nil || f.GetKick() != nil || strings.Contains(f.String(), attackerApp) {
			t.Fatalf("bob's send after the attack: %v", f)
		}
	}
}

// TestIsolationAPI calls every call of the server API (walked from the service's descriptor, so
// a call added later is walked too) with the attacker's key and the victim's names and ids,
// once as it is and once with a tag expression matching the victim's member where the request
// takes one.
func TestIsolationAPI(t *testing.T) {
	t.Parallel()
	v := startVictim(t)
	before := v.state(t)
	if again := v.state(t); again != before {
		t.Fatalf("the victim's state changes by itself:\n%s\nthen\n%s", before, again)
	}
	if !strings.Contains(before, victimMarker) || !strings.Contains(before, v.session) {
		t.Fatalf("the victim's state shows no %q: the check below could not see a leak:\n%s", victimMarker, before)
	}

	conn, err := grpc.NewClient(v.c.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	sd := apipb.File_api_proto.Services().ByName("RoomcastAPI")
	var calls []protoreflect.MethodDescriptor
	for i := range sd.Methods().Len() {
		calls = append(calls, sd.Methods().Get(i))
	}
	// Closing the attacker's namesake room first would leave the calls after it refused for
	// that alone.
	slices.SortStableFunc(calls, func(a, b protoreflect.MethodDescriptor) int {
		return cmpBool(strings.HasPrefix(string(a.Name()), "Close"), strings.HasPrefix(string(b.Name()), "Close"))
	})
	refused := 0
	for _, m := range calls {
		for _, optional := range append([]protoreflect.Name{""}, anchors...) {
			if optional != "" && !hasField(m.Input(), optional) {
				continue
			}
			req := newMessage(t, m.Input())
			v.aimAt(req.ProtoReflect(), optional, 0)
			resp := newMessage(t, m.Output())
			err := conn.Invoke(withKey(attackerKey), "/"+string(sd.FullName())+"/"+string(m.Name()), req, resp)
			if err != nil {
				if status.Code(err) == codes.InvalidArgument {
					t.Errorf("%s %v: %v: aimAt must make a request the call accepts as well-formed", m.Name(), protojson.Format(req), err)
				}
				refused++
				t.Logf("%s %v: refused: %v", m.Name(), protojson.Format(req), err)
				continue
			}
			text := protojson.Format(resp)
			if raw := rawText(resp.ProtoReflect()); strings.Contains(raw, victimMarker) || strings.Contains(raw, v.msgID) {
				t.Errorf("%s %v answered the attacker with the victim's data: %s", m.Name(), protojson.Format(req), text)
			}
			if co, ok := resp.(*apipb.CountOnlineResponse); ok && (co.Sessions != 0 || co.Users != 0) {
				t.Errorf("%s %v counted the victim's members for the attacker: %s", m.Name(), protojson.Format(req), text)
			}
			t.Logf("%s %v: acted on the attacker's own: %s", m.Name(), protojson.Format(req), text)
		}
	}
	if refused == 0 {
		t.Error("no call was refused: the attacker's room names cannot all exist")
	}
	if after := v.state(t); after != before {
		t.Errorf("the victim's state changed:\n%s\nthen\n%s", before, after)
	}
	v.checkBob(t)
}

// aimAt fills a request's fields, by name, with the victim's names and ids; a repeated message
// field gets one element, filled the same way. Fields it does not know keep their zero value.
// anchors are fields a request takes at most one of (or that change what it asks): aimAt sets
// one of them, or none, per request.
var anchors = []protoreflect.Name{"tag_expr", "before_id", "after_id", "cursor"}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

func (v *victim) aimAt(m protoreflect.Message, optional protoreflect.Name, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		name := string(fd.Name())
		if v.leaveOut(m.Descriptor(), fd.Name(), optional) {
			continue
		}
		switch {
		case fd.IsList() && fd.Kind() == protoreflect.MessageKind:
			if depth < 2 {
				el := m.Mutable(fd).List().AppendMutable()
				v.aimAt(el.Message(), optional, depth+1)
			}
		case fd.IsList() && fd.Kind() == protoreflect.StringKind:
			var vals []string
			switch name {
			case "uids":
				vals = []string{"bob"}
			case "tags":
				vals = []string{"mallory-tag"}
			case "tag_exprs":
				vals = []string{`"` + victimTag + `" in tags`}
			case "ids", "message_ids":
				vals = v.inboxIDs
			}
			for _, s := range vals {
				m.Mutable(fd).List().Append(protoreflect.ValueOfString(s))
			}
		case fd.Kind() == protoreflect.StringKind && !fd.IsList() && !fd.IsMap():
			if s := v.stringFor(name); s != "" {
				m.Set(fd, protoreflect.ValueOfString(s))
			}
		case fd.Kind() == protoreflect.BytesKind && !fd.IsList() && name == "value":
			m.Set(fd, protoreflect.ValueOfBytes([]byte("mallory-body")))
		case fd.Kind() == protoreflect.BoolKind && (name == "muted" || name == "at_least_once" || name == "as_member"):
			m.Set(fd, protoreflect.ValueOfBool(true))
		case (fd.Kind() == protoreflect.Int64Kind || fd.Kind() == protoreflect.Int32Kind) && name == "duration_ms":
			m.Set(fd, protoreflect.ValueOf(int64OrInt32(fd.Kind(), 60_000)))
		case fd.Kind() == protoreflect.Int32Kind && name == "spread_ms":
			m.Set(fd, protoreflect.ValueOfInt32(-1)) // a notice at once, which checkBob would see
		case fd.Kind() == protoreflect.Uint32Kind && name == "weight":
			m.Set(fd, protoreflect.ValueOfUint32(1))
		case fd.Kind() == protoreflect.EnumKind && !fd.IsList() && fd.Enum().Values().Len() > 1:
			m.Set(fd, protoreflect.ValueOfEnum(fd.Enum().Values().Get(1).Number()))
		}
	}
}

// rawText is every string and bytes field of m, nested ones too, as they are (protojson shows
// bytes in base64, where a marker would not show).
func rawText(m protoreflect.Message) string {
	var b strings.Builder
	var walk func(protoreflect.Message)
	add := func(fd protoreflect.FieldDescriptor, v protoreflect.Value) {
		switch fd.Kind() {
		case protoreflect.StringKind:
			b.WriteString(v.String() + "\n")
		case protoreflect.BytesKind:
			b.Write(v.Bytes())
			b.WriteByte('\n')
		case protoreflect.MessageKind, protoreflect.GroupKind:
			walk(v.Message())
		}
	}
	walk = func(m protoreflect.Message) {
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList():
				for i := range v.List().Len() {
					add(fd, v.List().Get(i))
				}
			case fd.IsMap():
				v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					b.WriteString(k.String() + "\n")
					add(fd.MapValue(), mv)
					return true
				})
			default:
				add(fd, v)
			}
			return true
		})
	}
	walk(m)
	return b.String()
}

// leaveOut says which fields a request of md leaves unset when it sets optional, by the calls'
// rules (docs/api.md): the anchors not chosen; a uid or session beside a tag expression (which
// names the members instead); a duration on a call taking a tag expression without one (only
// mutes by tag expression expire).
func (v *victim) leaveOut(md protoreflect.MessageDescriptor, name, optional protoreflect.Name) bool {
	switch {
	case slices.Contains(anchors, name):
		return name != optional
	case name == "uid" || name == "session_id":
		return optional == "tag_expr"
	case name == "duration_ms":
		return hasField(md, "tag_expr") && optional != "tag_expr"
	}
	return false
}

func int64OrInt32(k protoreflect.Kind, n int64) any {
	if k == protoreflect.Int32Kind {
		return int32(n)
	}
	return n
}

// stringFor is the value aimAt gives a string field of that name.
func (v *victim) stringFor(name string) string {
	switch name {
	case "room":
		return "stage"
	case "uid":
		return "bob"
	case "session_id":
		return v.session
	case "key":
		return victimKey
	case "before_id", "after_id", "message_id":
		return v.msgID
	case "cursor":
		return v.cursor
	case "tag":
		return victimTag
	case "tag_prefix":
		return "vi"
	case "tag_expr":
		return `"` + victimTag + `" in tags`
	case "body":
		return "mallory-body"
	case "type", "reason", "name":
		return "mallory"
	case "url_template":
		return "https://cdn.mallory.example/rc/{app}/{room}/{window_ms}/{index}"
	}
	return ""
}

func hasField(md protoreflect.MessageDescriptor, name protoreflect.Name) bool {
	return md.Fields().ByName(name) != nil
}

// newMessage returns a new message of the generated type md names.
func newMessage(t *testing.T, md protoreflect.MessageDescriptor) proto.Message {
	t.Helper()
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
	if err != nil {
		t.Fatal(err)
	}
	return mt.New().Interface()
}

// TestIsolationFrames sends every kind of client frame (walked from Frame's oneof, so a kind
// added later is walked too) from the attacker's member, logged in as the attacker's "bob" in its
// own "stage", aimed at the victim's messages, history, inbox and queue; and a login with a
// token naming the victim's app, signed with the attacker's secret. Kinds only the server sends
// close the connection (4003 BAD_FRAME).
func TestIsolationFrames(t *testing.T) {
	t.Parallel()
	v := startVictim(t)
	before := v.state(t)
	addr := v.c.Nodes[0].TCPAddr()
	attackerToken := func(t *testing.T, app, uid, room string) string {
		t.Helper()
		tok, err := auth.Mint([]byte(attackerSecret), app, uid, room, []string{victimTag}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	login := func(t *testing.T) *testkit.Client {
		t.Helper()
		cl := testkit.DialTCP(t, addr)
		cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: attackerToken(t, attackerApp, "bob", "stage"), Inbox: true, History: 100}}})
		for {
			f := cl.Next()
			v.checkAnswer(t, "login", f)
			if ack := f.GetLoginAck(); ack != nil && ack.App != attackerApp {
				t.Fatalf("the attacker's token logged into %v", ack)
			} else if f.GetPush().GetRecovery() != nil {
				return cl // the history asked for has come: the victim's is not in it
			}
		}
	}

	// What each kind a client sends carries: the victim's ids, keys and names.
	var queueOps []*clientpb.Frame
	ops := clientpb.QueueOp(0).Descriptor().Values()
	for i := range ops.Len() {
		op := ops.Get(i)
		queueOps = append(queueOps, &clientpb.Frame{Kind: &clientpb.Frame_QueueRequest{QueueRequest: &clientpb.RoomQueueRequest{
			Seq: uint64(op.Number()) + 100, Op: clientpb.QueueOp(op.Number()), Key: victimKey, Value: []byte("mallory-body")}}})
	}
	clientFrames := map[protoreflect.Name][]*clientpb.Frame{
		"send":      {{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{Seq: 1, Body: []byte("mallory-body"), TagExpr: `"` + victimTag + `" in tags`}}}},
		"heartbeat": {{Kind: &clientpb.Frame_Heartbeat{Heartbeat: &clientpb.Heartbeat{}}}},
		"history_query": {
			{Kind: &clientpb.Frame_HistoryQuery{HistoryQuery: &clientpb.HistoryQuery{Seq: 2}}},
			{Kind: &clientpb.Frame_HistoryQuery{HistoryQuery: &clientpb.HistoryQuery{Seq: 3, BeforeId: v.msgID}}},
			{Kind: &clientpb.Frame_HistoryQuery{HistoryQuery: &clientpb.HistoryQuery{Seq: 4, AfterId: "00000000000000000000000000"}}},
			{Kind: &clientpb.Frame_HistoryQuery{HistoryQuery: &clientpb.HistoryQuery{Seq: 5, Cursor: v.cursor}}},
		},
		"ack": {{Kind: &clientpb.Frame_Ack{Ack: &clientpb.Ack{Ids: v.inboxIDs}}}},
		// The victim's message, recalled from the attacker's room of the same name.
		"recall_request": {{Kind: &clientpb.Frame_RecallRequest{RecallRequest: &clientpb.RecallRequest{Seq: 8, MessageId: v.msgID}}}},
		"queue_request":  queueOps,
		// A moderator's acts on the victim's member (the attacker's room names no moderators:
		// refused, and the victim's bob stays unmuted and logged in, checkBob).
		"moderate_request": {
			{Kind: &clientpb.Frame_ModerateRequest{ModerateRequest: &clientpb.ModerateRequest{Seq: 9, Op: clientpb.ModerateOp_MODERATE_OP_MUTE, Uid: "carol"}}},
			{Kind: &clientpb.Frame_ModerateRequest{ModerateRequest: &clientpb.ModerateRequest{Seq: 10, Op: clientpb.ModerateOp_MODERATE_OP_REMOVE, Uid: "bob"}}},
		},
		// An attribute of the room of the same name: refused, the victim's attributes unchanged.
		"set_attribute": {{Kind: &clientpb.Frame_SetAttribute{SetAttribute: &clientpb.SetAttribute{Seq: 11, Key: "pinned", Value: "mallory-body"}}}},
		// A counted add gets no answer (its room's totals may come); a refused one an Error.
		"counter_add": {
			{Kind: &clientpb.Frame_CounterAdd{CounterAdd: &clientpb.CounterAdd{Name: "like", Amount: 3}}},
			{Kind: &clientpb.Frame_CounterAdd{CounterAdd: &clientpb.CounterAdd{Seq: 6, Name: "no spaces"}}},
			{Kind: &clientpb.Frame_CounterAdd{CounterAdd: &clientpb.CounterAdd{Seq: 7, Name: "like", Amount: 1000}}},
		},
	}

	kinds := (&clientpb.Frame{}).ProtoReflect().Descriptor().Oneofs().ByName("kind").Fields()
	for i := range kinds.Len() {
		kind := kinds.Get(i)
		t.Run(string(kind.Name()), func(t *testing.T) {
			switch frames, ok := clientFrames[kind.Name()]; {
			case kind.Name() == "login":
				// A token naming the victim's app, signed with the attacker's secret.
				cl := testkit.DialTCP(t, addr)
				f := cl.LoginAs(attackerToken(t, devcluster.App, "bob", "stage"), "web")
				if f.GetKick().GetCode() != uint32(clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN) {
					t.Fatalf("a token for the victim's app signed with the attacker's secret: %v, want a kick 4001", f)
				}
				// A second Login on the attacker's session.
				cl = login(t)
				cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: attackerToken(t, devcluster.App, "bob", "stage")}}})
				for f, ok := cl.Frames(), true; ok; {
					var fr *clientpb.Frame
					select {
					case fr, ok = <-f:
					case <-cl.Done():
						ok = false
					}
					if fr != nil && fr.GetLoginAck() != nil {
						t.Fatalf("a second login was answered %v", fr)
					}
				}
			case ok:
				cl := login(t)
				for _, f := range frames {
					cl.Send(f)
					if seq, ok := seqOf(f); ok && seq != 0 {
						v.until(t, cl, string(kind.Name()), func(a *clientpb.Frame) bool { s, ok := seqOf(a); return ok && s == seq })
					}
					v.untilHeartbeatAck(t, cl, string(kind.Name()))
				}
			default:
				cl := login(t)
				f := &clientpb.Frame{}
				m := f.ProtoReflect()
				m.Set(kind, m.NewField(kind))
				cl.Send(f)
				for {
					fr := cl.Next()
					v.checkAnswer(t, string(kind.Name()), fr)
					if fr.GetKick() != nil {
						if fr.GetKick().Code != uint32(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME) {
							t.Fatalf("a %s frame from a client: %v, want a kick 4003 (a kind a client sends needs its frames in clientFrames)", kind.Name(), fr)
						}
						return
					}
				}
			}
		})
	}
	if after := v.state(t); after != before {
		t.Errorf("the victim's state changed:\n%s\nthen\n%s", before, after)
	}
	v.checkBob(t)
}

// untilHeartbeatAck sends a Heartbeat and checks every answer up to its HeartbeatAck.
func (v *victim) untilHeartbeatAck(t *testing.T, cl *testkit.Client, what string) {
	t.Helper()
	cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Heartbeat{Heartbeat: &clientpb.Heartbeat{ClientTimeMs: 42}}})
	v.until(t, cl, what, func(f *clientpb.Frame) bool { return f.GetHeartbeatAck().GetClientTimeMs() == 42 })
}

// until checks every frame the attacker receives up to the one last says is the last.
func (v *victim) until(t *testing.T, cl *testkit.Client, what string, last func(*clientpb.Frame) bool) {
	t.Helper()
	for {
		f := cl.Next()
		v.checkAnswer(t, what, f)
		if last(f) {
			return
		}
		t.Logf("%s: %v", what, f)
	}
}

// seqOf returns the seq of a frame whose kind has one (a request, or the answer to one).
func seqOf(f *clientpb.Frame) (uint64, bool) {
	m := f.ProtoReflect()
	kind := m.WhichOneof(m.Descriptor().Oneofs().ByName("kind"))
	if kind == nil || kind.Message() == nil {
		return 0, false
	}
	inner := m.Get(kind).Message()
	if seq := inner.Descriptor().Fields().ByName("seq"); seq != nil {
		return inner.Get(seq).Uint(), true
	}
	return 0, false
}

// checkAnswer fails if a frame to the attacker carries the victim's data.
func (v *victim) checkAnswer(t *testing.T, what string, f *clientpb.Frame) {
	t.Helper()
	if raw := rawText(f.ProtoReflect()); strings.Contains(raw, victimMarker) || strings.Contains(raw, v.msgID) || strings.Contains(raw, v.session) {
		t.Errorf("%s: the attacker received the victim's data: %v", what, f)
	}
}
