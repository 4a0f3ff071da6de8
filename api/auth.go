package api

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "roomcast/proto/roomcastpb"
)

// The API key check: a call's "Authorization: Bearer KEY" (an HTTP header, or gRPC metadata)
// names the app the call acts for, which the call's context then carries.

type appKey struct{}

// appOf returns the app the call acts for, put there by the API key check.
func appOf(ctx context.Context) string { s, _ := ctx.Value(appKey{}).(string); return s }

// appFor returns the app an "Authorization: Bearer KEY" value names.
func (a *API) appFor(authorization string) (string, error) {
	key, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok {
		return "", apiError(pb.ErrorCode_ERROR_CODE_UNAUTHORIZED, "missing authorization: Bearer <API key>")
	}
	app, ok := a.cfg.Keys.App(key)
	if !ok {
		return "", apiError(pb.ErrorCode_ERROR_CODE_UNAUTHORIZED, "unknown API key")
	}
	return app, nil
}

// authenticate is the gRPC interceptor that checks the API key in the call's metadata.
func (a *API) authenticate(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if !strings.HasPrefix(info.FullMethod, "/"+pb.RoomcastAPI_ServiceDesc.ServiceName+"/") {
		return h(ctx, req) // another service on the same server (the dispatcher's) has its own rules
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var authz string
	if v := md.Get("authorization"); len(v) > 0 {
		authz = v[0]
	}
	app, err := a.appFor(authz)
	if err != nil {
		return nil, err
	}
	return h(context.WithValue(ctx, appKey{}, app), req)
}
