package api

import (
	"encoding/json"
	"net/http"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"roomcast/proto/apipb"
)

// The JSON of the HTTP answers. Not protojson's: 64-bit numbers are JSON numbers, which the
// clients of POST /v1/rooms/{room}/messages expect, and every field is present.

// answerJSON is what encoding/json writes as the answer resp. The answer of a send, the API's
// busiest call, skips jsonMessage's reflection and map for a struct that encodes to the same
// bytes (fields in name order, both always present).
func answerJSON(resp proto.Message) any {
	if s, ok := resp.(*apipb.SendResponse); ok {
		return sendResponseJSON{ID: s.Id, ServerTimeMS: s.ServerTimeMs}
	}
	return jsonMessage(resp.ProtoReflect())
}

type sendResponseJSON struct {
	ID           string `json:"id"`
	ServerTimeMS int64  `json:"server_time_ms"`
}

// jsonMessage turns a message into what encoding/json writes as the API's JSON.
func jsonMessage(m protoreflect.Message) map[string]any {
	out := make(map[string]any)
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.HasPresence() && !m.Has(fd) {
			continue // an absent message or optional field
		}
		v := m.Get(fd)
		switch {
		case fd.IsList():
			list := v.List()
			arr := make([]any, list.Len())
			for j := range arr {
				arr[j] = jsonValue(fd, list.Get(j))
			}
			out[string(fd.Name())] = arr
		case fd.IsMap():
			obj := make(map[string]any)
			v.Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				obj[k.String()] = jsonValue(fd.MapValue(), v)
				return true
			})
			out[string(fd.Name())] = obj
		default:
			out[string(fd.Name())] = jsonValue(fd, v)
		}
	}
	return out
}

func jsonValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch fd.Kind() {
	case protoreflect.MessageKind:
		return jsonMessage(v.Message())
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return string(ev.Name())
		}
		return int32(v.Enum())
	case protoreflect.BytesKind:
		return v.Bytes() // base64, as encoding/json writes []byte
	}
	return v.Interface()
}

// jsonContentType is every answer's Content-Type, one slice for all (Header.Set makes one
// per answer); net/http only reads it.
var jsonContentType = []string{"application/json"}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
