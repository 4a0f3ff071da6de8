package chatlink

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "roomcast/proto/roomcastpb"
)

// maxPushFrame is the largest frame the node sends: the protocol's frame limit, the same both
// ways (docs/protocol.md; sdk.MaxFrameSize), which clients enforce when they read.
const maxPushFrame = 65536

// pushFrames encodes msgs as Push frames of at most maxPushFrame bytes each, in order: a tick
// of large messages, or a long history, goes out as several frames rather than one a client
// would refuse. A message alone always fits: bodies are limited to 16 KiB.
func pushFrames(msgs []*pb.Message, recovered bool) [][]byte {
	// Frame{push: Push{messages..., recovered}}: the two outer headers take at most 1+3 bytes
	// each below the limit, recovered 2.
	const room = maxPushFrame - 2*(1+3) - 2
	var frames [][]byte
	for start := 0; start < len(msgs); {
		end, size := start, 0
		for end < len(msgs) {
			n := protowire.SizeTag(1) + protowire.SizeBytes(proto.Size(msgs[end])) // as a field of Push
			if end > start && size+n > room {
				break
			}
			size += n
			end++
		}
		b, _ := proto.Marshal(&pb.Frame{Kind: &pb.Frame_Push{Push: &pb.Push{Messages: msgs[start:end], Recovered: recovered}}})
		frames = append(frames, b)
		start = end
	}
	return frames
}
