package api

import (
	"context"
	"reflect"
	"runtime"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"roomcast/internal/bus"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

// The API key check: a call's "Authorization: Bearer KEY" (an HTTP header, or gRPC metadata)
// names the app the call acts for, which the call's context then carries, and must grant the
// scope the call needs (scopes.go).

type appKey struct{}

// appOf returns the app the call acts for, put there by the API key check.
func appOf(ctx context.Context) string { s, _ := ctx.Value(appKey{}).(string); return s }

// authorize returns the app an "Authorization: Bearer KEY" value names, if the key may make
// call (an RPC name of the service).
func (a *API) authorize(authorization, call string) (string, error) {
	scope, ok := callScopes[call]
	if !ok {
		// A programming error (TestEveryCallHasAScope): refused to every key.
		return "", apiError(clientpb.ErrorCode_ERROR_CODE_INTERNAL, "call %s has no scope", call)
	}
	return a.authorizeScope(authorization, scope, call)
}

// authorizeScope returns the app an "Authorization: Bearer KEY" value names, if the key has
// scope; call names what was asked, for the refusal.
func (a *API) authorizeScope(authorization, scope, call string) (string, error) {
	key, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok {
		return "", apiError(clientpb.ErrorCode_ERROR_CODE_UNAUTHORIZED, "missing authorization: Bearer <API key>")
	}
	grant, ok := a.lookupKey(key)
	if !ok {
		return "", apiError(clientpb.ErrorCode_ERROR_CODE_UNAUTHORIZED, "unknown API key")
	}
	if !grant.Allows(scope) {
		return "", scopeError(scope, call)
	}
	return grant.App, nil
}

// mdFirst returns the first value of key in a gRPC call's incoming metadata, or "".
func mdFirst(ctx context.Context, key string) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// authorizeGRPC checks the API key in the metadata of a call to the gRPC method fullMethod and
// returns ctx carrying the app it names. api is false for a method of another service on the
// same server (the dispatcher's, reflection), which has its own rules.
func (a *API) authorizeGRPC(ctx context.Context, fullMethod string) (_ context.Context, call string, api bool, err error) {
	call, api = strings.CutPrefix(fullMethod, "/"+apipb.RoomcastAPI_ServiceDesc.ServiceName+"/")
	if !api {
		return ctx, "", false, nil
	}
	app, err := a.authorize(mdFirst(ctx, "authorization"), call)
	if err != nil {
		return ctx, call, true, err
	}
	return context.WithValue(ctx, appKey{}, app), call, true, nil
}

// authenticate is the gRPC interceptor that checks the API key in the call's metadata.
func (a *API) authenticate(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, _, _, err := a.authorizeGRPC(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// authenticateStream is authenticate for the streaming calls (SendStream): the key is checked
// once, when the stream opens, and the stream's context carries the app.
func (a *API) authenticateStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, call, api, err := a.authorizeGRPC(ss.Context(), info.FullMethod)
	switch {
	case !api:
		return h(srv, ss)
	case err != nil:
		// Recorded and audited as a refused unary call is (observeGRPC): a stream's sends are
		// recorded one by one once it is open.
		code, msg := errorCodeOf(err)
		a.record(a.m.callMetrics("grpc", call), time.Now(), code, nil, mdFirst(ctx, "authorization"), true, msg, bus.ChildTraceparent(""))
		return err
	}
	return h(srv, &appStream{ServerStream: ss, ctx: ctx})
}

// appStream is a stream whose context carries the app its API key names.
type appStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *appStream) Context() context.Context { return s.ctx }

// callName names the RPC a method value of *API serves: "CreateRoom" for a.CreateRoom (whose
// function is "roomcast/api.(*API).CreateRoom-fm"). The HTTP routes name their call this way,
// so a route cannot name another call than the method it runs.
func callName(method any) string {
	name := strings.TrimSuffix(runtime.FuncForPC(reflect.ValueOf(method).Pointer()).Name(), "-fm")
	return name[strings.LastIndexByte(name, '.')+1:]
}
