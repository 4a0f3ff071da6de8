package api

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"roomcast/proto/clientpb"
	"roomcast/store/roomstore"
)

// Errors of the server API: each carries an ErrorCode (docs/protocol.md#4-error-codes-errorcode)
// in a gRPC status, which maps to a gRPC code and an HTTP status.

// apiError is an error of the API: a gRPC status whose ErrorInfo detail carries the ErrorCode.
func apiError(code clientpb.ErrorCode, format string, args ...any) error {
	return apiErrorInfo(code, nil, format, args...)
}

// apiErrorInfo is apiError with more metadata in the ErrorInfo beside "code".
func apiErrorInfo(code clientpb.ErrorCode, metadata map[string]string, format string, args ...any) error {
	st := status.New(grpcCode(code), fmt.Sprintf(format, args...))
	md := map[string]string{"code": strconv.Itoa(int(code))}
	maps.Copy(md, metadata)
	if withInfo, err := st.WithDetails(&errdetails.ErrorInfo{
		Reason:   codeName(code),
		Domain:   "roomcast",
		Metadata: md,
	}); err == nil {
		st = withInfo
	}
	return st.Err()
}

func codeName(code clientpb.ErrorCode) string {
	return strings.TrimPrefix(code.String(), "ERROR_CODE_")
}

// grpcCode maps an error code to the gRPC status code that carries it.
func grpcCode(code clientpb.ErrorCode) codes.Code {
	if m, ok := errorMappings[code]; ok {
		return m.grpc
	}
	return codes.Internal
}

// errorMappings gives each error code its gRPC code and HTTP status (httpStatus); a code not
// here is Internal / 500.
var errorMappings = map[clientpb.ErrorCode]struct {
	grpc codes.Code
	http int
}{
	clientpb.ErrorCode_ERROR_CODE_OK:                {codes.OK, http.StatusOK},
	clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST:       {codes.InvalidArgument, http.StatusBadRequest},
	clientpb.ErrorCode_ERROR_CODE_BAD_TAG_EXPR:      {codes.InvalidArgument, http.StatusBadRequest},
	clientpb.ErrorCode_ERROR_CODE_MESSAGE_TOO_LARGE: {codes.ResourceExhausted, http.StatusRequestEntityTooLarge},
	clientpb.ErrorCode_ERROR_CODE_RATE_LIMITED:      {codes.ResourceExhausted, http.StatusTooManyRequests},
	clientpb.ErrorCode_ERROR_CODE_FORBIDDEN:         {codes.PermissionDenied, http.StatusForbidden},
	clientpb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND:    {codes.NotFound, http.StatusNotFound},
	clientpb.ErrorCode_ERROR_CODE_USER_NOT_FOUND:    {codes.NotFound, http.StatusNotFound},
	clientpb.ErrorCode_ERROR_CODE_CONFLICT:          {codes.FailedPrecondition, http.StatusConflict},
	clientpb.ErrorCode_ERROR_CODE_UNAUTHORIZED:      {codes.Unauthenticated, http.StatusUnauthorized},
	clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE:       {codes.Unavailable, http.StatusServiceUnavailable},
	clientpb.ErrorCode_ERROR_CODE_BAD_HISTORY_QUERY: {codes.InvalidArgument, http.StatusBadRequest},
	clientpb.ErrorCode_ERROR_CODE_INBOX_FULL:        {codes.ResourceExhausted, http.StatusTooManyRequests},
	clientpb.ErrorCode_ERROR_CODE_QUEUE_KEY_EXISTS:  {codes.AlreadyExists, http.StatusConflict},
	clientpb.ErrorCode_ERROR_CODE_QUEUE_NOT_FOUND:   {codes.NotFound, http.StatusNotFound},
	clientpb.ErrorCode_ERROR_CODE_QUEUE_FULL:        {codes.ResourceExhausted, http.StatusConflict},
	clientpb.ErrorCode_ERROR_CODE_API_RATE_LIMITED:  {codes.ResourceExhausted, http.StatusTooManyRequests},
	clientpb.ErrorCode_ERROR_CODE_ATTRIBUTES_FULL:   {codes.ResourceExhausted, http.StatusConflict},
	clientpb.ErrorCode_ERROR_CODE_MESSAGE_NOT_FOUND: {codes.NotFound, http.StatusNotFound},
}

// errorCodeOf recovers the ErrorCode of an error returned by an API method.
func errorCodeOf(err error) (clientpb.ErrorCode, string) {
	st, ok := status.FromError(err)
	if !ok {
		return clientpb.ErrorCode_ERROR_CODE_INTERNAL, err.Error()
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if n, err := strconv.Atoi(info.Metadata["code"]); err == nil {
				return clientpb.ErrorCode(n), st.Message()
			}
		}
	}
	switch st.Code() {
	case codes.ResourceExhausted:
		return clientpb.ErrorCode_ERROR_CODE_MESSAGE_TOO_LARGE, st.Message()
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, st.Message()
	}
	return clientpb.ErrorCode_ERROR_CODE_INTERNAL, st.Message()
}

// internal logs err and returns the error a caller sees: UNAVAILABLE when a service or JetStream
// did not answer in time, INTERNAL otherwise.
func (a *API) internal(what string, err error) error {
	a.log.Warn(what, "err", err)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
		return apiError(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, "%s: a service did not answer in time", what)
	}
	return apiError(clientpb.ErrorCode_ERROR_CODE_INTERNAL, "%s failed", what)
}

func badName(what, v string) error {
	return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "%s %q must be 1-128 characters of A-Z a-z 0-9 _ -", what, v)
}

// storeError turns an error of a KV update into the API's answer.
func (a *API) storeError(what, id string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, roomstore.ErrRoomNotFound):
		return apiError(clientpb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND, "room %q was not created", id)
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return a.internal(what, err)
}

// httpStatus maps an error code to the HTTP status that answers it.
func httpStatus(code clientpb.ErrorCode) int {
	if m, ok := errorMappings[code]; ok {
		return m.http
	}
	return http.StatusInternalServerError
}
