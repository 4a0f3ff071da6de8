package tag

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Limits on a member's tags.
const (
	MaxTags     = 32
	MaxTagBytes = 64
)

var tagPattern = regexp.MustCompile(`^[A-Za-z0-9_:.\-]+$`)

// ErrBadTags wraps every reason a tag list is refused.
var ErrBadTags = errors.New("tag: bad tags")

// Validate checks a member's tag list.
func Validate(tags []string) error {
	if len(tags) > MaxTags {
		return fmt.Errorf("%w: %d tags, the limit is %d", ErrBadTags, len(tags), MaxTags)
	}
	for _, t := range tags {
		if len(t) == 0 || len(t) > MaxTagBytes || !tagPattern.MatchString(t) {
			return fmt.Errorf("%w: %q must be 1-%d characters of A-Z a-z 0-9 _ : . -", ErrBadTags, t, MaxTagBytes)
		}
	}
	return nil
}

// Set is a canonical tag set: sorted, without duplicates. Interned sets are shared by every
// member with the same tags, so members can be grouped by pointer.
type Set struct {
	ID   uint64 // unique per distinct set for the Interner's life
	Key  string // the tags joined by ","
	Tags []string
	Role string // the value of the "role:" tag, or ""

	refs int // members holding the set; guarded by the Interner's mu
}

// Interner hands out one shared *Set per distinct tag set and forgets a set when its last
// holder releases it.
type Interner struct {
	nextID atomic.Uint64

	mu   sync.Mutex // guards sets and every Set's refs
	sets map[string]*Set
}

// NewInterner returns an empty Interner.
func NewInterner() *Interner { return &Interner{sets: make(map[string]*Set)} }

// Canonical returns tags sorted and without duplicates.
func Canonical(tags []string) []string {
	out := slices.Clone(tags)
	slices.Sort(out)
	return slices.Compact(out)
}

// Intern returns the shared set for tags and holds it; call Release when done.
func (in *Interner) Intern(tags []string) *Set {
	canon := Canonical(tags)
	key := strings.Join(canon, ",")
	in.mu.Lock()
	defer in.mu.Unlock()
	s := in.sets[key]
	if s == nil {
		s = &Set{ID: in.nextID.Add(1), Key: key, Tags: canon, Role: roleOf(canon)}
		in.sets[key] = s
	}
	s.refs++
	return s
}

// Release drops one hold on s.
func (in *Interner) Release(s *Set) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if s.refs--; s.refs <= 0 {
		delete(in.sets, s.Key)
	}
}

// Len returns the number of distinct sets held.
func (in *Interner) Len() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.sets)
}

// roleOf returns the value of the first "role:" tag, or "".
func roleOf(tags []string) string {
	for _, t := range tags {
		if r, ok := strings.CutPrefix(t, "role:"); ok {
			return r
		}
	}
	return ""
}
