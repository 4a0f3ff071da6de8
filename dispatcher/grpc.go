package dispatcher

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"roomcast/internal/tracing"
	"roomcast/proto/dispatcherpb"
)

// RegisterGRPC adds the Dispatcher service (proto/dispatcher.proto) to s.
func (d *Dispatcher) RegisterGRPC(s grpc.ServiceRegistrar) {
	dispatcherpb.RegisterDispatcherServer(s, grpcService{d: d})
}

type grpcService struct {
	dispatcherpb.UnimplementedDispatcherServer
	d *Dispatcher
}

var _ dispatcherpb.DispatcherServer = grpcService{}

// Dispatch answers like GET /v1/dispatch. The client is the gRPC peer, or what a trusted proxy
// put in the x-forwarded-for / x-real-ip metadata; app and room steer it to the room's nodes.
func (g grpcService) Dispatch(ctx context.Context, req *dispatcherpb.DispatchRequest) (*dispatcherpb.DispatchResponse, error) {
	var addr string
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var realIP string
	if v := md.Get("x-real-ip"); len(v) > 0 {
		realIP = v[0]
	}
	ip := g.d.clientOf(addr, md.Get("x-forwarded-for"), realIP)
	dreq := Request{Client: ip, App: req.GetApp(), Room: req.GetRoom()}
	span := startDispatchSpan(ctx, tracing.MapCarrier(md), "grpc")
	ans, err := g.d.Dispatch(dreq)
	endDispatchSpan(span, dreq, ans, err)
	if errors.Is(err, ErrNoNodes) {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if errors.Is(err, ErrBadRequest) {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	resp := &dispatcherpb.DispatchResponse{TtlMs: ans.TTLMS, Nodes: make([]*dispatcherpb.Endpoint, len(ans.Nodes))}
	for i, e := range ans.Nodes {
		resp.Nodes[i] = &dispatcherpb.Endpoint{Node: e.Node, WsUrl: e.WSURL, TcpAddr: e.TCPAddr, TcpTls: e.TCPTLS}
	}
	return resp, nil
}
