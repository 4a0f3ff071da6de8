package api

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"roomcast/internal/auth"
	"roomcast/proto/apipb"
)

// serviceCalls returns every RPC of roomcast.v1.RoomcastAPI, from its descriptor: a call added to
// proto/api.proto is walked by the tests below without changing them.
func serviceCalls(t *testing.T) []protoreflect.MethodDescriptor {
	t.Helper()
	sd := apipb.File_api_proto.Services().ByName("RoomcastAPI")
	if sd == nil {
		t.Fatal("no RoomcastAPI service in proto/api.proto")
	}
	var calls []protoreflect.MethodDescriptor
	for i := range sd.Methods().Len() {
		calls = append(calls, sd.Methods().Get(i))
	}
	return calls
}

// TestEveryCallHasAScope checks that callScopes names every call of the service and nothing
// else, and that every HTTP route runs a call of the service.
func TestEveryCallHasAScope(t *testing.T) {
	t.Parallel()
	names := map[string]bool{}
	for _, m := range serviceCalls(t) {
		name := string(m.Name())
		names[name] = true
		if _, ok := callScopes[name]; !ok {
			t.Errorf("%s has no scope in callScopes (api/scopes.go)", name)
		}
	}
	for name, scope := range callScopes {
		if !names[name] {
			t.Errorf("callScopes names %s, which is not a call of the service", name)
		}
		if CheckScopes([]string{scope}) != nil {
			t.Errorf("%s: scope %q is not one of %v", name, scope, Scopes)
		}
	}
	for _, r := range (&API{}).routes() {
		if !names[r.rpc] {
			t.Errorf("route %s %s runs %q, which is not a call of the service", r.method, r.pattern, r.rpc)
		}
	}
}

// TestScopes calls every call of the service over gRPC and HTTP with a key that has every scope
// but the call's: each is refused with FORBIDDEN naming the scope, before it reaches its handler
// (the API here has no bus: a call that got through would fail otherwise). A key that has the
// scope gets past the check (and, here, on to a handler that fails for want of a bus).
func TestScopes(t *testing.T) {
	t.Parallel()
	keys := auth.APIKeys{}
	for _, s := range Scopes {
		var others []string
		for _, o := range Scopes {
			if o != s {
				others = append(others, o)
			}
		}
		keys["without-"+s] = auth.APIKey{App: "app", Scopes: others}
		keys["only-"+s] = auth.APIKey{App: "app", Scopes: []string{s}}
	}
	a := bareAPI(keys)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(a.authenticate), grpc.StreamInterceptor(a.authenticateStream))
	apipb.RegisterRoomcastAPIServer(srv, a)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	for _, m := range serviceCalls(t) {
		scope := callScopes[string(m.Name())]
		method := "/" + string(m.Parent().FullName()) + "/" + string(m.Name())
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer without-"+scope)
		var err error
		if m.IsStreamingClient() { // SendStream: the key is checked as the stream opens
			var st grpc.ClientStream
			st, err = conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: m.IsStreamingServer()}, method)
			if err == nil {
				_ = st.CloseSend() // a stream let through ends with nothing sent: EOF
				err = st.RecvMsg(dynamicpb.NewMessage(m.Output()))
			}
		} else {
			err = conn.Invoke(ctx, method, dynamicpb.NewMessage(m.Input()), dynamicpb.NewMessage(m.Output()))
		}
		if status.Code(err) != codes.PermissionDenied || errorInfo(err)["scope"] != scope || !strings.Contains(status.Convert(err).Message(), `"`+scope+`"`) {
			t.Errorf("gRPC %s without scope %s: %v (metadata %v), want PermissionDenied naming the scope", m.Name(), scope, err, errorInfo(err))
		}
		if _, err := a.authorize("Bearer only-"+scope, string(m.Name())); err != nil {
			t.Errorf("%s with only scope %s: %v", m.Name(), scope, err)
		}
	}

	mux := http.NewServeMux()
	a.Register(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	for _, r := range a.routes() {
		scope := callScopes[r.rpc]
		path := strings.NewReplacer("{room}", "r", "{uid}", "u", "{key}", "k").Replace(r.pattern)
		req, err := http.NewRequest(r.method, hs.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer without-"+scope)
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body ErrorBody
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || err != nil || body.Code != 103 || !strings.Contains(body.Error, `"`+scope+`"`) {
			t.Errorf("%s %s without scope %s: HTTP %d %+v %v, want 403 FORBIDDEN naming the scope", r.method, path, scope, resp.StatusCode, body, err)
		}
	}
	if _, err := a.authorize("Bearer only-read", "NoSuchCall"); status.Code(err) != codes.Internal {
		t.Errorf("a call without a scope: %v, want it refused (Internal)", err)
	}
}

// errorInfo returns the metadata of a gRPC error's ErrorInfo.
func errorInfo(err error) map[string]string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.Metadata
		}
	}
	return nil
}
