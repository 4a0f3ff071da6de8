// Package inbox keeps the at-least-once messages to users (the server API's SendToUsers with
// at_least_once) in a JetStream stream, one subject per user, until a session of the user
// acknowledges them or they expire. The server API stores them (Put); the ChatLinks ask which
// of the users logging in have any (Holding), read those users' messages (List) and remove
// those a client acknowledges (Ack).
//
// It holds no state besides the stream and must not deliver anything: handing messages to
// sessions is the server API's (live) and the ChatLinks' (at login) job. JetStream enforces its
// limits: the messages per user (DiscardNewPerSubject: a full user's Put fails with ErrFull,
// nothing older is dropped to make room) and each message's expiry (a per-message TTL).
package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/proto/clientpb"
)

// Stream is the JetStream stream of the users' stored messages, one subject per user
// (Subject).
const Stream = "rc_inbox"

// Subject is a user's subject in Stream.
func Subject(app, uid string) string { return "rc.inbox." + app + "." + uid }

// Limits and defaults.
const (
	// DefaultMaxPerUser is how many messages a user may have stored unless configured.
	DefaultMaxPerUser = 100
	// DefaultExpiry is how long a message stays stored unacknowledged unless the send or the
	// deployment says otherwise.
	DefaultExpiry = 24 * time.Hour
	// DefaultMaxExpiry is the longest expiry a send may ask for unless configured.
	DefaultMaxExpiry = 7 * 24 * time.Hour
	// MaxAckIDs is the most ids one Ack frame may carry.
	MaxAckIDs = 100
	// maxStored bounds one stored message: bodies are limited to 16 KiB, the rest is small.
	maxStored = 32 << 10
	// maxList bounds what List reads for one user, should the stream have been created with a
	// larger per-user limit than the reader expects.
	maxList = 1000
	// MaxHolding is the most users one Holding call may ask about: JetStream answers a
	// multi-subject read with at most 1,024 messages.
	MaxHolding = 256
)

// ErrFull is returned by Put when the user has as many messages stored as the stream allows.
var ErrFull = errors.New("inbox: the user has as many messages stored as allowed")

// Config configures the stream, when Open creates or updates it.
type Config struct {
	// Replicas is the stream's replication. Zero value means 1.
	Replicas int
	// MaxPerUser is how many messages a user may have stored. Zero value means
	// DefaultMaxPerUser.
	MaxPerUser int
	// MaxExpiry is the stream's age limit: no message outlives it, whatever its own expiry.
	// Zero value means DefaultMaxExpiry.
	MaxExpiry time.Duration
}

func (c Config) withDefaults() Config {
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.MaxPerUser <= 0 {
		c.MaxPerUser = DefaultMaxPerUser
	}
	if c.MaxExpiry <= 0 {
		c.MaxExpiry = DefaultMaxExpiry
	}
	return c
}

// Store reads and writes the users' stored messages. It is safe for concurrent use.
type Store struct {
	js jetstream.JetStream

	mu     sync.Mutex       // guards stream
	stream jetstream.Stream // nil until found (a reader's store looks for it at each use)
}

// Open creates the stream, or updates it to cfg, and returns a store on it. The server API
// calls it: it is the one that writes.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	stream, err := bus.CreateOrUpdateStream(ctx, js, jetstream.StreamConfig{
		Name:                 Stream,
		Description:          "Roomcast at-least-once messages to users, until acknowledged or expired",
		Subjects:             []string{Subject("*", "*")},
		MaxMsgsPerSubject:    int64(cfg.MaxPerUser),
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxAge:               cfg.MaxExpiry,
		AllowMsgTTL:          true,
		AllowDirect:          true, // logins read with direct gets, from any replica
		MaxMsgSize:           maxStored,
		Replicas:             cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: stream: %w", err)
	}
	return &Store{js: js, stream: stream}, nil
}

// NewReader returns a store that uses the stream without creating it: until the server API
// has created it, users have nothing stored. The ChatLinks use it.
func NewReader(js jetstream.JetStream) *Store { return &Store{js: js} }

// handle returns the stream, or nil when it does not exist (yet).
func (s *Store) handle(ctx context.Context) (jetstream.Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stream != nil {
		return s.stream, nil
	}
	stream, err := s.js.Stream(ctx, Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inbox: stream: %w", err)
	}
	s.stream = stream
	return stream, nil
}

// Put stores m for uid of app until it is acknowledged or ttl passes. It returns ErrFull when
// the user has as many messages stored as allowed.
func (s *Store) Put(ctx context.Context, app, uid string, m *clientpb.Message, ttl time.Duration) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("inbox: encode: %w", err)
	}
	_, err = s.js.Publish(ctx, Subject(app, uid), b, jetstream.WithMsgTTL(ttl))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && strings.Contains(apiErr.Description, "maximum messages per subject") {
		return ErrFull
	}
	if err != nil {
		return fmt.Errorf("inbox: store for %s: %w", uid, err)
	}
	return nil
}

// Stored is one of a user's stored messages.
type Stored struct {
	Seq     uint64 // its sequence in the stream
	Message *clientpb.Message
}

// User names one user's stored messages.
type User struct{ App, UID string }

// Holding reports which of users have messages stored: has[i] for users[i]. It reads the
// stream once, with a direct get of the last message of every user's subject, so a batch of
// logins whose users mostly have nothing stored costs one request instead of a List each. A
// message that has expired but is not yet removed counts; List leaves it out. At most
// MaxHolding users.
func (s *Store) Holding(ctx context.Context, users []User) ([]bool, error) {
	if len(users) > MaxHolding {
		return nil, fmt.Errorf("inbox: %d users asked about at once, at most %d", len(users), MaxHolding)
	}
	has := make([]bool, len(users))
	stream, err := s.handle(ctx)
	if stream == nil || err != nil || len(users) == 0 {
		return has, err
	}
	index := make(map[string][]int, len(users))
	subjects := make([]string, 0, len(users))
	for i, u := range users {
		subj := Subject(u.App, u.UID)
		if _, dup := index[subj]; !dup {
			subjects = append(subjects, subj)
		}
		index[subj] = append(index[subj], i)
	}
	req, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
	}{subjects})
	if err != nil {
		return nil, fmt.Errorf("inbox: holding: %w", err)
	}
	// The answer is a message per subject that has one, then an end-of-batch status; or one
	// "no results" status when none has. It comes on the connection's reply mux: no
	// subscription of its own.
	var statusErr error
	err = bus.RequestAnswers(ctx, s.js.Conn(), s.apiPrefix()+"DIRECT.GET."+Stream, req, func(m *nats.Msg) bool {
		switch status := m.Header.Get("Status"); status { // nats.go's names for a status line
		case "":
			for _, i := range index[m.Header.Get(jetstream.SubjectHeader)] {
				has[i] = true
			}
			return false
		case "404", "204": // no results; end of batch
		default:
			statusErr = fmt.Errorf("inbox: holding: status %s %s", status, m.Header.Get("Description"))
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: holding: %w", err)
	}
	if statusErr != nil {
		return nil, statusErr
	}
	return has, nil
}

// apiPrefix is the subject prefix of the JetStream API the store's context speaks to.
func (s *Store) apiPrefix() string {
	o := s.js.Options()
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// List returns uid's stored messages, oldest first, leaving out any that has expired but is
// not yet removed. A user with none costs one direct get.
func (s *Store) List(ctx context.Context, app, uid string) ([]Stored, error) {
	stream, err := s.handle(ctx)
	if stream == nil || err != nil {
		return nil, err
	}
	subject := Subject(app, uid)
	now := time.Now().UnixMilli()
	var out []Stored
	for seq := uint64(1); len(out) < maxList; {
		raw, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return out, fmt.Errorf("inbox: read %s: %w", uid, err)
		}
		seq = raw.Sequence + 1
		m := new(clientpb.Message)
		if err := proto.Unmarshal(raw.Data, m); err != nil || (m.ExpiresMs != 0 && m.ExpiresMs <= now) {
			continue // not ours to deliver: Put writes only messages that parse
		}
		out = append(out, Stored{Seq: raw.Sequence, Message: m})
	}
	return out, nil
}

// Ack removes uid's stored messages with the ids given and returns how many it removed; ids
// not stored (acknowledged before, expired, unknown) are ignored. known maps ids to their
// sequences when the caller already read them (List), sparing a read of the user's messages;
// sequences are never reused, so a known one names that message or nothing.
func (s *Store) Ack(ctx context.Context, app, uid string, ids []string, known map[string]uint64) (int, error) {
	stream, err := s.handle(ctx)
	if stream == nil || err != nil {
		return 0, err
	}
	var seqs []uint64
	missing := false
	for _, id := range ids {
		if seq, ok := known[id]; ok {
			seqs = append(seqs, seq)
		} else {
			missing = true
		}
	}
	if missing {
		stored, err := s.List(ctx, app, uid)
		if err != nil {
			return 0, err
		}
		seqs = seqs[:0]
		for _, st := range stored {
			if slices.Contains(ids, st.Message.Id) {
				seqs = append(seqs, st.Seq)
			}
		}
	}
	removed := 0
	for _, seq := range seqs {
		switch err := stream.DeleteMsg(ctx, seq); {
		case err == nil:
			removed++
		case errors.Is(err, jetstream.ErrMsgNotFound):
			// acknowledged by another session meanwhile, or expired
		default:
			return removed, fmt.Errorf("inbox: remove for %s: %w", uid, err)
		}
	}
	return removed, nil
}
