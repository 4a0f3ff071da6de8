// Command callbackbackend is an app's backend for Roomcast's login and send callbacks
// (docs/callbacks.md), written with the standard library only: it verifies each request's
// signature and timestamp, refuses replays, and answers with its rules: uids on a deny list may
// not log in, a uid with the "host" prefix gets the tag role:host, messages containing a link are
// denied, and "darn" in a message is replaced by "****".
//
//	CALLBACK_SECRET=... go run ./examples/callbackbackend --listen 127.0.0.1:8090
//
// with a callbacks file for `roomcast dev --callbacks FILE` such as
//
//	{"apps": {"demo": {"login_url": "http://127.0.0.1:8090/login",
//	                   "send_url": "http://127.0.0.1:8090/send", "secret_env": "CALLBACK_SECRET"}}}
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// replayWindow is how far a request's timestamp may be from our clock.
const replayWindow = 5 * time.Minute

// verify checks a callback request: the Roomcast-Timestamp is within the replay window, and
// Roomcast-Signature is "v1=" and the hex HMAC-SHA256 of timestamp + "." + body.
func verify(secret []byte, r *http.Request, body []byte, now time.Time) error {
	ts := r.Header.Get("Roomcast-Timestamp")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("no timestamp")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > replayWindow || d < -replayWindow {
		return errors.New("timestamp outside the replay window")
	}
	sig, ok := strings.CutPrefix(r.Header.Get("Roomcast-Signature"), "v1=")
	got, err := hex.DecodeString(sig)
	if !ok || err != nil {
		return errors.New("malformed signature")
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	if !hmac.Equal(got, mac.Sum(nil)) {
		return errors.New("signature does not match")
	}
	return nil
}

// seen remembers the ids of the requests of the last replay window, to refuse replays.
type seen struct {
	mu  sync.Mutex // guards ids
	ids map[string]time.Time
}

// first reports whether id was not seen in the window, and remembers it.
func (s *seen) first(id string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, t := range s.ids {
		if now.Sub(t) > 2*replayWindow {
			delete(s.ids, k)
		}
	}
	if _, dup := s.ids[id]; dup {
		return false
	}
	s.ids[id] = now
	return true
}

type backend struct {
	secret []byte
	denied map[string]bool // uids that may not log in
	seen   seen
	now    func() time.Time
}

func newBackend(secret []byte, denied ...string) *backend {
	b := &backend{secret: secret, denied: map[string]bool{}, seen: seen{ids: map[string]time.Time{}}, now: time.Now}
	for _, u := range denied {
		b.denied[u] = true
	}
	return b
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "read", http.StatusBadRequest)
		return
	}
	now := b.now()
	if err := verify(b.secret, r, body, now); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	var req struct {
		Hook string   `json:"hook"`
		ID   string   `json:"id"`
		UID  string   `json:"uid"`
		Tags []string `json:"tags"`
		Body []byte   `json:"body"` // base64 in the JSON
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, "bad JSON", http.StatusBadRequest)
		return
	}
	if !b.seen.first(req.ID, now) {
		http.Error(w, "replayed", http.StatusUnauthorized)
		return
	}
	var answer map[string]any
	switch req.Hook {
	case "login":
		answer = b.login(req.UID, req.Tags)
	case "send":
		answer = b.send(req.Body)
	default:
		http.Error(w, "unknown hook", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(answer)
}

func (b *backend) login(uid string, tags []string) map[string]any {
	switch {
	case b.denied[uid]:
		return map[string]any{"allow": false, "reason": "this account is suspended"}
	case strings.HasPrefix(uid, "host"):
		return map[string]any{"allow": true, "tags": append(tags, "role:host")}
	}
	return map[string]any{"allow": true}
}

func (b *backend) send(body []byte) map[string]any {
	text := string(body)
	switch {
	case strings.Contains(text, "http://") || strings.Contains(text, "https://"):
		return map[string]any{"allow": false, "reason": "links are not allowed here"}
	case strings.Contains(text, "darn"):
		return map[string]any{"allow": true, "body": []byte(strings.ReplaceAll(text, "darn", "****"))}
	}
	return map[string]any{"allow": true}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8090", "address to serve the callbacks on (/login and /send)")
	deny := flag.String("deny", "mallory", "comma-separated uids that may not log in")
	flag.Parse()
	secret := os.Getenv("CALLBACK_SECRET")
	if len(secret) < 16 {
		fmt.Fprintln(os.Stderr, "callbackbackend: set CALLBACK_SECRET (16 bytes or more), the secret of the app's callbacks")
		os.Exit(2)
	}
	log.Printf("callbackbackend: serving on http://%s/login and /send", *listen)
	log.Fatal(http.ListenAndServe(*listen, newBackend([]byte(secret), strings.Split(*deny, ",")...)))
}
